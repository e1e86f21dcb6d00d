#!/usr/bin/python3
"""Checkpoints end to end (issue #13): LoadTensors, GetLoadProgress and
SaveTensors against the real paradevd on a temporary Unix socket.

Files are written by NumPy (np.save, np.savez, np.savez_compressed, Fortran
order, big-endian) and by a safetensors writer here that follows the format's
reference (8-byte little-endian header length, JSON header, data); what the
daemon saves is read back with np.load and that reader (and the `safetensors`
package when it is installed), bit-exactly. Every expected value is computed
here with NumPy, never read back from the daemon.

Usage: test_checkpoints.py PARADEVD PYTHON_PROTO_DIR PARADEV_CLI
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio or numpy missing).
"""
import atexit
import http.server
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

try:
    import grpc
    import numpy as np
except ImportError as e:
    print("SKIP: %s (run with /usr/bin/python3; apt-get install python3-grpcio "
          "python3-numpy)" % e)
    sys.exit(77)

if len(sys.argv) != 4:
    print(__doc__)
    sys.exit(2)
PARADEVD, PARADEV_CLI = sys.argv[1], sys.argv[3]
sys.path.insert(0, sys.argv[2])
from paradev.v1 import paradev_pb2 as pb  # noqa: E402

SVC = "/paradev.v1.ParallelDevice/"
C = grpc.StatusCode
NDEV = 3
_TEMP_DIRS = []


def _mkdtemp(**kw):
    d = tempfile.mkdtemp(**kw)
    _TEMP_DIRS.append(d)
    return d


@atexit.register
def _remove_temp_dirs():
    for d in _TEMP_DIRS:
        shutil.rmtree(d, ignore_errors=True)


