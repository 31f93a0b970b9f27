"""Exceptions of the smla client: one class per gRPC status code, all under smla.Error.

Every error keeps the server's message (for InvalidArgument it names the field, row and
value) and the numeric gRPC code (``err.code``) and its name (``err.code_name``).
"""


class Error(Exception):
    """Base of every error the server or the client library reports."""

    code = 2
    code_name = "UNKNOWN"

    def __init__(self, message=""):
        super().__init__(message)
        self.message = message


def _subclass(name, code, code_name, doc):
    cls = type(name, (Error,), {"code": code, "code_name": code_name, "__doc__": doc})
    cls.__module__ = __name__
    return cls


Cancelled = _subclass("Cancelled", 1, "CANCELLED", "The call was cancelled.")
Unknown = _subclass("Unknown", 2, "UNKNOWN", "An error without a better code.")
InvalidArgument = _subclass(
    "InvalidArgument", 3, "INVALID_ARGUMENT",
    "A bug in the request (dtype, shape, position gap, top-k entry, ...); do not retry it "
    "unchanged.")
DeadlineExceeded = _subclass(
    "DeadlineExceeded", 4, "DEADLINE_EXCEEDED",
    "timeout_us or the call's deadline passed; read length() and re-send from there.")
NotFound = _subclass(
    "NotFound", 5, "NOT_FOUND",
    "Unknown model, layer, sequence or region; re-create and re-fill the sequence.")
AlreadyExists = _subclass("AlreadyExists", 6, "ALREADY_EXISTS", "The sequence id is taken.")
PermissionDenied = _subclass(
    "PermissionDenied", 7, "PERMISSION_DENIED", "Another tenant's resource (a region).")
ResourceExhausted = _subclass(
    "ResourceExhausted", 8, "RESOURCE_EXHAUSTED",
    "A queue, pool or quota is full (nothing written); back off and retry.")
FailedPrecondition = _subclass(
    "FailedPrecondition", 9, "FAILED_PRECONDITION",
    "Server state is missing (sinks, rope table, regions not enabled, ...); fix it, retry.")
Aborted = _subclass("Aborted", 10, "ABORTED", "The operation was aborted.")
OutOfRange = _subclass(
    "OutOfRange", 11, "OUT_OF_RANGE", "A range does not fit (e.g. a region too small).")
Unimplemented = _subclass("Unimplemented", 12, "UNIMPLEMENTED", "Not supported by this server.")
Internal = _subclass(
    "Internal", 13, "INTERNAL", "A backend failure or server bug; move the work elsewhere.")
Unavailable = _subclass(
    "Unavailable", 14, "UNAVAILABLE",
    "The server is draining, unhealthy or unreachable; its sequences are lost to you.")
DataLoss = _subclass(
    "DataLoss", 15, "DATA_LOSS",
    "A sequence whose server died (Cluster), or a response that does not parse.")
Unauthenticated = _subclass(
    "Unauthenticated", 16, "UNAUTHENTICATED", "A missing or invalid token or certificate.")

_BY_CODE = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound, AlreadyExists,
                PermissionDenied, ResourceExhausted, FailedPrecondition, Aborted, OutOfRange,
                Unimplemented, Internal, Unavailable, DataLoss, Unauthenticated)
}


def from_status(code, message):
    """The exception for gRPC status `code` with `message` (used by the bindings)."""
    return _BY_CODE.get(code, Error)(message)
