//! The ResolveModel use case: per initializer of a model, its digest, the
//! stored entries the caller can use, and a miss for every wanted format
//! without an exact hit; optionally packing what is missing (in the
//! background, or waiting for it).

use std::path::PathBuf;
use std::sync::Arc;

use ctcache::digest::SourceDigest;
use ctcache::dtype::DataType;
use ctcache::hit::{self, MissReason};
use ctcache::onnx::graph::NotASource;
use ctcache::onnx::TensorRef;
use ctcache::store::{Entry, Filter, HostFilter};

use super::lookup::Target;
use super::model::{self, FormatRequest};
use super::pack::{self, BackendRequest};
use super::{Miss, Result};
use crate::caller::Caller;
use crate::jobs::Jobs;
use crate::policy::Wanted;
use crate::scheduler::{JobState, Priority};
use crate::state::Daemon;

/// What to do about wanted formats without an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OnMiss {
    #[default]
    Nothing,
    /// Start packing; answer now.
    Background,
    /// Pack, and answer once done.
    Wait,
}

/// A ResolveModel request.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResolveRequest {
    pub model_path: String,
    /// A descriptor channel handout to read the model from instead.
    pub handout: String,
    pub on_miss: OnMiss,
    /// Empty: the daemon's policy.
    pub formats: Vec<FormatRequest>,
    pub target: Target,
}

/// A wanted format without a usable entry.
#[derive(Debug, Clone)]
pub(crate) struct FormatMiss {
    pub format: String,
    pub miss: Miss,
}

/// One initializer's resolution.
#[derive(Debug, Clone)]
pub(crate) struct TensorResolution {
    pub name: String,
    pub data_type: DataType,
    pub dims: Vec<u64>,
    pub digest: SourceDigest,
    /// Every stored entry of the initializer the caller can use.
    pub entries: Vec<Entry>,
    pub wanted_formats: Vec<String>,
    pub misses: Vec<FormatMiss>,
    /// "format: reason" of policy rules that matched but whose packer
    /// refuses the initializer.
    pub refused: Vec<String>,
}

/// A model's resolution.
#[derive(Debug, Clone)]
pub(crate) struct Resolution {
    pub model_path: PathBuf,
    pub tensors: Vec<TensorResolution>,
    pub not_sources: Vec<NotASource>,
    pub jobs_started: u64,
    /// The runtime forms stored of the model's content (D15).
    pub forms: Vec<Entry>,
}

/// The ResolveModel use case.
pub(crate) async fn resolve(
    d: &Arc<Daemon>,
    caller: &Caller,
    r: ResolveRequest,
) -> Result<Resolution> {
    let (d2, caller) = (d.clone(), caller.clone());
    let on_miss = r.on_miss;
    let (mut res, jobs) = super::blocking(move || resolve_now(&d2, &caller, &r)).await?;
    if on_miss == OnMiss::Wait {
        for (w, h) in jobs {
            let state = h.finished().await;
            let Some(t) = res.tensors.iter_mut().find(|t| t.name == w.initializer) else {
                continue;
            };
            match state {
                JobState::Done(p) => {
                    t.entries.push(p.entry);
                    t.misses.retain(|m| m.format != w.format);
                }
                JobState::Failed(e) => {
                    if let Some(m) = t.misses.iter_mut().find(|m| m.format == w.format) {
                        m.miss.detail = format!("{} could not be packed: {e}", w.format);
                    }
                }
                _ => {}
            }
        }
    }
    Ok(res)
}