class Daemon:
    """A paradevd child with storage roots, a config file and /metrics."""

    def __init__(self, roots, config="", *extra):
        self.dir = _mkdtemp(prefix="paradevd-ckpt-")
        self.sock = os.path.join(self.dir, "pd.sock")
        conf = os.path.join(self.dir, "paradevd.conf")
        with open(conf, "w") as f:
            f.write(config)
        args = [PARADEVD, "--config", conf, "--listen", "unix:" + self.sock,
                "--admin-socket", "", "--devices", str(NDEV),
                "--metrics-listen", "127.0.0.1:0", "--grace-ms", "1000"]
        for r in roots:
            args += ["--storage-root", r]
        self.proc = subprocess.Popen(args + list(extra), stderr=subprocess.PIPE,
                                     text=True, errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(20):
            self.proc.kill()
            raise RuntimeError("paradevd not ready; log:\n" + "".join(self.lines))
        m = [re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", line)
             for line in self.lines]
        self.http = int([x for x in m if x][0].group(1))
        self.target = "unix:" + self.sock

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def metrics(self):
        text = urllib.request.urlopen(
            "http://127.0.0.1:%d/metrics" % self.http, timeout=10).read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(20)
        return rc


class Client:
    def __init__(self, target):
        self.ch = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1)])

    def call(self, method, req, resp_cls, timeout=30):
        f = self.ch.unary_unary(SVC + method,
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def session(self):
        return self.call("CreateSession", pb.CreateSessionRequest(client_name="ckpt"),
                         pb.CreateSessionResponse).session_token

    def load(self, tok, source, tensors=(), **kw):
        return self.call("LoadTensors", pb.LoadTensorsRequest(
            session_token=tok, source=source, tensors=list(tensors), **kw),
            pb.LoadTensorsResponse)

    def progress(self, tok, load_id, wait_ms=0):
        return self.call("GetLoadProgress", pb.GetLoadProgressRequest(
            session_token=tok, load_id=load_id, wait_ms=wait_ms),
            pb.GetLoadProgressResponse)

    def wait_load(self, tok, load_id):
        for _ in range(600):
            p = self.progress(tok, load_id, wait_ms=1000)
            if p.done:
                return p
        raise AssertionError("load %d not done" % load_id)

    def sync(self, tok, ids=()):
        return self.call("Sync", pb.SyncRequest(session_token=tok, ids=list(ids)),
                         pb.SyncResponse)

    def save(self, tok, path, tensors, timeout=60, raw=False, **kw):
        # A save must name each tensor's layout; the helper names MIRRORED
        # where a test gave none (raw=True sends the specs as they are).
        if not raw:
            for t in tensors:
                if not t.HasField("layout"):
                    t.layout.CopyFrom(pb.Layout(kind=pb.LAYOUT_MIRRORED))
        return self.call("SaveTensors", pb.SaveTensorsRequest(
            session_token=tok, path=path, tensors=tensors, **kw),
            pb.SaveTensorsResponse, timeout=timeout)

    def download(self, tok, hid, layout=None):
        f = self.ch.unary_stream(SVC + "Download",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.DownloadResponse.FromString)
        layout = layout or pb.Layout(kind=pb.LAYOUT_MIRRORED)
        msgs = list(f(pb.DownloadRequest(session_token=tok, id=hid, layout=layout),
                      timeout=30))
        hdr = msgs[0].header
        parts = [bytearray() for _ in hdr.host_shapes]
        for m in msgs[1:]:
            parts[m.chunk.component] += m.chunk.data
        return hdr, [bytes(p) for p in parts]

    def alive(self):
        """The daemon still serves: an Echo round trip."""
        r = self.call("Echo", pb.EchoRequest(payload=b"still here"), pb.EchoResponse)
        assert r.payload == b"still here"


def expect_error(code, fn, *args, match=None, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if match:
            assert re.search(match, e.details() or "", re.I), \
                "message %r does not match %r" % (e.details(), match)
        return e.details()
    raise AssertionError("expected %s, the call succeeded" % code)


MIRRORED = pb.Layout(kind=pb.LAYOUT_MIRRORED)
PER_COMP = pb.Layout(kind=pb.LAYOUT_PER_COMPONENT)


def sharded(axis):
    return pb.Layout(kind=pb.LAYOUT_SHARDED, axis=axis)


DTYPES = {np.dtype("float32"): (pb.DTYPE_FLOAT32, "F32"),
          np.dtype("float64"): (pb.DTYPE_FLOAT64, "F64"),
          np.dtype("float16"): (pb.DTYPE_FLOAT16, "F16"),
          np.dtype("int32"): (pb.DTYPE_INT32, "I32"),
          np.dtype("int64"): (pb.DTYPE_INT64, "I64"),
          np.dtype("uint8"): (pb.DTYPE_UINT8, "U8"),
          np.dtype("bool"): (pb.DTYPE_BOOL, "BOOL")}
ST_DTYPES = {v[1]: k for k, v in DTYPES.items()}


def write_safetensors(path, tensors, metadata=None):
    """The reference layout: header keys sorted, data back to back."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = np.array(tensors[name], order="C")  # ascontiguousarray makes 0-d 1-d
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[a.dtype][1], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """Parses and checks a safetensors file as the reference reader does:
    offsets contiguous from 0, sizes matching, no trailing bytes."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header past the end"
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None)
    body = data[8 + n:]
    spans, out = [], {}
    for name, e in header.items():
        dt = ST_DTYPES[e["dtype"]]
        b0, b1 = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        assert b1 - b0 == count * dt.itemsize, "size mismatch for " + name
        spans.append((b0, b1))
        out[name] = np.frombuffer(body[b0:b1], dtype=dt).reshape(e["shape"])
    spans.sort()
    pos = 0
    for b0, b1 in spans:
        assert b0 == pos, "hole or overlap at %d" % b0
        pos = b1
    assert pos == len(body), "trailing bytes"
    try:
        import safetensors.numpy as stn  # the reference, where installed
        ref = stn.load_file(path)
        for k in out:
            assert ref[k].tobytes() == out[k].tobytes()
    except ImportError:
        pass
    return out, meta


def infos(resp):
    return {t.name: t.tensor for t in resp.tensors}


def check_bytes(cl, tok, hid, expect, layout=MIRRORED):
    _, parts = cl.download(tok, hid, layout)
    want = np.array(expect, order="C").astype(expect.dtype.newbyteorder("<"))
    assert parts[0] == want.tobytes(), "bytes of %d differ" % hid


# --------------------------------------------------------------------------
# Checks: each takes (client, daemon, root).

def make_arrays(rng):
    return {"w": rng.standard_normal((7, 5)).astype(np.float32),
            "b64": rng.standard_normal((6,)),
            "h": rng.standard_normal((4, 3)).astype(np.float16),
            "i": rng.integers(-2**31, 2**31 - 1, size=(5, 2), dtype=np.int32),
            "l": rng.integers(-2**62, 2**62, size=(3,), dtype=np.int64),
            "u": rng.integers(0, 255, size=(9,), dtype=np.uint8),
            "m": rng.integers(0, 2, size=(2, 2)).astype(bool),
            "s": np.array(3.5, dtype=np.float32)}


def check_load_layouts(cl, d, root):
    rng = np.random.default_rng(1)
    arrs = make_arrays(rng)
    write_safetensors(os.path.join(root, "all.safetensors"), arrs)
    np.savez(os.path.join(root, "all.npz"), **arrs)
    np.savez_compressed(os.path.join(root, "allz.npz"), **arrs)
    tok = cl.session()
    for src in ["all.safetensors", "all.npz", "allz.npz"]:
        r = cl.load(tok, src, first_id=1000)
        got = infos(r)
        assert set(got) == set(arrs), (src, set(got))
        assert r.total_bytes == sum(a.nbytes for a in arrs.values())
        for name, a in arrs.items():
            t = got[name]
            assert t.dtype == DTYPES[a.dtype][0], (src, name)
            assert list(t.shape.dims) == list(a.shape), (src, name, t.shape.dims)
        p = cl.wait_load(tok, r.load_id)
        assert p.bytes_done == p.bytes_total == r.total_bytes and p.status.code == 0
        assert p.tensors_done == p.tensors_total == len(arrs)
        assert cl.sync(tok).error.code == 0
        for name, a in arrs.items():
            check_bytes(cl, tok, got[name].id, a)
            # Mirrored: every component holds the whole value.
            _, parts = cl.download(tok, got[name].id, PER_COMP)
            assert all(p == a.tobytes() for p in parts), (src, name)
        cl.call("Delete", pb.DeleteRequest(session_token=tok,
                                           ids=[t.id for t in got.values()]),
                pb.DeleteResponse)
    # Sharded along axis 0 and 1: each component is np.array_split's part.
    for axis in (0, 1):
        r = cl.load(tok, "all.safetensors", [pb.LoadTensorSpec(
            name="w", id=50 + axis, layout=sharded(axis))])
        assert list(r.tensors[0].host_shape.dims) == [7, 5], r
        comp = [7, 5]
        comp[axis] = -1 if comp[axis] % NDEV else comp[axis] // NDEV
        assert list(r.tensors[0].tensor.shape.dims) == comp, r
        cl.wait_load(tok, r.load_id)
        _, parts = cl.download(tok, 50 + axis, PER_COMP)
        want = np.array_split(arrs["w"], NDEV, axis=axis)
        assert [p for p in parts] == [w.tobytes() for w in want], axis
        check_bytes(cl, tok, 50 + axis, arrs["w"], sharded(axis))
    # Per component from one file per device.
    comps = [rng.standard_normal((2, k + 1)).astype(np.float32) for k in range(NDEV)]
    for k, a in enumerate(comps):
        np.save(os.path.join(root, "pc%d.npy" % k), a)
    r = cl.load(tok, "pc0.npy", [pb.LoadTensorSpec(
        name="", id=60, layout=PER_COMP,
        component_sources=["pc%d.npy" % k for k in range(NDEV)])])
    assert list(r.tensors[0].tensor.shape.dims) == [2, -1]
    assert not r.tensors[0].HasField("host_shape")
    cl.wait_load(tok, r.load_id)
    _, parts = cl.download(tok, 60, PER_COMP)
    assert parts == [a.tobytes() for a in comps]
    # .npy: Fortran order and big-endian are transposed and swapped.
    f = np.asfortranarray(rng.standard_normal((4, 6)).astype(np.float32))
    np.save(os.path.join(root, "fortran.npy"), f)
    big = rng.standard_normal((5, 3)).astype(">f8")
    np.save(os.path.join(root, "big.npy"), big)
    for hid, src, a in [(70, "fortran.npy", f), (71, "big.npy", big)]:
        r = cl.load(tok, src, [pb.LoadTensorSpec(name="", id=hid)])
        cl.wait_load(tok, r.load_id)
        check_bytes(cl, tok, hid, np.ascontiguousarray(a).astype(
            a.dtype.newbyteorder("<")))
    # Sharded load of a big-endian array (not random-access) is still right.
    r = cl.load(tok, "big.npy", [pb.LoadTensorSpec(name="", id=72,
                                                   layout=sharded(0))])
    cl.wait_load(tok, r.load_id)
    _, parts = cl.download(tok, 72, PER_COMP)
    want = np.array_split(big.astype("<f8"), NDEV, axis=0)
    assert parts == [w.tobytes() for w in want]


def check_save_roundtrip(cl, d, root):
    rng = np.random.default_rng(2)
    arrs = make_arrays(rng)
    np.savez(os.path.join(root, "src.npz"), **arrs)
    tok = cl.session()
    r = cl.load(tok, "src.npz", first_id=100)
    cl.wait_load(tok, r.load_id)
    got = infos(r)
    specs = [pb.SaveTensorSpec(name=n, id=t.id) for n, t in got.items()]
    out = os.path.join(root, "out", "saved.safetensors")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    resp = cl.save(tok, "out/saved.safetensors", specs,
                   metadata=[pb.MetadataEntry(key="format", value="pt"),
                             pb.MetadataEntry(key="step", value="42")])
    assert resp.bytes_written == sum(a.nbytes for a in arrs.values()), resp
    back, meta = read_safetensors(out)
    assert meta == {"format": "pt", "step": "42"}, meta
    assert set(back) == set(arrs)
    for n, a in arrs.items():
        assert back[n].dtype == a.dtype and back[n].shape == a.shape, n
        assert back[n].tobytes() == a.tobytes(), n
    # One tensor as .npy.
    cl.save(tok, "out/w.npy", [pb.SaveTensorSpec(name="w", id=got["w"].id)])
    w = np.load(os.path.join(root, "out", "w.npy"))
    assert w.dtype == np.float32 and w.tobytes() == arrs["w"].tobytes()
    # A sharded tensor is gathered along its axis.
    r = cl.load(tok, "src.npz", [pb.LoadTensorSpec(name="w", id=150,
                                                   layout=sharded(0))])
    cl.wait_load(tok, r.load_id)
    cl.save(tok, "out/g.safetensors",
            [pb.SaveTensorSpec(name="w", id=150, layout=sharded(0))])
    back, _ = read_safetensors(os.path.join(root, "out", "g.safetensors"))
    assert back["w"].tobytes() == arrs["w"].tobytes()
    # Overwrite refused, then allowed.
    expect_error(C.ALREADY_EXISTS, cl.save, tok, "out/w.npy",
                 [pb.SaveTensorSpec(name="w", id=got["w"].id)])
    cl.alive()
    cl.save(tok, "out/w.npy", [pb.SaveTensorSpec(name="w", id=got["b64"].id)],
            overwrite=True)
    assert np.load(os.path.join(root, "out", "w.npy")).tobytes() == arrs["b64"].tobytes()
    # Progress of a larger load only grows, and ends done.
    big = rng.standard_normal(4 << 20).astype(np.float32)
    np.save(os.path.join(root, "bigsave.npy"), big)
    r = cl.load(tok, "bigsave.npy", [pb.LoadTensorSpec(name="", id=160)])
    last = 0
    while True:
        p = cl.progress(tok, r.load_id, wait_ms=2000)
        assert last <= p.bytes_done <= p.bytes_total == big.nbytes, (last, p)
        last = p.bytes_done
        if p.done:
            break
    assert p.tensors_done == 1 and p.status.code == 0
    # A client that gives up early does not stop the save, nor break the
    # daemon: the file is whole when it appears.
    try:
        cl.save(tok, "out/late.npy", [pb.SaveTensorSpec(name="x", id=160)],
                timeout=0.05)
    except grpc.RpcError as e:
        assert e.code() == C.DEADLINE_EXCEEDED, e
    cl.alive()
    late = os.path.join(root, "out", "late.npy")
    for _ in range(400):
        if os.path.exists(late):
            break
        time.sleep(0.05)
    if os.path.exists(late):
        assert np.load(late).tobytes() == big.tobytes()
    # A session closed while its save runs: the save is done or cancelled,
    # and the file is whole or absent.
    tok2 = cl.session()
    r = cl.load(tok2, "bigsave.npy", [pb.LoadTensorSpec(name="", id=1)])
    f = cl.ch.unary_unary(SVC + "SaveTensors",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.SaveTensorsResponse.FromString)
    fut = f.future(pb.SaveTensorsRequest(session_token=tok2, path="out/closed.npy",
                                         tensors=[pb.SaveTensorSpec(name="x", id=1, layout=pb.Layout(kind=pb.LAYOUT_MIRRORED))]),
                   timeout=60)
    cl.call("CloseSession", pb.CloseSessionRequest(session_token=tok2),
            pb.CloseSessionResponse)
    try:
        fut.result()
    except grpc.RpcError as e:
        assert e.code() in (C.CANCELLED, C.NOT_FOUND), e
    closed = os.path.join(root, "out", "closed.npy")
    if os.path.exists(closed):
        assert np.load(closed).tobytes() == big.tobytes()
    cl.alive()


def check_refusals(cl, d, root):
    outside = _mkdtemp(prefix="outside-")
    np.save(os.path.join(outside, "secret.npy"), np.arange(4, dtype=np.float32))
    os.symlink(os.path.join(outside, "secret.npy"), os.path.join(root, "link.npy"))
    os.symlink(outside, os.path.join(root, "linkdir"))
    os.mkfifo(os.path.join(root, "fifo.npy"))
    with open(os.path.join(root, "bad.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", 1 << 40) + b"{}")
    with open(os.path.join(root, "badjson.safetensors"), "wb") as f:
        h = b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]'
        f.write(struct.pack("<Q", len(h)) + h + b"\0" * 8)
    write_safetensors(os.path.join(root, "ok.safetensors"),
                      {"x": np.ones(3, np.float32)})
    tok = cl.session()
    spec = [pb.LoadTensorSpec(name="", id=900)]
    table = [
        (C.PERMISSION_DENIED, "../" + os.path.basename(outside) + "/secret.npy", spec),
        (C.PERMISSION_DENIED, os.path.join(outside, "secret.npy"), spec),
        (C.PERMISSION_DENIED, "/etc/passwd", spec),
        (C.PERMISSION_DENIED, "/proc/self/environ", spec),
        (C.PERMISSION_DENIED, "link.npy", spec),
        (C.PERMISSION_DENIED, "linkdir/secret.npy", spec),
        (C.PERMISSION_DENIED, "fifo.npy", spec),
        (C.PERMISSION_DENIED, "http://127.0.0.1:1/x.npy", spec),
        (C.NOT_FOUND, "missing.npy", spec),
        (C.NOT_FOUND, "ok.safetensors", [pb.LoadTensorSpec(name="nope", id=901)]),
        (C.INVALID_ARGUMENT, "bad.safetensors", []),
        (C.INVALID_ARGUMENT, "badjson.safetensors", []),
        (C.INVALID_ARGUMENT, "ok.safetensors\0../../etc/passwd", []),
        (C.INVALID_ARGUMENT, "", []),
        (C.INVALID_ARGUMENT, "ok.safetensors",
         [pb.LoadTensorSpec(name="x", id=902, layout=pb.Layout(kind=pb.LAYOUT_COMPONENT))]),
        (C.INVALID_ARGUMENT, "ok.safetensors",
         [pb.LoadTensorSpec(name="x", id=0)]),
    ]
    for code, src, tensors in table:
        try:
            expect_error(code, cl.load, tok, src, tensors, first_id=903)
        except AssertionError as e:
            raise AssertionError("load %r: %s" % (src, e))
        cl.alive()
    # An id in use.
    r = cl.load(tok, "ok.safetensors", [pb.LoadTensorSpec(name="x", id=904)])
    expect_error(C.ALREADY_EXISTS, cl.load, tok, "ok.safetensors",
                 [pb.LoadTensorSpec(name="x", id=904)])
    cl.wait_load(tok, r.load_id)
    # Saves outside the roots and over a file.
    for path in ["../x.safetensors", "/tmp/x.safetensors", "linkdir/x.safetensors"]:
        expect_error(C.PERMISSION_DENIED, cl.save, tok, path,
                     [pb.SaveTensorSpec(name="x", id=904)])
        cl.alive()
    assert not os.path.exists(os.path.join(outside, "x.safetensors"))
    expect_error(C.ALREADY_EXISTS, cl.save, tok, "ok.safetensors",
                 [pb.SaveTensorSpec(name="x", id=904)])
    expect_error(C.NOT_FOUND, cl.save, tok, "y.safetensors",
                 [pb.SaveTensorSpec(name="x", id=12345)])
    # A save that names no layout would guess (MIRRORED = component 0): refused.
    for layout in [None, pb.Layout(kind=pb.LAYOUT_UNSPECIFIED)]:
        spec = pb.SaveTensorSpec(name="x", id=904)
        if layout is not None:
            spec.layout.CopyFrom(layout)
        expect_error(C.INVALID_ARGUMENT, cl.save, tok, "z.safetensors",
                     [spec], raw=True, match="no layout.*MIRRORED.*SHARDED")
    assert not os.path.exists(os.path.join(root, "z.safetensors"))
    expect_error(C.NOT_FOUND, cl.progress, tok, 987654)
    expect_error(C.INVALID_ARGUMENT, cl.progress, tok, r.load_id, wait_ms=60001)
    cl.alive()
    # The refusals were logged, naming the root rule.
    assert any("storage" in line and "root" in line for line in d.lines)


