"""Errors raise the paradev.Error subclass of their status code with the
daemon's message, and the session works after each."""
import signal
import threading

import numpy as np
import pytest

import paradev
from paradev import _lib
from paradev._lib import ffi, lib
from conftest import Daemon


def still_works(sess):
    t = sess.upload(np.arange(3.0), paradev.mirrored())
    np.testing.assert_array_equal(np.asarray(t + t), [0.0, 2.0, 4.0])


def test_every_code_has_its_class():
    names = {1: "Cancelled", 2: "Unknown", 3: "InvalidArgument",
             4: "DeadlineExceeded", 5: "NotFound", 6: "AlreadyExists",
             7: "PermissionDenied", 8: "ResourceExhausted",
             9: "FailedPrecondition", 10: "Aborted", 11: "OutOfRange",
             12: "Unimplemented", 13: "Internal", 14: "Unavailable",
             15: "DataLoss", 16: "Unauthenticated"}
    for code, name in names.items():
        cls = getattr(paradev, name)
        assert issubclass(cls, paradev.Error)
        assert cls.code == code
        assert cls.code_name == ffi.string(lib.pd_code_name(code)).decode()
        st = _lib.status()
        lib.pd_status_set(st, code, b"planted message")
        with pytest.raises(cls, match="planted message"):
            _lib.check(code, st)


def test_invalid_argument(sess):
    a = sess.upload(np.ones((2, 3)), paradev.mirrored())
    with pytest.raises(paradev.InvalidArgument, match="inner dimensions"):
        a @ a
    with pytest.raises(paradev.InvalidArgument, match="NoSuchOp"):
        sess.op("NoSuchOp", a)
    with pytest.raises(paradev.InvalidArgument) as e:
        sess.op("Cast", a, DstT="float32", bogus_attr=1)
    assert "bogus_attr" in e.value.message
    still_works(sess)


def test_not_found(sess):
    ghost = paradev.Tensor(sess, 12345, np.dtype("float64"), (3,), True)
    sess._dead.add(ghost.id)  # never ours to delete
    with pytest.raises(paradev.NotFound, match="12345"):
        sess.op("Neg", ghost)
    with pytest.raises(paradev.NotFound):
        ghost.numpy(paradev.mirrored())
    still_works(sess)


def test_already_exists_and_failed_precondition(sess):
    x = sess.upload(np.array([2.0]), paradev.mirrored())
    st = _lib.status()
    tid = lib.pd_session_new_id(sess._s)
    _lib.check(lib.pd_tape_start(sess._s, tid, False, ffi.NULL, st), st)
    with pytest.raises(paradev.AlreadyExists):
        _lib.check(lib.pd_tape_start(sess._s, tid, False, ffi.NULL, st), st)
    ids = ffi.new("uint64_t[]", [x.id])
    _lib.check(lib.pd_tape_watch(sess._s, tid, ids, 1, ffi.NULL, st), st)
    y = x * x
    res = ffi.new("uint64_t[]", 1)
    _lib.check(lib.pd_tape_gradient(sess._s, tid, y.id, ids, 1, 0, res,
                                    ffi.NULL, ffi.NULL, st), st)
    res[0] = 0
    with pytest.raises(paradev.FailedPrecondition, match="one-shot|already"):
        _lib.check(lib.pd_tape_gradient(sess._s, tid, y.id, ids, 1, 0, res,
                                        ffi.NULL, ffi.NULL, st), st)
    _lib.check(lib.pd_tape_delete(sess._s, tid, ffi.NULL, st), st)
    still_works(sess)


def test_out_of_range(sess):
    x = sess.upload(np.arange(4.0), paradev.mirrored())
    st = _lib.status()
    small = ffi.new("char[]", 8)
    lay = ffi.new("pd_layout *")
    lay.kind = lib.PD_LAYOUT_MIRRORED
    with pytest.raises(paradev.OutOfRange, match="32"):
        _lib.check(lib.pd_download(sess._s, x.id, lay[0], small, 8, ffi.NULL,
                                   ffi.NULL, ffi.NULL, st), st)
    still_works(sess)


def test_resource_exhausted_quota(client):
    with client.session("quota", memory_quota=1 << 20) as s:
        with pytest.raises(paradev.ResourceExhausted, match="quota"):
            s.upload(np.zeros(1 << 18, np.float64), paradev.mirrored())
        still_works(s)


def test_error_stored_on_a_tensor(client):
    # Out of memory while running: the op's error is stored on its output
    # and raised by sync and download; the session goes on.
    with client.session("oom", memory_quota=8 << 20) as s:
        x = s.upload(np.ones((512, 512), np.float32), paradev.mirrored())
        with pytest.raises(paradev.ResourceExhausted):
            outs = [x @ x for _ in range(20)]
            s.sync()
        outs = None  # noqa: F841 -- frees the outputs
        still_works(s)


def test_deadline_exceeded(sess):
    x = sess.upload(np.ones((384, 384), np.float64), paradev.mirrored())
    with sess.pipeline():
        y = x
        for _ in range(200):
            y = y @ x * (1.0 / 384)
    with pytest.raises(paradev.DeadlineExceeded):
        sess.sync(timeout=0.001)
    with pytest.raises(paradev.DeadlineExceeded):
        y.numpy(paradev.mirrored(), timeout=0.001)
    sess.sync()
    np.testing.assert_allclose(np.asarray(y[0, :3]), [1.0, 1.0, 1.0])
    still_works(sess)


