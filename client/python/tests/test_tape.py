"""Gradient tapes against central finite differences computed here in
float64 with NumPy."""
import numpy as np
import pytest

import paradev

RNG = np.random.default_rng(11)


def numeric_grad(f, x, eps=1e-6):
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def mlp_loss_np(w, b, x, y):
    h = np.tanh(x @ w + b)
    return float(((h - y) ** 2).sum())


def _mlp_on_daemon(sess, tape, w, b, x, y):
    h = sess.ops.Tanh(sess.ops.BiasAdd(x @ w, b))
    d = h - y
    return (d * d).sum()


@pytest.mark.parametrize("pipelined", [False, True])
def test_gradient_against_finite_differences(sess, pipelined):
    W = RNG.standard_normal((3, 4))
    Bv = RNG.standard_normal(4)
    X = RNG.standard_normal((5, 3))
    Y = RNG.standard_normal((5, 4))
    w = sess.upload(W, paradev.mirrored())
    b = sess.upload(Bv, paradev.mirrored())
    x = sess.upload(X, paradev.mirrored())
    y = sess.upload(Y, paradev.mirrored())
    ctx = sess.pipeline() if pipelined else _nullctx()
    with ctx:
        with sess.tape(watch=[w, b]) as tape:
            loss = _mlp_on_daemon(sess, tape, w, b, x, y)
        gw, gb = tape.gradient(loss, [w, b])
    np.testing.assert_allclose(float(loss), mlp_loss_np(W, Bv, X, Y),
                               rtol=1e-12)
    want_w = numeric_grad(lambda v: mlp_loss_np(v, Bv, X, Y), W)
    want_b = numeric_grad(lambda v: mlp_loss_np(W, v, X, Y), Bv)
    assert gw.shape == W.shape and gb.shape == Bv.shape
    np.testing.assert_allclose(np.asarray(gw), want_w, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.asarray(gb), want_b, rtol=1e-6, atol=1e-7)


class _nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_persistent_tape_and_unwatched_source(sess):
    X = RNG.standard_normal((2, 2))
    x = sess.upload(X, paradev.mirrored())
    c = sess.upload(np.ones((2, 2)), paradev.mirrored())
    with sess.tape(persistent=True) as tape:
        tape.watch(x)
        y = sess.ops.Exp(x).sum()
        z = (x * x).sum()
    np.testing.assert_allclose(np.asarray(tape.gradient(y, x)), np.exp(X),
                               rtol=1e-12)
    np.testing.assert_allclose(np.asarray(tape.gradient(z, x)), 2 * X,
                               rtol=1e-12)
    # c was never watched: zeros of its shape
    np.testing.assert_array_equal(np.asarray(tape.gradient(z, c)),
                                  np.zeros((2, 2)))
    tape.delete()


def test_one_shot_tape_answers_once(sess):
    x = sess.upload(np.array([3.0]), paradev.mirrored())
    with sess.tape(watch=[x]) as tape:
        y = x * x
    np.testing.assert_allclose(np.asarray(tape.gradient(y, x)), [6.0])
    with pytest.raises(ValueError, match="one-shot"):
        tape.gradient(y, x)


def test_output_gradient_and_sharded_allreduce(sess):
    n = sess.num_devices
    X = RNG.standard_normal((2 * n, 3))
    x = sess.upload(X, paradev.sharded(0))
    w = sess.upload(np.ones(3), paradev.mirrored())
    with sess.tape(watch=[w]) as tape:
        loss = sess.ops.AllReduce((x * w).sum(), reduction="sum")
    g = tape.gradient(loss, w)
    # Each device differentiates the loss it holds: through AllReduce(sum)
    # the adjoint is the all-reduce of the upstream ones (n on every
    # device, device/vjp.c), times d/dw_d of the device's own sum, its
    # shard's column sums.
    comps = g.numpy(paradev.per_component())
    for comp, shard in zip(comps, np.array_split(X, n)):
        np.testing.assert_allclose(comp, n * shard.sum(0), rtol=1e-12)
    # the client cannot tell whether a gradient is mirrored; the daemon
    # knows this one is not, and np.asarray says which layouts to use
    assert g.is_mirrored is None
    with pytest.raises(ValueError, match="per_component.*the daemon"):
        np.asarray(g)
    m = sess.ops.AllReduce(g, reduction="sum")
    np.testing.assert_allclose(np.asarray(m), n * X.sum(0), rtol=1e-12)


def test_no_gradient_op_is_an_error(sess):
    x = sess.upload(np.array([1.0, 2.0]), paradev.mirrored())
    with sess.tape(watch=[x]) as tape:
        y = sess.op("ArgMax", sess.ops.Exp(x).reshape(1, 2), axis=1,
                    output_type="int64")
        z = sess.ops.Cast(y, DstT="float64").sum()
    try:
        g = tape.gradient(z, x)
    except paradev.InvalidArgument:
        return
    # An integer path carries no gradient: zeros.
    np.testing.assert_array_equal(np.asarray(g), [0.0, 0.0])


@pytest.mark.parametrize("pipelined", [False, True])
def test_tape_watches_what_its_block_reads(sess, pipelined):
    W = RNG.standard_normal((3, 3))
    w = sess.upload(W, paradev.mirrored())
    ctx = sess.pipeline() if pipelined else _nullctx()
    with ctx:
        with sess.tape() as tape:
            loss = (w @ w).sum()
        g = tape.gradient(loss, w)
    # d/dW sum(W W) = 1 W^T + W^T 1 (1: ones)
    ones = np.ones((3, 3))
    np.testing.assert_allclose(np.asarray(g), ones @ W.T + W.T @ ones,
                               rtol=1e-12)
    # watch_accessed=False: only what is named; the rest gets zeros
    v = sess.upload(W, paradev.mirrored())
    with sess.tape(watch_accessed=False, watch=[w]) as tape:
        loss = (w * v).sum()
    gw, gv = tape.gradient(loss, [w, v])
    np.testing.assert_allclose(np.asarray(gw), W, rtol=1e-12)
    np.testing.assert_array_equal(np.asarray(gv), np.zeros((3, 3)))


def test_tape_through_a_cast_of_integers(sess):
    k = sess.upload(np.array([1, 2, 3], np.int32), paradev.mirrored())
    with sess.tape() as tape:
        f = sess.ops.Cast(k, DstT="float64")  # not recorded: integer input
        y = (f * f).sum()
    np.testing.assert_allclose(np.asarray(tape.gradient(y, f)), [2.0, 4, 6])
