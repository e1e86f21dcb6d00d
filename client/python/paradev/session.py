"""Session: a namespace of tensors on the daemon (pd_session), with
uploads, downloads, ops (one Execute each, or pipelined through one Enqueue
stream), gradient tapes, checkpoints the daemon loads and saves
(checkpoint.py), and batched deletion of collected tensors.

Thread safety: a Session may be used from several threads (a lock guards
its stream, its scratch attributes and its shared memory region); ops of
one thread run in the order called. Sessions of different threads run
independently.
"""
import collections
import contextlib
import logging
import math
import re
import threading
import warnings
import weakref

import numpy as np

from . import _dtypes, _lib, layouts, placement
from ._lib import ffi, lib
from .errors import Error, NotFound, Unavailable
from .tensor import Tensor
from ._cstr import cbytes, cint
from ._util import (FLUSH_AT, _tensor_from_info, sliced_stream_wait,
                    sliced_sync)
from .transfer import Transfers
from .checkpoint import Checkpoints
from .functions import Symbol, active_trace, combine_mirrored

_NULL = ffi.NULL
TIMEOUT_NONE = _lib.C["PD_TIMEOUT_NONE"]
_SCRATCH = 16  # inputs / outputs that fit the session's scratch arrays
_U64_ARRAY = ffi.typeof("uint64_t[]")
_INFO_ARRAY = ffi.typeof("pd_tensor_info[]")

# Ops whose outputs hold the same value on every device whatever the
# inputs, and ops whose outputs differ between devices.
_MIRRORING = {"AllReduce", "Broadcast", "AllGather"}
_VARYING = {"ReduceScatter", "DeviceId", "ParallelPack"}
# The placement ops (issue #17): their outputs' device sets follow their
# own rules (_out_devices).
_PACK, _UNPACK, _COPY = "ParallelPack", "ParallelUnpack", "CopyToDevices"

_log = logging.getLogger("paradev")


def _ended_by_daemon(err):
    """Whether a close's error says the daemon itself ended the session and
    told its calls why: the mesh across machines lost a rank and ended
    every open session (server/mesh_state.c: UNAVAILABLE "session not
    found: ...; every session open then was ended: the mesh lost rank
    ..."). A plain NotFound (closed elsewhere, lease expired, daemon
    restarted) is not: an explicit close() still raises it."""
    return isinstance(err, Unavailable) and \
        "session not found" in (err.message or "")


def _cstr(s, what, arg=None, cache={}):
    """cbytes(s), remembered (op and attribute names recur)."""
    b = cache.get(s)
    if b is None:
        b = cbytes(s, what if arg is None else what % arg)
        if len(cache) < 4096:
            cache[s] = b
    return b



def _group_outputs(opdef, lengths, outs):
    """The flattened outputs of an op with a list output, one entry per
    output argument (a list for the list one); the entry itself when the
    op has one argument."""
    groups, k = [], 0
    for o, n in zip(opdef.outputs, lengths):
        if getattr(o, "is_list", False):
            groups.append(list(outs[k:k + n]))
        else:
            groups.append(outs[k])
        k += n
    return groups[0] if len(groups) == 1 else tuple(groups)

