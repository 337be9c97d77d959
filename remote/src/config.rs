//! The `[remote]` section of the daemon's config, and its checked form.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::manifest::Trust;
use crate::signing_keys::{PublicKey, SecretKey};

/// When a local miss asks the remote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FetchMode {
    /// The cost rule: per entry, the path measured faster for its format
    /// and backend (fetching first to measure the remote, then packing once
    /// to measure the packer; one entry in 16 takes the other path).
    #[default]
    Auto,
    /// Fetch on every local miss.
    Always,
    /// Never fetch (uploads still follow `write`).
    Never,
}

/// A `[remote]` setting that cannot be used, named by its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {message}")]
pub struct SettingError {
    /// The key under `[remote]`, e.g. `url`.
    pub key: &'static str,
    /// What is wrong with its value.
    pub message: String,
}

impl SettingError {
    fn new(key: &'static str, message: impl Into<String>) -> SettingError {
        SettingError {
            key,
            message: message.into(),
        }
    }
}

/// `[remote]`: the fleet tier on S3-compatible object storage.
///
/// This declaration is the one list of the section's keys: the daemon's
/// `--remote-*` flags, `CTCACHE_REMOTE_URL` and their help (doc comments,
/// defaults) are made from its schema.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// The bucket and prefix entries are shared under: `s3://bucket/prefix`
    /// (the prefix may be empty).
    #[schemars(extend("x-env" = "CTCACHE_REMOTE_URL"))]
    pub url: String,
    /// The S3 endpoint, e.g. `http://127.0.0.1:9000` for a local server;
    /// empty: AWS, or `AWS_ENDPOINT` from the environment.
    pub endpoint: String,
    /// The S3 region; empty: `AWS_REGION` / `AWS_DEFAULT_REGION`, else
    /// `us-east-1`.
    pub region: String,
    /// Allow plain HTTP endpoints (local servers only).
    pub allow_http: bool,
    /// Ask the remote on a local miss.
    pub read: bool,
    /// Upload what this host packs.
    pub write: bool,
    /// Each request's limit until its answer starts, and the longest stall
    /// while a payload streams, ms; at most one retry within it.
    pub timeout_ms: u64,
    /// The slowest upload waited for, bytes a second: a request sending
    /// `n` bytes is given `timeout_ms` and `n` at this rate (a server
    /// reports no progress while a body goes up).
    pub min_upload_bytes_per_s: u64,
    /// Upload jobs queued at most; more are dropped and counted.
    pub upload_queue: usize,
    /// Largest payload fetched or uploaded, bytes.
    pub max_object_bytes: u64,
    /// Ed25519 key (`ctcachectl remote keygen`) that signs uploads; without
    /// one this host does not upload.
    pub signing_key_file: Option<PathBuf>,
    /// A public key (`name:base64`) whose manifests this host accepts (its
    /// own signing key is always trusted).
    pub trusted_keys: Vec<String>,
    /// A public key (`name:base64`) whose runtime forms this host accepts
    /// (its own signing key is always trusted for them). A form cannot be
    /// audited by making it again (a runtime's output is not byte-stable),
    /// so `trusted_keys` alone does not admit one; none listed: only this
    /// host's own forms are fetched.
    pub trusted_form_keys: Vec<String>,
    /// When a local miss asks the remote.
    pub fetch: FetchMode,
    /// Fraction (0 to 1) of fetched entries packed again here and compared
    /// byte for byte; a mismatch quarantines the entry and names its signer.
    pub audit_rate: f64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            url: String::new(),
            endpoint: String::new(),
            region: String::new(),
            allow_http: false,
            read: true,
            write: true,
            timeout_ms: 3000,
            min_upload_bytes_per_s: 1 << 20,
            upload_queue: 256,
            max_object_bytes: 4 << 30,
            signing_key_file: None,
            trusted_keys: Vec::new(),
            trusted_form_keys: Vec::new(),
            fetch: FetchMode::Auto,
            audit_rate: 0.0,
        }
    }
}

impl RemoteConfig {
    /// The checks that need no file: the url, and numbers in range. The
    /// error names the key.
    pub fn check(&self) -> Result<(), SettingError> {
        parse_url(&self.url)?;
        for (key, v) in [
            ("timeout_ms", self.timeout_ms),
            ("min_upload_bytes_per_s", self.min_upload_bytes_per_s),
            ("upload_queue", self.upload_queue as u64),
            ("max_object_bytes", self.max_object_bytes),
        ] {
            if v == 0 {
                return Err(SettingError::new(key, "must be at least 1"));
            }
        }
        if !(0.0..=1.0).contains(&self.audit_rate) {
            let m = format!("{} is not between 0 and 1", self.audit_rate);
            return Err(SettingError::new("audit_rate", m));
        }
        Ok(())
    }
}

