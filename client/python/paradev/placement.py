"""Device sets (issue #17): the `devices=` arguments of sessions, uploads,
loads, ops without tensor inputs and copies, checked and turned into the
int32 arrays libparadev takes.

A device set is an ordered list of the daemon's devices: component i of a
tensor on it lives on device set[i]. A device is named by its index in the
daemon's mesh (client.info().devices[i].index) or by its name as
client.info() shows it ("cpu:2", "cuda:0"). Everything wrong with the list
itself (not a list, an unknown name, an index outside the mesh, a device
twice, an empty list) is refused here, before any call, with a TypeError or
ValueError naming the argument; what the daemon decides (a device outside
the session's allowed set: paradev.PermissionDenied; inputs on different
sets: paradev.InvalidArgument) comes back as its exception.
Source: TensorFlow's parallel device, built over a chosen list of devices.
"""
import numbers

from . import _lib
from ._lib import ffi

MAX_DEVICES = _lib.C["PD_MAX_DEVICES"]
_NULL = ffi.NULL


def mesh_names(client):
    """The daemon's device names in mesh order (client.info(), asked once
    per client: a daemon's mesh does not change while it runs)."""
    names = getattr(client, "_mesh_names", None)
    if names is None:
        names = tuple(d.name for d in client.info().devices)
        client._mesh_names = names
    return names


def normalize(devices, what, client):
    """`devices` as a tuple of daemon device indices, or None (the
    session's default) for None. `what` names the argument in errors."""
    if devices is None:
        return None
    if isinstance(devices, (str, bytes)) or \
            not isinstance(devices, (list, tuple, range)):
        raise TypeError(
            "%s: expected a list of devices (indices or names such as "
            "'cpu:2', as client.info() shows them), got %s %r"
            % (what, type(devices).__name__, devices))
    if not devices:
        raise ValueError("%s: [] names no device; pass None for the "
                         "session's default device set" % what)
    names = mesh_names(client)
    n = len(names)
    out = []
    for d in devices:
        if isinstance(d, str):
            try:
                i = names.index(d)
            except ValueError:
                raise ValueError(
                    "%s: %r is not a device of the daemon; expected an index "
                    "0..%d or one of %s" % (what, d, n - 1,
                                            ", ".join(names))) from None
        elif isinstance(d, numbers.Integral) and not isinstance(d, bool):
            i = int(d)
            if not 0 <= i < n:
                raise ValueError(
                    "%s: device %d is out of range; the daemon has %d devices "
                    "(0..%d)" % (what, i, n, n - 1))
        else:
            raise TypeError(
                "%s: a device is an index or a name such as %r, got %s %r"
                % (what, names[0] if names else "cpu:0", type(d).__name__, d))
        if i in out:
            raise ValueError("%s: device %d (%s) is named twice in %r; a "
                             "device set holds each device once"
                             % (what, i, names[i], list(devices)))
        out.append(i)
    if len(out) > MAX_DEVICES:
        raise ValueError("%s: %d devices; at most %d" % (what, len(out),
                                                         MAX_DEVICES))
    return tuple(out)


def c_array(devices):
    """(int32_t[] or NULL, n) for libparadev's *_on calls."""
    if not devices:
        return _NULL, 0
    return ffi.new("int32_t[]", list(devices)), len(devices)


def from_info(info):
    """A pd_tensor_info's device set as a tuple, None when the daemon did
    not say (one older than placement)."""
    n = info.num_devices
    if not 0 < n <= MAX_DEVICES:
        return None
    return tuple(info.devices[k] for k in range(n))
