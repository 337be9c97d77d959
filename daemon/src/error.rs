//! The daemon's errors: [`Error`], the one error of the use cases (a kind
//! that means something to the caller, and a sentence for people; the RPC
//! edge maps kinds to gRPC codes in one place, `rpc/error_codes.rs`), and
//! [`RunError`], why the daemon could not start or serve.

use std::io::ErrorKind as Io;

use ctcache::store::StoreError;

/// What went wrong, as the caller needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// The request is malformed or names something unusable; asking again
    /// the same way fails the same way.
    InvalidInput,
    /// A model, entry, lease or watch the request names does not exist.
    NotFound,
    /// The request reads past the end of what it names.
    OutOfRange,
    /// The caller may not do this (or read or write that).
    PermissionDenied,
    /// The request is well formed but the state does not allow it (no GPU
    /// for a wgpu request, no `[remote]`).
    Precondition,
    /// The model has nothing the target rewrites: a client may open it as
    /// it is (a precondition that clients tell apart by the
    /// `ctcache-error-kind` trailer every status carries, `rpc/error_codes.rs`).
    NothingToRewrite,
    /// A bound was reached (disk full, too many leases or jobs).
    Exhausted,
    /// The caller's share of the pack queue is full: asking again once some
    /// of its jobs have run may succeed.
    QueueFull,
    /// Stored bytes are damaged; they were not served.
    DataLoss,
    /// The work was abandoned (shutdown, every waiter gone, its input
    /// changed under it).
    Cancelled,
    /// The request ran past the daemon's time per request
    /// (`request_timeout_secs`).
    DeadlineExceeded,
    /// A passing fault (a busy or interrupted resource); asking again may
    /// succeed.
    Unavailable,
    /// A fault of the daemon or its host (I/O, a broken index).
    Internal,
}

/// A failed use case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidInput, message)
    }

    pub fn out_of_range(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::OutOfRange, message)
    }

    pub fn not_found(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::NotFound, message)
    }

    pub fn denied(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::PermissionDenied, message)
    }

    pub fn precondition(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Precondition, message)
    }

    pub fn exhausted(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Exhausted, message)
    }

    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }

    pub fn cancelled(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Cancelled, message)
    }
}

impl Error {
    /// An I/O failure on `what` (a path the caller named): a missing file
    /// is the request's NOT_FOUND, anything else as [`io_kind`] says.
    pub fn from_io(e: std::io::Error, what: &str) -> Error {
        let kind = match e.kind() {
            Io::NotFound => ErrorKind::NotFound,
            _ => caller_io_kind(&e),
        };
        Error::new(kind, format!("{what}: {e}"))
    }
}

/// The kind an I/O failure of the daemon means to a caller: a full disk is
/// a bound reached, a busy or interrupted resource passes, the daemon being
/// refused a file is a permission matter, anything else (a file missing
/// under the daemon included) is the daemon's fault, never the request's.
fn io_kind(e: &std::io::Error) -> ErrorKind {
    match e.kind() {
        Io::StorageFull | Io::QuotaExceeded | Io::FileTooLarge => ErrorKind::Exhausted,
        Io::TimedOut | Io::Interrupted | Io::WouldBlock | Io::ResourceBusy => {
            ErrorKind::Unavailable
        }
        Io::PermissionDenied => ErrorKind::PermissionDenied,
        _ => ErrorKind::Internal,
    }
}

/// [`io_kind`] for I/O on a path the caller named: there an invalid input
/// is the request's (an output that is the input, a path without a file
/// name), while in the store it is the daemon's fault.
fn caller_io_kind(e: &std::io::Error) -> ErrorKind {
    match e.kind() {
        Io::InvalidInput => ErrorKind::InvalidInput,
        _ => io_kind(e),
    }
}

impl From<ctcache::Error> for Error {
    fn from(e: ctcache::Error) -> Self {
        let kind = match e.cause() {
            // Reading the caller's model or writing its output: a full disk
            // is a bound, a refused file a permission matter.
            ctcache::Error::Io { source, .. } => caller_io_kind(source),
            ctcache::Error::PayloadChanged { .. } => ErrorKind::DataLoss,
            ctcache::Error::Cancelled => ErrorKind::Cancelled,
            ctcache::Error::Limit(_) => ErrorKind::Exhausted,
            // Everything else is about the bytes of the model the caller named.
            _ => ErrorKind::InvalidInput,
        };
        Error::new(kind, e.to_string())
    }
}

