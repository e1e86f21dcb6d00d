"""The client side of refusals (issues #14 and #15, the trial's findings 8,
10, 14 and 15): the advice after UNAUTHENTICATED follows what the daemon
refused (an identity, not a session token), a client certificate with the
wrong key or the wrong extendedKeyUsage is named before gRPC sees it, a
shell inside a Slurm job opens sessions under require_job_token, and
`paradev admin` prints status names and escapes names that would reorder
the operator's terminal. Real daemons on real sockets; certificates from
test_tls.py's fixture (openssl).

Environment (ctest sets them; tests/integration/CMakeLists.txt):
  PARADEVD, PARADEV_LIBRARY, PARADEV_CLI
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import test_tls  # noqa: E402  (the certificates, the daemon, the paths)
from test_tls import CLI, PARADEVD, connect, tls_conf  # noqa: E402,F401
from test_tls import certs  # noqa: E402,F401  (a fixture)

import paradev  # noqa: E402

for _v in ("PARADEV_JOB_TOKEN", "SLURM_JOB_ID", "PARADEV_ADMIN_SOCKET"):
    os.environ.pop(_v, None)


class Daemon(test_tls.Daemon):
    """test_tls's daemon, with an admin socket in its directory."""

    def __init__(self, tmp, conf):
        self.dir = tempfile.mkdtemp(prefix="pd-", dir=tmp)
        self.admin = os.path.join(self.dir, "admin.sock")
        self.conf = os.path.join(self.dir, "paradevd.conf")
        with open(self.conf, "w") as f:
            f.write("[daemon]\nlisten = 127.0.0.1:0\nadmin_socket = %s\n"
                    "shutdown_grace_ms = 1000\n[devices]\ndevices = 2\n"
                    "memory_limit = 64M\n%s" % (self.admin, conf))
        self.proc = subprocess.Popen(
            [PARADEVD, "--config", self.conf], stderr=subprocess.PIPE,
            text=True, errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(30):
            self.proc.kill()
            raise RuntimeError("paradevd not ready:\n" + self.log())
        m = test_tls.re.search(r"listening on [0-9.]+:(\d+)", self.log())
        self.port = int(m.group(1))
        self.target = "127.0.0.1:%d" % self.port


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


def cli(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("PARADEV_")}
    e.update(env or {})
    return subprocess.run([CLI, *args], capture_output=True, text=True,
                          env=e, timeout=60)


IDENTITY_HINT = ("--token-file", "PARADEV_TOKEN_FILE", "--tls-cert",
                 "PARADEV_TLS_CERT")


# --- finding 8: the hint follows the refusal ---------------------------------

def test_identity_refusal_names_the_identity_options(tmp):
    d = Daemon(tmp, "[auth]\nrequire_identity = tcp\n")
    try:
        with connect(d.port) as c:
            with pytest.raises(paradev.Unauthenticated) as e:
                c.info()
        assert "requires an identity" in e.value.message, e.value.message
        for w in IDENTITY_HINT:
            assert w in e.value.hint, e.value.hint
        assert "session token" not in e.value.hint
        assert "--token-file" in str(e.value), str(e.value)
        r = cli("--target", d.target, "info")
        assert r.returncode == 1, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("paradev info: UNAUTHENTICATED (identify"), last
        for w in IDENTITY_HINT:
            assert w in last, last
        assert "session token" not in r.stderr, r.stderr
    finally:
        assert d.stop() == 0, d.log()


def test_token_to_a_daemon_without_tokens(tmp):
    """A daemon without [auth] tokens_file ignores a token a client sends
    (deploy/README.md, Tenants and tokens, step 2): a client set up with a
    token for another daemon still works on this one."""
    d = Daemon(tmp, "")
    tok = os.path.join(tmp, "t.token")
    with open(tok, "w") as f:
        f.write("secret-token\n")
    try:
        with connect(d.port, token="secret-token") as c:
            assert c.info().num_devices > 0
        r = cli("--target", d.target, "ping", "--count", "1",
                env={"PARADEV_TOKEN_FILE": tok})
        assert r.returncode == 0, r.stderr
    finally:
        assert d.stop() == 0, d.log()


def test_bad_bearer_token_hint(tmp):
    good = "tok-alice-0123456789"
    tf = os.path.join(tmp, "tokens")
    with open(tf, "w") as f:
        f.write("alice sha256:%s\n" % hashlib.sha256(good.encode()).hexdigest())
    os.chmod(tf, 0o600)
    d = Daemon(tmp, "[auth]\ntokens_file = %s\nrequire_identity = tcp\n" % tf)
    try:
        with connect(d.port, token=good) as c:
            assert c.info().num_devices == 2
        with connect(d.port, token="tok-mallory") as c:
            with pytest.raises(paradev.Unauthenticated) as e:
                c.info()
        assert "bearer token is not valid" in e.value.message
        assert "--token-file" in e.value.hint, e.value.hint
    finally:
        assert d.stop() == 0, d.log()


# --- finding 10: the client certificate checked before the channel ------------

def test_client_key_not_the_certificates(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, ca="ca", require=True))
    try:
        with pytest.raises(paradev.InvalidArgument) as e:
            connect(d.port, tls_ca=certs.p("ca.crt"),
                    tls_cert=certs.p("client.crt"),
                    tls_key=certs.p("server.key"))
        msg = e.value.message
        assert "tls_key_file %s is not the private key of the client " \
            "certificate tls_cert_file %s" % (certs.p("server.key"),
                                              certs.p("client.crt")) in msg, msg
        r = cli("--target", d.target, "--tls-ca", certs.p("ca.crt"),
                "--tls-cert", certs.p("client.crt"), "--tls-key",
                certs.p("server.key"), "ping", "--count", "1")
        assert r.returncode == 2, r.stderr
        assert "is not the private key of the client certificate" in r.stderr
        for noise in ("empty address list", "Invalid private key",
                      "Handshaker factory", "ssl_transport_security"):
            assert noise not in r.stderr, r.stderr
        # the right pair still works
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_cert=certs.p("client.crt"),
                     tls_key=certs.p("client.key")) as c:
            assert c.info().client_cert_required
    finally:
        assert d.stop() == 0, d.log()


