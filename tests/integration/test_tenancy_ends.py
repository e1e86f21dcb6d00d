#!/usr/bin/python3
"""Tenancy's loose ends (issue #14, trial findings 1, 6, 7, 8, 9, 12)
against the real paradevd, over Debian's python3-grpcio with raw bearer
tokens (nothing of libparadev is involved).

- --check-config fails on what a start refuses: a missing tokens file, one
  that group or others may write, a job tokens file with a bad line; and a
  FIFO named as the [tls] key or as the tokens file is refused at once
  (not read, which would block).
- A tenant with max_sessions = 2 whose two sessions end by lease expiry
  can open two again (the slot is given back at every end).
- Revoking a token ends that holder's open Enqueue stream at a next item
  with UNAUTHENTICATED, while another tenant's open stream goes on.
- A tenant renamed by SIGHUP: its open session stays reachable by the
  identity that opened it, and is NOT_FOUND to another tenant.
- A daemon without a tokens file ignores a presented token: the Unix
  caller is let in as its uid, and a TCP listener that requires an identity
  refuses the caller as anonymous.

Usage: test_tenancy_ends.py PARADEVD PYTHON_PROTO_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import hashlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
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
TOKENS = {"dave": "dave-" + "d" * 40, "bob": "bob-" + "b" * 40}
NOT_FOUND_TEXT = "session not found: closed, lease expired, or never created"
WAIT_S = 60  # bound of every wait for the daemon; never a timing assertion


def sha(tok):
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def write_tokens(path, names, mode=0o600):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        for n in names:
            f.write("%s %s\n" % (n, sha(TOKENS[n])))
    os.chmod(tmp, mode)
    os.rename(tmp, path)


CONFIG = """
[auth]
tokens_file = {dir}/tokens
require_identity = tcp

[tenant {dave}]
identities = dave
max_sessions = 2

[tenant bob]
identities = bob
"""


class Daemon:
    def __init__(self, config, tokens=True):
        self.dir = tempfile.mkdtemp(prefix="paradevd-ends-")
        if tokens:
            write_tokens(os.path.join(self.dir, "tokens"), ["dave", "bob"])
        self.conf = os.path.join(self.dir, "paradevd.conf")
        self.config = config
        self.write_config(dave="dave")
        self.sock = os.path.join(self.dir, "pd.sock")
        args = [PARADEVD, "--config", self.conf, "--listen", "unix:" + self.sock,
                "--listen", "127.0.0.1:0", "--devices", "2",
                "--memory-limit", str(64 << 20), "--admin-socket", "",
                "--metrics-listen", "", "--grace-ms", "1000",
                "--log", "info,rpc=debug"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(WAIT_S):
            self.proc.kill()
            raise RuntimeError("paradevd not ready:\n" + "".join(self.lines))
        m = None
        for line in self.lines:
            m = m or re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        self.tcp = "127.0.0.1:" + m.group(1)

    def write_config(self, dave):
        with open(self.conf, "w") as f:
            f.write(self.config.format(dir=self.dir, dave=dave))

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def wait_log(self, pattern, start=0):
        end = time.time() + WAIT_S
        while time.time() < end:
            for line in self.lines[start:]:
                if re.search(pattern, line):
                    return line
            time.sleep(0.05)
        raise AssertionError("no log line matches %r:\n%s" %
                             (pattern, "".join(self.lines[start:])))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(30)
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


class Client:
    def __init__(self, target, token=None):
        self.ch = grpc.insecure_channel(target)
        self.md = [("authorization", "Bearer " + token)] if token else None

    def call(self, method, req, resp_cls):
        f = self.ch.unary_unary(SVC + method,
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=30, metadata=self.md)

    def session(self, **kw):
        return self.call("CreateSession", pb.CreateSessionRequest(**kw),
                         pb.CreateSessionResponse)

    def keepalive(self, tok):
        return self.call("KeepAlive", pb.KeepAliveRequest(session_token=tok),
                         pb.KeepAliveResponse)


class Stream:
    """An open Enqueue stream fed from a queue; replies gathered by a
    thread, and the stream's final error (or None) once it ends."""

    def __init__(self, client, tok):
        self.q = queue.Queue()
        self.tok = tok
        self.replies = []
        self.error = None
        self.done = threading.Event()
        f = client.ch.stream_stream(
            SVC + "Enqueue", request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.EnqueueResponse.FromString)
        self.it = f(iter(self.q.get, None), timeout=WAIT_S * 2,
                    metadata=client.md)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for r in self.it:
                self.replies.append(r)
        except grpc.RpcError as e:
            self.error = e
        self.done.set()

    def item(self):
        """Sends one item (a Delete of nothing) and waits for its reply;
        False when the stream ended instead."""
        n = len(self.replies)
        self.q.put(pb.EnqueueRequest(session_token=self.tok,
                                     delete=pb.DeleteItem(ids=[])))
        end = time.time() + WAIT_S
        while len(self.replies) == n and not self.done.is_set():
            if time.time() > end:
                raise AssertionError("no reply to an Enqueue item")
            time.sleep(0.01)
        return len(self.replies) > n

    def close(self):
        self.q.put(None)
        self.done.wait(WAIT_S)