def check_concurrent_sessions(cl, d, root):
    """Eight sessions load one file at once: storage reads it once."""
    rng = np.random.default_rng(3)
    arrs = {"t%d" % k: rng.standard_normal((256, 257)).astype(np.float32)
            for k in range(12)}
    path = os.path.join(root, "shared.safetensors")
    write_safetensors(path, arrs)
    size = os.path.getsize(path)
    before = d.metrics()["paradev_storage_bytes_fetched_total"]
    results, errors = [None] * 8, []

    def worker(k):
        try:
            c = Client(d.target)
            tok = c.session()
            r = c.load(tok, "shared.safetensors", first_id=10)
            c.wait_load(tok, r.load_id)
            h = infos(r)["t%d" % k]
            _, parts = c.download(tok, h.id)
            results[k] = parts[0]
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    for k in range(8):
        assert results[k] == arrs["t%d" % k].tobytes(), k
    m = d.metrics()
    fetched = m["paradev_storage_bytes_fetched_total"] - before
    assert fetched == size, "fetched %d bytes for a file of %d" % (fetched, size)
    assert m["paradev_storage_cache_bytes"] <= 64 << 20
    assert m["paradev_storage_cache_hits_total"] > 0


def check_rewritten(cl, d, root):
    path = os.path.join(root, "re.npy")
    a = np.arange(1000, dtype=np.float32)
    np.save(path, a)
    tok = cl.session()
    r = cl.load(tok, "re.npy", [pb.LoadTensorSpec(name="", id=300)])
    cl.wait_load(tok, r.load_id)
    check_bytes(cl, tok, 300, a)
    b = a[::-1].copy()
    np.save(path + ".tmp.npy", b)
    os.replace(path + ".tmp.npy", path)  # same size, new inode and mtime
    r = cl.load(tok, "re.npy", [pb.LoadTensorSpec(name="", id=301)])
    cl.wait_load(tok, r.load_id)
    check_bytes(cl, tok, 301, b)
    with open(path, "r+b") as f:  # in place: same inode, new mtime
        data = f.read()
        f.seek(len(data) - 4000)
        f.write(np.full(1000, 7, np.float32).tobytes())
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    r = cl.load(tok, "re.npy", [pb.LoadTensorSpec(name="", id=302)])
    cl.wait_load(tok, r.load_id)
    check_bytes(cl, tok, 302, np.full(1000, 7, np.float32))


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files with Range (206, Content-Range) and an ETag."""

    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        data = open(path, "rb").read()
        etag = '"%x-%x"' % (os.stat(path).st_mtime_ns, len(data))
        rng = self.headers.get("Range")
        m = re.match(r"bytes=(\d+)-(\d*)$", rng or "")
        if not m:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("ETag", etag)
            self.end_headers()
            self.wfile.write(data)
            return
        b0 = int(m.group(1))
        b1 = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        if b0 >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", "bytes */%d" % len(data))
            self.end_headers()
            return
        self.send_response(206)
        self.send_header("Content-Range", "bytes %d-%d/%d" % (b0, b1, len(data)))
        self.send_header("Content-Length", str(b1 - b0 + 1))
        self.send_header("ETag", etag)
        self.end_headers()
        self.wfile.write(data[b0:b1 + 1])

    def do_HEAD(self):  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        st = os.stat(path)
        self.send_response(200)
        self.send_header("Content-Length", str(st.st_size))
        self.send_header("ETag", '"%x-%x"' % (st.st_mtime_ns, st.st_size))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()


STALL = threading.Event()


class StallHandler(RangeHandler):
    """RangeHandler that holds every range past the first 64 KiB until STALL
    is set: a load that stays in progress."""

    def do_GET(self):  # noqa: N802
        m = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if m and int(m.group(1)) >= 65536:
            STALL.wait(30)
        super().do_GET()


class NoRangeHandler(http.server.SimpleHTTPRequestHandler):
    """Python's own: ignores Range and answers 200 with the whole file."""

    def log_message(self, *a):
        pass

    def copyfile(self, src, dst):
        try:
            super().copyfile(src, dst)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the daemon hung up once it had the range it wanted


