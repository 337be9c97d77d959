//! The model-level rules: those about the struct type table and the
//! device table, not about one compiled entry.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use prost::Message;

use super::{duplicate_key, err, from_struct, CheckError};
use crate::onnx::Extension;
use crate::structs::{self, Limits};

/// The model-level rules broken by `ext`: the struct type table is valid,
/// metadata keys are unique, devices are unique and typed.
pub(super) fn broken(ext: &Extension, limits: &Limits) -> Vec<CheckError> {
    let mut out = Vec::new();
    if let Err(e) = structs::validate_table(&ext.struct_types, limits) {
        out.push(from_struct(e, None, ""));
    }
    for (i, t) in ext.struct_types.iter().enumerate() {
        if let Some(k) = duplicate_key(&t.metadata_props) {
            out.push(err(
                "metadata.unique",
                None,
                format!("struct_types[{i}].metadata_props"),
                format!("duplicated key {k:?}"),
            ));
        }
    }
    // Equal devices encode equally (prost writes fields in order), so
    // the first index of each encoding finds duplicates in linear time.
    let mut first_of: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, d) in ext.devices.iter().enumerate() {
        match first_of.entry(d.encode_to_vec()) {
            Entry::Occupied(j) => out.push(err(
                "device.unique",
                None,
                format!("devices[{i}]"),
                format!("duplicates devices[{}]", j.get()),
            )),
            Entry::Vacant(v) => {
                v.insert(i);
            }
        }
        if let Some(k) = duplicate_key(&d.metadata_props) {
            out.push(err(
                "metadata.unique",
                None,
                format!("devices[{i}].metadata_props"),
                format!("duplicated key {k:?}"),
            ));
        }
        if d.r#type.is_empty() {
            out.push(err(
                "device.type",
                None,
                format!("devices[{i}].type"),
                "device type is empty",
            ));
        }
    }
    out
}
