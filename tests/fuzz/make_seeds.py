#!/usr/bin/python3
"""Writes the fuzz targets' seed corpus (tests/fuzz/README.md, "Seeds").

The messages are those the unit and integration tests send (test_daemon.py,
test_service.py, test_checkpoints.py, tests/integration/*.c), packed with the
wire's own Python classes; the checkpoint files are those tests/storage and
tests/unit/test_storage_formats.c build, written here with NumPy (the
reference writer of .npy/.npz) and by the safetensors format's definition.
Each file starts with the byte that selects its message type or format, as
the targets read it. Run at build time (tests/fuzz/CMakeLists.txt):

    make_seeds.py --proto-python build-fuzz/proto/python --out DIR

and writes DIR/<target>/<name>. Needs /usr/bin/python3 with python3-protobuf
(the wire's classes) and python3-numpy (the checkpoint files); a part whose
module is missing is skipped with a note.
"""
import argparse
import io
import json
import os
import re
import struct
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def methods():
    """The method names in PD_ALL_METHODS order (proto/paradev/v1/methods.h):
    the index the request target reads from the first byte."""
    text = open(os.path.join(ROOT, "proto/paradev/v1/methods.h")).read()
    lists = {}
    for name in ("PD_PARALLEL_DEVICE_METHODS", "PD_ADMIN_METHODS", "PD_HEALTH_METHODS"):
        body = re.search(r"#define %s\(X\)(.*?)(?:\n\n|\n#)" % name, text, re.S).group(1)
        lists[name] = re.findall(r"X\(PD_SVC_\w+,\s*(\w+),", body)
    return (lists["PD_PARALLEL_DEVICE_METHODS"] + lists["PD_ADMIN_METHODS"] +
            lists["PD_HEALTH_METHODS"])


class Writer:
    def __init__(self, out):
        self.out = out
        self.count = {}

    def put(self, target, name, data):
        d = os.path.join(self.out, target)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        self.count[target] = self.count.get(target, 0) + 1


