"""TLS on paradevd's TCP listeners and libparadev's TLS and token options
(issue #14, "Transport security"), against the real daemon on real sockets.

Certificates are made here with Debian's `openssl` in a temporary
directory: a CA and a second CA (the "unknown" one), a server certificate
for localhost and 127.0.0.1 and a second one (rotation), a certificate
signed by the second CA, one for a wrong name, client certificates with
spiffe:// URI SANs from both CAs. The served certificate is read back with
`openssl s_client` (its serial, compared with `openssl x509`'s).

Driven through the Python package (client/python, over libparadev) and the
`paradev` command; the token's metadata is read by a grpcio server
(Debian's python3-grpcio) standing in for the daemon.

Environment (ctest sets them; tests/integration/CMakeLists.txt):
  PARADEVD, PARADEV_LIBRARY, PARADEV_CLI
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import paradev  # noqa: E402

PARADEVD = os.environ.get("PARADEVD",
                          os.path.join(ROOT, "build", "server", "paradevd"))
CLI = os.environ.get("PARADEV_CLI",
                     os.path.join(ROOT, "build", "client", "paradev"))

if shutil.which("openssl") is None:
    pytest.skip("openssl not found (apt-get install openssl)",
                allow_module_level=True)

# The TLS variables of the environment ctest runs in must not leak in.
for _v in ("PARADEV_TLS_CA", "PARADEV_TLS_CERT", "PARADEV_TLS_KEY",
           "PARADEV_TLS_SERVER_NAME", "PARADEV_TOKEN", "PARADEV_TOKEN_FILE",
           "PARADEV_TARGET"):
    os.environ.pop(_v, None)


# --- certificates ---------------------------------------------------------

def _ssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _ca(d, name):
    _ssl("req", "-x509", "-newkey", "ec", "-pkeyopt",
         "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", name + ".key",
         "-out", name + ".crt", "-days", "2", "-subj", "/CN=" + name,
         "-addext", "basicConstraints=critical,CA:TRUE",
         "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _leaf(d, name, ca, san, eku):
    _ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
         "-subj", "/CN=" + name, cwd=d)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write("subjectAltName=%s\nextendedKeyUsage=%s\n"
                "basicConstraints=CA:FALSE\n" % (san, eku))
    _ssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey",
         ca + ".key", "-CAcreateserial", "-out", name + ".crt", "-days", "2",
         "-extfile", name + ".ext", cwd=d)


def serial_of(path):
    out = subprocess.run(["openssl", "x509", "-in", path, "-noout",
                          "-serial"], check=True, capture_output=True,
                         text=True).stdout
    return out.strip().split("=", 1)[1].upper()


def served_serial(port, ca):
    """The serial of the certificate the daemon serves a new connection."""
    r = subprocess.run(["openssl", "s_client", "-connect",
                        "127.0.0.1:%d" % port, "-servername", "localhost",
                        "-CAfile", ca], input="", capture_output=True,
                       text=True, timeout=20)
    pem = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----",
                    r.stdout, re.S)
    assert pem, r.stdout + r.stderr
    out = subprocess.run(["openssl", "x509", "-noout", "-serial"],
                         input=pem.group(0), capture_output=True, text=True,
                         check=True).stdout
    return out.strip().split("=", 1)[1].upper()


@pytest.fixture(scope="module")
def certs():
    d = tempfile.mkdtemp(prefix="paradev-tls-")
    _ca(d, "ca")
    _ca(d, "ca2")
    here = "DNS:localhost,IP:127.0.0.1"
    _leaf(d, "server", "ca", here, "serverAuth")
    _leaf(d, "server2", "ca", here, "serverAuth")
    _leaf(d, "other", "ca2", here, "serverAuth")
    _leaf(d, "wrongname", "ca", "DNS:wrong.example", "serverAuth")
    _leaf(d, "client", "ca", "URI:spiffe://example/alice", "clientAuth")
    _leaf(d, "client2", "ca2", "URI:spiffe://example/mallory", "clientAuth")
    yield type("Certs", (), {"dir": d, "p": staticmethod(
        lambda n: os.path.join(d, n))})
    shutil.rmtree(d, ignore_errors=True)


# --- the daemon -------------------------------------------------------------

class Daemon:
    """paradevd with `conf` (the text of a config file) on 127.0.0.1:0."""

    def __init__(self, tmp, conf, listen="127.0.0.1:0", wait=True):
        self.dir = tempfile.mkdtemp(prefix="pd-", dir=tmp)
        self.conf = os.path.join(self.dir, "paradevd.conf")
        with open(self.conf, "w") as f:
            f.write("[daemon]\nlisten = %s\nadmin_socket =\n"
                    "shutdown_grace_ms = 1000\n[devices]\ndevices = 2\n"
                    "memory_limit = 64M\n%s" % (listen, conf))
        self.proc = subprocess.Popen(
            [PARADEVD, "--config", self.conf], stderr=subprocess.PIPE,
            text=True, errors="replace")
        self.lines = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if wait and not self.ready.wait(30):
            self.proc.kill()
            raise RuntimeError("paradevd not ready:\n" + self.log())
        m = re.search(r"listening on [0-9.]+:(\d+)", self.log())
        self.port = int(m.group(1)) if m else None

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()
        self.ready.set()

    def log(self):
        return "".join(self.lines)

    def wait_log(self, pattern, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            m = re.search(pattern, self.log())
            if m:
                return m
            time.sleep(0.05)
        raise AssertionError("no %r in the log:\n%s" % (pattern, self.log()))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)


def tls_conf(c, cert="server", key=None, ca=None, require=False):
    s = "[tls]\ncert_file = %s\nkey_file = %s\n" % (
        c.p(cert + ".crt"), c.p((key or cert) + ".key"))
    if ca:
        s += "client_ca_file = %s\n" % c.p(ca + ".crt")
    if require:
        s += "require_client_cert = true\n"
    return s


def connect(port, host="127.0.0.1", **kw):
    kw.setdefault("timeout", 10)
    kw.setdefault("ignore_environment", True)
    return paradev.connect("%s:%d" % (host, port), **kw)


def square_roundtrip(c):
    """An op end to end: x * x on the daemon, against NumPy."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5
    with c.session("tls") as s:
        t = s.upload(x, paradev.mirrored())
        np.testing.assert_array_equal((t * t).numpy(paradev.mirrored()), x * x)


