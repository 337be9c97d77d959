"""Exceptions raised by the ctcache client."""

from __future__ import annotations


class CtcacheError(Exception):
    """Base class of every error this package raises."""


class DaemonNotRunning(CtcacheError):
    """Nothing answers on the socket: ctcached is not started, or the socket is stale."""

    def __init__(self, socket: str, why: str):
        self.socket = socket
        self.why = why
        super().__init__(
            f"ctcached is not running on {socket} ({why}). Start it with "
            f"`ctcached --socket {socket}` (add --cache-dir DIR / --watch DIR as needed), "
            f"or point the client at another daemon with connect(socket=...) or CTCACHE_SOCKET."
        )


class SocketPermissionDenied(CtcacheError):
    """The socket exists but this user may not connect to it."""

    def __init__(self, socket: str):
        self.socket = socket
        super().__init__(
            f"no permission to connect to {socket}: the daemon's socket_group decides who may "
            f"connect; ask for membership or run your own ctcached with --socket PATH"
        )


class RequestFailed(CtcacheError):
    """The daemon answered a request with an error status."""

    def __init__(self, method: str, code, details: str):
        self.method = method
        self._code = code  # a grpc.StatusCode, or its name for an answer that came without gRPC
        self.details = details
        name = getattr(code, "name", str(code))
        super().__init__(f"{method}: {name}: {details}")

    @property
    def code(self):
        """The ``grpc.StatusCode`` (grpc is imported here when the error
        came on the descriptor channel, which speaks no gRPC)."""
        return status_code(self._code) if isinstance(self._code, str) else self._code


def status_code(name: str):
    """The ``grpc.StatusCode`` of a code's name (grpc imported only here:
    the descriptor channel itself speaks no gRPC)."""
    import grpc

    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)


class NotFound(RequestFailed):
    """NOT_FOUND: no such model, entry or lease."""


class InvalidArgument(RequestFailed):
    """INVALID_ARGUMENT: the request is malformed (relative path, unknown format, ...)."""


class PermissionDenied(RequestFailed):
    """PERMISSION_DENIED: the daemon checked the caller's uid and refused."""


class FailedPrecondition(RequestFailed):
    """FAILED_PRECONDITION: well formed, but the daemon's state does not allow it
    (no GPU for a wgpu request, no ``[remote]``, a lease past its lifetime)."""


class NothingToRewrite(FailedPrecondition):
    """FAILED_PRECONDITION: the model has nothing the target rewrites (no
    node of the op types it converts, or every one skipped); the model can
    be used as it is."""


class ResourceExhausted(RequestFailed):
    """RESOURCE_EXHAUSTED: a bound was reached (disk, quota, leases, jobs, the
    size of an answer); the message names it."""


class OutOfRange(RequestFailed):
    """OUT_OF_RANGE: the request reads past the end of what it names."""


class DataLoss(RequestFailed):
    """DATA_LOSS: stored bytes are damaged; they were not served."""


class Aborted(RequestFailed):
    """ABORTED: the work was abandoned (the daemon shut down, every waiter left)."""


class Unavailable(RequestFailed):
    """UNAVAILABLE from the daemon itself: a passing fault (a source file that
    changed while it was read, a busy resource); asking again may succeed.
    A daemon that does not answer at all is :class:`DaemonNotRunning`."""


class Internal(RequestFailed):
    """INTERNAL: a fault of the daemon or its host; its log says more."""


class Cancelled(RequestFailed):
    """CANCELLED: the call was stopped (its caller went away, or a hand-over's peer closed)."""


class DeadlineExceeded(RequestFailed):
    """DEADLINE_EXCEEDED: the call ran out of its time (``timeout=``, or the daemon's limit per call)."""


class AlreadyExists(RequestFailed):
    """ALREADY_EXISTS: what the call would make is there already."""


class Unimplemented(RequestFailed):
    """UNIMPLEMENTED: the daemon has no such method (an older or newer daemon than this client)."""


class Unauthenticated(RequestFailed):
    """UNAUTHENTICATED: the daemon does not know who asks (a TCP peer without a certificate)."""


class Unknown(RequestFailed):
    """UNKNOWN, or a status this client does not know."""


class PayloadMismatch(CtcacheError):
    """A payload's bytes differ from the digests they were checked against
    (:meth:`ctcache.Payload.checked`): changed on disk since."""

    def __init__(self, key: str, detail: str):
        self.key = key
        self.detail = detail
        super().__init__(f"payload of {key} does not match its digest: {detail}")


class PrepackError(CtcacheError):
    """At least one pack job failed; ``progress`` holds the final state of
    every job, ``failed`` those that did not succeed."""

    def __init__(self, progress, failed):
        self.progress = list(progress)
        self.failed = failed = list(failed)
        what = "; ".join(f"{p.initializer} {p.format}: {p.error or 'failed'}" for p in failed)
        super().__init__(f"{len(failed)} of {len(self.progress)} pack jobs failed: {what}")


#: The error class of each gRPC code, by the code's name.
BY_CODE_NAME = {
    "NOT_FOUND": NotFound,
    "INVALID_ARGUMENT": InvalidArgument,
    "PERMISSION_DENIED": PermissionDenied,
    "FAILED_PRECONDITION": FailedPrecondition,
    "RESOURCE_EXHAUSTED": ResourceExhausted,
    "OUT_OF_RANGE": OutOfRange,
    "DATA_LOSS": DataLoss,
    "ABORTED": Aborted,
    "UNAVAILABLE": Unavailable,
    "INTERNAL": Internal,
    "CANCELLED": Cancelled,
    "DEADLINE_EXCEEDED": DeadlineExceeded,
    "ALREADY_EXISTS": AlreadyExists,
    "UNIMPLEMENTED": Unimplemented,
    "UNAUTHENTICATED": Unauthenticated,
    "UNKNOWN": Unknown,
}


def refusal(method: str, code, details: str, kind: str = "") -> RequestFailed:
    """The error for the daemon's refusal of ``method``: ``code`` (a
    ``grpc.StatusCode`` or its name) and the error kind it named
    (``nothing-to-rewrite``: :class:`NothingToRewrite`)."""
    if kind == "nothing-to-rewrite":
        return NothingToRewrite(method, code, details)
    return BY_CODE_NAME.get(getattr(code, "name", code), Unknown)(method, code, details)
