//! Where the daemon's socket is (D8) and connecting to it: a probe connect
//! classifies failures before tonic wraps them beyond recognition.

use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::error::Error;

/// The D8 per-user default socket for an environment.
pub fn default_socket_with(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    ctcache_format::paths::user_defaults(env).1
}

/// `CTCACHE_SOCKET` when set, else the D8 default (the system service's
/// socket when only that one exists).
pub fn default_socket() -> PathBuf {
    ctcache_format::paths::client_socket(&|k: &str| std::env::var(k).ok())
}

/// Connects once and drops the stream: the failure's kind is what tells the
/// user what to do.
pub(crate) async fn probe(socket: &Path) -> Result<(), Error> {
    match tokio::net::UnixStream::connect(socket).await {
        Ok(_) => Ok(()),
        Err(e) => Err(classify(socket, e)),
    }
}

fn classify(socket: &Path, e: std::io::Error) -> Error {
    let socket_buf = socket.to_path_buf();
    match e.kind() {
        ErrorKind::PermissionDenied => Error::PermissionDenied {
            socket: socket_buf,
            source: e,
        },
        ErrorKind::NotFound => Error::NotRunning {
            socket: socket_buf,
            source: e,
        },
        ErrorKind::ConnectionRefused => match std::fs::metadata(socket) {
            // Linux refuses connects to non-sockets the same way as to stale
            // sockets; tell the two apart.
            Ok(m) if !m.file_type().is_socket() => Error::NotASocket {
                socket: socket_buf,
                kind: if m.is_dir() {
                    "a folder"
                } else {
                    "a regular file"
                },
            },
            _ => Error::NotRunning {
                socket: socket_buf,
                source: e,
            },
        },
        _ => Error::Connect {
            socket: socket_buf,
            detail: e.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn d8_default_socket() {
        let e = env_of(&[("XDG_RUNTIME_DIR", "/run/user/1000"), ("HOME", "/home/u")]);
        assert_eq!(
            default_socket_with(&e),
            PathBuf::from("/run/user/1000/ctcache/ctcached.sock")
        );
        let e = env_of(&[
            ("XDG_RUNTIME_DIR", ""),
            ("XDG_CACHE_HOME", "/c"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(
            default_socket_with(&e),
            PathBuf::from("/c/ctcache/ctcached.sock")
        );
        let e = env_of(&[("HOME", "/home/u")]);
        assert_eq!(
            default_socket_with(&e),
            PathBuf::from("/home/u/.cache/ctcache/ctcached.sock")
        );
    }
}
