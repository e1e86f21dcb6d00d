"""Checkpoints of a Session: load and save, read and written by the daemon
itself beneath its storage roots (Session inherits them, a mixin).

A checkpoint's bytes never cross the client's wire: the daemon reads
safetensors, .npy and .npz files (and writes safetensors and .npy) through
its block cache, and only handles, dtypes and shapes come back. A load
returns as soon as the file's header was read; the bytes stream into the
devices afterwards (Load.progress(), Load.wait(), or a progress callback
tell how far it came). Source: pd_load_tensors, pd_load_progress and
pd_save_tensors (include/paradev/checkpoint.h).
"""
import collections
import time

from . import _lib, layouts, placement
from ._lib import ffi, lib
from .errors import DeadlineExceeded, error_for
from ._cstr import cbytes, cpath
from ._util import _call_options, _tensor_from_info, sliced_sync
from .tensor import Tensor

_NULL = ffi.NULL
MAX_RANK = _lib.C["PD_MAX_RANK"]
_FORMATS = {None: lib.PD_CHECKPOINT_AUTO, "auto": lib.PD_CHECKPOINT_AUTO,
            "safetensors": lib.PD_CHECKPOINT_SAFETENSORS,
            "npy": lib.PD_CHECKPOINT_NPY, "npz": lib.PD_CHECKPOINT_NPZ}
# A progress poll waits at most this long for bytes_done to change (the
# daemon allows 60 s; shorter keeps a timeout= honest).
_POLL_S = 1.0
_LAYOUTS_HINT = ("paradev.mirrored() (component 0, once), paradev.sharded(axis)"
                 " (the components gathered along axis) or "
                 "paradev.per_component() (one entry '<name>:<k>' per device)")

LoadProgress = collections.namedtuple(
    "LoadProgress", "bytes_done bytes_total tensors_done tensors_total "
    "tensors_failed done error")
LoadProgress.__doc__ = """How far a load has come (pd_load_progress_info):
bytes_done / bytes_total (host bytes read), tensors_done / tensors_total /
tensors_failed, done (every tensor ready or failed), error (None, or the
first failed read's paradev.Error: it is also stored on its tensor)."""


