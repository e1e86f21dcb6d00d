#!/usr/bin/python3
"""The client tools on a mesh across machines (issue #16; trial findings
A1, A2, A5, B3, B4): libparadev through the Python package, and the
`paradev` CLI, against real daemons on loopback (CPU backend, 2 devices
each, the coordinator's mesh port a free loopback port).

 - half-formed: a coordinator of a mesh of 2 whose rank 1 never started.
                ServerInfo.mesh: world size 2, rank 0, 2 devices per rank,
                not formed, not degraded, missing ranks (1,), epoch 0, the
                coordinator's address, a reason; the coordinator's view of
                both ranks (0 attached, 1 not). `paradev info` prints the
                mesh: block with the same; `paradev health` prints
                NOT_SERVING and the reason, exit 1. A session is refused
                with the daemon's own UNAVAILABLE ("the mesh is not whole
                ..."): no "cannot reach", no "check that paradevd runs".
 - transport:   a dead Unix socket: UNAVAILABLE "cannot reach unix:..."
                with the connectivity hint; a Unix socket that accepts and
                closes at once: no TLS hint (TLS never applies there).
 - formed:      rank 1 started: mesh formed, epoch >= 1, nothing missing,
                reason "", both ranks attached with their incarnations;
                rank 1's own info says rank 1 (no per-rank view); health
                SERVING with nothing after it; info's block says formed.
 - rank lost:   rank 1 SIGKILLed with two sessions open: the coordinator
                degraded with missing ranks (1,) and a reason naming rank 1;
                health NOT_SERVING with it; the ended session's next call
                raises the daemon's UNAVAILABLE (no "cannot reach"); a
                `with` block that caught that error ends without raising
                or warning; an explicit close() of the other ended session
                returns None; a `with` block whose own error propagates
                raises only that error.
 - off a mesh:  a daemon of its own: ServerInfo.mesh is None, no mesh:
                block, health SERVING.

Every wait is bounded; every daemon started here is stopped (at exit too).
Environment (ctest): PARADEVD, PARADEV_CLI, PARADEV_LIBRARY.
Exit 0: all passed; 1: a check failed; 77: skipped (numpy or cffi missing).
"""
import atexit
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(ROOT, "build")
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
PARADEVD = os.environ.get("PARADEVD", os.path.join(BUILD, "server", "paradevd"))
CLI = os.environ.get("PARADEV_CLI", os.path.join(BUILD, "client", "paradev"))
try:
    import numpy as np
    import paradev
except ImportError as e:
    print("SKIP: %s (python3-numpy, python3-cffi, PARADEV_LIBRARY)" % e)
    sys.exit(77)

TMP = tempfile.mkdtemp(prefix="pd-mesh-cli-")
WAIT_S = 60  # bound of every wait; never a timing assertion
DAEMONS = []
CONF = os.path.join(TMP, "mesh.conf")
with open(CONF, "w") as f:
    f.write("[mesh]\nlease_s = 4\njoin_timeout_s = 120\n")


def _cleanup():
    for d in DAEMONS:
        d.kill()
    shutil.rmtree(TMP, ignore_errors=True)


atexit.register(_cleanup)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class Daemon:
    def __init__(self, tag, rank=None, world=None, port=None):
        self.tag = tag
        self.sock = os.path.join(TMP, tag + ".sock")
        self.target = "unix:" + self.sock
        self.log_path = os.path.join(TMP, tag + ".log")
        args = [PARADEVD, "--config", CONF, "--devices", "2",
                "--listen", self.target, "--admin-socket", ""]
        if world:
            args += ["--world-size", str(world), "--rank", str(rank),
                     "--coordinator", "127.0.0.1:%d" % port]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SLURM_", "PARADEV_MESH_"))}
        self.logf = open(self.log_path, "w")
        self.p = subprocess.Popen(args, stdout=self.logf,
                                  stderr=subprocess.STDOUT, env=env,
                                  preexec_fn=_die_with_parent)
        DAEMONS.append(self)

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    def kill(self, sig=signal.SIGTERM):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        if not self.logf.closed:
            self.logf.close()

    def cli(self, *args):
        r = subprocess.run([CLI, "--target", self.target, "--timeout", "10s"]
                           + list(args), capture_output=True, text=True,
                           timeout=30)
        return r.returncode, r.stdout, r.stderr

    def info(self):
        """ServerInfo, None while the daemon does not answer."""
        try:
            with paradev.connect(self.target, timeout=5) as c:
                return c.info()
        except paradev.Error:
            return None


