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
        for (key, lib) in [
            ("ort_library", &self.ort_library),
            ("openvino_library", &self.openvino_library),
        ] {
            if let Some(lib) = lib.as_ref().filter(|l| !l.is_absolute()) {
                return Err(invalid(
                    key,
                    format!("{} is not an absolute path", lib.display()),
                ));
            }
        }
        self.validate_tls()?;
        if let Some(key) = self
            .zero_bound()
            .map_err(|e| invalid("config", e.to_string()))?
        {
            return Err(invalid(&key, "must be at least 1".into()));
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
            if rule.format == ONNXRUNTIME_FORM {
                check_form_rule(i, rule)?;
                continue;
            }
            if rule.format == OPENVINO_FORM {
                check_openvino_rule(i, rule)?;
                continue;
            }
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

    /// A bound or budget set to 0, by its key. Bounds are named so: every
    /// `max_*` key, every `*_budget` and `request_timeout_secs` (the gc
    /// limits, where no limit is the key left out, are refused at parse).
    fn zero_bound(&self) -> Result<Option<String>, toml::ser::Error> {
        let table = toml::Table::try_from(self)?;
        Ok(table
            .iter()
            .filter(|(key, _)| {
                key.starts_with("max_")
                    || key.ends_with("_budget")
                    || *key == "request_timeout_secs"
            })
            .find(|(_, v)| v.as_integer() == Some(0))
            .map(|(key, _)| key.clone()))
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

/// The policy rule of onnxruntime forms: its one parameter, the level.
const ONNXRUNTIME_FORM: &str = "onnxruntime.optimized_model";

/// The policy rule of OpenVINO forms: its parameters are the compile
/// config's properties (and `device`, `CPU`).
const OPENVINO_FORM: &str = "openvino.compiled_model";

fn check_openvino_rule(i: usize, rule: &super::PolicyRule) -> Result<(), ConfigError> {
    let invalid = |key: String, message: String| ConfigError::Invalid { key, message };
    if let Some(device) = rule.params.get("device").filter(|d| *d != "CPU") {
        return Err(invalid(
            format!("policy[{i}].params.device"),
            format!("{device:?}: OpenVINO forms are made for CPU only"),
        ));
    }
    ctcache::forms::check_openvino_config(rule.params.iter())
        .map_err(|e| invalid(format!("policy[{i}].params"), e.to_string()))
}

fn check_form_rule(i: usize, rule: &super::PolicyRule) -> Result<(), ConfigError> {
    use ctcache::forms::ONNXRUNTIME_LEVELS;
    let invalid = |key: &str, message: String| ConfigError::Invalid {
        key: key.to_string(),
        message,
    };
    for (k, v) in &rule.params {
        match k.as_str() {
            "level" if ONNXRUNTIME_LEVELS.contains(&v.as_str()) => {}
            "level" => {
                return Err(invalid(
                    &format!("policy[{i}].params.level"),
                    format!("{v:?} is not one of {}", ONNXRUNTIME_LEVELS.join(", ")),
                ))
            }
            other => {
                return Err(invalid(
                    &format!("policy[{i}].params"),
                    format!("{other:?}: a form rule takes level only"),
                ))
            }
        }
    }
    Ok(())
}
