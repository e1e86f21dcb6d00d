"""Tensor: a handle of a parallel tensor on the daemon, with NumPy interop
and operators that run ops (a + b is the op Add, a @ b MatMul, ...)."""
import numbers

import numpy as np

from . import layouts
from ._dtypes import need_numpy
from .errors import InvalidArgument


class Tensor:
    """A parallel tensor of a session: one component per device of its
    device set (`devices`, daemon device indices in component order).

    dtype: a NumPy dtype (bfloat16: ml_dtypes', or a placeholder without it);
    shape: a tuple, -1 on axes where the components differ. Both come from
    the daemon's shape inference, without waiting for the devices (for an op
    queued in pipelined mode, on first use).

    The handle is deleted on the daemon by delete(), or when the object is
    collected (batched: queued, and sent with the session's next call).
    """

    __slots__ = ("session", "id", "_dtype", "_shape", "_mirrored",
                 "_devices", "_deleted", "_ready", "__weakref__")
    __array_priority__ = 1000  # ndarray + Tensor -> Tensor.__radd__

    def __init__(self, session, id, dtype, shape, mirrored, devices=None):
        self.session = session
        self.id = id
        self._dtype = dtype
        self._shape = shape
        self._mirrored = mirrored
        self._devices = devices  # None: ask the daemon on first use
        self._deleted = False
        self._ready = False  # known computed (a download waited for it)

    # -- metadata ----------------------------------------------------------
    @property
    def dtype(self):
        if self._dtype is None:
            self.session._fetch_meta(self)
        return self._dtype

    @property
    def shape(self):
        if self._shape is None:
            self.session._fetch_meta(self)
        return self._shape

    @property
    def devices(self):
        """The tensor's device set: a tuple of daemon device indices,
        component i on devices[i] (issue #17). An op runs on its inputs'
        set; move a value with session.pack, tensor.unpack or tensor.to."""
        if self._devices is None:
            self.session._fetch_meta(self)
        return self._devices

    @property
    def num_components(self):
        """Components of the tensor: the size of its device set."""
        return len(self.devices)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def rank(self):
        return len(self.shape)

    @property
    def size(self):
        """Elements of the overall shape (None where components differ)."""
        if any(d < 0 for d in self.shape):
            return None
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def is_mirrored(self):
        """True when the client knows every component holds the same value
        (a mirrored upload, an AllReduce, ops on mirrored inputs); False
        when it knows they may differ (a sharded or per-component upload,
        what is computed from one); None when it cannot tell (a gradient).
        A tensor on one device is always mirrored: it has one component."""
        if self._devices is not None and len(self._devices) == 1:
            return True
        return self._mirrored

    def __repr__(self):
        if self._deleted:
            return "<paradev.Tensor id=%d deleted>" % self.id
        return "<paradev.Tensor id=%d dtype=%s shape=%s devices=%s%s>" % (
            self.id, getattr(self.dtype, "name", self.dtype), self.shape,
            list(self.devices), " mirrored" if self._mirrored else "")

    def __len__(self):
        s = _known_shape(self, "len()")
        if not s:
            raise TypeError("len() of a rank-0 tensor")
        return s[0]

    # -- lifetime ----------------------------------------------------------
    def delete(self):
        """Drops the handle on the daemon now (batched with the session's
        next call). Using the tensor afterwards is an error."""
        if not self._deleted:
            self._deleted = True
            self.session._queue_delete(self.id)

    def __del__(self):
        try:
            if not self._deleted:
                self._deleted = True
                self.session._queue_delete(self.id)
        except Exception:
            pass

    # -- waiting, reading --------------------------------------------------
    def wait(self):
        """Waits until the tensor is computed; raises the error stored on it
        (paradev.Error subclasses)."""
        self.session.sync([self])
        return self

    def describe(self):
        """dtype, overall shape, per-component shapes, bytes, readiness and
        the stored error, without waiting (Describe)."""
        return self.session.describe([self])[0]

    def numpy(self, layout, out=None, *, timeout=None):
        """Downloads the value (waiting until it is computed) as layout says:
        paradev.mirrored() (component 0; the value when mirrored),
        paradev.component(k), paradev.concat(axis), or
        paradev.per_component() (a list of arrays, one per device of the
        tensor's set, in the order of tensor.devices).
        out: an array of the right dtype and shape (C-contiguous) to write
        into instead of a fresh one (not for per_component). timeout:
        seconds (None: the client's), past which paradev.DeadlineExceeded
        is raised."""
        if out is not None and layout.kind == layouts.PER_COMPONENT:
            raise ValueError("out= is for one array; per_component() "
                             "downloads a list")
        return self.session.download(self, layout, out, timeout=timeout)

    def __array__(self, dtype=None, copy=None):
        """np.asarray(tensor): the value, when one array is unambiguous.
        A tensor known to differ between components (sharded or
        per-component uploads and what is computed from them) raises
        ValueError naming the layouts to pass to numpy(); where the client
        cannot tell (a gradient, an op on mixed inputs) the daemon decides:
        it refuses a MIRRORED read of a tensor it knows is not mirrored."""
        if copy is False:
            raise ValueError("a paradev.Tensor cannot be viewed without a "
                             "copy: its value lives on the daemon")
        if self.is_mirrored is False:
            raise ValueError(self._not_mirrored())
        try:
            a = self.session.download(self, layouts.mirrored())
        except InvalidArgument as e:
            if self.is_mirrored is True or "MIRRORED" not in e.message:
                raise
            raise ValueError(self._not_mirrored() + " (the daemon: %s)"
                             % e.message) from e
        if dtype is not None:
            a = a.astype(dtype, copy=False)
        return a

    def _not_mirrored(self):
        return ("np.asarray(tensor) needs a mirrored tensor; tensor %d "
                "(shape %s) may differ between its %d components: say which "
                "value you want with tensor.numpy(paradev.concat(axis)), "
                "tensor.numpy(paradev.component(k)) or "
                "tensor.numpy(paradev.per_component())"
                % (self.id, self.shape, len(self.devices)))

    def item(self):
        return np.asarray(self).item()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __index__(self):
        return int(self.item())

    # -- placement (issue #17) ---------------------------------------------
    def unpack(self):
        """ParallelUnpack: the tensor's components as single-device tensors,
        one per device of its set (a list, in the order of tensor.devices),
        sharing the components' buffers (no copy). Differentiable on a
        tape (its gradient is a pack). Inverse: session.pack."""
        return self.session.unpack(self)

    def to(self, devices):
        """CopyToDevices: a copy of the tensor on another device set
        (`devices`: indices or names, as client.info() shows them). Same
        size: component i goes to devices[i]; a tensor on one device (or a
        mirrored one) is replicated to every device of the new set; any
        other change of size is paradev.InvalidArgument. Differentiable on
        a tape (its gradient is a copy back, summed when replicated)."""
        return self.session._copy_to(self, devices)

    # -- operators -> ops --------------------------------------------------
    def _operand(self, other):
        if isinstance(other, Tensor):
            return other
        return self.session.constant(other, dtype=need_numpy(self.dtype),
                                     devices=self.devices)

    def _bin(self, op, other, reverse=False):
        o = self._operand(other)
        return self.session.op(op, o, self) if reverse else \
            self.session.op(op, self, o)

    def __add__(self, o): return self._bin("Add", o)
    def __radd__(self, o): return self._bin("Add", o, True)
    def __sub__(self, o): return self._bin("Sub", o)
    def __rsub__(self, o): return self._bin("Sub", o, True)
    def __mul__(self, o): return self._bin("Mul", o)
    def __rmul__(self, o): return self._bin("Mul", o, True)
    def __truediv__(self, o): return self._bin("Div", o)
    def __rtruediv__(self, o): return self._bin("Div", o, True)
    def __pow__(self, o): return self._bin("Pow", o)
    def __rpow__(self, o): return self._bin("Pow", o, True)

    def __matmul__(self, o):
        o = self._operand(o)
        op = "MatMul" if len(self.shape) == 2 and len(o.shape) == 2 \
            else "BatchMatMul"
        return self.session.op(op, self, o)

    def __rmatmul__(self, o):
        return self._operand(o).__matmul__(self)

    def __lt__(self, o): return self._bin("Less", o)
    def __gt__(self, o): return self._bin("Greater", o)

    def __neg__(self):
        return self.session.op("Neg", self)

    def __pos__(self):
        return self

    def __abs__(self):
        return self.session.op("Abs", self)

    @property
    def T(self):
        return self.transpose()

    def transpose(self, *perm):
        if len(perm) == 1 and isinstance(perm[0], (list, tuple)):
            perm = perm[0]
        if not perm:
            perm = tuple(range(len(_known_shape(self, "transpose()"))))[::-1]
        return self.session.op("Transpose", self, perm=list(perm))

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (list, tuple)):
            shape = shape[0]
        return self.session.op("Reshape", self, shape=list(shape))

    def sum(self, axis=None, keepdims=False):
        return self._reduce("Sum", axis, keepdims)

    def mean(self, axis=None, keepdims=False):
        return self._reduce("Mean", axis, keepdims)

    def _reduce(self, op, axis, keepdims):
        if axis is None:
            axis = []
        elif isinstance(axis, numbers.Integral):
            axis = [int(axis)]
        attrs = {"axis": list(axis)}
        if keepdims:
            attrs["keep_dims"] = True
        return self.session.op(op, self, **attrs)

    def astype(self, dtype):
        return self.session.op("Cast", self, DstT=dtype)

    def __getitem__(self, key):
        return _index(self, key)

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]


