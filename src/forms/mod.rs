//! Runtime compiled forms (D15): what a runtime makes of a whole model at
//! session start (onnxruntime's optimized model, OpenVINO's compiled blob),
//! made once per host by the daemon's worker and kept as a store entry.
//!
//! This module holds the key: what a form was made from, so that a form is
//! served only to a session that would have made the same one, and a miss
//! names the part that differed.

mod entry;
mod key;
mod model_digest;
mod skeleton;

pub use entry::{form_type_name, is_form_type, FORM_FORMAT_VERSION};
pub use key::{FormKey, KeyPart, RuntimeIdentity};
pub use model_digest::{model_digest, model_digest_of};
pub use skeleton::{inline, moved, served, split, MovedTensor};

/// onnxruntime's graph optimization levels a form is made at, as its
/// worker and the clients name them.
pub const ONNXRUNTIME_LEVELS: [&str; 4] = ["basic", "extended", "layout", "all"];

/// The level a policy rule or a request leaves unset.
pub const DEFAULT_LEVEL: &str = "extended";

/// The most properties an OpenVINO compile config of a form may set.
pub const MAX_CONFIG: usize = 64;

/// The longest property name or value of such a config.
pub const MAX_CONFIG_TEXT: usize = 256;

/// Why an OpenVINO compile config cannot be a form's options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadConfig {
    /// More properties than [`MAX_CONFIG`].
    #[error("{0} config properties: at most {MAX_CONFIG}")]
    TooMany(usize),
    /// A name that is no property's.
    #[error("config property {0:?} is not a property name")]
    Name(String),
    /// A value that is no property's (by the name).
    #[error("config property {0:?}: its value is not a property value")]
    Value(String),
}

/// Checks an OpenVINO compile config (property names to values), as a
/// request or a policy rule gives it: names of letters, digits, `_` and
/// `.`, values without NUL, each at most [`MAX_CONFIG_TEXT`] bytes.
pub fn check_openvino_config<'a>(
    config: impl ExactSizeIterator<Item = (&'a String, &'a String)>,
) -> Result<(), BadConfig> {
    if config.len() > MAX_CONFIG {
        return Err(BadConfig::TooMany(config.len()));
    }
    for (k, v) in config {
        let name = k
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
        if k.is_empty() || !name || k.len() > MAX_CONFIG_TEXT {
            return Err(BadConfig::Name(k.clone()));
        }
        if v.len() > MAX_CONFIG_TEXT || v.contains('\0') {
            return Err(BadConfig::Value(k.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// The first top-level initializer held as external data, by name: a form
/// is made of a model that holds its weights (a runtime's worker reads no
/// file), so such a model has none.
pub fn external_initializer(model: &crate::onnx::Model) -> crate::Result<Option<String>> {
    Ok(model
        .initializers()?
        .into_iter()
        .find(|t| matches!(t.storage, crate::onnx::Storage::External(_)))
        .map(|t| t.name))
}