impl From<ctcache_kernels::compile::CompileError> for Error {
    fn from(e: ctcache_kernels::compile::CompileError) -> Self {
        use ctcache_kernels::compile::CompileError as C;
        match e {
            C::Model(e) => e.into(),
            // The packer refuses the tensor: asking again fails the same way.
            e @ C::Pack { .. } => Error::invalid(e.to_string()),
            // The file was written since its digest was taken: asking again
            // reads it anew.
            e @ C::SourceChanged { .. } => Error::new(ErrorKind::Unavailable, e.to_string()),
            e @ C::Gpu { .. } => Error::internal(e.to_string()),
        }
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        let kind = match &e {
            StoreError::Io { source, .. } | StoreError::PayloadRead { source, .. } => {
                io_kind(source)
            }
            e if e.is_no_space() => ErrorKind::Exhausted,
            StoreError::InvalidEntry(_) | StoreError::InvalidKey(_) => ErrorKind::InvalidInput,
            StoreError::NotFound(_) | StoreError::UnknownLease(_) => ErrorKind::NotFound,
            StoreError::TooManyLeases { .. } => ErrorKind::Exhausted,
            StoreError::Leased { .. } | StoreError::LeaseLifetimeOver { .. } => {
                ErrorKind::Precondition
            }
            StoreError::PayloadDamaged { .. } | StoreError::PayloadCorrupt { .. } => {
                ErrorKind::DataLoss
            }
            _ => ErrorKind::Internal,
        };
        Error::new(kind, e.to_string())
    }
}

/// Why the daemon could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration is not one the daemon may run with.
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    /// The cache dir could not be opened.
    // The cause is part of the message, not a `source`: reports that walk
    // the chain (anyhow's `{:#}`) would say it twice.
    #[error("opening the cache {}: {problem}", .dir.display())]
    Store {
        /// The cache dir.
        dir: std::path::PathBuf,
        /// What the store said (boxed: keeps every `RunError` small).
        problem: Box<StoreError>,
    },
    /// A file or socket operation failed.
    #[error("{what}: {problem}")]
    Io {
        /// What was being done.
        what: String,
        /// The failure.
        problem: std::io::Error,
    },
    /// The metrics endpoint could not start.
    #[error("metrics endpoint: {0}")]
    Metrics(String),
    /// The watcher or the gRPC server failed.
    #[error("{0}")]
    Serve(String),
    /// The `[remote]` section is unusable (bad URL, unreadable key).
    #[error("remote: {0}")]
    Remote(String),
}

impl RunError {
    pub(crate) fn io(what: impl Into<String>, problem: std::io::Error) -> RunError {
        RunError::Io {
            what: what.into(),
            problem,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind_of(io: Io) -> ErrorKind {
        Error::from(StoreError::Io {
            op: "open",
            path: "/x".into(),
            source: io.into(),
        })
        .kind
    }

    #[test]
    fn io_failures_are_never_the_requests_fault() {
        assert_eq!(kind_of(Io::StorageFull), ErrorKind::Exhausted);
        assert_eq!(kind_of(Io::QuotaExceeded), ErrorKind::Exhausted);
        assert_eq!(kind_of(Io::NotFound), ErrorKind::Internal);
        assert_eq!(kind_of(Io::InvalidInput), ErrorKind::Internal);
        assert_eq!(kind_of(Io::InvalidData), ErrorKind::Internal);
        assert_eq!(kind_of(Io::Interrupted), ErrorKind::Unavailable);
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let e = Error::from(ctcache::Error::Io {
            action: "read",
            path: "/m.onnx".into(),
            source: enospc,
        });
        assert_eq!(e.kind, ErrorKind::Exhausted);
        let same = std::io::Error::new(Io::InvalidInput, "the output is the input");
        assert_eq!(Error::from_io(same, "-o").kind, ErrorKind::InvalidInput);
    }
}
