"""The seams of issue #14, end to end against the real daemon: TLS (tls.c)
carrying the identity (auth.c) into a tenant (config_tenants.c, the
scheduler's tenants) through libparadev, the `paradev` command and the
Python package; bearer tokens over plaintext loopback TCP and over TLS;
a remote operator on a client listener; a job token bound to a uid on the
Unix socket (peercred.c) with a second uid (setpriv); a tenant's storage
roots; each checked with the values the configuration gives.

Certificates come from test_tls.py's helpers (openssl in a temporary
directory); the daemon is test_tls.Daemon. Calls whose raw session tokens
matter (another tenant's session) go through Debian's python3-grpcio with
the client certificates, an independent client.

Environment (ctest sets them; tests/integration/CMakeLists.txt):
  PARADEVD, PARADEV_LIBRARY, PARADEV_CLI, PARADEV_PROTO_PYTHON_DIR
"""
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_tls as tt  # noqa: E402  (skips without openssl)
from test_tls import CLI, Daemon, paradev  # noqa: E402

grpc = pytest.importorskip("grpc")
PROTO = os.environ.get("PARADEV_PROTO_PYTHON_DIR",
                       os.path.join(tt.ROOT, "build", "proto", "python"))
# The generated modules live in a package named paradev too: let the client
# package find its v1 subpackage there.
paradev.__path__.append(os.path.join(PROTO, "paradev"))
from paradev.v1 import admin_pb2 as apb  # noqa: E402
from paradev.v1 import paradev_pb2 as pb  # noqa: E402

C = grpc.StatusCode
TOKENS = {"alice-tok": "alice-" + "a" * 40, "bob-tok": "bob-" + "b" * 40,
          "opsbot": "ops-" + "o" * 40, "nobody-tok": "nob-" + "n" * 40}
NOT_FOUND_TEXT = "session not found: closed, lease expired, or never created"
OTHER_UID = 65534  # nobody


def sha(tok):
    return "sha256:" + hashlib.sha256(tok.encode()).hexdigest()


def write_tokens(path, names):
    with open(path + ".new", "w") as f:
        for n in names:
            f.write("%s %s\n" % (n, sha(TOKENS[n])))
    os.rename(path + ".new", path)


def _leaf_cn(d, name, ca):
    """A client certificate with a CN and no subjectAltName at all."""
    tt._ssl("req", "-newkey", "ec", "-pkeyopt",
            "ec_paramgen_curve:prime256v1", "-nodes", "-keyout",
            name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name,
            cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n")
    tt._ssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt",
            "-CAkey", ca + ".key", "-CAcreateserial", "-out", name + ".crt",
            "-days", "2", "-extfile", name + ".ext", cwd=d)


@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="paradev-seams-")
    tt._ca(d, "ca")
    tt._leaf(d, "server", "ca", "DNS:localhost,IP:127.0.0.1", "serverAuth")
    tt._leaf(d, "alice", "ca", "URI:spiffe://example/alice", "clientAuth")
    tt._leaf(d, "ops", "ca", "URI:spiffe://example/ops", "clientAuth")
    _leaf_cn(d, "bobcn", "ca")
    # A DNS name before the spiffe ID: the spiffe ID still names alice.
    tt._leaf(d, "alice2", "ca", "DNS:alice.example,URI:spiffe://example/alice",
             "clientAuth")
    yield type("Certs", (), {"dir": d, "p": staticmethod(
        lambda n: os.path.join(d, n))})
    shutil.rmtree(d, ignore_errors=True)


