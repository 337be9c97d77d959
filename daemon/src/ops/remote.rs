//! The fleet tier's explicit transfers: `remote pull` (fetch every wanted
//! entry of a model the store lacks, packs and runtime forms, packing and
//! compiling nothing) and `remote push`
//! (upload local entries the remote lacks).

use std::sync::Arc;

use super::compile::rules::{self, Pulled};
use super::{model, pack, Error, Result};
use crate::caller::Caller;
use ctcache::forms::is_form_type;
use ctcache_kernels::compile::BackendChoice;

use crate::fleet::{Ask, Fleet, Pushed};
use crate::flights::Gone;
use crate::state::Daemon;

/// What a pull or push did, entry by entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Transfer {
    /// Fetched (pull) or uploaded (push) now.
    pub done: u32,
    /// Already on the receiving side.
    pub present: u32,
    /// Not on the sending side, or refused (pull: no manifest, rejected,
    /// failed; push: too large).
    pub missing: u32,
    /// Push: uploads that failed.
    pub failed: u32,
    pub bytes: u64,
    /// The first failure (push) or the first form not taken (pull), for
    /// people.
    pub first_error: String,
}

fn fleet(d: &Daemon) -> Result<&Fleet> {
    d.fleet
        .as_ref()
        .ok_or_else(|| Error::precondition("no [remote] in the daemon's config"))
}

/// The RemotePull use case, from a blocking thread: it stops before the
/// next entry (and a form's fetch it waits for) once `gone` is set (its
/// caller went).
pub(crate) fn pull(
    d: &Arc<Daemon>,
    caller: &Caller,
    (model_path, handout): (&str, &str),
    gone: &Gone,
) -> Result<Transfer> {
    fleet(d)?;
    tracing::info!(caller = %caller.describe(), model = %model_path, "remote pull");
    let m = model::open(d, model_path, handout, caller)?;
    let sel = model::wanted(d, &m.model, &[], &[])?;
    let (tensors, digests) = model::digests(d, caller.bounded_uid(), &m.path, &m.model)?;
    let mut t = Transfer::default();
    let went = || match gone.is_set() {
        true => Err(rules::pull_abandoned()),
        false => Ok(()),
    };
    for w in &sel.wanted {
        went()?;
        let (Some(tensor), Some(packer)) = (
            tensors.iter().find(|t| t.name == w.initializer),
            ctcache_kernels::find(&w.format),
        ) else {
            continue;
        };
        let Some(key) = pack::expected_key(&digests[&tensor.name], tensor, packer, &w.params)
        else {
            t.missing += 1;
            continue;
        };
        if d.store.stat(&key)?.is_some() {
            t.present += 1;
            continue;
        }
        let spec = pack::PackSpec {
            model: m.clone(),
            tensor: tensor.clone(),
            digest: digests[&tensor.name],
            packer,
            params: w.params.clone(),
            requested_by: caller.bounded_uid(),
        };
        match pack::fetch_remote(d, &spec, &key, Ask::Always, BackendChoice::Cpu)? {
            Some(e) => {
                t.done += 1;
                t.bytes += e.payload.len;
            }
            None => t.missing += 1,
        }
    }
    for rule in d.config.policy.iter().filter(|r| is_form_type(&r.format)) {
        went()?;
        let asked = (rule.format.as_str(), &rule.params);
        match rules::pulled(d, caller.bounded_uid(), &m, asked, gone)? {
            Pulled::Present => t.present += 1,
            Pulled::Fetched(bytes) => {
                t.done += 1;
                t.bytes += bytes;
            }
            Pulled::Missing(why) => {
                t.missing += 1;
                if t.first_error.is_empty() {
                    t.first_error = format!("{} form: {why}", rule.format);
                }
            }
        }
    }
    Ok(t)
}

/// The RemotePush use case: every local entry, or those packed from
/// `model_path` (as the entries record it). Trusted callers only: it
/// writes to the fleet's bucket.
pub(crate) fn push(d: &Daemon, caller: &Caller, model_path: &str) -> Result<Transfer> {
    caller.require_trusted("remote push")?;
    let f = fleet(d)?;
    // Entries record the real path of the model; the client resolves the
    // name it was given (the daemon opens no path a caller names).
    let mut entries = d.store.list(&Default::default())?;
    // A runtime form after every weight it names: a reader takes a form
    // only once its weights are there.
    entries.sort_by_key(|e| is_form_type(&e.type_name));
    let mut t = Transfer::default();
    for e in entries
        .iter()
        .filter(|e| model_path.is_empty() || e.model_paths.iter().any(|p| p == model_path))
    {
        match f.push(&d.store, e) {
            Ok(Pushed::Uploaded(b)) => {
                t.done += 1;
                t.bytes += b;
            }
            Ok(Pushed::Present) => t.present += 1,
            Ok(Pushed::TooLarge) => t.missing += 1,
            Err(msg) => {
                t.failed += 1;
                if t.first_error.is_empty() {
                    t.first_error = format!("{}: {msg}", e.key);
                }
            }
        }
    }
    Ok(t)
}