class Load(dict):
    """What Session.load returns: a dict name -> Tensor, in the file's order
    (or that of `names`), whose dtypes and shapes are known at once while
    the bytes stream into the devices. Beside the dict:

    load_id       the daemon's id of the load
    total_bytes   host bytes it reads
    host_shapes   name -> the value's shape in the file (for a sharded
                  tensor the whole value's; the Tensor's shape is its
                  components'), None for per-component tensors
    progress(wait=0)   a LoadProgress now, or once bytes_done changed
    wait(callback=None, timeout=None)   waits for the end; raises the first
                  failed read's error
    """

    def __init__(self, session, load_id, total_bytes):
        super().__init__()
        self.session = session
        self.load_id = load_id
        self.total_bytes = total_bytes
        self.host_shapes = {}

    def __repr__(self):
        return "<paradev.Load %d: %d tensors, %d bytes>" % (
            self.load_id, len(self), self.total_bytes)

    def progress(self, wait=0, *, timeout=None):
        """The load's LoadProgress. wait: seconds (0 to 60); 0 answers at
        once, otherwise the daemon answers once bytes_done changed or the
        load ended, after at most `wait` seconds. A failed read is not an
        error of this call: it is the result's .error. Raises
        paradev.NotFound for a load the daemon forgot (it keeps a session's
        last 64 finished loads), paradev.FailedPrecondition once the session
        closed."""
        if not 0 <= wait <= 60:
            raise ValueError("wait=%r: expected 0 to 60 seconds" % (wait,))
        wait_ms = int(round(wait * 1000))
        if timeout is None and wait_ms:
            timeout = wait + 10.0  # the client's default may be shorter
        info = ffi.new("pd_load_progress_info *")
        st = _lib.status()
        s = self.session
        _lib.check(lib.pd_load_progress(s._h(), self.load_id, wait_ms, info,
                                        _call_options(timeout), st), st)
        err = None
        if info.code:
            err = error_for(info.code, ffi.string(info.message).decode(
                "utf-8", "replace"))
        return LoadProgress(info.bytes_done, info.bytes_total,
                            info.tensors_done, info.tensors_total,
                            info.tensors_failed, bool(info.done), err)

    def wait(self, callback=None, *, timeout=None):
        """Waits until every tensor of the load is ready or failed, calling
        callback(bytes_done, bytes_total) at once, whenever bytes_done grows,
        and at the end. Returns the final LoadProgress; raises the first
        failed read's error (the other tensors stay usable), or
        paradev.DeadlineExceeded past `timeout` seconds (the load goes on)."""
        p = self._follow(callback, timeout)
        if p.error is not None:
            raise p.error
        return p

    def _follow(self, callback, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        p = self.progress(0)
        last = None
        while True:
            if callback is not None and (p.bytes_done != last or p.done):
                callback(p.bytes_done, p.bytes_total)
                last = p.bytes_done
            if p.done:
                return p
            wait = _POLL_S
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineExceeded(
                        "load %d: %d of %d bytes after %g s (the load goes "
                        "on)" % (self.load_id, p.bytes_done, p.bytes_total,
                                 timeout))
                wait = min(wait, left)
            p = self.progress(max(wait, 0.001))


def _format(fmt, save):
    key = fmt.lower() if isinstance(fmt, str) else fmt
    if key not in _FORMATS or (save and key == "npz"):
        raise ValueError("format=%r: expected None (by the file: %s), "
                         "'safetensors', 'npy'%s" % (
                             fmt, "'.npy' by extension, else safetensors"
                             if save else "its magic bytes",
                             "" if save else " or 'npz'"))
    return _FORMATS[key]


def _c_layout(layout, what):
    layouts.check(layout, what)
    if layout.kind not in (layouts.MIRRORED, layouts.SHARDED,
                           layouts.PER_COMPONENT):
        raise ValueError("%s: %r; a checkpoint tensor is %s" %
                         (what, layout, _LAYOUTS_HINT))
    return layout


def _str_arg(v, what):
    if not isinstance(v, str):
        raise TypeError("%s: expected a str, got %s" % (what, type(v).__name__))
    return cbytes(v, what)


def _check_names(names, per_name, default, component_sources):
    """Refuses what would silently load something else than asked."""
    if not names:
        raise ValueError("load: names=[] names no tensor; pass None for "
                         "every tensor of the file")
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError("load: the name %r is given twice" % (n,))
        seen.add(n)
    if per_name:
        extra = [k for k in per_name if k not in seen]
        if extra:
            raise ValueError("load: layout names %s, which names= lacks (%s)"
                             % (", ".join(map(repr, extra)),
                                ", ".join(map(repr, names))))
    pc = [n for n in names if getattr(
        per_name.get(n, default) if per_name else default, "kind",
        None) == layouts.PER_COMPONENT]
    if component_sources is not None and not pc:
        raise ValueError("load: component_sources, but no tensor is loaded "
                         "paradev.per_component()")
    if isinstance(component_sources, dict):
        extra = [k for k in component_sources if k not in pc]
        if extra:
            raise ValueError("load: component_sources names %s, which is not "
                             "loaded paradev.per_component()"
                             % ", ".join(map(repr, extra)))


class Checkpoints:
    """Session's load and save (a mixin: needs _lock, _h, _pending,
    _flush_deletes, _drain, _input_id, num_devices)."""

    def _quiesce(self):
        """Sends queued deletes and waits for the pipeline's replies, so the
        daemon knows every handle the caller made (raising a failed item's
        error)."""
        self._h()
        if self._pending:
            self._flush_deletes()
        self._drain()

    # -- load ------------------------------------------------------------------
    def load(self, path, names=None, layout=None, *, devices=None,
             format=None, component_sources=None, progress=None,
             timeout=None):
        """Loads tensors of a checkpoint the daemon reads itself: `path`
        beneath one of its storage roots (relative: tried under each local
        root; absolute: must begin with one) or an http(s):// URL beneath an
        allowed prefix; safetensors, .npy (one tensor, named "") or .npz
        (members named without ".npy"), told apart by their magic bytes
        unless format= says ('safetensors', 'npy', 'npz').

        names:  the tensors wanted (None: every tensor of the file, in its
                order; a str: that one).
        layout: paradev.mirrored() (the default: the whole value on every
                device), paradev.sharded(axis) (split as an upload splits;
                each device reads only its own bytes where it can) or
                paradev.per_component() (one value per device: from
                component_sources, or from the entries "<name>:<k>" a
                per-component save wrote); or a dict name -> layout (names
                it lacks load mirrored; with names=None its keys are the
                names).
        devices: where the tensors are placed (issue #17): a list of device
                indices or names for every tensor, or a dict name -> list
                (the others: the session's devices; needs names=); None:
                the session's devices. A layout splits over, and
                per_component reads one value per device of, the tensor's
                own set.
        component_sources: for per-component tensors, one path per device
                of the tensor's set (a list for all of them, or a dict
                name -> list).
        progress: callback(bytes_done, bytes_total): when given, load
                returns only once the load ended, having called it at once,
                whenever bytes_done grew and at the end. A failed read does
                not raise here: it is stored on its tensor.
        timeout: seconds for the call (and, with progress, for the whole
                load: paradev.DeadlineExceeded past it); None: the client's.

        Returns a Load: a dict name -> Tensor, with dtype and shape known at
        once; the bytes stream into the devices afterwards. tensor.numpy(),
        tensor.wait() and session.sync() wait for them and raise the error
        of a failed read (that tensor's alone); Load.progress() and
        Load.wait() follow the load. In pipelined mode the stream's queue
        is sent and waited for first (raising a failed item's error); the
        callback runs in the caller's thread.

        Raises (on error no tensor is made): paradev.PermissionDenied
        (outside the storage roots), paradev.NotFound (no such file, or a
        name the file lacks), paradev.InvalidArgument (a malformed file, a
        layout that does not fit), paradev.Unimplemented (a dtype paradev
        lacks), paradev.ResourceExhausted (quota, device memory),
        paradev.FailedPrecondition (the daemon has no storage root),
        paradev.Unavailable (an HTTP source unreachable); TypeError /
        ValueError for arguments that are wrong before any call."""
        src = cpath(path, "load: path")
        if isinstance(names, str):
            names = [names]
        per_name = isinstance(layout, dict)
        if per_name and names is None:
            names = list(layout)
        where = self._load_devices(devices, names)
        default = layouts.mirrored() if per_name or layout is None \
            else _c_layout(layouts.check_placing(layout, "load: layout"),
                           "load: layout")
        opts = ffi.new("pd_load_options *")
        opts.struct_size = ffi.sizeof("pd_load_options")
        opts.format = _format(format, False)
        keep = []  # what the specs point to, alive until the call returns
        specs, n = _NULL, 0
        if names is not None:
            names = list(names)
            specs = self._load_specs(names, layout if per_name else None,
                                     default, component_sources, keep, where)
            n = len(names)
        else:
            if default.kind == layouts.PER_COMPONENT:
                raise ValueError("load: paradev.per_component() needs the "
                                 "tensors' names (names=...)")
            if component_sources is not None:
                raise ValueError("load: component_sources needs names= and "
                                 "a paradev.per_component() layout")
            opts.default_layout = _pd_layout(default)
        if isinstance(where, tuple):
            _need_load_placement("pd_load_options", "default_devices")
            keep.append(placement.c_array(where)[0])
            opts.default_devices = keep[-1]
            opts.n_default_devices = len(where)
        out = ffi.new("pd_load **")
        st = _lib.status()
        with self._lock:
            self._quiesce()
            _lib.check(lib.pd_load_tensors(self._s, src, specs, n, opts, out,
                                           _call_options(timeout), st), st)
        ld = out[0]
        try:
            result = self._load_result(ld, names, layout if per_name else
                                       None, default, where)
        finally:
            lib.pd_load_delete(ld)
        if progress is not None:
            result._follow(progress, timeout)
        return result

    def _load_devices(self, devices, names):
        """load's devices=: None, a tuple (every tensor) or a dict name ->
        tuple, checked."""
        if devices is None:
            return None
        if not isinstance(devices, dict):
            return placement.normalize(devices, "load: devices", self.client)
        if names is None:
            raise ValueError("load: devices as a dict (name -> devices) needs "
                             "names= (or a dict layout=) saying which tensors "
                             "to load")
        extra = [k for k in devices if k not in names]
        if extra:
            raise ValueError("load: devices names %s, which names= lacks (%s)"
                             % (", ".join(map(repr, extra)),
                                ", ".join(map(repr, names))))
        out = {k: placement.normalize(v, "load: devices of %r" % (k,),
                                      self.client)
               for k, v in devices.items()}
        if out:
            _need_load_placement("pd_load_spec", "devices")
        return out

    def _load_specs(self, names, per_name, default, component_sources,
                    keep, where=None):
        """pd_load_spec[len(names)]; the strings they point to in keep."""
        _check_names(names, per_name, default, component_sources)
        specs = ffi.new("pd_load_spec[]", len(names))
        for i, name in enumerate(names):
            keep.append(ffi.new("char[]", _str_arg(name, "load: name")))
            specs[i].name = keep[-1]
            on = where.get(name) if isinstance(where, dict) else where
            if isinstance(where, dict) and on is not None:
                keep.append(placement.c_array(on)[0])
                specs[i].devices = keep[-1]
                specs[i].n_devices = len(on)
            lay = per_name.get(name, default) if per_name else default
            _c_layout(layouts.check_placing(lay, "load: layout of %r" % name),
                      "load: layout of %r" % name)
            specs[i].layout = _pd_layout(lay)
            if lay.kind != layouts.PER_COMPONENT:
                continue
            srcs = self._sources(component_sources, name,
                                 len(on) if on else self.num_devices)
            if srcs:
                arr = [ffi.new("char[]", cpath(
                    p, "load: component source of %r" % name)) for p in srcs]
                keep.extend(arr)
                keep.append(ffi.new("char *[]", arr))
                specs[i].component_sources = keep[-1]
                specs[i].n_component_sources = len(arr)
        return specs

    def _sources(self, component_sources, name, n):
        srcs = component_sources
        if isinstance(srcs, dict):
            srcs = srcs.get(name)
        if srcs is None:
            return []
        if isinstance(srcs, (str, bytes)) or len(srcs) != n:
            raise ValueError(
                "load: component_sources of %r: expected a list of %d paths "
                "(one per device of its set), got %r" % (name, n, srcs))
        return list(srcs)

    def _load_result(self, ld, names, per_name, default, where=None):
        result = Load(self, lib.pd_load_id(ld), lib.pd_load_total_bytes(ld))
        info = ffi.new("pd_tensor_info *")
        rank = ffi.new("int *")
        dims = ffi.new("int64_t[]", MAX_RANK)
        for i in range(lib.pd_load_num_tensors(ld)):
            name = ffi.string(lib.pd_load_tensor_name(ld, i)).decode(
                "utf-8", "replace")
            lib.pd_load_tensor_info(ld, i, info)
            lay = per_name.get(name, default) if per_name else default
            on = where.get(name) if isinstance(where, dict) else where
            result[name] = _tensor_from_info(self, info[0],
                                             lay.kind == layouts.MIRRORED, on)
            result.host_shapes[name] = (
                tuple(dims[k] for k in range(rank[0]))
                if lib.pd_load_tensor_host_shape(ld, i, rank, dims) else None)
        return result

    # -- save --------------------------------------------------------------
    def save(self, path, tensors, metadata=None, *, layout=None,
             overwrite=False, format=None, timeout=None):
        """Saves tensors to `path` beneath one of the daemon's storage
        roots, written by the daemon: safetensors (or .npy, one tensor,
        when the path ends in ".npy" or format='npy'), through a temporary
        file in the same directory that is fsynced and renamed into place,
        so a crash leaves the old file or the new one.

        tensors:  a dict name -> Tensor, or a list of (name, tensor) or
                  (name, tensor, layout); names 1 to 255 bytes (a .npy keeps
                  none).
        metadata: a dict str -> str, safetensors' __metadata__ (at most 64).
        layout:   how each tensor is read off the devices: a tuple's third
                  item first, then `layout` (one Layout for every tensor, or
                  a dict name -> Layout); paradev.mirrored() (component 0,
                  once), paradev.sharded(axis) / concat(axis) (the components
                  gathered along axis) or paradev.per_component() (entries
                  "<name>:<k>" and metadata "paradev.components.<name>").
                  Without one, a tensor the client knows is mirrored
                  (Tensor.is_mirrored True) is saved mirrored; any other
                  raises ValueError naming it.
        overwrite: replace an existing file (else paradev.AlreadyExists).
        timeout:  seconds; None: the client's default. Give one that fits
                  the file: a call that times out does not stop the save.

        Waits for the tensors (a pipelined session's queue is sent and
        waited for first); returns the tensor bytes written (the file less
        its header). Raises paradev.PermissionDenied (outside the roots),
        paradev.AlreadyExists, paradev.NotFound (an unknown handle, a
        directory that does not exist), paradev.InvalidArgument (duplicate
        or bad names, layouts that do not fit), paradev.ResourceExhausted
        (disk full), paradev.FailedPrecondition (no storage root), or a
        tensor's stored error (then nothing is written)."""
        dst = cpath(path, "save: path")
        items = self._save_items(tensors, layout)
        specs = ffi.new("pd_save_spec[]", len(items))
        keep = []
        for i, (name, t, lay) in enumerate(items):
            keep.append(ffi.new("char[]", cbytes(name, "save: name")))
            specs[i].name = keep[-1]
            specs[i].id = self._input_id(t)
            specs[i].layout = _pd_layout(lay)
        opts = ffi.new("pd_save_options *")
        opts.struct_size = ffi.sizeof("pd_save_options")
        opts.format = _format(format, True)
        opts.overwrite = bool(overwrite)
        if metadata:
            if not isinstance(metadata, dict):
                raise TypeError("save: metadata is a dict str -> str; got %s"
                                % type(metadata).__name__)
            ks = [ffi.new("char[]", _str_arg(k, "save: metadata key"))
                  for k in metadata]
            vs = [ffi.new("char[]", _str_arg(v, "save: metadata[%r]" % k))
                  for k, v in metadata.items()]
            keep += ks + vs
            keys, vals = ffi.new("char *[]", ks), ffi.new("char *[]", vs)
            keep += [keys, vals]
            opts.meta_keys, opts.meta_values = keys, vals
            opts.n_meta = len(ks)
        written = ffi.new("uint64_t *")
        st = _lib.status()
        with self._lock:
            self._quiesce()
            # the wait for the tensors in slices (Ctrl-C works)
            sliced_sync(self, [t.id for _, t, _ in items], timeout, "save")
            _lib.check(lib.pd_save_tensors(self._s, dst, specs, len(items),
                                           opts, written,
                                           _call_options(timeout), st), st)
        return int(written[0])

    def _save_items(self, tensors, layout):
        """[(name, Tensor, Layout)], each layout named or known."""
        if isinstance(tensors, dict):
            raw = [(k, v, None) for k, v in tensors.items()]
        elif isinstance(tensors, (list, tuple)):
            raw = []
            for e in tensors:
                if not isinstance(e, (list, tuple)) or len(e) not in (2, 3):
                    raise TypeError("save: tensors is a dict name -> Tensor "
                                    "or a list of (name, tensor[, layout]); "
                                    "got the item %r" % (e,))
                raw.append((e[0], e[1], e[2] if len(e) == 3 else None))
        else:
            raise TypeError("save: tensors is a dict name -> Tensor or a list "
                            "of (name, tensor[, layout]); got %s"
                            % type(tensors).__name__)
        if not raw:
            raise ValueError("save: no tensors to save")
        out = []
        for name, t, lay in raw:
            if not isinstance(name, str):
                raise TypeError("save: tensor names are str; got %r" % (name,))
            if not isinstance(t, Tensor):
                raise TypeError("save: %r is a %s; save takes paradev Tensors "
                                "(upload host values first)"
                                % (name, type(t).__name__))
            if lay is None:
                lay = layout.get(name) if isinstance(layout, dict) else layout
            if lay is None:
                if t.is_mirrored is not True:
                    raise ValueError(
                        "save: tensor %r (id %d) %s; name its layout (a "
                        "third item, or layout=): %s" % (
                            name, t.id,
                            "differs between devices (sharded or "
                            "per-component, or computed from such)"
                            if t._mirrored is False else
                            "is not known to be mirrored (a gradient, an op "
                            "on mixed inputs)", _LAYOUTS_HINT))
                lay = layouts.mirrored()
            out.append((name, t, _c_layout(lay, "save: layout of %r"
                                           % name)))
        return out


def _need_load_placement(ctype, field):
    """Placed loads need libparadev's placement fields of the load structs
    (issue #17); an older library is told apart before any call."""
    if not _lib.struct_has(ctype, field):
        from .errors import Unimplemented
        raise Unimplemented(
            "load: devices=: this libparadev (%s) has no %s.%s, so it cannot "
            "place a checkpoint's tensors; load on the session's devices and "
            "move them with tensor.to(devices)" % (_lib.LIBRARY_PATH, ctype,
                                                   field))


def _pd_layout(layout):
    p = ffi.new("pd_layout *")
    p.kind = layout.kind
    p.axis = layout.axis
    p.component = 0
    return p[0]
