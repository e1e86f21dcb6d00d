"""Client, session, every layout both ways and every dtype, checked against
NumPy (the expected values are computed here with NumPy, never read back)."""
import os

import numpy as np
import pytest

import paradev
from conftest import NDEV


def test_library_and_info(client, daemon):
    assert os.path.exists(paradev.LIBRARY_PATH)
    assert paradev.library_version == "0.1.0"
    info = client.info()
    assert info.num_devices == NDEV
    assert info.backend == "cpu"
    assert info.version == "0.1.0"
    assert info.limits["max_rank"] == 8
    assert client.health() == "SERVING"
    assert client.health("paradev.v1.ParallelDevice") == "SERVING"
    assert client.target == daemon.unix


def test_default_target(monkeypatch, tmp_path):
    monkeypatch.setenv("PARADEV_TARGET", "unix:/nowhere.sock")
    assert paradev.default_target() == "unix:/nowhere.sock"
    monkeypatch.delenv("PARADEV_TARGET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    t = paradev.default_target()
    assert t.startswith("unix:/tmp/paradevd-") or t == "127.0.0.1:7478"


def test_session_attributes(client):
    with client.session("attrs", job_id="job-7", lease_s=30,
                        memory_quota=1 << 28) as s:
        assert s.num_devices == NDEV
        assert s.lease_s == 30
        assert s.memory_quota == 1 << 28
        assert s.incarnation == client.info().incarnation
        s.keep_alive()
    assert s.closed
    with pytest.raises(ValueError, match="closed"):
        s.upload([1.0], paradev.mirrored())


def test_closed_session_refuses_everything(client):
    s = client.session("closing")
    x = s.upload(np.ones(3), paradev.mirrored())
    tape = s.tape(watch=[x]).__enter__()
    y = x * x
    s.close()
    for call in (lambda: x + x, lambda: x.numpy(paradev.mirrored()),
                 s.sync, lambda: tape.gradient(y, x), lambda: tape.watch(x),
                 lambda: s.describe([x]), lambda: s.tape().__enter__()):
        with pytest.raises(ValueError, match="closed"):
            call()
    with s.pipeline():
        with pytest.raises(ValueError, match="closed"):
            x * x
    s.close()  # idempotent


SHAPES = [(), (5,), (7, 3), (2, 3, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_mirrored_both_ways(sess, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    t = sess.upload(x, paradev.mirrored())
    assert t.dtype == np.float32 and t.shape == shape and t.is_mirrored
    np.testing.assert_array_equal(t.numpy(paradev.mirrored()), x)
    for k in range(NDEV):
        np.testing.assert_array_equal(t.numpy(paradev.component(k)), x)
    comps = t.numpy(paradev.per_component())
    assert len(comps) == NDEV
    for c in comps:
        np.testing.assert_array_equal(c, x)
    np.testing.assert_array_equal(np.asarray(t), x)
    if shape:
        np.testing.assert_array_equal(t.numpy(paradev.concat(0)),
                                      np.concatenate([x] * NDEV, 0))


@pytest.mark.parametrize("rows,axis", [(6, 0), (7, 0), (2, 0), (5, 1)])
def test_sharded_both_ways(sess, rows, axis):
    shape = (rows, 4) if axis == 0 else (3, rows)
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    t = sess.upload(x, paradev.sharded(axis))
    parts = np.array_split(x, NDEV, axis=axis)
    want_shape = list(shape)
    sizes = {p.shape[axis] for p in parts}
    want_shape[axis] = parts[0].shape[axis] if len(sizes) == 1 else -1
    assert t.shape == tuple(want_shape)
    assert not t.is_mirrored
    comps = t.numpy(paradev.per_component())
    for c, p in zip(comps, parts):
        np.testing.assert_array_equal(c, p)
    for k in range(NDEV):
        np.testing.assert_array_equal(t.numpy(paradev.component(k)), parts[k])
    np.testing.assert_array_equal(t.numpy(paradev.concat(axis)), x)
    with pytest.raises(ValueError, match="concat"):
        np.asarray(t)


def test_per_component_both_ways(sess):
    parts = [np.full((k + 1, 2), k, np.int32) for k in range(NDEV)]
    t = sess.upload(parts, paradev.per_component())
    assert t.shape == (-1, 2)
    assert t.dtype == np.int32
    got = t.numpy(paradev.per_component())
    for g, p in zip(got, parts):
        np.testing.assert_array_equal(g, p)
    np.testing.assert_array_equal(t.numpy(paradev.concat(0)),
                                  np.concatenate(parts))
    np.testing.assert_array_equal(t.numpy(paradev.component(2)), parts[2])
    d = t.describe()
    assert d["component_shapes"] == [(1, 2), (2, 2), (3, 2)]
    assert d["bytes"] == sum(p.nbytes for p in parts)
    with pytest.raises(ValueError, match="per_component"):
        np.asarray(t)
    with pytest.raises(ValueError, match="one per device"):
        sess.upload(parts[:2], paradev.per_component())


def test_layout_is_required(sess):
    t = sess.upload(np.ones(3, np.float32), paradev.mirrored())
    with pytest.raises(TypeError, match="layout"):
        t.numpy(None)
    with pytest.raises(TypeError, match="layout"):
        sess.upload(np.ones(3), "mirrored")
    with pytest.raises(ValueError, match="for downloads"):
        sess.upload(np.ones(3), paradev.component(0))
    with pytest.raises(IndexError, match="components"):
        t.numpy(paradev.component(NDEV))


DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8", "bool"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(sess, dtype):
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 5)) * 50).astype(dtype)
    for layout, down in [(paradev.mirrored(), paradev.mirrored()),
                         (paradev.sharded(0), paradev.concat(0))]:
        t = sess.upload(x, layout)
        assert t.dtype == np.dtype(dtype)
        got = t.numpy(down)
        assert got.dtype == np.dtype(dtype)
        assert got.tobytes() == x.tobytes()


def test_bfloat16(sess):
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    f = sess.upload(np.array([1.5, -2.25, 3.0], np.float32),
                    paradev.mirrored())
    b = sess.op("Cast", f, DstT="bfloat16")
    assert b.dtype == paradev.bfloat16
    if ml_dtypes is None:
        with pytest.raises(TypeError, match="ml_dtypes"):
            b.numpy(paradev.mirrored())
        back = sess.op("Cast", b, DstT=np.float32)
        np.testing.assert_array_equal(np.asarray(back), [1.5, -2.25, 3.0])
    else:
        x = np.array([1.5, -2.25, 3.0], ml_dtypes.bfloat16)
        np.testing.assert_array_equal(b.numpy(paradev.mirrored()), x)
        t = sess.upload(x, paradev.sharded(0))
        assert t.numpy(paradev.concat(0)).tobytes() == x.tobytes()


def test_unsupported_dtype(sess):
    with pytest.raises(TypeError, match="expected one of"):
        sess.upload(np.zeros(3, np.int16), paradev.mirrored())
    with pytest.raises(TypeError, match="expected one of"):
        sess.upload(np.zeros(3, np.complex64), paradev.mirrored())


def test_non_contiguous_and_big_endian(sess):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    t = sess.upload(x, paradev.mirrored())
    np.testing.assert_array_equal(np.asarray(t), x)
    be = np.arange(5, dtype=">i4")
    t = sess.upload(be, paradev.mirrored())
    np.testing.assert_array_equal(np.asarray(t), np.arange(5))


def test_array_protocol(sess):
    t = sess.upload(np.arange(4, dtype=np.float32), paradev.mirrored())
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64),
                                  np.arange(4.0))
    with pytest.raises(ValueError, match="copy"):
        t.__array__(copy=False)
    assert float(sess.upload(np.float32(2.5), paradev.mirrored())) == 2.5
    assert len(t) == 4


