#!/usr/bin/python3
"""paradevd as a service, tested on real daemons over real sockets.

 - config:   --check-config on good files and on each kind of error (unknown
             key, bad value, syntax, missing file, bad flag), with the file,
             line, key and what was expected; deploy/paradevd.conf holds
             every key the daemon knows; flags override the file.
 - notify:   the sd_notify sequence read from a test NOTIFY_SOCKET: READY=1
             once the port accepts, WATCHDOG=1 while healthy, RELOADING=1 ...
             READY=1 around SIGHUP (and what a reload changes), STOPPING=1.
 - metrics:  /metrics parsed after a scripted workload, each counter checked
             against what the workload did.
 - drain:    /healthz, /readyz, health Check and Watch through an Admin
             drain and back; SIGTERM: queued ops complete, new sessions get
             UNAVAILABLE, exit 0; the drain timeout; a second SIGTERM; a
             shutdown stuck in grpc_shutdown (a preloaded stand-in) ends
             with status 1 by itself, or at once on a second SIGTERM.
 - admin:    kill by job id frees every byte (GetServerInfo and /metrics),
             ListSessions, kill by number and token, SetLogLevel, operators
             only; `paradev admin` (the Slurm scripts: test_ops.py).
 - waits:    Sync and Download honour the deadline and cancellation while
             the devices are busy; quotas charge nothing for aliasing ops.

Long-running work is sized by measuring this machine first (a run of
MatMuls), never by assuming its speed; waits on the daemon poll with
generous limits that only catch hangs.

Usage: test_service.py PARADEVD PYTHON_PROTO_DIR PARADEV_ADMIN_CLI DEPLOY_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import shutil
import atexit
import json
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed for %s "
          "(apt-get install python3-grpcio; run with /usr/bin/python3)" % sys.executable)
    sys.exit(77)

if len(sys.argv) != 5:
    print(__doc__)
    sys.exit(2)
PARADEVD, PYDIR, ADMIN_CLI, DEPLOY = sys.argv[1:5]
sys.path.insert(0, PYDIR)
from paradev.v1 import paradev_pb2 as pb  # noqa: E402
from paradev.v1 import admin_pb2 as apb  # noqa: E402
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
ADMIN = "/paradev.v1.Admin/"
C = grpc.StatusCode
H = health_pb2.HealthCheckResponse
ALL_LOGS = []


def wait_for(fn, what, limit=60.0):
    """Polls fn() until it returns a true value; fails after `limit` s (a hang)."""
    end = time.monotonic() + limit
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


class Daemon:
    """A paradevd child with its gRPC, admin and HTTP listeners on fresh
    addresses. `env` adds to a clean environment (no NOTIFY_SOCKET)."""

    def __init__(self, *extra, config=None, env=None, ndev=2, mem=64 << 20,
                 admin=True, metrics=True):
        self.dir = _mkdtemp(prefix="paradevd-svc-")
        self.sock = os.path.join(self.dir, "pd.sock")
        self.admin = os.path.join(self.dir, "admin.sock")
        args = [PARADEVD, "--listen", "unix:" + self.sock, "--listen", "127.0.0.1:0",
                *([] if admin is None else ["--admin-socket", self.admin if admin else ""]),
                "--metrics-listen", "127.0.0.1:0" if metrics else "",
                "--devices", str(ndev), "--memory-limit", str(mem),
                "--grace-ms", "2000"]
        if config:
            args += ["--config", config]
        args += list(extra)
        e = {k: v for k, v in os.environ.items()
             if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "PARADEV_LOG",
                          "RUNTIME_DIRECTORY")}
        e.update(env or {})
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace", env=e)
        self.lines = []
        ALL_LOGS.append(self.lines)
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(60):
            self.proc.kill()
            raise RuntimeError("paradevd not ready in 60 s; log:\n" + "".join(self.lines))
        self.port = int(self.find(r"listening on 127\.0\.0\.1:(\d+)").group(1))
        self.http = int(self.find(r"metrics on http://127\.0\.0\.1:(\d+)/").group(1)) \
            if metrics else None
        self.target = "127.0.0.1:%d" % self.port

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def find(self, pattern):
        for line in list(self.lines):
            m = re.search(pattern, line)
            if m:
                return m
        return None

    def wait_line(self, pattern, limit=60.0):
        return wait_for(lambda: self.find(pattern), "log line /%s/" % pattern, limit)

    def log(self):
        return "".join(self.lines)

    def stop(self, sig=signal.SIGTERM, timeout=120):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.reader.join(5)
        return rc


class Client:
    def __init__(self, target):
        self.ch = grpc.insecure_channel(target)

    def call(self, path, req, resp_cls, timeout=30):
        f = self.ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=timeout)

    def pd(self, method, req, resp_cls, timeout=30):
        return self.call(SVC + method, req, resp_cls, timeout)

    def admin(self, method, req, resp_cls, timeout=60):
        return self.call(ADMIN + method, req, resp_cls, timeout)

    def session(self, **kw):
        return self.pd("CreateSession", pb.CreateSessionRequest(**kw),
                       pb.CreateSessionResponse).session_token

    def info(self):
        return self.pd("GetServerInfo", pb.GetServerInfoRequest(), pb.GetServerInfoResponse)

    def mem(self):
        return [d.memory_used_bytes for d in self.info().devices]

    def health(self, service=""):
        return self.call("/grpc.health.v1.Health/Check",
                         health_pb2.HealthCheckRequest(service=service),
                         health_pb2.HealthCheckResponse).status

    def upload(self, tok, hid, n, chunk=256):
        data = struct.pack("<%df" % n, *[float(i % 17) for i in range(n)])
        hdr = pb.UploadHeader(session_token=tok, id=hid, dtype=pb.DTYPE_FLOAT32,
                              shape=pb.Shape(dims=[n]))
        items = [pb.UploadRequest(header=hdr)]
        for off in range(0, len(data), chunk):
            items.append(pb.UploadRequest(chunk=pb.UploadChunk(
                offset=off, data=data[off:off + chunk])))
        f = self.ch.stream_unary(SVC + "Upload",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.UploadResponse.FromString)
        return f(iter(items), timeout=30)

    def upload_matrix(self, tok, hid, n):
        data = struct.pack("<%df" % (n * n), *[((i * 7) % 11 - 5) / 50.0 for i in range(n * n)])
        hdr = pb.UploadHeader(session_token=tok, id=hid, dtype=pb.DTYPE_FLOAT32,
                              shape=pb.Shape(dims=[n, n]))
        items = [pb.UploadRequest(header=hdr)]
        for off in range(0, len(data), 60000):
            items.append(pb.UploadRequest(chunk=pb.UploadChunk(
                offset=off, data=data[off:off + 60000])))
        f = self.ch.stream_unary(SVC + "Upload",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.UploadResponse.FromString)
        return f(iter(items), timeout=60)

    def execute(self, tok, *ops):
        return self.pd("Execute", pb.ExecuteRequest(session_token=tok, ops=ops),
                       pb.ExecuteResponse)

    def enqueue(self, items, timeout=300):
        f = self.ch.stream_stream(SVC + "Enqueue",
                                  request_serializer=lambda m: m.SerializeToString(),
                                  response_deserializer=pb.EnqueueResponse.FromString)
        return list(f(iter(items), timeout=timeout))

    def download(self, tok, hid, timeout=30, chunk_bytes=0):
        f = self.ch.unary_stream(SVC + "Download",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.DownloadResponse.FromString)
        return list(f(pb.DownloadRequest(session_token=tok, id=hid, chunk_bytes=chunk_bytes,
                                 layout=pb.Layout(kind=pb.LAYOUT_MIRRORED)),
                      timeout=timeout))

    def sync(self, tok, ids=(), timeout=300):
        return self.pd("Sync", pb.SyncRequest(session_token=tok, ids=list(ids)),
                       pb.SyncResponse, timeout=timeout)

    def describe(self, tok, ids):
        return self.pd("Describe", pb.DescribeRequest(session_token=tok, ids=ids),
                       pb.DescribeResponse).tensors


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


def fill_op(out_id, dims, value=1.0):
    return pb.Operation(op="Fill", output_ids=[out_id], attrs=[
        attr("shape", shape=pb.Shape(dims=dims)), attr("value", f=value),
        attr("dtype", dtype=pb.DTYPE_FLOAT32)])


def http_get(port, path, method="GET"):
    """(status, body, content type) of an HTTP request to the daemon."""
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode(), r.headers.get("Content-Type")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers.get("Content-Type")


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def scrape(port):
    """Parses /metrics: {(name, frozenset(labels)): value}, checking the
    exposition format on the way (every sample's family has HELP and TYPE)."""
    status, text, ctype = http_get(port, "/metrics")
    assert status == 200, status
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    types, helps, out = {}, set(), {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            helps.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, typ = line.split()
            assert typ in ("counter", "gauge", "histogram"), line
            types[name] = typ
        else:
            m = SAMPLE.match(line)
            assert m, "not a sample line: %r" % line
            name, labels, value = m.group(1), m.group(2) or "", m.group(3)
            pairs = LABEL.findall(labels)
            assert ",".join('%s="%s"' % p for p in pairs) == labels, labels
            family = re.sub(r"_(bucket|sum|count)$", "", name) \
                if re.sub(r"_(bucket|sum|count)$", "", name) in types else name
            assert family in types and family in helps, "no TYPE/HELP for " + name
            if types[family] == "counter":
                assert name.endswith("_total"), name
            out[(name, frozenset(pairs))] = float(value)
    return out


def metric(m, name, **labels):
    return m.get((name, frozenset(labels.items())))


def series(m, name):
    """[(labels dict, value)] of one metric name."""
    return [(dict(k[1]), v) for k, v in m.items() if k[0] == name]


def matmul_chain(tok, n_ops, first_id, w_id, x_id):
    """Enqueue items: n_ops MatMuls of x by w, each output deleted at once but
    the last, so memory stays flat; devices run them in order, so the last
    output is computed after all the others. A component is freed when its
    op is done on every device, so an AllReduce every 8 ops keeps the devices
    (and the memory they hold) from drifting apart."""
    items = []
    for i in range(n_ops):
        out = first_id + i
        items.append(pb.EnqueueRequest(session_token=tok if i == 0 else b"",
                                       execute=pb.Operation(op="MatMul", inputs=[x_id, w_id],
                                                            output_ids=[out])))
        if i + 1 < n_ops:
            dead = [out]
            if i % 8 == 7:
                red = first_id + n_ops + i
                items.append(pb.EnqueueRequest(execute=pb.Operation(
                    op="AllReduce", inputs=[out], output_ids=[red])))
                dead.append(red)
            items.append(pb.EnqueueRequest(delete=pb.DeleteItem(ids=dead)))
    return items, first_id + n_ops - 1


MATRIX = 384
_per_op = {}


def seconds_per_matmul(d):
    """Measures one MatMul of MATRIX x MATRIX on this daemon (machines and
    builds differ by 100x: sanitizers, core counts)."""
    if d in _per_op:
        return _per_op[d]
    cl = Client(d.target)
    tok = cl.session(client_name="calibrate")
    cl.upload_matrix(tok, 1, MATRIX)
    cl.upload_matrix(tok, 2, MATRIX)
    best = None
    for rnd in range(2):
        items, last = matmul_chain(tok, 20, 1000 + 100 * rnd, 2, 1)
        t0 = time.monotonic()
        replies = cl.enqueue(items)
        assert all(r.status.code == 0 for r in replies)
        assert cl.sync(tok, [last]).error.code == 0
        dt = (time.monotonic() - t0) / 20
        best = dt if best is None else min(best, dt)
        cl.pd("Delete", pb.DeleteRequest(session_token=tok, ids=[last]), pb.DeleteResponse)
    cl.pd("CloseSession", pb.CloseSessionRequest(session_token=tok), pb.CloseSessionResponse)
    _per_op[d] = max(best, 1e-5)
    return _per_op[d]


def busy_work(d, cl, tok, seconds, first_id=100000):
    """Queues about `seconds` of device work in session tok (its operands
    uploaded here as first_id-2 and first_id-1); returns the id of the last
    output."""
    cl.upload_matrix(tok, first_id - 2, MATRIX)
    cl.upload_matrix(tok, first_id - 1, MATRIX)
    n = int(seconds / seconds_per_matmul(d)) + 1
    items, last = matmul_chain(tok, n, first_id, first_id - 1, first_id - 2)
    replies = cl.enqueue(items)
    assert all(r.status.code == 0 for r in replies), [r for r in replies if r.status.code][:1]
    return last


# --------------------------------------------------------------------------
# config


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


def check_config():
    tmp = _mkdtemp(prefix="paradevd-conf-")
    run = lambda *a: subprocess.run([PARADEVD, "--check-config", *a], capture_output=True,
                                    text=True, timeout=60)
    good = write(os.path.join(tmp, "good.conf"),
                 "; a comment\n[daemon]\nlisten = 127.0.0.1:0, unix:/tmp/x.sock\n"
                 "listen = [::1]:7478\n  threads = 2\n[limits]\nmax_tensor_bytes = 1G\n"
                 "[sessions]\ndefault_memory_quota = 64M  ; inline comment\n"
                 "max_memory_quota = 1G\n[log]\nlevel = info,sched=debug\n")
    r = run("--config", good)
    assert r.returncode == 0 and "configuration OK" in r.stdout, (r.stdout, r.stderr)
    r = run("--config", os.path.join(DEPLOY, "paradevd.conf"))
    assert r.returncode == 0, r.stderr

    def bad(name, text, *want, flags=()):
        path = write(os.path.join(tmp, name), text)
        r = run("--config", path, *flags)
        assert r.returncode != 0, (name, r.stdout)
        for w in want:
            w = w.replace("FILE", path)
            assert w in r.stderr, "%s: %r not in:\n%s" % (name, w, r.stderr)
        return r.stderr

    bad("unknown.conf", "[daemon]\nthreads = 2\nthread = 4\n",
        "FILE:3: unknown key 'thread' in [daemon] (expected one of: listen,")
    bad("value.conf", "[limits]\n\nmax_sessions = lots\n",
        "FILE:3: [limits] max_sessions = 'lots': expected an integer from 1 to 1000000")
    bad("size.conf", "[limits]\nmax_message_bytes = 100\n",
        "FILE:2: [limits] max_message_bytes = '100': expected a byte count from 4096")
    bad("enum.conf", "[devices]\nbackend = tpu\n",
        "FILE:2: [devices] backend = 'tpu': expected cpu or cuda")
    bad("addr.conf", "[daemon]\nlisten = 127.0.0.1\n",
        "FILE:2: [daemon] listen = '127.0.0.1': '127.0.0.1' is not an address: expected "
        "unix:/absolute/path or host:port")
    bad("log.conf", "[log]\nlevel = loud\n", "FILE:2: [log] level = 'loud'",
        "is not one of error, warn, info, debug")
    # An admin socket others may write to would let any local user kill
    # sessions: refused.
    for mode in ("0777", "0662", "2"):
        bad("mode%s.conf" % mode, "[daemon]\nadmin_socket_mode = %s\n" % mode,
            "FILE:2: [daemon] admin_socket_mode = '%s': gives others write (o+w)" % mode)
    r = run("--config", write(os.path.join(tmp, "mode.conf"),
                              "[daemon]\nadmin_socket_mode = 0664\n"))
    assert r.returncode == 0 and "configuration OK" in r.stdout, (r.stdout, r.stderr)
    bad("section.conf", "[deamon]\nthreads = 2\n", "FILE:2: unknown section [deamon]")
    bad("place.conf", "[daemon]\nmax_sessions = 2\n",
        "FILE:2: [daemon] has no key 'max_sessions'; it belongs in [limits]")
    bad("syntax.conf", "[daemon]\nthreads 2\n",
        "FILE:2: syntax error: not 'key = value'")
    # A NUL byte would end inih's line early: the file is refused.
    bad("nul.conf", "[daemon]\nthreads = 2\x004\n",
        "FILE:2: line 2 contains a NUL byte (byte 12 of the line); expected a text file")
    # A UTF-8 byte order mark at the start is skipped.
    bom = os.path.join(tmp, "bom.conf")
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbf[daemon]\nthreads = 3\n")
    r = run("--config", bom)
    assert r.returncode == 0 and "configuration OK" in r.stdout, (r.stdout, r.stderr)
    with open(bom, "wb") as f:  # elsewhere it is still a mistake
        f.write(b"[daemon]\n\xef\xbb\xbfthreads = 3\n")
    r = run("--config", bom)
    assert r.returncode != 0 and "bom.conf:2: unknown key" in r.stderr, r.stderr
    # Bytes that are not text are escaped in the messages (valid UTF-8 is
    # kept): the output is UTF-8 without control characters.
    junk = os.path.join(tmp, "junk.conf")
    with open(junk, "wb") as f:
        f.write(b"[daemon]\nthreads = \xff\x01\x1b[31m\nn\xfe\xffkey = 1\n[\x1b]\na = 1\n"
                b"[devices]\nbackend = cp\xc3\xbc\n" + bytes(range(1, 256)) + b"\n")
    r = subprocess.run([PARADEVD, "--check-config", "--config", junk, "--threads", "\x07x"],
                       capture_output=True, timeout=60)
    err = r.stderr.decode("utf-8")
    assert r.returncode != 0 and not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", err), err
    for w in ["junk.conf:2: [daemon] threads = '\\xFF\\x01\\x1B[31m': expected an integer",
              "junk.conf:3: unknown key 'n\\xFE\\xFFkey' in [daemon]",
              "junk.conf:5: unknown section [\\x1B] (key 'a')",
              "junk.conf:7: [devices] backend = 'cpü': expected cpu or cuda",
              "--threads '\\x07x': expected an integer"]:
        assert w in err, "%r not in:\n%s" % (w, err)
    bad("twice.conf", "[daemon]\nthreads = 2\nthreads = 3\n",
        "FILE:3: [daemon] threads is set twice (first on line 2)")
    bad("cross.conf", "[sessions]\ndefault_lease_seconds = 100\nmax_lease_seconds = 10\n",
        "default_lease_seconds (100) is over max_lease_seconds (10)")
    # [cuda]: each key checked like the others, shown by --check-config, and
    # overridden by its flag.
    bad("tf32.conf", "[cuda]\nallow_tf32 = maybe\n",
        "FILE:2: [cuda] allow_tf32 = 'maybe': expected true or false")
    bad("coll.conf", "[cuda]\ncollectives = mpi\n",
        "FILE:2: [cuda] collectives = 'mpi': expected auto, nccl or copy")
    bad("ctimeout.conf", "[cuda]\ncollective_timeout_ms = 10\n",
        "FILE:2: [cuda] collective_timeout_ms = '10': expected an integer from 1000 to "
        "86400000")
    bad("pool.conf", "[cuda]\npool_release_threshold = lots\n",
        "FILE:2: [cuda] pool_release_threshold = 'lots': expected a byte count such as 0, "
        "512M or 4G, or unlimited")
    bad("cudaflag.conf", "[cuda]\n", "--collectives 'mpi': expected auto, nccl or copy",
        flags=("--collectives", "mpi"))
    cuda = write(os.path.join(tmp, "cuda.conf"),
                 "[devices]\nbackend = cuda\nmesh = cuda:0,cuda:0\n[cuda]\nallow_tf32 = true\n"
                 "collectives = copy\ncollective_timeout_ms = 60000\n"
                 "pool_release_threshold = 2G\n")
    r = run("--config", cuda)
    assert r.returncode == 0 and (
        "paradevd: devices: backend cuda, mesh cuda:0,cuda:0, memory_limit default; [cuda] "
        "allow_tf32 true, collectives copy, collective_timeout_ms 60000, "
        "pool_release_threshold 2147483648 bytes\n") in r.stdout, (r.stdout, r.stderr)
    r = run("--config", cuda, "--allow-tf32", "no", "--collectives=nccl")
    assert r.returncode == 0 and "[cuda] allow_tf32 false, collectives nccl," in r.stdout, \
        (r.stdout, r.stderr)
    r = run("--config", good, "--backend", "cuda")  # the built-in defaults
    assert r.returncode == 0 and (
        "paradevd: devices: backend cuda, mesh cuda:all, memory_limit default; [cuda] "
        "allow_tf32 false, collectives auto, collective_timeout_ms 300000, "
        "pool_release_threshold unlimited\n") in r.stdout, (r.stdout, r.stderr)
    r = run("--config", good)
    assert "paradevd: devices: backend cpu, 4 devices, memory_limit default\n" in r.stdout, r.stdout
    # [cuda] under the cpu backend: a warning, not an error.
    r = run("--config", write(os.path.join(tmp, "cpucuda.conf"), "[cuda]\nallow_tf32 = on\n"))
    assert r.returncode == 0 and ("paradevd: warning: %s: [cuda] settings other than the "
                                  "defaults apply to the cuda backend only"
                                  % os.path.join(tmp, "cpucuda.conf")) in r.stderr, \
        (r.stdout, r.stderr)
    r = run("--config", os.path.join(DEPLOY, "paradevd.conf"))  # defaults: no warning
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
    # Every mistake of a file is reported in one run.
    err = bad("many.conf", "[daemon]\nthreads = 0\nnope = 1\n[limits]\nmax_sessions = -1\n",
              "FILE:2:", "FILE:3:", "FILE:5:", "configuration has 3 errors")
    assert err.count("FILE".replace("FILE", os.path.join(tmp, "many.conf"))) == 3, err
    # A missing file, when named.
    missing = os.path.join(tmp, "missing.conf")
    r = run("--config", missing)
    assert r.returncode != 0 and missing in r.stderr and "No such file" in r.stderr, r.stderr
    # Flags are checked too, and override the file.
    r = run("--config", good, "--devices", "0")
    assert r.returncode != 0 and "--devices '0': expected an integer from 1 to 64" in r.stderr, \
        r.stderr
    # A bad level names the value once, and the accepted levels.
    r = run("--config", good, "--log", "loud")
    assert r.returncode != 0 and ("--log 'loud': the level is not one of error, warn, info, "
                                  "debug") in r.stderr and r.stderr.count("loud") == 1, r.stderr
    r = run("--config", good, "--log", "info,sched=loud")
    assert r.returncode != 0 and ("--log 'info,sched=loud': 'sched=loud': level 'loud' is not "
                                  "one of error, warn, info, debug") in r.stderr, r.stderr
    r = run("--config", good, "--frobnicate")
    assert r.returncode != 0 and "unknown option '--frobnicate'" in r.stderr, r.stderr
    # A bad file stops a normal start, with the same message.
    r = subprocess.run([PARADEVD, "--config", os.path.join(tmp, "value.conf")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "max_sessions = 'lots'" in r.stderr, r.stderr

    # The Admin service: off with an empty path; a default path that cannot
    # be bound (no runtime directory) does not stop the daemon, a configured
    # one does.
    d = Daemon(admin=False, metrics=False)
    assert not d.find("admin service") and not os.path.exists(d.admin)
    rc = d.stop()
    assert rc == 0, (rc, d.log())
    d = Daemon(admin=None, metrics=False, env={"XDG_RUNTIME_DIR": "/nonexistent/run"})
    assert d.find(r"no admin service: cannot listen on the default admin socket "
                  r"/nonexistent/run/paradevd-admin.sock")
    rc = d.stop()
    assert rc == 0, (rc, d.log())
    r = subprocess.run([PARADEVD, "--listen", "127.0.0.1:0", "--admin-socket",
                        "/nonexistent/run/admin.sock"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "cannot listen on the admin socket" in r.stderr, r.stderr
    # So does a listen socket's: what is wrong with its directory, before
    # gRPC tries (and logs only its raw error).
    notdir = write(os.path.join(tmp, "plain-file"), "")
    for path, why in [("/nonexistent/dir/d.sock", "its directory /nonexistent/dir does not "
                       "exist (the directory must exist"),
                      (notdir + "/d.sock", "%s is not a directory" % notdir)]:
        r = subprocess.run([PARADEVD, "--listen", "unix:" + path, "--admin-socket", "",
                            "--devices", "1"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and ("cannot listen on unix:%s: %s" % (path, why)) in r.stderr \
            and "address in use" not in r.stderr and "chttp2" not in r.stderr, r.stderr

    # deploy/paradevd.conf documents every key: in each section, the keys the
    # daemon lists for an unknown key are exactly the example's.
    example, section = {}, None
    for line in open(os.path.join(DEPLOY, "paradevd.conf")):
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
            example.setdefault(section, set())
        elif line and line[0] not in "#;" and "=" in line:
            example[section].add(line.split("=")[0].strip())
    assert set(example) == {"daemon", "devices", "cuda", "limits", "scheduler",
                            "sessions", "storage", "auth", "tls", "log",
                            "functions", "mesh"}, example
    for section, keys in example.items():
        err = bad("probe-%s.conf" % section, "[%s]\nno_such_key = 1\n" % section)
        m = re.search(r"expected one of: ([a-z0-9_, ]+)\)", err)
        assert m, err
        assert set(m.group(1).split(", ")) == keys, (section, m.group(1), keys)


# --------------------------------------------------------------------------
# sd_notify


class NotifySocket:
    """A NOTIFY_SOCKET: collects what the daemon sends, in order."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.s.bind(path)
        self.path = path
        self.msgs = []
        self.on_ready = None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            try:
                data = self.s.recv(65536)
            except OSError:
                return
            text = data.decode(errors="replace")
            self.msgs.append(text)
            if "READY=1" in text.split("\n") and self.on_ready:
                cb, self.on_ready = self.on_ready, None
                cb()

    def fields(self):
        """Every KEY=VALUE sent, in order."""
        return [f for m in list(self.msgs) for f in m.split("\n") if f]

    def index(self, field, start=0):
        fs = self.fields()
        for i in range(start, len(fs)):
            if fs[i] == field:
                return i
        return -1

    def count(self, field):
        return self.fields().count(field)


def check_notify():
    tmp = _mkdtemp(prefix="paradevd-notify-")
    ns = NotifySocket(os.path.join(tmp, "notify"))
    conf = write(os.path.join(tmp, "paradevd.conf"),
                 "[devices]\ndevices = 3\n[limits]\nmax_sessions = 8\n[log]\nlevel = info\n")
    accepted = {}

    def at_ready():
        # Connect the moment READY=1 arrives: the port must accept already.
        # The port is in the log, written before READY=1 was sent.
        try:
            m = wait_for(lambda: d_box and d_box[0].find(r"listening on 127\.0\.0\.1:(\d+)"),
                         "the port in the log", 30)
            with socket.create_connection(("127.0.0.1", int(m.group(1))), timeout=10):
                accepted["tcp"] = True
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(os.path.join(d_box[0].dir, "pd.sock"))
            s.close()
            accepted["unix"] = True
        except Exception as e:  # noqa: BLE001
            accepted["error"] = repr(e)

    d_box = []
    ns.on_ready = at_ready
    d = Daemon(config=conf, env={"NOTIFY_SOCKET": ns.path, "WATCHDOG_USEC": "300000"})
    d_box.append(d)
    try:
        # at_ready records "tcp", then "unix" (its last step) or "error":
        # wait for its end, not for its first step.
        wait_for(lambda: "unix" in accepted or "error" in accepted,
                 "the connections at READY=1", 30)
        assert accepted.get("tcp") and accepted.get("unix"), accepted
        cl = Client(d.target)
        assert cl.health() == H.SERVING
        fields = ns.fields()
        ready = ns.index("READY=1")
        assert ready >= 0, fields
        assert "STATUS=starting" in fields[:ready], fields
        status = [f for f in fields if f.startswith("STATUS=serving")]
        assert status and "0 sessions on 2 cpu devices" in status[0], fields
        info = cl.info()
        assert len(info.devices) == 2, "--devices 2 must override the file's devices = 3"
        assert info.limits.max_sessions == 8, info.limits
        # WATCHDOG=1 every 150 ms while the devices make progress (idle).
        wait_for(lambda: ns.count("WATCHDOG=1") >= 3, "3 WATCHDOG=1", 60)
        assert ns.index("WATCHDOG=1") > ready
        # STATUS follows the sessions.
        tok = cl.session(client_name="n")
        wait_for(lambda: any("1 session on 2 cpu devices" in f for f in ns.fields()),
                 "STATUS with 1 session", 30)
        # SIGHUP: RELOADING=1, the file again (flags still win), READY=1.
        write(conf, "[devices]\ndevices = 3\n[daemon]\nthreads = 2\n[limits]\n"
                    "max_sessions = 2\n[log]\nlevel = info,sched=debug\n")
        before = len(ns.fields())
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: ns.index("READY=1", before) > ns.index("RELOADING=1", before) >= 0,
                 "RELOADING=1 then READY=1", 60)
        assert any(f.startswith("MONOTONIC_USEC=") for f in ns.fields()[before:])
        d.wait_line(r"reloaded .*: log info,sched=debug, max_sessions 2")
        d.wait_line(r"\[daemon\] threads changed: it takes effect when paradevd restarts")
        assert cl.info().limits.max_sessions == 2
        assert len(cl.info().devices) == 2
        cl.session(client_name="n2")
        expect_error(C.RESOURCE_EXHAUSTED, cl.session, client_name="n3",
                     match="max_sessions = 2")
        # A bad file on reload: refused, the running configuration stays.
        write(conf, "[limits]\nmax_sessions = lots\n")
        before = len(ns.fields())
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: ns.index("READY=1", before) > ns.index("RELOADING=1", before) >= 0,
                 "RELOADING=1 then READY=1 after a bad file", 60)
        d.wait_line(r"reload failed: keeping the running configuration")
        assert "max_sessions = 'lots'" in d.log()
        assert cl.info().limits.max_sessions == 2
        # SIGTERM: STOPPING=1, exit 0.
        before = len(ns.fields())
        rc = d.stop()
        assert rc == 0, d.log()
        stopping = ns.index("STOPPING=1", before)
        assert stopping >= 0, ns.fields()[before:]
        assert "READY=1" not in ns.fields()[stopping:]
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# metrics


def check_metrics():
    ndev = 2
    d = Daemon(ndev=ndev, mem=1 << 20)
    try:
        cl = Client(d.target)
        # A quota of its own (capped at the mesh's 2 MiB): the fill below
        # must reach the device (the default quota, half of these small
        # devices, would refuse it first).
        a = cl.session(client_name="wa", job_id="j1", memory_quota_bytes=1 << 40)
        b = cl.session(client_name='w"b', job_id="j2")
        for hid, n in [(1, 100), (2, 200), (3, 50)]:
            cl.upload(a, hid, n)
        cl.upload(b, 1, 100000)  # 400 KB a device, within b's default quota
        uploaded = 4 * (100 + 200 + 50 + 100000)
        cl.execute(a, pb.Operation(op="Add", inputs=[1, 1], output_ids=[10]),
                   pb.Operation(op="Mul", inputs=[10, 1], output_ids=[11]),
                   pb.Operation(op="Neg", inputs=[3], output_ids=[12]),
                   pb.Operation(op="AllReduce", inputs=[1], output_ids=[13],
                                attrs=[attr("reduction", s="sum")]))
        # Fits a's quota (1.6 MB + 5600 bytes <= 2 MiB) but not beside b's
        # 400 KB on a device of 1 MiB: fails when it runs.
        cl.execute(a, fill_op(14, [200000]))
        expect_error(C.INVALID_ARGUMENT, cl.execute, a,
                     pb.Operation(op="NoSuchOp", output_ids=[15]))
        s = cl.sync(a)
        assert s.error.code == C.RESOURCE_EXHAUSTED.value[0] and s.failed_id == 14, s
        msgs = cl.download(a, 11, chunk_bytes=128)
        downloaded = sum(len(m.chunk.data) for m in msgs[1:])
        assert downloaded == 400
        expect_error(C.RESOURCE_EXHAUSTED, cl.download, a, 14)
        cl.pd("Delete", pb.DeleteRequest(session_token=a, ids=[12]), pb.DeleteResponse)
        info = cl.info()

        # Ops report their outcome when computed; Sync answered once they
        # were: the counts settle at once (polling only covers the callback
        # that counts finishing a moment after the one that answered Sync).
        # An RPC is counted once its status has been sent, so the client can
        # see the reply a moment before the count: wait for the last call's.
        def settled(m):
            ops_done = sum(v for _, v in series(m, "paradev_ops_total")) == 5
            info_counted = any(l.get("method") == "GetServerInfo" and l.get("code") == "OK"
                               and v == 1 for l, v in series(m, "paradev_rpcs_total"))
            return m if ops_done and info_counted else None
        m = wait_for(lambda: settled(scrape(d.http)), "5 ops and the last RPC counted", 30)
        ops = {(l["op"], l["outcome"]): v for l, v in series(m, "paradev_ops_total")}
        assert ops == {("Add", "OK"): 1, ("Mul", "OK"): 1, ("Neg", "OK"): 1,
                       ("AllReduce", "OK"): 1, ("Fill", "RESOURCE_EXHAUSTED"): 1}, ops
        assert metric(m, "paradev_op_duration_seconds_count") == 5
        assert metric(m, "paradev_op_duration_seconds_bucket", le="+Inf") == 5
        buckets = sorted((float(l["le"]), v) for l, v in
                         series(m, "paradev_op_duration_seconds_bucket") if l["le"] != "+Inf")
        assert all(x[1] <= y[1] for x, y in zip(buckets, buckets[1:])), buckets
        assert metric(m, "paradev_op_duration_seconds_sum") > 0
        assert metric(m, "paradev_collective_seconds_total", op="AllReduce") >= 0
        assert metric(m, "paradev_queue_depth") == 0
        assert metric(m, "paradev_ops_in_flight") == 0
        assert metric(m, "paradev_upload_bytes_total") == uploaded
        assert metric(m, "paradev_download_bytes_total") == downloaded
        rpc = lambda meth, code: metric(m, "paradev_rpcs_total", service="paradev.v1.ParallelDevice",
                                        method=meth, code=code)
        assert rpc("CreateSession", "OK") == 2
        assert rpc("Upload", "OK") == 4
        assert rpc("Execute", "OK") == 2
        assert rpc("Execute", "INVALID_ARGUMENT") == 1
        assert rpc("Sync", "OK") == 1
        assert rpc("Download", "OK") == 1
        assert rpc("Download", "RESOURCE_EXHAUSTED") == 1
        assert rpc("Delete", "OK") == 1
        assert rpc("GetServerInfo", "OK") == 1
        assert rpc("KeepAlive", "OK") == 0
        # Sessions: handles and bytes over the devices, as the quota counts.
        assert metric(m, "paradev_sessions_open") == 2
        assert metric(m, "paradev_sessions_created_total") == 2
        sess = {l["client"]: (l, v) for l, v in series(m, "paradev_session_tensors")}
        assert set(sess) == {"wa", 'w\\"b'}, sess
        assert sess["wa"][1] == 7 and sess["wa"][0]["job"] == "j1"  # 1 2 3 10 11 13 14
        assert sess['w\\"b'][1] == 1
        by = {l["client"]: v for l, v in series(m, "paradev_session_bytes")}
        f32 = 4 * ndev
        assert by["wa"] == f32 * (100 + 200 + 50 + 100 + 100 + 100 + 200000), by
        assert by['w\\"b'] == f32 * 100000
        for i in range(ndev):
            assert metric(m, "paradev_device_tensors", device=str(i)) == 8
            assert metric(m, "paradev_device_memory_used_bytes", device=str(i)) == \
                info.devices[i].memory_used_bytes
            assert metric(m, "paradev_device_memory_limit_bytes", device=str(i)) == 1 << 20
            assert metric(m, "paradev_device_memory_free_bytes", device=str(i)) == \
                (1 << 20) - info.devices[i].memory_used_bytes
            assert metric(m, "paradev_device_healthy", device=str(i)) == 1
            # Every op had run when GetServerInfo answered, and none since:
            # the two readings of the device's busy time agree, and 5 ops
            # took some of it.
            busy = metric(m, "paradev_device_busy_seconds_total", device=str(i))
            assert busy is not None and busy > 0, busy
            assert abs(busy - info.devices[i].busy_seconds) < 1e-6, \
                (busy, info.devices[i].busy_seconds)
        assert metric(m, "paradev_serving") == 1 and metric(m, "paradev_draining") == 0
        assert metric(m, "paradev_build_info", version=info.version, backend="cpu") == 1
        # Closing, lease expiry.
        cl.pd("CloseSession", pb.CloseSessionRequest(session_token=b), pb.CloseSessionResponse)
        cl.session(client_name="short", lease_seconds=1)
        m = wait_for(lambda: (lambda m: m if metric(m, "paradev_session_lease_expiries_total")
                              == 1 else None)(scrape(d.http)), "a lease expiry", 60)
        assert metric(m, "paradev_sessions_closed_total") == 1
        assert metric(m, "paradev_sessions_open") == 1
        assert [l["client"] for l, _ in series(m, "paradev_session_bytes")] == ["wa"]
        # The rest of the HTTP listener.
        assert http_get(d.http, "/nope")[0] == 404
        assert http_get(d.http, "/metrics", "POST")[0] == 405
        assert http_get(d.http, "/healthz") == (200, "ok\n", "text/plain; charset=utf-8")
        assert http_get(d.http, "/readyz")[0] == 200
        assert d.stop() == 0
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# drain


class Watcher:
    """A health Watch stream; statuses in arrival order."""

    def __init__(self, cl, service):
        f = cl.ch.unary_stream("/grpc.health.v1.Health/Watch",
                               request_serializer=lambda m: m.SerializeToString(),
                               response_deserializer=H.FromString)
        self.it = f(health_pb2.HealthCheckRequest(service=service), timeout=600)
        self.seen = []
        self.end = None
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        try:
            for r in self.it:
                self.seen.append(r.status)
            self.end = "OK"
        except grpc.RpcError as e:
            self.end = e.code()


def check_drain():
    d = Daemon("--drain-timeout", "300")
    try:
        cl = Client(d.target)
        adm = Client("unix:" + d.admin)
        assert http_get(d.http, "/healthz")[0] == 200
        assert http_get(d.http, "/readyz") == (200, "ready\n", "text/plain; charset=utf-8")
        w0, w1 = Watcher(cl, ""), Watcher(cl, "paradev.v1.ParallelDevice")
        wait_for(lambda: w0.seen == [H.SERVING] and w1.seen == [H.SERVING], "Watch: SERVING")
        tok = cl.session(client_name="drainer")
        r = adm.admin("Drain", apb.DrainRequest(), apb.DrainResponse)
        assert r.draining and not r.exiting and r.sessions == 1, r
        status, body, _ = http_get(d.http, "/readyz")
        assert status == 503 and "draining" in body, (status, body)
        assert http_get(d.http, "/healthz")[0] == 200  # alive: no restart wanted
        assert cl.health("") == H.NOT_SERVING
        assert cl.health("paradev.v1.ParallelDevice") == H.NOT_SERVING
        wait_for(lambda: w0.seen[-1:] == [H.NOT_SERVING] and w1.seen[-1:] == [H.NOT_SERVING],
                 "Watch: NOT_SERVING")
        expect_error(C.UNAVAILABLE, cl.session, client_name="late", match="draining")
        # Open sessions take no new work but may still sync (test_health.py
        # checks the rest: queued work finishing, downloads).
        expect_error(C.UNAVAILABLE, cl.execute, tok, fill_op(1, [4], 2.0),
                     match="draining for maintenance")
        assert cl.sync(tok).error.code == 0
        m = scrape(d.http)
        assert metric(m, "paradev_draining") == 1 and metric(m, "paradev_serving") == 0
        # Back in service.
        r = adm.admin("Drain", apb.DrainRequest(resume=True), apb.DrainResponse)
        assert not r.draining
        assert http_get(d.http, "/readyz")[0] == 200 and cl.health() == H.SERVING
        wait_for(lambda: w0.seen == [H.SERVING, H.NOT_SERVING, H.SERVING], "Watch: SERVING again")
        cl.session(client_name="welcome back")

        # SIGTERM with work queued: it completes, new sessions are refused,
        # the daemon exits 0.
        last = busy_work(d, cl, tok, 2.0)
        result = {}

        def sync():
            try:
                result["sync"] = cl.sync(tok, [last], timeout=300)
            except grpc.RpcError as e:
                result["sync"] = e

        t = threading.Thread(target=sync)
        t.start()
        d.proc.send_signal(signal.SIGTERM)
        d.wait_line(r"SIGTERM: draining")
        try:
            cl.session(client_name="too late")
            raise AssertionError("a session was created while draining")
        except grpc.RpcError as e:  # draining, or gone already
            assert e.code() == C.UNAVAILABLE, e
        t.join(300)
        s = result["sync"]
        assert isinstance(s, pb.SyncResponse) and s.error.code == 0, s
        rc = d.proc.wait(300)
        d.reader.join(5)
        assert rc == 0, d.log()
        assert d.find(r"drained: the queued work is done"), d.log()
        assert not d.find(r"drain timeout")
        wait_for(lambda: w0.end is not None, "the Watch stream to end")
        assert w0.seen == [H.SERVING, H.NOT_SERVING, H.SERVING, H.NOT_SERVING], w0.seen
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


def check_drain_timeout_and_second_signal():
    # The drain timeout: queued work is cut short, exit 0 all the same. The
    # calls still open when the grace period ends (a Sync and a Download
    # waiting on that work, an idle Enqueue stream) are ended by the daemon
    # with UNAVAILABLE, saying it is shutting down.
    d = Daemon("--drain-timeout", "1", "--log", "info,rpc=debug")
    try:
        cl = Client(d.target)
        tok = cl.session(client_name="slow")
        per_op = seconds_per_matmul(d)
        last = busy_work(d, cl, tok, max(20.0, 400 * per_op))
        ended, idle = {}, threading.Event()

        def open_call(name, fn):
            try:
                fn()
                ended[name] = "OK"
            except grpc.RpcError as e:
                ended[name] = (e.code(), e.details())

        def no_items():
            idle.wait(300)
            return
            yield

        enqueue = cl.ch.stream_stream(SVC + "Enqueue",
                                      request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=pb.EnqueueResponse.FromString)
        calls = {"Sync": lambda: cl.sync(tok, [last], timeout=300),
                 "Download": lambda: cl.download(tok, last, timeout=300),
                 "Enqueue": lambda: list(enqueue(no_items(), timeout=300))}
        started = re.compile(r" call /paradev\.v1\.ParallelDevice/(Sync|Download|Enqueue)$")
        count = lambda: sum(1 for line in list(d.lines) if started.search(line))
        before = count()
        threads = [threading.Thread(target=open_call, args=kv) for kv in calls.items()]
        for t in threads:
            t.start()
        wait_for(lambda: count() == before + 3, "the three calls to reach the daemon")
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(300)
        d.reader.join(5)
        idle.set()
        for t in threads:
            t.join(60)
        assert rc == 0, d.log()
        assert d.find(r"drain timeout \(1 s\)"), d.log()
        assert not d.find(r"drained:")
        assert d.find(r"grace period of 2000 ms over: ending the \d+ remaining calls with "
                      r"UNAVAILABLE"), d.log()
        for name in calls:
            assert ended.get(name) == (
                C.UNAVAILABLE, "paradevd is draining (shutting down): %s was still in "
                "progress when the 2000 ms grace period for calls ended; its session is gone "
                "with the daemon, retry on a daemon that is serving" % name), (name, ended)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
    # A second SIGTERM exits at once.
    d = Daemon("--drain-timeout", "300")
    try:
        cl = Client(d.target)
        tok = cl.session(client_name="slow")
        busy_work(d, cl, tok, max(20.0, 400 * seconds_per_matmul(d)))
        d.proc.send_signal(signal.SIGTERM)
        d.wait_line(r"SIGTERM: draining")
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(300)
        d.reader.join(5)
        assert rc == 1, (rc, d.log())
        m = d.find(r"second SIGTERM: exiting now with status 1, the drain and shutdown cut "
                   r"short while draining \(the main loop\); abandoning (\d+) queued ops and "
                   r"(\d+) running on the devices \(at the last count\), 0 calls in progress$")
        # Work was cut short; how it splits between queued and running at the
        # last count depends on how far the dispatcher got (dispatch-ahead).
        assert m and int(m.group(1)) + int(m.group(2)) > 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# A stand-in for a teardown that never returns (the trial's wedged devices
# left the daemon's main thread in grpc_shutdown for minutes): preloaded into
# paradevd, it makes paradevd's own call of grpc_shutdown (srv_stop's last
# step, on the main thread) block forever and says so on stderr. gRPC's own
# calls (a channel's destructor calls it too) go to gRPC.
WEDGE_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
void grpc_shutdown(void) {
  Dl_info caller;
  if (syscall(SYS_gettid) == getpid() &&
      dladdr(__builtin_return_address(0), &caller) && caller.dli_fname &&
      !strstr(caller.dli_fname, "libgrpc")) {
    static const char m[] = "wedge: grpc_shutdown blocks forever\n";
    ssize_t w = write(2, m, sizeof m - 1);
    (void)w;
    for (;;) pause();
  }
  ((void (*)(void))dlsym(RTLD_NEXT, "grpc_shutdown"))();
}
"""


def build_wedge():
    """Compiles WEDGE_C; (path, None), or (None, why not)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        return None, "no C compiler (cc, gcc or $CC) to build the stand-in"
    d = _mkdtemp(prefix="paradevd-wedge-")
    src, lib = os.path.join(d, "wedge.c"), os.path.join(d, "wedge.so")
    write(src, WEDGE_C)
    r = subprocess.run([cc, "-shared", "-fPIC", "-o", lib, src, "-ldl"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        return None, "the stand-in did not build: " + r.stderr
    return lib, None


def wedged_env(lib, ns):
    # An ASan build wants its runtime first among the libraries: the
    # stand-in comes first instead.
    asan = os.environ.get("ASAN_OPTIONS", "")
    return {"LD_PRELOAD": lib, "NOTIFY_SOCKET": ns.path,
            "ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}


def check_stuck_shutdown():
    """The shutdown is bounded, and a second SIGTERM ends it in any phase:
    with grpc_shutdown wedged, a daemon whose devices are still busy after
    the drain timeout exits 1 once the calls' grace period and 10 s more
    are over, saying where it was stuck and what was left; a second SIGTERM
    while it is wedged exits 1 at once. Both send STOPPING=1."""
    # systemd's stop timeout outlasts the whole bounded shutdown with the
    # shipped settings, so the daemon, not SIGKILL, ends a stuck one.
    unit = open(os.path.join(DEPLOY, "systemd", "paradevd.service.in")).read()
    conf = open(os.path.join(DEPLOY, "paradevd.conf")).read()
    key = lambda k, text: int(re.search(r"(?m)^%s\s*=\s*(\d+)" % k, text).group(1))
    bound = key("drain_timeout_seconds", conf) + key("shutdown_grace_ms", conf) / 1000 + 10
    assert key("TimeoutStopSec", unit) > bound, (key("TimeoutStopSec", unit), bound)

    lib, why = build_wedge()
    if not lib:
        print("SKIP check_stuck_shutdown: " + why)
        return
    tmp = _mkdtemp(prefix="paradevd-stuck-")
    ns = NotifySocket(os.path.join(tmp, "notify"))
    d = Daemon("--drain-timeout", "1", env=wedged_env(lib, ns))
    try:
        cl = Client(d.target)
        tok = cl.session(client_name="busy")
        last = busy_work(d, cl, tok, max(20.0, 400 * seconds_per_matmul(d)))
        result = {}

        def sync():
            try:
                result["sync"] = cl.sync(tok, [last], timeout=300)
            except grpc.RpcError as e:
                result["sync"] = e.code()

        t = threading.Thread(target=sync)
        t.start()
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(60)  # 1 s drain + 2 s grace + 10 s: only a hang is slower
        d.reader.join(5)
        t.join(60)
        assert rc == 1, (rc, d.log())
        timeout = d.find(r"drain timeout \(1 s\): cancelling (\d+) queued ops; (\d+) running "
                         r"on the devices are left")
        # Work was left at the timeout; with dispatch-ahead only a few ops are
        # on the devices at a time, and on a loaded host the count can catch
        # them all finished, so queued and running are counted together.
        assert timeout and int(timeout.group(1)) + int(timeout.group(2)) > 0, d.log()
        assert d.find(r"^wedge: grpc_shutdown blocks forever$"), d.log()
        assert not d.find(r"stopped$")
        # The counts are those of the drain's end: the main thread never
        # came back to read others.
        stuck = d.find(r"shutdown stuck: still closing the gRPC listeners \(srv_stop: .*\) when "
                       r"the shutdown's time was up \(the drain's 1 s, the calls' 2000 ms grace "
                       r"period, 10 s for the rest\); (\d+) ops queued and (\d+) running on the "
                       r"devices \(at the last count\), 0 calls in progress: exiting with "
                       r"status 1 without waiting any longer")
        assert stuck, d.log()
        assert stuck.groups() == timeout.groups(), (stuck.groups(), timeout.groups())
        # The Sync waiting on that work ended in the grace period, as always.
        assert result.get("sync") == C.UNAVAILABLE, result
        last_msg = "STOPPING=1\nSTATUS=exited: the shutdown was stuck (see the log)"
        wait_for(lambda: ns.msgs[-1:] == [last_msg], "the last notification", 30)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()

    # A second SIGTERM while the main thread is wedged exits at once. The
    # grace period (60 s) keeps the watchdog out of the way: the exit must be
    # the signal's.
    ns = NotifySocket(os.path.join(tmp, "notify2"))
    d = Daemon("--grace-ms", "60000", env=wedged_env(lib, ns))
    try:
        cl = Client(d.target)
        tok = cl.session(client_name="busy")
        busy_work(d, cl, tok, 2.0)
        d.proc.send_signal(signal.SIGTERM)
        d.wait_line(r"^wedge: grpc_shutdown blocks forever$")
        assert d.find(r"drained: the queued work is done"), d.log()
        assert d.find(r"shutting down \(grace period 60000 ms"), d.log()
        d.proc.send_signal(signal.SIGTERM)
        rc = d.proc.wait(60)  # only a hang takes this long
        d.reader.join(5)
        assert rc == 1, (rc, d.log())
        assert d.find(r"second SIGTERM: exiting now with status 1, the drain and shutdown cut "
                      r"short while closing the gRPC listeners \(srv_stop: .*\); abandoning 0 "
                      r"queued ops and 0 running on the devices \(at the last count\), 0 calls "
                      r"in progress$"), d.log()
        assert not d.find(r"shutdown stuck"), d.log()
        last_msg = "STOPPING=1\nSTATUS=exited at once (second SIGTERM)"
        wait_for(lambda: ns.msgs[-1:] == [last_msg], "the last notification", 30)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# admin


def cli(d, *args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([ADMIN_CLI, "admin", "--socket", d.admin, *args], capture_output=True,
                          text=True, timeout=120, env=e)


def check_admin():
    ndev = 2
    # --log overrides PARADEV_LOG (SetLogLevel below reports "info" first).
    d = Daemon("--log", "info", env={"PARADEV_LOG": "debug"}, ndev=ndev)
    try:
        cl = Client(d.target)
        adm = Client("unix:" + d.admin)
        assert stat.S_IMODE(os.stat(d.admin).st_mode) == 0o660
        # Admin needs an operator: on the client listeners no caller is one
        # (test_ops.py checks every method).
        for other in (cl, Client("unix:" + d.sock)):
            expect_error(C.PERMISSION_DENIED, other.admin, "ListSessions",
                         apb.ListSessionsRequest(), apb.ListSessionsResponse,
                         match="Admin.ListSessions needs an operator")
        base = sum(cl.mem())
        c = cl.session(client_name="other-job", job_id="other")
        cl.upload(c, 1, 10)
        with_c = sum(cl.mem())
        assert with_c > base
        # The job's sessions prove their job id with its token (what the
        # prolog mints); "other" only claims one.
        tok = adm.admin("CreateJobToken", apb.CreateJobTokenRequest(job_id="slurm-42", uid=-1),
                        apb.CreateJobTokenResponse).token
        a = cl.session(client_name="trainer", job_token=tok)
        b = cl.session(client_name="evaluator", job_token=tok)
        cl.upload(a, 1, 1000)
        cl.execute(a, pb.Operation(op="Neg", inputs=[1], output_ids=[2]),
                   pb.Operation(op="Reshape", inputs=[2], output_ids=[3],
                                attrs=[attr("shape", int_list=pb.IntList(values=[10, 100]))]))
        cl.upload(b, 1, 500)
        # Work still running on the devices when the kill comes: the reply
        # waits for it, so the memory is back when it arrives.
        busy_work(d, cl, b, 1.0)
        lst = adm.admin("ListSessions", apb.ListSessionsRequest(), apb.ListSessionsResponse)
        assert [s.client_name for s in lst.sessions] == ["other-job", "trainer", "evaluator"]
        assert lst.incarnation == cl.info().incarnation and not lst.draining
        tr = lst.sessions[1]
        assert tr.job_id == "slurm-42" and tr.handles == 3
        assert tr.memory_bytes == 2 * 4000 * ndev  # Reshape aliases Neg's output: free
        assert tr.age_seconds >= 0 and tr.idle_seconds >= 0 and tr.lease_seconds == 60
        job = adm.admin("ListSessions", apb.ListSessionsRequest(job_id="slurm-42"),
                        apb.ListSessionsResponse).sessions
        assert [s.session_id for s in job] == [lst.sessions[1].session_id,
                                               lst.sessions[2].session_id]
        held = sum(s.memory_bytes for s in job)
        handles = sum(s.handles for s in job)
        r = adm.admin("KillSession", apb.KillSessionRequest(job_id="slurm-42"),
                      apb.KillSessionResponse)
        assert r.sessions_killed == 2 and r.handles_freed == handles, r
        assert r.bytes_freed == held and r.sessions_remaining == 1, r
        # Every byte is back: GetServerInfo, /metrics and the reply agree.
        assert r.device_memory_used_bytes == with_c, (r.device_memory_used_bytes, with_c)
        assert sum(cl.mem()) == with_c
        m = scrape(d.http)
        assert sum(v for _, v in series(m, "paradev_device_memory_used_bytes")) == with_c
        assert [l["job"] for l, _ in series(m, "paradev_session_bytes")] == ["other"]
        assert metric(m, "paradev_sessions_killed_total") == 2
        assert metric(m, "paradev_ops_in_flight") == 0
        for tok in (a, b):
            expect_error(C.NOT_FOUND, cl.pd, "KeepAlive", pb.KeepAliveRequest(session_token=tok),
                         pb.KeepAliveResponse)
        # Mistakes.
        kill = lambda **kw: adm.admin("KillSession", apb.KillSessionRequest(**kw),
                                      apb.KillSessionResponse)
        expect_error(C.NOT_FOUND, kill, session_id=999, match="numbered 999")
        expect_error(C.INVALID_ARGUMENT, kill, job_id="", match="empty job id")
        expect_error(C.INVALID_ARGUMENT, kill, match="needs a target")
        expect_error(C.UNAUTHENTICATED, kill, session_token=b"short")
        assert kill(job_id="no-such-job").sessions_killed == 0
        # By token.
        e = cl.session(client_name="by-token")
        assert kill(session_token=e).sessions_killed == 1
        # SetLogLevel.
        assert not d.find(r"^<7>"), "--log info must override PARADEV_LOG=debug"
        r = adm.admin("SetLogLevel", apb.SetLogLevelRequest(spec="debug"),
                      apb.SetLogLevelResponse)
        assert (r.previous, r.current) == ("info", "debug"), r
        cl.info()
        d.wait_line(r"^<7>paradevd: rpc: .*call /paradev.v1.ParallelDevice/GetServerInfo")
        r = adm.admin("SetLogLevel", apb.SetLogLevelRequest(spec="info,sched=debug"),
                      apb.SetLogLevelResponse)
        assert r.current == "info,sched=debug", r
        expect_error(C.INVALID_ARGUMENT, adm.admin, "SetLogLevel",
                     apb.SetLogLevelRequest(spec="loud"), apb.SetLogLevelResponse,
                     match="'loud'.*error, warn, info, debug")

        # Garbage to every Admin method and odd HTTP requests: an error, never
        # a crash or INTERNAL.
        # (Drain and KillSession get only bytes that cannot name a real
        # target: a random token, or a truncated message.)
        rnd = __import__("random").Random(6)
        for meth in ("ListSessions", "SetLogLevel", "KillSession", "Drain", "CreateJobToken",
                     "KillJob"):
            for i in range(60):
                data = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 40)))
                if meth == "KillSession":
                    data = b"\x0a" + bytes([len(data)]) + data  # session_token
                elif meth == "Drain":
                    data = b"\x08" if i % 2 else b"\x10"  # a bool without its value
                elif i % 3 == 0:
                    data = b"\x0a" + bytes([len(data)]) + data  # field 1 of that length
                try:
                    adm.ch.unary_unary(ADMIN + meth)(data, timeout=30)
                except grpc.RpcError as e:
                    assert e.code() not in (C.INTERNAL, C.UNKNOWN), (meth, e)
        adm.admin("Drain", apb.DrainRequest(resume=True), apb.DrainResponse)
        adm.admin("SetLogLevel", apb.SetLogLevelRequest(spec="info"), apb.SetLogLevelResponse)
        for path in ("/", "/metrics/", "/readyz?x=1", "/" + "a" * 5000, "/%00", "/healthz/.."):
            assert http_get(d.http, path)[0] in (200, 400, 404, 414, 503), path
        assert cl.health() == H.SERVING
        assert len(adm.admin("ListSessions", apb.ListSessionsRequest(),
                             apb.ListSessionsResponse).sessions) == 1

        # `paradev admin`.
        r = cli(d, "sessions")
        assert r.returncode == 0 and "other-job" in r.stdout and "(1 session;" in r.stdout, \
            (r.stdout, r.stderr)
        # --json: one document, the summary and the list, valid JSON (json.tool).
        r = cli(d, "sessions", "--json")
        assert r.returncode == 0, r.stderr
        assert subprocess.run([sys.executable, "-m", "json.tool"], input=r.stdout,
                              capture_output=True, text=True).returncode == 0, r.stdout
        doc = json.loads(r.stdout)
        rows = doc["sessions"]
        assert len(rows) == 1 and rows[0]["job_id"] == "other", rows
        assert doc["count"] == 1 and doc["draining"] is False and doc["job_id"] == "", doc
        assert doc["device_memory_used_bytes"] >= 0 and len(doc["incarnation"]) == 16, doc
        r = cli(d, "sessions", "--job", "no-such-job", "--json")
        assert r.returncode == 0 and r.stdout.strip(), (r.stdout, r.stderr)
        assert subprocess.run([sys.executable, "-m", "json.tool"], input=r.stdout,
                              capture_output=True, text=True).returncode == 0, r.stdout
        doc = json.loads(r.stdout)
        assert doc["count"] == 0 and doc["sessions"] == [] and doc["job_id"] == "no-such-job", doc
        r = cli(d, "kill", "--session", str(rows[0]["session_id"]), "--verify")
        assert r.returncode == 0 and r.stdout.startswith("killed 1 session:"), (r.stdout, r.stderr)
        assert sum(cl.mem()) == base
        r = cli(d, "log-level", "warn")
        assert r.returncode == 0 and "log levels: warn (were info)" in r.stdout, r.stdout
        r = cli(d, "kill", "--session", "abc")
        assert r.returncode == 2 and "expected a session number" in r.stderr, r.stderr
        # Signed numbers are not session numbers (strtoull would read -1 as
        # 18446744073709551615).
        for n in ("-1", "+1", " 1", "0"):
            r = cli(d, "kill", "--session", n)
            assert r.returncode == 2 and (
                "kill: --session '%s': expected a session number" % n) in r.stderr, \
                (n, r.returncode, r.stderr)
        # Every flag that takes a value says so when the value is missing
        # (last, empty, or another flag in its place).
        for args, flag in ((("sessions", "--job"), "sessions: --job"),
                           (("sessions", "--job", "--json"), "sessions: --job"),
                           (("sessions", "--job="), "sessions: --job"),
                           (("kill", "--job"), "kill: --job"),
                           (("kill", "--job", "--verify"), "kill: --job"),
                           (("kill", "--session"), "kill: --session"),
                           (("kill", "--token"), "kill: --token"),
                           (("--timeout",), "--timeout"),
                           (("--timeout", "--json"), "--timeout")):
            r = cli(d, *args)
            assert r.returncode == 2 and (flag + " needs a value") in r.stderr, \
                (args, r.returncode, r.stderr)
            assert "unexpected" not in r.stderr, (args, r.stderr)
        r = subprocess.run([ADMIN_CLI, "admin", "--socket"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 2 and "--socket needs a value" in r.stderr, r.stderr
        # --target is a remote operator's (a client listener): not with --socket.
        r = cli(d, "--target", "127.0.0.1:1", "sessions")
        assert r.returncode == 2 and "--target and --socket: give one of the two" \
            in r.stderr, r.stderr
        r = cli(d, "frobnicate")
        assert r.returncode == 2, r.stderr
        # --timeout: a number and a unit, 1ms to 24h, as the top level's; a bare
        # number (once seconds here, milliseconds there) is refused.
        for t in ("60s", "2.5s", "1500ms", "1m", "24h"):
            r = cli(d, "--timeout", t, "sessions")
            assert r.returncode == 0, (t, r.stderr)
        for t in ("0", "0s", "86401", "86401s", "25h", "-1", "1e3", "10x", "60", "2.5"):
            r = cli(d, "--timeout", t, "sessions")
            assert r.returncode == 2 and (
                "--timeout '%s': expected a time from 1ms to 24h, such as 500ms, 2s or 1m "
                "(a number needs a unit: ms, s, m or h)" % t) in r.stderr, (t, r.returncode, r.stderr)
        r = subprocess.run([ADMIN_CLI, "admin", "--socket", d.admin + ".nope", "sessions"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "is paradevd running" in r.stderr, r.stderr
        r = cli(d, "drain")
        assert r.returncode == 0 and r.stdout.startswith("draining:"), r.stdout
        r = cli(d, "drain", "--resume")
        assert r.returncode == 0 and r.stdout.startswith("in service:"), r.stdout

        # The Slurm scripts: test_ops.py runs them against sessions of two jobs.
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# deadlines and cancellation


def check_waits():
    ndev = 2
    # Log levels: PARADEV_LOG overrides the file (whose "error" would hide
    # even the ready line); rpc=debug shows each call as it arrives.
    conf = write(os.path.join(_mkdtemp(prefix="paradevd-waits-"), "p.conf"),
                 "[log]\nlevel = error\n")
    d = Daemon(config=conf, env={"PARADEV_LOG": "info,rpc=debug"}, ndev=ndev)
    try:
        cl = Client(d.target)
        rpc = lambda meth, code: metric(scrape(d.http), "paradev_rpcs_total",
                                        service="paradev.v1.ParallelDevice",
                                        method=meth, code=code) or 0
        calls = lambda meth: sum("call /paradev.v1.ParallelDevice/%s\n" % meth in line
                                 for line in list(d.lines))
        tok = cl.session(client_name="waiter")
        last = busy_work(d, cl, tok, max(5.0, 100 * seconds_per_matmul(d)))
        # The server ends the call when its deadline passes (or when the
        # client, at its own deadline a moment earlier, cancels it: then the
        # server counts it CANCELLED), not when the work ends.
        ended = lambda meth: rpc(meth, "DEADLINE_EXCEEDED") + rpc(meth, "CANCELLED")
        expect_error(C.DEADLINE_EXCEEDED, cl.sync, tok, [last], timeout=0.3)
        wait_for(lambda: ended("Sync") == 1, "Sync ended by its deadline", 30)
        assert not cl.describe(tok, [last])[0].ready, "the work ended first; size it larger"
        expect_error(C.DEADLINE_EXCEEDED, cl.download, tok, last, timeout=0.3)
        wait_for(lambda: ended("Download") == 1, "Download ended by its deadline", 30)
        f = cl.ch.unary_unary(SVC + "Sync", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=pb.SyncResponse.FromString)
        before = calls("Sync")
        fut = f.future(pb.SyncRequest(session_token=tok, ids=[last]), timeout=300)
        wait_for(lambda: calls("Sync") > before, "the Sync call to reach the daemon", 30)
        fut.cancel()
        wait_for(lambda: ended("Sync") == 2, "Sync ended by cancellation", 30)
        assert not cl.describe(tok, [last])[0].ready
        # Without a deadline, Sync waits for the work and reports it.
        s = cl.sync(tok, [last])
        assert s.error.code == 0, s
        assert cl.describe(tok, [last])[0].ready

        # Quotas: an op whose output shares its input's buffer costs nothing.
        q = cl.session(client_name="quota", memory_quota_bytes=4 * 100 * ndev)
        cl.upload(q, 1, 100)
        cl.execute(q, pb.Operation(op="Reshape", inputs=[1], output_ids=[2],
                                   attrs=[attr("shape", int_list=pb.IntList(values=[10, 10]))]))
        expect_error(C.RESOURCE_EXHAUSTED, cl.execute, q,
                     pb.Operation(op="Neg", inputs=[1], output_ids=[3]), match="quota")
        assert d.stop() == 0, d.log()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()


# --------------------------------------------------------------------------
# default sockets without a runtime directory

# Run in new mount and network namespaces with a tmpfs on /tmp, so that
# /tmp/paradevd-UID and 127.0.0.1:7478 are this test's alone. $1 paradevd,
# $2 the paradev command, $3 the admin stand-in.
SOCKET_DIR_SCRIPT = r"""
# A fresh /tmp; a build tree under /tmp (a CI clone there) is bound back in
# from the old /tmp, kept at $4, so the binaries stay where they were.
mount --bind /tmp "$4" && mount -t tmpfs tmpfs /tmp && ip link set lo up ||
  { echo "SKIP: no tmpfs, bind mount or lo"; exit 0; }
for p in "$1" "$2" "$3"; do
  case "$p" in
    /tmp/*) top=${p#/tmp/}; top=${top%%/*}
            [ -d "/tmp/$top" ] || { mkdir "/tmp/$top" && mount --bind "$4/$top" "/tmp/$top"; } ;;
  esac
done
unset XDG_RUNTIME_DIR RUNTIME_DIRECTORY PARADEV_TARGET PARADEV_ADMIN_SOCKET NOTIFY_SOCKET
d=/tmp/paradevd-$(id -u)
echo "uid $(id -u)"
mkdir -m 0777 "$d"
"$1" --devices 1 2>/tmp/log; echo "world-writable rc=$?"; grep 'cannot listen' /tmp/log
chmod 0700 "$d"; chown 12345 "$d"
"$1" --devices 1 2>/tmp/log; echo "other owner rc=$?"; grep 'cannot listen' /tmp/log
rmdir "$d"
"$1" --devices 1 --grace-ms 1000 2>/tmp/log & pid=$!
i=0; until grep -q 'ready:' /tmp/log || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done
stat -c "dir %a %u" "$d"
"$2" health; echo "health rc=$?"
"$2" info | head -1
"$3" admin sessions | tail -1; echo "admin rc=$?"
chmod 0755 "$d"
"$2" info 2>&1 | head -1
"$3" admin sessions 2>&1; echo "untrusted admin rc=$?"
chmod 0700 "$d"
kill -TERM $pid; wait $pid; echo "daemon rc=$?"
"""


def check_default_socket_dir():
    """Without a runtime directory the default sockets live in
    /tmp/paradevd-UID, made mode 0700: the daemon refuses one another user
    could have made or can enter, and paradev and paradev admin find the
    daemon there (and trust nothing else there)."""
    cli_path = os.path.join(os.path.dirname(ADMIN_CLI), "..", "..", "client", "paradev")
    if not shutil.which("unshare") or not os.path.exists(cli_path):
        print("SKIP check_default_socket_dir: needs unshare(1) and %s" % cli_path)
        return
    old_tmp = tempfile.mkdtemp(prefix="paradev-oldtmp.", dir="/var/tmp")
    try:
        r = subprocess.run(["unshare", "--mount", "--net", "/bin/sh", "-c", SOCKET_DIR_SCRIPT,
                            "sh", os.path.realpath(PARADEVD), os.path.realpath(cli_path),
                            os.path.realpath(ADMIN_CLI), old_tmp],
                           capture_output=True, text=True, timeout=300,
                           env=dict(os.environ,
                                    PATH=os.environ.get("PATH", "") + ":/usr/sbin:/sbin"))
    finally:
        os.rmdir(old_tmp)
    out = r.stdout
    if r.returncode != 0 or "SKIP" in out or "uid " not in out:
        print("SKIP check_default_socket_dir: cannot make namespaces here (unshare "
              "needs root or user namespaces): %s" % (r.stderr.strip() or out.strip()))
        return
    uid = int(re.search(r"uid (\d+)", out).group(1))
    d = "/tmp/paradevd-%d" % uid
    want = [
        "world-writable rc=1",
        "cannot listen on unix:%s/paradevd.sock: %s is a directory owned by uid %d with "
        "mode 0777; expected a directory of uid %d with mode 0700" % (d, d, uid, uid),
        "other owner rc=1",
        "%s is a directory owned by uid 12345 with mode 0700" % d,
        "dir 700 %d" % uid,
        "SERVING\nhealth rc=0",
        "paradevd 0.1.0 at unix:%s/paradevd.sock" % d,
        "(0 sessions; device memory in use: 0 B)\nadmin rc=0",
        # Not private any more: paradev does not use the socket there (it
        # takes the daemon's TCP default), and paradev admin says why.
        "paradevd 0.1.0 at 127.0.0.1:7478",
        "paradev admin: %s is not a directory of yours that only you may enter (owner uid "
        "%d, mode 0755; expected uid %d, mode 0700)" % (d, uid, uid),
        "untrusted admin rc=1",
        "daemon rc=0",
    ]
    for w in want:
        assert w in out, "%r not in:\n%s\n%s" % (w, out, r.stderr)


def check_names():
    """Client names and job ids in any language: kept as they are in
    ListSessions, `paradev admin sessions` (table and JSON), /metrics labels
    (escaped as the text format says) and the log (which escapes quotes and
    backslashes). Names that are not UTF-8, or hold control characters, are
    refused by CreateSession with INVALID_ARGUMENT naming the byte offset
    (proto3 strings are UTF-8: a reply carrying such bytes would not parse
    in Python), so nothing has to be rewritten on the way out."""
    d = Daemon()
    try:
        cl = Client(d.target)
        adm = Client("unix:" + d.admin)
        # A proven job id (its token), so that the kill by job below ends it.
        tok = adm.admin("CreateJobToken", apb.CreateJobTokenRequest(job_id='quo"te\\back',
                                                                    uid=-1),
                        apb.CreateJobTokenResponse).token
        cl.session(client_name="unié中", job_token=tok)
        # Not UTF-8 (a client other than Python's may send it), with a newline.
        create = cl.ch.unary_unary(SVC + "CreateSession", request_serializer=lambda b: b,
                                   response_deserializer=pb.CreateSessionResponse.FromString)
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, create,
                     b"\x0a\x06bad\xff\n!\x12\x02j2", timeout=30,
                     match=re.escape("client_name: byte 3 (0xFF) is not UTF-8; expected "
                                     "UTF-8 text without control characters"))
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, create, b"\x0a\x02ok\x12\x02\xc3\x28",
                     timeout=30, match=re.escape("job_id: byte 0 (0xC3) is not UTF-8"))
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, cl.session, client_name="bad\n!",
                     match=re.escape("client_name: byte 3 (0x0A) is a control character"))
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, cl.session, client_name="ok",
                     job_id="\x1b[31mred",
                     match=re.escape("job_id: byte 0 (0x1B) is a control character"))
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, cl.session, client_name="c1\u0085",
                     match=re.escape("client_name: byte 2 (0xC2) is a control character"))
        cl.session(client_name="x" * 19 + "中中", job_id="cut")
        lst = adm.admin("ListSessions", apb.ListSessionsRequest(),
                        apb.ListSessionsResponse).sessions
        assert [(s.client_name, s.job_id) for s in lst] == [
            ("unié中", 'quo"te\\back'), ("x" * 19 + "中中", "cut")], lst
        logged = lambda text: wait_for(lambda: any(text in line for line in d.lines),
                                       "log line with %r" % text)
        logged('opened: client "unié中" job "quo\\"te\\\\back" lease')
        # /metrics: the label values as given, \\ and \" escaped.
        m = scrape(d.http)
        labels = sorted((x["client"], x["job"]) for x, _ in series(m, "paradev_session_tensors"))
        assert labels == [("unié中", 'quo\\"te\\\\back'), ("x" * 19 + "中中", "cut")], labels
        # The table: whole characters, cut and padded by characters.
        r = subprocess.run([ADMIN_CLI, "admin", "--socket", d.admin, "sessions"],
                           capture_output=True, timeout=120)
        out = r.stdout.decode("utf-8")
        assert r.returncode == 0, (out, r.stderr)
        assert " unié中%s quo\"te\\back  " % (" " * 15) in out, out
        assert " %s中 cut " % ("x" * 19) in out and "中中" not in out, out
        r = subprocess.run([ADMIN_CLI, "admin", "--socket", d.admin, "sessions", "--json"],
                           capture_output=True, timeout=120)
        rows = json.loads(r.stdout.decode("utf-8"))["sessions"]
        assert [(x["client_name"], x["job_id"]) for x in rows] == [
            ("unié中", 'quo"te\\back'), ("x" * 19 + "中中", "cut")], rows
        # The session's end, escaped the same way.
        adm.admin("KillSession", apb.KillSessionRequest(job_id='quo"te\\back'),
                  apb.KillSessionResponse)
        logged('(client "unié中" job "quo\\"te\\\\back") killed by an operator')
        logged('killed the sessions of job "quo\\"te\\\\back": 1 session,')
    finally:
        rc = d.stop()
    assert rc == 0, (rc, d.log())
    assert "\ufffd" not in d.log(), d.log()


CHECKS = [check_config, check_notify, check_metrics, check_drain,
          check_drain_timeout_and_second_signal, check_stuck_shutdown, check_admin,
          check_waits, check_default_socket_dir, check_names]


def run_checks(checks):
    """Runs each check (PARADEV_TEST_ONLY: a comma list of names to run),
    then looks for sanitizer reports in every daemon's log; the exit status.
    test_health.py and test_ops.py run theirs through it too."""
    only = os.environ.get("PARADEV_TEST_ONLY")
    failed = 0
    for check in checks:
        if only and check.__name__ not in only.split(","):
            continue
        t0 = time.monotonic()
        try:
            check()
            print("PASS %s (%.1f s)" % (check.__name__, time.monotonic() - t0), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s" % check.__name__, flush=True)
            traceback.print_exc()
    for lines in ALL_LOGS:
        for line in lines:
            if "AddressSanitizer" in line or "runtime error" in line or \
                    "LeakSanitizer" in line:
                failed += 1
                print("FAIL sanitizer report in a daemon's log:", line.strip())
    print("%d failed" % failed)
    return 1 if failed else 0


def main():
    return run_checks(CHECKS)


if __name__ == "__main__":
    sys.exit(main())