def wait_for(what, fn, d=None):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out after %d s waiting for %s%s"
                         % (WAIT_S, what, "\n" + d.log() if d else ""))


def block(out, name):
    """The lines of `paradev info`'s block `name:` (up to the next)."""
    lines = out.splitlines()
    i = lines.index(name + ":")
    rest = []
    for ln in lines[i + 1:]:
        if not ln.startswith("  "):
            break
        rest.append(ln)
    return rest


def field(lines, key):
    for ln in lines:
        if ln.startswith("  " + key + " "):
            return ln[len(key) + 2:].strip()
    raise AssertionError("no %r in %r" % (key, lines))


def no_transport_framing(msg, hint):
    assert "cannot reach" not in msg, msg
    assert "check that paradevd runs" not in (hint or ""), hint


def check_half_formed(c0, port):
    i = wait_for("the coordinator's info", c0.info, c0)
    m = i.mesh
    assert isinstance(m, paradev.MeshInfo), m
    assert (m.world_size, m.rank, m.devices_per_rank) == (2, 0, 2), m
    assert not m.formed and not m.degraded and not m.whole, m
    assert m.missing_ranks == (1,), m
    assert m.epoch == 0, m
    assert m.coordinator == "127.0.0.1:%d" % port, m
    assert m.reason and "not formed" in m.reason, m
    assert [(r.rank, r.attached) for r in m.ranks] == [(0, True), (1, False)], m
    assert m.ranks[0].incarnation == i.incarnation, (m.ranks[0], i.incarnation)
    assert m.ranks[1].incarnation == 0, m.ranks[1]

    rc, out, err = c0.cli("info")
    assert rc == 0, (rc, out, err)
    b = block(out, "mesh")
    assert field(b, "world size") == "2 (2 devices per rank)", b
    assert field(b, "this rank").startswith("0 (the coordinator"), b
    assert field(b, "coordinator") == "127.0.0.1:%d" % port, b
    assert field(b, "epoch") == "0", b
    assert field(b, "state").startswith("not formed"), b
    assert field(b, "missing") == "rank 1", b
    assert field(b, "reason") == m.reason, (b, m.reason)
    assert re.search(r"^\s+1\s+missing\s+-\s", "\n".join(b), re.M), b

    rc, out, err = c0.cli("health")
    assert rc == 1, (rc, out, err)
    assert out.strip() == "NOT_SERVING: the mesh is not whole (%s)" % m.reason, out

    with paradev.connect(c0.target, timeout=10) as c:
        try:
            c.session("early")
            raise AssertionError("a session on a half-formed mesh was opened")
        except paradev.Unavailable as e:
            assert e.message.startswith("the mesh is not whole ("), e.message
            assert m.reason in e.message, (e.message, m.reason)
            no_transport_framing(e.message, e.hint)
            assert "mesh across machines is not whole" in e.hint, e.hint
            assert "check that paradevd runs" not in str(e), str(e)
    print("ok half-formed: %s | health: NOT_SERVING: ...(%s)"
          % (field(b, "state"), m.reason), flush=True)