def unavailable(c):
    with pytest.raises(paradev.Unavailable) as e:
        c.info()
    return str(e.value)


# --- accepted ---------------------------------------------------------------

def test_tls_accepted(certs, tmp):
    d = Daemon(tmp, tls_conf(certs))
    try:
        assert "(TLS)" in d.log()
        with connect(d.port, tls_ca=certs.p("ca.crt")) as c:
            assert c.tls
            info = c.info()
            assert info.tls and not info.client_cert_required
            assert not info.insecure_tcp and info.warnings == ()
            square_roundtrip(c)
        # tls://, and the name localhost (the certificate's DNS SAN)
        with paradev.connect("tls://localhost:%d" % d.port, timeout=10,
                             tls_ca=certs.p("ca.crt")) as c:
            assert c.tls and c.target == "localhost:%d" % d.port
            assert c.info().tls
        # a client certificate offered to a daemon that asks for none
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_cert=certs.p("client.crt"),
                     tls_key=certs.p("client.key")) as c:
            assert c.info().tls
        # the environment's CA turns TLS on too
        os.environ["PARADEV_TLS_CA"] = certs.p("ca.crt")
        try:
            with paradev.connect("127.0.0.1:%d" % d.port, timeout=10) as c:
                assert c.tls and c.info().tls
        finally:
            del os.environ["PARADEV_TLS_CA"]
    finally:
        assert d.stop() == 0, d.log()


def test_mtls_accepted_and_refused(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, ca="ca", require=True))
    try:
        assert "client certificates required" in d.log()
        r = subprocess.run([PARADEVD, "--config", d.conf, "--check-config"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "tls: subject /CN=server, serial %s" % serial_of(
            certs.p("server.crt")) in r.stdout, r.stdout
        assert "client certificates required" in r.stdout, r.stdout
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_cert=certs.p("client.crt"),
                     tls_key=certs.p("client.key")) as c:
            info = c.info()
            assert info.tls and info.client_cert_required
            square_roundtrip(c)
        with connect(d.port, tls_ca=certs.p("ca.crt")) as c:
            msg = unavailable(c)
        assert "requires a client certificate" in msg, msg
        assert "--tls-cert" in msg and "PARADEV_TLS_CERT" in msg, msg
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_cert=certs.p("client2.crt"),
                     tls_key=certs.p("client2.key")) as c:
            msg = unavailable(c)
        assert "refused the client certificate" in msg, msg
        assert "client2.crt" in msg and "client_ca_file" in msg, msg
    finally:
        assert d.stop() == 0, d.log()


