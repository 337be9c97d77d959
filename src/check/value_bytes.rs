//! A structured value's payload: inline bytes, or the range of an
//! external-data file its `external_data` entries name.

use std::collections::BTreeSet;
use std::path::Path;

use bytes::Bytes;

use crate::onnx::{ExternalFileError, ExternalRef, ExternalRefError, Model};
use crate::pb;

/// Why a structured value's payload cannot be had.
#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    /// The `external_data` entries, location or range are refused.
    #[error(transparent)]
    Ref(#[from] ExternalRefError),
    /// The external reference has no `length`.
    #[error("external payloads need a \"length\" key")]
    NoLength,
    /// Both `raw_data` and `external_data` are set.
    #[error("both raw_data and external_data are set")]
    InlineAndExternal,
    /// The external-data file cannot be used.
    #[error(transparent)]
    File(#[from] ExternalFileError),
}

/// The external reference of a structured payload (`length` is mandatory).
pub fn payload_ref(value: &pb::StructProto) -> Result<ExternalRef, PayloadError> {
    let ext = ExternalRef::from_entries(
        value
            .external_data
            .iter()
            .map(|p| (p.key.as_str(), p.value.as_str())),
    )?;
    if ext.length.is_none() {
        return Err(PayloadError::NoLength);
    }
    Ok(ext)
}

/// The payload bytes of a structured value: inline, or its external range
/// (mapped, not copied; location, length and range checked).
pub fn payload_bytes(model: &Model, value: &pb::StructProto) -> Result<Bytes, PayloadError> {
    if value.external_data.is_empty() {
        return Ok(value.raw_data.clone());
    }
    if !value.raw_data.is_empty() {
        return Err(PayloadError::InlineAndExternal);
    }
    let ext = payload_ref(value)?;
    let file = model.external_file(&ext)?;
    let range = ext.range(file.len() as u64)?;
    Ok(file.slice(range.start as usize..range.end as usize))
}
/// The data files `model` reads, relative to its folder: its
/// initializers' external data and its compiled tensors' external payloads.
/// Stops once it has more than `limit` (the caller refuses such a model).
/// A compiled tensor that does not decode, or whose reference is refused,
/// names none: reading it fails on its own.
pub fn data_files(model: &Model, limit: usize) -> crate::Result<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    let mut add = |loc: &ExternalRef| {
        if let Some(p) = loc.file_in(Path::new("")) {
            names.insert(p.to_string_lossy().into_owned());
        }
        names.len() > limit
    };
    for t in model.initializers()? {
        if let crate::onnx::Storage::External(loc) = &t.storage {
            if add(loc) {
                return Ok(names);
            }
        }
    }
    for (_, c) in model.compiled_tensors() {
        let payload = c
            .ok()
            .and_then(|c| c.value)
            .filter(|v| !v.external_data.is_empty());
        if let Some(Ok(loc)) = payload.map(|v| payload_ref(&v)) {
            if add(&loc) {
                return Ok(names);
            }
        }
    }
    Ok(names)
}