class Site:
    """A daemon with tenants alice and bob, a tokens file, storage roots,
    TCP (TLS or not) and a Unix socket another uid can reach."""

    def __init__(self, certs, tls=True):
        # World-searchable, so that the second uid reaches the socket.
        self.dir = tempfile.mkdtemp(prefix="pd-seams-")
        os.chmod(self.dir, 0o755)
        self.tokens = os.path.join(self.dir, "tokens")
        write_tokens(self.tokens, TOKENS)
        self.roots = {r: os.path.join(self.dir, "roots", r)
                      for r in ("alice", "shared")}
        for r in self.roots.values():
            os.makedirs(r)
        self.sock = os.path.join(self.dir, "pd.sock")
        conf = ("[auth]\ntokens_file = %s\nrequire_identity = tcp\n"
                "operators = opsbot, spiffe://example/ops\n"
                "[tenant alice]\nidentities = spiffe://example/alice, "
                "alice-tok, uid:%d, nobody-tok\nmax_sessions = 3\n"
                "memory_quota = 1M\nmax_lease_seconds = 30\n"
                "storage_roots = %s\n"
                "[tenant bob]\nidentities = bobcn, bob-tok, uid:%d\n"
                "memory_quota = 2M\nmax_lease_seconds = 600\n"
                "[storage]\nroots = %s, %s\n" % (
                    self.tokens, OTHER_UID, self.roots["alice"],
                    os.getuid(), self.roots["alice"], self.roots["shared"]))
        if tls:
            conf += tt.tls_conf(certs, ca="ca")  # verified when given
        self.certs, self.tls = certs, tls
        self.d = Daemon(self.dir, conf,
                        listen="127.0.0.1:0, unix:" + self.sock)
        os.chmod(self.sock, 0o666)
        self.target = "127.0.0.1:%d" % self.d.port

    def stop(self):
        rc = self.d.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    # libparadev, through the Python package
    def connect(self, cert=None, **kw):
        if self.tls:
            kw.setdefault("tls_ca", self.certs.p("ca.crt"))
        if cert:
            kw.update(tls_cert=self.certs.p(cert + ".crt"),
                      tls_key=self.certs.p(cert + ".key"))
        return tt.connect(self.d.port, **kw)

    # grpcio, an independent client
    def channel(self, cert=None):
        if not self.tls:
            return grpc.insecure_channel(self.target)
        read = lambda n: open(self.certs.p(n), "rb").read()  # noqa: E731
        creds = grpc.ssl_channel_credentials(
            read("ca.crt"), read(cert + ".key") if cert else None,
            read(cert + ".crt") if cert else None)
        return grpc.secure_channel(self.target, creds)


def rpc(ch, path, req, resp_cls, token=None):
    f = ch.unary_unary(path, request_serializer=lambda m: m.SerializeToString(),
                       response_deserializer=resp_cls.FromString)
    md = [("authorization", "Bearer " + token)] if token else None
    return f(req, timeout=10, metadata=md)


def pdcall(ch, method, req, resp_cls, token=None):
    return rpc(ch, "/paradev.v1.ParallelDevice/" + method, req, resp_cls,
               token)


def admin(ch, method, req, resp_cls, token=None):
    return rpc(ch, "/paradev.v1.Admin/" + method, req, resp_cls, token)


def grpc_error(code, fn, *a, **kw):
    with pytest.raises(grpc.RpcError) as e:
        fn(*a, **kw)
    assert e.value.code() == code, (e.value.code(), e.value.details())
    return e.value.details()


def sessions_by_name(site):
    ch = site.channel("ops")
    r = admin(ch, "ListSessions", apb.ListSessionsRequest(),
              apb.ListSessionsResponse, None if site.tls else TOKENS["opsbot"])
    return {s.client_name: s for s in r.sessions}


@pytest.fixture(scope="module")
def tls_site(certs):
    s = Site(certs, tls=True)
    yield s
    assert s.stop() == 0, s.d.log()


@pytest.fixture(scope="module")
def plain_site(certs):
    s = Site(certs, tls=False)
    yield s
    assert s.stop() == 0, s.d.log()


# --- 1. mTLS identity, end to end -------------------------------------------