def test_client_cert_verified_when_given(certs, tmp):
    """A CA without require: no certificate is fine, a bad one is not."""
    d = Daemon(tmp, tls_conf(certs, ca="ca"))
    try:
        assert "verified when given" in d.log()
        with connect(d.port, tls_ca=certs.p("ca.crt")) as c:
            assert not c.info().client_cert_required
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_cert=certs.p("client.crt"),
                     tls_key=certs.p("client.key")) as c:
            assert c.info().tls
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_cert=certs.p("client2.crt"),
                     tls_key=certs.p("client2.key")) as c:
            assert "refused the client certificate" in unavailable(c)
    finally:
        assert d.stop() == 0, d.log()


# --- handshake failures -----------------------------------------------------

def test_unknown_ca(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, cert="other"))  # signed by ca2
    try:
        with connect(d.port, tls_ca=certs.p("ca.crt")) as c:
            msg = unavailable(c)
        assert "not trusted (unknown CA" in msg, msg
        assert certs.p("ca.crt") in msg and "--tls-ca" in msg, msg
        with connect(d.port, tls_ca=certs.p("ca2.crt")) as c:
            assert c.info().tls
    finally:
        assert d.stop() == 0, d.log()


def test_name_mismatch(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, cert="wrongname"))
    try:
        with connect(d.port, tls_ca=certs.p("ca.crt")) as c:
            msg = unavailable(c)
        assert "name mismatch" in msg and '"127.0.0.1"' in msg, msg
        assert "--tls-server-name" in msg, msg
        with connect(d.port, tls_ca=certs.p("ca.crt"),
                     tls_server_name="wrong.example") as c:
            assert c.info().tls
    finally:
        assert d.stop() == 0, d.log()


def test_plaintext_and_tls_mixed_up(certs, tmp):
    d = Daemon(tmp, tls_conf(certs))
    p = Daemon(tmp, "")
    try:
        with connect(d.port) as c:  # plaintext to TLS
            assert not c.tls
            msg = unavailable(c)
        assert "if it serves TLS" in msg and "tls://" in msg, msg
        with connect(p.port, tls_ca=certs.p("ca.crt")) as c:  # TLS to plain
            msg = unavailable(c)
        assert "does not speak TLS" in msg, msg
        with connect(p.port, tls=True) as c:
            assert c.tls
        with connect(p.port, tls=False) as c:
            assert not c.tls and c.info().tls is False
    finally:
        assert d.stop() == 0, d.log()
        assert p.stop() == 0, p.log()


def test_bad_client_options(certs, tmp):
    with pytest.raises(paradev.InvalidArgument, match="without a key"):
        connect(7478, tls_cert=certs.p("client.crt"))
    with pytest.raises(paradev.InvalidArgument,
                       match="tls_ca_file /nonexistent.pem cannot be read"):
        connect(7478, tls_ca="/nonexistent.pem")
    os.environ["PARADEV_TLS_CA"] = "/nonexistent.pem"
    try:
        with pytest.raises(paradev.InvalidArgument,
                           match=r"\$PARADEV_TLS_CA /nonexistent.pem"):
            paradev.connect("127.0.0.1:7478")
        # not read for a Unix socket, nor when told to ignore it
        paradev.connect("unix:/nowhere.sock").close()
        connect(7478).close()
    finally:
        del os.environ["PARADEV_TLS_CA"]
    notpem = os.path.join(tmp, "notpem")
    with open(notpem, "w") as f:
        f.write("hello\n")
    with pytest.raises(paradev.InvalidArgument, match="holds no PEM block"):
        connect(7478, tls_ca=notpem)
    with pytest.raises(paradev.InvalidArgument, match="printable ASCII"):
        connect(7478, token="two words")
    with pytest.raises(paradev.InvalidArgument, match="TLS is for TCP"):
        paradev.connect("tls://unix:/x.sock")
    with pytest.raises(paradev.InvalidArgument, match="TLS is for TCP"):
        paradev.connect("unix:/x.sock", tls=True)


# --- rotation -----------------------------------------------------------------

