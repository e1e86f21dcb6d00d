"""paradev: the Python client of paradevd, over libparadev.

    import numpy as np, paradev
    with paradev.connect("unix:/tmp/paradevd.sock") as client:
        with client.session("demo") as s:
            x = s.upload(np.arange(8, dtype=np.float32).reshape(4, 2),
                         paradev.sharded(0))
            y = s.ops.AllReduce(x * x, reduction="sum")
            print(y.numpy(paradev.mirrored()))

See client/python/README.md.
"""
from ._lib import LIBRARY_PATH, LibraryNotFound, lib as _clib, ffi as _ffi
from ._dtypes import bfloat16
from .checkpoint import Load, LoadProgress
from .client import (Client, DeviceInfo, MeshInfo, MeshRankInfo, ServerInfo,
                     connect, default_target)
from .errors import *  # noqa: F401,F403 -- Error and its subclasses
from .errors import Error, __all__ as _error_names
from .functions import (Function, FunctionDef, PASSES, Spec, Symbol,
                        function, gradients)
from .layouts import (Layout, component, concat, mirrored, per_component,
                      sharded)
from .ops import OpDef
from .session import Session
from .tape import Tape
from .tensor import Tensor

__version__ = "0.1.0"
library_version = _ffi.string(_clib.pd_version()).decode()

__all__ = ["connect", "Client", "Session", "Tensor", "Tape", "Layout",
           "mirrored", "sharded", "per_component", "component", "concat",
           "bfloat16", "ServerInfo", "DeviceInfo", "MeshInfo", "MeshRankInfo",
           "OpDef", "default_target",
           "LibraryNotFound", "LIBRARY_PATH", "library_version", "Load",
           "LoadProgress", "Function", "FunctionDef", "Spec", "Symbol", "function",
           "gradients", "PASSES"] + \
    list(_error_names)
