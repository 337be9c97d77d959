//! Import: a model that carries compiled tensors -> the store. An entry is
//! taken only when the checker passes for it and its source digest matches
//! the digest recomputed from the model's own initializer.

use std::time::Duration;

use ctcache::check::{payload_ref, CheckOptions, Checked};
use ctcache::onnx::Model;
use ctcache::store::{NewEntry, Producer};

use super::{model, Error, Miss, Result};
use crate::caller::Caller;
use crate::events::EventKind;
use crate::state::Daemon;

/// A compiled tensor of the model that was not imported, and why.
#[derive(Debug, Clone)]
pub(crate) struct ImportSkip {
    pub index: u32,
    pub source_name: String,
    pub miss: Miss,
}

/// What Import did.
#[derive(Debug, Clone, Default)]
pub(crate) struct ImportReport {
    pub imported: u32,
    pub already_present: u32,
    pub skipped: Vec<ImportSkip>,
}

/// Imports the compiled tensors of the model at `path` (trusted callers
/// only).
pub(crate) fn import(d: &Daemon, caller: &Caller, path: &str) -> Result<ImportReport> {
    caller.require_trusted("import models")?;
    let m = model::open(d, path, caller)?;
    let (canonical, model) = (&m.path, &*m.model);
    let checked = Checked::new(model, &CheckOptions::default())?;
    let (tensors, digests) = model::digests(d, canonical, model)?;
    let mut resp = ImportReport::default();
    if let Some(e) = checked.model_errors.first() {
        return Err(Error::invalid(format!(
            "the model's compiled tensors are invalid: {e}"
        )));
    }
    for (i, c) in checked.ext.compiled_tensors.iter().enumerate() {
        let skip = |reason: &'static str, detail: String| ImportSkip {
            index: i as u32,
            source_name: c.source_name.clone(),
            miss: Miss::new(reason, detail),
        };
        if let Some(err) = checked.entry_errors(i).into_iter().next() {
            resp.skipped.push(skip("invalid", err.to_string()));
            continue;
        }
        let Some(t) = tensors.iter().find(|t| t.name == c.source_name) else {
            resp.skipped
                .push(skip("invalid", "source initializer missing".into()));
            continue;
        };
        // The digest is recomputed from the model's own initializer, in the
        // entry's algorithm.
        let actual = match c.digest_algorithm.parse::<ctcache::digest::Algorithm>() {
            Ok(ctcache::digest::Algorithm::Blake3) => digests[&t.name],
            Ok(alg) => ctcache::digest::digest_tensor(model, t, alg)?,
            Err(_) => {
                resp.skipped
                    .push(skip("unknown_digest_algorithm", c.digest_algorithm.clone()));
                continue;
            }
        };
        if c.source_digest.as_ref() != actual.bytes {
            resp.skipped.push(skip(
                "stale_digest",
                "the initializer does not match the entry's digest".into(),
            ));
            continue;
        }
        let Some(value) = c.value.as_ref() else {
            continue;
        };
        let root = match checked.value_rule(i) {
            Ok(r) => r,
            Err(e) => {
                resp.skipped.push(skip("invalid", e.to_string()));
                continue;
            }
        };
        let physical_type = ctcache::structs::canonical_type(root, &checked.ext.struct_types, 32)
            .map_err(|e| Error::invalid(e.to_string()))?;
        let device = checked.ext.devices[c.device as usize].clone();
        let payload = payload_bytes(model, value)?;
        let new = NewEntry {
            source: actual,
            device,
            physical_type,
            dims: value.dims.clone(),
            producer: Producer {
                packer_id: ctcache::structs::metadata(
                    &root.metadata_props,
                    ctcache::structs::PACKER_KEY,
                )
                .unwrap_or("")
                .to_string(),
                packer_version: ctcache::structs::metadata(
                    &root.metadata_props,
                    ctcache::structs::FORMAT_VERSION_KEY,
                )
                .unwrap_or("")
                .to_string(),
                client_uid: if caller.is_self_or_root() {
                    None
                } else {
                    caller.uid()
                },
            },
            source_names: vec![c.source_name.clone()],
            model_paths: vec![canonical.display().to_string()],
            pack_duration: Duration::ZERO,
        };
        let stored = d.store.put(&new, &payload[..])?;
        if stored.created {
            resp.imported += 1;
            d.events.emit(
                EventKind::EntryAdded,
                Some(stored.entry.key),
                canonical.display().to_string(),
                "import".into(),
            );
        } else {
            resp.already_present += 1;
        }
    }
    Ok(resp)
}

/// The payload bytes of a structured value: inline, or its external range.
fn payload_bytes(model: &Model, value: &ctcache::pb::StructProto) -> Result<bytes::Bytes> {
    if value.external_data.is_empty() {
        return Ok(value.raw_data.clone());
    }
    let r = payload_ref(value).map_err(Error::invalid)?;
    let file = model.external_file(&r).map_err(Error::invalid)?;
    let range = r.range(file.len() as u64).map_err(Error::invalid)?;
    Ok(file.slice(range.start as usize..range.end as usize))
}
