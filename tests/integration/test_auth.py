#!/usr/bin/python3
"""Identities and tenants (issue #14) against the real daemon.

Starts paradevd with a tokens file, three tenants' worth of configuration and
require_identity = tcp, on a Unix socket and on 127.0.0.1:0, and drives it
with Debian's python3-grpcio, sending bearer tokens as raw call metadata
(`authorization: Bearer ...`), so nothing of libparadev is involved. Checks:
tokens good, wrong, malformed and revoked by editing the file while the
daemon runs (and a broken edit that keeps the old table); a Unix peer
identified by its uid (uid:N, SO_PEERCRED); UNAUTHENTICATED vs
PERMISSION_DENIED; tenants' isolation (another tenant's session token is
NOT_FOUND with the very text of a session that does not exist, for
KeepAlive, Describe, Upload, CloseSession and UnregisterSharedMemory);
per-tenant limits (sessions, memory across two sessions, the lease and
quota caps); SIGHUP applying new tenant limits; every refusal logged with
its method, identity and tenant; and /metrics counting each refusal by
reason, the counts computed here from the requests sent.

Usage: test_auth.py PARADEVD PYTHON_PROTO_DIR
Exit 0: all passed; 1: a check failed; 77: skipped (grpcio missing).
"""
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
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
import health_pb2  # noqa: E402

SVC = "/paradev.v1.ParallelDevice/"
C = grpc.StatusCode
TOKENS = {"alice": "alice-" + "a" * 40, "bob": "bob-" + "b" * 40,
          "carol": "carol-" + "c" * 40}
NOT_FOUND_TEXT = "session not found: closed, lease expired, or never created"
# Refusals this test causes, by reason; /metrics must show exactly these.
EXPECTED = {"no_identity": 0, "bad_token": 0, "no_tenant": 0,
            "other_tenant": 0, "tenant_limit": 0, "not_operator": 0,
            "job_token": 0}


def sha(tok):
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def write_tokens(path, names):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write("# name sha256:hex\n")
        for n in names:
            f.write("%s %s\n" % (n, sha(TOKENS[n])))
    os.rename(tmp, path)


CONFIG = """
[auth]
tokens_file = {dir}/tokens
require_identity = tcp
operators = ops-only

[tenant alice]
identities = alice, uid:{uid}
max_sessions = {alice_max}
memory_quota = 1M
max_lease_seconds = 30
priority = 2
weight = 3

[tenant bob]
identities = bob
max_lease_seconds = 600
"""


class Daemon:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="paradevd-auth-")
        write_tokens(os.path.join(self.dir, "tokens"), ["alice", "bob", "carol"])
        self.conf = os.path.join(self.dir, "paradevd.conf")
        self.write_config(alice_max=2)
        self.sock = os.path.join(self.dir, "pd.sock")
        args = [PARADEVD, "--config", self.conf, "--listen", "unix:" + self.sock,
                "--listen", "127.0.0.1:0", "--devices", "2",
                "--memory-limit", str(64 << 20), "--admin-socket", "",
                "--metrics-listen", "127.0.0.1:0", "--grace-ms", "1000"]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(20):
            self.proc.kill()
            raise RuntimeError("paradevd not ready:\n" + "".join(self.lines))
        self.tcp = "127.0.0.1:" + self.find(r"listening on 127\.0\.0\.1:(\d+)")
        self.http = int(self.find(r"metrics on http://127\.0\.0\.1:(\d+)/"))

    def write_config(self, alice_max):
        with open(self.conf, "w") as f:
            f.write(CONFIG.format(dir=self.dir, uid=os.getuid(),
                                  alice_max=alice_max))

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def find(self, pattern):
        for line in self.lines:
            m = re.search(pattern, line)
            if m:
                return m.group(1)
        raise AssertionError("no log line matches %r" % pattern)

    def wait_log(self, pattern, start=0, timeout=10):
        end = time.time() + timeout
        while time.time() < end:
            for line in self.lines[start:]:
                if re.search(pattern, line):
                    return line
            time.sleep(0.05)
        raise AssertionError("no log line matches %r:\n%s" %
                             (pattern, "".join(self.lines[start:])))

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(15)
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