def request_seeds(w, proto_python):
    sys.path.insert(0, proto_python)
    try:
        from paradev.v1 import paradev_pb2 as pb
        from paradev.v1 import admin_pb2 as apb
        import health_pb2 as hpb
    except ImportError as e:
        print("make_seeds: no request seeds (%s: install python3-protobuf)" % e)
        return
    order = methods()
    tok = bytes(range(24))

    def put(method, msg, tag=""):
        raw = msg if isinstance(msg, bytes) else msg.SerializeToString()
        w.put("fuzz_request", "%s%s" % (method, tag), bytes([order.index(method)]) + raw)

    def layout(kind, axis=0, component=0):
        return pb.Layout(kind=kind, axis=axis, component=component)

    def attr(name, **v):
        return pb.Attr(name=name, value=pb.AttrValue(**v))

    shape = lambda *d: pb.Shape(dims=list(d))
    ops = [
        pb.Operation(op="Fill", attrs=[attr("dtype", dtype=pb.DTYPE_FLOAT32),
                                       attr("shape", shape=shape(2, 3)), attr("value", f=1.5)],
                     output_ids=[1]),
        pb.Operation(op="Add", inputs=[1, 2], output_ids=[3]),
        pb.Operation(op="MatMul", inputs=[1, 2], output_ids=[4],
                     attrs=[attr("transpose_b", b=True)]),
        pb.Operation(op="RandomNormal", output_ids=[5],
                     attrs=[attr("shape", shape=shape(4, 4)), attr("seed", i=42),
                            attr("per_device", b=False)]),
        pb.Operation(op="Sum", inputs=[3], output_ids=[6], attrs=[attr("axis", int_list=pb.IntList(values=[0, -1]))]),
        pb.Operation(op="AllReduce", inputs=[6], output_ids=[7], attrs=[attr("reduction", s="mean")]),
        pb.Operation(op="Reshape", inputs=[1], output_ids=[8], attrs=[attr("shape", shape=shape(3, 2))]),
        pb.Operation(op="Concat", inputs=[1, 2, 3], output_ids=[9], attrs=[attr("axis", i=0)]),
        pb.Operation(op="Pow", inputs=[1, 2], output_ids=[10], attrs=[attr("x", float_list=pb.FloatList(values=[0.5, 2.0]))]),
        # list outputs: as many ids as the length attribute says
        pb.Operation(op="Split", inputs=[2], output_ids=list(range(11, 23)),
                     attrs=[attr("axis", i=0), attr("num_split", i=12)]),
        pb.Operation(op="SplitV", inputs=[1], output_ids=[23, 24],
                     attrs=[attr("size_splits", int_list=pb.IntList(values=[1, -1])), attr("axis", i=-1)]),
        pb.Operation(op="Unpack", inputs=[5], output_ids=[25, 26, 27, 28],
                     attrs=[attr("num", i=4), attr("axis", i=1)]),
        pb.Operation(op="Pack", inputs=[1, 1, 1], output_ids=[29], attrs=[attr("axis", i=-1)]),
        # placement (issue #17): an op without inputs on a subset, and a
        # malformed set (a device twice, one off the mesh)
        pb.Operation(op="Fill", attrs=[attr("dtype", dtype=pb.DTYPE_FLOAT32),
                                       attr("shape", shape=shape(2)), attr("value", f=2.0)],
                     output_ids=[30], devices=[1, 2]),
        pb.Operation(op="DeviceId", output_ids=[31], devices=[3, 0, 3, 9]),
    ]
    for i, op in enumerate(ops):
        w.put("fuzz_op", "test_op%d_%s" % (i, op.op), op.SerializeToString())
    op_seeds(w, pb)
    put("GetServerInfo", pb.GetServerInfoRequest())
    put("ListOps", pb.ListOpsRequest(name="MatMul"))
    put("ListOps", pb.ListOpsRequest(), "_all")
    put("CreateSession", pb.CreateSessionRequest(client_name="test_client", job_id="1234",
                                                 lease_seconds=60, memory_quota_bytes=1 << 20))
    put("CreateSession", pb.CreateSessionRequest(client_name="unié中", job_id='quo"te\\back'), "_utf8")
    put("CreateSession", b"\x0a\x06bad\xff\n!\x12\x02j2", "_not_utf8")
    put("CreateSession", b"\x0a\x03a\x00b", "_nul")
    put("CreateSession", pb.CreateSessionRequest(client_name="narrow", devices=[1, 2]),
        "_devices")
    put("CreateSession", pb.CreateSessionRequest(devices=[2, 2, 64, -1]), "_bad_devices")
    put("KeepAlive", pb.KeepAliveRequest(session_token=tok))
    put("CloseSession", pb.CloseSessionRequest(session_token=tok))
    hdr = pb.UploadHeader(session_token=tok, id=1, dtype=pb.DTYPE_FLOAT32, shape=shape(6, 2),
                          layout=layout(pb.LAYOUT_SHARDED, axis=0))
    put("Upload", pb.UploadRequest(header=hdr), "_sharded")
    put("Upload", pb.UploadRequest(header=pb.UploadHeader(
        session_token=tok, id=2, dtype=pb.DTYPE_INT64, layout=layout(pb.LAYOUT_PER_COMPONENT),
        component_shapes=[shape(1), shape(2), shape(0), shape(3)])), "_per_component")
    put("Upload", pb.UploadRequest(header=pb.UploadHeader(
        session_token=tok, id=3, dtype=pb.DTYPE_BFLOAT16, shape=shape(),
        layout=layout(pb.LAYOUT_MIRRORED))), "_scalar")
    put("Upload", pb.UploadRequest(chunk=pb.UploadChunk(component=0, offset=0, data=b"\0" * 48)), "_chunk")
    put("Upload", pb.UploadRequest(header=pb.UploadHeader(
        session_token=tok, id=5, dtype=pb.DTYPE_FLOAT32, layout=layout(pb.LAYOUT_PER_COMPONENT),
        component_shapes=[shape(2), shape(3)], devices=[3, 1])), "_devices")
    for k in (pb.LAYOUT_MIRRORED, pb.LAYOUT_SHARDED, pb.LAYOUT_PER_COMPONENT, pb.LAYOUT_COMPONENT):
        put("Download", pb.DownloadRequest(session_token=tok, id=1, layout=layout(k, 1, 3),
                                           chunk_bytes=1 << 20), "_%d" % k)
    put("Execute", pb.ExecuteRequest(session_token=tok, ops=ops))
    put("Execute", pb.ExecuteRequest(session_token=tok).SerializeToString() +
        b"\x12\x06\x0a\x02\xff\xfe\x20\x07", "_not_utf8_op")
    for i, op in enumerate(ops):
        put("Enqueue", pb.EnqueueRequest(session_token=tok, execute=op), "_op%d" % i)
    put("Enqueue", pb.EnqueueRequest(session_token=tok, delete=pb.DeleteItem(ids=[1, 2, 3])), "_delete")
    put("Enqueue", pb.EnqueueRequest(start_tape=pb.TapeStart(tape_id=1, persistent=True)), "_start")
    put("Enqueue", pb.EnqueueRequest(watch_tape=pb.TapeWatch(tape_id=1, ids=[1, 2])), "_watch")
    put("Enqueue", pb.EnqueueRequest(gradient=pb.TapeGradient(
        tape_id=1, target=7, sources=[1, 2], result_ids=[20, 21])), "_gradient")
    put("Enqueue", pb.EnqueueRequest(delete_tape=pb.TapeDelete(tape_id=1)), "_delete_tape")
    put("StartTape", pb.StartTapeRequest(session_token=tok, tape=pb.TapeStart(tape_id=1)))
    put("WatchTape", pb.WatchTapeRequest(session_token=tok, watch=pb.TapeWatch(tape_id=1, ids=[1])))
    put("Gradient", pb.GradientRequest(session_token=tok, gradient=pb.TapeGradient(
        tape_id=1, target=7, sources=[1], output_gradient=9, result_ids=[30])))
    put("DeleteTape", pb.DeleteTapeRequest(session_token=tok, tape=pb.TapeDelete(tape_id=1)))
    fn = pb.FunctionDef(
        name="affine",
        args=[pb.FunctionArg(name="x", dtype=pb.DTYPE_FLOAT32),
              pb.FunctionArg(name="w", dtype=pb.DTYPE_FLOAT32),
              pb.FunctionArg(name="b", dtype=pb.DTYPE_FLOAT32)],
        nodes=[pb.FunctionNode(name="mm", op="MatMul", inputs=["x", "w"],
                               attrs=[attr("transpose_b", b=False)]),
               pb.FunctionNode(name="ba", op="BiasAdd", inputs=["mm", "b"]),
               pb.FunctionNode(name="r", op="Relu", inputs=["ba:0"]),
               pb.FunctionNode(name="s", op="Sum", inputs=["r"],
                               attrs=[attr("axis", int_list=pb.IntList(values=[0, 1]))]),
               pb.FunctionNode(name="g", op="Gradients", inputs=["s", "w", "b"],
                               origins=["r"])],
        outputs=[pb.FunctionOutput(name="y", source="r"),
                 pb.FunctionOutput(name="dw", source="g:0"),
                 pb.FunctionOutput(name="db", source="g:1")],
        options=pb.FunctionOptions(fusion=pb.TRI_STATE_OFF, cse=pb.TRI_STATE_ON,
                                   max_instantiations=4))
    put("RegisterFunction", pb.RegisterFunctionRequest(session_token=tok, function=fn))
    put("RegisterFunction", pb.RegisterFunctionRequest(session_token=tok), "_empty")
    put("Enqueue", pb.EnqueueRequest(register_function=pb.RegisterFunctionRequest(function=fn)),
        "_register_function")
    put("DescribeFunction", pb.DescribeFunctionRequest(session_token=tok, name="affine"))
    put("Sync", pb.SyncRequest(session_token=tok, ids=[1, 2, 3]))
    put("Describe", pb.DescribeRequest(session_token=tok, ids=[1]))
    put("Delete", pb.DeleteRequest(session_token=tok, ids=[1, 2]))
    put("RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
        session_token=tok, name="in", key="/pdtest-shm-small", byte_size=4096))
    put("UnregisterSharedMemory", pb.UnregisterSharedMemoryRequest(session_token=tok, name="in"))
    put("UploadFromSharedMemory", pb.UploadFromSharedMemoryRequest(
        session_token=tok, id=4, dtype=pb.DTYPE_FLOAT32, shape=shape(8, 4),
        layout=layout(pb.LAYOUT_SHARDED, axis=1), region="in", offset=64))
    put("UploadFromSharedMemory", pb.UploadFromSharedMemoryRequest(
        session_token=tok, id=5, dtype=pb.DTYPE_FLOAT32, shape=shape(4), region="in",
        offset=64, devices=[0, 2]), "_devices")
    put("DownloadToSharedMemory", pb.DownloadToSharedMemoryRequest(
        session_token=tok, id=4, layout=layout(pb.LAYOUT_COMPONENT, component=2), region="in",
        offset=128))
    put("LoadTensors", pb.LoadTensorsRequest(
        session_token=tok, source="model.safetensors", format=pb.CHECKPOINT_FORMAT_SAFETENSORS,
        tensors=[pb.LoadTensorSpec(name="w", id=1, layout=layout(pb.LAYOUT_MIRRORED)),
                 pb.LoadTensorSpec(name="x", id=2, layout=layout(pb.LAYOUT_SHARDED, axis=0)),
                 pb.LoadTensorSpec(name="p", id=3, layout=layout(pb.LAYOUT_PER_COMPONENT),
                                   component_sources=["a.npy", "b.npy", "c.npy", "d.npy"])]))
    put("LoadTensors", pb.LoadTensorsRequest(session_token=tok, source="https://host/prefix/m.npz",
                                             first_id=100,
                                             default_layout=layout(pb.LAYOUT_MIRRORED)), "_all")
    put("LoadTensors", pb.LoadTensorsRequest(
        session_token=tok, source="m.safetensors", default_devices=[2, 3],
        tensors=[pb.LoadTensorSpec(name="w", id=1, devices=[1]),
                 pb.LoadTensorSpec(name="x", id=2, layout=layout(pb.LAYOUT_SHARDED, axis=0))]),
        "_devices")
    put("GetLoadProgress", pb.GetLoadProgressRequest(session_token=tok, load_id=1, wait_ms=100))
    put("SaveTensors", pb.SaveTensorsRequest(
        session_token=tok, path="out/readme.safetensors", overwrite=True,
        tensors=[pb.SaveTensorSpec(name="w", id=1, layout=layout(pb.LAYOUT_MIRRORED)),
                 pb.SaveTensorSpec(name="x", id=2, layout=layout(pb.LAYOUT_SHARDED, axis=0))],
        metadata=[pb.MetadataEntry(key="step", value="1"),
                  pb.MetadataEntry(key="note", value="ünï\ncode")]))
    put("SaveTensors", pb.SaveTensorsRequest(session_token=tok, path="w.npy",
                                             format=pb.CHECKPOINT_FORMAT_NPY,
                                             tensors=[pb.SaveTensorSpec(name="w", id=1)]), "_npy")
    put("Echo", pb.EchoRequest(payload=b"alive"))
    put("Echo", b"\xff\xff\xff\xff\x0f\x01", "_malformed")
    put("EchoStream", pb.EchoRequest(payload=b"x" * 100))
    put("ListSessions", apb.ListSessionsRequest(job_id="1234"))
    put("KillSession", apb.KillSessionRequest(session_token=tok), "_token")
    put("KillSession", apb.KillSessionRequest(job_id='quo"te\\back'), "_job")
    put("KillSession", apb.KillSessionRequest(session_id=3), "_id")
    put("CreateJobToken", apb.CreateJobTokenRequest(job_id="4242", uid=1000,
                                                    lifetime_seconds=3600))
    put("CreateJobToken", apb.CreateJobTokenRequest(job_id="4243", uid=-1), "_any")
    put("CreateJobToken", apb.CreateJobTokenRequest(job_id="4244", uid=1000, gpus=[1, 3]),
        "_gpus")
    put("CreateJobToken", apb.CreateJobTokenRequest(job_id="4245", devices=[0, 2], gpus=[7]),
        "_both")
    put("KillJob", apb.KillJobRequest(job_id="4242"))
    put("Drain", apb.DrainRequest(resume=False, exit_when_drained=True))
    put("SetLogLevel", apb.SetLogLevelRequest(spec="info,sched=debug,rpc=warn"))
    put("Check", hpb.HealthCheckRequest(service="paradev.v1.ParallelDevice"))
    put("Watch", hpb.HealthCheckRequest(service=""))
    missing = set(order) - set(n.split("_")[0] for n in os.listdir(os.path.join(w.out, "fuzz_request")))
    if missing:
        sys.exit("make_seeds: no seed for %s: add one here" % ", ".join(sorted(missing)))


