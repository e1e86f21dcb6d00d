"""The op registry, as the daemon describes it (ListOps, pd_list_ops), and
the wrappers generated from it: session.ops.MatMul(a, b, transpose_b=True)
with the registry's summary, arguments and attributes as its docstring.

Attributes given to session.op are converted to the kind the registry
declares (a tuple for a `shape`, an int for an int-list axis, a NumPy dtype
or its name for a dtype). A daemon older than ListOps (UNIMPLEMENTED), or a
libparadev without pd_list_ops, leaves the package with a minimal table:
one output per op (two for SparseSoftmaxCrossEntropyWithLogits) and kinds
guessed from the Python values.
"""
import inspect
import keyword
import threading

import numpy as np

from . import _dtypes, _lib
from ._lib import ffi, lib

_KINDS = {1: "int", 2: "float", 3: "bool", 4: "string", 5: "dtype",
          6: "shape", 7: "int_list", 8: "float_list"}
_KIND_DOC = {"int": "int", "float": "float", "bool": "bool",
             "string": "str", "dtype": "dtype", "shape": "shape (ints)",
             "int_list": "list of int", "float_list": "list of float"}
_DTYPE_ATTRS = {"dtype", "DstT", "SrcT", "T", "out_type", "output_type",
                "Tidx"}


class AttrDef:
    __slots__ = ("name", "kind", "has_default", "default", "doc", "minimum",
                 "maximum", "allowed")

    def __init__(self, name, kind, has_default=True, default=None, doc="",
                 minimum=None, maximum=None, allowed=()):
        self.name, self.kind, self.has_default = name, kind, has_default
        self.default, self.doc = default, doc
        self.minimum, self.maximum, self.allowed = minimum, maximum, allowed


class ArgDef:
    __slots__ = ("name", "is_list", "dtypes", "dtype_rule", "doc",
                 "length_attr")

    def __init__(self, name, is_list=False, dtypes=(), dtype_rule="", doc="",
                 length_attr=""):
        self.name, self.is_list, self.dtypes = name, is_list, dtypes
        self.dtype_rule, self.doc = dtype_rule, doc
        # a list output: the attribute giving its length ("num_split")
        self.length_attr = length_attr


class OpDef:
    """One op of the registry (pd_op_info)."""

    out_mirrored = None  # a graph function's: per output, what its trace knew

    def __init__(self, name, inputs=(), outputs=("output",), attrs=(),
                 summary="", notes="", has_gradient=False,
                 is_collective=False, known=True):
        self.name = name
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attrs = {a.name: a for a in attrs}
        self.summary, self.notes = summary, notes
        self.has_gradient, self.is_collective = has_gradient, is_collective
        self.known = known
        self._rules = None

    @property
    def num_outputs(self):
        """The number of output arguments (a list output counts once; see
        output_lengths for the flattened count)."""
        return len(self.outputs)

    def output_lengths(self, attrs):
        """How many tensors each output argument yields for these
        attributes (TFE_OpGetOutputLength): 1, or for a list output the
        value of its length attribute (an int: Split's num_split, Unpack's
        num) or that list's length (SplitV's size_splits)."""
        out = []
        for o in self.outputs:
            if not getattr(o, "is_list", False):
                out.append(1)
                continue
            name = getattr(o, "length_attr", "")
            v = attrs.get(name)
            if v is None and name in self.attrs:
                v = self.attrs[name].default
            if v is None:
                raise TypeError("%s: attribute %r is required (it gives the "
                                "number of outputs of %r)"
                                % (self.name, name, o.name))
            out.append(len(v) if isinstance(v, (list, tuple)) else int(v))
        return out

    def output_dtypes(self, inputs, attrs):
        """The outputs' dtypes as far as the registry's dtype rules tell
        them without the daemon ("same as x", "the attribute DstT",
        "bool"); None where they do not. `inputs`: the flattened input
        Tensors."""
        rules = self._rules
        if rules is None:
            rules = self._rules = [self._rule(o) for o in self.outputs]
        lengths = self.output_lengths(attrs) if any(
            getattr(o, "is_list", False) for o in self.outputs) else None
        out = []
        for j, (kind, arg) in enumerate(rules):
            dt = None
            if kind == "input" and arg < len(inputs):
                dt = inputs[arg]._dtype
            elif kind == "attr":
                v = attrs.get(arg)
                if v is None and arg in self.attrs:
                    v = self.attrs[arg].default
                if v is not None:
                    try:
                        dt = _dtypes.from_number(_dtypes.to_number(v))
                    except TypeError:
                        dt = None
            elif kind == "fixed":
                dt = arg
            if lengths is None:
                out.append(dt)
            else:
                out.extend([dt] * lengths[j])
        return out

    def _rule(self, o):
        rule = getattr(o, "dtype_rule", "") or ""
        if rule.startswith("same as "):
            name = rule[len("same as "):]
            for k, a in enumerate(self.inputs):
                if a.name == name:
                    # the flattened index, when no list comes before it
                    if any(b.is_list for b in self.inputs[:k]):
                        return (None, None)
                    return ("input", k)
        elif rule.startswith("the attribute "):
            return ("attr", rule[len("the attribute "):])
        elif rule in _dtypes._BY_NAME:
            return ("fixed", _dtypes.from_number(_dtypes._BY_NAME[rule]))
        return (None, None)

    def attr_kind(self, name, value):
        a = self.attrs.get(name)
        if a is not None:
            return a.kind
        return guess_kind(name, value)

    def doc(self):
        lines = [self.summary or self.name, ""]
        if self.inputs:
            lines.append("Inputs:")
            for a in self.inputs:
                lines.append("  %s%s: %s%s" % (
                    a.name, " (list)" if a.is_list else "",
                    ", ".join(a.dtypes) or "any dtype",
                    "; " + a.doc if a.doc else ""))
        lines.append("Outputs:")
        for a in self.outputs:
            nm = a.name if isinstance(a, ArgDef) else a
            if isinstance(a, ArgDef) and a.is_list:
                nm += " (a list of %s)" % (a.length_attr or "several")
            lines.append("  %s" % nm + (": " + a.doc if isinstance(a, ArgDef)
                                        and a.doc else ""))
        if self.attrs:
            lines.append("Attributes:")
            for a in self.attrs.values():
                d = "" if not a.has_default else " = %r" % (a.default,)
                lines.append("  %s (%s)%s%s" % (a.name, _KIND_DOC.get(
                    a.kind, a.kind), d, ": " + a.doc if a.doc else ""))
        lines.append("Gradient on a tape: %s." % ("yes" if self.has_gradient
                                                 else "no"))
        if self.notes:
            lines += ["", self.notes]
        return "\n".join(lines)


