"""SMLA client for Python: bindings over the C++ client library (client/include/smla/client/).

    import smla
    c = smla.Client("127.0.0.1:50051")
    info = c.info()
    seq = c.create_sequence("dsv4.1-flash", "req-1")
    req = smla.StepRequest("dsv4.1-flash", 0, [smla.Span(seq, 0, kv_rows, q)])
    out = smla.bf16_to_float32(c.step(req).out)

See docs/integration.md ("Python") for the whole API: sequences, unary and streamed steps,
shared-memory regions and the step ring, Cluster, TLS and tokens, and the errors.
"""

from . import errors
from ._smla import (
    __version__,
    ROW_DRAFT,
    ROW_VERIFY,
    Client,
    Cluster,
    Region,
    Sequence,
    Span,
    StepRequest,
    StepResult,
    StepRing,
    StepStream,
)
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DataLoss,
    DeadlineExceeded,
    Error,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)
from .tensors import (
    bf16_to_float32,
    decode_mxfp8,
    decode_mxfp8_query,
    e4m3_to_float32,
    e8m0_to_float32,
    float32_to_bf16,
)

__all__ = [
    "errors",
    "__version__",
    "ROW_DRAFT",
    "ROW_VERIFY",
    "Client",
    "Cluster",
    "Region",
    "Sequence",
    "Span",
    "StepRequest",
    "StepResult",
    "StepRing",
    "StepStream",
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "DataLoss",
    "DeadlineExceeded",
    "Error",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "bf16_to_float32",
    "decode_mxfp8",
    "decode_mxfp8_query",
    "e4m3_to_float32",
    "e8m0_to_float32",
    "float32_to_bf16",
]
