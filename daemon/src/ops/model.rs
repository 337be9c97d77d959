//! What every model use case starts with: open the model a caller named
//! (after the access check), choose the wanted (initializer, format) pairs,
//! and take the initializers' digests through the memo.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctcache::access::{self, Identity, Opener, OwnRights};
use ctcache::digest::SourceDigest;
use ctcache::onnx::graph::weight_uses;
use ctcache::onnx::{Model, TensorRef};
use ctcache_kernels::{PackError, Params};

use super::{Error, Result};
use crate::caller::Caller;
use crate::config::PolicyRule;
use crate::error::ErrorKind;
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

/// With whose rights a model found by path is read.
#[derive(Debug, Clone)]
enum Reader {
    /// The daemon's own: models of the admin's watched folders.
    Daemon,
    /// A user's: models of that user's watched folders, and their external
    /// data.
    As(Identity),
}

/// Opens the model a caller named. Over the Unix socket that is the model
/// the caller handed over on the descriptor channel (`handout`; `path`,
/// when set, must be the path it was handed under): the daemon opens no
/// path a caller names (D14), so a request naming only a path is refused
/// with the way out. Over TCP, where nothing can be handed over, only a
/// client with a verified certificate may name a model, and only one in a
/// watched folder of the config file (the admin's, read with the daemon's
/// rights).
pub(crate) fn open(d: &Daemon, path: &str, handout: &str, caller: &Caller) -> Result<OpenedModel> {
    if !handout.is_empty() {
        let (path, model) = d.handouts.model(handout, path, caller)?;
        return Ok(OpenedModel { path, model });
    }
    if path.is_empty() {
        return Err(Error::invalid("model_path is empty"));
    }
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(Error::invalid(format!(
            "model_path {path:?} must be absolute"
        )));
    }
    if caller.identity.is_some() {
        return Err(Error::invalid(format!(
            "{path}: ctcached opens no path a caller names; hand the model over on its \
             descriptor channel (the socket beside this one), as ctcachectl and the client \
             libraries do"
        )));
    }
    // To a TCP peer, a missing model and one outside the admin's folders get
    // the same answer: no probing for files.
    let hidden = || Error::denied(format!("{path}: not found, or not in a watched folder"));
    if !caller.trusted {
        return Err(hidden());
    }
    open_admin(d, p).map_err(|e| match e.kind {
        ErrorKind::NotFound | ErrorKind::PermissionDenied => hidden(),
        _ => e,
    })
}

/// Opens the model at `path` with the daemon's rights, and only when the
/// file opened is in a watched folder of the config (the admin's): a link
/// there to a file elsewhere is not read with them.
pub(crate) fn open_admin(d: &Daemon, path: &Path) -> Result<OpenedModel> {
    let named = |e| Error::from_io(e, &path.display().to_string());
    let file = access::open_regular(path).map_err(named)?;
    let real = access::real_path(&file).map_err(named)?;
    let m = from_file(file, &real, &Reader::Daemon)?;
    if !d.watcher.admin_covers(&m.path) {
        return Err(Error::denied(format!(
            "{} resolves to {}, outside the watched folders (a symbolic link?); watch the folder \
             it is in",
            path.display(),
            m.path.display()
        )));
    }
    Ok(m)
}

/// Opens the model `name` in the held folder `dir` (named `shown`) with
/// `who`'s rights: a user's watched folder is read through the handle that
/// was judged, whatever its path leads to now.
pub(crate) fn open_in(
    dir: &File,
    name: &Path,
    shown: &Path,
    who: &Identity,
) -> Result<OpenedModel> {
    let named = |e| Error::from_io(e, &shown.display().to_string());
    let file = who.open_read_at(dir, name, shown).map_err(named)?;
    let real = access::real_path(&file).map_err(named)?;
    from_file(file, &real, &Reader::As(who.clone()))
}

/// Maps an opened model; its external data is opened with the same rights.
fn from_file(file: File, real: &Path, reader: &Reader) -> Result<OpenedModel> {
    let opener: Arc<dyn Opener> = match reader {
        Reader::Daemon => Arc::new(OwnRights),
        Reader::As(who) => Arc::new(who.clone()),
    };
    let model = Model::from_file(file, real, opener)?;
    Ok(OpenedModel {
        path: real.to_path_buf(),
        model: Arc::new(model),
    })
}

