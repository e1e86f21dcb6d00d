#!/usr/bin/python3
"""Integration test of paradevd over real sockets, with an independent client.

Starts the real daemon on a temporary Unix socket and on 127.0.0.1:0, then goes
through every RPC it serves with Debian's python3-grpcio (a second gRPC
implementation) and message classes made by `protoc --python_out`. Expected
values are computed here, by hand or with struct/NumPy, never read back from
the daemon.

Usage: test_daemon.py PARADEVD PYTHON_PROTO_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import shutil
import atexit
import os
import random
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed for %s "
          "(apt-get install python3-grpcio; run with /usr/bin/python3)"
          % sys.executable)
    sys.exit(77)

if len(sys.argv) != 3:
    print(__doc__)
    sys.exit(2)
PARADEVD = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from paradev.v1 import paradev_pb2 as pb  # noqa: E402
import health_pb2  # noqa: E402


_TEMP_DIRS = []


def _mkdtemp(**kw):
    """tempfile.mkdtemp whose directory is removed when the test exits."""
    d = tempfile.mkdtemp(**kw)
    _TEMP_DIRS.append(d)
    return d


@atexit.register
def _remove_temp_dirs():
    for d in _TEMP_DIRS:
        shutil.rmtree(d, ignore_errors=True)


SVC = "/paradev.v1.ParallelDevice/"
C = grpc.StatusCode
NDEV = 3
MEM_LIMIT = 64 << 20  # per device
MAX_MSG = 1 << 20     # daemon's message limit in this test


class Daemon:
    """A paradevd child process; `targets` are its bound addresses."""

    def __init__(self, *extra):
        self.dir = _mkdtemp(prefix="paradevd-test-")
        self.sock = os.path.join(self.dir, "pd.sock")
        args = [PARADEVD, "--listen", "unix:" + self.sock,
                "--listen", "127.0.0.1:0", "--devices", str(NDEV),
                "--memory-limit", str(MEM_LIMIT),
                "--max-message-bytes", str(MAX_MSG), "--grace-ms", "2000",
                *extra]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.lines = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(20):
            self.proc.kill()
            raise RuntimeError("paradevd not ready in 20 s; log:\n" +
                               "".join(self.lines))
        ports = [m.group(1) for line in self.lines
                 for m in [re.search(r"listening on 127\.0\.0\.1:(\d+)", line)] if m]
        assert ports and ports[0] != "0", "no bound TCP port logged"
        self.targets = ["unix:" + self.sock, "127.0.0.1:" + ports[0]]

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def stop(self, sig=signal.SIGTERM, timeout=15):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        return rc


class Client:
    def __init__(self, target):
        self.ch = grpc.insecure_channel(target, options=[
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1)])

    def call(self, method, req, resp_cls, timeout=10):
        f = self.ch.unary_unary(SVC + method,
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def raw(self, path, data, timeout=10):
        f = self.ch.unary_unary(path)
        return f(data, timeout=timeout)

    def upload(self, items, timeout=10):
        f = self.ch.stream_unary(SVC + "Upload",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.UploadResponse.FromString)
        return f(iter(items), timeout=timeout)

    def download(self, req, timeout=10):
        f = self.ch.unary_stream(SVC + "Download",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.DownloadResponse.FromString)
        return list(f(req, timeout=timeout))

    def enqueue(self, items, timeout=20):
        f = self.ch.stream_stream(SVC + "Enqueue",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.EnqueueResponse.FromString)
        return list(f(iter(items), timeout=timeout))

    def health(self, service):
        f = self.ch.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return f(health_pb2.HealthCheckRequest(service=service), timeout=10)

    def session(self, **kw):
        return self.call("CreateSession", pb.CreateSessionRequest(**kw),
                         pb.CreateSessionResponse)


def expect_error(code, fn, *args, match=None, **kw):
    """Calls fn and checks it fails with `code` (and a message matching)."""
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if match:
            assert re.search(match, e.details() or ""), \
                "message %r does not match %r" % (e.details(), match)
        return e.details()
    raise AssertionError("expected %s, the call succeeded" % code)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def unf32(data):
    return list(struct.unpack("<%df" % (len(data) // 4), data))


def attr(name, **v):
    return pb.Attr(name=name, value=pb.AttrValue(**v))


def fill_op(out_id, dims, value):
    return pb.Operation(op="Fill", output_ids=[out_id], attrs=[
        attr("shape", shape=pb.Shape(dims=dims)), attr("value", f=value),
        attr("dtype", dtype=pb.DTYPE_FLOAT32)])


def upload_f32(cl, tok, hid, dims, values, layout=None, chunk=10):
    data = f32(values)
    hdr = pb.UploadHeader(session_token=tok, id=hid, dtype=pb.DTYPE_FLOAT32,
                          shape=pb.Shape(dims=dims), layout=layout)
    items = [pb.UploadRequest(header=hdr)]
    for off in range(0, len(data), chunk):
        items.append(pb.UploadRequest(chunk=pb.UploadChunk(offset=off, data=data[off:off + chunk])))
    return cl.upload(items)


def download_parts(cl, tok, hid, layout=None, chunk_bytes=0):
    if layout is None:  # the proto default is UNSPECIFIED, which Download refuses
        layout = pb.Layout(kind=pb.LAYOUT_MIRRORED)
    msgs = cl.download(pb.DownloadRequest(session_token=tok, id=hid, layout=layout,
                                          chunk_bytes=chunk_bytes))
    assert msgs and msgs[0].WhichOneof("item") == "header", "no header first"
    hdr = msgs[0].header
    parts = [bytearray() for _ in hdr.host_shapes]
    for m in msgs[1:]:
        assert m.WhichOneof("item") == "chunk"
        p = parts[m.chunk.component]
        assert m.chunk.offset == len(p), "chunk offsets out of order"
        p += m.chunk.data
    assert sum(len(p) for p in parts) == hdr.total_bytes
    return hdr, [bytes(p) for p in parts]


# --------------------------------------------------------------------------
# Checks; each takes a Client (and the Daemon).

def check_echo(cl, d):
    for payload in [b"", b"hello", bytes(range(256)) * 1024]:
        r = cl.call("Echo", pb.EchoRequest(payload=payload), pb.EchoResponse)
        assert r.payload == payload


def check_server_info(cl, d):
    r = cl.call("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)
    out = subprocess.run([PARADEVD, "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == "paradevd " + r.version, (out.stdout, r.version)
    assert r.backend == "cpu"
    assert len(r.devices) == NDEV
    for i, dev in enumerate(r.devices):
        assert dev.index == i and dev.kind == "cpu" and dev.name.startswith("cpu:%d" % i), dev
        assert dev.memory_limit_bytes == MEM_LIMIT
        assert dev.memory_free_bytes == MEM_LIMIT - dev.memory_used_bytes
        assert dev.busy_seconds >= 0
    assert r.limits.max_message_bytes == MAX_MSG
    assert r.limits.max_rank == 8 and r.limits.default_lease_seconds == 60
    assert r.incarnation != 0
    assert abs(r.start_time_unix_ms / 1000 - time.time()) < 600


def check_health(cl, d):
    for svc in ["", "paradev.v1.ParallelDevice"]:
        assert cl.health(svc).status == health_pb2.HealthCheckResponse.SERVING
    expect_error(C.NOT_FOUND, cl.health, "no.such.Service", match="unknown service")
    watch = cl.ch.unary_stream("/grpc.health.v1.Health/Watch",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=health_pb2.HealthCheckResponse.FromString)
    H = health_pb2.HealthCheckResponse
    for svc, want in [("", H.SERVING), ("no.such.Service", H.SERVICE_UNKNOWN)]:
        it = watch(health_pb2.HealthCheckRequest(service=svc), timeout=10)
        assert next(it).status == want
        it.cancel()  # the daemon frees the call when the client goes away


def check_quota(cl, d):
    tok = cl.session(client_name="quota", memory_quota_bytes=9000).session_token
    upload_f32(cl, tok, 1, [200], [1.0] * 200)  # 800 B x 3 devices = 2400 B
    upload_f32(cl, tok, 2, [200], [1.0] * 200)  # 4800 B
    expect_error(C.RESOURCE_EXHAUSTED, cl.call, "Execute", pb.ExecuteRequest(
        session_token=tok, ops=[pb.Operation(op="Add", inputs=[1, 2], output_ids=[3]),
                                pb.Operation(op="Add", inputs=[1, 2], output_ids=[4])]),
        pb.ExecuteResponse, match="quota")
    cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[
        pb.Operation(op="Add", inputs=[1, 2], output_ids=[3])]), pb.ExecuteResponse)
    expect_error(C.RESOURCE_EXHAUSTED, upload_f32, cl, tok, 4, [200], [1.0] * 200,
                 match="quota")
    cl.call("Delete", pb.DeleteRequest(session_token=tok, ids=[3]), pb.DeleteResponse)
    upload_f32(cl, tok, 4, [200], [1.0] * 200)  # fits again


def check_sessions(cl, d):
    info = cl.call("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)
    a = cl.session(client_name="test-a", job_id="42")
    b = cl.session(client_name="test-b", lease_seconds=5)
    assert len(a.session_token) == 24 and a.session_token != b.session_token
    assert a.lease_seconds == 60 and b.lease_seconds == 5
    assert a.incarnation == info.incarnation and a.num_devices == NDEV
    k = cl.call("KeepAlive", pb.KeepAliveRequest(session_token=b.session_token),
                pb.KeepAliveResponse)
    assert k.lease_seconds == 5 and k.incarnation == info.incarnation
    expect_error(C.INVALID_ARGUMENT, cl.session, lease_seconds=10 ** 9,
                 match="max_lease_seconds")
    expect_error(C.INVALID_ARGUMENT, cl.session, client_name="x" * 300,
                 match="max_string_bytes")
    upload_f32(cl, a.session_token, 1, [2], [1.0, 2.0])
    c = cl.call("CloseSession", pb.CloseSessionRequest(session_token=a.session_token),
                pb.CloseSessionResponse)
    assert c.handles_freed == 1
    expect_error(C.NOT_FOUND, cl.call, "KeepAlive",
                 pb.KeepAliveRequest(session_token=a.session_token), pb.KeepAliveResponse)
    cl.call("CloseSession", pb.CloseSessionRequest(session_token=b.session_token),
            pb.CloseSessionResponse)


def check_bad_tokens(cl, d):
    info = cl.call("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)
    inc = struct.pack("<Q", info.incarnation)
    ka = lambda tok: cl.call("KeepAlive", pb.KeepAliveRequest(session_token=tok),
                             pb.KeepAliveResponse)
    expect_error(C.UNAUTHENTICATED, ka, b"", match="malformed session token")
    expect_error(C.UNAUTHENTICATED, ka, b"x" * 23)
    expect_error(C.NOT_FOUND, ka, inc + os.urandom(16), match="session not found")
    # A 24-byte token of another incarnation: an earlier run's or a forged
    # one, which the daemon cannot tell apart; the message says both.
    other = struct.pack("<Q", info.incarnation ^ 1)
    msg = expect_error(C.NOT_FOUND, ka, other + os.urandom(16))
    assert msg == ("session token is not from this run of paradevd (token incarnation "
                   "%016x, this daemon %016x): the daemon restarted since the session "
                   "was created, or the token was not issued by it; create a new session"
                   % (info.incarnation ^ 1, info.incarnation)), msg
    # Every session-scoped method checks the token.
    expect_error(C.UNAUTHENTICATED, cl.call, "Execute",
                 pb.ExecuteRequest(ops=[fill_op(1, [1], 0.0)]), pb.ExecuteResponse)
    expect_error(C.NOT_FOUND, cl.call, "Describe",
                 pb.DescribeRequest(session_token=inc + os.urandom(16), ids=[1]),
                 pb.DescribeResponse)


def check_upload_download(cl, d):
    tok = cl.session(client_name="updown").session_token
    vals = [float(i) - 2.5 for i in range(6)]
    r = upload_f32(cl, tok, 10, [2, 3], vals, chunk=7)  # chunks cut floats
    assert r.tensor.id == 10 and list(r.tensor.shape.dims) == [2, 3]
    assert r.tensor.dtype == pb.DTYPE_FLOAT32 and r.bytes_received == 24
    hdr, parts = download_parts(cl, tok, 10, chunk_bytes=5)
    assert list(hdr.host_shapes[0].dims) == [2, 3] and unf32(parts[0]) == vals
    # Sharded along axis 0: 7 rows over 3 devices -> 3, 2, 2 rows.
    rows = [[float(10 * i + j) for j in range(2)] for i in range(7)]
    flat = [v for row in rows for v in row]
    upload_f32(cl, tok, 11, [7, 2], flat,
               layout=pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    desc = cl.call("Describe", pb.DescribeRequest(session_token=tok, ids=[11]),
                   pb.DescribeResponse).tensors[0]
    assert [list(s.dims) for s in desc.component_shapes] == [[3, 2], [2, 2], [2, 2]]
    assert list(desc.shape.dims) == [-1, 2] and desc.bytes == 7 * 2 * 4
    assert desc.ready and desc.status.code == 0
    _, parts = download_parts(cl, tok, 11, pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    assert unf32(parts[0]) == flat
    _, parts = download_parts(cl, tok, 11, pb.Layout(kind=pb.LAYOUT_COMPONENT, component=1))
    assert unf32(parts[0]) == flat[6:10]
    hdr, parts = download_parts(cl, tok, 11, pb.Layout(kind=pb.LAYOUT_PER_COMPONENT))
    assert [unf32(p) for p in parts] == [flat[0:6], flat[6:10], flat[10:14]]
    # 6 rows: shards of [2,2] that would join along axis 1 too, into another
    # value ([2,6], silently before): refused, both axes named.
    upload_f32(cl, tok, 470, [6, 2], flat[:12],
               layout=pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    expect_error(C.INVALID_ARGUMENT, download_parts, cl, tok, 470,
                 pb.Layout(kind=pb.LAYOUT_SHARDED, axis=1),
                 match="uploaded or loaded SHARDED along axis 0; reading it "
                       "SHARDED along axis 1")
    _, parts = download_parts(cl, tok, 470, pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    assert unf32(parts[0]) == flat[:12]
    # 400 KB in 64 KiB chunks up, 100000-byte chunks down.
    big = [float((i * 7919) % 10007) for i in range(100000)]
    upload_f32(cl, tok, 16, [100000], big, chunk=65536)
    msgs = cl.download(pb.DownloadRequest(session_token=tok, id=16, chunk_bytes=100000,
                                          layout=pb.Layout(kind=pb.LAYOUT_MIRRORED)))
    assert [len(m.chunk.data) for m in msgs[1:]] == [100000] * 4
    assert unf32(b"".join(m.chunk.data for m in msgs[1:])) == big
    # Per component: component i holds i+1 values; chunks of each in turn.
    vals = [[float(100 * i + j) for j in range(i + 1)] for i in range(NDEV)]
    hdr = pb.UploadHeader(session_token=tok, id=14, dtype=pb.DTYPE_FLOAT32,
                          layout=pb.Layout(kind=pb.LAYOUT_PER_COMPONENT),
                          component_shapes=[pb.Shape(dims=[i + 1]) for i in range(NDEV)])
    items = [pb.UploadRequest(header=hdr)]
    for i, v in enumerate(vals):
        data = f32(v)
        for off in range(0, len(data), 6):
            items.append(pb.UploadRequest(chunk=pb.UploadChunk(
                component=i, offset=off, data=data[off:off + 6])))
    r = cl.upload(items)
    assert list(r.tensor.shape.dims) == [-1] and r.bytes_received == 4 * sum(range(1, NDEV + 1))
    _, parts = download_parts(cl, tok, 14, pb.Layout(kind=pb.LAYOUT_PER_COMPONENT))
    assert [unf32(p) for p in parts] == vals
    hdr.id = 15
    items[0] = pb.UploadRequest(header=hdr)
    expect_error(C.INVALID_ARGUMENT, cl.upload, items[:-1], match="incomplete")
    # Bad uploads.
    hdr = pb.UploadHeader(session_token=tok, id=12, dtype=pb.DTYPE_FLOAT32,
                          shape=pb.Shape(dims=[4]))
    expect_error(C.INVALID_ARGUMENT, cl.upload, [pb.UploadRequest(header=hdr)],
                 match="incomplete")
    expect_error(C.INVALID_ARGUMENT, cl.upload, [pb.UploadRequest(header=hdr),
                 pb.UploadRequest(chunk=pb.UploadChunk(offset=4, data=b"1234"))],
                 match="in order")
    expect_error(C.INVALID_ARGUMENT, cl.upload, [pb.UploadRequest(header=hdr),
                 pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"x" * 20))],
                 match="holds 16 bytes")
    expect_error(C.INVALID_ARGUMENT, cl.upload,
                 [pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"1234"))],
                 match="before the header")
    expect_error(C.ALREADY_EXISTS, upload_f32, cl, tok, 10, [1], [1.0])
    expect_error(C.INVALID_ARGUMENT, upload_f32, cl, tok, 13, [1] * 9, [1.0],
                 match="max_rank is 8")
    expect_error(C.INVALID_ARGUMENT, upload_f32, cl, tok, 13, [2], [1.0, 2.0],
                 layout=pb.Layout(kind=pb.LAYOUT_SHARDED, axis=3))
    big = [1 << 20, 1 << 20]
    expect_error(C.RESOURCE_EXHAUSTED, upload_f32, cl, tok, 13, big, [],
                 match="max_tensor_bytes")
    expect_error(C.RESOURCE_EXHAUSTED, upload_f32, cl, tok, 13, [MEM_LIMIT // 4 + 1], [])
    expect_error(C.NOT_FOUND, download_parts, cl, tok, 999)
    # Nothing half-made is left behind.
    expect_error(C.NOT_FOUND, cl.call, "Describe",
                 pb.DescribeRequest(session_token=tok, ids=[12]), pb.DescribeResponse)


def check_execute(cl, d):
    tok = cl.session(client_name="exec").session_token
    x = [1.0, -2.0, 3.5, 4.0]
    upload_f32(cl, tok, 1, [2, 2], x)
    req = pb.ExecuteRequest(session_token=tok, ops=[
        pb.Operation(op="Add", inputs=[1, 1], output_ids=[2]),
        fill_op(3, [2, 2], 0.5),
        pb.Operation(op="Mul", inputs=[2, 3], output_ids=[4]),  # uses outputs above
        pb.Operation(op="MatMul", inputs=[1, 1], output_ids=[5],
                     attrs=[attr("transpose_b", b=True)])])
    r = cl.call("Execute", req, pb.ExecuteResponse)
    assert len(r.results) == 4
    for res, oid in zip(r.results, [2, 3, 4, 5]):
        assert res.outputs[0].id == oid and res.outputs[0].dtype == pb.DTYPE_FLOAT32
        assert list(res.outputs[0].shape.dims) == [2, 2]
    s = cl.call("Sync", pb.SyncRequest(session_token=tok), pb.SyncResponse)
    assert s.error.code == 0 and s.failed_id == 0
    _, p = download_parts(cl, tok, 4)
    assert unf32(p[0]) == [v for v in x]  # (x + x) * 0.5 == x exactly
    _, p = download_parts(cl, tok, 5)
    a = [[1.0, -2.0], [3.5, 4.0]]
    mm = [sum(a[i][k] * a[j][k] for k in range(2)) for i in range(2) for j in range(2)]
    assert unf32(p[0]) == mm, (unf32(p[0]), mm)
    # DeviceId differs per component.
    r = cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[
        pb.Operation(op="DeviceId", output_ids=[6])]), pb.ExecuteResponse)
    assert r.results[0].outputs[0].dtype == pb.DTYPE_INT32  # as TensorFlow's
    assert list(r.results[0].outputs[0].shape.dims) == []
    _, parts = download_parts(cl, tok, 6, pb.Layout(kind=pb.LAYOUT_PER_COMPONENT))
    assert [struct.unpack("<i", p)[0] for p in parts] == list(range(NDEV))
    # A MIRRORED download of it is refused for what it is: computed per
    # device, not uploaded sharded.
    expect_error(C.INVALID_ARGUMENT, download_parts, cl, tok, 6,
                 pb.Layout(kind=pb.LAYOUT_MIRRORED), match="differ between devices")

    ex = lambda *ops: cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=ops),
                              pb.ExecuteResponse)
    expect_error(C.INVALID_ARGUMENT, ex, pb.Operation(op="NoSuchOp", output_ids=[20]),
                 match="op 0")
    expect_error(C.NOT_FOUND, ex, pb.Operation(op="Neg", inputs=[77], output_ids=[20]),
                 match="handle 77 not found")
    expect_error(C.ALREADY_EXISTS, ex, pb.Operation(op="Neg", inputs=[1], output_ids=[2]))
    expect_error(C.INVALID_ARGUMENT, ex, pb.Operation(op="Neg", inputs=[1], output_ids=[0]))
    expect_error(C.INVALID_ARGUMENT, ex, pb.Operation(op="Neg", inputs=[1], output_ids=[]))
    expect_error(C.INVALID_ARGUMENT, ex, pb.Operation(op="Neg", inputs=[1], output_ids=[21],
                 attrs=[pb.Attr(name="x")]), match="has no value")
    expect_error(C.INVALID_ARGUMENT, ex)  # no ops
    # All or nothing: op 1 is bad, so op 0's output must not exist.
    expect_error(C.INVALID_ARGUMENT, ex, pb.Operation(op="Neg", inputs=[1], output_ids=[30]),
                 pb.Operation(op="MatMul", inputs=[1], output_ids=[31]), match="op 1")
    expect_error(C.NOT_FOUND, cl.call, "Describe",
                 pb.DescribeRequest(session_token=tok, ids=[30]), pb.DescribeResponse)
    # Another session's handle is NOT_FOUND, worded as one that never existed.
    other = cl.session(client_name="other").session_token
    m1 = expect_error(C.NOT_FOUND, cl.call, "Execute", pb.ExecuteRequest(
        session_token=other, ops=[pb.Operation(op="Neg", inputs=[1], output_ids=[2])]),
        pb.ExecuteResponse)
    m2 = expect_error(C.NOT_FOUND, cl.call, "Execute", pb.ExecuteRequest(
        session_token=other, ops=[pb.Operation(op="Neg", inputs=[12345], output_ids=[2])]),
        pb.ExecuteResponse)
    assert m1.replace(" 1 ", " N ") == m2.replace(" 12345 ", " N "), (m1, m2)
    # Delete: all or nothing.
    expect_error(C.NOT_FOUND, cl.call, "Delete",
                 pb.DeleteRequest(session_token=tok, ids=[2, 999]), pb.DeleteResponse)
    r = cl.call("Delete", pb.DeleteRequest(session_token=tok, ids=[2, 3]), pb.DeleteResponse)
    assert r.deleted == 2
    expect_error(C.NOT_FOUND, cl.call, "Describe",
                 pb.DescribeRequest(session_token=tok, ids=[2]), pb.DescribeResponse)
    _, p = download_parts(cl, tok, 4)  # still there; its inputs were deleted
    assert unf32(p[0]) == x
    # Deleted ids can be reused.
    upload_f32(cl, tok, 2, [1], [9.0])


def check_sync_error(cl, d):
    """An op that fails on the devices stores its error; Sync reports it."""
    tok = cl.session(client_name="oom").session_token
    n = MEM_LIMIT // 4 // 2 + 1  # two of these do not fit one device
    try:
        cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[
            fill_op(1, [n], 1.0), fill_op(2, [n], 2.0)]), pb.ExecuteResponse)
    except grpc.RpcError as e:  # rejected at submission: also acceptable
        assert e.code() == C.RESOURCE_EXHAUSTED, e
        return
    s = cl.call("Sync", pb.SyncRequest(session_token=tok, ids=[1, 2]), pb.SyncResponse)
    assert s.error.code == C.RESOURCE_EXHAUSTED.value[0], s
    assert s.failed_id in (1, 2)
    expect_error(C.RESOURCE_EXHAUSTED, download_parts, cl, tok, s.failed_id)
    cl.call("CloseSession", pb.CloseSessionRequest(session_token=tok), pb.CloseSessionResponse)


def check_enqueue(cl, d):
    tok = cl.session(client_name="stream").session_token
    items = [pb.EnqueueRequest(session_token=tok, execute=fill_op(1, [3], 1.0))]
    for i in range(2, 200):
        items.append(pb.EnqueueRequest(execute=pb.Operation(
            op="Add", inputs=[i - 1, 1], output_ids=[i])))
    items.append(pb.EnqueueRequest(execute=pb.Operation(op="Nope", output_ids=[500])))
    items.append(pb.EnqueueRequest(delete=pb.DeleteItem(ids=[5, 6])))
    items.append(pb.EnqueueRequest(delete=pb.DeleteItem(ids=[5])))
    items.append(pb.EnqueueRequest())
    replies = cl.enqueue(items)
    assert [r.index for r in replies] == list(range(len(items)))
    for r in replies[:199]:
        assert r.status.code == 0, r
    assert replies[10].outputs[0].id == 11 and list(replies[10].outputs[0].shape.dims) == [3]
    assert replies[199].status.code == C.INVALID_ARGUMENT.value[0]
    assert replies[200].status.code == 0
    assert replies[201].status.code == C.NOT_FOUND.value[0]
    assert replies[202].status.code == C.INVALID_ARGUMENT.value[0]
    _, p = download_parts(cl, tok, 199)
    assert unf32(p[0]) == [199.0] * 3
    expect_error(C.UNAUTHENTICATED, cl.enqueue, [pb.EnqueueRequest(execute=fill_op(1, [1], 0))])


def check_echo_stream(cl, d):
    f = cl.ch.stream_stream(SVC + "EchoStream",
                            request_serializer=lambda m: m.SerializeToString(),
                            response_deserializer=pb.EchoResponse.FromString)
    payloads = [os.urandom(random.randint(0, 3000)) for _ in range(300)]
    out = [r.payload for r in f(iter(pb.EchoRequest(payload=p) for p in payloads), timeout=20)]
    assert out == payloads


def check_unknown_method(cl, d):
    t0 = time.monotonic()
    expect_error(C.UNIMPLEMENTED, cl.raw, SVC + "NoSuchMethod", b"", timeout=30,
                 match="not implemented")
    expect_error(C.UNIMPLEMENTED, cl.raw, "/other.Service/X", b"\x01\x02", timeout=30)
    assert time.monotonic() - t0 < 5, "UNIMPLEMENTED was not prompt"


def check_limits_and_garbage(cl, d):
    expect_error(C.RESOURCE_EXHAUSTED, cl.call, "Echo",
                 pb.EchoRequest(payload=b"x" * (MAX_MSG + 1)), pb.EchoResponse)
    for method in ["Execute", "CreateSession", "Echo", "Describe"]:
        expect_error(C.INVALID_ARGUMENT, cl.raw, SVC + method, b"\xff\xff\xff\xff\x0f\x01",
                     match="malformed")
    # 400k empty ops: 800 KB on the wire, ~50x that once unpacked.
    expect_error(C.RESOURCE_EXHAUSTED, cl.raw, SVC + "Execute", b"\x12\x00" * 400000,
                 match="decoding budget")
    tok = cl.session(client_name="limits").session_token
    expect_error(C.INVALID_ARGUMENT, cl.call, "Describe",
                 pb.DescribeRequest(session_token=tok, ids=list(range(1, 70000))),
                 pb.DescribeResponse, match="max_ids_per_request")
    expect_error(C.INVALID_ARGUMENT, cl.call, "Execute", pb.ExecuteRequest(
        session_token=tok, ops=[pb.Operation(op="Neg", inputs=[1] * 65, output_ids=[1])]),
        pb.ExecuteResponse, match="max_inputs_per_op")
    expect_error(C.INVALID_ARGUMENT, cl.call, "Execute", pb.ExecuteRequest(
        session_token=tok, ops=[fill_op(1, [1], 0)] * 4097), pb.ExecuteResponse,
        match="max_ops_per_request")
    expect_error(C.INVALID_ARGUMENT, cl.call, "Execute", pb.ExecuteRequest(
        session_token=tok, ops=[pb.Operation(op="Fill", output_ids=[1], attrs=[
            attr("shape", int_list=pb.IntList(values=[1] * 65))])]), pb.ExecuteResponse,
        match="max_list_length")
    # Still serving correctly after all of that.
    r = cl.call("Echo", pb.EchoRequest(payload=b"still here"), pb.EchoResponse)
    assert r.payload == b"still here"


def check_lease_expiry(cl, d):
    info = lambda: cl.call("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)
    before = sum(x.memory_used_bytes for x in info().devices)
    tok = cl.session(client_name="lease", lease_seconds=1).session_token
    upload_f32(cl, tok, 1, [1000], [1.0] * 1000)
    during = sum(x.memory_used_bytes for x in info().devices)
    assert during >= before + NDEV * 4000, (before, during)
    time.sleep(3)
    expect_error(C.NOT_FOUND, cl.call, "KeepAlive", pb.KeepAliveRequest(session_token=tok),
                 pb.KeepAliveResponse, match="session not found")
    after = sum(x.memory_used_bytes for x in info().devices)
    assert after == before, (before, during, after)
    assert any("lease expired" in line for line in d.lines)
    # The line names the session, as every session-end line does.
    assert any(re.search(r'session \d+ \(client "lease" job ""\) lease expired: 1 handles freed',
                         line) for line in d.lines), "".join(d.lines[-20:])


def check_fuzz(cl, d):
    """Mutated and random requests: any status is fine, a crash is not."""
    rnd = random.Random(1234)
    tok = cl.session(client_name="fuzz").session_token
    upload_f32(cl, tok, 1, [2, 2], [1.0, 2.0, 3.0, 4.0])
    seeds = {
        "Execute": pb.ExecuteRequest(session_token=tok, ops=[
            pb.Operation(op="MatMul", inputs=[1, 1], output_ids=[2],
                         attrs=[attr("transpose_a", b=True), attr("x", int_list=pb.IntList(values=[1, 2])),
                                attr("y", shape=pb.Shape(dims=[2, 3])), attr("z", s="abc")]),
            fill_op(3, [2, 2], 1.0)]),
        "Describe": pb.DescribeRequest(session_token=tok, ids=[1, 2]),
        "Sync": pb.SyncRequest(session_token=tok, ids=[1]),
        "Delete": pb.DeleteRequest(session_token=tok, ids=[12345]),
        "CreateSession": pb.CreateSessionRequest(client_name="f", job_id="j", lease_seconds=2),
        "KeepAlive": pb.KeepAliveRequest(session_token=tok),
        "GetServerInfo": pb.GetServerInfoRequest(),
        "StartTape": pb.StartTapeRequest(session_token=tok, tape=pb.TapeStart(
            tape_id=3, persistent=True)),
        "WatchTape": pb.WatchTapeRequest(session_token=tok, watch=pb.TapeWatch(
            tape_id=3, ids=[1, 2])),
        "Gradient": pb.GradientRequest(session_token=tok, gradient=pb.TapeGradient(
            tape_id=3, target=1, sources=[1, 2], output_gradient=1, result_ids=[5, 6])),
        "DeleteTape": pb.DeleteTapeRequest(session_token=tok, tape=pb.TapeDelete(tape_id=3)),
    }
    codes = set()
    for method, msg in seeds.items():
        base = bytearray(msg.SerializeToString())
        for i in range(150):
            data = bytearray(base)
            for _ in range(rnd.randint(1, 4)):
                if data and rnd.random() < 0.7:
                    data[rnd.randrange(len(data))] = rnd.randrange(256)
                else:
                    data.insert(rnd.randint(0, len(data)), rnd.randrange(256))
            if i % 10 == 0:
                data = bytearray(os.urandom(rnd.randint(0, 64)))
            try:
                cl.raw(SVC + method, bytes(data), timeout=10)
                codes.add("OK")
            except grpc.RpcError as e:
                assert e.code() != C.INTERNAL and e.code() != C.UNAVAILABLE, (method, e)
                codes.add(e.code().name)
    # Streams: random items after a valid header / first item.
    for _ in range(30):
        items = [pb.UploadRequest(header=pb.UploadHeader(
            session_token=tok, id=rnd.randint(100, 120), dtype=rnd.randint(0, 10),
            shape=pb.Shape(dims=[rnd.randint(-1, 5) for _ in range(rnd.randint(0, 3))]),
            layout=pb.Layout(kind=rnd.randint(0, 4), axis=rnd.randint(-1, 3))))]
        for _ in range(rnd.randint(0, 4)):
            items.append(pb.UploadRequest(chunk=pb.UploadChunk(
                component=rnd.randint(-1, 3), offset=rnd.randint(0, 40),
                data=os.urandom(rnd.randint(0, 40)))))
        try:
            cl.upload(items)
        except grpc.RpcError as e:
            assert e.code() != C.INTERNAL, e
    items = [pb.EnqueueRequest(session_token=tok, execute=fill_op(500, [1], 1.0))]
    ids = lambda k: [rnd.choice([1, 500, 99, 0, rnd.randint(0, 2000)]) for _ in range(k)]
    for k in range(300):
        kind = rnd.randrange(6)
        if kind == 0:
            items.append(pb.EnqueueRequest(start_tape=pb.TapeStart(
                tape_id=rnd.randint(0, 4), persistent=rnd.random() < 0.5)))
        elif kind == 1:
            items.append(pb.EnqueueRequest(watch_tape=pb.TapeWatch(
                tape_id=rnd.randint(0, 4), ids=ids(rnd.randint(0, 3)))))
        elif kind == 2:
            n = rnd.randint(0, 3)
            items.append(pb.EnqueueRequest(gradient=pb.TapeGradient(
                tape_id=rnd.randint(0, 4), target=rnd.choice([1, 500, 99, 0]),
                sources=ids(n), output_gradient=rnd.choice([0, 0, 1, 500]),
                result_ids=ids(n + rnd.choice([0, 0, 0, 1])))))
        elif kind == 3:
            items.append(pb.EnqueueRequest(delete_tape=pb.TapeDelete(tape_id=rnd.randint(0, 4))))
        else:
            op = pb.Operation(op=rnd.choice(["Add", "Neg", "MatMul", "Nope", "Reshape", "Fill",
                                             "Square", "Sum", "Abs"]),
                              inputs=ids(rnd.randint(0, 3)),
                              output_ids=[rnd.randint(0, 2000) for _ in range(rnd.randint(0, 2))])
            items.append(pb.EnqueueRequest(execute=op))
    replies = cl.enqueue(items)
    assert len(replies) == len(items)
    assert all(r.status.code != C.INTERNAL.value[0] for r in replies)
    # An op name that is not UTF-8: the per-item status must still parse.
    raw = cl.ch.stream_stream(SVC + "Enqueue", request_serializer=lambda b: b,
                              response_deserializer=pb.EnqueueResponse.FromString)
    first = pb.EnqueueRequest(session_token=tok, execute=fill_op(600, [1], 1.0))
    out = list(raw(iter([first.SerializeToString(), b"\x12\x04\x0a\x02\xff\xfe"]), timeout=10))
    assert [r.status.code for r in out] == [0, C.INVALID_ARGUMENT.value[0]], out
    expect_error(C.INVALID_ARGUMENT, cl.raw, SVC + "Execute",
                 pb.ExecuteRequest(session_token=tok).SerializeToString() +
                 b"\x12\x06\x0a\x02\xff\xfe\x20\x07", match="op 0")
    r = cl.call("Echo", pb.EchoRequest(payload=b"alive"), pb.EchoResponse)
    assert r.payload == b"alive"
    assert "INVALID_ARGUMENT" in codes, codes


def check_cancelled_upload(cl, d):
    """A client gone in the middle of an upload leaves no memory held."""
    used = lambda: sum(x.memory_used_bytes for x in cl.call(
        "GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse).devices)
    before = used()
    tok = cl.session(client_name="cancel").session_token
    sent = threading.Event()
    release = threading.Event()

    def items():
        yield pb.UploadRequest(header=pb.UploadHeader(
            session_token=tok, id=1, dtype=pb.DTYPE_FLOAT32, shape=pb.Shape(dims=[100000])))
        yield pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"\0" * 4000))
        sent.set()
        release.wait(30)

    f = cl.ch.stream_unary(SVC + "Upload", request_serializer=lambda m: m.SerializeToString(),
                           response_deserializer=pb.UploadResponse.FromString)
    fut = f.future(items(), timeout=30)
    assert sent.wait(10)
    deadline = time.monotonic() + 5
    while used() < before + NDEV * 400000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert used() >= before + NDEV * 400000, "the upload's tensor was not allocated"
    fut.cancel()
    release.set()
    deadline = time.monotonic() + 5
    while used() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert used() == before, (before, used())
    expect_error(C.NOT_FOUND, cl.call, "Describe",
                 pb.DescribeRequest(session_token=tok, ids=[1]), pb.DescribeResponse)


def check_concurrent_clients(cl, d):
    errors = []

    def worker(k):
        try:
            c2 = Client(d.targets[k % 2])
            tok = c2.session(client_name="worker%d" % k).session_token
            for i in range(20):
                vals = [float(k * 100 + i + j) for j in range(4)]
                upload_f32(c2, tok, 1 + i, [4], vals)
                c2.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[
                    pb.Operation(op="Add", inputs=[1 + i, 1 + i], output_ids=[1000 + i])]),
                    pb.ExecuteResponse)
                _, p = download_parts(c2, tok, 1000 + i)
                assert unf32(p[0]) == [2 * v for v in vals]
        except Exception:
            errors.append(traceback.format_exc())

    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors[0]


def check_tape(cl, d):
    """Gradient tapes on the wire: a gradient checked against a value worked
    out by hand, the same as Enqueue items, and requests that are wrong."""
    tok = cl.session(client_name="tape").session_token
    # x = [[1, 2], [3, 4]], w = [[0.5], [-1]], loss = sum((x w)^2) = 8.5;
    # d loss / d w = 2 x^T (x w) = [[-18], [-26]].
    upload_f32(cl, tok, 1, [2, 2], [1, 2, 3, 4])
    upload_f32(cl, tok, 2, [2, 1], [0.5, -1])
    call = lambda m, req, resp: cl.call(m, req, resp)
    call("StartTape", pb.StartTapeRequest(session_token=tok, tape=pb.TapeStart(tape_id=7)),
         pb.StartTapeResponse)
    call("WatchTape", pb.WatchTapeRequest(session_token=tok, watch=pb.TapeWatch(tape_id=7, ids=[2])),
         pb.WatchTapeResponse)
    cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[
        pb.Operation(op="MatMul", inputs=[1, 2], output_ids=[3]),
        pb.Operation(op="Square", inputs=[3], output_ids=[4]),
        pb.Operation(op="Sum", inputs=[4], output_ids=[5])]), pb.ExecuteResponse)
    grad = lambda **kw: pb.GradientRequest(session_token=tok, gradient=pb.TapeGradient(**kw))
    r = call("Gradient", grad(tape_id=7, target=5, sources=[2, 1], result_ids=[10, 11]),
             pb.GradientResponse)
    assert [t.id for t in r.results] == [10, 11]
    assert list(r.results[0].shape.dims) == [2, 1] and r.results[0].dtype == pb.DTYPE_FLOAT32
    for comp in range(NDEV):
        _, p = download_parts(cl, tok, 10, pb.Layout(kind=pb.LAYOUT_COMPONENT, component=comp))
        assert unf32(p[0]) == [-18.0, -26.0], unf32(p[0])
        _, p = download_parts(cl, tok, 11, pb.Layout(kind=pb.LAYOUT_COMPONENT, component=comp))
        assert unf32(p[0]) == [0.0] * 4  # x was not watched: no path
    expect_error(C.FAILED_PRECONDITION, call, "Gradient",
                 grad(tape_id=7, target=5, sources=[2], result_ids=[12]), pb.GradientResponse,
                 match="one-shot")
    # Wrong requests: each a clear error, never a crash.
    expect_error(C.INVALID_ARGUMENT, call, "StartTape", pb.StartTapeRequest(session_token=tok),
                 pb.StartTapeResponse, match="no tape")
    expect_error(C.INVALID_ARGUMENT, call, "StartTape",
                 pb.StartTapeRequest(session_token=tok, tape=pb.TapeStart(tape_id=0)),
                 pb.StartTapeResponse, match="reserved")
    expect_error(C.ALREADY_EXISTS, call, "StartTape",
                 pb.StartTapeRequest(session_token=tok, tape=pb.TapeStart(tape_id=7)),
                 pb.StartTapeResponse)
    expect_error(C.UNAUTHENTICATED, call, "StartTape",
                 pb.StartTapeRequest(session_token=b"x", tape=pb.TapeStart(tape_id=8)),
                 pb.StartTapeResponse)
    expect_error(C.NOT_FOUND, call, "WatchTape",
                 pb.WatchTapeRequest(session_token=tok, watch=pb.TapeWatch(tape_id=99, ids=[1])),
                 pb.WatchTapeResponse, match="tape 99")
    expect_error(C.INVALID_ARGUMENT, call, "WatchTape",
                 pb.WatchTapeRequest(session_token=tok, watch=pb.TapeWatch(
                     tape_id=7, ids=list(range(1, 70000)))),
                 pb.WatchTapeResponse, match="max_ids_per_request")
    call("StartTape", pb.StartTapeRequest(session_token=tok, tape=pb.TapeStart(
        tape_id=8, persistent=True)), pb.StartTapeResponse)
    expect_error(C.INVALID_ARGUMENT, call, "Gradient",
                 grad(tape_id=8, target=5, sources=[2, 1], result_ids=[20]),
                 pb.GradientResponse, match="result id")
    expect_error(C.INVALID_ARGUMENT, call, "Gradient",
                 grad(tape_id=8, target=5, sources=[2], result_ids=[0]),
                 pb.GradientResponse, match="reserved")
    expect_error(C.INVALID_ARGUMENT, call, "Gradient",
                 grad(tape_id=8, target=5, sources=[2, 1], result_ids=[20, 20]),
                 pb.GradientResponse, match="distinct")
    expect_error(C.NOT_FOUND, call, "Gradient",
                 grad(tape_id=99, target=5, sources=[2], result_ids=[20]),
                 pb.GradientResponse, match="tape 99")
    expect_error(C.INVALID_ARGUMENT, call, "Gradient",
                 pb.GradientRequest(session_token=tok), pb.GradientResponse, match="no gradient")
    expect_error(C.NOT_FOUND, call, "DeleteTape",
                 pb.DeleteTapeRequest(session_token=tok, tape=pb.TapeDelete(tape_id=99)),
                 pb.DeleteTapeResponse)
    # The same as Enqueue items, one reply each, in order.
    items = [pb.EnqueueRequest(session_token=tok, start_tape=pb.TapeStart(tape_id=30)),
             pb.EnqueueRequest(watch_tape=pb.TapeWatch(tape_id=30, ids=[1])),
             pb.EnqueueRequest(execute=pb.Operation(op="Square", inputs=[1], output_ids=[31])),
             pb.EnqueueRequest(execute=pb.Operation(op="Sum", inputs=[31], output_ids=[32])),
             pb.EnqueueRequest(gradient=pb.TapeGradient(tape_id=30, target=32, sources=[1],
                                                        result_ids=[33])),
             pb.EnqueueRequest(gradient=pb.TapeGradient(tape_id=31, target=32, sources=[1],
                                                        result_ids=[34])),
             pb.EnqueueRequest(delete_tape=pb.TapeDelete(tape_id=30)),
             pb.EnqueueRequest(start_tape=pb.TapeStart()),
             pb.EnqueueRequest(gradient=pb.TapeGradient())]
    replies = cl.enqueue(items)
    codes = [r.status.code for r in replies]
    v = lambda c: c.value[0]
    assert codes == [0, 0, 0, 0, 0, v(C.NOT_FOUND), 0, v(C.INVALID_ARGUMENT),
                     v(C.NOT_FOUND)], replies
    assert [t.id for t in replies[4].outputs] == [33]
    _, p = download_parts(cl, tok, 33)
    assert unf32(p[0]) == [2.0, 4.0, 6.0, 8.0]  # d sum(x^2) / dx = 2x
    r = cl.call("Echo", pb.EchoRequest(payload=b"alive"), pb.EchoResponse)
    assert r.payload == b"alive"


def check_papercuts(cl, d):
    """Messages a new user found unclear now say what was wrong."""
    tok = cl.session(client_name="papercut").session_token
    # A sharded scalar: not "expected 0 to -1".
    hdr = pb.UploadHeader(session_token=tok, id=1, dtype=pb.DTYPE_FLOAT32,
                          layout=pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    msg = expect_error(C.INVALID_ARGUMENT, cl.upload,
                       [pb.UploadRequest(header=hdr),
                        pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"1234"))],
                       match=r"along axis 0 of a scalar \(rank 0\): a scalar has no axis")
    assert "-1" not in msg, msg
    # A chunk past the value's end blames the value, not max_chunk_bytes.
    hdr = pb.UploadHeader(session_token=tok, id=2, dtype=pb.DTYPE_FLOAT32,
                          shape=pb.Shape(dims=[4]))
    msg = expect_error(C.INVALID_ARGUMENT, cl.upload,
                       [pb.UploadRequest(header=hdr),
                        pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"x" * 20))],
                       match=r"runs past the end of the value, which holds 16 bytes \(16 left\)")
    assert "max_chunk_bytes" not in msg, msg
    # A chunk over max_chunk_bytes (within the message limit) cites it.
    info = cl.call("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)
    max_chunk = info.limits.max_chunk_bytes
    n = max_chunk + 16
    assert n + 64 < MAX_MSG, (n, MAX_MSG)
    hdr = pb.UploadHeader(session_token=tok, id=3, dtype=pb.DTYPE_UINT8,
                          shape=pb.Shape(dims=[2 * n]))
    expect_error(C.INVALID_ARGUMENT, cl.upload,
                 [pb.UploadRequest(header=hdr),
                  pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"x" * n))],
                 match=r"a chunk of %d bytes; the limit max_chunk_bytes is %d" % (n, max_chunk))
    # The string limit GetServerInfo reports is the one enforced.
    lim = info.limits.max_string_bytes
    ok_name = "n" * lim
    r = cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[pb.Operation(
        op="Fill", output_ids=[4], attrs=[
            attr("shape", shape=pb.Shape(dims=[1])), attr("value", f=1.0),
            attr("dtype", dtype=pb.DTYPE_FLOAT32), attr(ok_name, i=1)])]),
        pb.ExecuteResponse) if False else None  # an unknown attr fails in the engine
    expect_error(C.INVALID_ARGUMENT, cl.call, "Execute", pb.ExecuteRequest(
        session_token=tok, ops=[pb.Operation(op="Fill", output_ids=[4], attrs=[
            attr("n" * (lim + 1), i=1)])]), pb.ExecuteResponse,
        match=r"has a name of %d bytes; expected 1 to max_string_bytes = %d" % (lim + 1, lim))
    # A session's end names the session, whatever the reason.
    cl.call("CloseSession", pb.CloseSessionRequest(session_token=tok), pb.CloseSessionResponse)
    pat = re.compile(r'session \d+ \(client "papercut" job ""\) closed by its client: '
                     r'0 handles freed')
    deadline = time.monotonic() + 5
    while not any(pat.search(line) for line in d.lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(pat.search(line) for line in d.lines), "".join(d.lines[-20:])


def check_log_warn_port(cl, d):
    """--log warn still prints the port picked for 127.0.0.1:0."""
    tmp = _mkdtemp(prefix="paradevd-warn-")
    proc = subprocess.Popen([PARADEVD, "--listen", "127.0.0.1:0", "--devices", "1",
                             "--admin-socket", "", "--log", "warn"],
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            cwd=tmp)
    lines, found = [], []

    def read():
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                found.append(int(m.group(1)))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not found and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert found and found[0] != 0, "".join(lines)
        # That port is the daemon's.
        assert Client("127.0.0.1:%d" % found[0]).call(
            "Echo", pb.EchoRequest(payload=b"warn"), pb.EchoResponse).payload == b"warn"
        assert not any("ready:" in line for line in lines), "".join(lines)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(15)
        t.join(5)
    assert rc == 0, (rc, "".join(lines))


def check_list_ops(cl, d):
    """ListOps through an independent client: the registry's values."""
    ops = cl.call("ListOps", pb.ListOpsRequest(), pb.ListOpsResponse).ops
    names = [o.name for o in ops]
    assert names == sorted(names) and len(names) >= 50, names
    assert all(o.summary for o in ops), [o.name for o in ops if not o.summary]
    mm = cl.call("ListOps", pb.ListOpsRequest(name="MatMul"), pb.ListOpsResponse).ops
    assert len(mm) == 1 and mm[0].name == "MatMul" and mm[0].has_gradient
    assert [a.name for a in mm[0].inputs] == ["a", "b"]
    assert set(mm[0].inputs[0].dtypes) == {pb.DTYPE_FLOAT32, pb.DTYPE_FLOAT64,
                                          pb.DTYPE_FLOAT16, pb.DTYPE_BFLOAT16}
    for a in mm[0].attrs:
        assert a.kind == pb.ATTR_KIND_BOOL and a.HasField("default_value")
        assert a.default_value.WhichOneof("value") == "b" and not a.default_value.b
    reshape = {o.name: o for o in ops}["Reshape"]
    shape = reshape.attrs[0]
    assert shape.name == "shape" and shape.kind == pb.ATTR_KIND_INT_LIST
    assert not shape.HasField("default_value")  # required
    assert "Differs from tf.raw_ops.Reshape" in reshape.notes
    ar = {o.name: o for o in ops}["AllReduce"]
    assert ar.is_collective and list(ar.attrs[0].allowed_values) == [
        "sum", "mean", "max", "min", "prod"]
    expect_error(grpc.StatusCode.NOT_FOUND, cl.call, "ListOps",
                 pb.ListOpsRequest(name="Matmul"), pb.ListOpsResponse,
                 match="no op named 'Matmul'")


