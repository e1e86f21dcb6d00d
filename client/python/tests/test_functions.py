"""Graph functions from Python (paradev.functions): traced and explicit
definitions against the real daemon, values checked against NumPy in
float64 (forward values, an MLP loss's analytic gradient), the cache's miss
reasons and the passes' switches as DescribeFunction reports them."""
import numpy as np
import pytest

import paradev

RNG = np.random.default_rng(23)


def _passes(d, key="passes_in_force"):
    """{pass: enabled} (protobuf's JSON leaves out false values)."""
    return {p["pass"]: bool(p.get("enabled", False)) for p in d.get(key, [])}


def test_traced_function_matches_numpy(sess):
    X = RNG.standard_normal((6, 3))
    W = RNG.standard_normal((3, 4))
    B = RNG.standard_normal(4)
    b = sess.upload(B, paradev.mirrored())  # captured by the trace

    @sess.function
    def affine_relu(x, w):
        return sess.ops.Relu(sess.ops.BiasAdd(x @ w, b)) * 2.0 - 1.0

    x = sess.upload(X, paradev.mirrored())
    w = sess.upload(W, paradev.mirrored())
    y = affine_relu(x, w)
    # dtype and shape from the call's reply, before any download
    assert y.dtype == np.float64 and y.shape == (6, 4)
    want = np.maximum(X @ W + B, 0) * 2 - 1
    np.testing.assert_allclose(y.numpy(paradev.mirrored()), want, rtol=1e-12)
    # a second call reuses the registration and the instantiation
    y2 = affine_relu(x, w)
    np.testing.assert_allclose(np.asarray(y2), want, rtol=1e-12)
    d = sess.describe_function("affine_relu")
    assert d["function"]["name"] == "affine_relu"
    assert [a["name"] for a in d["function"]["args"]][:2] == ["x", "w"]
    assert d.get("hits", 0) >= 1 and d.get("misses", 0) == 1


def test_outputs_in_the_callables_form_and_pipelined(sess):
    A = RNG.standard_normal((2, 5)).astype(np.float32)

    @sess.function
    def stats(x):
        return {"total": x.sum(), "square": x * x}

    a = sess.upload(A, paradev.mirrored())
    with sess.pipeline():
        out = stats(a)
        assert set(out) == {"total", "square"}
        assert out["square"].dtype == np.float32
    np.testing.assert_allclose(np.asarray(out["total"]), A.sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out["square"]), A * A, rtol=1e-6)

    @sess.function
    def pair(x):
        return x + 1.0, -x

    p, q = pair(a)
    np.testing.assert_allclose(np.asarray(p), A + 1, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(q), -A)


def test_nested_function(sess):
    X = RNG.standard_normal((4, 4))

    @sess.function
    def inner(x):
        return sess.ops.Tanh(x) * x

    @sess.function
    def outer(x):
        return inner(inner(x) + x)

    x = sess.upload(X, paradev.mirrored())
    t = np.tanh(X) * X + X
    np.testing.assert_allclose(np.asarray(outer(x)), np.tanh(t) * t,
                               rtol=1e-12)
    nodes = sess.describe_function("outer")["function"]["nodes"]
    assert sum(n["op"] == "inner" for n in nodes) == 2


def test_all_reduce_of_a_sharded_input(sess):
    n = sess.num_devices
    X = RNG.standard_normal((2 * n, 3))

    @sess.function
    def sumsq(x):
        return sess.ops.AllReduce((x * x).sum(0), reduction="sum")

    y = sumsq(sess.upload(X, paradev.sharded(0)))
    assert y.is_mirrored is True  # the trace saw the AllReduce
    np.testing.assert_allclose(y.numpy(paradev.mirrored()),
                               (X * X).sum(0), rtol=1e-12)
    comps = y.numpy(paradev.per_component())
    for c in comps[1:]:
        assert np.array_equal(c, comps[0])


def _mlp_np(W, B, X, Y):
    H = np.tanh(X @ W + B)
    loss = ((H - Y) ** 2).sum()
    dz = 2 * (H - Y) * (1 - H ** 2)
    return loss, X.T @ dz, dz.sum(0)


