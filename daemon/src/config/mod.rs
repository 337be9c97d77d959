//! The daemon's configuration: one struct, loaded once from defaults, the
//! TOML file, `CTCACHE_*` environment variables and flags, in that order of
//! increasing precedence (D8). Unknown keys are rejected by name.

use std::path::{Path, PathBuf};

use ctcache_remote::config::RemoteConfig;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod keys;
mod policy;
mod sources;
mod validate;

pub use keys::Overrides;
pub use policy::{default_policy, PolicyRule};
pub use sources::config_file;

/// Where the settings came from when a value is invalid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read or parsed.
    #[error("config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// The read or TOML error, naming the key.
        message: String,
    },
    /// A `CTCACHE_*` environment variable does not parse.
    #[error("environment variable {var}: {message}")]
    Env {
        /// The variable's name.
        var: String,
        /// What is wrong with its value.
        message: String,
    },
    /// A setting parsed but its value is out of range or inconsistent.
    #[error("invalid setting {key}: {message}")]
    Invalid {
        /// The setting's key, as in the config file.
        key: String,
        /// What is wrong with its value.
        message: String,
    },
}

/// A gc limit from the file: a positive number (no limit is the key left out).
fn nonzero_limit<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match u64::deserialize(d)? {
        0 => Err(serde::de::Error::custom(
            "0 is not a gc limit (for `ctcachectl gc` it would mean \"everything\"): \
             leave the key out for none",
        )),
        n => Ok(n),
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Journald when `JOURNAL_STREAM` says stderr is the journal, else human.
    Auto,
    /// Plain text lines (colored on a terminal).
    Human,
    /// One JSON object per line.
    Json,
    /// Native journald records with structured fields.
    Journald,
}

