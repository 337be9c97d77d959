//! Where settings come from besides the defaults: the config file's path,
//! the `CTCACHE_*` environment and the flags.

use std::path::{Path, PathBuf};

use clap::ValueEnum;

use super::{Config, ConfigError, LogFormat, Overrides};

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

impl Config {
    pub(super) fn apply_env(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), ConfigError> {
        let bad = |var: &str, message: String| ConfigError::Env {
            var: var.to_string(),
            message,
        };
        if let Some(v) = env("CTCACHE_CACHE_DIR") {
            self.cache_dir = v.into();
        }
        if let Some(v) = env("CTCACHE_SOCKET") {
            self.socket = v.into();
        }
        if let Some(v) = env("CTCACHE_SOCKET_GROUP") {
            self.socket_group = v;
        }
        if let Some(v) = env("CTCACHE_LISTEN_TCP") {
            self.listen_tcp = Some(v).filter(|s| !s.is_empty());
        }
        if let Some(v) = env("CTCACHE_METRICS_ADDR") {
            self.metrics_addr = Some(v).filter(|s| !s.is_empty());
        }
        if let Some(v) = env("CTCACHE_WATCH") {
            self.watch = std::env::split_paths(&v).collect();
        }
        if let Some(v) = env("CTCACHE_WORKERS") {
            self.workers = v
                .parse()
                .map_err(|_| bad("CTCACHE_WORKERS", format!("{v:?} is not a number")))?;
        }
        if let Some(v) = env("CTCACHE_LOG_FORMAT") {
            self.log_format = toml::Value::String(v.clone()).try_into().map_err(|_| {
                bad(
                    "CTCACHE_LOG_FORMAT",
                    format!("{v:?}: expected {}", one_of::<LogFormat>()),
                )
            })?;
        }
        if let Some(v) = env("CTCACHE_LOG_LEVEL") {
            self.log_level = v;
        }
        if let Some(v) = env("CTCACHE_REMOTE_URL").filter(|s| !s.is_empty()) {
            self.remote.get_or_insert_with(Default::default).url = v;
        }
        if let Some(v) = env("CTCACHE_GPU") {
            self.gpu = matches!(v.as_str(), "1" | "true" | "yes" | "on");
        }
        Ok(())
    }

    pub(super) fn apply_flags(&mut self, f: &Overrides) -> Result<(), ConfigError> {
        if let Some(v) = &f.cache_dir {
            self.cache_dir = v.clone();
        }
        if let Some(v) = &f.socket {
            self.socket = v.clone();
        }
        if !f.watch.is_empty() {
            self.watch = f.watch.clone();
        }
        if let Some(v) = &f.listen_tcp {
            self.listen_tcp = Some(v.clone());
        }
        if let Some(v) = &f.metrics_addr {
            self.metrics_addr = Some(v.clone());
        }
        if let Some(v) = f.workers {
            self.workers = v;
        }
        if let Some(v) = f.log_format {
            self.log_format = v;
        }
        f.remote.apply(&mut self.remote)
    }
}

/// The names of an enum's values, as "a, b or c".
fn one_of<T: ValueEnum>() -> String {
    let names: Vec<String> = T::value_variants()
        .iter()
        .filter_map(|v| Some(v.to_possible_value()?.get_name().to_string()))
        .collect();
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    }
}