def serve(handler, directory):
    srv = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=directory))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def check_http(web_dir, servers):
    rng = np.random.default_rng(4)
    arrs = {"a": rng.standard_normal((300, 41)).astype(np.float32),
            "b": rng.integers(0, 100, size=(77,), dtype=np.int64)}
    write_safetensors(os.path.join(web_dir, "m.safetensors"), arrs)
    roots = ["http://127.0.0.1:%d/" % s.server_address[1] for s in servers]
    d = Daemon(roots, "[storage]\nblock_size = 64K\nfetch_timeout_s = 10\n"
               "fetch_retries = 1\n")
    try:
        cl = Client(d.target)
        tok = cl.session()
        for k, url in enumerate(roots[:2]):
            r = cl.load(tok, url + "m.safetensors", first_id=400 + 10 * k)
            p = cl.wait_load(tok, r.load_id)
            assert p.status.code == 0, (url, p.status)
            for n, a in arrs.items():
                check_bytes(cl, tok, infos(r)[n].id, a)
            r = cl.load(tok, url + "m.safetensors", [pb.LoadTensorSpec(
                name="a", id=480 + k, layout=sharded(0))])
            cl.wait_load(tok, r.load_id)
            _, parts = cl.download(tok, 480 + k, PER_COMP)
            assert parts == [w.tobytes() for w in np.array_split(arrs["a"], NDEV)]
            expect_error(C.NOT_FOUND, cl.load, tok, url + "missing.safetensors")
            cl.alive()
        # A load held up by its server: a progress wait ends before the
        # call's deadline with the progress as it is, not with an error.
        big = rng.standard_normal((64, 4096)).astype(np.float32)
        write_safetensors(os.path.join(web_dir, "stall.safetensors"), {"big": big})
        r = cl.load(tok, roots[2] + "stall.safetensors",
                    [pb.LoadTensorSpec(name="big", id=490)])
        p = cl.call("GetLoadProgress", pb.GetLoadProgressRequest(
            session_token=tok, load_id=r.load_id, wait_ms=60000),
            pb.GetLoadProgressResponse, timeout=1.5)
        assert not p.done and p.bytes_done < p.bytes_total == big.nbytes, p
        STALL.set()
        p = cl.wait_load(tok, r.load_id)
        assert p.status.code == 0, p.status
        check_bytes(cl, tok, 490, big)
    finally:
        STALL.set()
        assert d.stop() == 0


