"""What session.py, transfer.py and tape.py share."""
from . import _dtypes
from ._lib import ffi
from .client import _timeout_ms
from .tensor import Tensor

_NULL = ffi.NULL

# Deletions of collected tensors wait for this many before an op sends them
# (one Delete, or one stream item, for all); uploads, downloads, syncs and a
# timer (every 0.5 s) send them whatever their number.
FLUSH_AT = 64


def _call_options(timeout):
    if timeout is None:
        return _NULL
    o = ffi.new("pd_call_options *")
    o.struct_size = ffi.sizeof("pd_call_options")
    o.timeout_ms = _timeout_ms(timeout)
    return o


def _tensor_from_info(session, info, mirrored):
    shape = tuple(info.dims[j] for j in range(info.rank))
    return Tensor(session, info.id, _dtypes.from_number(info.dtype), shape,
                  mirrored)