def test_server_certificate_as_client_certificate(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, ca="ca", require=True))
    try:
        with pytest.raises(paradev.InvalidArgument) as e:
            connect(d.port, tls_ca=certs.p("ca.crt"),
                    tls_cert=certs.p("server.crt"),
                    tls_key=certs.p("server.key"))
        msg = e.value.message
        assert "%s is not a client certificate: its extendedKeyUsage lacks " \
            "clientAuth" % certs.p("server.crt") in msg, msg
        assert "signed by a CA" not in msg, msg
        notkey = os.path.join(tmp, "notkey.pem")
        with open(notkey, "w") as f:
            f.write("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")
        with pytest.raises(paradev.InvalidArgument,
                           match="holds no private key that can be read"):
            connect(d.port, tls_ca=certs.p("ca.crt"),
                    tls_cert=certs.p("client.crt"), tls_key=notkey)
    finally:
        assert d.stop() == 0, d.log()


# --- finding 15: $SLURM_JOB_ID under require_job_token ------------------------

def test_slurm_job_id_never_fails_a_session(tmp):
    d = Daemon(tmp, "[auth]\nrequire_job_token = true\n")
    os.environ["SLURM_JOB_ID"] = "4242"
    try:
        with connect(d.port) as c:
            with c.session("in-a-job") as s:
                assert s.num_devices == 2
                r = cli("admin", "--socket", d.admin, "sessions", "--json")
                doc = json.loads(r.stdout)
                got = [(e["job_id"], e["job_proven"]) for e in doc["sessions"]
                       if e["client_name"] == "in-a-job"]
                assert got == [("", False)], doc
            # A job id the caller gives without a token is still refused.
            with pytest.raises(paradev.PermissionDenied,
                               match="job_id given without a job token"):
                c.session("claim", job_id="4242")
    finally:
        del os.environ["SLURM_JOB_ID"]
        assert d.stop() == 0, d.log()


# --- findings 14 and 15: `paradev admin` -----------------------------------------

def test_admin_escapes_bidi_and_names_codes(tmp):
    d = Daemon(tmp, "")
    # an override and an isolate; a tag character (past U+FFFF)
    names = ["ab\u202edcba\u2066x", "\U000e0041\u200bz"]
    try:
        with connect(d.port) as c, c.session(names[0]), c.session(names[1]):
            r = cli("admin", "--socket", d.admin, "sessions")
            assert r.returncode == 0, r.stderr
            for ch in "\u202e\u2066\U000e0041\u200b":
                assert ch not in r.stdout, r.stdout
            assert "ab\\u202Edcba\\u2066x " in r.stdout, r.stdout
            assert "\\U000E0041\\u200Bz " in r.stdout, r.stdout
            r = cli("admin", "--socket", d.admin, "sessions", "--json")
            got = [e["client_name"] for e in json.loads(r.stdout)["sessions"]]
            assert sorted(got) == sorted(names), got  # JSON stays exact
        r = cli("admin", "--socket", d.admin, "kill", "--session", "999999")
        assert r.returncode == 1, r.stderr
        assert "(NOT_FOUND)" in r.stderr and "(status " not in r.stderr, r.stderr
    finally:
        assert d.stop() == 0, d.log()
    r = cli("admin", "--socket", os.path.join(tmp, "none.sock"), "status")
    assert r.returncode == 1
    assert "(UNAVAILABLE)" in r.stderr and "(status 14)" not in r.stderr, \
        r.stderr
