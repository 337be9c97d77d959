//! The one mapping from a use case's error to a gRPC status.

use tonic::{Code, Status};

use crate::error::{Error, ErrorKind};

/// The gRPC status of a use case's error.
pub(crate) fn status(e: Error) -> Status {
    Status::new(code(e.kind), e.message)
}

/// The gRPC code of an error kind.
pub(crate) fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidInput => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::OutOfRange => Code::OutOfRange,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Precondition => Code::FailedPrecondition,
        ErrorKind::Exhausted | ErrorKind::QueueFull => Code::ResourceExhausted,
        ErrorKind::DataLoss => Code::DataLoss,
        ErrorKind::Cancelled => Code::Aborted,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    }
}

/// The canonical name of an error kind's gRPC code (`RESOURCE_EXHAUSTED`),
/// for answers that carry a failure inside a message.
pub(crate) fn code_name(kind: ErrorKind) -> &'static str {
    ctcache_api::code_name(code(kind))
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        status(e)
    }
}
