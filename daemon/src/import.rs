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
use ctcache_api::v1 as api;

use crate::convert;
use crate::daemon::{Daemon, OpResult};
use crate::peer::Peer;

/// Imports the compiled tensors of the model at `path` (the caller checked
/// that `peer` is trusted).
pub fn import(d: &Daemon, path: &str, peer: &Peer) -> OpResult<api::ImportResponse> {
    let (canonical, model) = d.open_model(path, peer)?;
    // The memo's digests when it can give them; a model with an unreadable
    // initializer still imports its other entries (digests computed here).
    let digests = d
        .digests(&canonical, &model)
        .map(|(_, d)| d)
        .unwrap_or_default();
    let host = Host::any_device(d.host.accept().clone());
    let mut resp = api::ImportResponse::default();
    for item in importable(&model, &host, &CheckOptions::default(), &digests) {
        let e = match item.entry {
            Ok(e) => e,
            Err(m) => {
                resp.skipped.push(api::ImportSkip {
                    index: item.index as u32,
                    source_name: item.source_name,
                    reason: Some(convert::miss(m.code(), m.detail())),
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
                client_uid: if peer.is_self_or_root() {
                    None
                } else {
                    peer.uid
                },
            },
            source_names: vec![item.source_name],
            model_paths: vec![canonical.display().to_string()],
            pack_duration: Duration::ZERO,
        };
        let stored = d.store.put(&new, &e.payload[..])?;
        if stored.created {
            resp.imported += 1;
            d.emit(
                "entry_added",
                convert::key_to_string(&stored.entry.key),
                canonical.display().to_string(),
                "import".into(),
                None,
            );
        } else {
            resp.already_present += 1;
        }
    }
    Ok(resp)
}
