"""Graph functions on the daemon (RegisterFunction, DescribeFunction),
over libparadev's pd_function builder: explicit definitions
(FunctionDef, session.register_function) and tracing (session.function,
paradev.function, paradev.gradients).

Tracing runs the Python callable once per dtype signature with symbolic
values (Symbol) in place of its arguments; inside, session.op -- and so
the generated wrappers session.ops.NAME and the Tensor operators -- add a
node to the definition instead of running an op; concrete Tensors it reads
become hidden arguments (captures, passed at every call); the callable's
return value(s) become the outputs. The first call registers the function
(once per session); every call is one op, Execute or, pipelined, one
Enqueue item, whose outputs' dtypes and shapes come back at once.
The daemon instantiates the function per shape signature and optimizes it.

Source: TensorFlow's FunctionDef and tf.function (tracing, captures,
input_signature); tf.gradients for paradev.gradients.
"""
import inspect
import json
import re
import sys
import threading

import numpy as np

from . import _dtypes, _lib, placement
from ._cstr import cbytes
from ._lib import ffi, lib
from .errors import InvalidArgument, error_for
from .ops import ArgDef, OpDef
from .tensor import Tensor

_NULL = ffi.NULL
# The built-in passes, in pd_pass's order (include/paradev/function.h).
PASSES = ("pruning", "cse", "constant_folding", "arithmetic", "fusion",
          "buffer_planning", "cuda_graph")
_TRI = {None: 0, False: 1, True: 2}  # pd_tristate
_MIRRORING = {"AllReduce", "Broadcast", "AllGather"}
_VARYING = {"ReduceScatter", "DeviceId"}
_PKG_DIR = __file__.rsplit("/", 1)[0]

# free() for pd_describe_function's text (the C library's).
ffi.cdef("void free(void *);", override=True)
_libc = ffi.dlopen(None)

_tls = threading.local()


def active_trace():
    """The innermost trace running in this thread, or None."""
    stack = getattr(_tls, "stack", None)
    return stack[-1] if stack else None


class Spec:
    """The type of a function argument: a dtype (NumPy's, or its name) and,
    optionally, a shape the trace may use (the daemon instantiates the
    function per shape of the call's inputs whatever it says)."""

    def __init__(self, dtype, shape=None):
        self.dtype = _dtypes.from_number(_dtypes.to_number(dtype))
        self.shape = None if shape is None else tuple(int(d) for d in shape)

    def __repr__(self):
        return "paradev.Spec(%s%s)" % (
            getattr(self.dtype, "name", self.dtype),
            "" if self.shape is None else ", %s" % (self.shape,))


class FunctionDef:
    """A definition built by hand: arguments, nodes and outputs, named as
    the proto says ("arg", "node" for output 0, "node:k"), and options:

        d = paradev.FunctionDef("affine", passes={"fusion": False})
        d.arg("x", "float32"); d.arg("w", "float32")
        d.node("xw", "MatMul", ["x", "w"], transpose_b=True)
        d.output("y", "xw")
        f = session.register_function(d)   # f(x, w) calls it

    Attributes are plain Python values, converted at registration to the
    kinds the daemon's registry declares (as session.op does)."""

    def __init__(self, name, *, passes=None, max_instantiations=0):
        self.name = str(name)
        self.args = []     # (name, dtype)
        self.nodes = []    # (name, op, [inputs], {attrs})
        self.outputs = []  # (name, source)
        self.passes = {}
        for k, v in (passes or {}).items():
            self.set_pass(k, v)
        self.max_instantiations = _instantiation_cap(max_instantiations)
        self.origins = {}  # node name -> "file:line" where a trace made it
        self.output_dtypes = {}  # output name -> dtype, when known
        # output name -> True / False, or the argument indices it is
        # mirrored with (a trace's; see Symbol)
        self.output_mirrored = {}

    def arg(self, name, dtype):
        self.args.append((str(name), _dtypes.from_number(
            _dtypes.to_number(dtype))))
        return name

    def node(self, name, op, inputs=(), **attrs):
        self.nodes.append((str(name), str(op), [str(i) for i in inputs],
                           attrs))
        return name

    def output(self, name, source):
        self.outputs.append((str(name), str(source)))

    def set_pass(self, name, on):
        """on: True, False, or None (the daemon's configuration)."""
        if name not in PASSES:
            raise ValueError("unknown pass %r; expected one of %s"
                             % (name, ", ".join(PASSES)))
        if on is not None and not isinstance(on, bool):
            raise TypeError("pass %r: expected True, False or None (the "
                            "daemon's setting), got %r" % (name, on))
        self.passes[name] = on

    def __repr__(self):
        return "<paradev.FunctionDef %r: %d args, %d nodes, %d outputs>" % (
            self.name, len(self.args), len(self.nodes), len(self.outputs))


