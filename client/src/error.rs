//! Client errors. Each one says what to do: the socket problems name the
//! socket and the fix, daemon refusals carry the daemon's own sentence.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing listens on the socket (no file, or a stale one).
    #[error(
        "ctcached is not running: nothing answers on {} ({source}); start it with `ctcached` \
         (or `systemctl start ctcached`), or point --socket / CTCACHE_SOCKET at its socket",
        .socket.display()
    )]
    NotRunning {
        socket: PathBuf,
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
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The path exists but is no socket (e.g. a typo pointing at a file).
    #[error(
        "{} is not a socket (it is {kind}); pass the daemon's socket with --socket or CTCACHE_SOCKET",
        .socket.display()
    )]
    NotASocket { socket: PathBuf, kind: &'static str },
    /// Any other failure to set up the connection.
    #[error("cannot connect to ctcached at {}: {detail}", .socket.display())]
    Connect { socket: PathBuf, detail: String },
    /// The daemon went away during a call.
    #[error(
        "ctcached at {} stopped answering during {rpc}: {message}; check that it still runs \
         (`systemctl status ctcached`) and start it again",
        .socket.display()
    )]
    Unavailable {
        socket: PathBuf,
        rpc: &'static str,
        message: String,
    },
    /// The daemon refused or failed a call; `message` is its explanation.
    #[error("{message}")]
    Rpc {
        rpc: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// The payload read does not match its entry.
    #[error("payload of entry {key} is damaged: {detail}; run `ctcachectl verify`")]
    PayloadMismatch { key: String, detail: String },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    InvalidArgument(String),
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
fn connection_lost(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unavailable
        || std::error::Error::source(s).is_some()
        || s.message().starts_with("h2 protocol error")
        || s.message() == "Unexpected EOF decoding stream."
}