def guess_kind(name, value):
    """The attribute kind of a Python value, for ops the registry does not
    describe."""
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "float"
    if isinstance(value, str):
        if name in _DTYPE_ATTRS and value in _dtypes._BY_NAME:
            return "dtype"
        return "string"
    if isinstance(value, (np.dtype, type)) or value is _dtypes.bfloat16:
        return "dtype"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) for v in value):
            return "int_list"
        return "float_list"
    return "unknown"


# What the package knows without ListOps: kinds of attributes a Python value
# does not tell (an int for an int-list axis; a tuple for a shape).
_FALLBACK_KINDS = {
    "Fill": {"shape": "shape", "value": "float"},
    "RandomNormal": {"shape": "shape", "stddev": "float", "mean": "float"},
    "RandomUniform": {"shape": "shape"},
    **{op: {"axis": "int_list"} for op in ("Sum", "Mean", "Max", "Min",
                                           "Prod")},
}


_FALLBACKS = {}


def _fallback(name):
    d = _FALLBACKS.get(name)
    if d is None:
        d = _FALLBACKS[name] = _make_fallback(name)
    return d


def _make_fallback(name):
    outs = ("loss", "backprop") if name == \
        "SparseSoftmaxCrossEntropyWithLogits" else ("output",)
    kinds = _FALLBACK_KINDS.get(name, {})
    return OpDef(name, outputs=outs, known=False,
                 attrs=[AttrDef(k, v) for k, v in kinds.items()],
                 summary="%s (the daemon did not describe it: ListOps is "
                 "not available)" % name)


def _s(p):
    return ffi.string(p).decode("utf-8", "replace") if p != ffi.NULL else ""


def _dtype_names(bits):
    return [_dtypes.from_number(n).name for n in range(1, 9)
            if bits & (1 << n) and _dtypes.from_number(n) is not None]


def _value(v):
    k = _KINDS.get(v.kind)
    if k == "int":
        return v.i
    if k == "float":
        return v.f
    if k == "bool":
        return bool(v.b)
    if k == "string":
        return _s(v.s)
    if k == "dtype":
        d = _dtypes.from_number(v.dtype)
        return getattr(d, "name", None)
    if k in ("shape", "int_list"):
        return [v.ints[i] for i in range(v.n)]
    if k == "float_list":
        return [v.floats[i] for i in range(v.n)]
    return None


def _arg(a):
    return ArgDef(_s(a.name), bool(a.is_list), _dtype_names(a.dtypes),
                  _s(a.dtype_rule), _s(a.doc), _s(a.length_attr))


def _from_info(o):
    attrs = []
    for j in range(o.num_attrs):
        a = o.attrs[j]
        attrs.append(AttrDef(
            _s(a.name), _KINDS.get(a.kind, "unknown"), bool(a.has_default),
            _value(a.default_value) if a.has_default else None, _s(a.doc),
            a.minimum if a.has_minimum else None,
            a.maximum if a.has_maximum else None,
            tuple(_s(a.allowed_values[k])
                  for k in range(a.num_allowed_values))))
    return OpDef(_s(o.name), [_arg(o.inputs[j]) for j in range(o.num_inputs)],
                 [_arg(o.outputs[j]) for j in range(o.num_outputs)], attrs,
                 _s(o.summary), _s(o.notes), bool(o.has_gradient),
                 bool(o.is_collective))