class FunctionOpDef(OpDef):
    """A registered function as session.op sees it: its arguments and
    outputs (with the dtypes and mirroring a trace found)."""

    def __init__(self, fdef):
        outs = [ArgDef(n, dtype_rule=getattr(fdef.output_dtypes.get(n),
                                             "name", "") or "")
                for n, _ in fdef.outputs]
        super().__init__(fdef.name, [ArgDef(n) for n, _ in fdef.args], outs,
                         summary="graph function %s" % fdef.name)
        self.out_mirrored = [fdef.output_mirrored.get(n, frozenset((-1,)))
                             for n, _ in fdef.outputs]


def _build(session, fdef):
    """The pd_function of `fdef`; attributes converted with the session's
    registry. The caller deletes it."""
    f = lib.pd_function_new(cbytes(fdef.name, "function name"))
    if f == _NULL:
        raise MemoryError("pd_function_new")
    a = lib.pd_attrs_new()
    st = _lib.status()
    try:
        for name, dt in fdef.args:
            lib.pd_function_add_arg(f, cbytes(name, "function argument"),
                                    _dtypes.to_number(dt))
        for name, op, inputs, attrs in fdef.nodes:
            ca = _NULL
            if attrs:
                ca = session._set_attrs(session._opdef(op), attrs, a)
            keep = [ffi.new("char[]", cbytes(i, "node input")) for i in inputs]
            arr = ffi.new("char *[]", keep) if keep else _NULL
            _lib.check(lib.pd_function_add_node(
                f, cbytes(name, "node name"), cbytes(op, "node op"), arr,
                len(keep), ca, st), st)
        for name, src in fdef.outputs:
            _lib.check(lib.pd_function_add_output(
                f, cbytes(name, "output name"), cbytes(src, "output source"),
                st), st)
        for k, v in fdef.passes.items():
            lib.pd_function_set_pass(f, PASSES.index(k), _TRI[v])
        if fdef.max_instantiations:
            lib.pd_function_set_max_instantiations(f, fdef.max_instantiations)
    except BaseException:
        lib.pd_function_delete(f)
        raise
    finally:
        lib.pd_attrs_delete(a)
    return f


def _with_origins(fdef, code, st):
    """The registration's error, with where the trace made each node the
    daemon's message names."""
    msg = ffi.string(lib.pd_status_message(st)).decode("utf-8", "replace")
    hint = ffi.string(lib.pd_status_hint(st)).decode("utf-8", "replace")
    seen = []
    for name in sorted(fdef.origins, key=len, reverse=True):
        if re.search(r"(?<![\w.])%s(?![\w])" % re.escape(name), msg) and \
                not any(name in s for s in seen):
            seen.append(name)
    if seen:
        msg += " (%s)" % "; ".join("node %s made at %s" % (n, fdef.origins[n])
                                   for n in seen)
    return error_for(code, msg, hint)


