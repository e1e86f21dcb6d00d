"""Finds and loads libparadev, and turns its statuses into exceptions.

The library is bound with cffi in ABI mode: declarations from _cdef.py
(generated from include/paradev/*.h, checked by the test python.cdef), no
compiler at install time. Where it is looked for, in order:

1. $PARADEV_LIBRARY: the path of libparadev.so (nothing else is tried);
2. the build tree, when the package is imported from a source checkout
   (client/python/paradev inside a tree that has include/paradev/paradev.h):
   BUILD/client/libparadev.so for the tree's build directories (build, then
   build-*);
3. the installed library: the dynamic loader's own search (libparadev.so.0:
   LD_LIBRARY_PATH, the ldconfig cache), ctypes.util.find_library("paradev"),
   then PREFIX/lib for sys.prefix, /usr/local and /usr (and their lib64 and
   multiarch directories).

When none loads, importing paradev raises LibraryNotFound (an ImportError)
listing every place tried and why each failed.
"""
import ctypes.util
import glob
import os
import re
import sys
import sysconfig
import threading

from cffi import FFI

from ._cdef import CDEF, CONSTANTS
from .errors import error_for

ffi = FFI()
ffi.cdef(CDEF)

# Placement entry points (issue #17) that libparadev's headers may not
# declare yet, each declared here only where _cdef.py (the headers) lacks
# it; has() says whether the loaded library defines it. Where one is
# missing the package takes another road (a pipelined op with a placement
# is sent as one Execute after the stream's replies; a placed upload goes
# through gRPC instead of shared memory).
_OPTIONAL = {
    "pd_stream_execute_on":
        "pd_code pd_stream_execute_on(pd_stream *t, const int32_t *devices, "
        "int n_devices, const char *op, const uint64_t *inputs, "
        "int n_inputs, const pd_attrs *attrs, uint64_t *output_ids, "
        "int n_outputs, uint64_t *index, pd_status *st);",
    "pd_upload_from_shared_memory_on":
        "pd_code pd_upload_from_shared_memory_on(pd_session *s, "
        "const int32_t *devices, int n_devices, uint64_t id, pd_dtype dtype, "
        "const int64_t *dims, int rank, pd_shared_memory *region, "
        "uint64_t offset, pd_layout layout, pd_tensor_info *info, "
        "const pd_call_options *call, pd_status *st);",
    "pd_upload_components_from_shared_memory_on":
        "pd_code pd_upload_components_from_shared_memory_on(pd_session *s, "
        "const int32_t *devices, int n_devices, uint64_t id, pd_dtype dtype, "
        "int num_components, const int64_t *const *dims, const int *ranks, "
        "pd_shared_memory *region, uint64_t offset, pd_tensor_info *info, "
        "const pd_call_options *call, pd_status *st);",
}
for _name, _decl in _OPTIONAL.items():
    if not re.search(r"\b%s\s*\(" % _name, CDEF):
        ffi.cdef(_decl)


class LibraryNotFound(ImportError):
    """libparadev could not be found or loaded; the message lists where."""


SONAME = "libparadev.so.0"


def _source_root():
    pkg = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(pkg)))
    if os.path.exists(os.path.join(root, "include", "paradev", "paradev.h")):
        return root
    return None


def _candidates():
    """(where, path-or-name) in the order tried."""
    env = os.environ.get("PARADEV_LIBRARY")
    if env:
        yield "$PARADEV_LIBRARY", env
        return
    root = _source_root()
    if root:
        dirs = [os.path.join(root, "build")]
        dirs += sorted(d for d in glob.glob(os.path.join(root, "build-*"))
                       if os.path.isdir(d))
        for d in dirs:
            yield "build tree", os.path.join(d, "client", "libparadev.so")
    yield "the dynamic loader's search", SONAME
    found = ctypes.util.find_library("paradev")
    if found:
        yield "ctypes.util.find_library", found
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    seen = set()
    for prefix in (sys.prefix, "/usr/local", "/usr"):
        for sub in ("lib", "lib64", os.path.join("lib", multiarch)):
            d = os.path.join(prefix, sub)
            if d in seen or (sub.endswith("/") and not multiarch):
                continue
            seen.add(d)
            yield "installed prefix", os.path.join(d, SONAME)


def _load():
    tried = []
    for where, path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("  %s: %s (no such file)" % (where, path))
            continue
        try:
            lib = ffi.dlopen(path)
            lib.pd_version  # noqa: B018 -- the library is libparadev
        except (OSError, AttributeError) as e:
            tried.append("  %s: %s (%s)" % (where, path, e))
            continue
        return lib, path
    raise LibraryNotFound(
        "paradev: libparadev not found. Tried:\n%s\n"
        "Install libparadev (cmake --install build; then ldconfig for "
        "/usr/local), or set PARADEV_LIBRARY to the path of libparadev.so "
        "(in a build tree: build/client/libparadev.so)." % "\n".join(tried))


lib, LIBRARY_PATH = _load()
C = CONSTANTS

_version = ffi.string(lib.pd_version()).decode()
if int(_version.split(".")[0]) != C["PD_VERSION_MAJOR"]:
    raise LibraryNotFound(
        "paradev: %s is libparadev %s; this package was generated from the "
        "headers of %d.%d.%d (major versions differ)" %
        (LIBRARY_PATH, _version, C["PD_VERSION_MAJOR"], C["PD_VERSION_MINOR"],
         C["PD_VERSION_PATCH"]))

_tls = threading.local()


def status():
    """This thread's pd_status (a pd_status belongs to one thread)."""
    st = getattr(_tls, "st", None)
    if st is None:
        st = ffi.gc(lib.pd_status_new(), lib.pd_status_delete)
        if st == ffi.NULL:
            raise MemoryError("pd_status_new")
        _tls.st = st
    return st


def raise_status(code, st):
    msg = ffi.string(lib.pd_status_message(st)).decode("utf-8", "replace")
    hint = ffi.string(lib.pd_status_hint(st)).decode("utf-8", "replace")
    raise error_for(code, msg or ffi.string(lib.pd_code_name(code)).decode(),
                    hint)


_HAS = {}


def has(name):
    """True when the loaded libparadev defines function `name`."""
    v = _HAS.get(name)
    if v is None:
        try:
            getattr(lib, name)
            v = True
        except AttributeError:
            v = False
        _HAS[name] = v
    return v


def struct_has(ctype, field):
    """True when the C struct `ctype` (as declared) has `field`."""
    return field in dict(ffi.typeof(ctype).fields)


def check(code, st):
    """Raises the Error of `code` unless it is PD_OK."""
    if code != 0:
        raise_status(code, st)