/// The wanted (initializer, format) pairs: explicit formats for every
/// initializer they accept (and, unless `only` names initializers, the
/// policy's size and use filters admit), or the policy; `only` keeps those
/// initializers.
pub(crate) fn wanted(
    d: &Daemon,
    model: &Model,
    formats: &[FormatRequest],
    only: &[String],
) -> Result<Selection> {
    let mut sel = if formats.is_empty() {
        policy::select(model, &d.config.policy)?
    } else {
        let rules = only.is_empty().then_some(d.config.policy.as_slice());
        explicit(model, formats, rules)?
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

/// Every initializer an explicitly named format accepts and, with `rules`,
/// their size and use filters admit.
fn explicit(
    model: &Model,
    formats: &[FormatRequest],
    rules: Option<&[PolicyRule]>,
) -> Result<Selection> {
    let mut sel = Selection::default();
    let uses = match rules {
        Some(_) => Some(weight_uses(model)?),
        None => None,
    };
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
            if let (Some(rules), Some(uses)) = (rules, &uses) {
                if !policy::admitted(rules, &f.id, &t, uses) {
                    continue;
                }
            }
            match packer.check_source(t.data_type, &t.dims, params) {
                Ok(()) => sel.wanted.push(Wanted {
                    initializer: t.name.clone(),
                    format: f.id.clone(),
                    params: params.clone(),
                }),
                // A bad parameter is the caller's mistake, not a refusal.
                // Those two name the packer themselves.
                Err(e @ (PackError::UnknownParam { .. } | PackError::BadParamValue { .. })) => {
                    return Err(Error::invalid(e.to_string()))
                }
                Err(e @ (PackError::MalformedParam(_) | PackError::DuplicateParam(_))) => {
                    return Err(Error::invalid(format!("{}: {e}", f.id)))
                }
                Err(e) => sel.refused.push((t.name.clone(), e.to_string())),
            }
        }
    }
    Ok(sel)
}

/// The refusal of a request whose selection came out empty, worded as
/// `ctcachectl` words it when it packs locally.
pub(crate) fn nothing_to_pack(
    d: &Daemon,
    path: &Path,
    sel: &Selection,
    formats: &[FormatRequest],
) -> Error {
    let format = match formats {
        [one] => Some(one.id.as_str()),
        _ => None,
    };
    let filters = policy::describe_filters(&d.config.policy, format);
    Error::precondition(ctcache::onnx::graph::nothing_to_pack(
        path,
        &sel.why_nothing(&filters),
    ))
}

/// The model's initializers and their blake3 digests, through the memo.
/// A model with an initializer over `max_tensor_bytes`, or more data in all
/// than `max_model_bytes`, is refused before any of its data is read; so is
/// one whose hashing `payer` (an untrusted uid) has no budget left for.
pub(crate) fn digests(
    d: &Daemon,
    payer: Option<u32>,
    path: &Path,
    model: &Model,
) -> Result<(Vec<TensorRef>, HashMap<String, SourceDigest>)> {
    let tensors = model.initializers()?;
    let declared = check_sizes(
        &tensors,
        d.config.max_tensor_bytes,
        d.config.max_model_bytes,
    )?;
    if let Some(known) = d.memo.remembered(path, model, &tensors) {
        return Ok((tensors, known));
    }
    if let Some(uid) = payer {
        d.hash_budget
            .charge(uid, declared)
            .map_err(|e| Error::exhausted(e.to_string()))?;
    }
    // Looked up once above: a miss is hashed here without a second look.
    let digests = d.memo.compute(path, model, &tensors)?;
    Ok((tensors, digests))
}

/// Refuses initializers whose declared data exceeds `max` bytes, and
/// models whose initializers declare more than `max_model` together (a
/// sparse external-data file can declare terabytes it never stored, and
/// many initializers can name the same range). Returns the bytes they
/// declare together.
fn check_sizes(tensors: &[TensorRef], max: u64, max_model: u64) -> Result<u64> {
    let mut total = 0u64;
    for t in tensors {
        // Variable-width (string) data is bounded by the model file itself.
        if t.data_type.bit_width().is_none() {
            continue;
        }
        match t.raw_size() {
            Some(n) if n <= max => total = total.saturating_add(n),
            n => {
                let size = n.map_or("more than 2^64".into(), |n| n.to_string());
                return Err(Error::exhausted(format!(
                    "initializer {:?} declares {size} bytes of data, over max_tensor_bytes ({max}): the daemon does not read it",
                    t.name
                )));
            }
        }
        if total > max_model {
            return Err(Error::exhausted(format!(
                "the initializers declare more than {max_model} bytes of data together, over \
                 max_model_bytes: the daemon does not read them"
            )));
        }
    }
    Ok(total)
}

/// The model's D15 digest (runtime forms) from its initializers' digests
/// as [`digests`] gives them (by name); taken anew where a name repeats or
/// a digest is missing, so that no two initializers pass for one.
pub(crate) fn form_digest(
    model: &Model,
    tensors: &[TensorRef],
    known: &HashMap<String, SourceDigest>,
) -> Result<[u8; 32]> {
    let invalid = |e: ctcache::Error| Error::invalid(e.to_string());
    let names: std::collections::HashSet<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    let by_name: Option<Vec<_>> = tensors
        .iter()
        .map(|t| known.get(&t.name).copied())
        .collect();
    match by_name {
        Some(digests) if names.len() == tensors.len() => {
            ctcache::forms::model_digest_of(model, tensors, digests.into_iter().map(Ok))
                .map_err(invalid)
        }
        _ => ctcache::forms::model_digest(model).map_err(invalid),
    }
}
