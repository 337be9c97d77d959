//! A form served to its caller, every payload checked as it is served and
//! leased (or held) for the caller: onnxruntime's with its model, each
//! moved initializer named by its payload file (relative to the store's
//! payload folder, as an in-memory materialize names them); OpenVINO's as
//! its payload alone, which the caller maps and imports.

use std::sync::Arc;

use bytes::Bytes;
use ctcache::forms::{self, MovedTensor};
use ctcache::store::{Entry, EntryKey};

use super::super::payload_access::{self, Granted, Leased, Leasing};
use super::super::{serve, Error, Result};
use crate::caller::Caller;
use crate::error::ErrorKind;
use crate::state::Daemon;

/// A form as its caller gets it.
#[derive(Debug, Clone)]
pub(crate) struct ServedForm {
    /// The form's own entry, leased.
    pub form: Granted,
    /// onnxruntime: its model, the moved initializers external data in
    /// the payload folder (OpenVINO: empty, the payload is the form).
    pub model: Vec<u8>,
    /// Each moved initializer, with the entry that holds it.
    pub tensors: Vec<(MovedTensor, EntryKey)>,
    /// Every entry the model reads, the form's own first, leased.
    pub leased: Leased,
}

/// Serves the form `e`: DATA_LOSS when one of its payloads rotted or is no
/// longer stored (the caller compiles it again).
pub(super) fn serve_form(
    d: &Arc<Daemon>,
    caller: &Caller,
    e: &Entry,
    leasing: &Leasing,
) -> Result<ServedForm> {
    // Opened, its file checked as every served payload is (hashed once
    // per file stamp).
    let own = serve::open(d, caller, e)?;
    let mut entries = vec![e.clone()];
    let mut keys = Vec::new();
    // OpenVINO's: the caller maps the payload itself, as a session maps
    // onnxruntime's form's weights.
    if Some(e.type_name.as_str()) != forms::form_type_name("onnxruntime") {
        return lease(d, caller, Vec::new(), Vec::new(), entries, leasing);
    }
    // The model the answer carries: its bytes hashed as they are read.
    let skeleton = Bytes::copy_from_slice(serve::checked(d, caller, e, &own, 0..own.len())?);
    let (model, moved) = forms::served::<Error>(skeleton, |text| {
        let key: EntryKey = text
            .parse()
            .map_err(|err: ctcache::store::InvalidKey| Error::internal(err.to_string()))?;
        keys.push(key);
        // A weight gone (gc) is as a rotted one: the form is incomplete.
        let weight = d.store.stat(&key)?.ok_or_else(|| {
            Error::new(
                ErrorKind::DataLoss,
                format!("a weight of the form ({key}) is no longer stored"),
            )
        })?;
        let payload = serve::open(d, caller, &weight)?;
        if !entries.iter().any(|x| x.key == key) {
            entries.push(weight);
        }
        Ok(d.store
            .blob_in_folder(&payload.info.blake3)
            .display()
            .to_string())
    })?;
    // `locate` ran once per moved initializer, in order.
    let tensors = moved.into_iter().zip(keys).collect();
    lease(d, caller, model, tensors, entries, leasing)
}

/// The most bytes a form's model may have: an answer carries it, with
/// room for the rest.
pub(super) fn max_model(d: &Daemon) -> usize {
    d.config.max_message_bytes.saturating_sub(1 << 20)
}

/// Leases (or holds) `entries`, the form's own first, for the caller of
/// the form's `model`.
fn lease(
    d: &Arc<Daemon>,
    caller: &Caller,
    model: Vec<u8>,
    tensors: Vec<(MovedTensor, EntryKey)>,
    entries: Vec<Entry>,
    leasing: &Leasing,
) -> Result<ServedForm> {
    // An answer carries the model: refused before anything is leased.
    let limit = max_model(d);
    if model.len() > limit {
        return Err(Error::exhausted(format!(
            "the form's model is {} bytes, more than an answer may carry (max_message_bytes \
             less 1 MiB: {limit})",
            model.len()
        )));
    }
    let leased =
        payload_access::lease_answer(d, caller, &entries.iter().collect::<Vec<_>>(), leasing)?;
    Ok(ServedForm {
        form: leased.leases[0].clone(),
        model,
        tensors,
        leased,
    })
}
