//! The settings checked together, each error naming its key.

use super::{Config, ConfigError};

impl Config {
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
}
