"""NumPy dtypes <-> pd_dtype. bfloat16 comes from ml_dtypes when it is
installed; without it a tensor's dtype is the placeholder `bfloat16` below
and downloading one raises a clear error."""
import numpy as np

try:  # optional: NumPy has no bfloat16
    import ml_dtypes as _ml_dtypes
except ImportError:  # pragma: no cover - depends on the machine
    _ml_dtypes = None


class _Bfloat16Placeholder:
    """Stands for bfloat16 where ml_dtypes is not installed."""
    name = "bfloat16"
    itemsize = 2
    kind = "V"

    def __repr__(self):
        return "paradev.bfloat16 (install ml_dtypes for a NumPy bfloat16)"

    def __eq__(self, other):
        return other is self or other == "bfloat16"

    def __hash__(self):
        return hash("bfloat16")


if _ml_dtypes is not None:
    bfloat16 = np.dtype(_ml_dtypes.bfloat16)
else:
    bfloat16 = _Bfloat16Placeholder()

# pd_dtype numbers (include/paradev/types.h; part of the wire, never change)
_BY_NUMBER = {
    1: np.dtype("float32"), 2: np.dtype("float64"), 3: np.dtype("float16"),
    4: bfloat16, 5: np.dtype("int32"), 6: np.dtype("int64"),
    7: np.dtype("uint8"), 8: np.dtype("bool"),
}
_BY_NAME = {"float32": 1, "float64": 2, "float16": 3, "bfloat16": 4,
            "int32": 5, "int64": 6, "uint8": 7, "bool": 8}
SUPPORTED = ", ".join(_BY_NAME)


def from_number(n):
    return _BY_NUMBER.get(int(n))


def to_number(dtype):
    """pd_dtype of a NumPy dtype, a type (np.float32), or a name."""
    if dtype is bfloat16:
        return 4
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = getattr(dtype, "name", repr(dtype))
    n = _BY_NAME.get(name)
    if n is None:
        raise TypeError("dtype %s is not one paradev has; expected one of %s"
                        % (name, SUPPORTED))
    return n


def need_numpy(dtype):
    """Raises when `dtype` has no NumPy type here (bfloat16 without
    ml_dtypes)."""
    if isinstance(dtype, _Bfloat16Placeholder):
        raise TypeError(
            "bfloat16 has no NumPy dtype here: install ml_dtypes "
            "(pip install ml_dtypes), or cast on the daemon first: "
            "session.op('Cast', t, DstT='float32')")
    return dtype