/// Resolves from the store and starts the jobs `on_miss` asks for.
fn resolve_now(d: &Arc<Daemon>, caller: &Caller, r: &ResolveRequest) -> Result<(Resolution, Jobs)> {
    let m = model::open(d, &r.model_path, &r.handout, caller)?;
    let sel = model::wanted(d, &m.model, &r.formats, &[])?;
    let (tensors, digests) = model::digests(d, caller.bounded_uid(), &m.path, &m.model)?;
    let filter = r.target.filter(d);
    let mut res = Resolution {
        model_path: m.path.clone(),
        tensors: Vec::with_capacity(tensors.len()),
        not_sources: sel.not_sources.clone(),
        jobs_started: 0,
        forms: forms_of(d, &m.model, &tensors, &digests),
    };
    let mut missing = Vec::new();
    for t in &tensors {
        let digest = digests[&t.name];
        // Counted below per wanted format: tensors nothing wants are not
        // lookups a runtime would make.
        let hits: Vec<Entry> = d
            .store
            .lookup_uncounted(&digest, &filter)?
            .iter()
            .map(|h| h.entry.to_entry())
            .collect();
        // Entries a resolve returns are the caller's use of them.
        for e in &hits {
            d.store.note_use(&e.key);
        }
        let wanted: Vec<_> = sel
            .wanted
            .iter()
            .filter(|w| w.initializer == t.name)
            .collect();
        let mut tr = TensorResolution {
            name: t.name.clone(),
            data_type: t.data_type,
            dims: t.dims.clone(),
            digest,
            entries: hits,
            wanted_formats: wanted.iter().map(|w| w.format.clone()).collect(),
            misses: Vec::new(),
            refused: sel
                .refused
                .iter()
                .filter(|(n, _)| n == &t.name)
                .map(|(_, why)| why.clone())
                .collect(),
        };
        for w in wanted {
            // A hit is the exact key this build's packer produces for the
            // wanted format and parameters (never a name or a prefix).
            let expected = ctcache_kernels::find(&w.format)
                .and_then(|p| pack::expected_key(&digest, t, p, &w.params));
            let hit = expected.is_some_and(|k| {
                tr.entries
                    .iter()
                    .any(|e| e.key.physical_type == k.physical_type)
            });
            d.store.count_lookups(u64::from(hit), u64::from(!hit));
            if !hit {
                tr.misses.push(FormatMiss {
                    format: w.format.clone(),
                    miss: explain_miss(d, &filter, t, &digest, w)?,
                });
                missing.push(w.clone());
            }
        }
        res.tensors.push(tr);
    }
    let priority = match r.on_miss {
        OnMiss::Nothing => return Ok((res, Vec::new())),
        OnMiss::Background => Priority::Background,
        OnMiss::Wait => Priority::Client,
    };
    let jobs = pack::submit_all(
        d,
        &m,
        &missing,
        (caller.bounded_uid(), priority),
        BackendRequest::Auto,
    )?;
    res.jobs_started = jobs.len() as u64;
    Ok((res, jobs))
}

/// The runtime forms stored of a model's content (none when the model has
/// no digest of its own: a Constant held as external data, say).
fn forms_of(
    d: &Daemon,
    m: &ctcache::onnx::Model,
    tensors: &[TensorRef],
    digests: &std::collections::HashMap<String, SourceDigest>,
) -> Vec<Entry> {
    let Ok(digest) = model::form_digest(m, tensors, digests) else {
        return Vec::new();
    };
    let source = SourceDigest {
        algorithm: ctcache::digest::Algorithm::Blake3,
        bytes: digest,
    };
    let of_model = Filter {
        source: Some(source),
        ..Default::default()
    };
    d.store
        .list(&of_model)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| ctcache::forms::is_form_type(&e.type_name))
        .collect()
}

/// Why a wanted format has no hit: the judgement of a stored entry that
/// claims the type name this build's packer writes for it (a known name
/// over another layout, a client's entry the daemon does not serve, ...),
/// else `no_entry`. An entry of another name (another format, or other
/// parameters such as 8 bits for a 4-bit request) says nothing about this
/// one.
fn explain_miss(
    d: &Daemon,
    filter: &HostFilter,
    t: &TensorRef,
    digest: &SourceDigest,
    w: &Wanted,
) -> Result<Miss> {
    let not_yet = || Miss::new(MissReason::NoEntry, format!("{} not packed yet", w.format));
    let name = ctcache_kernels::find(&w.format)
        .and_then(|p| p.output(t.data_type, &t.dims, &w.params).ok())
        .map(|l| l.struct_type.name);
    let Some(name) = name else {
        return Ok(not_yet());
    };
    let same_name = d.store.list(&Filter {
        source: Some(*digest),
        format: Some(name.clone()),
        ..Default::default()
    })?;
    Ok(match same_name.first() {
        None => not_yet(),
        Some(e) => match hit::judge(e, filter) {
            Err(reason) => reason.into(),
            // Usable, yet not the key wanted: the same name over the layout
            // of other parameters.
            Ok(_) => MissReason::UnknownPhysicalType {
                name,
                detail: "another layout than the one requested (other parameters)".into(),
            }
            .into(),
        },
    })
}
