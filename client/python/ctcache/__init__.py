"""Python client for ctcached, the compiled ONNX tensor cache daemon.

    import ctcache
    with ctcache.connect() as c:                      # $CTCACHE_SOCKET or the D8 default
        r = c.resolve_model("/models/m.onnx", on_miss="wait")
        for t in r.tensors:
            for e in t.entries:
                with c.open_payload(e) as p:          # leased, mmapped read-only
                    data = p.numpy()                  # zero copy; the entry's dtype and shape

A 4-bit onnxruntime model whose weight files are reflinks of the cache's
payloads (copies where the filesystem has no reflinks; ``ctcache.ort``
imports onnxruntime only when called)::

    r = ctcache.materialize("/models/m.onnx")         # -> /models/m.int4.onnx + m.int4.onnx.weights/
    import ctcache.ort
    sess = ctcache.ort.inference_session("/models/m.onnx")  # falls back to onnxruntime's quantizer,
                                                            # with a warning, when no daemon answers

Answers are protobuf messages from ``ctcache.pb`` (the ctcache.v1 API);
devices and struct types are ``ctcache.onnx_pb`` messages (protobuf package
``ctcache_onnx``, so ``import onnx`` can live in the same process).
"""

from ._pb import ctcache_v1_pb2 as pb
from ._pb import onnx_pb2 as onnx_pb
from .client import Client, connect, default_socket, entry_format, state_name
from .errors import (
    Aborted,
    CtcacheError,
    DaemonNotRunning,
    DataLoss,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NothingToRewrite,
    NotFound,
    OutOfRange,
    PayloadMismatch,
    PermissionDenied,
    PrepackError,
    RequestFailed,
    ResourceExhausted,
    SocketPermissionDenied,
    Unavailable,
)
from .ort import materialize
from .payload import Payload

__version__ = "0.1.0"

__all__ = [
    "Aborted",
    "Client",
    "CtcacheError",
    "DaemonNotRunning",
    "DataLoss",
    "FailedPrecondition",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "NothingToRewrite",
    "OutOfRange",
    "Payload",
    "PayloadMismatch",
    "PermissionDenied",
    "PrepackError",
    "RequestFailed",
    "ResourceExhausted",
    "SocketPermissionDenied",
    "Unavailable",
    "connect",
    "default_socket",
    "entry_format",
    "materialize",
    "onnx_pb",
    "pb",
    "state_name",
]