def expect_error(code, fn, *args, match=None):
    try:
        fn(*args)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if match:
            assert re.search(match, e.details() or ""), (e.details(), match)
        return e.details()
    raise AssertionError("expected %s, the call succeeded" % code)


# --- checks -------------------------------------------------------------------


def check_config(args, want_rc, want):
    r = subprocess.run([PARADEVD, "--check-config", "--devices", "1"] + args,
                       capture_output=True, text=True, timeout=WAIT_S)
    assert r.returncode == want_rc and want in (r.stdout + r.stderr), \
        (args, r.returncode, r.stdout, r.stderr)


def check_check_config():
    d = tempfile.mkdtemp(prefix="paradevd-ends-conf-")
    try:
        conf = os.path.join(d, "c.conf")

        def with_config(body, want_rc, want):
            with open(conf, "w") as f:
                f.write("[daemon]\nadmin_socket =\n" + body)
            check_config(["--config", conf], want_rc, want)

        with_config("[auth]\ntokens_file = %s/none\n" % d, 2,
                    "[auth] tokens_file: the tokens file %s/none cannot be "
                    "read: No such file or directory; a start refuses it" % d)
        tokens = os.path.join(d, "tokens")
        write_tokens(tokens, ["dave"], mode=0o666)
        with_config("[auth]\ntokens_file = %s\n" % tokens, 2,
                    "the tokens file %s is owned by uid %d with mode 0666; "
                    "expected a file of root or of uid %d (the daemon's user) "
                    "that no one else may write" % (tokens, os.geteuid(),
                                                    os.geteuid()))
        os.chmod(tokens, 0o640)
        with_config("[auth]\ntokens_file = %s\n" % tokens, 0, "configuration OK")
        jt = os.path.join(d, "job-tokens")
        with open(jt, "w") as f:
            f.write("v1 not-a-hash\n")
        os.chmod(jt, 0o600)
        with_config("[auth]\njob_tokens_file = %s\n" % jt, 2,
                    "[auth] job_tokens_file: the job tokens file %s:1:" % jt)
        fifo = os.path.join(d, "fifo")
        os.mkfifo(fifo, 0o600)
        with_config("[auth]\ntokens_file = %s\n" % fifo, 2,
                    "the tokens file %s is a FIFO; expected a regular file" % fifo)
        # The [tls] key as a FIFO: refused at once, not read (a start or
        # --check-config that opened it to read would wait for a writer).
        here = os.path.dirname(os.path.abspath(__file__))
        crt = os.path.join(d, "s.crt")
        key = os.path.join(d, "s.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048",
                        "-nodes", "-keyout", key, "-out", crt, "-days", "2",
                        "-subj", "/CN=localhost"], check=True,
                       capture_output=True, cwd=here, timeout=WAIT_S)
        check_config(["--config", "/dev/null", "--tls-cert", crt, "--tls-key", fifo],
                     2, "key_file %s is a FIFO; expected a regular file" % fifo)
        check_config(["--config", "/dev/null", "--tls-cert", crt, "--tls-key", key],
                     0, "configuration OK")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def check_expiry_frees_slots(d):
    dave = Client(d.tcp, TOKENS["dave"])
    for _ in range(2):
        dave.session(client_name="short", lease_seconds=1)
    end = time.time() + WAIT_S
    while True:  # both expire; before the fix the tenant stayed full
        try:
            dave.session(client_name="after-expiry", lease_seconds=1)
            break
        except grpc.RpcError as e:
            assert e.code() == C.RESOURCE_EXHAUSTED, e
            assert time.time() < end, "dave's slots never came back: %s" % e.details()
            time.sleep(0.1)
    end = time.time() + WAIT_S
    while True:
        try:
            dave.session(client_name="after-expiry", lease_seconds=1)
            break
        except grpc.RpcError as e:
            assert e.code() == C.RESOURCE_EXHAUSTED, e
            assert time.time() < end, e.details()
            time.sleep(0.1)
    print("PASS expired sessions give their tenant's slots back")


