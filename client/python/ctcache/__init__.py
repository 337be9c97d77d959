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

from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    CtcacheError,
    DaemonNotRunning,
    DataLoss,
    DeadlineExceeded,
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
    Unauthenticated,
    Unavailable,
    Unimplemented,
    Unknown,
)

__version__ = "0.1.0"

# What needs grpc or protobuf is imported on first use, so that `import
# ctcache.ort` (or `import ctcache` for its errors) loads neither.
_LAZY = {
    "pb": ("._pb.ctcache_v1_pb2", None),
    "onnx_pb": ("._pb.onnx_pb2", None),
    "Client": (".client", "Client"),
    "connect": (".client", "connect"),
    "default_socket": (".handout", "default_socket"),
    "entry_format": (".client", "entry_format"),
    "state_name": (".client", "state_name"),
    "materialize": (".ort", "materialize"),
    "Payload": (".payload", "Payload"),
    "client": (".client", None),
    "payload": (".payload", None),
    "ort": (".ort", None),
    "layout": (".layout", None),
    "_pb": ("._pb", None),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'ctcache' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    value = importlib.import_module(module, __name__)
    if attr is not None:
        value = getattr(value, attr)
    globals()[name] = value
    return value

__all__ = [
    "Aborted",
    "AlreadyExists",
    "Cancelled",
    "Client",
    "CtcacheError",
    "DaemonNotRunning",
    "DataLoss",
    "DeadlineExceeded",
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
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "Unknown",
    "connect",
    "default_socket",
    "entry_format",
    "materialize",
    "onnx_pb",
    "pb",
    "state_name",
]
