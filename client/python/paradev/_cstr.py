"""Strings for C: every str or bytes the package hands libparadev passes
here, so that none is cut short at a NUL byte (a C string ends at its
first NUL: "n\\0x.safetensors" would name the file "n")."""
import os

from .errors import InvalidArgument


def cbytes(v, what):
    """The bytes of `v` (a str, UTF-8 encoded, or bytes) for a C string.
    Raises ValueError naming `what` for a NUL byte or a str that is not
    valid Unicode (a lone surrogate), TypeError for anything else."""
    if isinstance(v, str):
        try:
            b = v.encode()
        except UnicodeEncodeError as e:
            raise ValueError("%s: %r is not valid Unicode (%s); expected "
                             "text that UTF-8 can encode" % (what, v, e.reason)
                             ) from None
    elif isinstance(v, (bytes, bytearray)):
        b = bytes(v)
    else:
        raise TypeError("%s: expected a str, got %s" % (what,
                                                        type(v).__name__))
    if b"\0" in b:
        raise ValueError("%s: %r contains a NUL byte; a C string would end "
                         "there and name something else" % (what, v))
    return b


def cint(v, what, lo, hi, expected):
    """int(v) for a C integer field of range lo..hi. Raises
    paradev.InvalidArgument (as the daemon does for a value in the field but
    out of its range) naming `what` and `expected` when it does not fit the
    field: cffi would raise a bare OverflowError."""
    n = int(v)
    if not lo <= n <= hi:
        raise InvalidArgument("%s=%d is out of range: expected %s" % (
            what, n, expected))
    return n


def cpath(p, what):
    """The bytes of a path (a str, bytes or os.PathLike) as the OS spells
    it (os.fsencode: bytes stay bytes, undecodable names round-trip).
    Raises TypeError for anything else, ValueError for a NUL byte."""
    try:
        p = os.fspath(p)
    except TypeError:
        raise TypeError("%s: a path is a str, bytes or os.PathLike; got %s"
                        % (what, type(p).__name__)) from None
    b = os.fsencode(p)
    if b"\0" in b:
        raise ValueError("%s: %r contains a NUL byte; a C string would end "
                         "there and name another file" % (what, p))
    return b
