//! The daemon's configuration: one struct, loaded once from defaults, the
//! TOML file, `CTCACHE_*` environment variables and flags, in that order of
//! increasing precedence (D8). Unknown keys are rejected by name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ctcache_remote::config::{FetchMode, RemoteConfig};
use serde::{Deserialize, Serialize};

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

/// A policy rule: which initializers get which format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyRule {
    /// Packer id, e.g. `ort.matmul_nbits`.
    pub format: String,
    /// Packer parameters.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// Source data types (ONNX names); empty = FLOAT.
    #[serde(default = "default_types")]
    pub data_types: Vec<String>,
    /// Required rank (0 = any).
    #[serde(default = "default_rank")]
    pub rank: usize,
    /// Smallest element count that qualifies (fewer: not worth packing).
    #[serde(default = "default_min_elements")]
    pub min_elements: u64,
    /// Uses that qualify: `MatMul.B`, `Gemm.B`; empty = any initializer.
    #[serde(default = "default_used_as")]
    pub used_as: Vec<String>,
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

fn default_types() -> Vec<String> {
    vec!["FLOAT".into()]
}
fn default_rank() -> usize {
    2
}
fn default_min_elements() -> u64 {
    ctcache::onnx::graph::DEFAULT_MIN_ELEMENTS
}
fn default_used_as() -> Vec<String> {
    ctcache::onnx::graph::DEFAULT_USED_AS
        .map(String::from)
        .to_vec()
}

/// The default policy: MatMul/Gemm weights of at least 65,536 FLOAT elements
/// get the host's SGEMM B-panel layout and onnxruntime's 4-bit format.
pub fn default_policy() -> Vec<PolicyRule> {
    let rule = |format: &str, params: &[(&str, &str)]| PolicyRule {
        format: format.into(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        data_types: default_types(),
        rank: 2,
        min_elements: default_min_elements(),
        used_as: default_used_as(),
    };
    vec![
        rule("gemm.pack_b.f32", &[]),
        rule(
            "ort.matmul_nbits",
            &[("bits", "4"), ("block_size", "32"), ("symmetric", "true")],
        ),
    ]
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

/// Every setting of the daemon, after defaults, file, environment and flags (D8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The store's root folder (index, payloads, quarantine).
    pub cache_dir: PathBuf,
    /// The Unix socket clients connect to.
    pub socket: PathBuf,
    /// Group that may connect to the socket (name or gid); empty = the daemon's.
    pub socket_group: String,
    /// Optional TCP listen address (off by default). A non-loopback address
    /// needs `tls_cert` and `tls_key`.
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
    pub metrics_addr: Option<String>,
    /// Model directories watched recursively.
    pub watch: Vec<PathBuf>,
    /// CPU pack workers (0 = cores - 1, at least 1).
    pub workers: usize,
    /// Bytes of pack output in flight at once.
    pub memory_budget: u64,
    /// Pack on a hardware wgpu adapter when there is one (never a software one).
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
    pub log_format: LogFormat,
    /// Tracing filter (RUST_LOG syntax); RUST_LOG wins when set.
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

/// Flags that override the file and the environment.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    /// `--cache-dir`.
    pub cache_dir: Option<PathBuf>,
    /// `--socket`.
    pub socket: Option<PathBuf>,
    /// `--watch` (repeatable); non-empty replaces the configured folders.
    pub watch: Vec<PathBuf>,
    /// `--listen-tcp`.
    pub listen_tcp: Option<String>,
    /// `--metrics-addr`.
    pub metrics_addr: Option<String>,
    /// `--workers`.
    pub workers: Option<usize>,
    /// `--log-format`.
    pub log_format: Option<LogFormat>,
    /// The `--remote-*` flags.
    pub remote: RemoteOverrides,
}

/// `--remote-*` flags: each replaces its `[remote]` key (and turns the
/// section on when the file has none).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct RemoteOverrides {
    /// `--remote-url` (`s3://bucket/prefix`).
    pub url: Option<String>,
    /// `--remote-endpoint`.
    pub endpoint: Option<String>,
    /// `--remote-region`.
    pub region: Option<String>,
    /// `--remote-allow-http`.
    pub allow_http: Option<bool>,
    /// `--remote-read`.
    pub read: Option<bool>,
    /// `--remote-write`.
    pub write: Option<bool>,
    /// `--remote-timeout-ms`.
    pub timeout_ms: Option<u64>,
    /// `--remote-upload-queue`.
    pub upload_queue: Option<usize>,
    /// `--remote-max-object-bytes`.
    pub max_object_bytes: Option<u64>,
    /// `--remote-signing-key-file`.
    pub signing_key_file: Option<PathBuf>,
    /// `--remote-trusted-key` (repeatable); replaces the list when not empty.
    pub trusted_keys: Vec<String>,
    /// `--remote-fetch`.
    pub fetch: Option<FetchMode>,
    /// `--remote-audit-rate`.
    pub audit_rate: Option<f64>,
}

