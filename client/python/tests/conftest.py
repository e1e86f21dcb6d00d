"""Fixtures of the paradev package's tests: a real paradevd on a temporary
Unix socket (and 127.0.0.1:0), with a storage root (daemon.storage) for
checkpoints, started once per test run; a client; a fresh
session per test.

Environment (ctest sets both; client/python/CMakeLists.txt):
  PARADEVD          the daemon to start (default: build/server/paradevd)
  PARADEV_LIBRARY   the libparadev the package loads (default: its search)
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.dirname(HERE))

import paradev  # noqa: E402

NDEV = 3
MEM_LIMIT = 256 << 20  # per device


def paradevd_path():
    p = os.environ.get("PARADEVD") or os.path.join(ROOT, "build", "server",
                                                   "paradevd")
    if not os.path.exists(p):
        pytest.exit("paradevd not found at %s (set PARADEVD)" % p, 2)
    return p


class Daemon:
    """A paradevd child process on a temporary Unix socket and a loopback
    port; `unix` and `tcp` are its targets."""

    def __init__(self, devices=NDEV, *extra):
        self.dir = tempfile.mkdtemp(prefix="paradev-py-")
        self.sock = os.path.join(self.dir, "pd.sock")
        # beneath it the daemon loads and saves checkpoints (test_checkpoint)
        self.storage = os.path.join(self.dir, "storage")
        os.mkdir(self.storage)
        args = [paradevd_path(), "--listen", "unix:" + self.sock,
                "--listen", "127.0.0.1:0", "--devices", str(devices),
                "--memory-limit", str(MEM_LIMIT), "--admin-socket", "",
                "--grace-ms", "2000",
                "--storage-root", self.storage,
                # Sessions here fill small devices on purpose; the daemon's
                # default quota (half the mesh) is tested in
                # tests/integration/test_memory.py.
                "--default-memory-quota", "unlimited", *extra]
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True,
                                     errors="replace")
        self.lines = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if not self.ready.wait(30):
            self.proc.kill()
            raise RuntimeError("paradevd not ready in 30 s; log:\n" +
                               "".join(self.lines))
        ports = [m.group(1) for line in self.lines for m in
                 [re.search(r"listening on 127\.0\.0\.1:(\d+)", line)] if m]
        self.unix = "unix:" + self.sock
        self.tcp = "127.0.0.1:" + ports[0] if ports else None

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            if "ready:" in line:
                self.ready.set()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc


@pytest.fixture(scope="session")
def daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, "paradevd exited %s; log:\n%s" % (rc, "".join(d.lines))


@pytest.fixture(scope="session")
def client(daemon):
    c = paradev.connect(daemon.unix, timeout=30)
    yield c
    c.close()


@pytest.fixture
def sess(client):
    with client.session("pytest") as s:
        yield s