class Client:
    def __init__(self, target, token=None):
        self.ch = grpc.insecure_channel(target)
        self.md = [("authorization", "Bearer " + token)] if token else None

    def call(self, method, req, resp_cls, md=None):
        f = self.ch.unary_unary(SVC + method,
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=resp_cls.FromString)
        return f(req, timeout=10, metadata=md if md is not None else self.md)

    def session(self, **kw):
        return self.call("CreateSession", pb.CreateSessionRequest(**kw),
                         pb.CreateSessionResponse)

    def keepalive(self, tok):
        return self.call("KeepAlive", pb.KeepAliveRequest(session_token=tok),
                         pb.KeepAliveResponse)

    def upload(self, tok, hid, nbytes):
        f = self.ch.stream_unary(SVC + "Upload",
                                 request_serializer=lambda m: m.SerializeToString(),
                                 response_deserializer=pb.UploadResponse.FromString)
        hdr = pb.UploadHeader(session_token=tok, id=hid, dtype=pb.DTYPE_UINT8,
                              shape=pb.Shape(dims=[nbytes]),
                              layout=pb.Layout(kind=pb.LAYOUT_MIRRORED))
        items = [pb.UploadRequest(header=hdr),
                 pb.UploadRequest(chunk=pb.UploadChunk(offset=0, data=b"\1" * nbytes))]
        return f(iter(items), timeout=10, metadata=self.md)

    def health(self):
        f = self.ch.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=lambda m: m.SerializeToString(),
                                response_deserializer=health_pb2.HealthCheckResponse.FromString)
        return f(health_pb2.HealthCheckRequest(service=""), timeout=10,
                 metadata=self.md)


def expect_error(code, fn, *args, match=None, reason=None, **kw):
    try:
        fn(*args, **kw)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if match:
            assert re.search(match, e.details() or ""), \
                "message %r does not match %r" % (e.details(), match)
        if reason:
            EXPECTED[reason] += 1
        return e.details()
    raise AssertionError("expected %s, the call succeeded" % code)


def scrape(port):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
        text = r.read().decode()
    out = {}
    for m in re.finditer(r'^paradev_auth_refusals_total\{reason="(\w+)"\} (\d+)$',
                         text, re.M):
        out[m.group(1)] = int(m.group(2))
    return out


# --- checks ---------------------------------------------------------------------


def check_unauthenticated(d):
    anon = Client(d.tcp)
    # Health needs no identity (an orchestrator's probe has none).
    assert anon.health().status == health_pb2.HealthCheckResponse.SERVING
    start = len(d.lines)
    expect_error(C.UNAUTHENTICATED, anon.session, match=r"requires an identity",
                 reason="no_identity")
    d.wait_log(r'refused /paradev\.v1\.ParallelDevice/CreateSession '
               r'\(no_identity\): identity "" tenant ""', start)
    wrong = Client(d.tcp, "not-a-token")
    expect_error(C.UNAUTHENTICATED, wrong.session, match=r"not valid",
                 reason="bad_token")
    # Not "Bearer <token>".
    expect_error(C.UNAUTHENTICATED, anon.call, "CreateSession",
                 pb.CreateSessionRequest(), pb.CreateSessionResponse,
                 md=[("authorization", "Basic eDp5")], match=r"Bearer",
                 reason="bad_token")
    # A good token of an identity without a tenant: PERMISSION_DENIED.
    carol = Client(d.tcp, TOKENS["carol"])
    start = len(d.lines)
    expect_error(C.PERMISSION_DENIED, carol.session,
                 match=r'identity "carol" belongs to no tenant',
                 reason="no_tenant")
    d.wait_log(r'refused .*CreateSession \(no_tenant\): identity "carol"', start)