def op_seeds(w, pb):
    """One Operation per op of the registry (docs/ops.md, generated from it):
    its inputs (ids 0.. pick fuzz_op's tensors) and every attribute with a
    value of its kind, so that each op's checks are reached from the
    start."""
    text = open(os.path.join(ROOT, "docs/ops.md")).read()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    values = {
        "int": dict(i=0), "float": dict(f=0.5), "bool": dict(b=True),
        "dtype": dict(dtype=pb.DTYPE_FLOAT32), "shape": dict(shape=pb.Shape(dims=[2, 3])),
        "list(int)": dict(int_list=pb.IntList(values=[0])),
        "list(float)": dict(float_list=pb.FloatList(values=[1.0])),
    }
    for sec in sections:
        name = sec.split("\n", 1)[0].strip()
        parts = re.split(r"^(Inputs|Outputs|Attributes):$", sec, flags=re.M)
        tables = {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}
        rows = lambda t: re.findall(r"^\| `(\w+)` \| ([^|]*?) \|(.*)$", tables.get(t, ""), re.M)
        n_in = len(rows("Inputs"))
        attrs = []
        for aname, kind, rest in rows("Attributes"):
            kind = kind.strip()
            if kind == "string":
                allowed = re.search(r"\| ([^|]*?) \\\|", rest)
                v = dict(s=allowed.group(1).strip() if allowed else "x")
            else:
                v = values.get(kind)
            if v:
                attrs.append(pb.Attr(name=aname, value=pb.AttrValue(**v)))
        op = pb.Operation(op=name, inputs=list(range(n_in)), attrs=attrs,
                          output_ids=[100 + k for k in range(len(rows("Outputs")))])
        w.put("fuzz_op", "op_" + name, op.SerializeToString())