/// Every setting of the daemon, after defaults, file, environment and flags
/// (D8). This declaration is the one list of the keys: a field's doc
/// comment is its help, and `x-env` / `x-flag` give it a `CTCACHE_*`
/// variable and a `ctcached` flag (`keys.rs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The store's root folder (index, payloads, quarantine).
    #[schemars(extend("x-env" = "CTCACHE_CACHE_DIR", "x-flag" = true))]
    pub cache_dir: PathBuf,
    /// The Unix socket clients connect to.
    #[schemars(extend("x-env" = "CTCACHE_SOCKET", "x-flag" = true))]
    pub socket: PathBuf,
    /// Group that may connect to the socket (name or gid); empty = the daemon's.
    #[schemars(extend("x-env" = "CTCACHE_SOCKET_GROUP"))]
    pub socket_group: String,
    /// Optional TCP listen address (off by default). A non-loopback address
    /// needs `tls_cert` and `tls_key`.
    #[schemars(extend("x-env" = "CTCACHE_LISTEN_TCP", "x-flag" = true))]
    pub listen_tcp: Option<String>,
    /// PEM certificate chain the TCP listener serves TLS with.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s): TCP clients must present a certificate one of
    /// them signed (mutual TLS); such clients are trusted like
    /// `trusted_uids`. Without it, TCP callers may only read.
    pub tls_client_ca: Option<PathBuf>,
    /// Optional Prometheus endpoint address (off by default).
    #[schemars(extend("x-env" = "CTCACHE_METRICS_ADDR", "x-flag" = true))]
    pub metrics_addr: Option<String>,
    /// The onnxruntime library (`libonnxruntime.so`, as the onnxruntime
    /// wheel ships it under `onnxruntime/capi/`) that the daemon's
    /// onnxruntime worker loads; unset: none. The daemon never loads it
    /// itself.
    #[schemars(extend("x-env" = "CTCACHE_ORT_LIBRARY", "x-flag" = true))]
    pub ort_library: Option<PathBuf>,
    /// The OpenVINO C library (`libopenvino_c.so`, as the openvino wheel
    /// ships it under `openvino/libs/`) that the daemon's OpenVINO worker
    /// loads; unset: none. The daemon never loads it itself.
    #[schemars(extend("x-env" = "CTCACHE_OPENVINO_LIBRARY", "x-flag" = true))]
    pub openvino_library: Option<PathBuf>,
    /// Model directories watched recursively.
    #[schemars(extend("x-env" = "CTCACHE_WATCH", "x-flag" = true))]
    pub watch: Vec<PathBuf>,
    /// CPU pack workers (0 = cores - 1, at least 1).
    #[schemars(extend("x-env" = "CTCACHE_WORKERS", "x-flag" = true))]
    pub workers: usize,
    /// Bytes of pack output in flight at once.
    pub memory_budget: u64,
    /// Pack on a hardware wgpu adapter when there is one (never a software one).
    #[schemars(extend("x-env" = "CTCACHE_GPU"))]
    pub gpu: bool,
    /// uids allowed to Put, Import, Gc, Verify and RemoveWatch (the daemon's
    /// own uid and root always are).
    pub trusted_uids: Vec<u32>,
    /// Lookups return only entries the daemon packed itself.
    pub daemon_produced_only: bool,
    /// Seconds a watched file must stay unchanged before it is read.
    pub stable_secs: f64,
    /// Largest gRPC message, bytes.
    pub max_message_bytes: usize,
    /// Largest payload the daemon packs or takes from Put, bytes (also
    /// never more than `memory_budget`).
    pub max_payload_bytes: u64,
    /// Largest initializer the daemon reads for a request (digest, pack),
    /// bytes of its declared data.
    pub max_tensor_bytes: u64,
    /// Most data the daemon reads from one model for a request (all its
    /// initializers' declared data together), bytes.
    pub max_model_bytes: u64,
    /// Declared initializer bytes one untrusted uid may make the daemon hash
    /// in any hour (what the digest memo already knows is free).
    pub max_hashed_bytes_per_uid_per_hour: u64,
    /// CPU seconds the daemon may spend in any hour for one untrusted uid
    /// (its requests' work and its pack jobs, from the threads' CPU clocks).
    pub max_cpu_secs_per_uid_per_hour: u64,
    /// Bytes of entries packed for one untrusted uid's requests that gc
    /// keeps; gc removes the uid's least recently used over it first.
    pub max_stored_bytes_per_uid: u64,
    /// Live leases one uid may hold.
    pub max_leases_per_uid: usize,
    /// Longest lease, seconds (longer requests are cut to it).
    pub max_lease_ttl_secs: u64,
    /// Longest a lease of an untrusted uid lasts from when it was taken,
    /// renewals included, seconds: gc is never held off for ever.
    pub max_lease_lifetime_secs: u64,
    /// Pack jobs one uid may have waiting in the queue.
    pub max_queued_jobs_per_uid: usize,
    /// Folders one uid may add with AddWatch.
    pub max_watches_per_uid: usize,
    /// Events followers at once.
    pub max_event_subscribers: usize,
    /// Models whose digests the memo keeps (in memory and in the index).
    pub max_memo_entries: usize,
    /// Bytes of digest records the memo keeps (in memory and in the index).
    pub max_memo_bytes: u64,
    /// Open connections, Unix socket and TCP together (more wait to be
    /// accepted).
    pub max_connections: usize,
    /// Open Unix-socket connections of one uid (trusted uids are not
    /// counted); more are closed at once.
    pub max_connections_per_uid: usize,
    /// Requests one connection may have running (more wait).
    pub max_requests_per_connection: usize,
    /// HTTP/2 streams one connection may have open.
    pub max_streams_per_connection: u32,
    /// Longest a call may take to answer, seconds (at least 1: 0 is refused,
    /// as for every bound); streams already answering are not cut.
    pub request_timeout_secs: u64,
    /// How log lines are written to stderr.
    #[schemars(extend("x-env" = "CTCACHE_LOG_FORMAT", "x-flag" = true))]
    pub log_format: LogFormat,
    /// Tracing filter (RUST_LOG syntax); RUST_LOG wins when set.
    #[schemars(extend("x-env" = "CTCACHE_LOG_LEVEL"))]
    pub log_level: String,
    /// Size budget for `ctcachectl gc` and the daily gc timer (bytes). No
    /// budget: the key left out (0 here); `0` in the file is refused, as
    /// `ctcachectl gc --max-size 0` is: a 0 never means "none" in one place
    /// and "everything" in another.
    #[serde(deserialize_with = "nonzero_limit", skip_serializing_if = "is_zero")]
    pub gc_max_bytes: u64,
    /// Age limit since last access for gc, seconds. No limit: the key left
    /// out (0 here); `0` in the file is refused.
    #[serde(deserialize_with = "nonzero_limit", skip_serializing_if = "is_zero")]
    pub gc_max_age_secs: u64,
    /// Which initializers get which formats; the first rule that admits a tensor wins.
    pub policy: Vec<PolicyRule>,
    /// The fleet tier on S3-compatible object storage (off when absent;
    /// boxed: most configs have none).
    pub remote: Option<Box<RemoteConfig>>,
}