def register(session, fdef):
    """RegisterFunction of `fdef`; returns whether an identical definition
    was registered before. Installs the function's op definition in the
    session, so that session.op(fdef.name, ...) knows its outputs."""
    f = _build(session, fdef)
    try:
        already = ffi.new("bool *")
        st = _lib.status()
        with session._lock:
            session._h()
            code = lib.pd_register_function(session._s, f, already, _NULL,
                                            st)
        if code != 0:
            raise _with_origins(fdef, code, st)
    finally:
        lib.pd_function_delete(f)
    session._defs[fdef.name] = FunctionOpDef(fdef)
    return bool(already[0])


_U64 = {"hits", "misses", "evictions", "calls", "arena_bytes",
        "unplanned_bytes", "incarnation"}


def _ints(v):
    """protobuf's JSON mapping writes 64-bit integers as strings."""
    if isinstance(v, dict):
        return {k: (int(x) if k in _U64 and isinstance(x, str) and
                    x.lstrip("-").isdigit() else _ints(x))
                for k, x in v.items()}
    if isinstance(v, list):
        return [_ints(x) for x in v]
    return v


def describe(session, name):
    """DescribeFunction as a dict (the wire message, fields by their proto
    names; 64-bit counts as ints)."""
    out = ffi.new("char **")
    st = _lib.status()
    with session._lock:
        session._h()
        session._drain()
        code = lib.pd_describe_function(session._s, cbytes(name, "function"),
                                        out, _NULL, st)
    _lib.check(code, st)
    try:
        text = ffi.string(out[0]).decode("utf-8", "replace")
    finally:
        _libc.free(out[0])
    return _ints(json.loads(text))


class RegisteredFunction:
    """A function of the session, called like an op: f(*tensors) returns a
    Tensor or a tuple of them (one per output)."""

    def __init__(self, session, name, already_registered):
        self.session = session
        self.name = name
        self.already_registered = already_registered

    def __call__(self, *inputs, devices=None):
        """devices=: see Function.__call__."""
        if devices is not None:
            return self.session.op(self.name, *inputs, devices=devices)
        return self.session.op(self.name, *inputs)

    def describe(self):
        return describe(self.session, self.name)

    def __repr__(self):
        return "<paradev function %r>" % self.name


# -- tracing ---------------------------------------------------------------

class Symbol:
    """A value inside a function's trace: an argument or a node's output.
    dtype as far as the registry's rules tell it; shape only where a Spec
    gave it (None otherwise). Operators and session.op add nodes."""

    __slots__ = ("_trace", "ref", "_dtype", "_shape", "_mirrored", "_deps")

    def __init__(self, trace, ref, dtype, shape=None, mirrored=None,
                 deps=frozenset()):
        self._trace = trace
        self.ref = ref
        self._dtype = dtype
        self._shape = shape
        # True / False when the trace knows whether the value is the same
        # on every device; None: it is when the arguments in _deps (indices;
        # -1: something the daemon decides, a gradient) are
        self._mirrored = mirrored
        self._deps = deps

    @property
    def session(self):
        return self._trace.session

    @property
    def dtype(self):
        return self._dtype

    @property
    def shape(self):
        return self._shape

    def __repr__(self):
        return "<paradev.Symbol %s of %s dtype=%s>" % (
            self.ref, self._trace.fdef.name,
            getattr(self._dtype, "name", self._dtype))

    def _operand(self, other):
        if isinstance(other, (Symbol, Tensor)):
            return other
        return self._trace.constant(other, self._dtype)

    def __matmul__(self, o):
        o = self._operand(o)
        ranks = [len(s) for s in (self._shape, getattr(o, "_shape", None))
                 if s is not None]
        op = "BatchMatMul" if any(r != 2 for r in ranks) else "MatMul"
        return self.session.op(op, self, o)

    def __rmatmul__(self, o):
        return self._operand(o).__matmul__(self)

    def __bool__(self):
        raise TypeError("a symbolic value has no truth value while a "
                        "function is traced (the trace runs once); use ops "
                        "such as Select or Maximum instead of Python "
                        "branches on values")

    __hash__ = object.__hash__

    def _no_value(self, *a):
        raise TypeError("a symbolic value has no value while a function is "
                        "traced; return it from the function and read the "
                        "call's result")

    numpy = item = __array__ = __float__ = __int__ = __index__ = _no_value

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a symbolic value of unknown shape")
        return self._shape[0]


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__",
              "__rmul__", "__truediv__", "__rtruediv__", "__pow__",
              "__rpow__", "__lt__", "__gt__", "__neg__", "__pos__",
              "__abs__", "T", "transpose", "reshape", "sum", "mean",
              "_reduce", "astype", "_bin", "__getitem__", "to", "unpack"):
    setattr(Symbol, _name, Tensor.__dict__[_name])


