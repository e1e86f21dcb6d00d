#!/usr/bin/python3
"""Deadlines of queued ops (issue #15) against the real paradevd.

An op that reads a tensor still loading waits in its session's queue (the
session is held on that tensor); a checkpoint served by an HTTP server that
holds its ranges until this test lets them go keeps it there as long as the
test wants, so nothing here depends on timing. Checked: an op not started by
its deadline (an Execute request's op_timeout_ms, the session's
op_timeout_ms, the Execute call's own gRPC deadline) fails with
DEADLINE_EXCEEDED, with a message that names it, and so does an op that
consumes it; ops without a deadline wait on and compute the right values
(NumPy's); the session goes on. Waits are bounded by generous timeouts
(30 s), never a timing threshold.

Usage: test_deadlines.py PARADEVD PYTHON_PROTO_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio or numpy missing).
"""
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
import traceback

try:
    import grpc
    import numpy as np
except ImportError as e:
    print("SKIP: %s (run with /usr/bin/python3; apt-get install python3-grpcio "
          "python3-numpy)" % e)
    sys.exit(77)

if len(sys.argv) != 3:
    print(__doc__)
    sys.exit(2)
PARADEVD = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from paradev.v1 import paradev_pb2 as pb  # noqa: E402

SVC = "/paradev.v1.ParallelDevice/"
NDEV = 2
DEADLINE_EXCEEDED = 4  # gRPC's code, as SyncResponse.error carries it
GATES = {}  # file name -> threading.Event: its ranges past 64 KiB wait on it


def write_safetensors(path, name, a):
    b = a.astype("<f4").tobytes()
    h = json.dumps({name: {"dtype": "F32", "shape": list(a.shape),
                           "data_offsets": [0, len(b)]}}).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b)


class GateHandler(http.server.SimpleHTTPRequestHandler):
    """Range reads (206) of the directory's files; a range past the first
    64 KiB of a gated file waits for its gate."""

    def log_message(self, *a):
        pass

    def do_GET(self):  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return self.send_error(404)
        data = open(path, "rb").read()
        m = re.match(r"bytes=(\d+)-(\d*)$", self.headers.get("Range") or "")
        if not m:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        b0 = int(m.group(1))
        b1 = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
        gate = GATES.get(os.path.basename(path))
        if gate is not None and b0 >= 65536:
            gate.wait(60)
        self.send_response(206)
        self.send_header("Content-Range", "bytes %d-%d/%d" % (b0, b1, len(data)))
        self.send_header("Content-Length", str(b1 - b0 + 1))
        self.send_header("ETag", '"%x"' % len(data))
        self.end_headers()
        self.wfile.write(data[b0:b1 + 1])

    def do_HEAD(self):  # noqa: N802
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            return self.send_error(404)
        self.send_response(200)
        self.send_header("Content-Length", str(os.stat(path).st_size))
        self.send_header("ETag", '"%x"' % os.stat(path).st_size)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()