def check_layouts_never_guess(cl, d):
    """A Download names its layout; MIRRORED of shards is refused."""
    tok = cl.session(client_name="layouts").session_token
    vals = [float(i) for i in range(6)]
    upload_f32(cl, tok, 1, [6], vals)  # no layout: UNSPECIFIED, as MIRRORED
    for lay in (None, pb.Layout(), pb.Layout(kind=pb.LAYOUT_UNSPECIFIED, axis=0)):
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, cl.download,
                     pb.DownloadRequest(session_token=tok, id=1, layout=lay),
                     match=r"layout is unspecified .*MIRRORED \(1.*SHARDED \(2"
                           r".*PER_COMPONENT \(3.*COMPONENT \(4")
    _, parts = download_parts(cl, tok, 1, pb.Layout(kind=pb.LAYOUT_MIRRORED))
    assert unf32(parts[0]) == vals
    upload_f32(cl, tok, 2, [6], vals, layout=pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, download_parts, cl, tok, 2,
                 pb.Layout(kind=pb.LAYOUT_MIRRORED), match="not mirrored")
    # Neg of a sharded tensor is not mirrored either; its AllReduce is.
    r = cl.call("Execute", pb.ExecuteRequest(session_token=tok, ops=[
        pb.Operation(op="Neg", inputs=[2], output_ids=[3]),
        pb.Operation(op="AllReduce", inputs=[3], output_ids=[4])]),
        pb.ExecuteResponse)
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, download_parts, cl, tok, 3,
                 pb.Layout(kind=pb.LAYOUT_MIRRORED), match="not mirrored")
    _, parts = download_parts(cl, tok, 4, pb.Layout(kind=pb.LAYOUT_MIRRORED))
    n = len(list(cl.call("Describe", pb.DescribeRequest(session_token=tok, ids=[2]),
                         pb.DescribeResponse).tensors[0].component_shapes))
    shards = [vals[i * 6 // n:(i + 1) * 6 // n] for i in range(n)]
    want = [-sum(s[j] for s in shards) for j in range(len(shards[0]))]
    assert unf32(parts[0]) == want, (unf32(parts[0]), want)
    _, parts = download_parts(cl, tok, 2, pb.Layout(kind=pb.LAYOUT_SHARDED, axis=0))
    assert unf32(parts[0]) == vals  # the session goes on


def check_bad_input(cl, d):
    """The bad-input table (README, "Bad input"): one row per refusal of a
    request's bytes, each with its status and the words of its message.
    Rows are raw bytes: strings that are not UTF-8 cannot be built from
    Python's str, so a same-length placeholder is swapped for them."""
    tok = cl.session(client_name="bad-input").session_token

    def swap(msg, old, new):
        raw = msg.SerializeToString()
        assert len(old) == len(new) and raw.count(old) == 1, (raw, old)
        return raw.replace(old, new)

    ld = lambda src: pb.LoadTensorsRequest(session_token=tok, source=src)
    meta = lambda k, v: pb.SaveTensorsRequest(
        session_token=tok, path="x.safetensors",
        tensors=[pb.SaveTensorSpec(name="x", id=1, layout=pb.Layout(kind=pb.LAYOUT_MIRRORED))],
        metadata=[pb.MetadataEntry(key=k, value=v)])
    table = [
        # (method, request bytes, code, message words)
        ("Echo", b"\xff\xff\xff\xff\x0f\x01", C.INVALID_ARGUMENT,
         r"malformed paradev.v1.EchoRequest: 6 bytes"),
        ("Execute", b"\x12\x00" * 400000, C.RESOURCE_EXHAUSTED, r"decoding budget"),
        # A NUL in any string field, at any depth (protobuf-c would cut it).
        ("CreateSession", pb.CreateSessionRequest(client_name="a\0b").SerializeToString(),
         C.INVALID_ARGUMENT, r"CreateSessionRequest: the string field 'client_name' holds a NUL"),
        ("CreateSession", pb.CreateSessionRequest(job_id="1\0002").SerializeToString(),
         C.INVALID_ARGUMENT, r"the string field 'job_id' holds a NUL byte"),
        ("LoadTensors", ld("a.npy\0../x").SerializeToString(), C.INVALID_ARGUMENT,
         r"the string field 'source' holds a NUL byte"),
        ("Execute", pb.ExecuteRequest(session_token=tok, ops=[pb.Operation(
            op="Neg\0x", inputs=[1], output_ids=[2])]).SerializeToString(),
         C.INVALID_ARGUMENT, r"the string field 'op' holds a NUL byte"),
        ("Execute", pb.ExecuteRequest(session_token=tok, ops=[pb.Operation(
            op="Fill", output_ids=[2], attrs=[attr("s", s="x\0y")])]).SerializeToString(),
         C.INVALID_ARGUMENT, r"the string field 's' holds a NUL byte"),
        ("RegisterSharedMemory", pb.RegisterSharedMemoryRequest(
            session_token=tok, name="r", key="/k\0x", byte_size=4096).SerializeToString(),
         C.INVALID_ARGUMENT, r"the string field 'key' holds a NUL byte"),
        # Client names and job ids: UTF-8 without control characters.
        ("CreateSession", swap(pb.CreateSessionRequest(client_name="badX"), b"badX", b"bad\xff"),
         C.INVALID_ARGUMENT, r"client_name: byte 3 \(0xFF\) is not UTF-8"),
        ("CreateSession", swap(pb.CreateSessionRequest(job_id="jXX"), b"jXX", b"j\xed\xa0"),
         C.INVALID_ARGUMENT, r"job_id: byte 1 \(0xED\) is not UTF-8"),
        ("CreateSession", pb.CreateSessionRequest(client_name="a\nb").SerializeToString(),
         C.INVALID_ARGUMENT, r"client_name: byte 1 \(0x0A\) is a control character"),
        ("CreateSession", pb.CreateSessionRequest(job_id="\x1b[2J").SerializeToString(),
         C.INVALID_ARGUMENT, r"job_id: byte 0 \(0x1B\) is a control character"),
        # Checkpoint metadata: UTF-8 (the file's JSON header must be).
        ("SaveTensors", swap(meta("kX", "v"), b"kX", b"k\xfe"), C.INVALID_ARGUMENT,
         r"a metadata key: byte 1 \(0xFE\) is not UTF-8"),
        ("SaveTensors", swap(meta("k", "cafX"), b"cafX", b"caf\xe9"), C.INVALID_ARGUMENT,
         r"a metadata value: byte 3 \(0xE9\) is not UTF-8"),
    ]
    for method, data, code, match in table:
        try:
            expect_error(code, cl.raw, SVC + method, data, timeout=30, match=match)
        except AssertionError as e:
            raise AssertionError("%s %r: %s" % (method, data[:40], e))
    r = cl.call("Echo", pb.EchoRequest(payload=b"still here"), pb.EchoResponse)
    assert r.payload == b"still here"


CHECKS = [check_echo, check_server_info, check_health, check_sessions,
          check_bad_tokens, check_upload_download, check_execute, check_sync_error,
          check_quota, check_enqueue, check_echo_stream, check_unknown_method,
          check_limits_and_garbage, check_fuzz, check_tape, check_papercuts,
          check_list_ops, check_layouts_never_guess, check_bad_input]


def main():
    failed = 0
    d = Daemon()
    try:
        for target in d.targets:
            cl = Client(target)
            for check in CHECKS:
                name = "%s @ %s" % (check.__name__, target.split(":")[0])
                try:
                    check(cl, d)
                    print("PASS", name, flush=True)
                except Exception:
                    failed += 1
                    print("FAIL", name, flush=True)
                    traceback.print_exc()
        for check in [check_lease_expiry, check_cancelled_upload, check_concurrent_clients,
                      check_log_warn_port]:
            try:
                check(Client(d.targets[1]), d)
                print("PASS", check.__name__, flush=True)
            except Exception:
                failed += 1
                print("FAIL", check.__name__, flush=True)
                traceback.print_exc()
        # A token from before a restart.
        old_tok = Client(d.targets[0]).session(client_name="restart").session_token
    finally:
        rc = d.stop()
    if rc != 0:
        failed += 1
        print("FAIL SIGTERM: exit status %s; log:\n%s" % (rc, "".join(d.lines)))
    else:
        print("PASS SIGTERM -> exit 0")
    d2 = Daemon()
    try:
        expect_error(C.NOT_FOUND, Client(d2.targets[0]).call, "KeepAlive",
                     pb.KeepAliveRequest(session_token=old_tok), pb.KeepAliveResponse,
                     match="daemon restarted")
        print("PASS stale token after restart -> NOT_FOUND daemon restarted")
    except Exception:
        failed += 1
        print("FAIL stale token after restart")
        traceback.print_exc()
    # A stream left open: shutdown waits the grace period (2 s), then
    # cancels it, and still exits 0.
    release = threading.Event()

    def idle_items():
        yield pb.EchoRequest(payload=b"first")
        release.wait(30)

    f = Client(d2.targets[1]).ch.stream_stream(
        SVC + "EchoStream", request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.EchoResponse.FromString)
    stream = f(idle_items(), timeout=60)
    try:
        assert next(stream).payload == b"first"
    except Exception:
        failed += 1
        print("FAIL open stream before shutdown")
        traceback.print_exc()
    t0 = time.monotonic()
    try:
        rc = d2.stop(signal.SIGINT)
    finally:
        release.set()
    took = time.monotonic() - t0
    if took > 10:
        failed += 1
        print("FAIL shutdown with an open stream took %.1f s" % took)
    if rc != 0:
        failed += 1
        print("FAIL SIGINT: exit status %s" % rc)
    else:
        print("PASS SIGINT -> exit 0")
    for line in d.lines + d2.lines:
        if "\ufffd" in line:
            failed += 1
            print("FAIL the daemon logged bytes that are not UTF-8:", repr(line))
        if "AddressSanitizer" in line or "runtime error" in line:
            failed += 1
            print("FAIL sanitizer report in the daemon's log:", line.strip())
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