def check_transport():
    dead = "unix:" + os.path.join(TMP, "nobody.sock")
    with paradev.connect(dead, timeout=5) as c:
        try:
            c.info()
            raise AssertionError("info on a dead socket answered")
        except paradev.Unavailable as e:
            assert e.message.startswith("cannot reach %s: " % dead), e.message
            assert "check that paradevd runs" in e.hint, e.hint
    # A socket that accepts and closes every connection at once.
    path = os.path.join(TMP, "closer.sock")
    ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    ls.bind(path)
    ls.listen(16)
    ls.settimeout(0.2)
    stop = threading.Event()

    def closer():
        while not stop.is_set():
            try:
                a, _ = ls.accept()
                a.close()
            except socket.timeout:
                pass
            except OSError:
                return

    t = threading.Thread(target=closer, daemon=True)
    t.start()
    try:
        with paradev.connect("unix:" + path, timeout=5) as c:
            try:
                c.info()
                raise AssertionError("info on a closing socket answered")
            except (paradev.Unavailable, paradev.DeadlineExceeded) as e:
                text = str(e)
                assert "tls://" not in text and "TLS" not in text, text
                if isinstance(e, paradev.Unavailable):
                    assert e.message.startswith("cannot reach unix:"), text
                print("ok transport: dead socket: %s | closing socket: %s"
                      % ("cannot reach ...", text), flush=True)
    finally:
        stop.set()
        ls.close()
        t.join(5)


def check_formed(c0, r1):
    def whole():
        i = c0.info()
        return i if i and i.mesh and i.mesh.formed else None
    i = wait_for("the mesh formed", whole, c0)
    m = i.mesh
    assert m.formed and not m.degraded and m.whole, m
    assert m.missing_ranks == () and m.reason == "", m
    assert m.epoch >= 1, m
    assert [(r.rank, r.attached) for r in m.ranks] == [(0, True), (1, True)], m
    i1 = wait_for("rank 1's info", r1.info, r1)
    m1 = i1.mesh
    assert (m1.world_size, m1.rank, m1.devices_per_rank) == (2, 1, 2), m1
    assert m1.ranks == () and m1.coordinator == m.coordinator, m1
    assert m.ranks[1].incarnation == i1.incarnation != 0, (m.ranks[1], i1)
    assert m.ranks[1].incarnation != m.ranks[0].incarnation, m.ranks
    assert i.num_devices == 4, i.devices

    rc, out, err = c0.cli("health")
    assert (rc, out.strip()) == (0, "SERVING"), (rc, out, err)
    rc, out, err = c0.cli("info")
    b = block(out, "mesh")
    assert field(b, "state").startswith("formed"), b
    assert field(b, "epoch") == str(m.epoch), b
    assert not any(ln.startswith("  missing ") or ln.startswith("  reason ")
                   for ln in b), b
    assert len(re.findall(r"^\s+[01]\s+attached\s+[0-9a-f]{16}\s", out, re.M)) \
        == 2, b
    rc, out, err = r1.cli("info")
    assert rc == 0, (rc, out, err)
    b1 = block(out, "mesh")
    assert field(b1, "this rank").startswith("1 (clients connect to the "
                                             "coordinator"), b1
    print("ok formed: epoch %d, rank 1 incarnation %016x"
          % (m.epoch, m.ranks[1].incarnation), flush=True)
    return m.epoch


