//! Client errors. Each one says what to do: the socket problems name the
//! socket and the fix, daemon refusals carry the daemon's own sentence.

use std::path::PathBuf;

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a client call failed; the message tells the user what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing listens on the socket (no file, or a stale one).
    #[error(
        "ctcached is not running: nothing answers on {} ({source}); start it with `ctcached` \
         (or `systemctl start ctcached`), or point --socket / CTCACHE_SOCKET at its socket",
        .socket.display()
    )]
    NotRunning {
        /// The socket that was tried.
        socket: PathBuf,
        /// The connect error (not found, connection refused).
        #[source]
        source: std::io::Error,
    },
    /// The socket (or a folder above it) refuses this user.
    #[error(
        "permission denied on {sock}: join the socket's group (`ls -l {sock}` shows it) and log in \
         again, or ask the daemon's owner to set socket_group",
        sock = .socket.display()
    )]
    PermissionDenied {
        /// The socket that was tried.
        socket: PathBuf,
        /// The permission error.
        #[source]
        source: std::io::Error,
    },
    /// The path exists but is no socket (e.g. a typo pointing at a file).
    #[error(
        "{} is not a socket (it is {kind}); pass the daemon's socket with --socket or CTCACHE_SOCKET",
        .socket.display()
    )]
    NotASocket {
        /// The path given as the socket.
        socket: PathBuf,
        /// What the path is instead: `a folder` or `a regular file`.
        kind: &'static str,
    },
    /// Any other failure to set up the connection.
    #[error("cannot connect to ctcached at {}: {detail}", .socket.display())]
    Connect {
        /// The socket that was tried.
        socket: PathBuf,
        /// The transport's error, as text.
        detail: String,
    },
    /// The daemon went away during a call.
    #[error(
        "ctcached at {} stopped answering during {rpc}: {message}; check that it still runs \
         (`systemctl status ctcached`) and start it again",
        .socket.display()
    )]
    Unavailable {
        /// The daemon's socket.
        socket: PathBuf,
        /// The RPC that was running, e.g. `ResolveModel`.
        rpc: &'static str,
        /// The transport's error, as text.
        message: String,
    },
    /// The daemon refused or failed a call; `message` is its explanation.
    #[error("{message}")]
    Rpc {
        /// The RPC that was refused, e.g. `Put`.
        rpc: &'static str,
        /// The gRPC status code the daemon answered with.
        code: tonic::Code,
        /// The daemon's explanation, shown to the user as is.
        message: String,
    },
    /// The payload read does not match its entry.
    #[error("payload of entry {key} is damaged: {detail}; run `ctcachectl verify`")]
    PayloadMismatch {
        /// The entry's key.
        key: String,
        /// What differs (length or hash).
        detail: String,
    },
    /// A local file (model, output, payload) could not be read or mapped.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The caller's input or a local step failed before anything reached the daemon.
    #[error("{0}")]
    InvalidArgument(String),
    /// Writing a file this process makes (a materialized model).
    #[error(transparent)]
    Write(#[from] ctcache_files::Error),
}

impl Error {
    /// True when the daemon could not be reached at all (exit code 3 in
    /// `ctcachectl`): the caller may fall back to offline work.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Error::NotRunning { .. }
                | Error::PermissionDenied { .. }
                | Error::NotASocket { .. }
                | Error::Connect { .. }
                | Error::Unavailable { .. }
        )
    }

    /// The gRPC status code of a daemon refusal.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    pub(crate) fn from_status(
        socket: &std::path::Path,
        rpc: &'static str,
        s: tonic::Status,
    ) -> Error {
        if connection_lost(&s) {
            return Error::Unavailable {
                socket: socket.to_path_buf(),
                rpc,
                message: crate::chain(&s),
            };
        }
        let code = s.code();
        Error::Rpc {
            rpc,
            code,
            message: if s.message().is_empty() {
                format!("{rpc} failed: {code}")
            } else {
                s.message().to_string()
            },
        }
    }
}

/// Whether tonic made `s` itself because the connection broke (the daemon
/// went away mid-call) instead of receiving it from the daemon. A status
/// the daemon sends has no source error; one tonic builds from a transport
/// failure keeps it (unary calls: "transport error", code Unknown), or
/// names the HTTP/2 failure, or (a stream cut inside a message) the EOF.
pub(crate) fn connection_lost(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unavailable
        || std::error::Error::source(s).is_some()
        || s.message().starts_with("h2 protocol error")
        || s.message() == "Unexpected EOF decoding stream."
}