class Session(Transfers, Checkpoints):
    """A session on the daemon; see Client.session. Attributes:
    devices (its allowed device set, also the default placement: a tuple
    of daemon device indices), num_devices (their number: components of a
    tensor placed by default), lease_s, incarnation,
    memory_quota (bytes, 0: none), ops (generated op wrappers), stats (bytes
    moved through gRPC and through shared memory)."""

    def __init__(self, client, name=None, *, job_id=None, lease_s=None,
                 memory_quota=None, keep_alive=True, priority=0, weight=0,
                 pipelined=False,
                 prefer_shared_memory=True, shm_threshold=1 << 20,
                 op_timeout_ms=None, job_token=None, devices=None):
        self.client = client
        opts = ffi.new("pd_session_options *")
        opts.struct_size = ffi.sizeof("pd_session_options")
        keep = []
        want = placement.normalize(devices, "session: devices", client)
        if want is not None:
            keep.append(placement.c_array(want)[0])
            opts.devices, opts.num_devices = keep[-1], len(want)
        if name is not None:
            keep.append(ffi.new("char[]", cbytes(str(name),
                                                 "session: name")))
            opts.client_name = keep[-1]
        if job_id is not None:
            keep.append(ffi.new("char[]", cbytes(str(job_id),
                                                 "session: job_id")))
            opts.job_id = keep[-1]
        if job_token is not None:  # else libparadev reads $PARADEV_JOB_TOKEN
            keep.append(ffi.new("char[]", cbytes(str(job_token),
                                                 "session: job_token")))
            opts.job_token = keep[-1]
        u32, u64 = (1 << 32) - 1, (1 << 64) - 1
        opts.lease_seconds = cint(lease_s or 0, "lease_s", 0, u32,
                                  "seconds, 0 (the daemon's default) or more")
        opts.memory_quota_bytes = cint(memory_quota or 0, "memory_quota", 0,
                                       u64, "bytes, 0 (none) to 2**64-1")
        opts.keep_alive = bool(keep_alive)
        opts.op_timeout_ms = cint(op_timeout_ms or 0, "op_timeout_ms", 0, u32,
                                  "milliseconds, 0 (none) to 2**32-1")
        opts.priority = cint(priority, "priority", -(1 << 31), (1 << 31) - 1,
                             "a band -8 to 8 (0: the default)")
        opts.weight = cint(weight, "weight", 0, u32, "1 to 10000 (0: 1)")
        st = _lib.status()
        s = lib.pd_session_new(client._handle(), opts, _NULL, st)
        if s == _NULL:
            _lib.raise_status(lib.pd_status_code(st), st)
        self._s = s
        client._session_made()
        self.name = name
        self.devices = self._allowed_devices(s, want)
        self.num_devices = len(self.devices)
        self.lease_s = lib.pd_session_lease_seconds(s)
        self.incarnation = lib.pd_session_incarnation(s)
        self.memory_quota = lib.pd_session_memory_quota(s)
        self._lock = threading.RLock()
        self._pending = collections.deque()  # ids of collected tensors
        self._pending_tapes = collections.deque()
        self._stream = None
        self._items = {}  # stream item index -> ids it makes or deletes
        self._dead = set()  # ids whose making item failed: never deleted
        self._index = ffi.new("uint64_t *")
        self._in_buf = ffi.new(_U64_ARRAY, _SCRATCH)
        self._out_buf = ffi.new(_U64_ARRAY, _SCRATCH)
        self._defs = {}
        self._tapes = []  # tapes whose block is running, watch_accessed
        self._pipelined = bool(pipelined)
        self._attrs = lib.pd_attrs_new()
        self._region = None
        self._shm = bool(prefer_shared_memory) and client.is_local
        self.shm_threshold = int(shm_threshold)
        self.shm_disabled_reason = None if self._shm else (
            "prefer_shared_memory is False" if not prefer_shared_memory
            else "the daemon is not on this machine (%s)" % client.target)
        self.stats = {"grpc_upload_bytes": 0, "grpc_download_bytes": 0,
                      "shm_upload_bytes": 0, "shm_download_bytes": 0}
        self._closed = False
        from .ops import Ops
        self.ops = Ops(self)
        self._timer_stop = threading.Event()
        # The timer holds the session weakly, so that a session dropped
        # without close() is still collected (and closed).
        self._timer = threading.Thread(
            target=_flush_periodically,
            args=(weakref.ref(self), self._timer_stop),
            name="paradev-deletes", daemon=True)
        self._timer.start()

    # -- lifetime ------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(_quiet=exc_type is not None, _exit=True)

    def __del__(self):
        try:
            self.close(_quiet=True)
        except Exception:
            pass

    def __repr__(self):
        return "<paradev.Session %s%s on %s, devices %s>" % (
            "%r " % self.name if self.name else "",
            "closed" if self._closed else "open", self.client.target,
            list(self.devices))

    def _allowed_devices(self, s, want):
        """The session's allowed device set (pd_session_devices); a
        libparadev that does not report one (older than placement) means
        the whole mesh, which a narrowed session must not silently get."""
        buf = ffi.new("int32_t[]", placement.MAX_DEVICES)
        n = lib.pd_session_devices(s, buf, placement.MAX_DEVICES)
        if n > 0:
            return tuple(buf[i] for i in range(min(n, placement.MAX_DEVICES)))
        if want is not None:
            st = _lib.status()
            lib.pd_session_close(s, _NULL, st)
            lib.pd_session_delete(s)
            self.client._session_deleted()
            self._closed = True
            from .errors import Unimplemented
            raise Unimplemented(
                "session: devices=%r: this libparadev (%s) does not report "
                "a session's device set (pd_session_devices answered 0), so "
                "the session cannot be narrowed" % (list(want),
                                                    _lib.LIBRARY_PATH))
        return tuple(range(lib.pd_session_num_devices(s)))

    @property
    def closed(self):
        return self._closed

    def close(self, _quiet=False, _exit=False):
        """Closes the session on the daemon: every tensor it holds is freed.
        Idempotent. Raises the close's error (e.g. paradev.NotFound for a
        session the daemon already lost: restarted, or the lease ran out)
        unless the session was closing because of another exception. At
        the end of a `with` block a session the daemon no longer has is
        not an error: a RuntimeWarning says so instead. A session the
        daemon itself ended and said so (a mesh across machines that lost a
        rank ends every open session: UNAVAILABLE "session not found: ...;
        every session open then was ended: ...", which its calls raised
        already) closes quietly: logged at debug on the "paradev" logger,
        never raised, from close() or a `with` block."""
        if self._closed:
            return
        self._closed = True
        self._timer_stop.set()
        err = None
        with self._lock:
            self._pending.clear()
            if self._stream is not None:
                lib.pd_stream_delete(self._stream)
                self._stream = None
            if self._region is not None:
                lib.pd_shared_memory_destroy(self._region, _NULL, _NULL)
                self._region = None
            st = _lib.status()
            code = lib.pd_session_close(self._s, _NULL, st)
            if code != 0:
                try:
                    _lib.raise_status(code, st)
                except Error as e:
                    err = e
            lib.pd_session_delete(self._s)
            self.client._session_deleted()
            lib.pd_attrs_delete(self._attrs)
            self._attrs = _NULL
        self.client._sessions.discard(self)
        if err is None:
            return
        if _ended_by_daemon(err):
            _log.debug("session%s: closed after the daemon ended it: %s",
                       " %r" % self.name if self.name else "", err.message)
            return
        if _quiet:
            return
        if _exit and isinstance(err, NotFound):
            warnings.warn("paradev: session%s was already gone on the daemon "
                          "when its with-block ended (%s)" % (
                              " %r" % self.name if self.name else "",
                              err.message), RuntimeWarning, stacklevel=3)
            return
        raise err

    def _h(self):
        if self._closed:
            raise ValueError("paradev.Session is closed")
        return self._s

    def keep_alive(self):
        """Renews the lease now (a background thread does it by itself)."""
        st = _lib.status()
        _lib.check(lib.pd_session_keep_alive(self._h(), _NULL, st), st)

    # -- deletion (batched) -----------------------------------------------
    def _queue_delete(self, id):
        if not self._closed:
            if self._dead and id in self._dead:
                self._dead.discard(id)
                return
            self._pending.append(id)

    def _flush_deletes(self):
        """Sends the queued deletions: as a stream item when the session has
        a stream (it keeps their order after the ops that made them), else
        one Delete. Best effort: a failure here loses nothing the session's
        close would not free."""
        if self._closed:
            return
        ids = []
        pend = self._pending
        while pend:
            ids.append(pend.popleft())
        if self._dead and ids:
            dead = self._dead
            keep = [i for i in ids if i not in dead]
            dead.difference_update(ids)
            ids = keep
        tapes = []
        while self._pending_tapes:
            tapes.append(self._pending_tapes.popleft())
        st = _lib.status()
        if ids:
            arr = ffi.new("uint64_t[]", ids)
            if self._stream is not None:
                if lib.pd_stream_delete_ids(self._stream, arr, len(ids),
                                            self._index, st) == 0:
                    self._items[self._index[0]] = None  # a delete item
            else:
                lib.pd_delete(self._s, arr, len(ids), _NULL, st)
        for tape in tapes:
            if self._stream is not None:
                lib.pd_stream_tape_delete(self._stream, tape, _NULL, st)
            else:
                lib.pd_tape_delete(self._s, tape, _NULL, st)

    def _flush_tick(self):
        if (self._pending or self._pending_tapes) and \
                self._lock.acquire(blocking=False):
            try:
                self._flush_deletes()
            except Exception:
                pass
            finally:
                self._lock.release()

    def flush(self):
        """Sends the queued deletions of collected tensors now."""
        with self._lock:
            self._flush_deletes()

    # -- the stream (pipelined mode) --------------------------------------
    def _get_stream(self):
        t = self._stream
        if t is None:
            st = _lib.status()
            t = lib.pd_stream_new(self._h(), _NULL, st)
            if t == _NULL:
                _lib.raise_status(lib.pd_status_code(st), st)
            self._stream = t
        return t

    def _drain(self):
        """Waits for the replies of every stream item so far, so that unary
        calls see the handles they made; raises the first failed item's
        error (each failure once).

        A failed execute item made no handles: its outputs are marked dead
        so that collecting them sends no delete (a Delete naming an unknown
        id deletes nothing). A failed delete item (it named such an id when
        more items failed than the wait reports) is not the caller's error
        and is not raised."""
        t = self._stream
        if t is None:
            return
        if lib.pd_stream_num_replies(t) >= lib.pd_stream_num_items(t) and \
                not self._items:
            return
        code, st = sliced_stream_wait(self, t)
        items, self._items = self._items, {}
        if code == 0:
            return
        msg = ffi.string(lib.pd_status_message(st)).decode("utf-8", "replace")
        m = re.match(r"item (\d+): .*?(\(and (\d+) more items failed\))?$",
                     msg, re.S)
        first = int(m.group(1)) if m else -1
        more = m is not None and m.group(2) is not None
        # Outputs of the failed item never existed; when more failed than
        # the message names, every op item since the last wait is suspect:
        # leaking their handles until the session closes beats deleting
        # handles that do not exist.
        for idx, ids in items.items():
            if ids and (idx == first or (more and idx >= first)):
                self._dead.update(ids)
        if first in items and items[first] is None and not more:
            return  # only a delete failed
        _lib.raise_status(code, st)

    @property
    def pipelined(self):
        return self._pipelined

    @contextlib.contextmanager
    def pipeline(self):
        """Inside, ops, tape calls and deletions are written to one Enqueue
        stream without waiting for replies (errors come at the next wait:
        sync(), a download, a shape asked for, or the block's end)."""
        old = self._pipelined
        self._pipelined = True
        try:
            yield self
        finally:
            self._pipelined = old
            with self._lock:
                if not self._closed:
                    self._drain()

    # -- ops ---------------------------------------------------------------
    def op(self, name, *inputs, **attrs):
        """Runs op `name` (a TensorFlow raw-op name) on the devices of its
        inputs' set. Inputs are Tensors (or values, uploaded mirrored);
        attributes are plain Python values converted to the kinds the
        registry declares. devices=[...] (indices or names) places an op
        without tensor inputs (Fill, RandomNormal, DeviceId, a function
        without arguments; default: the session's devices); an op with
        inputs runs on their set, and devices= naming another set is the
        daemon's paradev.InvalidArgument (as are inputs on different sets).
        For an op with an attribute `devices` (CopyToDevices) devices= is
        that attribute. Returns a Tensor, a list of Tensors for an op whose
        one output is a list (Split, SplitV, Unpack: as many as the length
        attribute says), or a tuple for an op with several outputs."""
        opdef = self._defs.get(name)
        if opdef is None:
            opdef = self._defs[name] = self.ops._def(name)
        where = None
        if "devices" in attrs:
            if name == _COPY or "devices" in opdef.attrs:
                if name == _COPY:
                    _need_target(attrs["devices"], self.devices,
                                 "%s: devices" % name)
                attrs["devices"] = list(placement.normalize(
                    attrs["devices"], "%s: devices" % name, self.client))
            else:
                where = placement.normalize(attrs.pop("devices"),
                                            "%s: devices" % name, self.client)
        tr = active_trace()
        if tr is not None and tr.session is self:
            if name in (_PACK, _UNPACK, _COPY):
                raise ValueError(
                    "%s inside a traced function: it moves a value between "
                    "device sets, and a function's nodes run on one set (the "
                    "daemon refuses it as a node); call it outside the "
                    "function, on the call's arguments or results" % name)
            if where is not None:
                raise ValueError(
                    "%s: devices=%r inside a traced function: a node runs "
                    "where the call runs; place the call instead (fn(..., "
                    "devices=[...]) for a function without arguments)"
                    % (name, list(where)))
            return tr.op(name, inputs, attrs)  # a node of a traced function
        if name == _UNPACK and len(inputs) == 1 and \
                isinstance(inputs[0], Tensor):
            _unpack_count(opdef, inputs[0], attrs)
        return self._op(opdef, name, inputs, attrs, where)

    def _op(self, opdef, name, inputs, attrs, where, n_unpack=None):
        """session.op past the trace and the placement's check. n_unpack:
        ParallelUnpack's output count (its input's set size) where the
        registry has no attribute that says it."""
        n_out = opdef.num_outputs
        lengths = None
        if n_unpack is not None:
            lengths, n_out = [n_unpack], n_unpack
        elif any(getattr(o, "is_list", False) for o in opdef.outputs):
            lengths = opdef.output_lengths(attrs)
            n_out = sum(lengths)
        mirrored = True
        ids = []
        tensors = []
        for e in inputs:
            if e.__class__ is not Tensor:
                if isinstance(e, (list, tuple)) and e and \
                        all(isinstance(t, Tensor) for t in e):
                    for t in e:
                        ids.append(self._input_id(t))
                        tensors.append(t)
                        if t._mirrored is not True and mirrored is not False:
                            mirrored = t._mirrored
                    continue
                e = self._input_tensor(e, _tensor_set(inputs))
            elif e.session is not self or e._deleted:
                self._input_id(e)
            ids.append(e.id)
            tensors.append(e)
            if e._mirrored is not True and mirrored is not False:
                mirrored = e._mirrored
        if name in _MIRRORING:
            mirrored = True
        elif name in _VARYING or attrs.get("per_device"):
            mirrored = False
        elif name in (_UNPACK, _COPY) and tensors:
            mirrored = _placed_mirrored(name, tensors[0], attrs)
        if self._tapes and tensors:
            for tape in self._tapes:
                tape._accessed(tensors)
        n_in = len(ids)
        with self._lock:
            self._h()
            if len(self._pending) >= FLUSH_AT:
                self._flush_deletes()
            a = self._set_attrs(opdef, attrs) if attrs else _NULL
            if n_in <= _SCRATCH:
                in_arr = self._in_buf
                in_arr[0:n_in] = ids
            else:
                in_arr = ffi.new(_U64_ARRAY, ids)
            out_ids = self._out_buf if n_out <= _SCRATCH else \
                ffi.new(_U64_ARRAY, n_out)
            for i in range(n_out):
                out_ids[i] = 0
            st = _lib.status()
            devs = _out_devices(self, name, tensors, attrs, where, n_out)
            on, n_on = placement.c_array(where)
            if self._pipelined and (where is None or
                                    _lib.has("pd_stream_execute_on")):
                if where is None:
                    code = lib.pd_stream_execute(self._get_stream(),
                                                 _cstr(name, "op name"),
                                                 in_arr, n_in, a, out_ids,
                                                 n_out, self._index, st)
                else:
                    code = lib.pd_stream_execute_on(
                        self._get_stream(), on, n_on, _cstr(name, "op name"),
                        in_arr, n_in, a, out_ids, n_out, self._index, st)
                if code != 0:
                    _lib.raise_status(code, st)
                dts = opdef.output_dtypes(tensors, attrs) if n_unpack is \
                    None else [tensors[0]._dtype] * n_out
                if n_out == 1 and lengths is None and \
                        opdef.out_mirrored is None:
                    out = Tensor(self, out_ids[0], dts[0], None, mirrored,
                                 devs[0])
                    self._items[self._index[0]] = (out.id,)
                    if self._tapes:
                        self._tracked(tensors, (out,))
                    return out
                if len(dts) < n_out:
                    dts = list(dts) + [None] * (n_out - len(dts))
                outs = [Tensor(self, out_ids[i], dts[i], None, mirrored,
                               devs[i]) for i in range(n_out)]
                self._items[self._index[0]] = [o.id for o in outs]
            else:
                # eager; or a placed op of a pipelined session when the
                # library has no pd_stream_execute_on: after the stream's
                # replies (the order holds), as one Execute
                self._drain()
                infos = ffi.new(_INFO_ARRAY, n_out)
                if where is None:
                    code = lib.pd_execute(self._s, _cstr(name, "op name"),
                                          in_arr, n_in, a, out_ids, n_out,
                                          infos, _NULL, st)
                else:
                    code = lib.pd_execute_on(self._s, on, n_on,
                                             _cstr(name, "op name"), in_arr,
                                             n_in, a, out_ids, n_out, infos,
                                             _NULL, st)
                if code != 0:
                    _lib.raise_status(code, st)
                outs = [_tensor_from_info(self, infos[i], mirrored, devs[i])
                        for i in range(n_out)]
        if opdef.out_mirrored is not None:  # a function's: what its trace knew
            for o, m in zip(outs, opdef.out_mirrored):
                o._mirrored = m if isinstance(m, bool) else \
                    combine_mirrored(tensors, m)[0]
        if self._tapes:
            self._tracked(tensors, outs)
        if n_unpack is not None:
            return outs  # ParallelUnpack's, however the registry lists them
        if lengths is not None:
            return _group_outputs(opdef, lengths, outs)
        return outs[0] if n_out == 1 else tuple(outs)

    # -- placement (issue #17) ---------------------------------------------
    def pack(self, tensors):
        """ParallelPack: single-device tensors (each on a set of one device,
        distinct devices, one dtype) as one tensor on their devices, in the
        list's order (component i is tensors[i]), sharing their buffers (no
        copy); not mirrored. Differentiable on a tape (its gradient is an
        unpack). Inverse: tensor.unpack()."""
        if isinstance(tensors, Tensor) or not isinstance(tensors,
                                                         (list, tuple)):
            raise TypeError("pack: expected a list of single-device tensors "
                            "(tensor.unpack() makes them), got %s"
                            % type(tensors).__name__)
        if not tensors:
            raise ValueError("pack: an empty list; expected one tensor per "
                             "device of the new set")
        for i, t in enumerate(tensors):
            if not isinstance(t, (Tensor, Symbol)):
                raise TypeError("pack: item %d is a %s; expected a paradev "
                                "Tensor on one device" % (i, type(t).__name__))
        return self.op(_PACK, list(tensors))

    def unpack(self, tensor):
        """ParallelUnpack of `tensor`: see Tensor.unpack."""
        if isinstance(tensor, Symbol):
            raise ValueError(
                "ParallelUnpack inside a traced function: it moves a value "
                "between device sets, and a function's nodes run on one set "
                "(the daemon refuses it as a node); call it outside the "
                "function, on the call's arguments or results")
        self._input_id(tensor)
        n = len(tensor.devices)
        opdef = self._opdef(_UNPACK)
        attrs = {}
        out = opdef.outputs[0] if opdef.outputs else None
        length = getattr(out, "length_attr", "") if \
            getattr(out, "is_list", False) else ""
        if length:  # the registry's length attribute, if it has one
            attrs[length] = n
        outs = self._op(opdef, _UNPACK, (tensor,), attrs, None,
                        n_unpack=n if not length else None)
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]

    def _copy_to(self, tensor, devices):
        """CopyToDevices of `tensor` onto `devices`: Tensor.to."""
        if not isinstance(tensor, (Tensor, Symbol)):
            raise TypeError("to: expected a paradev Tensor, got %s"
                            % type(tensor).__name__)
        _need_target(devices, self.devices, "to: devices")
        return self.op(_COPY, tensor, devices=devices)

    def _tracked(self, inputs, outs):
        """Outputs of an op run inside a watching tape's block, with a
        floating input (watched above): the tape records the op, so they need
        no watch of their own. Others (an op on integers only: not recorded)
        are watched when an op reads them."""
        if not any(_is_floating(t._dtype) for t in inputs):
            return
        for tape in self._tapes:
            tape._watched.update(o.id for o in outs)

    def _opdef(self, name):
        """The op's definition (a registered function's too), remembered."""
        opdef = self._defs.get(name)
        if opdef is None:
            opdef = self._defs[name] = self.ops._def(name)
        return opdef

    def _input_id(self, e):
        if isinstance(e, Symbol):
            raise ValueError("%r is a symbolic value of a function's trace, "
                             "used outside it: return it from the function"
                             % e)
        if not isinstance(e, Tensor):
            raise TypeError("op inputs are paradev Tensors or host values; "
                            "got %s" % type(e).__name__)
        if e.session is not self:
            raise ValueError("tensor %d belongs to another session" % e.id)
        if e._deleted:
            raise ValueError("tensor %d was deleted" % e.id)
        return e.id

    def _input_tensor(self, value, devices=None):
        """A host value given as an op's input: uploaded mirrored on the
        device set of the op's tensor inputs (`devices`)."""
        if isinstance(value, Symbol):
            self._input_id(value)  # raises: a trace's value, outside it
        return self.constant(value, devices=devices)

    def _set_attrs(self, opdef, attrs, a=None):
        if a is None:
            a = self._attrs
        lib.pd_attrs_clear(a)
        for k, v in attrs.items():
            kind = opdef.attr_kind(k, v)
            kb = _cstr(k, "%s: attribute name", opdef.name)
            if kind == "int":
                lib.pd_attrs_set_int(a, kb, _int(opdef.name, k, v))
            elif kind == "float":
                lib.pd_attrs_set_float(a, kb, _float(opdef, k, v, attrs))
            elif kind == "bool":
                if not isinstance(v, (bool, np.bool_)) and v not in (0, 1):
                    raise TypeError("%s: attribute %s: expected a bool, got "
                                    "%r" % (opdef.name, k, v))
                lib.pd_attrs_set_bool(a, kb, bool(v))
            elif kind == "string":
                lib.pd_attrs_set_string(a, kb, cbytes(
                    str(v), "%s: attribute %s" % (opdef.name, k)))
            elif kind == "dtype":
                lib.pd_attrs_set_dtype(a, kb, _dtypes.to_number(v))
            elif kind == "shape":
                dims = [_int(opdef.name, k, d) for d in _seq(k, v)]
                lib.pd_attrs_set_shape(a, kb, ffi.new("int64_t[]", dims)
                                       if dims else _NULL, len(dims))
            elif kind == "int_list":
                vals = [_int(opdef.name, k, d) for d in _seq(k, v)]
                lib.pd_attrs_set_int_list(a, kb, ffi.new("int64_t[]", vals)
                                          if vals else _NULL, len(vals))
            elif kind == "float_list":
                vals = [_float(opdef, k, d) for d in _seq(k, v)]
                lib.pd_attrs_set_float_list(a, kb, ffi.new("double[]", vals)
                                            if vals else _NULL, len(vals))
            else:
                raise TypeError("%s: attribute %s: cannot send %r (kind %s)"
                                % (opdef.name, k, v, kind))
        return a

    def constant(self, value, dtype=None, devices=None):
        """Uploads a host value mirrored (what operators do with a Python
        number beside a Tensor: on that tensor's devices)."""
        if devices is not None and tuple(devices) == self.devices:
            devices = None  # the default: no placement to send
        return self.upload(value, layouts.mirrored(), dtype=dtype,
                           devices=devices)

    # -- sync, describe ----------------------------------------------------
    def sync(self, tensors=None, *, timeout=None):
        """Waits until the session's work (or the given tensors) is
        computed; raises the first stored error (the session stays
        usable). timeout: seconds (None: the client's default), past which
        paradev.DeadlineExceeded is raised."""
        with self._lock:
            self._flush_deletes()
            self._drain()
            ids = [t.id for t in tensors] if tensors else []
            sliced_sync(self, ids, timeout)

    def describe(self, tensors):
        """A dict per tensor: dtype, shape, devices (its device set),
        component_shapes (one per device of it), bytes, ready, and error
        (None, or the stored Error) -- without waiting."""
        with self._lock:
            self._drain()
            ids = [t.id for t in tensors]
            arr = ffi.new("uint64_t[]", ids)
            st = _lib.status()
            d = lib.pd_describe(self._h(), arr, len(ids), _NULL, st)
            if d == _NULL:
                _lib.raise_status(lib.pd_status_code(st), st)
        try:
            out = []
            info = ffi.new("pd_tensor_info *")
            dev_buf = ffi.new("int32_t[]", placement.MAX_DEVICES)
            for i in range(len(ids)):
                lib.pd_description_info(d, i, info)
                comps = []
                for k in range(lib.pd_description_num_components(d, i)):
                    lib.pd_description_component(d, i, k, info)
                    comps.append(tuple(info.dims[j] for j in range(info.rank)))
                lib.pd_description_info(d, i, info)
                ready = bool(lib.pd_description_ready(d, i))
                err = None
                if ready:
                    msg = ffi.new("char **")
                    code = lib.pd_description_status(d, i, msg)
                    if code:
                        from .errors import error_for
                        err = error_for(code, ffi.string(msg[0]).decode(
                            "utf-8", "replace"))
                nd = lib.pd_description_devices(d, i, dev_buf,
                                                placement.MAX_DEVICES)
                out.append({
                    "id": ids[i],
                    "devices": tuple(dev_buf[k] for k in range(nd)) if nd
                    else self.devices,
                    "dtype": _dtypes.from_number(info.dtype),
                    "shape": tuple(info.dims[j] for j in range(info.rank)),
                    "component_shapes": comps,
                    "bytes": lib.pd_description_bytes(d, i),
                    "ready": ready, "error": err})
            return out
        finally:
            lib.pd_description_delete(d)

    def _fetch_meta(self, tensor):
        d = self.describe([tensor])[0]
        tensor._dtype = d["dtype"]
        tensor._shape = d["shape"]
        tensor._devices = d["devices"]

    # -- graph functions ---------------------------------------------------
    def function(self, fn=None, **options):
        """A traced graph function of this session, as a decorator:

            @session.function                     # or (passes={...}, ...)
            def step(x, w):
                return session.ops.Relu(x @ w)
            y = step(x, w)                        # one op per call

        Options: input_signature (paradev.Spec per argument), passes
        ({"fusion": False, ...}), max_instantiations, name. See
        paradev.functions.Function."""
        from .functions import function
        return function(self, fn, **options)

    def register_function(self, fdef):
        """Registers a paradev.FunctionDef (RegisterFunction); returns a
        callable that runs it. An identical definition registered before is
        a no-op (.already_registered); another body under the same name
        raises paradev.AlreadyExists; a bad definition InvalidArgument with
        the daemon's message, naming the node."""
        from .functions import RegisteredFunction, register
        return RegisteredFunction(self, fdef.name, register(self, fdef))

    def describe_function(self, name):
        """DescribeFunction as a dict: "function" (as registered),
        "optimized" (the last instantiation's graph), "instantiations"
        (signature, nodes_in/out, passes, arena_bytes, calls, ...), "hits",
        "misses", "cache_misses" (why, latest first), "passes_in_force"."""
        from .functions import describe
        return describe(self, getattr(name, "name", name))

    # -- tapes -------------------------------------------------------------
    def tape(self, *, persistent=False, watch=(), watch_accessed=True):
        """A gradient tape on the daemon, as a context manager:

            with session.tape() as tape:
                loss = ...
            dw, = tape.gradient(loss, [w])

        Inside the block the inputs of every op are watched
        (watch_accessed=True); with watch_accessed=False only watch= and
        tape.watch() say what is."""
        from .functions import active_trace
        if active_trace() is not None:
            raise RuntimeError(
                "session.tape() inside a traced function: a tape records "
                "eager ops; inside a function use paradev.gradients(y, xs), "
                "which adds a Gradients node")
        from .tape import Tape
        return Tape(self, persistent=persistent, watch=watch,
                    watch_accessed=watch_accessed)


