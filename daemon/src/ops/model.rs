//! What every model use case starts with: open the model a caller named
//! (after the access check), choose the wanted (initializer, format) pairs,
//! and take the initializers' digests through the memo.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctcache::digest::SourceDigest;
use ctcache::onnx::{Model, TensorRef};
use ctcache_kernels::{PackError, Params};

use super::{Error, Result};
use crate::caller::Caller;
use crate::policy::{self, Selection, Wanted};
use crate::state::Daemon;

/// A format a request names, with its packer parameters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FormatRequest {
    pub id: String,
    pub params: Vec<(String, String)>,
}

/// A model opened for a caller.
#[derive(Clone)]
pub(crate) struct OpenedModel {
    /// The canonical path.
    pub path: PathBuf,
    pub model: Arc<Model>,
}

/// Opens the model at `path` for `caller`: an absolute path the caller may
/// read, or one under a watched folder.
pub(crate) fn open(d: &Daemon, path: &str, caller: &Caller) -> Result<OpenedModel> {
    if path.is_empty() {
        return Err(Error::invalid("model_path is empty"));
    }
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(Error::invalid(format!(
            "model_path {path:?} must be absolute"
        )));
    }
    // To anyone but root and the daemon's user, a missing model and one they
    // may not read get the same answer: no probing for other users' files.
    let hidden = || {
        Error::denied(format!(
            "{path}: not found, or outside the watched folders and not readable by {}",
            caller.describe()
        ))
    };
    let canonical = match p.canonicalize() {
        Ok(c) => c,
        Err(e) if caller.is_self_or_root() => return Err(Error::not_found(format!("{path}: {e}"))),
        Err(_) => return Err(hidden()),
    };
    if !d.watcher.covers(&canonical) && !caller.may_read(&canonical) {
        return Err(hidden());
    }
    let model = Model::open(&canonical)?;
    Ok(OpenedModel {
        path: canonical,
        model: Arc::new(model),
    })
}

/// The wanted (initializer, format) pairs: explicit formats for every
/// initializer they accept, or the policy; `only` keeps those initializers.
pub(crate) fn wanted(
    d: &Daemon,
    model: &Model,
    formats: &[FormatRequest],
    only: &[String],
) -> Result<Selection> {
    let mut sel = if formats.is_empty() {
        policy::select(model, &d.config.policy)?
    } else {
        explicit(model, formats)?
    };
    if !only.is_empty() {
        for name in only {
            if !sel.wanted.iter().any(|w| &w.initializer == name) {
                let why = sel
                    .refused
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, r)| r.clone());
                return Err(Error::invalid(match why {
                    Some(r) => format!("{name}: {r}"),
                    None => format!("{name}: not an initializer the selected formats accept"),
                }));
            }
        }
        sel.wanted.retain(|w| only.contains(&w.initializer));
    }
    Ok(sel)
}

/// Every initializer an explicitly named format accepts.
fn explicit(model: &Model, formats: &[FormatRequest]) -> Result<Selection> {
    let mut sel = Selection::default();
    let mut parsed = Vec::with_capacity(formats.len());
    for f in formats {
        let packer = ctcache_kernels::find(&f.id)
            .ok_or_else(|| Error::invalid(format!("unknown format {:?}", f.id)))?;
        let params = Params::parse(f.params.iter().map(|(k, v)| format!("{k}={v}")))
            .map_err(|e| Error::invalid(e.to_string()))?;
        parsed.push((f, packer, params));
    }
    for t in model.initializers()? {
        for (f, packer, params) in &parsed {
            match packer.check_source(t.data_type, &t.dims, params) {
                Ok(()) => sel.wanted.push(Wanted {
                    initializer: t.name.clone(),
                    format: f.id.clone(),
                    params: params.clone(),
                }),
                // A bad parameter is the caller's mistake, not a refusal.
                Err(
                    e @ (PackError::UnknownParam { .. }
                    | PackError::BadParamValue { .. }
                    | PackError::MalformedParam(_)
                    | PackError::DuplicateParam(_)),
                ) => return Err(Error::invalid(format!("{}: {e}", f.id))),
                Err(e) => sel.refused.push((t.name.clone(), e.to_string())),
            }
        }
    }
    Ok(sel)
}

/// The model's initializers and their blake3 digests, through the memo.
/// A model with an initializer over `max_tensor_bytes` is refused before
/// any of its data is read.
pub(crate) fn digests(
    d: &Daemon,
    path: &Path,
    model: &Model,
) -> Result<(Vec<TensorRef>, HashMap<String, SourceDigest>)> {
    let tensors = model.initializers()?;
    check_sizes(&tensors, d.config.max_tensor_bytes)?;
    let (digests, _) = d.memo.digests(path, model, &tensors)?;
    Ok((tensors, digests))
}

/// Refuses initializers whose declared data exceeds `max` bytes (a sparse
/// external-data file can declare terabytes it never stored).
fn check_sizes(tensors: &[TensorRef], max: u64) -> Result<()> {
    for t in tensors {
        // Variable-width (string) data is bounded by the model file itself.
        if t.data_type.bit_width().is_none() {
            continue;
        }
        match t.raw_size() {
            Some(n) if n <= max => {}
            n => {
                let size = n.map_or("more than 2^64".into(), |n| n.to_string());
                return Err(Error::exhausted(format!(
                    "initializer {:?} declares {size} bytes of data, over max_tensor_bytes ({max}): the daemon does not read it",
                    t.name
                )));
            }
        }
    }
    Ok(())
}