def check_rank_lost(c0, r1, epoch):
    c = paradev.connect(c0.target, timeout=30)
    s1 = c.session("victim")
    s2 = c.session("other")
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    t = s1.upload(x, paradev.sharded(0))
    np.testing.assert_array_equal(t.numpy(paradev.concat(0)), x)
    r1.kill(signal.SIGKILL)

    def degraded():
        i = c0.info()
        return i if i and i.mesh and i.mesh.degraded else None
    i = wait_for("the coordinator degraded", degraded, c0)
    m = i.mesh
    assert m.missing_ranks == (1,) and not m.whole, m
    assert re.search(r"\brank 1\b", m.reason), m.reason
    assert m.epoch == epoch, (m.epoch, epoch)
    assert [(r.rank, r.attached) for r in m.ranks] == [(0, True), (1, False)], m
    rc, out, err = c0.cli("health")
    assert rc == 1, (rc, out, err)
    assert out.strip() == "NOT_SERVING: the mesh is not whole (%s)" % m.reason, out
    rc, out, err = c0.cli("info")
    b = block(out, "mesh")
    assert field(b, "state").startswith("degraded"), b
    assert field(b, "missing") == "rank 1", b

    # The ended session's call, caught inside the block: the block ends
    # quietly (no second error from close, no warning).
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with s1:
            try:
                s1.upload(x, paradev.sharded(0)).numpy(paradev.concat(0))
                raise AssertionError("a call of the ended session worked")
            except paradev.Unavailable as e:
                seen.append(e)
    e = seen[0]
    no_transport_framing(e.message, e.hint)
    assert "the mesh lost rank 1" in e.message, e.message
    assert s1.closed
    # An explicit close of a session the mesh ended: quiet.
    assert s2.close() is None and s2.closed
    # The block's own error, nothing else.
    s3 = None
    try:
        s3 = c.session("during")
        raise AssertionError("a session on a degraded mesh was opened")
    except paradev.Unavailable as e2:
        assert e2.message.startswith("the mesh is not whole ("), e2.message
        no_transport_framing(e2.message, e2.hint)
    assert s3 is None
    c.close()
    print("ok rank lost: %s | health NOT_SERVING: ...(%s)"
          % (e.message, m.reason), flush=True)


def is_degraded(d):
    i = d.info()
    return bool(i and i.mesh and i.mesh.degraded)


def check_with_block_error(c0, port):
    """A `with` block whose own error propagates while the mesh ends its
    session: only that error comes out."""
    r1 = Daemon("r1b", 1, 2, port)
    try:
        def whole():
            i = c0.info()
            return i if i and i.mesh and i.mesh.whole else None
        wait_for("the mesh re-formed", whole, c0)
        c = paradev.connect(c0.target, timeout=30)
        s = c.session("mine")
        s.upload(np.ones((4, 2), np.float32), paradev.sharded(0))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with s:
                    r1.kill(signal.SIGKILL)
                    wait_for("the coordinator degraded",
                             lambda: is_degraded(c0), c0)
                    raise KeyError("mine")
        except KeyError as e:
            assert e.args == ("mine",), e
        assert s.closed
        c.close()
        print("ok with-block: only the block's KeyError", flush=True)
    finally:
        r1.kill(signal.SIGKILL)


def check_off_mesh():
    d = Daemon("solo")
    try:
        i = wait_for("the daemon of its own", d.info, d)
        assert i.mesh is None, i.mesh
        rc, out, err = d.cli("info")
        assert rc == 0 and "\nmesh:" not in out, out
        rc, out, err = d.cli("health")
        assert (rc, out.strip()) == (0, "SERVING"), (rc, out, err)
        print("ok off a mesh: ServerInfo.mesh None", flush=True)
    finally:
        d.kill()


def main():
    failed = 0
    port = free_port()
    c0 = Daemon("r0", 0, 2, port)
    r1 = None
    steps = [
        ("half-formed", lambda: check_half_formed(c0, port)),
        ("transport", check_transport),
    ]
    for name, fn in steps:
        try:
            fn()
        except Exception:
            failed += 1
            print("FAIL %s:\n%s" % (name, traceback.format_exc()), flush=True)
    try:
        r1 = Daemon("r1", 1, 2, port)
        epoch = check_formed(c0, r1)
        check_rank_lost(c0, r1, epoch)
        check_with_block_error(c0, port)
    except Exception:
        failed += 1
        print("FAIL mesh:\n%s\n--- r0 log:\n%s" % (traceback.format_exc(),
                                                   c0.log()[-4000:]),
              flush=True)
    finally:
        if r1:
            r1.kill(signal.SIGKILL)
        c0.kill()
    try:
        check_off_mesh()
    except Exception:
        failed += 1
        print("FAIL off a mesh:\n%s" % traceback.format_exc(), flush=True)
    print("%s" % ("FAILED %d" % failed if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
