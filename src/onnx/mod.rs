//! ONNX model access at the wire level: memory-mapped models, top-level graph
//! initializers borrowed from the mapping, external data, and the
//! byte-preserving rewrite of the compiled-tensor fields.

pub mod elem_types;
mod external;
pub mod graph;
mod guarded;
mod model;
pub mod rewrite;
pub mod shapes;
mod tensor;

pub use external::{ExternalRef, ExternalRefError, MAX_EXTERNAL_FILES};
pub use guarded::{ensure_intact, intact, release, CUT_SHORT};
pub(crate) use model::decode;
pub use model::{
    BadInitializer, Extension, ExtensionCounts, ExternalFileError, LenientExtension, Model,
    OverLimits, TopField,
};
pub use tensor::{Storage, TensorRef, Typed};

/// `ModelProto` field numbers that ctcache reads or splices.
pub mod fields {
    /// `ModelProto.graph`.
    pub const MODEL_GRAPH: u32 = 7;
    /// `ModelProto.opset_import`.
    pub(crate) const MODEL_OPSET_IMPORT: u32 = 8;
    /// `ModelProto.functions`.
    pub(crate) const MODEL_FUNCTIONS: u32 = 25;
    /// `ModelProto.struct_types` (extension, D1).
    pub const MODEL_STRUCT_TYPES: u32 = 1000;
    /// `ModelProto.devices` (extension, D1).
    pub(crate) const MODEL_DEVICES: u32 = 1001;
    /// `ModelProto.compiled_tensors` (extension, D1).
    pub const MODEL_COMPILED_TENSORS: u32 = 1002;
    /// `GraphProto.node`.
    pub(crate) const GRAPH_NODE: u32 = 1;
    /// `GraphProto.initializer`.
    pub(crate) const GRAPH_INITIALIZER: u32 = 5;
    /// `GraphProto.input`.
    pub(crate) const GRAPH_INPUT: u32 = 11;
    /// `GraphProto.output`.
    pub(crate) const GRAPH_OUTPUT: u32 = 12;
    /// `GraphProto.value_info`.
    pub(crate) const GRAPH_VALUE_INFO: u32 = 13;

    /// True for the extension fields owned by ctcache (D1).
    pub(crate) fn is_compiled_field(number: u32) -> bool {
        (MODEL_STRUCT_TYPES..=MODEL_COMPILED_TENSORS).contains(&number)
    }
}