def config_seeds(w):
    sample = os.path.join(ROOT, "deploy/paradevd.conf")
    if os.path.exists(sample):
        w.put("fuzz_config", "deploy_paradevd.conf", open(sample, "rb").read())
    # test_service.py's check_config files.
    w.put("fuzz_config", "bom.conf", b"\xef\xbb\xbf[daemon]\nthreads = 3\n")
    w.put("fuzz_config", "junk.conf",
          b"[daemon]\nthreads = \xff\x01\x1b[31m\nn\xfe\xffkey = 1\n[\x1b]\na = 1\n"
          b"[devices]\nbackend = cp\xc3\xbc\n" + bytes(range(1, 256)) + b"\n")
    w.put("fuzz_config", "keys.conf",
          b"[daemon]\nlisten = unix:/tmp/x.sock, 127.0.0.1:0\nadmin_socket = /tmp/a.sock\n"
          b"[devices]\nbackend = cpu\ndevices = 4\nmemory_limit = 64M\n"
          b"[sessions]\ndefault_lease_seconds = 60\nmax_lease_seconds = 30\n"
          b"default_memory_quota = unlimited\n[log]\nlevel = info,sched=debug\n"
          b"[storage]\nroots = /tmp, https://host/prefix/\ncache_bytes = 1G\n"
          b"[cuda]\nallow_tf32 = true\ncollectives = nccl\n; comment\n# comment\n")
    w.put("fuzz_config", "functions.conf",
          b"[functions]\npruning = on\ncse = OFF\nfusion = default\ncuda_graph = maybe\n"
          b"max_instantiations = 64\nconstant_folding_max_bytes = 1M\n"
          b"constant_folding_max_ms = 0\n"
          b"optimizer_plugins = /a/libx.so , /b/liby.so,, relative.so,\n")
    # [tenant NAME] devices (issue #17): good, repeated, off the mesh, junk.
    w.put("fuzz_config", "tenant_devices.conf",
          b"[devices]\ndevices = 4\n[tenant a]\nidentities = uid:1\ndevices = 0, 1\n"
          b"[tenant b]\nidentities = uid:2\ndevices = 3,3\n[tenant c]\nidentities = x\n"
          b"devices = 9, ,\n[tenant d]\nidentities = y\ndevices = 18446744073709551617\n")


