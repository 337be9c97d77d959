//! The compiled-tensor extension of a model (`ModelProto` fields
//! 1000-1002): counting its fields against the limits and decoding them,
//! strictly or field by field.

use super::{decode, Model};
use crate::error::{Error, Result};
use crate::onnx::fields::*;
use crate::pb;

/// The compiled-tensor extension of a model (fields 1000-1002), decoded.
/// Inline payloads borrow from the model mapping.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extension {
    /// `ModelProto.struct_types`: the declared structured types.
    pub struct_types: Vec<pb::StructTypeProto>,
    /// `ModelProto.devices`: the devices entries refer to by index.
    pub devices: Vec<pb::DeviceProto>,
    /// `ModelProto.compiled_tensors`: the compiled entries.
    pub compiled_tensors: Vec<pb::CompiledTensorProto>,
}

/// How many fields of each extension kind a model has (counted from the
/// index of its top-level fields, nothing decoded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExtensionCounts {
    /// `ModelProto.struct_types` fields.
    pub struct_types: usize,
    /// `ModelProto.devices` fields.
    pub devices: usize,
    /// `ModelProto.compiled_tensors` fields.
    pub compiled_tensors: usize,
}

impl ExtensionCounts {
    /// Refuses counts over `limits` (4096 struct types, 1M devices and 1M
    /// compiled tensors by default): checked before anything is decoded,
    /// since a field of a few bytes decodes to a message many times larger.
    pub fn within(&self, limits: &crate::structs::Limits) -> Result<(), OverLimits> {
        if self.struct_types > limits.max_struct_types
            || self.devices.max(self.compiled_tensors) > limits.max_entries
        {
            return Err(OverLimits {
                counts: *self,
                max_struct_types: limits.max_struct_types,
                max_entries: limits.max_entries,
            });
        }
        Ok(())
    }
}

/// An extension with more fields of a kind than the limits allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{} struct types, {} devices, {} compiled tensors exceed the limits ({}, {}, {})",
    counts.struct_types,
    counts.devices,
    counts.compiled_tensors,
    max_struct_types,
    max_entries,
    max_entries
)]
pub struct OverLimits {
    /// The model's counts.
    pub counts: ExtensionCounts,
    /// `Limits::max_struct_types`.
    pub max_struct_types: usize,
    /// `Limits::max_entries` (devices and compiled tensors each).
    pub max_entries: usize,
}

/// The extension decoded field by field ([`Model::extension_lenient`]).
#[derive(Debug, Clone, Default)]
pub struct LenientExtension {
    /// What decoded; an undecodable compiled tensor keeps its slot (a
    /// default entry), so indices stay those of the file.
    pub ext: Extension,
    /// Why the struct type or device table is unusable (a field of it does
    /// not decode: entries refer to them by index, so none can be trusted).
    pub table_error: Option<String>,
    /// Compiled tensors that do not decode: (index, error).
    pub entry_errors: Vec<(usize, String)>,
}

impl Model {
    /// How many extension fields of each kind the model has.
    pub fn extension_counts(&self) -> ExtensionCounts {
        let mut n = ExtensionCounts::default();
        for f in &self.top {
            match f.number {
                MODEL_STRUCT_TYPES => n.struct_types += 1,
                MODEL_DEVICES => n.devices += 1,
                MODEL_COMPILED_TENSORS => n.compiled_tensors += 1,
                _ => {}
            }
        }
        n
    }

    /// The compiled-tensor extension, decoded (payloads borrowed); refused
    /// when it has more fields of a kind than the default limits allow.
    pub fn extension(&self) -> Result<Extension> {
        let (struct_types, devices) = self.extension_tables()?;
        let compiled_tensors = self
            .compiled_tensors()
            .map(|(_, c)| c)
            .collect::<Result<_>>()?;
        Ok(Extension {
            struct_types,
            devices,
            compiled_tensors,
        })
    }

    /// The struct type and device tables that compiled tensors refer to by
    /// index, decoded; refused when the extension has more fields of a kind
    /// than the default limits allow.
    pub(crate) fn extension_tables(
        &self,
    ) -> Result<(Vec<pb::StructTypeProto>, Vec<pb::DeviceProto>)> {
        self.extension_counts()
            .within(&crate::structs::Limits::default())
            .map_err(|e| self.named(Error::Model(e.to_string())))?;
        let (mut types, mut devices) = (Vec::new(), Vec::new());
        for f in &self.top {
            let bytes = || self.bytes.slice(f.value.clone());
            match f.number {
                MODEL_STRUCT_TYPES => types.push(decode(bytes(), "ModelProto.struct_types")),
                MODEL_DEVICES => devices.push(decode(bytes(), "ModelProto.devices")),
                _ => {}
            }
        }
        let named = |e| self.named(e);
        Ok((
            types.into_iter().collect::<Result<_>>().map_err(named)?,
            devices.into_iter().collect::<Result<_>>().map_err(named)?,
        ))
    }

    /// The compiled tensors, each decoded only when the iterator reaches it
    /// (a caller that handles one at a time never holds them all): the
    /// index of its top-level field and the entry. Call
    /// [`Model::extension_tables`] first, which checks the counts.
    pub fn compiled_tensors(
        &self,
    ) -> impl Iterator<Item = (usize, Result<pb::CompiledTensorProto>)> + '_ {
        self.top
            .iter()
            .enumerate()
            .filter(|(_, f)| f.number == MODEL_COMPILED_TENSORS)
            .map(|(i, f)| {
                let c = decode(
                    self.bytes.slice(f.value.clone()),
                    "ModelProto.compiled_tensors",
                );
                (i, c.map_err(|e| self.named(e)))
            })
    }

    /// The extension, decoded field by field (see [`LenientExtension`]):
    /// never fails, so one bad field does not make the model unloadable.
    pub(crate) fn extension_lenient(&self) -> LenientExtension {
        let mut out = LenientExtension::default();
        for f in &self.top {
            let bytes = || self.bytes.slice(f.value.clone());
            match f.number {
                MODEL_STRUCT_TYPES => match decode(bytes(), "ModelProto.struct_types") {
                    Ok(t) => out.ext.struct_types.push(t),
                    Err(e) => {
                        out.table_error.get_or_insert(e.to_string());
                    }
                },
                MODEL_DEVICES => match decode(bytes(), "ModelProto.devices") {
                    Ok(d) => out.ext.devices.push(d),
                    Err(e) => {
                        out.table_error.get_or_insert(e.to_string());
                    }
                },
                MODEL_COMPILED_TENSORS => {
                    let c = decode(bytes(), "ModelProto.compiled_tensors").unwrap_or_else(|e| {
                        out.entry_errors
                            .push((out.ext.compiled_tensors.len(), e.to_string()));
                        pb::CompiledTensorProto::default()
                    });
                    out.ext.compiled_tensors.push(c);
                }
                _ => {}
            }
        }
        out
    }
}