def _instantiation_cap(n):
    """max_instantiations: an int 0 (the daemon's) .. 64."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 64:
        raise ValueError("max_instantiations: expected an int from 0 (the "
                         "daemon's, default 8) to 64, got %r" % (n,))
    return n


def combine_mirrored(values, which):
    """(mirrored, deps) of a value computed from values[i] for i in
    `which` (Tensors or Symbols; an index outside them, -1, is unknown):
    True when all are, False when one is not, else (None, the arguments
    it depends on)."""
    m, deps = True, set()
    for i in which:
        v = values[i] if 0 <= i < len(values) else None
        vm = getattr(v, "_mirrored", None)
        if vm is False:
            return False, frozenset()
        if vm is None:
            m = None
            deps |= getattr(v, "_deps", None) or {-1}
    return m, frozenset(deps) if m is None else frozenset()


def _user_frame():
    """The first frame outside the package (the user's code), or None."""
    f = sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith(_PKG_DIR):
        f = f.f_back
    return f


def _origin(f=None):
    """file:line of frame f (default: the user's code)."""
    f = f or _user_frame()
    return "%s:%d" % (f.f_code.co_filename, f.f_lineno) if f else "?"


def _captured_as(value, frame):
    """How an error names a value a trace captured: the variable of the
    user's frame bound to it (its locals, closure variables included, then
    its globals) and where it was captured."""
    name = None
    if frame is not None:
        for scope in (frame.f_locals, frame.f_globals):
            name = next((k for k, v in scope.items() if v is value), None)
            if name is not None:
                break
    what = "tensor %d" % value.id if isinstance(value, Tensor) else \
        "the array of shape %s" % (np.shape(value),)
    return "%s%s captured at %s" % (what, " (%s)" % name if name else "",
                                    _origin(frame))


class HostConstant:
    """An array a trace captured (x + np.array([...]) inside a traced
    function): its host value, uploaded mirrored on the device set of each
    call -- once per set (the upload is kept for the next call there), so
    that the function runs on any set, as its Fill nodes do."""

    __slots__ = ("value", "where", "_placed", "_lock")

    def __init__(self, value, where):
        self.value = value      # an ndarray of the node's dtype
        self.where = where      # how an error names it (_captured_as)
        self._placed = {}       # device set (a tuple) -> Tensor
        self._lock = threading.Lock()

    def on(self, session, devices):
        """The value as a mirrored tensor on `devices` (a tuple)."""
        t = self._placed.get(devices)
        if t is None or t._deleted:
            with self._lock:
                t = self._placed.get(devices)
                if t is None or t._deleted:
                    t = session.constant(self.value, devices=devices)
                    self._placed[devices] = t
        return t

    def __repr__(self):
        return "<paradev captured constant: %s, on %d device sets>" % (
            self.where, len(self._placed))


class _Trace:
    """The definition being built by one run of a traced callable."""

    def __init__(self, session, name, arg_names, specs):
        self.session = session
        self.fdef = None
        self.name = name
        self.arg_names = list(arg_names)
        self.specs = specs
        # passed after the arguments: Tensors (as they are) and
        # HostConstants (placed on the call's set); how errors name each
        self.captured = []
        self.captured_as = []
        self._captures = {}      # Tensor id (or ("host", id)) -> Symbol
        self._count = 0
        self._names = set(arg_names)

    def _fresh(self, base):
        base = re.sub(r"[^A-Za-z0-9_.]", "_", base)
        while True:
            self._count += 1
            n = "%s_%d" % (base, self._count)
            if n not in self._names:
                self._names.add(n)
                return n

    def capture(self, t):
        if t.session is not self.session:
            raise ValueError("tensor %d belongs to another session" % t.id)
        if t._deleted:
            raise ValueError("tensor %d was deleted" % t.id)
        s = self._captures.get(t.id)
        if s is None:
            n = self._fresh("capture")
            s = Symbol(self, n, t.dtype, t.shape, None,
                       frozenset((len(self.fdef.args),)))
            self.fdef.arg(n, t.dtype)
            self._captures[t.id] = s
            self.captured.append(t)
            self.captured_as.append(_captured_as(t, _user_frame()))
        return s

    def capture_host(self, hc):
        """A HostConstant as a hidden argument (mirrored: one value)."""
        key = ("host", id(hc))
        s = self._captures.get(key)
        if s is None:
            n = self._fresh("constant")
            self.fdef.arg(n, hc.value.dtype)
            s = Symbol(self, n, self.fdef.args[-1][1], hc.value.shape, True)
            self._captures[key] = s
            self.captured.append(hc)
            self.captured_as.append(hc.where)
        return s

    def constant(self, value, dtype=None):
        """A Python number as a Fill node (dtype: the other operand's);
        an array as a HostConstant (uploaded on each call's device set)."""
        if dtype is None:
            dtype = np.asarray(value).dtype
            if dtype == np.float64:
                dtype = np.dtype("float32")
        if np.ndim(value) == 0:
            return self.op("Fill", [], {"shape": (), "value": float(value),
                                        "dtype": dtype})
        f = _user_frame()
        arr = np.array(value, dtype=_dtypes.need_numpy(dtype))
        return self.capture_host(HostConstant(arr, _captured_as(value, f)))

    def _ref(self, e):
        if isinstance(e, Symbol):
            if e._trace is not self:
                raise ValueError(
                    "%r belongs to another function's trace: pass it to "
                    "this function as an argument" % e)
            return e
        if isinstance(e, Tensor):
            return self.capture(e)
        if isinstance(e, HostConstant):  # a called function's, inside
            return self.capture_host(e)
        return self.constant(e)

    def op(self, name, inputs, attrs, opdef=None):
        """Adds node `name`(inputs, attrs); returns its output Symbol(s)."""
        if opdef is None:
            opdef = self.session._opdef(name)
        syms = []
        for e in inputs:
            if isinstance(e, (list, tuple)) and not isinstance(e, Symbol):
                syms.extend(self._ref(x) for x in e)
            else:
                syms.append(self._ref(e))
        mirrored, deps = combine_mirrored(syms, range(len(syms)))
        if name in _MIRRORING:
            mirrored, deps = True, frozenset()
        elif name in _VARYING or attrs.get("per_device"):
            mirrored, deps = False, frozenset()
        node = self._fresh(name)
        self.fdef.node(node, name, [s.ref for s in syms], **attrs)
        self.fdef.origins[node] = _origin()
        dts = opdef.output_dtypes(syms, attrs)
        om = getattr(opdef, "out_mirrored", None)  # a called function's
        # a list output (Split's): as many values as its length attribute
        lengths = opdef.output_lengths(attrs) if any(
            getattr(o, "is_list", False) for o in opdef.outputs) else None
        outs = []
        for i in range(sum(lengths) if lengths else opdef.num_outputs):
            m, d = mirrored, deps
            if om:
                m, d = (om[i], frozenset()) if isinstance(om[i], bool) \
                    else combine_mirrored(syms, om[i])
            outs.append(Symbol(self, node if i == 0 else "%s:%d" % (node, i),
                               dts[i] if i < len(dts) else None, None, m, d))
        if lengths is not None:
            from .session import _group_outputs
            return _group_outputs(opdef, lengths, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def run(self, fn, passes, max_instantiations):
        self.fdef = FunctionDef(self.name, passes=passes,
                                max_instantiations=max_instantiations)
        args = []
        for i, (n, spec) in enumerate(zip(self.arg_names, self.specs)):
            self.fdef.arg(n, spec.dtype)
            args.append(Symbol(self, n, spec.dtype, spec.shape, None,
                               frozenset((i,))))
        stack = _tls.__dict__.setdefault("stack", [])
        stack.append(self)
        try:
            result = fn(*args)
        finally:
            stack.pop()
        return self._outputs(result)

    def _outputs(self, result):
        """Records the outputs; returns how to rebuild the result's form."""
        if isinstance(result, dict):
            form, items = ("dict", list(result)), list(result.items())
        elif isinstance(result, (tuple, list)):
            form = (type(result).__name__, len(result))
            items = [("output_%d" % i, v) for i, v in enumerate(result)]
        elif result is None:
            raise ValueError("function %s returned None: return the values "
                             "it computes (a value, a tuple, a list or a "
                             "dict of them)" % self.name)
        else:
            form, items = ("single", 1), [("output", result)]
        stack = _tls.__dict__.setdefault("stack", [])
        stack.append(self)  # a returned number becomes a node
        try:
            for k, v in items:
                s = self._ref(v)
                self.fdef.output(str(k), s.ref)
                self.fdef.output_dtypes[str(k)] = s._dtype
                self.fdef.output_mirrored[str(k)] = s._mirrored if \
                    s._mirrored is not None else s._deps
        finally:
            stack.pop()
        return form


def _rebuild(form, outs):
    if not isinstance(outs, tuple):
        outs = (outs,)
    kind, arg = form
    if kind == "single":
        return outs[0]
    if kind == "dict":
        return dict(zip(arg, outs))
    return list(outs) if kind == "list" else tuple(outs)


class _Concrete:
    __slots__ = ("name", "captured", "captured_as", "form", "n_args")


class Function:
    """A traced function of one session (session.function): called with
    Tensors (or symbolic values inside another function's trace), it traces
    `fn` once per dtype signature, registers the definition on the first
    call and then runs it as one op per call.

    input_signature: a list of paradev.Spec, one per argument (else the
    dtypes of the first call's tensors); passes: {pass name: bool}
    (PASSES); max_instantiations: the daemon's cache cap for it (0: its
    default); name: the function's name in the session (default: the
    callable's)."""

    def __init__(self, session, fn, *, name=None, input_signature=None,
                 passes=None, max_instantiations=0):
        self.session = session
        self.fn = fn
        base = name or getattr(fn, "__name__", "function")
        self.name = re.sub(r"[^A-Za-z0-9_.]", "_", base) or "function"
        self.input_signature = None if input_signature is None else [
            s if isinstance(s, Spec) else Spec(s) for s in input_signature]
        self.passes = dict(passes or {})
        for k in self.passes:
            if k not in PASSES:
                raise ValueError("unknown pass %r; expected one of %s"
                                 % (k, ", ".join(PASSES)))
            v = self.passes[k]
            if v is not None and not isinstance(v, bool):
                raise TypeError("pass %r: expected True, False or None (the "
                                "daemon's setting), got %r" % (k, v))
        self.max_instantiations = _instantiation_cap(max_instantiations)
        self._concrete = {}
        self._lock = threading.RLock()
        self._tracing = set()  # signatures being traced (no recursion)
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            params = []
        self._params = [p.name for p in params
                        if p.kind in (p.POSITIONAL_ONLY,
                                      p.POSITIONAL_OR_KEYWORD)]
        self._varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
        self.__doc__ = getattr(fn, "__doc__", None)

    def __repr__(self):
        return "<paradev.Function %r of %r, %d traced>" % (
            self.name, self.session, len(self._concrete))

    @property
    def function_names(self):
        """The names registered for it, one per dtype signature traced."""
        return [c.name for c in self._concrete.values()]

    def _specs(self, args):
        if self.input_signature is not None:
            if len(args) != len(self.input_signature):
                raise TypeError("%s takes %d arguments (its input_signature)"
                                ", got %d" % (self.name,
                                              len(self.input_signature),
                                              len(args)))
            for i, (a, s) in enumerate(zip(args, self.input_signature)):
                dt = getattr(a, "_dtype", None)
                if isinstance(a, (Tensor, Symbol)) and dt is not None and \
                        dt != s.dtype:
                    raise TypeError("%s: argument %d is %s, its "
                                    "input_signature says %s" % (
                                        self.name, i, dt.name, s.dtype.name))
            return self.input_signature
        specs = []
        for i, a in enumerate(args):
            if isinstance(a, (Tensor, Symbol)):
                if a.dtype is None:
                    raise TypeError("%s: the dtype of argument %d is not "
                                    "known; give an input_signature"
                                    % (self.name, i))
                specs.append(Spec(a.dtype))
            else:
                specs.append(Spec(np.asarray(a).dtype
                                  if not isinstance(a, float) else "float32"))
        return specs

    def _arg_names(self, n):
        names = self._params[:n] if len(self._params) >= n or \
            self._varargs else None
        if names is None:
            raise TypeError("%s takes %d positional arguments, got %d"
                            % (self.name, len(self._params), n))
        names = names + ["arg_%d" % i for i in range(len(names), n)]
        return [re.sub(r"[^A-Za-z0-9_.]", "_", x) for x in names]

    def get_concrete(self, *args):
        """Traces and registers for the dtypes of `args` (once); with an
        input_signature and no args, for the signature's."""
        if not args and self.input_signature:
            args = (None,) * len(self.input_signature)
        specs = self._specs(args)
        key = tuple(_dtypes.to_number(s.dtype) for s in specs)
        c = self._concrete.get(key)
        if c is not None:
            return c, specs
        with self._lock:
            c = self._concrete.get(key)
            if c is not None:
                return c, specs
            if key in self._tracing:
                raise ValueError("%s calls itself while it is traced: graph "
                                 "functions cannot recurse" % self.name)
            self._tracing.add(key)
            base = self.name
            table = self.session.ops._table()
            if table and base in table:  # a function may not shadow an op
                base += "_fn"
            name = base if not self._concrete else "%s_%d" % (
                base, len(self._concrete) + 1)
            try:
                tr = _Trace(self.session, name, self._arg_names(len(args)),
                            specs)
                form = tr.run(self.fn, self.passes, self.max_instantiations)
                register(self.session, tr.fdef)
            finally:
                self._tracing.discard(key)
            c = _Concrete()
            c.name, c.captured, c.form = name, tr.captured, form
            c.captured_as = tr.captured_as
            c.n_args = len(args)
            self._concrete[key] = c
        return c, specs

    def definition(self, *args):
        """The FunctionDef traced for these arguments' dtypes."""
        return self.get_concrete(*args)[0]

    def __call__(self, *args, devices=None):
        """One call of the function (one op). It runs on the device set of
        its tensor arguments; a function without them on devices=[...]
        (default: the session's devices; with tensor arguments, naming
        another set is paradev.InvalidArgument). Host values among the
        arguments and arrays the trace captured are uploaded mirrored on
        that set (a captured array once per set); a captured Tensor keeps
        its own set, and one on another set than the call's is
        paradev.InvalidArgument naming it."""
        c, specs = self.get_concrete(*args)
        s = self.session
        tr = active_trace()
        inner = tr is not None and tr.session is s
        if inner and devices is not None:
            raise ValueError("%s(devices=...) inside another function's "
                             "trace: a node runs where the outer call "
                             "runs; place that call" % self.name)
        where, agree = None, True
        if not inner:
            where, agree = self._call_set(args, devices, c)
        ins = []
        for a, spec in zip(args, specs):
            if isinstance(a, (Tensor, Symbol)) or inner:
                ins.append(a)
            else:
                ins.append(s.constant(a, dtype=_dtypes.need_numpy(spec.dtype),
                                      devices=where))
        for cap, what in zip(c.captured, c.captured_as):
            if inner:
                ins.append(cap)
            elif isinstance(cap, HostConstant):
                ins.append(cap.on(s, where))
            else:
                if agree and cap.devices != where:
                    raise InvalidArgument(
                        "%s: the function uses %s, which is on devices %s, "
                        "but the call runs on devices %s (a call runs on "
                        "one device set; a captured tensor keeps its own): "
                        "move it with tensor.to(%s) and pass it as an "
                        "argument" % (c.name, what, list(cap.devices),
                                      list(where), list(where)))
                ins.append(cap)
        if inner:
            return _rebuild(c.form, tr.op(c.name, ins, {}))
        if devices is not None:
            return _rebuild(c.form, s.op(c.name, *ins, devices=devices))
        return _rebuild(c.form, s.op(c.name, *ins))

    def _call_set(self, args, devices, c):
        """(the call's device set, whether its tensors agree on it): its
        tensor arguments', else devices= (checked), else its captured
        tensors', else the session's."""
        sets = [a.devices for a in args if isinstance(a, Tensor)]
        if sets:
            return sets[0], all(d == sets[0] for d in sets)
        if devices is not None:
            return placement.normalize(devices, "%s: devices" % c.name,
                                       self.session.client), True
        caps = [t.devices for t in c.captured if isinstance(t, Tensor)]
        if caps:  # a function without arguments runs where they are
            return caps[0], True  # one on another set is named below
        return self.session.devices, True

    def describe(self, *args):
        """DescribeFunction of the last traced signature (or of the one
        for `args`' dtypes)."""
        if args:
            return describe(self.session, self.get_concrete(*args)[0].name)
        if not self._concrete:
            raise ValueError("%s has not been called yet (nothing is "
                             "registered)" % self.name)
        return describe(self.session, list(self._concrete.values())[-1].name)


def function(session, fn=None, **options):
    """paradev.function(session)(fn), or @paradev.function(session,
    passes=...): a traced Function of `session` (see Function)."""
    if fn is None:
        return lambda f: Function(session, f, **options)
    return Function(session, fn, **options)


def gradients(y, xs, grad_y=None):
    """Inside a traced function: the Gradients node, tf.gradients(y, xs,
    grad_ys) with one target: d(sum(y * grad_y))/d(x) for each x (grad_y
    default: ones like y); a list (or one value when xs is one). Zeros for
    an x that y does not depend on."""
    tr = active_trace()
    if tr is not None and isinstance(y, (list, tuple)):
        raise ValueError("paradev.gradients takes one target y (a value of "
                         "the traced function), got a %s of %d; sum the "
                         "targets first (tf.gradients sums them too)"
                         % (type(y).__name__, len(y)))
    if tr is None or not isinstance(y, Symbol):
        raise ValueError("paradev.gradients works inside a traced function "
                         "(session.function); eagerly, use session.tape()")
    single = not isinstance(xs, (list, tuple))
    xs = [xs] if single else list(xs)
    xsyms = [tr._ref(x) for x in xs]
    ins = [y] + xsyms
    attrs = {}
    if grad_y is not None:
        ins.append(grad_y)
        attrs["has_grad_y"] = True
    d = OpDef("Gradients", outputs=[ArgDef("g%d" % i) for i in range(len(xs))],
              known=False)
    outs = tr.op("Gradients", ins, attrs, opdef=d)
    if not isinstance(outs, tuple):
        outs = (outs,)
    for o, x in zip(outs, xsyms):
        o._dtype, o._shape = x._dtype, x._shape
        o._mirrored, o._deps = None, frozenset((-1,))
    return outs[0] if single else list(outs)
