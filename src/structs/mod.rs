//! Structured types (docs/FORMAT.md, Structured types): validation, the size function, the
//! leaf reader and the physical type key (D4). Every walk is bounded by
//! [`Limits`] before it allocates anything proportional to the input.

mod key;
mod leaves;
mod walk;

pub use key::{canonical_type, physical_type_key, PhysicalTypeKey};
pub use leaves::{leaves, Leaf, LeafType, LeafView};
pub use walk::{check_value, check_value_within, validate_table, ValueLayout};

use crate::pb;

/// Configurable bounds on structured types (D6).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Deepest nesting of types inside a type (references included).
    pub max_depth: u32,
    /// Entries of `ModelProto.struct_types`.
    pub max_struct_types: usize,
    /// Fields of one structure, components of one packed array.
    pub max_fields: usize,
    /// Nodes visited while walking one value's type (guards reference fan-out).
    pub max_nodes: u64,
    /// Nodes visited walking the types of one model's values and table
    /// together (many small entries over one large type would otherwise
    /// cost entries x nodes).
    pub max_model_nodes: u64,
    /// Bytes of all `constant` fields of one model.
    pub max_constant_bytes: u64,
    /// `dims_param` entries of one declaration.
    pub max_dims: usize,
    /// Leaves enumerated by the leaf reader.
    pub max_leaves: usize,
    /// Compiled tensors and devices per model.
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 32,
            max_struct_types: 4096,
            max_fields: 4096,
            max_nodes: 100_000,
            max_model_nodes: 10_000_000,
            max_constant_bytes: 16 << 20,
            max_dims: 16,
            max_leaves: 4096,
            max_entries: 1 << 20,
        }
    }
}

/// A structural error: the rule broken, where, and what was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("[{rule}] {path}: {message}")]
pub struct StructError {
    /// The rule's short name.
    pub rule: &'static str,
    /// The field path where it broke.
    pub path: String,
    /// What was found.
    pub message: String,
}

impl StructError {
    pub(crate) fn new(
        rule: &'static str,
        path: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        StructError {
            rule,
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The concrete type of a `StructProto` value (after following `type`).
pub(crate) fn resolve_root<'a>(
    value: &'a pb::StructProto,
    table: &'a [pb::StructTypeProto],
) -> Result<&'a pb::StructTypeProto, StructError> {
    match (value.r#type, value.struct_type.as_ref()) {
        (t, Some(_)) if t >= 0 => Err(StructError::new(
            "struct.type_index",
            "type",
            format!("type = {t} refers to a model-level type but struct_type is also set"),
        )),
        (t, None) if t >= 0 => table.get(t as usize).ok_or_else(|| {
            StructError::new(
                "struct.type_index",
                "type",
                format!("type = {t} is out of range ({} struct types)", table.len()),
            )
        }),
        (-1, Some(inline)) => Ok(inline),
        (-1, None) => Err(StructError::new(
            "struct.type_index",
            "type",
            "type = -1 requires an inline struct_type",
        )),
        (t, _) => Err(StructError::new(
            "struct.type_index",
            "type",
            format!("type = {t} is invalid (>= 0 or -1)"),
        )),
    }
}

/// Value of a metadata key, if present.
pub fn metadata<'a>(props: &'a [pb::StringStringEntryProto], key: &str) -> Option<&'a str> {
    props
        .iter()
        .find(|p| p.key == key)
        .map(|p| p.value.as_str())
}

/// Metadata key naming a type's format version (D4).
pub const FORMAT_VERSION_KEY: &str = "ctcache.format_version";
/// Metadata key naming the packer that produced a type (D4).
pub const PACKER_KEY: &str = "ctcache.packer";
