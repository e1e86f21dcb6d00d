"""Ops with a list output (Split, SplitV, Unpack) and Pack through the
daemon: the wrappers name as many output ids as the length attribute says
(num_split 12, more than the old limit of 8 outputs), return a list, and
every output downloads with NumPy's values; sharded inputs split each
component; wrong counts of output ids are refused at the wire; gradients
through the tape."""
import numpy as np
import pytest

import paradev
from paradev import errors
from paradev._lib import ffi, lib
from paradev import _lib
from conftest import NDEV

X = np.arange(48, dtype=np.float32).reshape(24, 2)


@pytest.mark.parametrize("pipelined", [False, True])
def test_split_twelve(sess, pipelined):
    x = sess.upload(X, paradev.mirrored())
    ctx = sess.pipeline() if pipelined else _Null()
    with ctx:
        outs = sess.ops.Split(x, axis=0, num_split=12)
        again = sess.op("Split", x, axis=-2, num_split=12)
    assert isinstance(outs, list) and len(outs) == 12
    want = np.split(X, 12, axis=0)
    for got, g2, w in zip(outs, again, want):
        assert got.shape == (2, 2)
        np.testing.assert_array_equal(got.numpy(paradev.mirrored()), w)
        np.testing.assert_array_equal(np.asarray(g2), w)


def test_splitv_unpack_pack(sess):
    x = sess.upload(X[:6], paradev.mirrored())  # (6, 2)
    parts = sess.ops.SplitV(x, size_splits=[1, -1, 2], axis=0)
    assert [p.shape for p in parts] == [(1, 2), (3, 2), (2, 2)]
    for got, w in zip(parts, np.split(X[:6], [1, 4], axis=0)):
        np.testing.assert_array_equal(np.asarray(got), w)
    rows = sess.ops.Unpack(x, num=6)
    assert len(rows) == 6 and rows[0].shape == (2,)
    for k in range(6):
        np.testing.assert_array_equal(np.asarray(rows[k]), X[k])
    cols = sess.ops.Unpack(x, num=2, axis=-1)
    np.testing.assert_array_equal(np.asarray(cols[1]), X[:6, 1])
    back = sess.ops.Pack(*rows, axis=1)
    np.testing.assert_array_equal(np.asarray(back), np.stack(X[:6], axis=1))
    same = sess.ops.Pack(rows)  # a list for the list input
    np.testing.assert_array_equal(np.asarray(same), X[:6])


def test_sharded_split(sess):
    full = np.arange(NDEV * 2 * 4, dtype=np.float64).reshape(NDEV * 2, 4)
    x = sess.upload(full, paradev.sharded(0))  # two rows per component
    top, bottom = sess.ops.Split(x, axis=0, num_split=2)
    comps = bottom.numpy(paradev.per_component())
    for k in range(NDEV):
        np.testing.assert_array_equal(comps[k], full[2 * k + 1:2 * k + 2])
    # three rows per component cannot split in two
    y = sess.upload(np.zeros((NDEV * 3, 2)), paradev.sharded(0))
    with pytest.raises(errors.Error, match="not divisible by num_split 2"):
        sess.ops.Split(y, axis=0, num_split=2)


def test_wrong_output_counts_at_the_wire(sess):
    x = sess.upload(X, paradev.mirrored())
    attrs = lib.pd_attrs_new()
    try:
        lib.pd_attrs_set_int(attrs, b"axis", 0)
        lib.pd_attrs_set_int(attrs, b"num_split", 12)
        ins = ffi.new("uint64_t[]", [x.id])
        for n, needle in (
                (3, r"the request names 3 output ids \(its list output's "
                    r"length is attribute 'num_split'\)"),
                (65, "no op has more than 64 outputs")):
            ids = ffi.new("uint64_t[]", n)
            st = _lib.status()
            code = lib.pd_execute(sess._s, b"Split", ins, 1, attrs, ids, n,
                                  ffi.NULL, ffi.NULL, st)
            assert code == 3  # INVALID_ARGUMENT
            with pytest.raises(errors.Error, match=needle):
                _lib.raise_status(code, st)
    finally:
        lib.pd_attrs_delete(attrs)
    # the session goes on
    np.testing.assert_array_equal(np.asarray(sess.ops.Split(
        x, axis=1, num_split=2)[1]), X[:, 1:])


def test_wrapper_doc(sess):
    assert "output (a list of num_split)" in sess.ops.Split.__doc__
    assert "output (a list of size_splits)" in sess.ops.SplitV.__doc__


def test_missing_length_attribute(sess):
    x = sess.upload(X, paradev.mirrored())
    with pytest.raises(TypeError, match="num_split"):
        sess.op("Split", x, axis=0)


def test_gradients(sess):
    xv = np.arange(6, dtype=np.float64).reshape(2, 3) + 1
    x = sess.upload(xv, paradev.mirrored())
    with sess.tape(persistent=True, watch=[x]) as tape:
        a, b, c = sess.ops.Split(x, axis=1, num_split=3)
        y = a + c * c  # b gets no gradient: zeros
        rows = sess.ops.Unpack(x, num=2)
        z = rows[1] * rows[1]
        p = sess.ops.Pack(a, c, axis=0)
    gy = tape.gradient(y, x)
    np.testing.assert_allclose(np.asarray(gy),
                               [[1, 0, 2 * 3], [1, 0, 2 * 6]], rtol=1e-15)
    gz = tape.gradient(z, x)
    np.testing.assert_allclose(np.asarray(gz), [[0, 0, 0], 2 * xv[1]],
                               rtol=1e-15)
    gp = tape.gradient(p, x)
    np.testing.assert_allclose(np.asarray(gp), [[1, 0, 1], [1, 0, 1]])


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