/// A bucket and the prefix inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The bucket name, checked against the S3 naming rules.
    pub bucket: String,
    /// No leading or trailing `/`.
    pub prefix: String,
}

/// Parses `s3://bucket[/prefix]`.
pub fn parse_url(url: &str) -> Result<Location, SettingError> {
    let bad = |m: String| SettingError::new("url", m);
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| bad(format!("{url:?}: expected s3://bucket/prefix")))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let valid_bucket = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if !valid_bucket {
        return Err(bad(format!(
            "{url:?}: bucket {bucket:?} is not a valid S3 bucket name"
        )));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|p| p == "." || p == "..") || prefix.contains("//") {
        return Err(bad(format!(
            "{url:?}: the prefix has an empty, '.' or '..' part"
        )));
    }
    Ok(Location {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    })
}

/// The config, checked: location parsed, keys loaded.
pub struct Settings {
    /// The config as given.
    pub config: RemoteConfig,
    /// `url`, parsed.
    pub location: Location,
    /// The key loaded from `signing_key_file`; `None`: this host does not upload.
    pub signing_key: Option<SecretKey>,
    /// `trusted_keys` plus this host's own public key.
    pub trust: Trust,
    /// `trusted_form_keys` plus this host's own public key: the signers
    /// whose runtime forms are fetched.
    pub form_trust: Trust,
}

impl Settings {
    /// Checks `config` and loads its keys; the error names the bad setting.
    pub fn new(config: RemoteConfig) -> Result<Settings, SettingError> {
        let location = parse_url(&config.url)?;
        config.check()?;
        let signing_key = match &config.signing_key_file {
            Some(p) => Some(
                SecretKey::load(p)
                    .map_err(|e| SettingError::new("signing_key_file", e.to_string()))?,
            ),
            None => None,
        };
        let trust = |setting: &'static str, list: &[String]| {
            let mut keys = list
                .iter()
                .map(|t| PublicKey::parse(t).map_err(|e| SettingError::new(setting, e.to_string())))
                .collect::<Result<Vec<_>, _>>()?;
            keys.extend(signing_key.as_ref().map(SecretKey::public));
            Ok::<_, SettingError>(Trust::new(keys))
        };
        let (trust, form_trust) = (
            trust("trusted_keys", &config.trusted_keys)?,
            trust("trusted_form_keys", &config.trusted_form_keys)?,
        );
        Ok(Settings {
            config,
            location,
            signing_key,
            trust,
            form_trust,
        })
    }

    /// `timeout_ms` as a duration.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.config.timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let l = parse_url("s3://ctc-bucket/fleet/a/").unwrap();
        assert_eq!(
            (l.bucket.as_str(), l.prefix.as_str()),
            ("ctc-bucket", "fleet/a")
        );
        assert_eq!(parse_url("s3://abc").unwrap().prefix, "");
        for bad in [
            "http://b/p",
            "s3://",
            "s3://B_ucket/x",
            "s3://abc/x/../y",
            "s3://abc/x//y",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_trust_their_own_key_and_refuse_bad_ones() {
        let d = tempfile::tempdir().unwrap();
        let k = SecretKey::generate("me").unwrap();
        let (s, p) = (d.path().join("s"), d.path().join("p"));
        k.write_pair(&s, &p).unwrap();
        let cfg = RemoteConfig {
            url: "s3://bucket/x".into(),
            signing_key_file: Some(s),
            ..Default::default()
        };
        let st = Settings::new(cfg.clone()).unwrap();
        assert!(!st.trust.is_empty());
        let bad = RemoteConfig {
            trusted_keys: vec!["nope".into()],
            ..cfg.clone()
        };
        let err = Settings::new(bad)
            .err()
            .expect("a bad trusted key is refused");
        assert_eq!(err.key, "trusted_keys", "{err}");
        let bad = RemoteConfig {
            trusted_form_keys: vec!["nope".into()],
            ..cfg
        };
        let err = Settings::new(bad)
            .err()
            .expect("a bad trusted form key is refused");
        assert_eq!(err.key, "trusted_form_keys", "{err}");
    }
}
