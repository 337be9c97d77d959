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
pub use skeleton::{inline, served, split, MovedTensor};

/// onnxruntime's graph optimization levels a form is made at, as its
/// worker and the clients name them.
pub const ONNXRUNTIME_LEVELS: [&str; 4] = ["basic", "extended", "layout", "all"];

/// The level a policy rule or a request leaves unset.
pub const DEFAULT_LEVEL: &str = "extended";

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