def test_gradients_inside_a_function_match_numpy(sess):
    W = RNG.standard_normal((3, 4))
    B = RNG.standard_normal(4)
    X = RNG.standard_normal((5, 3))
    Y = RNG.standard_normal((5, 4))

    @sess.function
    def loss_and_grads(w, b, x, y):
        h = sess.ops.Tanh(sess.ops.BiasAdd(x @ w, b))
        d = h - y
        loss = (d * d).sum()
        dw, db = paradev.gradients(loss, [w, b])
        return loss, dw, db

    args = [sess.upload(v, paradev.mirrored()) for v in (W, B, X, Y)]
    loss, dw, db = loss_and_grads(*args)
    assert dw.shape == W.shape and db.shape == B.shape
    want_loss, want_dw, want_db = _mlp_np(W, B, X, Y)
    np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-12)
    np.testing.assert_allclose(dw.numpy(paradev.mirrored()), want_dw,
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(db.numpy(paradev.mirrored()), want_db,
                               rtol=1e-10, atol=1e-12)


def test_gradients_with_upstream_gradient(sess):
    X = RNG.standard_normal((3, 2))
    G = RNG.standard_normal((3, 2))

    @sess.function
    def vjp(x, g):
        return paradev.gradients(sess.ops.Exp(x), x, grad_y=g)

    dx = vjp(sess.upload(X, paradev.mirrored()),
             sess.upload(G, paradev.mirrored()))
    np.testing.assert_allclose(dx.numpy(paradev.mirrored()), np.exp(X) * G,
                               rtol=1e-12)


def test_describe_after_a_shape_change_says_why_it_missed(sess):
    @sess.function(input_signature=[paradev.Spec("float32")])
    def double(x):
        return x + x

    double(sess.upload(np.ones((4, 3), np.float32), paradev.mirrored()))
    y = double(sess.upload(np.ones((5, 3), np.float32), paradev.mirrored()))
    assert y.shape == (5, 3)
    d = double.describe()
    assert d.get("misses") == 2
    assert len(d["instantiations"]) == 2
    why = d["cache_misses"][0]
    assert "input 0" in why and "5,3" in why and "4,3" in why, why


def test_registration_error_names_the_node(sess):
    d = paradev.FunctionDef("broken")
    d.arg("x", "float32")
    d.node("ok", "Neg", ["x"])
    d.node("bad_node", "Add", ["ok", "missing"])
    d.output("y", "bad_node")
    with pytest.raises(paradev.InvalidArgument) as e:
        sess.register_function(d)
    assert "bad_node" in e.value.message and "missing" in e.value.message

    @sess.function
    def wrong_arity(x):
        return sess.op("MatMul", x)  # MatMul takes two inputs

    with pytest.raises(paradev.InvalidArgument) as e:
        wrong_arity(sess.upload(np.ones((2, 2)), paradev.mirrored()))
    # the daemon names the node; the package adds where the trace made it
    assert "MatMul_" in e.value.message
    assert "test_functions.py" in e.value.message


def test_explicit_definition_identical_and_conflicting(sess):
    def make(op):
        d = paradev.FunctionDef("explicit_scale")
        d.arg("x", "float64")
        d.node("two", "Fill", [], shape=(), value=2.0, dtype="float64")
        d.node("y", op, ["x", "two"])
        d.output("y", "y")
        return d

    f = sess.register_function(make("Mul"))
    assert f.already_registered is False
    assert sess.register_function(make("Mul")).already_registered is True
    with pytest.raises(paradev.AlreadyExists):
        sess.register_function(make("Add"))
    X = RNG.standard_normal(7)
    np.testing.assert_allclose(np.asarray(f(sess.upload(X, paradev.mirrored(
    )))), 2 * X)


def test_pass_switch_is_reflected_in_describe(sess):
    @sess.function(passes={"fusion": False, "cse": True},
                   max_instantiations=3)
    def chain(x):
        return sess.ops.Relu(x * 3.0 + 1.0)

    X = RNG.standard_normal(8).astype(np.float32)
    y = chain(sess.upload(X, paradev.mirrored()))
    np.testing.assert_allclose(np.asarray(y), np.maximum(X * 3 + 1, 0),
                               rtol=1e-6)
    d = chain.describe()
    force = _passes(d)
    assert force["fusion"] is False and force["cse"] is True
    assert d.get("max_instantiations") == 3
    opts = d["function"].get("options", {})
    assert opts.get("fusion") in ("TRI_STATE_OFF", 1)
    inst = _passes(d["instantiations"][0], "passes")
    assert inst["fusion"] is False


def test_symbols_stay_inside_their_trace(sess):
    leaked = []

    @sess.function
    def keep(x):
        leaked.append(x)
        with pytest.raises(TypeError):
            bool(x)
        return -x

    keep(sess.upload(np.ones(2), paradev.mirrored()))
    with pytest.raises(ValueError, match="symbolic"):
        sess.ops.Neg(leaked[0])
    with pytest.raises(ValueError, match="inside a traced function"):
        paradev.gradients(sess.upload(np.ones(2), paradev.mirrored()), [])


def test_list_output_op_inside_a_function(sess):
    if "Split" not in dir(sess.ops):
        pytest.skip("the daemon has no Split (list outputs)")
    X = RNG.standard_normal((6, 4))

    @sess.function
    def thirds(x):
        a, b, c = sess.ops.Split(x, axis=0, num_split=3)
        return a * c + b

    y = thirds(sess.upload(X, paradev.mirrored()))
    np.testing.assert_allclose(np.asarray(y), X[:2] * X[4:] + X[2:4],
                               rtol=1e-12)


def test_a_function_cannot_call_itself(sess):
    @sess.function
    def rec(x):
        return rec(x) + 1.0

    with pytest.raises(ValueError, match="cannot recurse"):
        rec(sess.upload(np.ones(2), paradev.mirrored()))


def test_nested_function_returning_a_collective(sess):
    # A called function's output made by a collective is known mirrored:
    # the trace of the caller used to fail unpacking that mark.
    n = sess.num_devices
    X = RNG.standard_normal((2 * n, 3))

    @sess.function
    def inner_ar(x):
        return sess.ops.AllReduce(x.sum(0), reduction="sum")

    @sess.function
    def outer_ar(x):
        return inner_ar(x) * 2.0

    x = sess.upload(X, paradev.sharded(0))
    np.testing.assert_allclose(np.asarray(outer_ar(x)), 2.0 * X.sum(0),
                               rtol=1e-12)


def test_clear_errors_for_what_a_trace_cannot_do(sess):
    x = sess.upload(RNG.standard_normal((4, 4)), paradev.mirrored())

    @sess.function
    def sliced(v):
        return v[1:3]

    with pytest.raises(TypeError, match="input_signature"):
        sliced(x)

    @sess.function
    def two_targets(v):
        return paradev.gradients([v.sum(), (v * v).sum()], [v])

    with pytest.raises(ValueError, match="one target"):
        two_targets(x)

    @sess.function
    def with_tape(v):
        with sess.tape():
            return v * 2.0

    with pytest.raises(RuntimeError, match="paradev.gradients"):
        with_tape(x)

    with pytest.raises(TypeError, match="list of numbers, got str 'abc'"):
        sess.op("Sum", x, axis="abc")  # not read one character at a time

    with pytest.raises(TypeError, match="expected True, False or None"):
        sess.function(lambda v: v, passes={"fusion": "no"})
    with pytest.raises(ValueError, match="max_instantiations"):
        sess.function(lambda v: v, max_instantiations=2.5)

    # With the shape given, slicing traces.
    @sess.function(input_signature=[paradev.Spec("float64", [4, 4])])
    def sliced_ok(v):
        return v[1:3]

    np.testing.assert_allclose(np.asarray(sliced_ok(x)),
                               np.asarray(x)[1:3], rtol=0)
