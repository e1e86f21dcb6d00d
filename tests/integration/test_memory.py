#!/usr/bin/python3
"""Memory that is enforced (issue #15), against the real paradevd.

1. The default configuration (4 CPU devices, no memory flags): one
   RandomNormal [50000, 50000] float32 (10 GB a component) is refused with
   RESOURCE_EXHAUSTED, by the default session quota for a session that asked
   none and by its own quota, capped at the mesh's memory (the sum of the
   device limits) when no max_memory_quota is set, for a session that asked
   2^50 bytes; the daemon never
   allocates it (its peak RSS stays under a gigabyte) and serves on.
2. A daemon with a small memory (2 devices of 64 MiB): the default quota is
   half the mesh's memory (64 MiB), so 48 MiB mirrored (96 MiB of quota) is
   refused; a session asking 2^64 - 1 bytes gets the mesh's 128 MiB; an op
   over a device's limit fails naming the device (cpu:0, the bytes asked and
   in use), and the next ones run; freed blocks appear as memory_cached_bytes in
   GetServerInfo and /metrics.
Expected values are computed here by hand.

Usage: test_memory.py PARADEVD PYTHON_PROTO_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import traceback
import urllib.request

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed for %s" % sys.executable)
    sys.exit(77)

if len(sys.argv) != 3:
    print(__doc__)
    sys.exit(2)
PARADEVD = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from paradev.v1 import paradev_pb2 as pb  # noqa: E402

SVC = "/paradev.v1.ParallelDevice/"
C = grpc.StatusCode
MiB = 1 << 20


class Daemon:
    def __init__(self, *extra):
        self.dir = tempfile.mkdtemp(prefix="paradevd-mem-")
        conf = os.path.join(self.dir, "empty.conf")
        open(conf, "w").close()  # the defaults, whatever /etc holds
        self.sock = os.path.join(self.dir, "pd.sock")
        args = [PARADEVD, "--config", conf, "--listen", "unix:" + self.sock,
                "--metrics-listen", "127.0.0.1:0", "--admin-socket", "",
                "--grace-ms", "2000", *extra]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(60):
            self.proc.kill()
            raise RuntimeError("not ready:\n" + "".join(self.lines))
        m = [re.search(r"metrics on http://127\.0\.0\.1:(\d+)/", l) for l in self.lines]
        self.http = int([x for x in m if x][0].group(1))
        self.ch = grpc.insecure_channel("unix:" + self.sock)

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def call(self, method, req, resp_cls, timeout=30):
        f = self.ch.unary_unary(SVC + method,
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def session(self, **kw):
        return self.call("CreateSession", pb.CreateSessionRequest(**kw),
                         pb.CreateSessionResponse).session_token

    def status_kb(self, field):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return 0

    def metrics(self):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.http,
                                    timeout=30) as r:
            return r.read().decode()

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def attr(name, **v):
    return pb.Attr(name=name, value=pb.AttrValue(**v))


def gen_op(op, out_id, dims, **extra):
    attrs = [attr("shape", shape=pb.Shape(dims=dims)),
             attr("dtype", dtype=pb.DTYPE_FLOAT32)]
    if op == "Fill":
        attrs.append(attr("value", f=extra.get("value", 1.0)))
    return pb.Operation(op=op, output_ids=[out_id], attrs=attrs)


def execute(d, tok, ops):
    """(the gRPC error or None, the Sync error message or "")."""
    try:
        d.call("Execute", pb.ExecuteRequest(session_token=tok, ops=ops),
               pb.ExecuteResponse)
    except grpc.RpcError as e:
        return e, ""
    s = d.call("Sync", pb.SyncRequest(session_token=tok), pb.SyncResponse)
    return None, (s.error.code, s.error.message)


def serves_on(d):
    """A small op runs and downloads the right value: the daemon serves on."""
    tok = d.session(client_name="after")
    err, (code, msg) = execute(d, tok, [gen_op("Fill", 1, [3], value=2.5)])
    assert err is None and code == 0, (err, msg)
    f = d.ch.unary_stream(SVC + "Download",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.DownloadResponse.FromString)
    data = b"".join(m.chunk.data for m in f(pb.DownloadRequest(
        session_token=tok, id=1, layout=pb.Layout(kind=pb.LAYOUT_MIRRORED)),
        timeout=30) if m.WhichOneof("item") == "chunk")
    assert struct.unpack("<3f", data) == (2.5, 2.5, 2.5), data


def check_default_config():
    d = Daemon()
    try:
        big = [50000, 50000]  # float32: 10,000,000,000 bytes a component
        info = d.call("GetServerInfo", pb.GetServerInfoRequest(),
                      pb.GetServerInfoResponse)
        limit = info.devices[0].memory_limit_bytes
        assert len(info.devices) == 4 and limit > 0, info
        if limit >= 10_000_000_000:  # a host of 40 GB or more
            big = [50000, limit // 200000 + 1]
        asked = big[0] * big[1] * 4
        # No quota of its own: the default (half the mesh) refuses it.
        tok = d.session(client_name="default-quota")
        err, _ = execute(d, tok, [gen_op("RandomNormal", 1, big)])
        assert err is not None and err.code() == C.RESOURCE_EXHAUSTED, err
        assert "quota" in err.details(), err.details()
        print("PASS default quota:", err.details())
        # A quota of its own: without max_memory_quota it is capped at the
        # mesh's memory (4 device limits), which still refuses 4 components
        # of `asked` bytes, each over a device's limit.
        r = d.call("CreateSession", pb.CreateSessionRequest(
            client_name="own-quota", memory_quota_bytes=1 << 50),
            pb.CreateSessionResponse)
        assert r.memory_quota_bytes == 4 * limit, (r.memory_quota_bytes, limit)
        err, _ = execute(d, r.session_token, [gen_op("RandomNormal", 1, big)])
        assert err is not None and err.code() == C.RESOURCE_EXHAUSTED, err
        assert "quota" in err.details(), err.details()
        print("PASS own quota capped at the mesh:", err.details())
        hwm = d.status_kb("VmHWM")
        assert hwm < 1 << 20, "peak RSS %d kB: the tensor was allocated" % hwm
        print("PASS never allocated: peak RSS %.0f MiB" % (hwm / 1024))
        serves_on(d)
        print("PASS serves on")
    finally:
        assert d.stop() == 0


def check_small_memory():
    d = Daemon("--devices", "2", "--memory-limit", "64M")
    try:
        tok = d.session(client_name="default-quota")  # 64 MiB of 2 x 64 MiB
        err, _ = execute(d, tok, [gen_op("Fill", 1, [12 * MiB])])  # 48 MiB x 2
        assert err is not None and err.code() == C.RESOURCE_EXHAUSTED, err
        assert re.search(r"quota.*67108864", err.details()), err.details()
        print("PASS default quota (half of 128 MiB):", err.details())
        err, (code, msg) = execute(d, tok, [gen_op("Fill", 2, [4 * MiB])])  # 16 MiB x 2
        assert err is None and code == 0, (err, msg)
        r = d.call("CreateSession", pb.CreateSessionRequest(
            client_name="huge", memory_quota_bytes=2**64 - 1), pb.CreateSessionResponse)
        assert r.memory_quota_bytes == 2 * 64 * MiB, r.memory_quota_bytes
        print("PASS a quota of 2^64 - 1 asked, %d bytes (the mesh) given" %
              r.memory_quota_bytes)
        tok2 = d.session(client_name="own-quota", memory_quota_bytes=1 << 40)
        err, (code, msg) = execute(d, tok2, [gen_op("Fill", 1, [14 * MiB])])  # 56 MiB
        assert err is None and code == C.RESOURCE_EXHAUSTED.value[0], (err, code, msg)
        assert re.search(r"cpu:[01] is out of memory: 58720256 bytes requested "
                         r"with 16777216 of 67108864 bytes in use", msg), msg
        print("PASS device limit:", msg)
        # Freed: 16 MiB a device goes to the block cache, counted as cached.
        d.call("Delete", pb.DeleteRequest(session_token=tok, ids=[2]),
               pb.DeleteResponse)
        d.call("Sync", pb.SyncRequest(session_token=tok), pb.SyncResponse)
        info = d.call("GetServerInfo", pb.GetServerInfoRequest(),
                      pb.GetServerInfoResponse)
        for dv in info.devices:
            assert dv.memory_used_bytes == 0, dv
            assert dv.memory_cached_bytes in (0, 16 * MiB), dv  # 0: trimmed idle
        assert re.search(r'^paradev_device_memory_cached_bytes\{device="1"\} \d+$',
                         d.metrics(), re.M)
        serves_on(d)
        print("PASS cached bytes shown; serves on")
    finally:
        assert d.stop() == 0


def main():
    failed = 0
    for check in (check_default_config, check_small_memory):
        try:
            check()
        except Exception:
            failed += 1
            print("FAIL", check.__name__)
            traceback.print_exc()
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
