#!/usr/bin/python3
"""NumPy oracle for the paradev engine.

Generates a table of cases (op, attributes, inputs of given dtypes, shapes and
layouts, random values from a fixed seed), writes the inputs as raw
little-endian files plus a line-based manifest, runs the C driver
(tests/oracle/oracle_driver.c; see its header for both file formats), and
checks every output component against NumPy, computed in float64 from the
values the device actually holds (inputs already rounded to their dtype).

Comparison (see class Expect): copies (Transpose, Gather, Max, AllGather, ...)
must be exact. Cast to any float dtype must be correctly rounded (nearest,
ties to even); so must the float16/bfloat16 results of elementwise ops, with
2^-20 relative slack for their float32 step except at exact midpoints. The
rest: |got - want| <= atol(dtype) + rtol(dtype) * scale, where scale is |want|
or a bound on the magnitude of the terms of sums and products (sum |x|,
|a| @ |b|; times n-1 for 16-bit collective reductions, which NCCL rounds at
every hop); rtol float64 1e-12, float32 1e-5, float16 2e-3, bfloat16 1e-2.
Integer and bool outputs must match exactly.

Semantics: TensorFlow raw ops (names, attributes, Div on integers truncates,
Cast from float to int truncates toward zero, OneHot of an out-of-range index
is a row of off_value, ArgMax returns the first maximum), NumPy broadcasting,
NCCL collectives (ReduceScatter splits the reduced value along axis 0, the
first dim % n parts one longer, as np.array_split does).

Prints every failing case (op, dtypes, shapes, the worst element) and ends
with "N passed, M failed"; exit status 0 only if none failed.

Usage: oracle.py --driver PATH [--keep] [--filter OP-OR-NAME] [--list]
                 [--timeout SECONDS]
The work directory (inputs, outputs, manifest, results) is kept when a case
fails, or with --keep.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

SEED = 20240611

# --------------------------------------------------------------------------
# dtypes

FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")

STORAGE = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("u1"),
}

RTOL = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
# Absolute floor: below the smallest normal of the dtype relative error
# means nothing (float16 subnormals are 6e-8 apart).
ATOL = {"float64": 1e-300, "float32": 1e-37, "float16": 1e-7,
        "bfloat16": 1e-37}

INT_RANGE = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1),
             "uint8": (0, 255)}


def is_float(dt):
    return dt in FLOATS


def bf16_bits(x):
    """float64 array -> bfloat16 bit patterns, rounded to nearest even from
    the float64 value itself (NaN stays NaN). The float64 is first rounded to
    float32 by rounding to odd, which makes the second rounding correct
    (Boldo & Melquiond 2008); plain float32 rounding would round twice."""
    d = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf
        f = d.astype(np.float32)
        # round to odd: truncate toward zero, set the last bit if inexact
        inexact = np.isfinite(f) & (f.astype(np.float64) != d)
        over = inexact & (np.abs(f.astype(np.float64)) > np.abs(d))
        f = np.where(over, np.nextafter(f, np.float32(0)), f).astype(np.float32)
    bits = np.asarray(f).reshape(-1).view(np.uint32).astype(np.uint64) \
        .reshape(d.shape)
    bits = np.where(inexact, bits | np.uint64(1), bits)
    u16, one = np.uint64(16), np.uint64(1)
    rounded = (bits + np.uint64(0x7FFF) + ((bits >> u16) & one)) >> u16
    out = np.asarray(rounded.astype(np.uint16))
    nan = np.isnan(d)
    if np.any(nan):
        out[nan] = ((bits[nan] >> u16) | np.uint64(0x40)).astype(np.uint16)
    return out


def step_toward(q, want, dt):
    """The neighbour of q (a value of dt) in the direction of want."""
    up = want > q
    if dt in ("float32", "float64", "float16"):
        t = STORAGE[dt].type
        inf = np.where(up, np.inf, -np.inf).astype(t)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.nextafter(q.astype(t), inf).astype(np.float64)
    # bfloat16, on its bit patterns: sign and magnitude
    bits = bf16_bits(q).astype(np.int64)
    neg = (bits & 0x8000) != 0
    mag = bits & 0x7FFF
    away = (up & ~neg & (q >= 0)) | (~up & neg)  # magnitude grows
    zero = mag == 0
    new_mag = np.where(away | zero, mag + 1, mag - 1)
    new_neg = np.where(zero, ~up, neg)
    nb = (new_mag | np.where(new_neg, 0x8000, 0)).astype(np.uint16)
    return bf16_value(nb)


def bf16_value(bits):
    b = np.asarray(bits, dtype=np.uint32)
    f = (b.reshape(-1) << np.uint32(16)).astype(np.uint32).view(np.float32)
    with np.errstate(invalid="ignore"):  # NaN payloads
        return f.astype(np.float64).reshape(b.shape)


def to_storage(val, dt):
    """Value array (float64 / int64 / bool) -> storage array of dt."""
    if dt == "bfloat16":
        return bf16_bits(val)
    if dt == "bool":
        return np.asarray(val).astype(bool).astype(np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow -> inf
        return np.asarray(val).astype(STORAGE[dt])


def from_storage(arr, dt):
    """Storage array -> the value it holds (float64, int64 or bool)."""
    if dt == "bfloat16":
        return bf16_value(arr)
    if dt in FLOATS:
        return arr.astype(np.float64)
    if dt == "bool":
        return arr != 0
    return arr.astype(np.int64)


def quantize(val, dt):
    """The value that a host value takes once stored as dt."""
    return from_storage(to_storage(val, dt), dt)


def cast_value(val, src, dst):
    """TensorFlow Cast: float -> int truncates toward zero, -> bool is != 0."""
    v = np.asarray(val)
    if dst == "bool":
        return v != 0
    if dst in FLOATS:
        return v.astype(np.float64)  # compared as correctly rounded
    if src in FLOATS:
        v = np.trunc(v)
    return v.astype(np.int64)


# --------------------------------------------------------------------------
# cases

class Input:
    def __init__(self, dt, val, layout="mirrored", axis=0):
        self.dt = dt
        self.val = val  # host value as the device sees it
        self.layout = layout
        self.axis = axis

    def components(self, n):
        if self.layout == "mirrored":
            return [self.val] * n
        return np.array_split(self.val, n, axis=self.axis)

    def desc(self):
        shape = "[" + ",".join(str(d) for d in self.val.shape) + "]"
        lay = "" if self.layout == "mirrored" else "/sharded%d" % self.axis
        return "%s%s%s" % (self.dt, shape, lay)


class Expect:
    """One output component: value, dtype and how to compare floats:
    mode "tol":     |got - want| <= atol + rtol * scale (scale |want| if None)
    mode "rounded": 16-bit floats: got is want correctly rounded to the
                    dtype, with 2^-20 |want| of slack for the float32 step
                    (libm error, double rounding); else as "tol"
    mode "cast":    as "rounded", and float32/float64 correctly rounded too
    mode "exact":   got == want (copies, Max/Min, Neg, Abs, Relu)."""

    def __init__(self, val, dt, scale=None, mode="tol"):
        self.val = np.asarray(val)
        self.dt = dt
        self.scale = scale
        self.mode = mode


class Case:
    def __init__(self, op, inputs, attrs=(), ndev=3, ref=None, mesh_ref=None,
                 expect="ok", code="INVALID_ARGUMENT", note=""):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = list(attrs)  # (name, type, value)
        self.ndev = ndev
        self.ref = ref            # per component: (vals, dts, attrs) -> [Expect]
        self.mesh_ref = mesh_ref  # all components: (comps, dts, attrs, n)
        self.expect = expect      # ok | err_exec | err_run | err_any
        self.code = code
        self.note = note
        self.name = None

    def attr_dict(self):
        return {name: value for name, _, value in self.attrs}

    def desc(self):
        attrs = " ".join("%s=%s" % (n, fmt_attr(t, v)) for n, t, v in self.attrs)
        s = "%s(%s)" % (self.op, ", ".join(i.desc() for i in self.inputs))
        if attrs:
            s += " {" + attrs + "}"
        s += " mesh=%d" % self.ndev
        if self.note:
            s += " [" + self.note + "]"
        return s

    def expected(self):
        """list over outputs of list over devices of Expect."""
        n = self.ndev
        dts = [i.dt for i in self.inputs]
        attrs = self.attr_dict()
        comps = [i.components(n) for i in self.inputs]
        if self.mesh_ref:
            return self.mesh_ref(comps, dts, attrs, n)
        per_dev = [self.ref([c[d] for c in comps], dts, attrs) for d in range(n)]
        return [[per_dev[d][o] for d in range(n)] for o in range(len(per_dev[0]))]


def fmt_attr(t, v):
    if t in ("ilist", "flist", "shape"):
        return "[" + ",".join(str(x) for x in v) + "]"
    if t == "bool":
        return "true" if v else "false"
    return str(v)


def manifest_attr(name, t, v):
    if t in ("ilist", "flist", "shape"):
        return "attr %s %s %d %s" % (name, t, len(v),
                                      " ".join(repr(x) for x in v))
    if t == "bool":
        return "attr %s bool %d" % (name, 1 if v else 0)
    if t == "float":
        return "attr %s float %r" % (name, float(v))
    return "attr %s %s %s" % (name, t, v)


# --------------------------------------------------------------------------
# random inputs

rng = np.random.default_rng(SEED)


def rand(dt, shape, lo=-2.0, hi=2.0, ilo=-50, ihi=50, layout="mirrored",
         axis=0, nonzero=False, integral=False):
    shape = tuple(shape)
    if dt == "bool":
        v = rng.integers(0, 2, shape).astype(bool)
    elif dt in FLOATS:
        if integral:
            v = rng.integers(int(lo), int(hi) + 1, shape).astype(np.float64)
        else:
            v = rng.uniform(lo, hi, shape)
            if nonzero:
                v = np.where(np.abs(v) < 0.25, np.copysign(0.25, v) + v, v)
        v = quantize(v, dt)
    else:
        v = rng.integers(ilo, ihi + 1, shape).astype(np.int64)
        if nonzero:
            v = np.where(v == 0, 1, v)
    return Input(dt, v, layout, axis)


def fixed(dt, values, layout="mirrored", axis=0):
    v = np.asarray(values)
    if dt in FLOATS:
        v = quantize(v.astype(np.float64), dt)
    elif dt == "bool":
        v = v.astype(bool)
    else:
        v = v.astype(np.int64)
    return Input(dt, v, layout, axis)


# --------------------------------------------------------------------------
# references (per component; inputs as float64 / int64 / bool)

def out_like(val, dt, scale=None, mode="tol"):
    if dt in INTS:
        val = np.asarray(val).astype(np.int64)
    return Expect(val, dt, scale, mode)


def trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return q * np.sign(a) * np.sign(b)


def ref_binary(op):
    def f(v, dts, attrs):
        a, b = v
        dt = dts[0]
        if op == "Add":
            r = a + b
        elif op == "Sub":
            r = a - b
        elif op == "Mul":
            r = a * b
        elif op == "Div":
            r = trunc_div(a, b) if dt in INTS else a / b
        elif op == "Maximum":
            r = np.maximum(a, b)
        elif op == "Minimum":
            r = np.minimum(a, b)
        elif op == "Pow":
            r = np.power(a, b)
        elif op == "Equal":
            return [Expect(a == b, "bool")]
        elif op == "Greater":
            return [Expect(a > b, "bool")]
        elif op == "Less":
            return [Expect(a < b, "bool")]
        else:
            raise ValueError(op)
        exact = op in ("Maximum", "Minimum")
        return [out_like(r, dt, mode="exact" if exact else "rounded")]
    return f


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY = {
    "Neg": lambda x: -x,
    "Abs": np.abs,
    "Exp": np.exp,
    "Log": np.log,
    "Sqrt": np.sqrt,
    "Rsqrt": lambda x: 1.0 / np.sqrt(x),
    "Square": lambda x: x * x,
    "Tanh": np.tanh,
    "Sigmoid": sigmoid,
    "Relu": lambda x: np.maximum(x, 0),
}


def ref_unary(op):
    def f(v, dts, attrs):
        exact = op in ("Neg", "Abs", "Relu")
        return [out_like(UNARY[op](v[0]), dts[0],
                         mode="exact" if exact else "rounded")]
    return f


def ref_cast(v, dts, attrs):
    dst = attrs["DstT"]
    return [Expect(cast_value(v[0], dts[0], dst), dst, mode="cast")]


def ref_matmul(v, dts, attrs):
    a, b = v
    if attrs.get("transpose_a"):
        a = a.T
    if attrs.get("transpose_b"):
        b = b.T
    return [Expect(a @ b, dts[0], np.abs(a) @ np.abs(b))]


def ref_batch_matmul(v, dts, attrs):
    x, y = v
    if attrs.get("adj_x"):
        x = np.swapaxes(x, -1, -2)
    if attrs.get("adj_y"):
        y = np.swapaxes(y, -1, -2)
    return [Expect(np.matmul(x, y), dts[0], np.matmul(np.abs(x), np.abs(y)))]


def ref_bias_add(v, dts, attrs):
    return [out_like(v[0] + v[1], dts[0], mode="rounded")]


def red_axes(attrs, rank):
    axes = attrs.get("axis", [])
    if len(axes) == 0:
        return None
    return tuple(sorted(a % rank for a in axes)) if rank else None


def ref_reduce(op):
    def f(v, dts, attrs):
        x = v[0]
        dt = dts[0]
        ax = red_axes(attrs, x.ndim)
        kd = bool(attrs.get("keep_dims", False))
        if op == "Sum":
            r = np.sum(x, axis=ax, keepdims=kd)
            return [out_like(r, dt, np.sum(np.abs(x), axis=ax, keepdims=kd))]
        if op == "Mean":
            if dt in INTS:
                s = np.sum(x, axis=ax, keepdims=kd)
                cnt = x.size // max(np.asarray(s).size, 1) if x.size else 1
                return [out_like(trunc_div(s, cnt), dt)]
            r = np.mean(x, axis=ax, keepdims=kd)
            return [out_like(r, dt, np.mean(np.abs(x), axis=ax, keepdims=kd))]
        if op == "Max":
            return [out_like(np.max(x, axis=ax, keepdims=kd), dt, mode="exact")]
        if op == "Min":
            return [out_like(np.min(x, axis=ax, keepdims=kd), dt, mode="exact")]
        raise ValueError(op)
    return f


def ref_argmax(v, dts, attrs):
    ot = attrs.get("output_type", "int64")
    return [Expect(np.argmax(v[0], axis=attrs["axis"]).astype(np.int64), ot)]


def softmax(x):
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def log_softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    return x - m - np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True))


def ref_softmax(v, dts, attrs):
    return [Expect(softmax(v[0]), dts[0])]


def ref_log_softmax(v, dts, attrs):
    r = log_softmax(v[0])
    return [Expect(r, dts[0], np.abs(r) + 1.0)]


def ref_sscewl(v, dts, attrs):
    x, labels = v
    lsm = log_softmax(x)
    rows = np.arange(x.shape[0])
    loss = -lsm[rows, labels]
    back = softmax(x)
    back[rows, labels] -= 1.0
    return [Expect(loss, dts[0], np.abs(loss) + 1.0),
            Expect(back, dts[0], np.ones_like(back))]


def ref_transpose(v, dts, attrs):
    return [out_like(np.transpose(v[0], attrs["perm"]), dts[0], mode="exact")]


def ref_concat(v, dts, attrs):
    return [out_like(np.concatenate(v, axis=attrs["axis"]), dts[0], mode="exact")]


def ref_slice(v, dts, attrs):
    x = v[0]
    idx = []
    for b, s, d in zip(attrs["begin"], attrs["size"], x.shape):
        idx.append(slice(b, d if s == -1 else b + s))
    return [out_like(x[tuple(idx)], dts[0], mode="exact")]


def ref_gather(v, dts, attrs):
    return [out_like(np.take(v[0], v[1], axis=attrs.get("axis", 0)), dts[0], mode="exact")]


def ref_one_hot(v, dts, attrs):
    idx = v[0]
    depth = attrs["depth"]
    on = attrs.get("on_value", 1.0)
    off = attrs.get("off_value", 0.0)
    axis = attrs.get("axis", -1)
    dt = attrs.get("dtype", "float32")
    hot = idx[..., None] == np.arange(depth)
    r = np.where(hot, on, off).astype(np.float64)
    if axis != -1:
        r = np.moveaxis(r, -1, axis)
    if dt in INTS:
        r = r.astype(np.int64)
    else:
        r = quantize(r, dt)
    return [Expect(r, dt)]


def ref_reshape(v, dts, attrs):
    return [out_like(v[0].reshape(attrs["shape"]), dts[0], mode="exact")]


# --------------------------------------------------------------------------
# collectives (all components at once)

def reduce_stack(stack, red):
    if red == "sum":
        return np.sum(stack, axis=0), np.sum(np.abs(stack), axis=0)
    if red == "mean":
        return np.mean(stack, axis=0), np.mean(np.abs(stack), axis=0)
    if red == "prod":
        return np.prod(stack, axis=0), np.prod(np.abs(stack), axis=0)
    if red == "max":
        return np.max(stack, axis=0), None
    if red == "min":
        return np.min(stack, axis=0), None
    raise ValueError(red)


def mesh_reduce(comps, dts, attrs, n):
    """Reduces the components; NCCL reduces 16-bit floats hop by hop, rounding
    at each of the n-1 hops, so their error bound grows with the mesh."""
    r, scale = reduce_stack(np.stack(comps[0]), attrs.get("reduction", "sum"))
    if scale is not None and dts[0] in ("float16", "bfloat16"):
        scale = scale * max(n - 1, 1)
    return r, scale


def mesh_all_reduce(comps, dts, attrs, n):
    r, scale = mesh_reduce(comps, dts, attrs, n)
    mode = "exact" if attrs.get("reduction") in ("max", "min") else "tol"
    return [[out_like(r, dts[0], scale, mode) for _ in range(n)]]


def mesh_broadcast(comps, dts, attrs, n):
    root = attrs.get("root", 0)
    return [[out_like(comps[0][root], dts[0], mode="exact") for _ in range(n)]]


def mesh_all_gather(comps, dts, attrs, n):
    r = np.concatenate(comps[0], axis=attrs.get("axis", 0))
    return [[out_like(r, dts[0], mode="exact") for _ in range(n)]]


def mesh_reduce_scatter(comps, dts, attrs, n):
    r, scale = mesh_reduce(comps, dts, attrs, n)
    parts = np.array_split(r, n, axis=0)
    sparts = np.array_split(scale, n, axis=0) if scale is not None else [None] * n
    return [[out_like(parts[d], dts[0], sparts[d]) for d in range(n)]]


# --------------------------------------------------------------------------
# the table

def build_cases():
    cases = []
    add = cases.append

    # Elementwise binary ops with broadcasting.
    shape_pairs = [([3, 1, 4], [5, 4]), ([], [2, 3]), ([0, 3], [1, 3]),
                   ([2, 3], [2, 3]), ([4, 1], [1, 5]), ([2, 3, 4], [4]),
                   ([1], [])]
    binops = ["Add", "Sub", "Mul", "Div", "Maximum", "Minimum", "Pow",
              "Equal", "Greater", "Less"]
    for op in binops:
        for dt in FLOATS + INTS:
            pairs = shape_pairs if dt in ("float32", "int32") else shape_pairs[:2]
            for sa, sb in pairs:
                kw_a, kw_b = {}, {}
                if op == "Div":
                    kw_b = {"nonzero": True, "ilo": -9, "ihi": 9}
                if op == "Pow":
                    kw_a = {"lo": 0.5, "hi": 2.0, "ilo": 0, "ihi": 5}
                    kw_b = {"lo": -2.0, "hi": 2.0, "ilo": 0, "ihi": 4}
                if op in ("Equal", "Greater", "Less", "Maximum", "Minimum"):
                    kw_a = kw_b = {"lo": -2, "hi": 2, "integral": True,
                                   "ilo": -2, "ihi": 2}
                add(Case(op, [rand(dt, sa, **kw_a), rand(dt, sb, **kw_b)],
                         ref=ref_binary(op)))
    # Components that differ in shape: sharded [7,4] (3,2,2 rows) + mirrored.
    for op in ("Add", "Mul", "Maximum", "Greater"):
        for dt in ("float32", "bfloat16", "int64"):
            add(Case(op, [rand(dt, [7, 4], layout="sharded", axis=0),
                          rand(dt, [4])], ref=ref_binary(op)))
    add(Case("Sub", [rand("float64", [2, 3]), rand("float64", [2, 3])],
             ndev=1, ref=ref_binary("Sub")))
    add(Case("Add", [rand("float32", [3, 7], layout="sharded", axis=1),
                     rand("float32", [3, 1])], ndev=4, ref=ref_binary("Add"),
             note="split along axis 1 on 4 devices"))
    add(Case("Sum", [rand("float64", [3, 7], layout="sharded", axis=1)],
             [("axis", "ilist", [1]), ("keep_dims", "bool", True)], ndev=4,
             ref=ref_reduce("Sum")))
    add(Case("Div", [fixed("int32", [7, -7, 7, -7, 0, 1]),
                     fixed("int32", [2, 2, -2, -2, 3, -1])],
             ref=ref_binary("Div"), note="truncating integer division"))

    # Unary ops.
    ranges = {"Log": (0.1, 4.0), "Sqrt": (0.1, 4.0), "Rsqrt": (0.1, 4.0),
              "Exp": (-3.0, 3.0), "Tanh": (-3.0, 3.0), "Sigmoid": (-6.0, 6.0)}
    int_unary = ("Neg", "Abs", "Square", "Relu")
    for op in UNARY:
        lo, hi = ranges.get(op, (-2.0, 2.0))
        dts = FLOATS + (INTS if op in int_unary else ())
        for dt in dts:
            for shape in ([2, 3, 4], [], [0, 5]):
                add(Case(op, [rand(dt, shape, lo=lo, hi=hi)], ref=ref_unary(op)))
        add(Case(op, [rand("float32", [5, 3], lo=lo, hi=hi, layout="sharded")],
                 ref=ref_unary(op)))

    # Cast.
    cast_src = {"float32": dict(lo=-100, hi=100), "float64": dict(lo=-100, hi=100),
                "float16": dict(lo=-100, hi=100), "bfloat16": dict(lo=-100, hi=100),
                "int32": dict(ilo=-1000, ihi=1000), "int64": dict(ilo=-1000, ihi=1000),
                "bool": {}}
    for src, kw in cast_src.items():
        for dst in FLOATS + INTS + ("bool",):
            if src == dst:
                continue
            add(Case("Cast", [rand(src, [3, 5], **kw)],
                     [("DstT", "dtype", dst)], ref=ref_cast))
    add(Case("Cast", [rand("float32", [4, 4], lo=0, hi=255)],
             [("DstT", "dtype", "uint8")], ref=ref_cast))
    add(Case("Cast", [fixed("float32", [-2.5, -0.5, 0.0, 0.5, 2.5, 3.99])],
             [("DstT", "dtype", "int32")], ref=ref_cast,
             note="truncation toward zero"))
    add(Case("Cast", [rand("float32", [0, 3])], [("DstT", "dtype", "float16")],
             ref=ref_cast))

    # MatMul, BatchMatMul, BiasAdd.
    for dt in FLOATS:
        for ta in (False, True):
            for tb in (False, True):
                m, k, n = 5, 7, 3
                a = rand(dt, [k, m] if ta else [m, k])
                b = rand(dt, [n, k] if tb else [k, n])
                add(Case("MatMul", [a, b], [("transpose_a", "bool", ta),
                                            ("transpose_b", "bool", tb)],
                         ref=ref_matmul))
    add(Case("MatMul", [rand("float32", [33, 65]), rand("float32", [65, 17])],
             ref=ref_matmul))
    add(Case("MatMul", [rand("float32", [3, 0]), rand("float32", [0, 4])],
             ref=ref_matmul, note="k=0 gives zeros"))
    add(Case("MatMul", [rand("float64", [0, 4]), rand("float64", [4, 2])],
             ref=ref_matmul))
    add(Case("MatMul", [rand("float32", [7, 6], layout="sharded"),
                        rand("float32", [6, 4])], ref=ref_matmul))
    add(Case("MatMul", [rand("float64", [4, 6]), rand("float64", [6, 4])],
             ndev=1, ref=ref_matmul))
    bmm_shapes = [([2, 1, 3, 4], [5, 4, 6]), ([3, 2, 4], [3, 4, 5]),
                  ([3, 4], [2, 4, 5]), ([1, 2, 3], [4, 3, 2])]
    for dt in FLOATS:
        for sx, sy in bmm_shapes[:2] if dt != "float32" else bmm_shapes:
            for adj_x in (False, True):
                for adj_y in (False, True):
                    x = list(sx)
                    y = list(sy)
                    if adj_x:
                        x[-1], x[-2] = x[-2], x[-1]
                    if adj_y:
                        y[-1], y[-2] = y[-2], y[-1]
                    add(Case("BatchMatMul", [rand(dt, x), rand(dt, y)],
                             [("adj_x", "bool", adj_x), ("adj_y", "bool", adj_y)],
                             ref=ref_batch_matmul))
    for dt in FLOATS:
        for shape in ([4, 5], [2, 3, 5], [0, 5]):
            add(Case("BiasAdd", [rand(dt, shape), rand(dt, [5])],
                     ref=ref_bias_add))

    # Reductions.
    axis_sets = [[], [0], [1, 2], [-1], [0, 2], [2, 0]]
    for op in ("Sum", "Mean", "Max", "Min"):
        for dt in FLOATS + INTS:
            axes = axis_sets if dt in ("float32", "int32") else axis_sets[:3]
            for axis in axes:
                for kd in (False, True):
                    add(Case(op, [rand(dt, [3, 4, 5])],
                             [("axis", "ilist", axis), ("keep_dims", "bool", kd)],
                             ref=ref_reduce(op)))
        add(Case(op, [rand("float32", [])], [("axis", "ilist", [])],
                 ref=ref_reduce(op), note="rank 0"))
        add(Case(op, [rand("float32", [7, 3], layout="sharded")],
                 [("axis", "ilist", [0])], ref=ref_reduce(op)))
        add(Case(op, [rand("float64", [64, 33])], [("axis", "ilist", [0])],
                 ref=ref_reduce(op)))
    for op in ("Sum", "Mean"):
        add(Case(op, [rand("float32", [4, 0, 3])], [("axis", "ilist", [2])],
                 ref=ref_reduce(op), note="zero-size"))
    add(Case("Sum", [rand("float32", [0, 3])], [("axis", "ilist", [0])],
             ref=ref_reduce("Sum"), note="sum over an empty axis is 0"))
    for dt in FLOATS + INTS:
        for shape, axis in (([4, 6], 0), ([4, 6], 1), ([3, 4, 5], -1),
                            ([3, 4, 5], 1)):
            for ot in ("int32", "int64"):
                if dt not in ("float32", "int32") and (ot == "int32" or axis != 1):
                    continue
                add(Case("ArgMax", [rand(dt, shape)],
                         [("axis", "int", axis), ("output_type", "dtype", ot)],
                         ref=ref_argmax))
    add(Case("ArgMax", [rand("float32", [7, 5], layout="sharded")],
             [("axis", "int", 1)], ref=ref_argmax, note="default output_type"))

    # Softmax family.
    for dt in FLOATS:
        for shape in ([4, 7], [2, 3, 5], [6]):
            add(Case("Softmax", [rand(dt, shape, lo=-4, hi=4)], ref=ref_softmax))
            add(Case("LogSoftmax", [rand(dt, shape, lo=-4, hi=4)],
                     ref=ref_log_softmax))
        for lt in INTS:
            add(Case("SparseSoftmaxCrossEntropyWithLogits",
                     [rand(dt, [5, 7], lo=-4, hi=4), rand(lt, [5], ilo=0, ihi=6)],
                     ref=ref_sscewl))
    add(Case("Softmax", [rand("float32", [7, 10], lo=-30, hi=30, layout="sharded")],
             ref=ref_softmax, note="large logits"))
    add(Case("SparseSoftmaxCrossEntropyWithLogits",
             [rand("float32", [7, 4], layout="sharded"),
              rand("int32", [7], ilo=0, ihi=3, layout="sharded")],
             ref=ref_sscewl))

    # Array ops.
    all_dts = FLOATS + INTS + ("bool",)
    for dt in all_dts:
        add(Case("Transpose", [rand(dt, [2, 3, 4])], [("perm", "ilist", [2, 0, 1])],
                 ref=ref_transpose))
    for shape, perm in (([3, 5], [1, 0]), ([2, 3, 4], [1, 0, 2]), ([], []),
                        ([2, 1, 3, 2], [3, 1, 0, 2]), ([0, 4], [1, 0])):
        add(Case("Transpose", [rand("float32", shape)], [("perm", "ilist", perm)],
                 ref=ref_transpose))
    for dt in ("float32", "bfloat16", "int64", "float64"):
        add(Case("Concat", [rand(dt, [2, 3]), rand(dt, [4, 3]), rand(dt, [1, 3])],
                 [("axis", "int", 0)], ref=ref_concat))
    add(Case("Concat", [rand("float32", [2, 3]), rand("float32", [2, 1])],
             [("axis", "int", 1)], ref=ref_concat))
    add(Case("Concat", [rand("int32", [2, 3, 2]), rand("int32", [2, 3, 1]),
                        rand("int32", [2, 3, 4])], [("axis", "int", -1)],
             ref=ref_concat))
    add(Case("Concat", [rand("float32", [2, 3]), rand("float32", [0, 3])],
             [("axis", "int", 0)], ref=ref_concat, note="zero-size piece"))
    add(Case("Concat", [rand("float16", [3, 2])], [("axis", "int", 1)],
             ref=ref_concat, note="one input"))
    add(Case("Concat", [rand("float32", [7, 2], layout="sharded"),
                        rand("float32", [7, 3], layout="sharded")],
             [("axis", "int", 1)], ref=ref_concat))
    for dt in ("float32", "int32", "bfloat16"):
        add(Case("Slice", [rand(dt, [5, 6])], [("begin", "ilist", [1, 2]),
                                               ("size", "ilist", [3, -1])],
                 ref=ref_slice))
    add(Case("Slice", [rand("float64", [4, 5, 6])],
             [("begin", "ilist", [0, 1, 2]), ("size", "ilist", [-1, 2, 3])],
             ref=ref_slice))
    add(Case("Slice", [rand("int64", [4, 5])],
             [("begin", "ilist", [2, 0]), ("size", "ilist", [0, 5])],
             ref=ref_slice, note="size 0"))
    for dt in ("float32", "float16", "int64"):
        for it in INTS:
            add(Case("Gather", [rand(dt, [5, 4]), rand(it, [3], ilo=0, ihi=4)],
                     [("axis", "int", 0)], ref=ref_gather))
    add(Case("Gather", [rand("float32", [5, 4]), rand("int64", [2, 2], ilo=0, ihi=3)],
             [("axis", "int", 1)], ref=ref_gather))
    add(Case("Gather", [rand("float64", [3, 4, 5]), rand("int32", [6], ilo=0, ihi=4)],
             [("axis", "int", -1)], ref=ref_gather))
    add(Case("Gather", [rand("float32", [5, 4]), fixed("int32", 3)],
             [("axis", "int", 0)], ref=ref_gather, note="scalar index"))
    add(Case("Gather", [rand("float32", [5, 4]), rand("int32", [0], ilo=0, ihi=4)],
             [("axis", "int", 0)], ref=ref_gather, note="no indices"))
    for it in INTS:
        add(Case("OneHot", [fixed(it, [0, 3, -1, 4, 5])], [("depth", "int", 5)],
                 ref=ref_one_hot, note="-1 and 5 are out of range"))
    add(Case("OneHot", [rand("int32", [2, 3], ilo=0, ihi=3)],
             [("depth", "int", 4), ("axis", "int", 0), ("on_value", "float", 2.5),
              ("off_value", "float", -1.0), ("dtype", "dtype", "float64")],
             ref=ref_one_hot))
    add(Case("OneHot", [rand("int64", [2, 3], ilo=0, ihi=3)],
             [("depth", "int", 3), ("axis", "int", 1), ("on_value", "float", 7.0),
              ("off_value", "float", -1.0), ("dtype", "dtype", "int32")],
             ref=ref_one_hot))
    add(Case("OneHot", [rand("int32", [4], ilo=0, ihi=9)],
             [("depth", "int", 10), ("dtype", "dtype", "bfloat16")],
             ref=ref_one_hot))
    for dt, shape, new in (("float32", [2, 3, 4], [6, 4]),
                           ("int64", [2, 3, 4], [-1, 2]),
                           ("bfloat16", [2, 3, 4], [24]),
                           ("float64", [], [1, 1]),
                           ("float32", [0, 3], [3, 0])):
        add(Case("Reshape", [rand(dt, shape)], [("shape", "ilist", new)],
                 ref=ref_reshape))

    # Larger shapes: vectorized and blocked paths, and 16-bit types that
    # must accumulate in float32 (a float16 accumulator fails these).
    for dt in FLOATS:
        add(Case("Add", [rand(dt, [67, 129]), rand(dt, [129])],
                 ref=ref_binary("Add")))
        add(Case("Mul", [rand(dt, [64, 1]), rand(dt, [1, 65])],
                 ref=ref_binary("Mul")))
        add(Case("Sub", [rand(dt, [33, 65]), rand(dt, [])],
                 ref=ref_binary("Sub"), note="scalar on the right"))
        add(Case("Sum", [rand(dt, [130, 257])], [("axis", "ilist", [0])],
                 ref=ref_reduce("Sum")))
        add(Case("Sum", [rand(dt, [130, 257])], [("axis", "ilist", [1])],
                 ref=ref_reduce("Sum")))
        add(Case("Mean", [rand(dt, [9, 1000])], [("axis", "ilist", [])],
                 ref=ref_reduce("Mean")))
        add(Case("MatMul", [rand(dt, [65, 257]), rand(dt, [257, 70])],
                 ref=ref_matmul))
        add(Case("MatMul", [rand(dt, [257, 65]), rand(dt, [33, 257])],
                 [("transpose_a", "bool", True), ("transpose_b", "bool", True)],
                 ref=ref_matmul))
        add(Case("Softmax", [rand(dt, [33, 1000], lo=-8, hi=8)],
                 ref=ref_softmax))
        add(Case("LogSoftmax", [rand(dt, [17, 999], lo=-8, hi=8)],
                 ref=ref_log_softmax))
        add(Case("Exp", [rand(dt, [1001], lo=-5, hi=5)], ref=ref_unary("Exp")))
        add(Case("Sigmoid", [rand(dt, [1001], lo=-20, hi=20)],
                 ref=ref_unary("Sigmoid")))
        add(Case("Tanh", [rand(dt, [1001], lo=-10, hi=10)],
                 ref=ref_unary("Tanh")))
    for dt in INTS:
        add(Case("Sum", [rand(dt, [130, 257], ilo=-1000, ihi=1000)],
                 [("axis", "ilist", [1])], ref=ref_reduce("Sum")))
        add(Case("Add", [rand(dt, [67, 129]), rand(dt, [67, 1])],
                 ref=ref_binary("Add")))
    add(Case("Transpose", [rand("float32", [37, 53, 3])],
             [("perm", "ilist", [1, 2, 0])], ref=ref_transpose))
    add(Case("Transpose", [rand("bfloat16", [130, 67])],
             [("perm", "ilist", [1, 0])], ref=ref_transpose))
    add(Case("BatchMatMul", [rand("float32", [4, 33, 65]),
                             rand("float32", [1, 65, 34])],
             [("adj_x", "bool", False), ("adj_y", "bool", False)],
             ref=ref_batch_matmul))
    add(Case("Cast", [rand("float32", [4097], lo=-70000, hi=70000)],
             [("DstT", "dtype", "float16")], ref=ref_cast,
             note="overflow to inf"))
    add(Case("Cast", [rand("float64", [4097], lo=-1e-6, hi=1e-6)],
             [("DstT", "dtype", "float16")], ref=ref_cast, note="subnormals"))
    add(Case("Cast", [rand("float32", [4097], lo=-3e38, hi=3e38)],
             [("DstT", "dtype", "bfloat16")], ref=ref_cast))
    # Special values. Float -> int saturates and NaN -> 0: the project's
    # contract (C would be undefined behaviour; TensorFlow is unspecified).
    specials = [np.nan, np.inf, -np.inf, 1e10, -1e10, 3.5, -3.5, 0.0, -0.0]
    for dst, lo, hi in (("int32", -2**31, 2**31 - 1),
                        ("int64", -2**63, 2**63 - 1)):
        want = np.array([0, hi, lo, min(1e10, hi), max(-1e10, lo), 3, -3, 0, 0],
                        dtype=np.int64)
        add(Case("Cast", [fixed("float32", specials)], [("DstT", "dtype", dst)],
                 ref=lambda v, dts, attrs, w=want, d=dst: [Expect(w, d)],
                 note="NaN, inf and out of range saturate"))
    for dst in ("float16", "bfloat16", "float64"):
        add(Case("Cast", [fixed("float32", specials)], [("DstT", "dtype", dst)],
                 ref=ref_cast, note="NaN and inf stay NaN and inf"))
    for dt in ("float32", "float16", "bfloat16"):
        add(Case("Exp", [fixed(dt, [10.0, 11.0, 12.0, -30.0, np.inf, -np.inf])],
                     ref=ref_unary("Exp"), note="overflow and underflow"))
        add(Case("Sqrt", [fixed(dt, [np.nan, np.inf, 0.0, 4.0])],
                 ref=ref_unary("Sqrt"), note="NaN and inf"))
        add(Case("Add", [fixed(dt, [np.nan, np.inf, -np.inf, 1.0]),
                         fixed(dt, [1.0, 1.0, 1.0, np.inf])],
                 ref=ref_binary("Add"), note="NaN and inf"))

    # ------------------------------------------------------------ errors
    # Validation errors: dev_execute must refuse them with INVALID_ARGUMENT.
    def err(op, inputs, attrs=(), expect="err_exec", ndev=3, note=""):
        add(Case(op, inputs, attrs, ndev=ndev, expect=expect, note=note))

    err("Add", [rand("float32", [3]), rand("float32", [4])], note="no broadcast")
    err("Add", [rand("float32", [2, 3]), rand("float32", [3, 2])], note="no broadcast")
    err("Add", [rand("float32", [2]), rand("float64", [2])], note="dtype mismatch")
    err("Mul", [rand("int32", [2]), rand("float32", [2])], note="dtype mismatch")
    err("MatMul", [rand("float32", [2, 3]), rand("float32", [4, 5])],
        note="inner dims")
    err("MatMul", [rand("float32", [2, 3]), rand("float16", [3, 5])],
        note="dtype mismatch")
    err("BatchMatMul", [rand("float32", [2, 2, 3]), rand("float32", [3, 3, 4])],
        note="batch dims do not broadcast")
    err("NoSuchOp", [rand("float32", [2])], note="unknown op")
    err("Sum", [rand("float32", [2, 3])], [("axis", "ilist", [2])],
        note="axis out of range")
    err("Transpose", [rand("float32", [2, 3])], [("perm", "ilist", [0, 0])],
        note="not a permutation")
    err("Concat", [rand("float32", [2, 3]), rand("float32", [2, 4])],
        [("axis", "int", 0)], note="dims differ off the axis")
    err("Concat", [rand("float32", [2, 3]), rand("int32", [2, 3])],
        [("axis", "int", 0)], note="dtype mismatch")
    err("Log", [rand("int32", [3])], note="float-only op on int32")
    err("Slice", [rand("float32", [4, 4])], [("begin", "ilist", [2, 0]),
                                             ("size", "ilist", [3, 4])],
        note="begin+size past the end")
    err("Reshape", [rand("float32", [2, 3])], [("shape", "ilist", [4, 2])],
        note="element count differs")
    err("AllReduce", [rand("float32", [6, 2], layout="sharded")],
        [("reduction", "string", "median")], note="unknown reduction")
    err("Broadcast", [rand("float32", [6, 2], layout="sharded")],
        [("root", "int", 3)], note="root outside the mesh")
    err("AllReduce", [rand("float32", [7, 2], layout="sharded")],
        [("reduction", "string", "sum")], expect="err_any",
        note="components differ in shape")
    # Data-dependent errors: reported by the kernel, stored on the outputs.
    err("Gather", [rand("float32", [5, 4]), fixed("int32", [1, 5])],
        [("axis", "int", 0)], expect="err_run", note="index out of range")
    err("Gather", [rand("float32", [5, 4]), fixed("int64", [-1, 0])],
        [("axis", "int", 0)], expect="err_run", note="negative index")
    err("Div", [fixed("int32", [1, 2]), fixed("int32", [1, 0])],
        expect="err_run", note="integer division by zero")
    err("SparseSoftmaxCrossEntropyWithLogits",
        [rand("float32", [2, 3]), fixed("int32", [0, 3])],
        expect="err_run", note="label out of range")
    # The engine must still run good ops after those.
    add(Case("Add", [rand("float32", [2, 3]), rand("float32", [3])],
             ref=ref_binary("Add"), note="after errors"))

    # ------------------------------------------------------------ collectives
    for n in (3, 4):
        for red in ("sum", "mean", "max", "min", "prod"):
            for dt in FLOATS + INTS:
                if red == "mean" and dt in INTS:
                    continue
                kw = {}
                if red == "prod":
                    kw = {"lo": 0.5, "hi": 1.5, "ilo": -2, "ihi": 2}
                add(Case("AllReduce",
                         [rand(dt, [n * 2, 3], layout="sharded", **kw)],
                         [("reduction", "string", red)], ndev=n,
                         mesh_ref=mesh_all_reduce))
        add(Case("AllReduce", [rand("float32", [5, 3])],
                 [("reduction", "string", "sum")], ndev=n,
                 mesh_ref=mesh_all_reduce, note="mirrored"))
        add(Case("AllReduce", [rand("float32", [n * 100, 37], layout="sharded")],
                 [("reduction", "string", "sum")], ndev=n,
                 mesh_ref=mesh_all_reduce))
        add(Case("AllReduce", [rand("float32", [0, 3], layout="sharded")],
                 [("reduction", "string", "sum")], ndev=n,
                 mesh_ref=mesh_all_reduce, note="zero-size"))
        for dt in ("float32", "float16", "int64", "bfloat16"):
            for root in (0, n - 1):
                add(Case("Broadcast", [rand(dt, [n * 2, 3], layout="sharded")],
                         [("root", "int", root)], ndev=n, mesh_ref=mesh_broadcast))
            add(Case("AllGather", [rand(dt, [n * 2, 3], layout="sharded")],
                     [("axis", "int", 0)], ndev=n, mesh_ref=mesh_all_gather))
            add(Case("AllGather", [rand(dt, [2, n * 3], layout="sharded", axis=1)],
                     [("axis", "int", 1)], ndev=n, mesh_ref=mesh_all_gather))
        add(Case("AllGather", [rand("float32", [2, n * 3], layout="sharded", axis=1)],
                 [("axis", "int", 0)], ndev=n, mesh_ref=mesh_all_gather,
                 note="gather along another axis than the split"))
        for red in ("sum", "mean"):
            for dt in FLOATS + (INTS if red == "sum" else ()):
                for rows in (7, n * 2, 1):
                    if dt != "float32" and rows != 7:
                        continue
                    add(Case("ReduceScatter",
                             [rand(dt, [n * rows, 2], layout="sharded")],
                             [("reduction", "string", red)], ndev=n,
                             mesh_ref=mesh_reduce_scatter))
    add(Case("AllReduce", [rand("float64", [3, 2])],
             [("reduction", "string", "sum")], ndev=1, mesh_ref=mesh_all_reduce,
             note="one device"))

    for i, c in enumerate(cases):
        c.name = "c%04d_%s" % (i, c.op)
    return cases


# --------------------------------------------------------------------------
# driver I/O

def write_inputs(cases, work):
    lines = []
    for c in cases:
        lines.append("case %s %d %s" % (c.name, c.ndev, c.op))
        for name, t, v in c.attrs:
            lines.append(manifest_attr(name, t, v))
        for k, inp in enumerate(c.inputs):
            fname = "%s.in%d.bin" % (c.name, k)
            to_storage(inp.val, inp.dt).tofile(os.path.join(work, fname))
            shape = inp.val.shape
            lay = "mirrored" if inp.layout == "mirrored" \
                else "sharded %d" % inp.axis
            lines.append("input %s %s %d %s %s" % (
                inp.dt, lay, len(shape), " ".join(str(d) for d in shape), fname))
        lines.append("end")
    path = os.path.join(work, "manifest.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


class Result:
    def __init__(self, status, code=None, msg=""):
        self.status = status  # ok | err_exec | err_run | err_setup
        self.code = code
        self.msg = msg
        self.outs = []  # list of (dtype, [(shape, file)])


def read_results(path):
    results = {}
    cur = None
    with open(path) as f:
        for line in f:
            tok = line.split()
            if not tok:
                continue
            if tok[0] == "case":
                name, status = tok[1], tok[2]
                if status == "ok":
                    cur = Result("ok")
                else:
                    msg = line.split(None, 4)[4].strip() if len(tok) > 4 else ""
                    cur = Result(status, tok[3], msg)
                results[name] = cur
            elif tok[0] == "out":
                cur.outs.append((tok[2], []))
            elif tok[0] == "comp":
                rank = int(tok[2])
                shape = tuple(int(x) for x in tok[3:3 + rank])
                cur.outs[-1][1].append((shape, tok[3 + rank]))
    return results


def load_component(work, dt, shape, fname):
    raw = np.fromfile(os.path.join(work, fname), dtype=STORAGE[dt])
    count = int(np.prod(shape)) if shape else 1
    if raw.size != count:
        raise ValueError("file %s has %d elements, shape %s wants %d"
                         % (fname, raw.size, list(shape), count))
    return from_storage(raw.reshape(shape), dt)


# --------------------------------------------------------------------------
# comparison

def compare(got, exp):
    """None if got matches exp, else a description of the worst element."""
    want = np.asarray(exp.val)
    if got.shape != want.shape:
        return "shape %s, expected %s" % (list(got.shape), list(want.shape))
    if got.size == 0:
        return None
    if exp.dt not in FLOATS:
        bad = got != want
        if not np.any(bad):
            return None
        i = np.unravel_index(np.argmax(bad), got.shape)
        return "%d of %d elements differ; at %s got %s, expected %s" % (
            int(np.sum(bad)), got.size, list(i), got[i], want[i])
    want = want.astype(np.float64)
    got = got.astype(np.float64)
    # A finite value that overflows the output dtype must come out as inf.
    with np.errstate(over="ignore", invalid="ignore"):
        q = quantize(want, exp.dt)
    want = np.where(np.isinf(q) & np.isfinite(want), q, want)
    strict = np.zeros(want.shape, dtype=bool)  # must equal q exactly
    q = want
    if exp.mode == "exact":
        tol = np.zeros(want.shape)
    elif exp.mode == "cast" or (exp.mode == "rounded" and
                                exp.dt in ("float16", "bfloat16")):
        # Correct rounding: the nearest value of the dtype, ties to even
        # (strictly: an exact midpoint is exact in float32 too); elsewhere the
        # other neighbour is accepted only within the slack.
        with np.errstate(over="ignore", invalid="ignore"):
            q = quantize(want, exp.dt)
            other = step_toward(q, want, exp.dt)
            tie = np.isfinite(want) & (q != want) & \
                (np.abs(other - want) == np.abs(q - want))
            slack = 2.0**-20 if exp.dt in ("float16", "bfloat16") else 0.0
            tol = np.abs(q - want) + slack * np.abs(want)
        tol = np.where(np.isfinite(tol), tol, 0.0)
        if exp.dt == "float16" and exp.mode == "rounded":
            tol = tol + ATOL["float16"]  # subnormal results of the f32 step
        strict = tie
    else:
        scale = np.abs(want) if exp.scale is None else \
            np.broadcast_to(np.asarray(exp.scale, dtype=np.float64), want.shape)
        tol = ATOL[exp.dt] + RTOL[exp.dt] * scale
    with np.errstate(invalid="ignore"):
        err = np.abs(got - want)
        same_special = (np.isnan(got) & np.isnan(want)) | \
            (np.isinf(want) & (got == want))
        bad = ~same_special & (~(err <= tol) | (strict & (got != q)))
    if not np.any(bad):
        return None
    excess = np.where(bad, np.nan_to_num(err / np.maximum(tol, 1e-300),
                                         nan=np.inf, posinf=np.inf), -1.0)
    i = np.unravel_index(np.argmax(excess), got.shape)
    return ("%d of %d elements out of tolerance; worst at %s: got %.10g, "
            "expected %.10g (|diff| %.3g, tol %.3g)" % (
                int(np.sum(bad)), got.size, list(i), got[i], want[i],
                err[i], tol[i]))


def check_case(c, r, work):
    """None on pass, else the reason."""
    if r is None:
        return "no result (driver stopped before this case)"
    if c.expect != "ok":
        ok_stage = {"err_exec": ("err_exec",), "err_run": ("err_run",),
                    "err_any": ("err_exec", "err_run")}[c.expect]
        if r.status in ok_stage and r.code == c.code:
            return None
        if r.status == "ok":
            return "expected %s %s, but the op succeeded" % (c.expect, c.code)
        return "expected %s %s, got %s %s: %s" % (c.expect, c.code, r.status,
                                                 r.code, r.msg)
    if r.status != "ok":
        return "%s %s: %s" % (r.status, r.code, r.msg)
    exp = c.expected()
    if len(r.outs) != len(exp):
        return "%d outputs, expected %d" % (len(r.outs), len(exp))
    for o, (dt, comps) in enumerate(r.outs):
        if dt != exp[o][0].dt:
            return "output %d has dtype %s, expected %s" % (o, dt, exp[o][0].dt)
        if len(comps) != c.ndev:
            return "output %d has %d components, expected %d" % (
                o, len(comps), c.ndev)
        for d, (shape, fname) in enumerate(comps):
            got = load_component(work, dt, shape, fname)
            why = compare(got, exp[o][d])
            if why:
                return "output %d component %d (%s): %s" % (o, d, dt, why)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", required=True, help="path to oracle_driver")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory even when all pass")
    ap.add_argument("--filter", default=None,
                    help="run only cases whose op or name contains this")
    ap.add_argument("--list", action="store_true", help="list cases and exit")
    ap.add_argument("--timeout", type=float, default=280.0)
    args = ap.parse_args()

    cases = build_cases()
    if args.filter:
        cases = [c for c in cases if args.filter in c.name or args.filter == c.op]
    if args.list:
        for c in cases:
            print(c.name, c.desc(), c.expect if c.expect != "ok" else "")
        return 0

    work = tempfile.mkdtemp(prefix="paradev-oracle-")
    manifest = write_inputs(cases, work)
    results_path = os.path.join(work, "results.txt")
    driver_failed = None
    try:
        proc = subprocess.run([args.driver, manifest, results_path, work],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=args.timeout)
        if proc.returncode != 0:
            driver_failed = "driver exited with status %d:\n%s" % (
                proc.returncode, proc.stdout.decode(errors="replace")[-4000:])
    except subprocess.TimeoutExpired:
        driver_failed = "driver timed out after %.0f s" % args.timeout
    results = read_results(results_path) if os.path.exists(results_path) else {}

    passed = failed = 0
    failing_ops = {}
    for c in cases:
        try:
            why = check_case(c, results.get(c.name), work)
        except Exception as ex:  # a malformed output file is a failure too
            why = "could not check: %r" % (ex,)
        if why is None:
            passed += 1
        else:
            failed += 1
            failing_ops[c.op] = failing_ops.get(c.op, 0) + 1
            print("FAIL %s %s\n     %s" % (c.name, c.desc(), why))
    if driver_failed:
        print("FAIL " + driver_failed)
        failed += 1
    if failing_ops:
        print("failing cases by op: " + ", ".join(
            "%s %d" % kv for kv in sorted(failing_ops.items())))
    if failed or args.keep:
        print("inputs and outputs kept in " + work)
    else:
        shutil.rmtree(work, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
