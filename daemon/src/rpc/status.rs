//! The one mapping from a use case's error to a gRPC status.

use tonic::{Code, Status};

use crate::error::{Error, ErrorKind};

/// The gRPC status of a use case's error.
pub(crate) fn status(e: Error) -> Status {
    let code = match e.kind {
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
    };
    Status::new(code, e.message)
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        status(e)
    }
}