class Daemon:
    def __init__(self, root_url):
        self.dir = tempfile.mkdtemp(prefix="paradevd-deadline-")
        sock = os.path.join(self.dir, "pd.sock")
        conf = os.path.join(self.dir, "paradevd.conf")
        with open(conf, "w") as f:
            f.write("[storage]\nblock_size = 64K\nfetch_timeout_s = 60\n")
        self.proc = subprocess.Popen(
            [PARADEVD, "--config", conf, "--listen", "unix:" + sock,
             "--admin-socket", "", "--devices", str(NDEV), "--grace-ms", "1000",
             "--storage-root", root_url],
            stderr=subprocess.PIPE, text=True, errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(20):
            self.proc.kill()
            raise RuntimeError("paradevd not ready:\n" + "".join(self.lines))
        self.ch = grpc.insecure_channel("unix:" + sock)

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

    def stop(self):
        self.ch.close()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


def session(d, **kw):
    return d.call("CreateSession", pb.CreateSessionRequest(
        client_name="deadlines", **kw), pb.CreateSessionResponse).session_token


def load(d, tok, url, hid):
    r = d.call("LoadTensors", pb.LoadTensorsRequest(
        session_token=tok, source=url, tensors=[pb.LoadTensorSpec(name="v", id=hid)]),
        pb.LoadTensorsResponse)
    return r.load_id


def wait_load(d, tok, load_id):
    for _ in range(60):
        p = d.call("GetLoadProgress", pb.GetLoadProgressRequest(
            session_token=tok, load_id=load_id, wait_ms=1000),
            pb.GetLoadProgressResponse)
        if p.done:
            assert p.status.code == 0, p.status
            return
    raise AssertionError("load %d not done" % load_id)


def op(name, inputs, out):
    return pb.Operation(op=name, inputs=inputs, output_ids=[out])


def execute(d, tok, ops, timeout=30, **kw):
    return d.call("Execute", pb.ExecuteRequest(session_token=tok, ops=ops, **kw),
                  pb.ExecuteResponse, timeout=timeout)


def sync(d, tok, ids):
    return d.call("Sync", pb.SyncRequest(session_token=tok, ids=ids),
                  pb.SyncResponse).error


def download(d, tok, hid):
    f = d.ch.unary_stream(SVC + "Download",
                          request_serializer=lambda m: m.SerializeToString(),
                          response_deserializer=pb.DownloadResponse.FromString)
    msgs = list(f(pb.DownloadRequest(session_token=tok, id=hid, layout=pb.Layout(
        kind=pb.LAYOUT_MIRRORED)), timeout=30))
    return np.frombuffer(b"".join(m.chunk.data for m in msgs[1:]), "<f4")


def expect_expired(err, op_name, source):
    assert err.code == DEADLINE_EXCEEDED, err
    assert "%s (op " % op_name in err.message, err.message
    assert "was not started by its deadline" in err.message, err.message
    assert source in err.message, err.message
    assert "in the queue" in err.message, err.message


def check(d, web):
    rng = np.random.default_rng(15)
    x = rng.standard_normal(1000).astype(np.float32)
    write_safetensors(os.path.join(web, "x.safetensors"), "v", x)
    bigs = {}
    for k in range(3):
        name = "big%d.safetensors" % k
        bigs[k] = rng.standard_normal(64 * 1024).astype(np.float32)  # 256 KiB
        write_safetensors(os.path.join(web, name), "v", bigs[k])
        GATES[name] = threading.Event()
    url = "http://127.0.0.1:%d/" % d.web_port

    # 1. The request's op_timeout_ms: A = big0 + big0 is held behind the
    # load, expires; B = Neg(A) (no deadline) fails with A's error once it
    # runs; C = Neg(x) (no deadline) waits and is right.
    tok = session(d)
    wait_load(d, tok, load(d, tok, url + "x.safetensors", 1))
    lid = load(d, tok, url + "big0.safetensors", 500)
    execute(d, tok, [op("Add", [500, 500], 600)], op_timeout_ms=200)
    execute(d, tok, [op("Neg", [600], 601), op("Neg", [1], 602)])
    expect_expired(sync(d, tok, [600]), "Add", "the op's own timeout_ms")
    GATES["big0.safetensors"].set()
    wait_load(d, tok, lid)
    err = sync(d, tok, [601])
    expect_expired(err, "Add", "the op's own timeout_ms")  # the consumer
    assert sync(d, tok, [602]).code == 0
    assert np.array_equal(download(d, tok, 602), -x)
    # The session goes on: the same op again, now that nothing holds it.
    execute(d, tok, [op("Add", [500, 500], 603)], op_timeout_ms=10000)
    assert np.array_equal(download(d, tok, 603), bigs[0] + bigs[0])

    # 2. The session's op_timeout_ms, for every op of the session.
    tok2 = session(d, op_timeout_ms=150)
    wait_load(d, tok2, load(d, tok2, url + "x.safetensors", 1))
    lid = load(d, tok2, url + "big1.safetensors", 500)
    execute(d, tok2, [op("Mul", [500, 500], 700)])
    expect_expired(sync(d, tok2, [700]), "Mul", "the session's op_timeout_ms")
    GATES["big1.safetensors"].set()
    wait_load(d, tok2, lid)
    execute(d, tok2, [op("Mul", [500, 500], 701)])
    assert np.array_equal(download(d, tok2, 701), bigs[1] * bigs[1])

    # 3. The Execute call's own gRPC deadline (0.5 s): Execute answers at
    # once (the op is queued), and the op expires in the queue.
    tok3 = session(d)
    lid = load(d, tok3, url + "big2.safetensors", 500)
    execute(d, tok3, [op("Neg", [500], 800)], timeout=0.5)
    expect_expired(sync(d, tok3, [800]), "Neg",
                   "the deadline of the call that queued it")
    GATES["big2.safetensors"].set()
    wait_load(d, tok3, lid)
    execute(d, tok3, [op("Neg", [500], 801)])
    assert np.array_equal(download(d, tok3, 801), -bigs[2])
    # Another session was never touched by any of it.
    assert np.array_equal(download(d, tok, 602), -x)


def main():
    web = tempfile.mkdtemp(prefix="deadline-web-")
    srv = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: GateHandler(*a, directory=web))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    d = Daemon("http://127.0.0.1:%d/" % srv.server_address[1])
    d.web_port = srv.server_address[1]
    failed = 0
    try:
        check(d, web)
        print("PASS deadlines", flush=True)
    except Exception:  # noqa: BLE001
        failed = 1
        print("FAIL deadlines", flush=True)
        traceback.print_exc()
    finally:
        for g in GATES.values():
            g.set()
        rc = d.stop()
        srv.shutdown()
        shutil.rmtree(web, ignore_errors=True)
    if rc != 0:
        failed = 1
        print("FAIL SIGTERM: exit status %s; log:\n%s" % (rc, "".join(d.lines)))
    return failed


if __name__ == "__main__":
    sys.exit(main())