def _tensor_set(inputs):
    """The device set of the first Tensor among an op's inputs (None when
    there is none): where host values beside them are uploaded."""
    for e in inputs:
        if e.__class__ is Tensor:
            return e.devices
        if isinstance(e, (list, tuple)):
            for t in e:
                if t.__class__ is Tensor:
                    return t.devices
    return None


def _out_devices(session, name, inputs, attrs, where, n_out):
    """What the client can tell of each output's device set before the
    reply (a pipelined op has none): the placement ops' rules, else the
    inputs' set, else the placement (the session's default); None where it
    cannot (asked for on first use). A reply's pd_tensor_info wins."""
    known = [t._devices for t in inputs]
    if name == _PACK:
        d = None
        if known and all(k is not None and len(k) == 1 for k in known):
            d = tuple(k[0] for k in known)
        return [d] * n_out
    if name == _UNPACK:
        if known and known[0] is not None and len(known[0]) == n_out:
            return [(k,) for k in known[0]]
        return [None] * n_out
    if name == _COPY and attrs.get("devices"):
        return [tuple(attrs["devices"])] * n_out
    if inputs:
        return [next((k for k in known if k is not None), None)] * n_out
    return [where or session.devices] * n_out


def _need_target(devices, default, what):
    """A copy's target set (CopyToDevices' `devices`, tensor.to's): it has
    no default, so None and [] are refused here with advice that fits a
    copy (placement.normalize's for [] points to None: the session's
    default set, which a placement has and a copy has not)."""
    if devices is None:
        raise TypeError(
            "%s is required: the target device set, a list of device "
            "indices or names (such as %r); a copy has no default set"
            % (what, list(default)))
    if isinstance(devices, (list, tuple, range)) and not devices:
        raise ValueError(
            "%s: [] names no device; a copy needs its target device set: "
            "a list of device indices or names (such as %r)"
            % (what, list(default)))


