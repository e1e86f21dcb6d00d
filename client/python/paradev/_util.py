"""What session.py, transfer.py and tape.py share."""
import time

from . import _dtypes, _lib
from ._lib import ffi, lib
from .client import _timeout_ms
from .errors import DeadlineExceeded
from .placement import from_info
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


def _tensor_from_info(session, info, mirrored, devices=None):
    """A Tensor of a reply's pd_tensor_info: dtype, shape and device set
    (when the daemon did not say, one older than placement: `devices`,
    what the client could tell, else the session's default set)."""
    shape = tuple(info.dims[j] for j in range(info.rank))
    return Tensor(session, info.id, _dtypes.from_number(info.dtype), shape,
                  mirrored, from_info(info) or devices or session.devices)


# -- interruptible waits ------------------------------------------------------
# A C call blocks the calling thread with the GIL released; Python runs its
# signal handlers (Ctrl-C's KeyboardInterrupt) only once it returns. So every
# wait of unbounded length goes in slices of _SLICE_S seconds: a call that
# runs past its slice returns DEADLINE_EXCEEDED, the signal handlers run, and
# the wait goes on until the caller's own timeout. The daemon's Sync holds no
# thread while it waits and ends at the call's deadline (server/exec.c), and
# a stream's wait is local, so a slice that ends leaves nothing behind and
# the session stays usable after a KeyboardInterrupt.
_SLICE_S = 0.2
_DEADLINE = 4  # PD_DEADLINE_EXCEEDED
DEFAULT_TIMEOUT_S = 60.0  # libparadev's default_timeout_ms


def _total_s(session, timeout):
    if timeout is not None:
        _timeout_ms(timeout)  # refuses timeout <= 0
        return float(timeout)
    t = session.client.timeout
    return float(t) if t is not None else DEFAULT_TIMEOUT_S


def sliced_sync(session, ids, timeout, what="sync"):
    """pd_sync of `ids` (all the session's work when empty) in slices;
    raises the first stored error, or DeadlineExceeded past `timeout`
    seconds (None: the client's)."""
    total = _total_s(session, timeout)
    deadline = time.monotonic() + total
    arr = ffi.new("uint64_t[]", ids) if ids else _NULL
    failed = ffi.new("uint64_t *")
    o = ffi.new("pd_call_options *")
    o.struct_size = ffi.sizeof("pd_call_options")
    s = session._h()
    while True:
        left = deadline - time.monotonic()
        o.timeout_ms = max(1, int(min(_SLICE_S, left) * 1000))
        st = _lib.status()
        failed[0] = 0
        code = lib.pd_sync(s, arr, len(ids), failed, o, st)
        if code == _DEADLINE and failed[0] == 0:
            if left > _SLICE_S:
                continue  # a slice ended: signals run, then wait on
            raise DeadlineExceeded("%s: the work was not done within %g s "
                                   "(it goes on)" % (what, total))
        _lib.check(code, st)
        return


def sliced_stream_wait(session, stream):
    """pd_stream_wait(stream, no limit) in slices (see above); returns its
    code, with the thread's status holding the message."""
    while True:
        st = _lib.status()
        code = lib.pd_stream_wait(stream, int(_SLICE_S * 1000), st)
        if code != _DEADLINE:
            return code, st
        msg = ffi.string(lib.pd_status_message(st))
        if not msg.startswith(b"item ") and b"within the timeout" in msg:
            continue  # a slice ended, not an item that failed
        return code, st
