"""Ops through session.op, the generated wrappers and the operators on
Tensors, each checked against NumPy."""
import numpy as np
import pytest

import paradev

RNG = np.random.default_rng(3)
A = RNG.standard_normal((4, 3))
B = RNG.standard_normal((4, 3))
P = np.abs(RNG.standard_normal((4, 3))) + 0.5


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# (op, inputs, attrs, NumPy's answer)
TABLE = [
    ("Add", (A, B), {}, A + B),
    ("Sub", (A, B), {}, A - B),
    ("Mul", (A, B), {}, A * B),
    ("Div", (A, P), {}, A / P),
    ("Maximum", (A, B), {}, np.maximum(A, B)),
    ("Minimum", (A, B), {}, np.minimum(A, B)),
    ("Pow", (P, B), {}, P ** B),
    ("Neg", (A,), {}, -A),
    ("Exp", (A,), {}, np.exp(A)),
    ("Log", (P,), {}, np.log(P)),
    ("Sqrt", (P,), {}, np.sqrt(P)),
    ("Rsqrt", (P,), {}, 1 / np.sqrt(P)),
    ("Square", (A,), {}, A * A),
    ("Tanh", (A,), {}, np.tanh(A)),
    ("Sigmoid", (A,), {}, 1 / (1 + np.exp(-A))),
    ("Relu", (A,), {}, np.maximum(A, 0)),
    ("MatMul", (A, B), {"transpose_b": True}, A @ B.T),
    ("MatMul", (A, B), {"transpose_a": True}, A.T @ B),
    ("BiasAdd", (A, B[0]), {}, A + B[0]),
    ("Sum", (A,), {"axis": 1}, A.sum(axis=1)),
    ("Sum", (A,), {"axis": [0, 1]}, A.sum()),
    ("Sum", (A,), {"axis": [0], "keep_dims": True}, A.sum(0, keepdims=True)),
    ("Mean", (A,), {"axis": [0]}, A.mean(axis=0)),
    ("Reshape", (A,), {"shape": (3, 4)}, A.reshape(3, 4)),
    ("Reshape", (A,), {"shape": [-1]}, A.reshape(-1)),
    ("Transpose", (A,), {"perm": [1, 0]}, A.T),
    ("Concat", ([A, B],), {"axis": 0}, np.concatenate([A, B], 0)),
    ("Slice", (A,), {"begin": [1, 0], "size": [2, -1]}, A[1:3, :]),
    ("Softmax", (A,), {}, softmax(A)),
    ("LogSoftmax", (A,), {}, np.log(softmax(A))),
    ("Fill", (), {"shape": (2, 3), "value": 1.5, "dtype": "float64"},
     np.full((2, 3), 1.5)),
    ("Cast", (A,), {"DstT": np.int32}, A.astype(np.int32)),
]


def _ids(row):
    return "%s-%s" % (row[0], "-".join(sorted(row[2])) or "plain")


@pytest.mark.parametrize("row", TABLE, ids=[_ids(r) for r in TABLE])
def test_wrappers_against_numpy(sess, row):
    name, inputs, attrs, want = row
    ts = []
    for x in inputs:
        if isinstance(x, list):
            ts.append([sess.upload(e, paradev.mirrored()) for e in x])
        else:
            ts.append(sess.upload(x, paradev.mirrored()))
    flat = [t for x in ts for t in (x if isinstance(x, list) else [x])]
    wrapper = getattr(sess.ops, name)
    out = wrapper(*flat, **attrs)
    assert out.shape == want.shape
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-12, atol=1e-12)
    # session.op gives the same
    out2 = sess.op(name, *ts, **attrs)
    np.testing.assert_array_equal(np.asarray(out2), np.asarray(out))


def test_two_outputs(sess):
    logits = RNG.standard_normal((5, 4))
    labels = np.array([0, 3, 1, 2, 3], np.int32)
    loss, backprop = sess.ops.SparseSoftmaxCrossEntropyWithLogits(
        sess.upload(logits, paradev.mirrored()),
        sess.upload(labels, paradev.mirrored()))
    sm = softmax(logits)
    np.testing.assert_allclose(np.asarray(loss),
                               -np.log(sm[np.arange(5), labels]), rtol=1e-12)
    onehot = np.eye(4)[labels]
    np.testing.assert_allclose(np.asarray(backprop), sm - onehot, atol=1e-12)


def test_collectives(sess):
    n = sess.num_devices
    x = np.arange(n * 2 * 3, dtype=np.float64).reshape(n * 2, 3)
    t = sess.upload(x, paradev.sharded(0))
    parts = np.array_split(x, n)
    s = sess.ops.AllReduce(t, reduction="sum")
    assert s.is_mirrored
    np.testing.assert_array_equal(np.asarray(s), sum(parts))
    m = sess.ops.AllReduce(t, reduction="mean")
    np.testing.assert_allclose(np.asarray(m), sum(parts) / n)
    g = sess.ops.AllGather(t, axis=0)
    np.testing.assert_array_equal(np.asarray(g), x)