class StallServer:
    """A TCP server that accepts and never answers (nor closes): an HTTP
    source that stalls."""

    def __init__(self):
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def check_stalled_source(root):
    """A stalled HTTP source holds neither the RPC threads nor the session:
    4 loads from it with a 1 s deadline (the daemon's default 4 threads, 30 s
    per request and 3 retries), then a health check, an Echo and a local load
    from another session on a new connection answer promptly; the abandoned
    loads published nothing (their ids load again); a CloseSession during a
    stalled load answers at once and that load ends. Bounds are generous
    (10 s), never a timing threshold."""
    stall = StallServer()
    url = "http://127.0.0.1:%d/" % stall.port
    arr = np.arange(1000, dtype=np.float32) * 0.5
    np.save(os.path.join(root, "local.npy"), arr)
    d = Daemon([root, url])
    try:
        cl = Client(d.target)
        tok = cl.session()
        errs = []

        def stalled(k):
            try:
                cl.call("LoadTensors", pb.LoadTensorsRequest(
                    session_token=tok, source=url + "r%d.safetensors" % k,
                    first_id=700 + k), pb.LoadTensorsResponse, timeout=1)
                errs.append("load %d answered" % k)
            except grpc.RpcError as e:
                errs.append(e.code())
        ts = [threading.Thread(target=stalled, args=(k,)) for k in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert errs == [C.DEADLINE_EXCEEDED] * 4, errs
        # the daemon answers at once, on a new connection too
        p = subprocess.run([PARADEV_CLI, "--target", d.target, "--timeout", "10s",
                            "health"], capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
        c2 = Client(d.target)
        r = c2.call("Echo", pb.EchoRequest(payload=b"x"), pb.EchoResponse, timeout=10)
        assert r.payload == b"x"
        tok2 = c2.session()
        r = c2.call("LoadTensors", pb.LoadTensorsRequest(
            session_token=tok2, source="local.npy",
            tensors=[pb.LoadTensorSpec(name="", id=1)]),
            pb.LoadTensorsResponse, timeout=10)
        c2.wait_load(tok2, r.load_id)
        check_bytes(c2, tok2, 1, arr)
        # the abandoned loads published no handle: their ids are free
        r = cl.call("LoadTensors", pb.LoadTensorsRequest(
            session_token=tok, source="local.npy",
            tensors=[pb.LoadTensorSpec(name="", id=700)]),
            pb.LoadTensorsResponse, timeout=10)
        cl.wait_load(tok, r.load_id)
        check_bytes(cl, tok, 700, arr)
        # CloseSession while the session's load is stuck in a fetch (no
        # deadline on the load): the close answers, the load ends with it.
        tok3 = cl.session()
        f = cl.ch.unary_unary(SVC + "LoadTensors",
                              request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=pb.LoadTensorsResponse.FromString)
        fut = f.future(pb.LoadTensorsRequest(session_token=tok3,
                                             source=url + "c.safetensors"))
        time.sleep(0.3)  # let the open reach the stalled server
        cl.call("CloseSession", pb.CloseSessionRequest(session_token=tok3),
                pb.CloseSessionResponse, timeout=10)
        try:
            fut.result(timeout=10)
            raise AssertionError("the load of a closed session answered OK")
        except grpc.FutureTimeoutError:
            raise AssertionError("the load still runs 10 s after its session closed")
        except grpc.RpcError as e:
            assert e.code() in (C.CANCELLED, C.NOT_FOUND), (e.code(), e.details())
        cl.alive()
    finally:
        stall.close()
        assert d.stop() == 0



def check_kill_during_save(root):
    """SIGKILL of the daemon during a large SaveTensors leaves the old file or
    the new one, never a torn one."""
    old = {"x": np.full((16,), 1.0, np.float32)}
    big = np.random.default_rng(5).standard_normal((8 << 20) // 4).astype(np.float32)
    np.save(os.path.join(root, "big.npy"), big)
    outcomes = set()
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2, 0.4):
        path = os.path.join(root, "victim.safetensors")
        write_safetensors(path, old)
        d = Daemon([root])
        try:
            cl = Client(d.target)
            tok = cl.session()
            r = cl.load(tok, "big.npy", [pb.LoadTensorSpec(name="", id=1)])
            cl.wait_load(tok, r.load_id)
            f = cl.ch.unary_unary(SVC + "SaveTensors",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.SaveTensorsResponse.FromString)
            fut = f.future(pb.SaveTensorsRequest(
                session_token=tok, path="victim.safetensors", overwrite=True,
                tensors=[pb.SaveTensorSpec(name="x", id=1, layout=pb.Layout(kind=pb.LAYOUT_MIRRORED))]),
                timeout=60)
            time.sleep(delay)
            d.proc.kill()
            d.proc.wait(10)
            try:
                fut.result()
            except grpc.RpcError:
                pass
        finally:
            if d.proc.poll() is None:
                d.proc.kill()
        back, _ = read_safetensors(path)
        if back["x"].tobytes() == old["x"].tobytes():
            outcomes.add("old")
        else:
            assert back["x"].tobytes() == big.tobytes(), "torn file after SIGKILL"
            outcomes.add("new")
    print("  kill during save: outcomes %s" % sorted(outcomes))


def check_cli(d, root):
    rng = np.random.default_rng(6)
    arrs = {"emb": rng.standard_normal((10, 4)).astype(np.float32),
            "bias": np.arange(5, dtype=np.int64)}
    np.savez(os.path.join(root, "cli.npz"), **arrs)

    def run(*args):
        return subprocess.run([PARADEV_CLI, "--target", d.target, *args],
                              capture_output=True, text=True, timeout=120)

    p = run("load", "cli.npz")
    assert p.returncode == 0, p.stderr
    assert re.search(r"^emb\s+float32\s+\[10, 4\]$", p.stdout, re.M), p.stdout
    assert re.search(r"^bias\s+int64\s+\[5\]$", p.stdout, re.M), p.stdout
    assert re.search(r"2 tensors, .* in [\d.]+ s \(.*/s\)", p.stdout), p.stdout
    assert "progress:" in p.stderr and "done" in p.stderr, p.stderr
    p = run("load", "cli.npz", "--names", "emb", "--layout", "sharded:0", "--quiet")
    assert p.returncode == 0 and "bias" not in p.stdout and p.stderr == "", p
    assert re.search(r"^emb\s+float32\s+\[10, 4\]$", p.stdout, re.M), p.stdout
    p = run("load", "cli.npz", "--names", "nope")
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr, p
    p = run("load", "/etc/passwd")
    assert p.returncode == 1 and "PERMISSION_DENIED" in p.stderr, p
    p = run("load", "cli.npz", "--layout", "diagonal")
    assert p.returncode == 2, p
    p = run("save", "--from", "cli.npz", "cli.safetensors", "--metadata", "k=v")
    assert p.returncode == 0, p.stderr
    # The absolute path written, not the path as given.
    assert re.search(r"saved 2 tensors \(.*\) to %s in " % re.escape(
        os.path.join(root, "cli.safetensors")), p.stdout), p.stdout
    back, meta = read_safetensors(os.path.join(root, "cli.safetensors"))
    assert meta == {"k": "v"} and all(back[n].tobytes() == a.tobytes()
                                      for n, a in arrs.items())
    p = run("save", "--from", "cli.npz", "cli.safetensors")
    assert p.returncode == 1 and "ALREADY_EXISTS" in p.stderr, p
    assert "--overwrite" in p.stderr
    p = run("save", "--from", "cli.npz", "--names", "emb", "cli.safetensors",
            "--overwrite", "--quiet")
    assert p.returncode == 0, p.stderr
    back, _ = read_safetensors(os.path.join(root, "cli.safetensors"))
    assert list(back) == ["emb"]
    p = run("save", "cli.safetensors")
    assert p.returncode == 2, p
    p = run("info")
    assert p.returncode == 0 and re.search(r"storage roots:\n  %s\n" % re.escape(root),
                                           p.stdout), p.stdout
    for cmd in ("load", "save"):
        p = run(cmd, "--help")
        assert p.returncode == 0 and "Usage: paradev" in p.stdout


def check_npy_names_and_axes(cl, d, root):
    """A .npy's tensor (no name) saved to safetensors takes the file's stem,
    --name and --rename rename; the daemon names a nameless tensor by name;
    a save or download along another axis than the sharded load's is refused;
    the CLI's hints fit the command."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 4)).astype(np.float32)  # 3 devices: [2, 4] each
    np.save(os.path.join(root, "x.npy"), x)

    def run(*args):
        return subprocess.run([PARADEV_CLI, "--target", d.target, *args],
                              capture_output=True, text=True, timeout=120)

    p = run("save", "--from", "x.npy", "x.safetensors", "--quiet")
    assert p.returncode == 0, p.stderr
    back, _ = read_safetensors(os.path.join(root, "x.safetensors"))
    assert list(back) == ["x"] and back["x"].tobytes() == x.tobytes(), list(back)
    p = run("save", "--from", "x.npy", "x2.safetensors", "--name", "weights", "--quiet")
    assert p.returncode == 0, p.stderr
    back, _ = read_safetensors(os.path.join(root, "x2.safetensors"))
    assert list(back) == ["weights"] and back["weights"].tobytes() == x.tobytes()
    p = run("save", "--from", "x.safetensors", "x3.safetensors", "--rename", "x=y",
            "--quiet")
    assert p.returncode == 0, p.stderr
    back, _ = read_safetensors(os.path.join(root, "x3.safetensors"))
    assert list(back) == ["y"] and back["y"].tobytes() == x.tobytes()
    p = run("save", "--from", "x.safetensors", "x4.safetensors", "--rename", "nope=y")
    assert p.returncode == 2 and "no tensor 'nope'" in p.stderr, p
    p = run("save", "--from", "x.npy", "x5.npy", "--quiet")  # .npy keeps no name
    assert p.returncode == 0, p.stderr
    assert np.load(os.path.join(root, "x5.npy")).tobytes() == x.tobytes()
    # The daemon: a nameless tensor is named by its (empty) name, not a handle.
    tok = cl.session()
    r = cl.load(tok, "x.npy", [pb.LoadTensorSpec(name="", id=900, layout=sharded(0))])
    cl.wait_load(tok, r.load_id)
    msg = expect_error(C.INVALID_ARGUMENT, cl.save, tok, "n.safetensors",
                       [pb.SaveTensorSpec(name="", id=900, layout=sharded(0))])
    assert "tensor 0 ('')" in msg and "needs a name of 1 to 255 bytes; give one" in msg \
        and "handle" not in msg, msg
    # Loaded sharded(0): saving or downloading sharded(1) would join the equal
    # shards into another value ([6,4] -> [2,12] on 3 devices), silently before:
    # refused, both axes named.
    msg = expect_error(C.INVALID_ARGUMENT, cl.save, tok, "wrong.safetensors",
                       [pb.SaveTensorSpec(name="x", id=900, layout=sharded(1))])
    assert "along axis 0" in msg and "along axis 1" in msg, msg
    assert not os.path.exists(os.path.join(root, "wrong.safetensors"))
    expect_error(C.INVALID_ARGUMENT, cl.download, tok, 900, sharded(1),
                 match="SHARDED along axis 0; reading it SHARDED along axis 1")
    expect_error(C.INVALID_ARGUMENT, cl.download, tok, 900, MIRRORED,
                 match="loaded SHARDED along axis 0")
    check_bytes(cl, tok, 900, x, sharded(0))
    cl.save(tok, "right.safetensors", [pb.SaveTensorSpec(name="x", id=900,
                                                         layout=sharded(0))])
    back, _ = read_safetensors(os.path.join(root, "right.safetensors"))
    assert back["x"].shape == (6, 4) and back["x"].tobytes() == x.tobytes()
    # Hints by command: a missing file is not a missing session.
    p = run("load", "missing.npy")
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr, p
    assert "open a new session" not in p.stderr and "paradev info" in p.stderr, p.stderr
    p = run("save", "--from", "x.npy", "https://example.com/x.safetensors")
    assert p.returncode == 1 and "UNIMPLEMENTED" in p.stderr, p
    assert "upgrade" not in p.stderr, p.stderr
    p = run("load", "x.npy", "--names", "a,,b")
    assert p.returncode == 2 and "non-empty names" in p.stderr, p
    p = run("ops", "matmul")
    assert p.returncode == 1 and "did you mean 'MatMul'?" in p.stderr, p
    assert "open a new session" not in p.stderr, p.stderr
    # .npz read as safetensors: the format is named.
    np.savez(os.path.join(root, "z.npz"), a=x)
    p = run("load", "z.npz", "--format", "safetensors")
    assert p.returncode == 1 and "not a safetensors file" in p.stderr \
        and "format npz" in p.stderr, p.stderr
    assert not any("storage: storage:" in line for line in d.lines), \
        [line for line in d.lines if "storage: storage:" in line]


def check_multi_root():
    """A relative save goes to the root that holds the file (as a load reads
    it), else to the first root where its directory exists; the reply and
    the CLI say the absolute path."""
    roots = [_mkdtemp(prefix="ckpt-r%d-" % i) for i in range(3)]
    a, b, c = roots
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_safetensors(os.path.join(b, "ok.safetensors"), {"x": x})
    write_safetensors(os.path.join(c, "held.safetensors"), {"old": x[:1]})
    os.makedirs(os.path.join(b, "sub"))
    d = Daemon(roots)
    try:
        cl = Client(d.target)
        tok = cl.session()
        r = cl.load(tok, "ok.safetensors", [pb.LoadTensorSpec(name="x", id=1)])
        cl.wait_load(tok, r.load_id)
        spec = [pb.SaveTensorSpec(name="x", id=1)]
        resp = cl.save(tok, "new.safetensors", spec)
        assert resp.path == os.path.join(a, "new.safetensors"), resp.path
        assert os.path.exists(resp.path)
        # held.safetensors is in c: a save without overwrite is refused there
        # (it used to land in a), and with overwrite replaces c's file.
        expect_error(C.ALREADY_EXISTS, cl.save, tok, "held.safetensors", spec)
        assert not os.path.exists(os.path.join(a, "held.safetensors"))
        resp = cl.save(tok, "held.safetensors", spec, overwrite=True)
        assert resp.path == os.path.join(c, "held.safetensors"), resp.path
        back, _ = read_safetensors(resp.path)
        assert list(back) == ["x"] and back["x"].tobytes() == x.tobytes()
        # sub/ exists only in b.
        resp = cl.save(tok, "sub/s.npy", spec)
        assert resp.path == os.path.join(b, "sub", "s.npy"), resp.path
        assert np.load(resp.path).tobytes() == x.tobytes()
        p = subprocess.run([PARADEV_CLI, "--target", d.target, "save", "--from",
                            "ok.safetensors", "fifo.npy", "--quiet"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert "to %s in " % os.path.join(a, "fifo.npy") in p.stdout, p.stdout
    finally:
        rc = d.stop()
    assert rc == 0, "".join(d.lines)


def check_config():
    """[storage] keys and --storage-root: bad values are refused with the key
    and what was expected; a root that does not exist stops the start."""
    tmp = _mkdtemp(prefix="ckpt-conf-")

    def check(conf, *flags):
        path = os.path.join(tmp, "c.conf")
        with open(path, "w") as f:
            f.write(conf)
        return subprocess.run([PARADEVD, "--config", path, "--check-config", *flags],
                              capture_output=True, text=True, timeout=60)

    r = check("[storage]\nroots = %s, https://models.example/v1/\nblock_size = 1M\n"
              "cache_bytes = 0\nmax_staleness_s = 60\nfetch_timeout_s = 5\n"
              "fetch_retries = 0\nload_workers = 4\n" % tmp)
    assert r.returncode == 0, r.stderr
    for conf, flags, what in [
            ("[storage]\nroots = relative/dir\n", [], "not a storage root"),
            ("[storage]\nblock_size = 12\n", [], "block_size"),
            ("[storage]\nload_workers = 0\n", [], "load_workers"),
            ("[storage]\nfetch_timeout_s = 0\n", [], "fetch_timeout_s"),
            ("", ["--storage-root", "ftp://x/"], "not a storage root")]:
        r = check(conf, *flags)
        assert r.returncode == 2 and what in r.stderr, (conf, flags, r.stderr)
    r = subprocess.run([PARADEVD, "--listen", "unix:" + os.path.join(tmp, "s.sock"),
                        "--admin-socket", "", "--storage-root", tmp + "/missing"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and tmp + "/missing" in r.stderr, (r.returncode, r.stderr)
    # --check-config checks the roots as a start does.
    r = check("", "--storage-root", tmp + "/missing")
    assert r.returncode == 2 and tmp + "/missing" in r.stderr \
        and "not an existing directory" in r.stderr, r.stderr
    # A root of / (or one holding /etc) is warned about loudly, not refused.
    r = check("[storage]\nroots = %s, /\n" % tmp)
    assert r.returncode == 0 and "warning:" in r.stderr \
        and "'/' is the root file system" in r.stderr, r.stderr
    r = check("[storage]\nroots = %s\n" % tmp)
    assert r.returncode == 0 and "warning:" not in r.stderr, r.stderr


def check_server_info(cl, d, root):
    r = cl.call("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)
    assert list(r.storage_roots) == [root], r.storage_roots


def main():
    failed = 0

    def run(name, fn, *args):
        nonlocal failed
        try:
            fn(*args)
            print("PASS", name, flush=True)
        except Exception:  # noqa: BLE001
            failed += 1
            print("FAIL", name, flush=True)
            traceback.print_exc()

    run("check_config", check_config)
    root = _mkdtemp(prefix="ckpt-root-")
    d = Daemon([root], "[storage]\nblock_size = 256K\ncache_bytes = 64M\n"
               "load_workers = 3\n")
    try:
        cl = Client(d.target)
        for check in [check_server_info, check_load_layouts, check_save_roundtrip,
                      check_refusals, check_concurrent_sessions, check_rewritten]:
            run(check.__name__, check, cl, d, root)
        run("check_cli", check_cli, d, root)
        run("check_npy_names_and_axes", check_npy_names_and_axes, cl, d, root)
    finally:
        rc = d.stop()
    if rc != 0:
        failed += 1
        print("FAIL SIGTERM: exit status %s; log:\n%s" % (rc, "".join(d.lines)))
    run("check_multi_root", check_multi_root)
    web = _mkdtemp(prefix="ckpt-web-")
    servers = [serve(RangeHandler, web), serve(NoRangeHandler, web),
               serve(StallHandler, web)]
    run("check_http (Range honoured, Range ignored)", check_http, web, servers)
    for s in servers:
        s.shutdown()
    run("check_kill_during_save", check_kill_during_save, _mkdtemp(prefix="ckpt-kill-"))
    run("check_stalled_source", check_stalled_source, _mkdtemp(prefix="ckpt-stall-"))
    for line in d.lines:
        if "AddressSanitizer" in line or "runtime error" in line:
            failed += 1
            print("FAIL sanitizer report in the daemon's log:", line.strip())
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
