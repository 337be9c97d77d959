//! Runtime compiled forms (D15): what a runtime makes of a whole model at
//! session start (onnxruntime's optimized model, OpenVINO's compiled blob),
//! made once per host by the daemon's worker and kept as a store entry.
//!
//! This module holds the key: what a form was made from, so that a form is
//! served only to a session that would have made the same one, and a miss
//! names the part that differed.

mod key;
mod model_digest;

pub use key::{FormKey, KeyPart, RuntimeIdentity};
pub use model_digest::model_digest;

#[cfg(test)]
mod tests;
