//! Default locations (D8), shared by the daemon and its clients.

use std::path::{Path, PathBuf};

/// The system service's socket (systemd units).
pub const SYSTEM_SOCKET: &str = "/run/ctcache/ctcached.sock";
/// The system service's cache folder.
pub const SYSTEM_CACHE_DIR: &str = "/var/cache/ctcache";
/// The system service's config file.
pub const SYSTEM_CONFIG: &str = "/etc/ctcache/ctcached.toml";

/// Defaults for an unprivileged user: cache `$XDG_CACHE_HOME/ctcache` (else
/// `~/.cache/ctcache`), socket `$XDG_RUNTIME_DIR/ctcache/ctcached.sock` (else
/// in the cache folder). `env` reads environment variables.
pub fn user_defaults(env: &dyn Fn(&str) -> Option<String>) -> (PathBuf, PathBuf) {
    let set = |k: &str| env(k).filter(|s| !s.is_empty());
    let cache = set("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/cache"))
        .join("ctcache");
    let socket = set("XDG_RUNTIME_DIR")
        .map(|r| Path::new(&r).join("ctcache").join("ctcached.sock"))
        .unwrap_or_else(|| cache.join("ctcached.sock"));
    (cache, socket)
}

/// The socket a client uses: `CTCACHE_SOCKET`, else the user's default when
/// it exists, else the system service's when that exists, else the user's.
pub fn client_socket(env: &dyn Fn(&str) -> Option<String>) -> PathBuf {
    if let Some(s) = env("CTCACHE_SOCKET").filter(|s| !s.is_empty()) {
        return PathBuf::from(s);
    }
    let (_, user) = user_defaults(env);
    if !user.exists() && Path::new(SYSTEM_SOCKET).exists() {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn d8_defaults() {
        let env = |k: &str| match k {
            "HOME" => Some("/home/u".to_string()),
            "XDG_RUNTIME_DIR" => Some("/run/user/1".to_string()),
            _ => None,
        };
        let (c, s) = user_defaults(&env);
        assert_eq!(c, Path::new("/home/u/.cache/ctcache"));
        assert_eq!(s, Path::new("/run/user/1/ctcache/ctcached.sock"));
        let env = |k: &str| (k == "XDG_CACHE_HOME").then(|| "/x".to_string());
        let (c, s) = user_defaults(&env);
        assert_eq!(c, Path::new("/x/ctcache"));
        assert_eq!(s, Path::new("/x/ctcache/ctcached.sock"));
        let env = |k: &str| (k == "CTCACHE_SOCKET").then(|| "/s.sock".to_string());
        assert_eq!(client_socket(&env), Path::new("/s.sock"));
    }
}