def test_cert_identity_becomes_tenant(tls_site):
    s = tls_site
    # URI SAN spiffe://example/alice -> tenant alice: its lease and quota.
    with s.connect("alice") as c, c.session("alice-lib", lease_s=100) as a:
        assert (a.lease_s, a.memory_quota) == (30, 1 << 20)
        # A CN-only certificate: the CN (bobcn) -> tenant bob.
        with s.connect("bobcn") as c2, c2.session("bob-lib",
                                                    lease_s=100) as b:
            assert (b.lease_s, b.memory_quota) == (100, 2 << 20)
            rows = sessions_by_name(s)
            assert (rows["alice-lib"].identity, rows["alice-lib"].tenant) == (
                "spiffe://example/alice", "alice")
            assert (rows["bob-lib"].identity, rows["bob-lib"].tenant) == (
                "bobcn", "bob")
        with s.connect("alice2") as c3, c3.session("alice-dns") as a2:
            assert (a2.lease_s, a2.memory_quota) == (30, 1 << 20)
            assert sessions_by_name(s)["alice-dns"].identity == \
                "spiffe://example/alice"
        x = np.arange(4, dtype=np.float32)
        t = a.upload(x, paradev.mirrored())
        np.testing.assert_array_equal((t + t).numpy(paradev.mirrored()), x + x)
    # The command: the certificate identifies the caller as well.
    r = subprocess.run([CLI, "--target", s.target, "--tls-ca",
                        s.certs.p("ca.crt"), "--tls-cert",
                        s.certs.p("alice.crt"), "--tls-key",
                        s.certs.p("alice.key"), "info"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_cert_tenants_isolated(tls_site):
    s = tls_site
    alice, bob = s.channel("alice"), s.channel("bobcn")
    a = pdcall(alice, "CreateSession", pb.CreateSessionRequest(
        client_name="iso-a"), pb.CreateSessionResponse)
    assert a.lease_seconds == 30
    tok = a.session_token
    for fn in (lambda: pdcall(bob, "KeepAlive", pb.KeepAliveRequest(
                   session_token=tok), pb.KeepAliveResponse),
               lambda: pdcall(bob, "CloseSession", pb.CloseSessionRequest(
                   session_token=tok), pb.CloseSessionResponse)):
        assert grpc_error(C.NOT_FOUND, fn) == NOT_FOUND_TEXT
    s.d.wait_log(r'refused /paradev\.v1\.ParallelDevice/KeepAlive '
                 r'\(other_tenant\): identity "bobcn" tenant "bob"')
    pdcall(alice, "KeepAlive", pb.KeepAliveRequest(session_token=tok),
           pb.KeepAliveResponse)
    pdcall(alice, "CloseSession", pb.CloseSessionRequest(session_token=tok),
           pb.CloseSessionResponse)


def test_tls_without_identity_unauthenticated(tls_site):
    s = tls_site
    with s.connect() as c:  # TLS, no certificate, no token
        assert c.tls
        with pytest.raises(paradev.Unauthenticated) as e:
            c.session("anon")
    assert "requires an identity" in str(e.value), str(e.value)
    r = subprocess.run([CLI, "--target", s.target, "--tls-ca",
                        s.certs.p("ca.crt"), "info"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr and \
        "requires an identity" in r.stderr, r.stderr


# --- 2. bearer tokens, plaintext and TLS --------------------------------------

@pytest.mark.parametrize("kind", ["plain", "tls"])
def test_token_end_to_end(kind, request, tmp_path):
    s = request.getfixturevalue(kind + "_site")
    tokfile = str(tmp_path / "alice.token")
    with open(tokfile, "w") as f:
        f.write(TOKENS["alice-tok"] + "\n")
    with s.connect(token=TOKENS["alice-tok"]) as c, c.session("tok") as a:
        assert (c.tls, a.lease_s, a.memory_quota) == (s.tls, 30, 1 << 20)
        assert sessions_by_name(s)["tok"].identity == "alice-tok"
    with s.connect(token_file=tokfile) as c:
        c.session("tokfile").close()
    env = dict(os.environ, PARADEV_TOKEN=TOKENS["bob-tok"])
    tls = ["--tls-ca", s.certs.p("ca.crt")] if s.tls else []
    r = subprocess.run([CLI, "--target", s.target, *tls, "info"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([CLI, "--target", s.target, *tls, "--token-file",
                        tokfile, "info"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # A wrong token: UNAUTHENTICATED, said plainly by each client.
    with s.connect(token="wrong-" + "x" * 20) as c:
        with pytest.raises(paradev.Unauthenticated) as e:
            c.session("wrong")
    assert "not valid" in str(e.value), str(e.value)
    env["PARADEV_TOKEN"] = "wrong-" + "x" * 20
    r = subprocess.run([CLI, "--target", s.target, *tls, "info"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "UNAUTHENTICATED" in r.stderr and \
        "not valid" in r.stderr, r.stderr
    # The hint is about the caller's credentials, not a session token.
    assert "the session token is malformed" not in r.stderr, r.stderr
    assert "identify with a bearer token" in r.stderr, r.stderr
    # Revoked by editing the file: the next call of an open client fails.
    c = s.connect(token=TOKENS["alice-tok"])
    try:
        sess = c.session("revoke")
        write_tokens(s.tokens, [n for n in TOKENS if n != "alice-tok"])
        with pytest.raises(paradev.Unauthenticated) as e:
            sess.upload(np.zeros(3, np.float32), paradev.mirrored()).numpy(
                paradev.mirrored())
        assert "not valid" in str(e.value), str(e.value)
        r = subprocess.run([CLI, "--target", s.target, *tls, "--token-file",
                            tokfile, "info"], capture_output=True, text=True)
        assert r.returncode == 1 and "not valid" in r.stderr, r.stderr
        write_tokens(s.tokens, TOKENS)
        sess.close()
    finally:
        write_tokens(s.tokens, TOKENS)
        c.close()


# --- 3. a remote operator -------------------------------------------------------

def test_remote_operator(tls_site, plain_site, tmp_path):
    for s, who in ((tls_site, {"cert": "ops"}), (tls_site, {"token": "opsbot"}),
                   (plain_site, {"token": "opsbot"})):
        ch = s.channel(who.get("cert"))
        tok = TOKENS[who["token"]] if "token" in who else None
        r = admin(ch, "ListSessions", apb.ListSessionsRequest(),
                  apb.ListSessionsResponse, tok)
        assert not r.draining
        # A tenant's identity is no operator.
        d = grpc_error(C.PERMISSION_DENIED, admin, s.channel("alice") if s.tls
                       else ch, "ListSessions", apb.ListSessionsRequest(),
                       apb.ListSessionsResponse,
                       None if s.tls else TOKENS["alice-tok"])
        assert "Admin.ListSessions needs an operator" in d, d
    # `paradev admin --target` with TLS and token options.
    opsfile = str(tmp_path / "ops.token")
    with open(opsfile, "w") as f:
        f.write(TOKENS["opsbot"] + "\n")
    s = tls_site
    with s.connect("alice") as c, c.session("seen-by-ops"):
        for creds in (["--tls-cert", s.certs.p("ops.crt"), "--tls-key",
                       s.certs.p("ops.key")], ["--token-file", opsfile]):
            r = subprocess.run([CLI, "admin", "--target", s.target,
                                "--tls-ca", s.certs.p("ca.crt"), *creds,
                                "sessions", "--json"],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            doc = json.loads(r.stdout)
            row = [x for x in doc["sessions"]
                   if x["client_name"] == "seen-by-ops"]
            assert [(x["tenant"], x["identity"]) for x in row] == [
                ("alice", "spiffe://example/alice")], doc
    r = subprocess.run([CLI, "admin", "--target", plain_site.target,
                        "--token-file", opsfile, "status", "--field",
                        "state"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == "serving\n", r.stderr
    # The environment's CA and token, as for any client, and tls://.
    env = dict(os.environ, PARADEV_TLS_CA=s.certs.p("ca.crt"),
               PARADEV_TOKEN=TOKENS["opsbot"])
    for t in (s.target, "tls://localhost:%d" % s.d.port):
        r = subprocess.run([CLI, "admin", "--target", t, "status", "--field",
                            "state"], capture_output=True, text=True, env=env)
        assert r.returncode == 0 and r.stdout == "serving\n", (t, r.stderr)
    # Plaintext to the TLS listener: the hint names TLS.
    r = subprocess.run([CLI, "admin", "--timeout", "5s", "--target", s.target,
                        "--token-file", opsfile, "status"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "without TLS?" in r.stderr, r.stderr
    # Someone else: PERMISSION_DENIED, printed with the method.
    r = subprocess.run([CLI, "admin", "--target", s.target, "--tls-ca",
                        s.certs.p("ca.crt"), "--tls-cert",
                        s.certs.p("alice.crt"), "--tls-key",
                        s.certs.p("alice.key"), "status"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "needs an operator" in r.stderr, r.stderr
    # A wrong token: UNAUTHENTICATED, said so.
    with open(opsfile, "w") as f:
        f.write("not-a-token\n")
    r = subprocess.run([CLI, "admin", "--target", plain_site.target,
                        "--token-file", opsfile, "status"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not valid" in r.stderr, r.stderr
    # Options that need --target, and a CA without TLS material.
    r = subprocess.run([CLI, "admin", "--token-file", opsfile, "status"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--target" in r.stderr, r.stderr


# --- 4. a job token bound to a uid ----------------------------------------------

_STAGED = {}


def _staged_client():
    """The Python package and libparadev copied into a directory every uid
    may read: the checkout (a `mktemp -d` clone, mode 0700) may not be
    readable by OTHER_UID. Returns (package dir, library or None)."""
    if not _STAGED:
        d = tempfile.mkdtemp(prefix="paradev-seams-other-")
        os.chmod(d, 0o755)
        shutil.copytree(os.path.join(tt.ROOT, "client", "python", "paradev"),
                        os.path.join(d, "paradev"))
        lib = os.environ.get("PARADEV_LIBRARY")
        if lib:
            shutil.copy(lib, os.path.join(d, "libparadev.so"))
            lib = os.path.join(d, "libparadev.so")
        for root, dirs, files in os.walk(d):
            for n in dirs:
                os.chmod(os.path.join(root, n), 0o755)
            for n in files:
                os.chmod(os.path.join(root, n), 0o644)
        _STAGED["dir"], _STAGED["lib"] = d, lib
    return _STAGED["dir"], _STAGED["lib"]


def _as_other_uid(site, job_token, extra=""):
    """Opens a session on the Unix socket as uid 65534 (setpriv)."""
    pkg, lib = _staged_client()
    prog = ("import sys; sys.path.insert(0, %r); import paradev\n"
            "c = paradev.connect(%r, ignore_environment=True%s)\n"
            "try:\n"
            "    c.session('as-other', job_token=%r).close(); print('OK')\n"
            "except paradev.Error as e:\n"
            "    print(type(e).__name__, e)\n" % (
                pkg, "unix:" + site.sock,
                extra, job_token))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "PYTHONDONTWRITEBYTECODE": "1"}
    if lib:
        env["PARADEV_LIBRARY"] = lib
    for k in ("LD_PRELOAD", "ASAN_OPTIONS"):  # a sanitizer build's runtime
        if k in os.environ:
            env[k] = os.environ[k]
    r = subprocess.run(["setpriv", "--reuid", str(OTHER_UID), "--regid",
                        str(OTHER_UID), "--clear-groups", sys.executable, "-c",
                        prog], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_job_token_uid(plain_site):
    s = plain_site
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to act as a second uid (%d)" %
                    OTHER_UID)
    ch = s.channel()
    ops = TOKENS["opsbot"]
    tok = admin(ch, "CreateJobToken", apb.CreateJobTokenRequest(
        job_id="4242", uid=OTHER_UID), apb.CreateJobTokenResponse, ops).token
    # Root (uid 0, tenant bob) on the Unix socket: not its token.
    with tt.paradev.connect("unix:" + s.sock, timeout=10,
                            ignore_environment=True) as c:
        with pytest.raises(paradev.PermissionDenied) as e:
            c.session("root", job_token=tok)
    assert 'job token of job "4242" belongs to uid:%d; this caller is ' \
        'uid:0' % OTHER_UID in str(e.value), str(e.value)
    # Nor with a bearer token on top: the peer is still uid 0.
    with tt.paradev.connect("unix:" + s.sock, timeout=10,
                            ignore_environment=True,
                            token=TOKENS["nobody-tok"]) as c:
        with pytest.raises(paradev.PermissionDenied) as e:
            c.session("root-tok", job_token=tok)
    assert "uid:0" in str(e.value), str(e.value)
    # uid 65534 itself: accepted, the session bound to job 4242.
    assert _as_other_uid(s, tok) == "OK"
    line = s.d.wait_log(r'session \d+ opened: client "as-other" job "4242"'
                        r'[^\n]*').group(0)
    assert 'tenant "alice"' in line and "claimed" not in line, line
    # And it is refused to uid 65534 for another uid's token.
    tok0 = admin(ch, "CreateJobToken", apb.CreateJobTokenRequest(
        job_id="4343", uid=0), apb.CreateJobTokenResponse, ops).token
    out = _as_other_uid(s, tok0)
    assert out.startswith("PermissionDenied") and \
        "belongs to uid:0; this caller is uid:%d" % OTHER_UID in out, out


# --- 5. a tenant's storage roots ------------------------------------------------

def test_tenant_storage_roots(tls_site):
    s = tls_site
    x = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5
    for r in s.roots.values():
        np.save(os.path.join(r, "x.npy"), x)
        os.chmod(r, 0o777)
    inside = os.path.join(s.roots["alice"], "x.npy")
    outside = os.path.join(s.roots["shared"], "x.npy")
    with s.connect("alice") as c, c.session("roots") as a:
        np.testing.assert_array_equal(a.load(inside)[""].numpy(
            paradev.mirrored()), x)
        with pytest.raises(paradev.PermissionDenied) as e:
            a.load(outside)
        msg = str(e.value)
        assert "storage_roots" in msg and "alice" in msg, msg
        t = a.upload(x, paradev.mirrored())
        a.save(os.path.join(s.roots["alice"], "y.npy"), {"y": t})
        np.testing.assert_array_equal(
            np.load(os.path.join(s.roots["alice"], "y.npy")), x)
        with pytest.raises(paradev.PermissionDenied) as e:
            a.save(os.path.join(s.roots["shared"], "y.npy"), {"y": t})
        assert "storage_roots" in str(e.value), str(e.value)
        assert not os.path.exists(os.path.join(s.roots["shared"], "y.npy"))
    # bob has no storage_roots of its own: every [storage] root.
    with s.connect("bobcn") as c, c.session("roots-bob") as b:
        np.testing.assert_array_equal(b.load(outside)[""].numpy(
            paradev.mirrored()), x)
    assert stat.S_ISREG(os.stat(inside).st_mode)