def check_revoked_stream(d):
    path = os.path.join(d.dir, "tokens")
    dave = Client(d.tcp, TOKENS["dave"])
    bob = Client(d.tcp, TOKENS["bob"])
    # dave's slots may still be held by check_expiry's 1-second sessions.
    end = time.time() + WAIT_S
    while True:
        try:
            td = dave.session(client_name="pipelined", lease_seconds=60).session_token
            break
        except grpc.RpcError as e:
            assert e.code() == C.RESOURCE_EXHAUSTED and time.time() < end, e
            time.sleep(0.1)
    tb = bob.session(client_name="pipelined", lease_seconds=60).session_token
    sd, sb = Stream(dave, td), Stream(bob, tb)
    assert sd.item() and sb.item()
    start = len(d.lines)
    write_tokens(path, ["bob"])  # dave revoked
    n = 0
    end = time.time() + WAIT_S
    while sd.item():
        n += 1
        assert time.time() < end, "dave's stream outlived the revocation"
        time.sleep(0.02)
    sd.done.wait(WAIT_S)
    assert sd.error is not None and sd.error.code() == C.UNAUTHENTICATED, sd.error
    assert "the bearer token this call was let in with is no longer valid" in \
        sd.error.details(), sd.error.details()
    d.wait_log(r"refused /paradev\.v1\.ParallelDevice/Enqueue \(bad_token\): "
               r'identity "dave"', start)
    # bob's token is still good: his open stream goes on.
    assert sb.item() and sb.item(), sb.error
    sb.close()
    assert sb.error is None, sb.error
    # New calls of dave's are refused too.
    expect_error(C.UNAUTHENTICATED, dave.keepalive, td, match=r"not valid")
    write_tokens(path, ["dave", "bob"])  # for the next checks
    print("PASS revoked: dave's stream ended after %d more items; bob's went on" % n)


def check_renamed_tenant(d):
    dave = Client(d.tcp, TOKENS["dave"])
    bob = Client(d.tcp, TOKENS["bob"])
    end = time.time() + WAIT_S
    while True:
        try:
            tok = dave.session(client_name="renamed", lease_seconds=60).session_token
            break
        except grpc.RpcError as e:
            assert e.code() == C.RESOURCE_EXHAUSTED and time.time() < end, e
            time.sleep(0.1)
    start = len(d.lines)
    d.write_config(dave="dave2")
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"identities: required from tcp peers, 2 tenants", start)
    # The identity that opened it still reaches it; another tenant does not.
    assert dave.keepalive(tok).lease_seconds == 60
    t = expect_error(C.NOT_FOUND, bob.keepalive, tok)
    assert t == NOT_FOUND_TEXT, t
    # New sessions are the new tenant's.
    dave.session(client_name="in-dave2")
    dave.call("CloseSession", pb.CloseSessionRequest(session_token=tok),
              pb.CloseSessionResponse)
    print("PASS a renamed tenant's session stays its opener's")


def check_no_tokens_file():
    d = Daemon("[auth]\nrequire_identity = tcp\n", tokens=False)
    try:
        unix = Client("unix:" + d.sock, "some-token-for-another-daemon")
        start = len(d.lines)
        r = unix.session(client_name="token-ignored")
        assert r.session_token
        d.wait_log(r"a call presented a bearer token, but \[auth\] tokens_file "
                   r"is not set: tokens are ignored", start)
        tcp = Client(d.tcp, "some-token-for-another-daemon")
        expect_error(C.UNAUTHENTICATED, tcp.session, match=r"requires an identity")
        print("PASS without a tokens file a token is ignored")
    finally:
        assert d.stop() == 0


def main():
    failed = 0

    def run(name, fn):
        nonlocal failed
        try:
            fn()
            print("ok   %s" % name)
        except Exception:
            failed += 1
            print("FAIL %s" % name)
            traceback.print_exc()

    run("check_config", check_check_config)
    run("no_tokens_file", check_no_tokens_file)
    d = Daemon(CONFIG)
    try:
        run("expiry_frees_slots", lambda: check_expiry_frees_slots(d))
        run("revoked_stream", lambda: check_revoked_stream(d))
        run("renamed_tenant", lambda: check_renamed_tenant(d))
    finally:
        rc = d.stop()
        if rc != 0:
            failed += 1
            print("FAIL daemon exit status %d" % rc)
    if failed:
        print("%d check(s) failed; daemon log:\n%s" % (failed, "".join(d.lines)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