/// D8 defaults for an unprivileged user (see `ctcache::paths`).
pub fn default_paths(env: &dyn Fn(&str) -> Option<String>) -> (PathBuf, PathBuf) {
    ctcache::paths::user_defaults(env)
}

impl Default for Config {
    fn default() -> Self {
        let (cache_dir, socket) = default_paths(&|k| std::env::var(k).ok());
        Config {
            cache_dir,
            socket,
            socket_group: String::new(),
            listen_tcp: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            metrics_addr: None,
            ort_library: None,
            openvino_library: None,
            watch: Vec::new(),
            workers: 0,
            memory_budget: 2 << 30,
            gpu: true,
            trusted_uids: Vec::new(),
            daemon_produced_only: false,
            stable_secs: 0.3,
            max_message_bytes: 16 << 20,
            max_payload_bytes: 2 << 30,
            max_tensor_bytes: 16 << 30,
            max_model_bytes: 1 << 40,
            max_hashed_bytes_per_uid_per_hour: 256 << 30,
            max_cpu_secs_per_uid_per_hour: 1800,
            max_stored_bytes_per_uid: 16 << 30,
            max_leases_per_uid: 1024,
            max_lease_ttl_secs: 3600,
            max_lease_lifetime_secs: 86400,
            max_queued_jobs_per_uid: 1024,
            max_watches_per_uid: 16,
            max_event_subscribers: 64,
            max_memo_entries: 4096,
            max_memo_bytes: 64 << 20,
            max_connections: 512,
            max_connections_per_uid: 64,
            max_requests_per_connection: 32,
            max_streams_per_connection: 64,
            request_timeout_secs: 1800,
            log_format: LogFormat::Auto,
            log_level: "info".into(),
            gc_max_bytes: 0,
            gc_max_age_secs: 0,
            policy: default_policy(),
            remote: None,
        }
    }
}

impl Config {
    /// Loads the effective config: defaults < file < environment < flags.
    pub fn load(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
        flags: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut cfg = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
                Self::from_toml(&text).map_err(|e| ConfigError::File {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?
            }
            None => Config::default(),
        };
        keys::apply(&mut cfg, &keys::from_env(env)?)?;
        keys::apply(&mut cfg, flags.given())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses a TOML document over the defaults; errors name the bad key.
    pub fn from_toml(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str::<Config>(text)
    }

    /// The largest payload a pack or Put may produce.
    pub fn payload_limit(&self) -> u64 {
        self.max_payload_bytes.min(self.memory_budget)
    }

    /// The effective config as TOML (for `--print-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot print config: {e}\n"))
    }

    /// Pack workers after applying the default (cores - 1, at least 1).
    pub fn worker_count(&self) -> usize {
        if self.workers > 0 {
            return self.workers;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get().saturating_sub(1).max(1))
    }
}

#[cfg(test)]
mod tests;