def check_isolation(d):
    alice = Client(d.tcp, TOKENS["alice"])
    bob = Client(d.tcp, TOKENS["bob"])
    a = alice.session(client_name="a1", lease_seconds=100)
    # Capped by the tenant: lease 30 s, quota the tenant's 1 MiB.
    assert a.lease_seconds == 30, a.lease_seconds
    assert a.memory_quota_bytes == 1 << 20, a.memory_quota_bytes
    b = bob.session(client_name="b1", lease_seconds=100)
    assert b.lease_seconds == 100
    tok_a = a.session_token
    alice.upload(tok_a, 7, 16)
    alice.keepalive(tok_a)
    # The text of a session that does not exist (same incarnation).
    ghost = tok_a[:-1] + bytes([tok_a[-1] ^ 1])
    t = expect_error(C.NOT_FOUND, alice.keepalive, ghost)
    assert t == NOT_FOUND_TEXT, t
    start = len(d.lines)
    for fn in [lambda: bob.keepalive(tok_a),
               lambda: bob.call("Describe", pb.DescribeRequest(session_token=tok_a, ids=[7]),
                                pb.DescribeResponse),
               lambda: bob.upload(tok_a, 8, 16),
               lambda: bob.call("UnregisterSharedMemory",
                                pb.UnregisterSharedMemoryRequest(session_token=tok_a, name="r"),
                                pb.UnregisterSharedMemoryResponse),
               lambda: bob.call("CloseSession", pb.CloseSessionRequest(session_token=tok_a),
                                pb.CloseSessionResponse)]:
        t = expect_error(C.NOT_FOUND, fn, reason="other_tenant")
        assert t == NOT_FOUND_TEXT, t
    d.wait_log(r'refused .*KeepAlive \(other_tenant\): identity "bob" tenant "bob"',
               start)
    # Alice's session survived all of that, handle 7 included.
    r = alice.call("Describe", pb.DescribeRequest(session_token=tok_a, ids=[7]),
                   pb.DescribeResponse)
    assert list(r.tensors[0].shape.dims) == [16], r
    # Bob's own handle 7 does not exist: ids are per session.
    expect_error(C.NOT_FOUND, bob.call, "Describe",
                 pb.DescribeRequest(session_token=b.session_token, ids=[7]),
                 pb.DescribeResponse, match=r"handle 7 not found")
    bob.call("CloseSession", pb.CloseSessionRequest(session_token=b.session_token),
             pb.CloseSessionResponse)
    return tok_a


def check_unix_uid_and_limits(d, tok_a):
    # The Unix socket needs no token here; the peer's uid is the identity,
    # and uid:<ours> is alice's: alice's TCP session is its own.
    unix = Client("unix:" + d.sock)
    unix.keepalive(tok_a)
    s2 = unix.session(client_name="a2").session_token
    start = len(d.lines)
    expect_error(C.RESOURCE_EXHAUSTED, unix.session,
                 match=r'tenant "alice" holds 2 sessions; its limit max_sessions is 2',
                 reason="tenant_limit")
    d.wait_log(r'refused .*CreateSession \(tenant_limit\): identity "uid:%d" '
               r'tenant "alice"' % os.getuid(), start)
    # Memory over both sessions: 1 MiB for the tenant, 16 B held; with 2
    # devices a mirrored upload of n bytes counts 2n.
    unix.upload(tok_a, 1, 300000)   # 600000 + 32 held
    expect_error(C.RESOURCE_EXHAUSTED, unix.upload, s2, 1, 250000,
                 match=r'tenant "alice" memory quota exceeded: 600032 bytes held '
                       r'by its sessions \+ 500000 new > memory_quota 1048576',
                 reason="tenant_limit")
    unix.upload(s2, 2, 200000)      # 1000032 <= 1048576
    return s2


def check_reload_limits(d, tok_a, s2):
    unix = Client("unix:" + d.sock)
    start = len(d.lines)
    d.write_config(alice_max=3)
    d.proc.send_signal(signal.SIGHUP)
    d.wait_log(r"identities: required from tcp peers, 2 tenants", start)
    s3 = unix.session(client_name="a3").session_token
    for t in (tok_a, s2, s3):
        unix.call("CloseSession", pb.CloseSessionRequest(session_token=t),
                  pb.CloseSessionResponse)


