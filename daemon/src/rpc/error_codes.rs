//! The one mapping from a use case's error to a gRPC status.

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::error::{Error, ErrorKind};

/// The trailing metadata key that names the error kind, which clients act
/// on where the code alone is ambiguous: `nothing-to-rewrite` among the
/// preconditions, and any kind at all to tell the daemon's UNAVAILABLE
/// (retry) from a daemon that is not there.
pub(crate) const KIND_KEY: &str = "ctcache-error-kind";

/// The gRPC status of a use case's error.
pub(crate) fn status(e: Error) -> Status {
    let mut s = Status::new(code(e.kind), e.message);
    s.metadata_mut()
        .insert(KIND_KEY, MetadataValue::from_static(kind_name(e.kind)));
    s
}

/// The kind as the trailer names it.
pub(crate) fn kind_name(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "invalid-input",
        ErrorKind::NotFound => "not-found",
        ErrorKind::OutOfRange => "out-of-range",
        ErrorKind::PermissionDenied => "permission-denied",
        ErrorKind::Precondition => "precondition",
        ErrorKind::NothingToRewrite => "nothing-to-rewrite",
        ErrorKind::Exhausted => "exhausted",
        ErrorKind::QueueFull => "queue-full",
        ErrorKind::DataLoss => "data-loss",
        ErrorKind::Cancelled => "cancelled",
        ErrorKind::DeadlineExceeded => "deadline-exceeded",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Internal => "internal",
    }
}

/// The gRPC code of an error kind.
pub(crate) fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidInput => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::OutOfRange => Code::OutOfRange,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::Precondition | ErrorKind::NothingToRewrite => Code::FailedPrecondition,
        ErrorKind::Exhausted | ErrorKind::QueueFull => Code::ResourceExhausted,
        ErrorKind::DataLoss => Code::DataLoss,
        ErrorKind::Cancelled => Code::Aborted,
        ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_names_its_kind_in_a_trailer() {
        let s = status(Error::new(
            ErrorKind::NothingToRewrite,
            "nothing to materialize",
        ));
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.metadata().get(KIND_KEY).unwrap(), "nothing-to-rewrite");
        let other = status(Error::precondition("no [remote]"));
        assert_eq!(other.code(), Code::FailedPrecondition);
        assert_eq!(other.metadata().get(KIND_KEY).unwrap(), "precondition");
        let retry = status(Error::new(ErrorKind::Unavailable, "the source changed"));
        assert_eq!(retry.code(), Code::Unavailable);
        assert_eq!(retry.metadata().get(KIND_KEY).unwrap(), "unavailable");
    }
}