def _unpack_count(opdef, t, attrs):
    """ParallelUnpack's output count (its length attribute, `num`) filled
    in from the input's device set where it is 0 or not given (the
    wrapper's default): the client knows the set (a pipelined output's is
    predicted; else asked for once). A nonzero count is the daemon's to
    check."""
    out = opdef.outputs[0] if opdef.outputs else None
    length = getattr(out, "length_attr", "") if \
        getattr(out, "is_list", False) else ""
    if length and not attrs.get(length):
        attrs[length] = len(t.devices)


def _placed_mirrored(name, t, attrs):
    """What the client knows of the mirroring of ParallelUnpack's or
    CopyToDevices' outputs, as the engine marks them (device/place.c): a
    single-device output of an unpack holds one value; a copy onto a set of
    another size is replicated (from one device, or a mirrored input's
    component 0); a copy of the same size keeps the input's mark."""
    if name == _UNPACK:
        return True
    to = attrs.get("devices")
    if t._devices is not None and to is not None and \
            len(to) != len(t._devices):
        return True
    return t._mirrored


def _is_floating(dt):
    return dt is not None and (dt is _dtypes.bfloat16 or
                               getattr(dt, "kind", "") == "f")


def _flush_periodically(ref, stop):
    """The deletions timer: every 0.5 s, sends what collected tensors
    queued when nothing else did (and the session is not busy)."""
    while not stop.wait(0.5):
        s = ref()
        if s is None:
            return
        s._flush_tick()
        del s


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _int(op, name, v):
    """An int64 attribute value; TypeError for a non-integer, ValueError
    (naming the op, the attribute and the range) past int64."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        try:
            if float(v) != int(v):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise TypeError("%s: attribute %s: expected an integer, got %r"
                            % (op, name, v)) from None
    i = int(v)
    if not _INT64[0] <= i <= _INT64[1]:
        raise ValueError("%s: attribute %s: %d is out of range; expected an "
                         "integer from -2**63 to 2**63-1 (int64)"
                         % (op, name, i))
    return i


def _float(opdef, name, v, attrs=None):
    """A float attribute value. The `value` of an op making an integer (or
    bool) dtype must be integral: the daemon would cast 3.7 to 3 where
    TensorFlow's Fill takes a value of the dtype itself."""
    try:
        f = float(v)
    except OverflowError:
        raise ValueError("%s: attribute %s: %r is out of range; expected a "
                         "float64" % (opdef.name, name, v)) from None
    except (TypeError, ValueError):
        raise TypeError("%s: attribute %s: expected a float, got %r"
                        % (opdef.name, name, v)) from None
    if attrs is not None and name == "value" and not f.is_integer():
        dt = attrs.get("dtype")
        if dt is None and "dtype" in opdef.attrs:
            dt = opdef.attrs["dtype"].default
        if dt is not None:
            try:
                npdt = _dtypes.from_number(_dtypes.to_number(dt))
            except TypeError:
                npdt = None
            if getattr(npdt, "kind", "") in ("i", "u", "b"):
                raise ValueError(
                    "%s: value=%r is not an integer but dtype is %s (it "
                    "would become %s); pass a value of the dtype, as "
                    "TensorFlow's Fill takes" % (
                        opdef.name, v, npdt.name,
                        int(f) if math.isfinite(f) else "undefined"))
    return f


def _seq(name, v):
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return [v]
    if isinstance(v, (str, bytes)):  # iterable, but never a list of numbers
        raise TypeError("attribute %s: expected a list of numbers, got %s %r"
                        % (name, type(v).__name__, v))
    try:
        return list(v)
    except TypeError:
        raise TypeError("attribute %s: expected a list, got %r"
                        % (name, v)) from None
