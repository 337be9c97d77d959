//! Serving a payload file to a caller (ReadPayload, AcquireLease, Embed,
//! Materialize): the store hashes it the first time it is served after
//! the daemon started and whenever the file is no longer the one hashed
//! (see [`Store::open_payload`](ctcache::store::Store::open_payload)), and
//! paths that copy bytes check each group as they copy it ([`checked`]); a
//! file found rotted is quarantined and its entries dropped. Here the
//! dropped entry is then packed again at once, in the background, from the
//! model it was packed from, so that it comes back without anyone asking.
//!
//! The trust boundary: the model is opened as for a Prepack of the caller
//! being served ([`model::open`]), with the caller's rights, so a repack
//! never reads what that caller could not. Only paths the daemon
//! recorded itself are tried (a pack, or an import by root or the daemon's
//! user): the model path of a client's `Put` is that client's word.

use std::sync::Arc;

use ctcache::hit::{Accept, KnownLayout, MissReason};
use ctcache::store::{Entry, Payload, Rotted, StoreError};
use ctcache_kernels::Params;

use super::model;
use super::pack::{self, BackendRequest};
use super::{Error, Result};
use crate::caller::Caller;
use crate::policy::Wanted;
use crate::scheduler::{JobState, Priority};
use crate::state::Daemon;

/// The payload of `e` for `caller`; when its file is found rotted, the
/// entry is packed again in the background and the answer is DATA_LOSS.
pub(crate) fn open(d: &Arc<Daemon>, caller: &Caller, e: &Entry) -> Result<Payload> {
    match d.store.open_payload(&e.key) {
        Err(err @ StoreError::PayloadCorrupt { .. }) => Err(condemned(d, caller, e, err)),
        other => Ok(other?),
    }
}

/// The answer for `e` once the store condemned its payload (`err`): `e`
/// is packed again when this call dropped it (a concurrent one that did
/// repacks it itself).
fn condemned(d: &Arc<Daemon>, caller: &Caller, e: &Entry, err: StoreError) -> Error {
    if let StoreError::PayloadCorrupt { dropped, .. } = &err {
        if dropped.contains(&e.key) {
            repack(d, caller, e);
        }
    }
    err.into()
}

/// The bytes `range` of `e`'s payload `p`, each group checked (D12);
/// rotted ones are handled as [`open`] handles a file found rotted.
pub(crate) fn checked<'p>(
    d: &Arc<Daemon>,
    caller: &Caller,
    e: &Entry,
    p: &'p Payload,
    range: std::ops::Range<usize>,
) -> Result<&'p [u8]> {
    p.checked(range).map_err(|r| rotted(d, caller, e, p, r))
}

/// The answer to a serve that found `r` in `e`'s payload `p`: the file is
/// quarantined, its entries dropped and `e` packed again (DATA_LOSS).
pub(crate) fn rotted(d: &Arc<Daemon>, caller: &Caller, e: &Entry, p: &Payload, r: Rotted) -> Error {
    tracing::warn!(
        "payload of {} rotted at byte {} of {}: not served",
        e.key,
        r.offset,
        p.path.display()
    );
    condemned(d, caller, e, d.store.payload_rotted(&e.key, p, r))
}

/// Starts packing `e` again from one of its recorded models, off this
/// thread (opening a model and taking its digests can take a while).
fn repack(d: &Arc<Daemon>, caller: &Caller, e: &Entry) {
    let key = e.key;
    if ctcache::forms::is_form_type(&e.type_name) {
        tracing::warn!("form {key} rotted: compiled again when next asked for");
        return;
    }
    if let Some(uid) = e.producer.client_uid {
        tracing::warn!(
            "payload of {key} rotted: not packed again (uid {uid} put it; its model path is not the daemon's to open)"
        );
        return;
    }
    let layout = match layout_of(d, e) {
        Ok(l) => l,
        Err(why) => {
            tracing::warn!("payload of {key} rotted: not packed again ({why})");
            return;
        }
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("payload of {key} rotted: not packed again (no runtime to pack on)");
        return;
    };
    let (d, caller, e) = (d.clone(), caller.clone(), e.clone());
    let rt = runtime.clone();
    runtime.spawn_blocking(move || {
        let mut why = Vec::new();
        for path in &e.model_paths {
            match submit_from(&d, &caller, &e, &layout, path) {
                Ok(jobs) => {
                    for (w, _) in &jobs {
                        tracing::info!(
                            "payload of {key} rotted: packing {} as {} again from {path}",
                            w.initializer,
                            w.format
                        );
                    }
                    // The job runs while someone waits for it.
                    rt.spawn(async move {
                        for (w, h) in jobs {
                            match h.finished().await {
                                JobState::Done(_) => tracing::info!(
                                    "packed {} as {} again after its payload rotted",
                                    w.initializer,
                                    w.format
                                ),
                                other => tracing::warn!(
                                    "packing {} as {} again failed: {other:?}",
                                    w.initializer,
                                    w.format
                                ),
                            }
                        }
                    });
                    return;
                }
                Err(err) => why.push(format!("{path}: {}", err.message)),
            }
        }
        tracing::warn!(
            "payload of {key} rotted: not packed again (no recorded model to pack it from{}{})",
            if why.is_empty() { "" } else { ": " },
            why.join("; ")
        );
    });
}

/// Why a rotted entry's layout is unknown here (it is not packed again).
#[derive(Debug, thiserror::Error)]
enum UnknownLayout {
    #[error("the daemon judges no layouts")]
    NotJudged,
    #[error("the entry records no source shape")]
    NoSourceShape,
    /// The hit rule's registry does not know the type over that shape.
    #[error("{}", .0.detail())]
    Refused(MissReason),
}

/// The layout (packer and parameters) this build knows the entry as.
fn layout_of(d: &Daemon, e: &Entry) -> std::result::Result<Arc<KnownLayout>, UnknownLayout> {
    let Accept::Known(types) = d.host.accept() else {
        return Err(UnknownLayout::NotJudged);
    };
    let shape = (e.source_shape.as_ref()).ok_or(UnknownLayout::NoSourceShape)?;
    types
        .layout(&e.key.physical_type, shape, || {
            e.physical_type().map_err(|err| MissReason::Invalid {
                rule: "store.record",
                message: err.to_string(),
            })
        })
        .map_err(UnknownLayout::Refused)
}

/// Opens `path` (only one in the admin's watched folders: a caller's model
/// is the caller's to open, D14) and submits the job that packs `e` again
/// from the initializer whose digest is `e`'s source.
fn submit_from(
    d: &Arc<Daemon>,
    caller: &Caller,
    e: &Entry,
    layout: &KnownLayout,
    path: &str,
) -> Result<crate::jobs::Jobs> {
    let m = model::open_admin(d, std::path::Path::new(path))?;
    let (tensors, digests) = model::digests(d, caller.bounded_uid(), &m.path, &m.model)?;
    let same_source = |name: &String| digests.get(name) == Some(&e.key.source);
    let t = e
        .source_names
        .iter()
        .find(|n| same_source(n))
        .or_else(|| tensors.iter().map(|t| &t.name).find(|n| same_source(n)))
        .ok_or_else(|| Error::precondition("the model no longer holds this source"))?;
    let params =
        Params::parse(layout.params.split(',')).map_err(|err| Error::internal(err.to_string()))?;
    let wanted = [Wanted {
        initializer: t.clone(),
        format: layout.packer.clone(),
        params,
    }];
    let who = (caller.bounded_uid(), Priority::Background);
    pack::submit_all(d, &m, &wanted, who, BackendRequest::Auto)
}
