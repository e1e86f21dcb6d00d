#!/usr/bin/python3
"""Sharing the devices (issue #15), against the real paradevd with an
independent client (grpcio and protoc's message classes):

1. CreateSession's priority (field 180) and weight (181) reach the
   scheduler: in range a session serves; a band out of -8..8 or a weight
   over 10000 is INVALID_ARGUMENT naming the range.
2. Admission by device time ([limits] max_queued_device_ms = 1): one
   Execute of two MatMuls [256,256] x [256,256] is refused with
   RESOURCE_EXHAUSTED saying what is queued, what was asked and the bound;
   each op's estimate worked out by hand from device/cost.c's CPU rates:
   2 us + max(2*256^3 FLOPs / 20e9, 3*256*256*4 bytes / 8e9) s
   = 2 + 1677.72 us = 1.680 ms, so two are 3.359 ms. One MatMul alone on
   an empty queue is admitted however large, and computes 256 * 0.5 * 0.25.
3. [scheduler] fair_share = false (the round-robin baseline) serves too.

Usage: test_sharing.py PARADEVD PYTHON_PROTO_DIR
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


class Daemon:
    def __init__(self, conf_text):
        self.dir = tempfile.mkdtemp(prefix="paradevd-sharing-")
        conf = os.path.join(self.dir, "paradevd.conf")
        with open(conf, "w") as f:
            f.write(conf_text)
        self.sock = os.path.join(self.dir, "pd.sock")
        args = [PARADEVD, "--config", conf, "--listen", "unix:" + self.sock,
                "--admin-socket", "", "--devices", "2", "--grace-ms", "2000"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.lines = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(20):
            self.proc.kill()
            raise RuntimeError("paradevd not ready; log:\n" + "".join(self.lines))
        self.ch = grpc.insecure_channel("unix:" + self.sock)

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def call(self, method, req, resp_cls):
        f = self.ch.unary_unary(SVC + method,
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=20)

    def stop(self):
        self.ch.close()
        self.proc.terminate()
        rc = self.proc.wait(15)
        self.reader.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)
        assert rc == 0, "paradevd exited %d; log:\n%s" % (rc, "".join(self.lines))


def expect_error(code, fn, *args, match=None, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if match:
            assert re.search(match, e.details() or ""), \
                "message %r does not match %r" % (e.details(), match)
        return e.details()
    raise AssertionError("expected %s, the call succeeded" % code)


def attr(name, **v):
    return pb.Attr(name=name, value=pb.AttrValue(**v))


def fill(out_id, dims, value):
    return pb.Operation(op="Fill", output_ids=[out_id], attrs=[
        attr("shape", shape=pb.Shape(dims=dims)), attr("value", f=value),
        attr("dtype", dtype=pb.DTYPE_FLOAT32)])


def matmul(out_id):
    return pb.Operation(op="MatMul", inputs=[1, 2], output_ids=[out_id])


def session(d, **kw):
    return d.call("CreateSession", pb.CreateSessionRequest(client_name="sharing", **kw),
                  pb.CreateSessionResponse).session_token


def execute(d, tok, *ops):
    return d.call("Execute", pb.ExecuteRequest(session_token=tok, ops=ops),
                  pb.ExecuteResponse)


def first_value(d, tok, hid):
    f = d.ch.unary_stream(SVC + "Download",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.DownloadResponse.FromString)
    req = pb.DownloadRequest(session_token=tok, id=hid,
                             layout=pb.Layout(kind=pb.LAYOUT_MIRRORED))
    data = b"".join(r.chunk.data for r in f(req, timeout=30) if r.HasField("chunk"))
    return struct.unpack("<f", data[:4])[0]


def check_priority_weight_and_admission():
    d = Daemon("[limits]\nmax_queued_device_ms = 1\n")
    try:
        expect_error(C.INVALID_ARGUMENT, session, d, priority=9,
                     match=r"priority 9 out of range: expected -8 to 8")
        expect_error(C.INVALID_ARGUMENT, session, d, weight=10001,
                     match=r"weight 10001 out of range: expected 1 to 10000")
        tok = session(d, priority=3, weight=7)
        execute(d, tok, fill(1, [256, 256], 0.5), fill(2, [256, 256], 0.25))
        d.call("Sync", pb.SyncRequest(session_token=tok), pb.SyncResponse)
        msg = expect_error(C.RESOURCE_EXHAUSTED, execute, d, tok, matmul(3), matmul(4))
        for want in ["0 ops queued, an estimated 0.000 ms",
                     "with 2 more (3.359 ms)", "max_queued_device_ms = 1.000 ms"]:
            assert want in msg, (want, msg)
        execute(d, tok, matmul(3))
        assert first_value(d, tok, 3) == 256 * 0.5 * 0.25
    finally:
        d.stop()


def check_round_robin_baseline():
    d = Daemon("[scheduler]\nfair_share = false\ndispatch_ahead_us = 0\n")
    try:
        tok = session(d)
        execute(d, tok, fill(1, [4, 4], 2.0), fill(2, [4, 4], 3.0), matmul(3))
        assert first_value(d, tok, 3) == 4 * 2.0 * 3.0
    finally:
        d.stop()


def main():
    failed = 0
    for check in (check_priority_weight_and_admission, check_round_robin_baseline):
        try:
            check()
            print("PASS", check.__name__)
        except Exception:
            failed += 1
            print("FAIL", check.__name__)
            traceback.print_exc()
    print("%d failed" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