impl RemoteOverrides {
    fn apply(&self, remote: &mut Option<Box<RemoteConfig>>) {
        if *self == RemoteOverrides::default() {
            return;
        }
        let r = remote.get_or_insert_with(Default::default);
        fn set<T: Clone>(field: &mut T, flag: &Option<T>) {
            if let Some(v) = flag {
                *field = v.clone();
            }
        }
        set(&mut r.url, &self.url);
        set(&mut r.endpoint, &self.endpoint);
        set(&mut r.region, &self.region);
        set(&mut r.allow_http, &self.allow_http);
        set(&mut r.read, &self.read);
        set(&mut r.write, &self.write);
        set(&mut r.timeout_ms, &self.timeout_ms);
        set(&mut r.upload_queue, &self.upload_queue);
        set(&mut r.max_object_bytes, &self.max_object_bytes);
        if let Some(k) = &self.signing_key_file {
            r.signing_key_file = Some(k.clone());
        }
        if !self.trusted_keys.is_empty() {
            r.trusted_keys = self.trusted_keys.clone();
        }
        set(&mut r.fetch, &self.fetch);
        set(&mut r.audit_rate, &self.audit_rate);
    }
}

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
        cfg.apply_env(env)?;
        cfg.apply_flags(flags);
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses a TOML document over the defaults; errors name the bad key.
    pub fn from_toml(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str::<Config>(text)
    }

    fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
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
                    format!("{v:?}: expected auto, human, json or journald"),
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

    fn apply_flags(&mut self, f: &Overrides) {
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
        f.remote.apply(&mut self.remote);
    }

    /// Checks the settings together; [`Config::load`] and `ctcached::run`
    /// call it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            key: key.into(),
            message,
        };
        if self.cache_dir.as_os_str().is_empty() {
            return Err(invalid("cache_dir", "empty path".into()));
        }
        if self.socket.as_os_str().len() > 100 {
            return Err(invalid(
                "socket",
                "Unix socket paths are limited to about 100 bytes".into(),
            ));
        }
        for (key, addr) in [
            ("listen_tcp", &self.listen_tcp),
            ("metrics_addr", &self.metrics_addr),
        ] {
            if let Some(a) = addr {
                a.parse::<std::net::SocketAddr>()
                    .map_err(|_| invalid(key, format!("{a:?} is not host:port")))?;
            }
        }
        self.validate_tls()?;
        for (key, v) in [
            ("memory_budget", self.memory_budget),
            ("max_message_bytes", self.max_message_bytes as u64),
            ("max_payload_bytes", self.max_payload_bytes),
            ("max_tensor_bytes", self.max_tensor_bytes),
            ("max_model_bytes", self.max_model_bytes),
            (
                "max_hashed_bytes_per_uid_per_hour",
                self.max_hashed_bytes_per_uid_per_hour,
            ),
            ("max_stored_bytes_per_uid", self.max_stored_bytes_per_uid),
            ("max_leases_per_uid", self.max_leases_per_uid as u64),
            ("max_lease_ttl_secs", self.max_lease_ttl_secs),
            ("max_lease_lifetime_secs", self.max_lease_lifetime_secs),
            (
                "max_queued_jobs_per_uid",
                self.max_queued_jobs_per_uid as u64,
            ),
            ("max_watches_per_uid", self.max_watches_per_uid as u64),
            ("max_event_subscribers", self.max_event_subscribers as u64),
            ("max_memo_entries", self.max_memo_entries as u64),
            ("max_memo_bytes", self.max_memo_bytes),
            ("max_connections", self.max_connections as u64),
            (
                "max_connections_per_uid",
                self.max_connections_per_uid as u64,
            ),
            (
                "max_requests_per_connection",
                self.max_requests_per_connection as u64,
            ),
            (
                "max_streams_per_connection",
                u64::from(self.max_streams_per_connection),
            ),
            ("request_timeout_secs", self.request_timeout_secs),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        if self.stable_secs < 0.0 || !self.stable_secs.is_finite() {
            return Err(invalid(
                "stable_secs",
                "must be a non-negative number".into(),
            ));
        }
        if let Some(r) = &self.remote {
            r.check()
                .map_err(|e| invalid(&format!("remote.{}", e.key), e.message))?;
        }
        for (i, rule) in self.policy.iter().enumerate() {
            if ctcache_kernels::find(&rule.format).is_none() {
                return Err(invalid(
                    &format!("policy[{i}].format"),
                    format!("unknown format {:?}", rule.format),
                ));
            }
            for t in &rule.data_types {
                if ctcache::dtype::DataType::from_name(t).is_none() {
                    return Err(invalid(
                        &format!("policy[{i}].data_types"),
                        format!("unknown data type {t:?}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// TCP off a loopback address only with TLS; TLS files come in pairs.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            key: key.into(),
            message,
        };
        match (&self.tls_cert, &self.tls_key) {
            (Some(_), None) => return Err(invalid("tls_key", "tls_cert needs tls_key".into())),
            (None, Some(_)) => return Err(invalid("tls_cert", "tls_key needs tls_cert".into())),
            _ => {}
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return Err(invalid(
                "tls_client_ca",
                "client certificates need TLS: set tls_cert and tls_key".into(),
            ));
        }
        let Some(addr) = &self.listen_tcp else {
            if self.tls_cert.is_some() {
                return Err(invalid(
                    "tls_cert",
                    "TLS is for listen_tcp, which is not set".into(),
                ));
            }
            return Ok(());
        };
        let addr: std::net::SocketAddr = addr
            .parse()
            .map_err(|_| invalid("listen_tcp", format!("{addr:?} is not host:port")))?;
        if !addr.ip().is_loopback() && self.tls_cert.is_none() {
            return Err(invalid(
                "listen_tcp",
                format!(
                    "{addr} is not a loopback address: TCP beyond this host needs TLS (set tls_cert and tls_key; tls_client_ca to require client certificates)"
                ),
            ));
        }
        Ok(())
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
