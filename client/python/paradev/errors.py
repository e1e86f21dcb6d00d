"""paradev.Error and one subclass per status code (gRPC's numbers, as
include/paradev/types.h has them). A failed call raises the subclass of its
code carrying the daemon's (or libparadev's) message."""


class Error(Exception):
    """A call to the daemon failed.

    code:      the status code's number (gRPC's: 3 is INVALID_ARGUMENT, ...)
    code_name: its name, "INVALID_ARGUMENT"
    message:   what was wrong and what was expected (the daemon's words)
    hint:      one sentence on what to do next (libparadev's pd_status_hint:
               the code's advice, or the message's); str() shows it for
               UNAVAILABLE and UNAUTHENTICATED
    """

    code = 2
    code_name = "UNKNOWN"

    def __init__(self, message, hint=None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self):
        s = "%s: %s" % (self.code_name, self.message)
        if self.hint and self.code_name in ("UNAVAILABLE", "UNAUTHENTICATED"):
            s += " (%s)" % self.hint
        return s


_NAMES = [
    (1, "CANCELLED", "Cancelled"),
    (2, "UNKNOWN", "Unknown"),
    (3, "INVALID_ARGUMENT", "InvalidArgument"),
    (4, "DEADLINE_EXCEEDED", "DeadlineExceeded"),
    (5, "NOT_FOUND", "NotFound"),
    (6, "ALREADY_EXISTS", "AlreadyExists"),
    (7, "PERMISSION_DENIED", "PermissionDenied"),
    (8, "RESOURCE_EXHAUSTED", "ResourceExhausted"),
    (9, "FAILED_PRECONDITION", "FailedPrecondition"),
    (10, "ABORTED", "Aborted"),
    (11, "OUT_OF_RANGE", "OutOfRange"),
    (12, "UNIMPLEMENTED", "Unimplemented"),
    (13, "INTERNAL", "Internal"),
    (14, "UNAVAILABLE", "Unavailable"),
    (15, "DATA_LOSS", "DataLoss"),
    (16, "UNAUTHENTICATED", "Unauthenticated"),
]

BY_CODE = {}
__all__ = ["Error"]
for _code, _name, _cls in _NAMES:
    _c = type(_cls, (Error,), {"code": _code, "code_name": _name,
                               "__doc__": "Status code %s (%d)." % (_name, _code)})
    _c.__module__ = "paradev"
    globals()[_cls] = _c
    BY_CODE[_code] = _c
    __all__.append(_cls)
Error.__module__ = "paradev"


def error_for(code, message, hint=None):
    """The Error subclass instance for status `code`."""
    cls = BY_CODE.get(int(code))
    if cls is None:
        e = Error("code %d: %s" % (code, message), hint)
        e.code = int(code)
        return e
    return cls(message, hint)