def test_wait_and_sync(sess):
    t = sess.upload(np.ones((4, 4), np.float32), paradev.mirrored())
    u = t @ t
    assert u.wait() is u
    sess.sync()
    d = u.describe()
    assert d["ready"] and d["error"] is None
    assert d["shape"] == (4, 4)


def test_download_into(sess):
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    t = sess.upload(x, paradev.sharded(0))
    out = np.zeros((6, 2), np.float32)
    got = t.numpy(paradev.concat(0), out=out)
    assert got is out
    np.testing.assert_array_equal(out, x)
    with pytest.raises(ValueError, match="shape"):
        t.numpy(paradev.concat(0), out=np.zeros((5, 2), np.float32))
    with pytest.raises(ValueError, match="float32"):
        t.numpy(paradev.concat(0), out=np.zeros((6, 2), np.float64))
    with pytest.raises(ValueError, match="list"):
        t.numpy(paradev.per_component(), out=out)


def test_session_op_timeout(client):
    # A session's op_timeout_ms (issue #15) reaches the daemon and bounds
    # only queued ops: these are dispatched at once, well within a minute,
    # and compute as NumPy does. Expiry itself is integration.deadlines'.
    x = np.arange(6, dtype=np.float32)
    with client.session("deadline", op_timeout_ms=60000) as s:
        t = s.upload(x, paradev.mirrored())
        np.testing.assert_array_equal((t * t + t).numpy(paradev.mirrored()),
                                      x * x + x)
    with pytest.raises(paradev.InvalidArgument,
                       match=r"op_timeout_ms=-1 is out of range: expected "
                             r"milliseconds, 0 \(none\) to 2\*\*32-1"):
        client.session("bad", op_timeout_ms=-1)