def _install(certs, live, name):
    """Replaces the daemon's files atomically (rename), as a deploy tool
    would: the key first is fine, the pair is checked when both changed."""
    for ext in (".key", ".crt"):
        shutil.copy(certs.p(name + ext), live + ext + ".new")
        os.rename(live + ext + ".new", live + ext)


def test_rotation_while_connected(certs, tmp):
    live = os.path.join(tmp, "live")
    shutil.copy(certs.p("server.crt"), live + ".crt")
    shutil.copy(certs.p("server.key"), live + ".key")
    conf = "[tls]\ncert_file = %s.crt\nkey_file = %s.key\n" % (live, live)
    d = Daemon(tmp, conf)
    try:
        ca = certs.p("ca.crt")
        assert served_serial(d.port, ca) == serial_of(certs.p("server.crt"))
        old = connect(d.port, tls_ca=ca)
        sess = old.session("before")
        x = np.array([1.5, -2.0, 3.25], dtype=np.float64)
        t = sess.upload(x, paradev.mirrored())
        # Same CA, new certificate: new connections get it.
        _install(certs, live, "server2")
        assert served_serial(d.port, ca) == serial_of(certs.p("server2.crt"))
        d.wait_log(r"TLS reload \(a file changed\): new connections get "
                   r"subject /CN=server2")
        # A certificate of another CA: a new client that trusts only the
        # first CA is refused, the old connection goes on (it would fail
        # too if it had to handshake again).
        _install(certs, live, "other")
        with connect(d.port, tls_ca=ca) as c:
            assert "unknown CA" in unavailable(c)
        with connect(d.port, tls_ca=certs.p("ca2.crt")) as c:
            assert c.info().tls
        np.testing.assert_array_equal((t + t).numpy(paradev.mirrored()),
                                      x + x)
        assert old.info().tls
        sess.close()
        old.close()
    finally:
        assert d.stop() == 0, d.log()


def test_failed_reload_keeps_old_certificate(certs, tmp):
    live = os.path.join(tmp, "live")
    shutil.copy(certs.p("server.crt"), live + ".crt")
    shutil.copy(certs.p("server.key"), live + ".key")
    conf = "[tls]\ncert_file = %s.crt\nkey_file = %s.key\n" % (live, live)
    d = Daemon(tmp, conf)
    try:
        ca = certs.p("ca.crt")
        first = serial_of(certs.p("server.crt"))
        # A key that is not the certificate's.
        shutil.copy(certs.p("server2.key"), live + ".key.new")
        os.rename(live + ".key.new", live + ".key")
        assert served_serial(d.port, ca) == first
        d.wait_log(r"TLS reload \(a file changed\) failed: key_file \S+ is "
                   r"not the private key of the certificate")
        with connect(d.port, tls_ca=ca) as c:
            square_roundtrip(c)
        # An unreadable certificate, and SIGHUP: still the first one.
        os.chmod(live + ".crt", 0)
        if os.access(live + ".crt", os.R_OK):  # root reads anything
            os.remove(live + ".crt")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log(r"TLS reload \(SIGHUP\) failed: cert_file \S+ cannot be "
                   r"read")
        assert served_serial(d.port, ca) == first
        # Put a good pair back: SIGHUP (or the next connection) takes it.
        if os.path.exists(live + ".crt"):
            os.chmod(live + ".crt", 0o600)
        _install(certs, live, "server2")
        d.proc.send_signal(signal.SIGHUP)
        d.wait_log(r"TLS reload \(SIGHUP\): new connections get subject "
                   r"/CN=server2")
        assert served_serial(d.port, ca) == serial_of(certs.p("server2.crt"))
    finally:
        assert d.stop() == 0, d.log()