def list_ops(client):
    """Every op the daemon's registry holds, {name: OpDef}; None when the
    daemon or the library has no ListOps."""
    try:
        fn = lib.pd_list_ops
    except AttributeError:
        return None
    out = ffi.new("pd_op_info **")
    n = ffi.new("int *")
    st = _lib.status()
    code = fn(client._handle(), ffi.NULL, out, n, ffi.NULL, st)
    if code == 12:  # UNIMPLEMENTED: an older daemon
        return None
    _lib.check(code, st)
    try:
        return {d.name: d for d in (_from_info(out[0][i])
                                    for i in range(n[0]))}
    finally:
        lib.pd_ops_free(out[0], n[0])


_registry_lock = threading.Lock()


def registry(client):
    """The client's op table, asked for once."""
    r = getattr(client, "_ops_registry", False)
    if r is False:
        with _registry_lock:
            r = getattr(client, "_ops_registry", False)
            if r is False:
                r = list_ops(client)
                client._ops_registry = r
    return r


def _pyname(n):
    return n + "_" if keyword.iskeyword(n) else n


def _default(a):
    v = a.default
    return tuple(v) if isinstance(v, list) else v


_PLACED_DOC = ("\n\ndevices: where the op runs (a list of device indices "
               "or names; None: the session's devices).")


def attr_names_of(d):
    return {_pyname(a.name) for a in d.attrs.values()}


def _make_wrapper(session, d):
    if not d.known:
        def generic(*inputs, **attrs):
            return session.op(d.name, *inputs, **attrs)
        generic.__name__ = generic.__qualname__ = d.name
        generic.__doc__ = d.doc()
        return generic
    params = []
    for a in d.inputs:
        if a.is_list:
            params.append(inspect.Parameter(_pyname(a.name),
                                            inspect.Parameter.VAR_POSITIONAL))
        else:
            params.append(inspect.Parameter(
                _pyname(a.name), inspect.Parameter.POSITIONAL_OR_KEYWORD))
    for a in d.attrs.values():
        params.append(inspect.Parameter(
            _pyname(a.name), inspect.Parameter.KEYWORD_ONLY,
            default=_default(a) if a.has_default else
            inspect.Parameter.empty))
    # the placement (issue #17), unless an attribute has the name
    # (CopyToDevices' target): devices= then is that attribute
    placed = "devices" not in attr_names_of(d) and \
        all(_pyname(a.name) != "devices" for a in d.inputs)
    if placed:
        params.append(inspect.Parameter("devices",
                                        inspect.Parameter.KEYWORD_ONLY,
                                        default=None))
    sig = inspect.Signature(params)
    in_names = [(_pyname(a.name), a.is_list) for a in d.inputs]
    attr_names = {_pyname(a.name): a.name for a in d.attrs.values()}

    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        ins = []
        for nm, is_list in in_names:
            v = bound.arguments.get(nm, ())
            if is_list:
                if len(v) == 1 and isinstance(v[0], (list, tuple)):
                    v = v[0]
                ins.extend(v)
            else:
                ins.append(v)
        # only the attributes given: the daemon fills in the defaults
        attrs = {attr_names[k]: v for k, v in bound.arguments.items()
                 if k in attr_names}
        if placed and bound.arguments.get("devices") is not None:
            attrs["devices"] = bound.arguments["devices"]
        return session.op(d.name, *ins, **attrs)

    wrapper.__name__ = wrapper.__qualname__ = d.name
    wrapper.__signature__ = sig
    wrapper.__doc__ = d.doc() + (_PLACED_DOC if placed and not d.inputs
                                 else "")
    return wrapper


class Ops:
    """session.ops: one wrapper per op of the daemon's registry, made on
    first use (dir(session.ops) lists them)."""

    def __init__(self, session):
        self._session = session
        self._wrappers = {}

    def _table(self):
        return registry(self._session.client)

    def _def(self, name):
        t = self._table()
        if t is None:
            return _fallback(name)
        d = t.get(name)
        if d is None:
            # The daemon will refuse it with its own message
            return _fallback(name)
        return d

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        w = self._wrappers.get(name)
        if w is not None:
            return w
        t = self._table()
        if t is None:
            d = _fallback(name)
        else:
            d = t.get(name)
            if d is None:
                raise AttributeError(
                    "the daemon has no op %r (dir(session.ops) lists them)"
                    % name)
        w = self._wrappers[name] = _make_wrapper(self._session, d)
        return w

    def __dir__(self):
        t = self._table()
        return sorted(t) if t else []

    def __getitem__(self, name):
        return getattr(self, name)
