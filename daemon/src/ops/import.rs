//! Import: a model that carries compiled tensors -> the store. An entry is
//! taken only when the core's hit rule accepts it for some device: it
//! passes the checker, its digest matches the model's own initializer, its
//! layout is one this build produces (D9) and its payload checksum, when
//! recorded, matches. Everything else is skipped with its miss reason.

use std::time::Duration;

use ctcache::check::CheckOptions;
use ctcache::hit::Host;
use ctcache::resolve::importable;
use ctcache::store::{NewEntry, Producer};

use super::{model, Miss, Result};
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

/// Imports the compiled tensors of the model at `path`, or of the one
/// `handout` names (trusted callers only).
pub(crate) fn import(
    d: &Daemon,
    caller: &Caller,
    path: &str,
    handout: &str,
) -> Result<ImportReport> {
    caller.require_trusted("import models")?;
    let m = model::open(d, path, handout, caller)?;
    let (canonical, model) = (&m.path, &*m.model);
    // The memo's digests when it can give them; a model with an unreadable
    // initializer still imports its other entries (digests computed here).
    let digests = model::digests(d, None, canonical, model)
        .map(|(_, d)| d)
        .unwrap_or_default();
    let host = Host::any_device(d.host.accept().clone());
    let mut resp = ImportReport::default();
    for item in importable(model, &host, &CheckOptions::default(), &digests) {
        let checked = item
            .entry
            .and_then(|e| e.copy_payload().map(|payload| (e, payload)));
        let (e, payload) = match checked {
            Ok(x) => x,
            Err(m) => {
                resp.skipped.push(ImportSkip {
                    index: item.index as u32,
                    source_name: item.source_name,
                    miss: m.into(),
                });
                continue;
            }
        };
        let (packer_id, packer_version) = e
            .layout
            .as_ref()
            .map(|l| (l.packer.clone(), l.format_version.to_string()))
            .unwrap_or_default();
        let new = NewEntry {
            source: e.source,
            source_shape: e.source_shape,
            device: e.device,
            physical_type: e.physical_type,
            dims: e.dims,
            producer: Producer {
                packer_id,
                packer_version,
                client_uid: if caller.is_self_or_root() {
                    None
                } else {
                    caller.uid()
                },
                requested_by: None,
            },
            source_names: vec![item.source_name],
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
