"""Uploads and downloads of a Session: every layout, through gRPC or
through the session's shared memory region (Session inherits them).

Zero copies on the Python side: an upload hands libparadev the array's own
buffer (ffi.from_buffer), a download writes into a fresh np.empty (or the
caller's out=). Through shared memory, one copy into or out of the region,
as in C. Called with the session's lock taken for the region.
"""
import numpy as np

from . import _dtypes, _lib, layouts, placement
from ._lib import ffi, lib
from .errors import Error
from ._util import (FLUSH_AT, _call_options, _tensor_from_info,
                    sliced_sync)
from .tensor import Tensor

_NULL = ffi.NULL
MAX_RANK = _lib.C["PD_MAX_RANK"]


class Transfers:
    """Session's uploads and downloads (a mixin: needs _lock, _h, _s,
    _pending, _flush_deletes, _drain, describe, num_devices, stats)."""

    # -- uploads ---------------------------------------------------------------
    def upload(self, value, layout, *, dtype=None, devices=None):
        """Uploads a host value as a new tensor: an array (anything
        np.asarray takes) with paradev.mirrored() or paradev.sharded(axis),
        or a list of arrays, one per device, with paradev.per_component().
        devices: the tensor's device set (a list of device indices or
        names, as client.info() shows them; None: the session's devices):
        sharded splits over its size, per_component takes one array per
        device of it. Returns a Tensor whose dtype, shape and devices are
        known at once. Large values travel through shared memory when the
        daemon is local."""
        layouts.check_placing(layout, "upload")
        where = placement.normalize(devices, "upload: devices", self.client)
        if layout.kind == layouts.PER_COMPONENT:
            return self._upload_components(value, dtype, where)
        if layout.kind not in (layouts.MIRRORED, layouts.SHARDED):
            raise ValueError("upload takes paradev.mirrored(), "
                             "paradev.sharded(axis) or paradev.per_component()"
                             "; %r is for downloads" % (layout,))
        a = _host_array(value, dtype)
        dt = _dtypes.to_number(a.dtype)
        with self._lock:
            if len(self._pending) >= FLUSH_AT:
                self._flush_deletes()
            s = self._h()
            tid = lib.pd_session_new_id(s)
            dims = ffi.new("int64_t[]", a.shape) if a.ndim else _NULL
            info = ffi.new("pd_tensor_info *")
            lay = _c_layout(layout)
            st = _lib.status()
            on, n_on = placement.c_array(where)
            region = self._region_for(a.nbytes) if where is None or \
                _lib.has("pd_upload_from_shared_memory_on") else None
            if region is not None:
                ffi.memmove(lib.pd_shared_memory_data(region), a, a.nbytes)
                if where is None:
                    code = lib.pd_upload_from_shared_memory(
                        s, tid, dt, dims, a.ndim, region, 0, lay, info,
                        _NULL, st)
                else:
                    code = lib.pd_upload_from_shared_memory_on(
                        s, on, n_on, tid, dt, dims, a.ndim, region, 0, lay,
                        info, _NULL, st)
                self.stats["shm_upload_bytes"] += a.nbytes
            else:
                buf = ffi.from_buffer(a) if a.nbytes else _NULL
                code = lib.pd_upload_on(s, on, n_on, tid, dt, dims, a.ndim,
                                        buf, a.nbytes, lay, info, _NULL, st)
                self.stats["grpc_upload_bytes"] += a.nbytes
            _lib.check(code, st)
        return _tensor_from_info(self, info[0],
                                 layout.kind == layouts.MIRRORED, where)

    def _upload_components(self, values, dtype, where=None):
        want = len(where) if where is not None else self.num_devices
        if isinstance(values, np.ndarray) or not hasattr(values, "__len__"):
            raise TypeError("paradev.per_component() uploads a list of %d "
                            "arrays (one per device of %s); got %s"
                            % (want, list(where or self.devices),
                               type(values).__name__))
        arrs = [_host_array(v, dtype) for v in values]
        n = len(arrs)
        if n != want:
            raise ValueError("paradev.per_component(): %d arrays for the %d "
                             "devices %s; expected one per device"
                             % (n, want, list(where or self.devices)))
        if dtype is None and len({a.dtype for a in arrs}) > 1:
            raise TypeError("paradev.per_component(): the arrays' dtypes "
                            "differ (%s); pass dtype= or convert them"
                            % ", ".join(str(a.dtype) for a in arrs))
        dt = _dtypes.to_number(arrs[0].dtype)
        dims = [ffi.new("int64_t[]", a.shape or [0]) for a in arrs]
        dims_p = ffi.new("int64_t *[]", dims)
        ranks = ffi.new("int[]", [a.ndim for a in arrs])
        total = sum(a.nbytes for a in arrs)
        info = ffi.new("pd_tensor_info *")
        with self._lock:
            if len(self._pending) >= FLUSH_AT:
                self._flush_deletes()
            s = self._h()
            tid = lib.pd_session_new_id(s)
            st = _lib.status()
            on, n_on = placement.c_array(where)
            region = self._region_for(total) if where is None or _lib.has(
                "pd_upload_components_from_shared_memory_on") else None
            if region is not None:
                base = ffi.cast("char *", lib.pd_shared_memory_data(region))
                off = 0
                for a in arrs:
                    ffi.memmove(base + off, a, a.nbytes)
                    off += a.nbytes
                if where is None:
                    code = lib.pd_upload_components_from_shared_memory(
                        s, tid, dt, n, dims_p, ranks, region, 0, info, _NULL,
                        st)
                else:
                    code = lib.pd_upload_components_from_shared_memory_on(
                        s, on, n_on, tid, dt, n, dims_p, ranks, region, 0,
                        info, _NULL, st)
                self.stats["shm_upload_bytes"] += total
            else:
                bufs = [ffi.from_buffer(a) if a.nbytes else _NULL for a in arrs]
                data = ffi.new("void *[]", bufs)
                sizes = ffi.new("size_t[]", [a.nbytes for a in arrs])
                code = lib.pd_upload_components_on(s, on, n_on, tid, dt, n,
                                                   dims_p, ranks, data, sizes,
                                                   info, _NULL, st)
                self.stats["grpc_upload_bytes"] += total
            _lib.check(code, st)
        return _tensor_from_info(self, info[0], False, where)

    # -- shared memory -----------------------------------------------------
    def _region_for(self, nbytes):
        """The session's shared memory region, grown to hold nbytes, when
        this transfer should use one; else None (gRPC). A region that cannot
        be made turns shared memory off for the session
        (shm_disabled_reason says why)."""
        if not self._shm or nbytes < self.shm_threshold:
            return None
        r = self._region
        if r is not None and lib.pd_shared_memory_size(r) >= nbytes:
            return r
        if r is not None:
            lib.pd_shared_memory_destroy(r, _NULL, _NULL)
            self._region = None
        size = max(nbytes, 2 * (lib.pd_shared_memory_size(r) if r else 0))
        size = (size + (1 << 20) - 1) & ~((1 << 20) - 1)
        out = ffi.new("pd_shared_memory **")
        st = _lib.status()
        code = lib.pd_shared_memory_create(self._s, size, 0, out, _NULL, st)
        if code != 0:
            self._shm = False
            self.shm_disabled_reason = "%s: %s" % (
                ffi.string(lib.pd_code_name(code)).decode(),
                ffi.string(lib.pd_status_message(st)).decode("utf-8",
                                                             "replace"))
            return None
        self._region = out[0]
        return self._region

    # -- downloads -------------------------------------------------------------
    def download(self, tensor, layout, out=None, *, timeout=None):
        """tensor.numpy(layout, out=None, timeout=None); see Tensor.numpy."""
        layouts.check(layout, "download")
        with self._lock:
            self._h()
            if len(self._pending) >= FLUSH_AT:
                self._flush_deletes()
            self._drain()
            dtype = _dtypes.need_numpy(tensor.dtype)
            # Wait first, in slices (Ctrl-C works), and raise a stored error
            # before allocating the host array (a failed huge op's
            # RESOURCE_EXHAUSTED, not np.empty's MemoryError).
            # A computed value never changes: once is enough.
            if not tensor._ready:
                sliced_sync(self, [tensor.id], timeout,
                            "download of tensor %d" % tensor.id)
                tensor._ready = True
            call = _call_options(timeout)
            if layout.kind == layouts.PER_COMPONENT:
                return self._download_components(tensor, dtype, call)
            shape = self._host_shape(tensor, layout)
            if out is None:
                out = np.empty(shape, dtype)
            elif not (isinstance(out, np.ndarray) and out.shape == shape and
                      out.dtype == dtype and out.flags.c_contiguous and
                      out.flags.writeable):
                raise ValueError(
                    "out= must be a writeable C-contiguous %s array of shape "
                    "%s; got %s" % (np.dtype(dtype).name, shape,
                                    _describe_array(out)))
            lay = _c_layout(layout)
            st = _lib.status()
            got = ffi.new("size_t *")
            region = self._region_for(out.nbytes)
            if region is not None:
                code = lib.pd_download_to_shared_memory(
                    self._s, tensor.id, lay, region, 0, _NULL, got, call, st)
                _lib.check(code, st)
                ffi.memmove(out, lib.pd_shared_memory_data(region), got[0])
                self.stats["shm_download_bytes"] += got[0]
            else:
                buf = ffi.from_buffer(out, require_writable=True) \
                    if out.nbytes else _NULL
                code = lib.pd_download(self._s, tensor.id, lay, buf,
                                       out.nbytes, _NULL, got, call, st)
                _lib.check(code, st)
                self.stats["grpc_download_bytes"] += got[0]
            if got[0] != out.nbytes:
                raise Error("download of tensor %d gave %d bytes; expected %d"
                            % (tensor.id, got[0], out.nbytes))
            return out

    def _download_components(self, tensor, dtype, call=_NULL):
        shapes = self._component_shapes(tensor)
        outs = [np.empty(sh, dtype) for sh in shapes]
        n = len(outs)
        st = _lib.status()
        total = sum(o.nbytes for o in outs)
        region = self._region_for(total)
        if region is not None:
            got = ffi.new("size_t *")
            _lib.check(lib.pd_download_components_to_shared_memory(
                self._s, tensor.id, n, region, 0, _NULL, got, call, st), st)
            base = ffi.cast("char *", lib.pd_shared_memory_data(region))
            off = 0
            for o in outs:
                ffi.memmove(o, base + off, o.nbytes)
                off += o.nbytes
            self.stats["shm_download_bytes"] += total
        else:
            bufs = [ffi.from_buffer(o, require_writable=True) if o.nbytes
                    else _NULL for o in outs]
            data = ffi.new("void *[]", bufs)
            caps = ffi.new("size_t[]", [o.nbytes for o in outs])
            _lib.check(lib.pd_download_components(
                self._s, tensor.id, n, data, caps, _NULL, call, st), st)
            self.stats["grpc_download_bytes"] += total
        return outs

    def _component_shapes(self, tensor):
        shape = tensor.shape
        if all(d >= 0 for d in shape):
            return [shape] * len(tensor.devices)  # one per device of ITS set
        return self.describe([tensor])[0]["component_shapes"]

    def _host_shape(self, tensor, layout):
        shape = tensor.shape
        n = len(tensor.devices)  # the tensor's set, not the session's
        if layout.kind == layouts.COMPONENT:
            k = layout.component
            if not 0 <= k < n:
                raise IndexError("paradev.component(%d): tensor %d has %d "
                                 "components (0..%d), on devices %s"
                                 % (k, tensor.id, n, n - 1,
                                    list(tensor.devices)))
        if all(d >= 0 for d in shape):
            if layout.kind != layouts.SHARDED:
                return shape
            ax = layout.axis
            if not -len(shape) <= ax < len(shape):
                raise IndexError("paradev.concat(%d): tensor %d has rank %d"
                                 % (ax, tensor.id, len(shape)))
            s = list(shape)
            s[ax] *= n
            return tuple(s)
        comps = self._component_shapes(tensor)
        if layout.kind == layouts.MIRRORED:
            return comps[0]
        if layout.kind == layouts.COMPONENT:
            return comps[layout.component]
        ax = layout.axis
        r = len(comps[0])
        if not -r <= ax < r:
            raise IndexError("paradev.concat(%d): tensor %d has rank %d"
                             % (ax, tensor.id, r))
        s = list(comps[0])
        s[ax] = sum(c[ax] for c in comps)
        return tuple(s)


def _describe_array(a):
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    return "%s %s%s%s" % (a.dtype, a.shape,
                          "" if a.flags.c_contiguous else " non-contiguous",
                          "" if a.flags.writeable else " read-only")


def _c_layout(layout):
    p = ffi.new("pd_layout *")
    p.kind = layout.kind
    p.axis = layout.axis
    p.component = layout.component
    return p[0]


def _host_array(value, dtype):
    if isinstance(value, Tensor):
        raise TypeError("upload takes host values; tensor %d is already on "
                        "the daemon" % value.id)
    a = np.asarray(value, dtype=dtype)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    _dtypes.to_number(a.dtype)
    if a.ndim > MAX_RANK:
        raise ValueError("rank %d is over paradev's limit of %d"
                         % (a.ndim, MAX_RANK))
    return a if a.flags.c_contiguous else np.array(a, order="C")

