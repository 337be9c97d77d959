//! What writing a file can fail with.

use std::path::PathBuf;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error writing files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure; `action` is what was being done ("read", "write").
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done: `read` or `write`.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// What the filesystem cannot do (a reflink where it has none).
    #[error("{0}")]
    Unsupported(String),
    /// A cached payload whose bytes are no longer the ones hashed (D12):
    /// found while placing it, so nothing of it was placed.
    #[error("payload {}: {problem}", path.display())]
    PayloadChanged {
        /// The payload file.
        path: PathBuf,
        /// What differs: the bytes of a group, or the file itself.
        problem: String,
    },
    /// An answer that cannot be written as it is (a file name that is not
    /// one path component).
    #[error("{0}")]
    BadAnswer(String),
    /// The write was asked to stop; what it had made is removed.
    #[error("cancelled")]
    Cancelled,
}

impl Error {
    /// Reading `path` failed.
    pub fn read(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            action: "read",
            path: path.into(),
            source,
        }
    }

    /// Writing `path` failed.
    pub fn write(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            action: "write",
            path: path.into(),
            source,
        }
    }
}
