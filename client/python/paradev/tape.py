"""Gradient tapes on the daemon (StartTape, WatchTape, Gradient,
DeleteTape). Source: TensorFlow's GradientTape."""
from . import _lib
from ._lib import ffi, lib
from ._util import FLUSH_AT, _tensor_from_info
from .tensor import Tensor

_NULL = ffi.NULL


class Tape:
    """Records the session's ops on watched tensors while it exists.

    Use it as a context manager; inside the block every tensor an op
    reads is watched (watch_accessed=True, as TensorFlow's
    watch_accessed_variables); with watch_accessed=False only what watch=
    or tape.watch names is, before the ops that use it. Then call
    tape.gradient(target, sources), inside the block or after it. A
    one-shot tape (persistent=False) answers one gradient and is then
    deleted on the daemon; a persistent one lives until tape.delete() or
    until it is collected. Only floating tensors carry gradients."""

    def __init__(self, session, persistent=False, watch=(),
                 watch_accessed=True):
        self.session = session
        self.persistent = bool(persistent)
        self.id = None
        self._watch = list(watch)
        self._watch_accessed = bool(watch_accessed)
        self._watched = set()
        self._done = False

    def __enter__(self):
        s = self.session
        with s._lock:
            if len(s._pending) >= FLUSH_AT:
                s._flush_deletes()
            self.id = lib.pd_session_new_id(s._h())
            st = _lib.status()
            if s._pipelined:
                _lib.check(lib.pd_stream_tape_start(
                    s._get_stream(), self.id, self.persistent, _NULL, st), st)
            else:
                s._drain()
                _lib.check(lib.pd_tape_start(s._s, self.id, self.persistent,
                                             _NULL, st), st)
        if self._watch:
            self.watch(*self._watch)
        if self._watch_accessed:
            s._tapes.append(self)
        return self

    def __exit__(self, *exc):
        try:
            self.session._tapes.remove(self)
        except ValueError:
            pass
        return False

    def _accessed(self, tensors):
        """Inside the block: watches the inputs of an op about to run that
        the tape does not watch yet (TensorFlow's watch_accessed_variables,
        for every tensor)."""
        new = [t for t in tensors if t.id not in self._watched]
        if new and not self._done:
            self.watch(*new)

    def __del__(self):
        try:
            if self.id is not None and not self._done:
                self._done = True
                self.session._pending_tapes.append(self.id)
        except Exception:
            pass

    def _check(self):
        if self.id is None:
            raise ValueError("use the tape as a context manager: "
                             "with session.tape() as tape: ...")
        if self._done:
            raise ValueError("tape %d was deleted (a one-shot tape answers "
                             "one gradient; use persistent=True for more)"
                             % self.id)

    def watch(self, *tensors):
        """Watches tensors: ops that consume them are recorded from now
        on, and they can be sources of a gradient."""
        self._check()
        ts = [t for x in tensors
              for t in (x if isinstance(x, (list, tuple)) else (x,))]
        if not ts:
            return
        self._watched.update(t.id for t in ts)
        s = self.session
        ids = ffi.new("uint64_t[]", [_tensor(t, s).id for t in ts])
        st = _lib.status()
        with s._lock:
            s._h()
            if s._pipelined:
                _lib.check(lib.pd_stream_tape_watch(
                    s._get_stream(), self.id, ids, len(ts), _NULL, st), st)
            else:
                s._drain()
                _lib.check(lib.pd_tape_watch(s._s, self.id, ids, len(ts),
                                             _NULL, st), st)

    def gradient(self, target, sources, output_gradient=None):
        """Gradients of `target` with respect to `sources` (a Tensor, or a
        list of them: the result has the same form), weighted by
        output_gradient (default: ones like the target). A source the
        target does not depend on gets zeros."""
        self._check()
        s = self.session
        single = isinstance(sources, Tensor)
        srcs = [sources] if single else list(sources)
        src_ids = ffi.new("uint64_t[]", [_tensor(t, s).id for t in srcs])
        n = len(srcs)
        res = ffi.new("uint64_t[]", n)
        og = _tensor(output_gradient, s).id if output_gradient is not None \
            else 0
        st = _lib.status()
        with s._lock:
            s._h()
            if len(s._pending) >= FLUSH_AT:
                s._flush_deletes()
            if s._pipelined:
                t = s._get_stream()
                _lib.check(lib.pd_stream_tape_gradient(
                    t, self.id, _tensor(target, s).id, src_ids, n, og, res,
                    s._index, st), st)
                # a source's gradient lives on the source's device set
                outs = [Tensor(s, res[i], src._dtype, src._shape, None,
                               src._devices) for i, src in enumerate(srcs)]
                s._items[s._index[0]] = [o.id for o in outs]
                if not self.persistent:
                    self._done = True
                    lib.pd_stream_tape_delete(t, self.id, _NULL, st)
            else:
                s._drain()
                infos = ffi.new("pd_tensor_info[]", n)
                _lib.check(lib.pd_tape_gradient(
                    s._s, self.id, _tensor(target, s).id, src_ids, n, og, res,
                    infos, _NULL, st), st)
                # mirrored or not: the daemon knows (np.asarray asks it)
                outs = [_tensor_from_info(s, infos[i], None,
                                          srcs[i]._devices)
                        for i in range(n)]
                if not self.persistent:
                    self._done = True
                    lib.pd_tape_delete(s._s, self.id, _NULL, st)
        return outs[0] if single else outs

    def delete(self):
        """Deletes the tape on the daemon (batched with the next call)."""
        if self.id is not None and not self._done:
            self._done = True
            self.session._pending_tapes.append(self.id)


def _tensor(t, s):
    if not isinstance(t, Tensor):
        raise TypeError("expected a paradev.Tensor, got %s"
                        % type(t).__name__)
    if t.session is not s:
        raise ValueError("tensor %d belongs to another session" % t.id)
    return t