def test_bad_files_refuse_to_start(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, cert="server", key="server2"),
               wait=False)
    rc = d.proc.wait(30)
    d.ready.wait(10)  # set at the end of stderr: the log is read whole
    assert rc != 0
    assert "is not the private key of the certificate" in d.log(), d.log()
    r = subprocess.run([PARADEVD, "--config", d.conf, "--check-config"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "a start refuses it" in r.stderr, r.stderr
    # An expired certificate (notAfter = notBefore = now, then a second).
    _ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey",
         "ca.key", "-CAcreateserial", "-out", os.path.join(tmp, "old.crt"),
         "-days", "0", "-extfile", "server.ext", cwd=certs.dir)
    time.sleep(1.1)
    conf = os.path.join(tmp, "old.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nlisten = 127.0.0.1:0\nadmin_socket =\n[tls]\n"
                "cert_file = %s\nkey_file = %s\n" % (
                    os.path.join(tmp, "old.crt"), certs.p("server.key")))
    r = subprocess.run([PARADEVD, "--config", conf, "--check-config"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "has expired" in r.stderr, r.stderr
    # Missing and empty files, a section without its key.
    for body, why in [
            ("cert_file = /nonexistent.crt\nkey_file = %s\n" %
             certs.p("server.key"), "cert_file /nonexistent.crt cannot be "
             "read: No such file or directory"),
            ("cert_file = %s\nkey_file = /dev/null\n" % certs.p("server.crt"),
             "key_file /dev/null is a device; expected a regular file"),
            ("cert_file = %s\n" % certs.p("server.crt"),
             "cert_file is set without key_file"),
            ("client_ca_file = %s\n" % certs.p("ca.crt"),
             "client_ca_file needs TLS"),
            ("cert_file = relative.crt\n", "expected the absolute path")]:
        with open(conf, "w") as f:
            f.write("[daemon]\nlisten = 127.0.0.1:0\nadmin_socket =\n"
                    "[tls]\n" + body)
        r = subprocess.run([PARADEVD, "--config", conf, "--check-config"],
                           capture_output=True, text=True)
        assert r.returncode == 2 and why in r.stderr, (why, r.stderr)


# --- plaintext off loopback -------------------------------------------------

def test_non_loopback_without_tls_refuses_to_start(tmp):
    d = Daemon(tmp, "", listen="0.0.0.0:0", wait=False)
    rc = d.proc.wait(30)
    d.ready.wait(10)  # set at the end of stderr: the log is read whole
    log = d.log()
    assert rc == 2, log
    assert "listen 0.0.0.0:0 is not a loopback address" in log, log
    assert "[tls] cert_file and key_file" in log, log
    assert "allow_insecure_tcp = true" in log, log
    r = subprocess.run([PARADEVD, "--config", d.conf, "--check-config"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "not a loopback address" in r.stderr


def test_allow_insecure_tcp_starts_and_warns(tmp):
    d = Daemon(tmp, "[tls]\nallow_insecure_tcp = true\n",
               listen="0.0.0.0:0")
    try:
        assert "insecure TCP: 0.0.0.0:0 serves plaintext" in d.log(), d.log()
        with connect(d.port) as c:
            info = c.info()
            assert info.insecure_tcp and not info.tls
            assert len(info.warnings) == 1
            assert info.warnings[0].startswith("insecure TCP: 0.0.0.0:0")
        r = subprocess.run([CLI, "--target", "127.0.0.1:%d" % d.port, "info"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "warning      insecure TCP" in r.stdout, r.stdout
        r = subprocess.run([PARADEVD, "--config", d.conf, "--check-config"],
                           capture_output=True, text=True)
        assert r.returncode == 0 and "insecure TCP" in r.stderr, r.stderr
    finally:
        assert d.stop() == 0, d.log()


def test_loopback_needs_no_tls(tmp):
    conf = os.path.join(tmp, "loop.conf")
    with open(conf, "w") as f:
        f.write("[daemon]\nlisten = 127.0.0.1:7478, 127.9.8.7:7478, "
                "[::1]:7478, localhost:7478, [::ffff:127.0.0.1]:7478, "
                "unix:/tmp/x.sock\nadmin_socket =\n")
    r = subprocess.run([PARADEVD, "--config", conf, "--check-config"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "insecure" not in r.stderr, r.stderr
    for addr in ("10.1.2.3:7478", "[::]:7478", "example.com:7478"):
        with open(conf, "w") as f:
            f.write("[daemon]\nlisten = %s\nadmin_socket =\n" % addr)
        r = subprocess.run([PARADEVD, "--config", conf, "--check-config"],
                           capture_output=True, text=True)
        assert r.returncode == 2, r.stderr
        assert "listen %s is not a loopback address" % addr in r.stderr
    d = Daemon(tmp, "")
    try:
        with connect(d.port) as c:
            info = c.info()
            assert not info.insecure_tcp and info.warnings == ()
    finally:
        assert d.stop() == 0, d.log()


# --- the command --------------------------------------------------------------

def test_cli_over_tls(certs, tmp):
    d = Daemon(tmp, tls_conf(certs, ca="ca", require=True))
    try:
        t = "127.0.0.1:%d" % d.port
        r = subprocess.run([CLI, "--target", t, "--tls-ca", certs.p("ca.crt"),
                            "--tls-cert", certs.p("client.crt"),
                            "--tls-key", certs.p("client.key"), "info"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "transport    TLS (the daemon requires client certificates)" \
            in r.stdout, r.stdout
        env = dict(os.environ, PARADEV_TLS_CA=certs.p("ca.crt"),
                   PARADEV_TLS_CERT=certs.p("client.crt"),
                   PARADEV_TLS_KEY=certs.p("client.key"))
        r = subprocess.run([CLI, "--target", t, "ping", "--count", "3"],
                           capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        r = subprocess.run([CLI, "--target", t, "--tls-ca", certs.p("ca.crt"),
                            "info"], capture_output=True, text=True)
        assert r.returncode == 1
        assert "requires a client certificate" in r.stderr, r.stderr
        assert "TLS settings" in r.stderr, r.stderr
        r = subprocess.run([CLI, "--target", t, "--tls-cert",
                            certs.p("client.crt"), "info"],
                           capture_output=True, text=True)
        assert r.returncode == 2 and "without a key" in r.stderr, r.stderr
    finally:
        assert d.stop() == 0, d.log()


# --- the token ------------------------------------------------------------------

def _metadata_server(creds=None):
    """A grpcio server that records each call's metadata and answers
    UNIMPLEMENTED: it stands in for the daemon's token check (ident's)."""
    grpc = pytest.importorskip("grpc")
    from concurrent import futures
    seen = []

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            seen.append(dict(details.invocation_metadata))
            return None

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         handlers=[Handler()])
    port = (server.add_secure_port("127.0.0.1:0", creds) if creds else
            server.add_insecure_port("127.0.0.1:0"))
    server.start()
    return server, port, seen


def test_token_sent_on_every_call(certs, tmp):
    tok = os.path.join(tmp, "token")
    with open(tok, "w") as f:
        f.write("  s3cr3t-Token_value  \nsecond line ignored\n")
    server, port, seen = _metadata_server()
    try:
        with connect(port, token="abc.DEF-123") as c:
            with pytest.raises(paradev.Unimplemented):
                c.info()
            with pytest.raises(paradev.Unimplemented):
                c.echo(b"x")
        assert [m.get("authorization") for m in seen] == [
            "Bearer abc.DEF-123"] * 2
        seen.clear()
        with connect(port, token_file=tok) as c:
            with pytest.raises(paradev.Unimplemented):
                c.info()
        assert seen[-1].get("authorization") == "Bearer s3cr3t-Token_value"
        seen.clear()
        os.environ["PARADEV_TOKEN_FILE"] = tok
        try:
            with paradev.connect("127.0.0.1:%d" % port, timeout=10) as c:
                with pytest.raises(paradev.Unimplemented):
                    c.info()
        finally:
            del os.environ["PARADEV_TOKEN_FILE"]
        assert seen[-1].get("authorization") == "Bearer s3cr3t-Token_value"
        seen.clear()
        with connect(port) as c:  # none given: none sent
            with pytest.raises(paradev.Unimplemented):
                c.info()
        assert "authorization" not in seen[-1]
    finally:
        server.stop(0)
    # over TLS too
    grpc = pytest.importorskip("grpc")
    key = open(certs.p("server.key"), "rb").read()
    crt = open(certs.p("server.crt"), "rb").read()
    server, port, seen = _metadata_server(
        grpc.ssl_server_credentials([(key, crt)]))
    try:
        with connect(port, tls_ca=certs.p("ca.crt"), token="over-tls") as c:
            assert c.tls
            with pytest.raises(paradev.Unimplemented):
                c.info()
        assert seen[-1].get("authorization") == "Bearer over-tls"
        r = subprocess.run([CLI, "--target", "127.0.0.1:%d" % port,
                            "--tls-ca", certs.p("ca.crt"), "--token-file",
                            tok, "info"], capture_output=True, text=True)
        assert r.returncode == 1 and "UNIMPLEMENTED" in r.stderr, r.stderr
        assert seen[-1].get("authorization") == "Bearer s3cr3t-Token_value"
    finally:
        server.stop(0)