def test_unavailable_without_a_daemon(tmp_path):
    c = paradev.connect("unix:%s/none.sock" % tmp_path, timeout=5)
    with pytest.raises(paradev.Unavailable) as e:
        c.info()
    assert "cannot reach" in str(e.value)
    with pytest.raises(paradev.Unavailable):
        c.session()
    c.close()


def test_bad_target():
    with pytest.raises(paradev.InvalidArgument, match="target"):
        paradev.connect("localhost:99999")


def test_killed_daemon_gives_a_clear_error():
    d = Daemon(2)
    try:
        c = paradev.connect(d.unix, timeout=10)
        s = c.session("doomed")
        x = s.upload(np.ones(4), paradev.mirrored())
        np.testing.assert_array_equal(np.asarray(x + x), 2 * np.ones(4))
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait(20)
        for call in (lambda: x + x, lambda: x.numpy(paradev.mirrored()),
                     c.info, s.sync):
            with pytest.raises(paradev.Unavailable, match="cannot reach") as e:
                call()
            # a Unix socket: never a TLS hint (trial finding A5)
            assert "tls://" not in str(e.value), str(e.value)
            assert "check that paradevd runs" in e.value.hint, e.value.hint
        with pytest.raises(paradev.Unavailable, match="cannot reach"):
            with s.pipeline():
                x * x
        s.close(_quiet=True)
        c.close()
    finally:
        d.stop()


def test_daemon_killed_during_a_wait():
    # A sync waiting for long work on the devices ends with UNAVAILABLE when
    # the daemon dies under it, long before the call's 60 s deadline.
    d = Daemon(2)
    try:
        c = paradev.connect(d.unix, timeout=60)
        s = c.session("doomed-wait")
        x = s.upload(np.ones((384, 384)), paradev.mirrored())
        with s.pipeline():
            y = x
            for _ in range(2000):
                y = y @ x * (1.0 / 384)
        killer = threading.Timer(0.3, d.proc.send_signal, (signal.SIGKILL,))
        killer.start()
        with pytest.raises((paradev.Unavailable, paradev.Cancelled)):
            s.sync()
        killer.join()
        s.close(_quiet=True)
        c.close()
    finally:
        d.stop()


def test_session_priority_and_weight(client):
    """A session's band and weight travel to the daemon (CreateSession
    fields 180, 181): in range it serves, out of range is InvalidArgument
    naming the range."""
    with client.session("hp", priority=3, weight=5) as s:
        still_works(s)
    with pytest.raises(paradev.InvalidArgument, match="-8 to 8"):
        client.session("bad", priority=9)
    with pytest.raises(paradev.InvalidArgument, match="1 to 10000"):
        client.session("bad", weight=10001)
    # Past the C fields: the package's own InvalidArgument, not cffi's
    # OverflowError, naming the argument and the range.
    for kw, want in ((dict(priority=2 ** 40),
                      r"priority=1099511627776 is out of range: expected a "
                      r"band -8 to 8"),
                     (dict(weight=-1), r"weight=-1 is out of range: expected "
                      r"1 to 10000"),
                     (dict(weight=2 ** 32), r"weight=4294967296 is out"),
                     (dict(lease_s=-5), r"lease_s=-5 is out of range"),
                     (dict(op_timeout_ms=2 ** 32), r"op_timeout_ms=4294967296"),
                     (dict(memory_quota=2 ** 64), r"memory_quota=18446744073709551616")):
        with pytest.raises(paradev.InvalidArgument, match=want):
            client.session("bad", **kw)


def test_hint_follows_the_message():
    """pd_status_hint: an UNAUTHENTICATED about the session token, a job
    token or the caller's identity gets advice for that one (the daemon's
    messages: scheduler/sessions.c, server/jobs.c, server/auth.c)."""
    st = _lib.status()
    cases = [
        (16, b"malformed session token: 3 bytes, expected 32 (the ...)",
         "the session token is malformed; open a new session"),
        (16, b"job_token is unknown to this paradevd: revoked ...",
         "present the job's current token"),
        (16, b"this listener requires an identity ([auth] require_identity)",
         "identify with a bearer token (--token-file"),
        (16, b"the bearer token is not valid: unknown or revoked",
         "identify with a bearer token"),
        (16, b"this daemon takes no bearer tokens ([auth] tokens_file is "
             b"not set)", "this daemon takes no bearer token: drop"),
        (14, b"paradevd is draining for maintenance: it takes no new work",
         "paradevd takes no new work while it drains"),
        (14, b"connection refused", "check that paradevd runs"),
        (14, b"cannot reach unix:/x.sock: failed to connect to all "
             b"addresses", "check that paradevd runs"),
        # the daemon's own UNAVAILABLE: it was reached (trial finding A2)
        (14, b"the mesh is not whole (degraded: rank 1 missing); open a "
             b"session once every rank has attached again",
         "the daemon's mesh across machines is not whole"),
        (14, b"GET 'http://h/x.npy': Connection refused",
         "the daemon answered that it cannot do this now"),
        (5, b"session not found", "the session or handle does not exist"),
    ]
    for code, msg, want in cases:
        lib.pd_status_set(st, code, msg)
        hint = ffi.string(lib.pd_status_hint(st)).decode()
        assert hint.startswith(want), (msg, hint)
        assert hint == ffi.string(lib.pd_status_str(code)).decode() or \
            code in (14, 16), hint
        with pytest.raises(paradev.Error) as e:
            _lib.check(code, st)
        assert e.value.hint == hint
    lib.pd_status_set(st, 16, b"this listener requires an identity")
    with pytest.raises(paradev.Unauthenticated) as e:
        _lib.check(16, st)
    assert "(identify with a bearer token" in str(e.value), str(e.value)
    assert "session token" not in str(e.value)