def test_operators(sess):
    a = sess.upload(A, paradev.mirrored())
    b = sess.upload(B, paradev.mirrored())
    p = sess.upload(P, paradev.mirrored())
    np.testing.assert_allclose(np.asarray(a + b), A + B)
    np.testing.assert_allclose(np.asarray(a - b), A - B)
    np.testing.assert_allclose(np.asarray(a * b), A * B)
    np.testing.assert_allclose(np.asarray(a / p), A / P)
    np.testing.assert_allclose(np.asarray(-a), -A)
    np.testing.assert_allclose(np.asarray(a @ b.T), A @ B.T)
    np.testing.assert_allclose(np.asarray(a * 2), A * 2)
    np.testing.assert_allclose(np.asarray(2 - a), 2 - A)
    np.testing.assert_allclose(np.asarray(1 / p), 1 / P)
    np.testing.assert_allclose(np.asarray(p ** 2), P ** 2)
    np.testing.assert_array_equal(np.asarray(a < b), A < B)
    np.testing.assert_array_equal(np.asarray(a > 0.5), A > 0.5)
    np.testing.assert_allclose(np.asarray(a.sum()), A.sum())
    np.testing.assert_allclose(np.asarray(a.mean(axis=1)), A.mean(axis=1))
    np.testing.assert_array_equal(np.asarray(a.reshape(12)), A.reshape(12))
    np.testing.assert_array_equal(np.asarray(a.astype(np.float32)),
                                  A.astype(np.float32))


@pytest.mark.parametrize("key", [
    1, -1, slice(1, 3), (slice(None), 2), (2, slice(0, 2)), (Ellipsis, 1),
    (slice(-3, None), slice(1, None)), (0, 0)])
def test_indexing(sess, key):
    a = sess.upload(A, paradev.mirrored())
    want = A[key]
    got = a[key]
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got), want)


def test_indexing_errors(sess):
    a = sess.upload(A, paradev.mirrored())
    with pytest.raises(IndexError, match="step"):
        a[::2]
    with pytest.raises(IndexError, match="out of bounds"):
        a[4]
    with pytest.raises(IndexError, match="too many"):
        a[0, 0, 0]


def test_wrappers_describe_the_registry(sess):
    table = paradev.ops.registry(sess.client) if hasattr(paradev, "ops") \
        else None
    if table is None:
        pytest.skip("the daemon has no ListOps (older than the op reference)")
    assert "MatMul" in dir(sess.ops)
    doc = sess.ops.MatMul.__doc__
    assert "transpose_b" in doc
    import inspect
    sig = inspect.signature(sess.ops.MatMul)
    assert "transpose_b" in sig.parameters
    with pytest.raises(AttributeError, match="no op"):
        sess.ops.NoSuchOp


def test_pipelined_ops(sess):
    a = sess.upload(A, paradev.mirrored())
    with sess.pipeline():
        outs = [a]
        for i in range(50):
            outs.append(outs[-1] * 1.0 + a)
        last = outs[-1]
        # the registry's dtype rules give dtypes without asking the daemon
        assert last._dtype == np.float64 and last._shape is None
        c = sess.op("Cast", a, DstT="int32")
        assert c._dtype == np.int32
        assert sess.op("Equal", c, c)._dtype == np.bool_
    np.testing.assert_allclose(np.asarray(last), A * 51, rtol=1e-12)
    assert last.shape == (4, 3)
    assert last.dtype == np.float64


def test_pipelined_error_comes_at_the_wait(sess):
    a = sess.upload(A, paradev.mirrored())
    bad = sess.upload(np.ones((5, 5)), paradev.mirrored())
    with pytest.raises(paradev.InvalidArgument, match="MatMul"):
        with sess.pipeline():
            sess.op("MatMul", a, bad)
    # the session goes on
    np.testing.assert_allclose(np.asarray(a + a), 2 * A)


def test_attribute_conversion_errors(sess):
    a = sess.upload(A, paradev.mirrored())
    with pytest.raises(TypeError, match="expected a bool"):
        sess.ops.MatMul(a, a, transpose_b="yes")
    with pytest.raises(TypeError, match="expected an integer"):
        sess.op("Sum", a, axis=[0.5])
    with pytest.raises(TypeError, match="dtype"):
        sess.op("Cast", a, DstT="complex64")
    # numbers given for int lists and shapes are converted
    np.testing.assert_allclose(np.asarray(sess.op("Sum", a, axis=np.int64(0))),
                               A.sum(0))
    f = sess.op("Fill", shape=[np.int32(2)], value=np.float32(0.5),
                dtype=np.float64)
    np.testing.assert_array_equal(np.asarray(f), [0.5, 0.5])