def shm_seeds(w):
    token = bytes(range(24))
    hdr = b"PDSHM\x01" + struct.pack("<H", len(token)) + token
    hdr += b"\0" * (64 - len(hdr))
    tail = struct.pack("<QQQ", 4096, 0, 4032)
    w.put("fuzz_shm", "valid", hdr + bytes([24]) + tail + token + b"/pdtest-shm-small")
    w.put("fuzz_shm", "odd", hdr + bytes([23]) + struct.pack("<QQQ", 65, 1, 0) + b"/..")
    w.put("fuzz_shm", "past_end", hdr + bytes([24]) + struct.pack("<QQQ", 4096, 4000, 33) +
          token + b"/x\xc3\xa9")


def checkpoint_seeds(w):
    try:
        import numpy as np
    except ImportError:
        print("make_seeds: no checkpoint seeds (install python3-numpy)")
        return

    def npy(a):
        b = io.BytesIO()
        np.save(b, a, allow_pickle=False)
        return b.getvalue()

    arrays = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "f64_be": np.arange(6, dtype=">f8").reshape(2, 3),
        "fortran": np.asfortranarray(np.arange(24, dtype=np.int32).reshape(2, 3, 4)),
        "bool": np.array([True, False, True]),
        "i64_scalar": np.array(7, dtype=np.int64),
        "empty": np.zeros((0, 3), dtype=np.uint8),
        "f16": np.linspace(-1, 1, 5).astype(np.float16),
    }
    for name, a in arrays.items():
        raw = npy(a)
        w.put("fuzz_checkpoint", "npy_" + name, b"\x02" + raw)
        w.put("fuzz_checkpoint", "npyhdr_" + name, b"\x04" + raw[:256])
    # .npy 2.0 (a header over 64 KiB needs it; NumPy writes 2.0 on request).
    b = io.BytesIO()
    np.lib.format.write_array(b, arrays["f32"], version=(2, 0))
    w.put("fuzz_checkpoint", "npy_v2", b"\x02" + b.getvalue())
    for comp, fn in (("stored", np.savez), ("deflated", np.savez_compressed)):
        b = io.BytesIO()
        fn(b, **{k: v for k, v in arrays.items() if k != "empty"})
        w.put("fuzz_checkpoint", "npz_" + comp, b"\x03" + b.getvalue())
    # A zip64 archive with one member (as zipfile writes when forced).
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
        with z.open("w.npy", "w", force_zip64=True) as m:
            m.write(npy(arrays["f32"]))
    w.put("fuzz_checkpoint", "npz_zip64", b"\x03" + b.getvalue())

    def safetensors(tensors, meta=None):
        header, data = {}, b""
        names = {"float32": "F32", "float64": "F64", "float16": "F16", "int32": "I32",
                 "int64": "I64", "uint8": "U8", "bool": "BOOL"}
        for name, a in tensors.items():
            raw = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
            header[name] = {"dtype": names[a.dtype.name], "shape": list(a.shape),
                            "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        if meta:
            header["__metadata__"] = meta
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)
        return struct.pack("<Q", len(h)) + h + data

    st = safetensors({k: v for k, v in arrays.items() if k not in ("f64_be",)},
                     {"step": "1", "format": "pt"})
    w.put("fuzz_checkpoint", "safetensors", b"\x01" + st)
    w.put("fuzz_checkpoint", "auto_safetensors", b"\x00" + st)
    bf16 = struct.pack("<Q", 64) + b'{"b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'
    bf16 = bf16[:8] + bf16[8:].ljust(64) + b"\x80\x3f\x00\x40"
    w.put("fuzz_checkpoint", "safetensors_bf16", b"\x01" + bf16)
    w.put("fuzz_checkpoint", "safetensors_empty", b"\x01" + safetensors({}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--proto-python", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    w = Writer(a.out)
    request_seeds(w, a.proto_python)
    config_seeds(w)
    shm_seeds(w)
    checkpoint_seeds(w)
    print("make_seeds: %s" % ", ".join("%s %d" % kv for kv in sorted(w.count.items())))


if __name__ == "__main__":
    main()