def check_revocation(d):
    path = os.path.join(d.dir, "tokens")
    alice = Client(d.tcp, TOKENS["alice"])
    bob = Client(d.tcp, TOKENS["bob"])
    tok = alice.session().session_token
    start = len(d.lines)
    write_tokens(path, ["bob", "carol"])  # alice revoked
    expect_error(C.UNAUTHENTICATED, alice.keepalive, tok, match=r"not valid",
                 reason="bad_token")
    d.wait_log(r"tokens file .* reloaded: 2 tokens", start)
    bob.session()
    # A broken edit keeps the table read before (bob still works).
    start = len(d.lines)
    with open(path + ".new", "w") as f:
        f.write("bob %s\nthis line is wrong\n" % sha(TOKENS["bob"]))
    os.rename(path + ".new", path)
    bob.session()
    d.wait_log(r"tokens file changed but is refused: .*line 2: expected "
               r"'NAME sha256:HEX'.*keeping the 2 tokens", start)
    # Fixed again: alice is back.
    write_tokens(path, ["alice", "bob"])
    alice.keepalive(tok)


def check_metrics(d):
    got = scrape(d.http)
    assert got == EXPECTED, (got, EXPECTED)


def check_hash_token():
    r = subprocess.run([PARADEVD, "--hash-token"], input="s3cret-token\n",
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    assert r.stdout == sha("s3cret-token") + "\n", r.stdout
    r = subprocess.run([PARADEVD, "--hash-token"], input="two words\n",
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "blank or control" in r.stderr, r


def check_bad_config():
    d = tempfile.mkdtemp(prefix="paradevd-auth-conf-")
    try:
        conf = os.path.join(d, "c.conf")
        with open(conf, "w") as f:
            f.write("[tenant a]\nidentities = x\npriority = 9\n"
                    "[tenant b]\nidentities = x\ncolour = red\n"
                    "[tenant c d]\nidentities = y\n"
                    "[tenant e]\nstorage_roots = /nowhere\n")
        r = subprocess.run([PARADEVD, "--config", conf, "--check-config"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, r
        for pat in [r"priority = '9': expected a priority band from -8 to 8",
                    r"colour = 'red': unknown key of a tenant",
                    r"'c d' is not a tenant name"]:
            assert re.search(pat, r.stderr), (pat, r.stderr)
        with open(conf, "w") as f:
            f.write("[tenant a]\nidentities = x, y\n[tenant b]\nidentities = y\n"
                    "[tenant e]\nidentities = z\nstorage_roots = /nowhere\n")
        r = subprocess.run([PARADEVD, "--config", conf, "--check-config"],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2, r
        for pat in [r"identity 'y' is in \[tenant a\] and \[tenant b\]",
                    r"\[tenant e\] storage_roots: '/nowhere' is not one of \[storage\] roots"]:
            assert re.search(pat, r.stderr), (pat, r.stderr)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main():
    failed = 0
    for name, fn in [("hash_token", check_hash_token), ("bad_config", check_bad_config)]:
        try:
            fn()
            print("ok   %s" % name)
        except Exception:
            failed += 1
            print("FAIL %s" % name)
            traceback.print_exc()
    d = Daemon()
    try:
        steps = [("unauthenticated", lambda: check_unauthenticated(d))]
        state = {}
        steps.append(("isolation", lambda: state.update(a=check_isolation(d))))
        steps.append(("unix_uid_and_limits",
                      lambda: state.update(s2=check_unix_uid_and_limits(d, state["a"]))))
        steps.append(("reload_limits",
                      lambda: check_reload_limits(d, state["a"], state["s2"])))
        steps.append(("revocation", lambda: check_revocation(d)))
        steps.append(("metrics", lambda: check_metrics(d)))
        for name, fn in steps:
            try:
                fn()
                print("ok   %s" % name)
            except Exception:
                failed += 1
                print("FAIL %s" % name)
                traceback.print_exc()
    finally:
        rc = d.stop()
        if rc != 0:
            failed += 1
            print("FAIL daemon exit status %d; log:\n%s" % (rc, "".join(d.lines)))
    if failed:
        print("%d check(s) failed; daemon log:\n%s" % (failed, "".join(d.lines)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
