//! Which config file is read.

use std::path::{Path, PathBuf};

/// The config file to read: `--config`, else `CTCACHE_CONFIG`, else the
/// system file when it exists (only under systemd or for root), else the
/// user's `$XDG_CONFIG_HOME/ctcache/ctcached.toml` when it exists.
pub fn config_file(flag: Option<&Path>, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    if let Some(f) = flag {
        return Some(f.to_path_buf());
    }
    if let Some(f) = env("CTCACHE_CONFIG").filter(|s| !s.is_empty()) {
        return Some(PathBuf::from(f));
    }
    let system = PathBuf::from(ctcache::paths::SYSTEM_CONFIG);
    if env("INVOCATION_ID").is_some() && system.exists() {
        return Some(system);
    }
    let user = env("XDG_CONFIG_HOME")
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .or_else(|| env("HOME").map(|h| Path::new(&h).join(".config")))?
        .join("ctcache/ctcached.toml");
    user.exists().then_some(user)
}