def _known_shape(t, what):
    """t's shape; inside a trace a value's shape is known only where an
    input_signature gave it, so say so instead of failing on None."""
    shape = t.shape
    if shape is None:
        raise TypeError(
            "%s needs the value's shape, which a traced function does not "
            "know here: give the function input_signature=[paradev.Spec("
            "dtype, shape), ...], or use the ops (Slice, Transpose with a "
            "perm, Reshape) directly" % what)
    return shape


def _index(t, key):
    """Basic indexing: integers and slices of step 1 (and ..., None is not
    supported) -> Slice, then Reshape to drop the integer axes."""
    if not isinstance(key, tuple):
        key = (key,)
    shape = _known_shape(t, "indexing")
    if Ellipsis in key:
        i = key.index(Ellipsis)
        fill = len(shape) - (len(key) - 1)
        key = key[:i] + (slice(None),) * fill + key[i + 1:]
    if len(key) > len(shape):
        raise IndexError("too many indices (%d) for a tensor of rank %d"
                         % (len(key), len(shape)))
    begin, size, keep = [], [], []
    for ax, dim in enumerate(shape):
        k = key[ax] if ax < len(key) else slice(None)
        if dim < 0:
            if k != slice(None):
                raise IndexError(
                    "axis %d differs between components (shape %s): index a "
                    "downloaded component instead" % (ax, shape))
            begin.append(0)
            size.append(-1)
            keep.append(-1)
            continue
        if isinstance(k, slice):
            start, stop, step = k.indices(dim)
            if step != 1:
                raise IndexError(
                    "slices with a step (%r) are not supported: the daemon's "
                    "Slice takes begin and size only" % (k,))
            begin.append(start)
            size.append(max(0, stop - start))
            keep.append(max(0, stop - start))
        elif isinstance(k, numbers.Integral) and not isinstance(k, bool):
            i = int(k)
            if not -dim <= i < dim:
                raise IndexError("index %d is out of bounds for axis %d with "
                                 "size %d" % (i, ax, dim))
            begin.append(i % dim)
            size.append(1)
        else:
            raise IndexError(
                "only integers, slices (step 1) and ... index a paradev "
                "Tensor; got %r" % (k,))
    out = t.session.op("Slice", t, begin=begin, size=size)
    if len(keep) != len(shape):
        out = t.session.op("Reshape", out, shape=keep)
    return out
