//! Pack jobs: submit (or join) the job of one wanted (initializer, format)
//! pair on the scheduler, run it (reuse the stored entry, else pack and put),
//! and wait for a set of jobs. The Prepack use case is the caller-facing
//! front of it.

use std::sync::Arc;

use ctcache::digest::SourceDigest;
use ctcache::onnx::{Model, Storage, TensorRef};
use ctcache::store::{Entry, EntryKey, NewEntry, Producer};
use ctcache_kernels::compile::{BackendChoice, Compiled};
use ctcache_kernels::{copies, Packer, Params};

use super::model::{self, FormatRequest, OpenedModel};
use super::progress;
use super::{Error, Result};
use crate::caller::Caller;
use crate::error::ErrorKind;
use crate::events::EventKind;
use crate::jobs::{JobKey, Jobs, Packed};
use crate::policy::Wanted;
use crate::scheduler::{CancelToken, JobHandle, JobState, Lane, Priority};
use crate::state::Daemon;

/// Which backend a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum BackendRequest {
    /// The scheduler's choice: the GPU lane for what a hardware adapter can
    /// pack, else the CPU.
    #[default]
    Auto,
    Cpu,
    Wgpu,
}

/// A Prepack request.
#[derive(Debug, Clone, Default)]
pub(crate) struct PrepackRequest {
    pub model_path: String,
    /// A descriptor channel handout to read the model from instead.
    pub handout: String,
    pub initializers: Vec<String>,
    pub formats: Vec<FormatRequest>,
    pub backend: BackendRequest,
}

/// The Prepack use case: starts (or joins) the jobs of the wanted pairs.
pub(crate) fn prepack(d: &Arc<Daemon>, caller: &Caller, r: &PrepackRequest) -> Result<Jobs> {
    tracing::info!(caller = %caller.describe(), model = %r.model_path, "prepack");
    let m = model::open(d, &r.model_path, &r.handout, caller)?;
    let sel = model::wanted(d, &m.model, &r.formats, &r.initializers)?;
    if sel.wanted.is_empty() {
        return Err(model::nothing_to_pack(d, &m.path, &sel, &r.formats));
    }
    if r.backend == BackendRequest::Wgpu {
        check_wgpu(d, &m.model, &sel.wanted)?;
    }
    submit_all(
        d,
        &m,
        &sel.wanted,
        (caller.bounded_uid(), Priority::Client),
        r.backend,
    )
}

/// A wgpu request needs a hardware adapter's lane and formats it can pack.
fn check_wgpu(d: &Daemon, model: &Model, wanted: &[Wanted]) -> Result<()> {
    if !d.scheduler.has_gpu_lane() {
        let why = if d.config.gpu {
            "this host has no hardware wgpu adapter (software adapters are slower than the CPU packers and are not used)"
        } else {
            "the daemon's config turns the GPU off (gpu = false)"
        };
        return Err(Error::precondition(format!("backend wgpu: {why}")));
    }
    let tensors = model.initializers()?;
    for w in wanted {
        if let Some(t) = tensors.iter().find(|t| t.name == w.initializer) {
            if !gpu_can_pack(w, t) {
                return Err(Error::invalid(format!(
                    "backend wgpu cannot pack {} as {} (wgpu packs FLOAT sources, not transposed ones); use backend cpu or auto",
                    w.initializer, w.format
                )));
            }
        }
    }
    Ok(())
}

fn gpu_can_pack(w: &Wanted, t: &TensorRef) -> bool {
    ctcache_kernels::gpu::supports_source(&w.format, t.data_type)
        && w.params.get("transposed") != Some("true")
}

/// Who a job is for: the owner whose queue bound applies (`None`: the
/// daemon or an admin) and how urgent it is.
pub(crate) type For = (Option<u32>, Priority);

/// Starts (or joins) the jobs of every wanted pair of an opened model. Every
/// payload is checked against the limit before any job is submitted.
pub(crate) fn submit_all(
    d: &Arc<Daemon>,
    m: &OpenedModel,
    wanted: &[Wanted],
    who: For,
    backend: BackendRequest,
) -> Result<Jobs> {
    let (tensors, digests) = model::digests(d, who.0, &m.path, &m.model)?;
    let mut todo = Vec::with_capacity(wanted.len());
    for w in wanted {
        let Some(t) = tensors.iter().find(|t| t.name == w.initializer) else {
            continue;
        };
        let packer = ctcache_kernels::find(&w.format)
            .ok_or_else(|| Error::invalid(format!("unknown format {:?}", w.format)))?;
        check_payload(d, t, w, packer)?;
        todo.push((w, t, packer));
    }
    let mut jobs = Vec::with_capacity(todo.len());
    for (w, t, packer) in todo {
        let digest = digests[&t.name];
        jobs.push((w.clone(), submit(d, m, t, digest, w, packer, who, backend)?));
    }
    Ok(jobs)
}

/// The wanted pairs whose entry is not stored yet (an entry a client put
/// counts as missing when the daemon keeps only its own): what a watched
/// model submits, so that pairs already packed take no place in the
/// owner's share of the queue.
pub(crate) fn missing(
    d: &Arc<Daemon>,
    owner: Option<u32>,
    m: &OpenedModel,
    wanted: &[Wanted],
) -> Result<Vec<Wanted>> {
    let (tensors, digests) = model::digests(d, owner, &m.path, &m.model)?;
    Ok(wanted
        .iter()
        .filter(|w| {
            let (Some(t), Some(packer)) = (
                tensors.iter().find(|t| t.name == w.initializer),
                ctcache_kernels::find(&w.format),
            ) else {
                return true;
            };
            let stored = expected_key(&digests[&t.name], t, packer, &w.params)
                .and_then(|key| d.store.stat(&key).ok().flatten());
            !stored
                .is_some_and(|e| !d.config.daemon_produced_only || e.producer.client_uid.is_none())
        })
        .cloned()
        .collect())
}

/// Refuses a pack whose declared payload exceeds the limit
/// (`max_payload_bytes`, `memory_budget`), before anything is allocated.
fn check_payload(d: &Daemon, t: &TensorRef, w: &Wanted, packer: &dyn Packer) -> Result<()> {
    let layout = packer
        .output(t.data_type, &t.dims, &w.params)
        .map_err(|e| Error::invalid(format!("{} as {}: {e}", t.name, w.format)))?;
    let limit = d.config.payload_limit();
    if layout.payload_len > limit {
        return Err(Error::exhausted(format!(
            "{} as {}: the payload would be {} bytes, over the limit of {limit} (max_payload_bytes, memory_budget)",
            t.name, w.format, layout.payload_len
        )));
    }
    Ok(())
}

/// The resolved inputs of one pack: the model as it was opened for the
/// request (never opened again by path), one of its initializers.
pub(crate) struct PackSpec {
    pub model: OpenedModel,
    pub tensor: TensorRef,
    pub digest: SourceDigest,
    pub packer: &'static dyn Packer,
    pub params: Params,
    /// The untrusted uid the job packs for (the first to ask), whose
    /// storage quota the entry counts against.
    pub requested_by: Option<u32>,
}

fn params_key(p: &Params) -> String {
    p.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// (device, inode) of the file `t`'s bytes are read from: its external-data
/// file, else the model file.
fn source_file(m: &OpenedModel, t: &TensorRef) -> Option<(u64, u64)> {
    let stamp = match &t.storage {
        Storage::External(loc) => m.model.external_stamp(loc).ok(),
        _ => m.model.stamp(),
    };
    stamp.map(|s| (s.dev, s.ino))
}

/// Submits (or joins) the pack job of one wanted pair.
#[allow(clippy::too_many_arguments)]
fn submit(
    d: &Arc<Daemon>,
    m: &OpenedModel,
    t: &TensorRef,
    digest: SourceDigest,
    w: &Wanted,
    packer: &'static dyn Packer,
    (owner, priority): For,
    backend: BackendRequest,
) -> Result<JobHandle<Packed>> {
    let spec = PackSpec {
        model: m.clone(),
        tensor: t.clone(),
        digest,
        packer,
        params: w.params.clone(),
        requested_by: owner,
    };
    let key = JobKey {
        source: digest.bytes,
        format: w.format.clone(),
        params: params_key(&w.params),
        file: source_file(m, t),
    };
    let bytes = t.raw_size().unwrap_or(0).saturating_mul(2);
    let gpu = d.scheduler.has_gpu_lane() && gpu_can_pack(w, t);
    let (lane, choice) = match backend {
        BackendRequest::Cpu => (Lane::Cpu, BackendChoice::Cpu),
        BackendRequest::Wgpu => (Lane::Gpu, BackendChoice::Wgpu),
        // The GPU lane packs on the adapter, falling back to the CPU kernels
        // when the GPU fails.
        BackendRequest::Auto if gpu => (Lane::Gpu, BackendChoice::Auto),
        BackendRequest::Auto => (Lane::Cpu, BackendChoice::Cpu),
    };
    let me = d.clone();
    // The job's CPU time is its owner's (see `cpu_budget`): a job that
    // starts after its owner's hour ran out is refused, not run.
    let payer = owner.map(|uid| d.cpu_budget.payer(uid));
    d.scheduler
        .submit(owner, key, lane, priority, bytes, move |cancel| {
            let work = || run(&me, spec, choice, cancel);
            match payer {
                Some(p) => p.admitted()?.run(work),
                None => work(),
            }
        })
        .map_err(|full| Error::new(ErrorKind::QueueFull, full.to_string()))
}

/// The key of the entry `packer` produces from `t` (digest `digest`) with
/// `params`: what a request for that format and those parameters must hit.
pub(crate) fn expected_key(
    digest: &SourceDigest,
    t: &TensorRef,
    packer: &dyn Packer,
    params: &Params,
) -> Option<EntryKey> {
    let shape = ctcache::hit::SourceShape {
        data_type: t.data_type,
        dims: t.dims.clone(),
    };
    let (key, _) = ctcache_kernels::registry::entry_key(packer, params, *digest, &shape).ok()?;
    Some(key)
}

/// The stored entry `packer` would produce for `t` with `params`, if it
/// may be reused: its payload file hashes to its name (hashed once per
/// daemon run; a damaged one is quarantined and its entries dropped, so the
/// job packs it again) and, when the daemon takes only its own entries, it
/// was not put by a client (such an entry is removed to make room for the
/// daemon's own).
fn existing(
    d: &Daemon,
    digest: &SourceDigest,
    t: &TensorRef,
    packer: &dyn Packer,
    params: &Params,
) -> Option<Entry> {
    let key = expected_key(digest, t, packer, params)?;
    let entry = d.store.stat(&key).ok().flatten()?;
    if d.config.daemon_produced_only && entry.producer.client_uid.is_some() {
        if let Err(e) = d.store.remove(&key) {
            tracing::warn!("cannot replace the client's entry {key}: {e}");
        }
        return None;
    }
    match d.store.check_payload(&key) {
        Ok(_) => Some(entry),
        Err(e) => {
            tracing::warn!("not reusing {key}, packing it again: {e}");
            None
        }
    }
}

/// Packs `spec` on `choice`, refusing the result when the bytes packed are
/// not the ones `spec.digest` was taken of (the model was written since; a
/// watched model is picked up again). The pack's share of the kernels'
/// memory budget comes with it, to be dropped once the payload is stored.
fn compile(spec: &PackSpec, choice: BackendChoice) -> Result<(Compiled, copies::Share)> {
    ctcache_kernels::compile::compile_held(
        &spec.model.model,
        &spec.tensor,
        Some(spec.digest),
        spec.packer,
        &spec.params,
        choice,
    )
    .map_err(Error::from)
}

/// The entry of what the daemon packed: `c`, for `requested_by`, from
/// the model files `model_paths`.
pub(crate) fn new_entry(
    c: &Compiled,
    requested_by: Option<u32>,
    model_paths: Vec<String>,
) -> NewEntry {
    NewEntry {
        source: c.digest,
        source_shape: c.source_shape.clone(),
        device: c.device.clone(),
        physical_type: c.layout.struct_type.clone(),
        dims: c.layout.dims.clone(),
        producer: Producer {
            packer_id: c.packer_id.to_string(),
            packer_version: c.packer_version.to_string(),
            client_uid: None,
            requested_by,
        },
        source_names: vec![c.source_name.clone()],
        model_paths,
        pack_duration: c.duration,
    }
}

/// A pack job: reuse a stored entry, else pack and put.
fn run(d: &Daemon, spec: PackSpec, choice: BackendChoice, cancel: &CancelToken) -> Result<Packed> {
    let t = &spec.tensor;
    let model_path = spec.model.path.display().to_string();
    if let Some(entry) = existing(d, &spec.digest, t, spec.packer, &spec.params) {
        return Ok(Packed {
            entry,
            cached: true,
            backend: None,
        });
    }
    if cancel.cancelled() {
        return Err(Error::cancelled("every waiter went away"));
    }
    let remote = match expected_key(&spec.digest, t, spec.packer, &spec.params) {
        Some(key) => fetch_remote(d, &spec, &key, crate::fleet::Ask::CostRule, choice)?,
        None => None,
    };
    if let Some(entry) = remote {
        return Ok(Packed {
            entry,
            cached: true,
            backend: None,
        });
    }
    // The payload counts toward the pack budget until it is stored, so
    // workers waiting on the store do not hold payloads beyond it.
    let (c, _share) = compile(&spec, choice)?;
    if cancel.cancelled() {
        return Err(Error::cancelled("every waiter went away"));
    }
    let mut new = new_entry(&c, spec.requested_by, vec![model_path.clone()]);
    new.source = spec.digest;
    // A full disk stays RESOURCE_EXHAUSTED up to the caller.
    let stored = d.store.put(&new, &c.payload[..]).map_err(Error::from)?;
    if d.config.daemon_produced_only && stored.entry.producer.client_uid.is_some() {
        // The client's entry of this key is leased, so it stayed.
        return Err(Error::precondition(format!(
            "a client's entry {} holds this key under a lease; only the daemon's own are served",
            stored.entry.key
        )));
    }
    let (format, backend) = (spec.packer.id(), c.backend.name());
    metrics::counter!("ctcache_pack_jobs_total", "format" => format, "backend" => backend)
        .increment(1);
    metrics::histogram!("ctcache_pack_seconds", "format" => format, "backend" => backend)
        .record(c.duration.as_secs_f64());
    d.events.emit(
        EventKind::EntryAdded,
        Some(stored.entry.key),
        model_path,
        format!("{} {}", t.name, stored.entry.type_name),
    );
    if let (Some(fleet), true) = (&d.fleet, stored.created) {
        let params = spec.params.iter();
        let params = params.map(|(k, v)| (k.to_string(), v.to_string()));
        fleet.packed(&d.store, &stored.entry, (format, backend), params.collect());
    }
    Ok(Packed {
        entry: stored.entry,
        cached: !stored.created,
        backend: Some(c.backend),
    })
}

/// Read-through on a local miss of `key` (what `spec` packs to): the entry
/// from the fleet tier, stored here, when the remote has it (and, under
/// `ask`, the cost rule says fetching pays for a pack on `choice`). Fails
/// only when the local store has no room for it.
pub(crate) fn fetch_remote(
    d: &Daemon,
    spec: &PackSpec,
    key: &EntryKey,
    ask: crate::fleet::Ask,
    choice: BackendChoice,
) -> Result<Option<Entry>> {
    let Some(fleet) = d.fleet.as_ref() else {
        return Ok(None);
    };
    let model_path = spec.model.path.display().to_string();
    // The CPU packers are the reference an audit compares with.
    let repack = || compile(spec, BackendChoice::Cpu).map(|(c, _share)| c.payload);
    let entry = fleet.fetch(
        &d.store,
        key,
        ask,
        crate::fleet::Source {
            shape: ctcache::hit::SourceShape {
                data_type: spec.tensor.data_type,
                dims: spec.tensor.dims.clone(),
            },
            names: vec![spec.tensor.name.clone()],
            model_paths: vec![model_path.clone()],
        },
        crate::fleet::Packing {
            format: spec.packer.id(),
            // Auto reaches a job only on the GPU lane.
            backend: match choice {
                BackendChoice::Cpu => "cpu",
                BackendChoice::Wgpu | BackendChoice::Auto => "wgpu",
            },
            repack: &repack,
        },
    )?;
    let Some(entry) = entry else {
        return Ok(None);
    };
    d.events.emit(
        EventKind::EntryAdded,
        Some(entry.key),
        model_path,
        format!("{} {} (from the remote)", spec.tensor.name, entry.type_name),
    );
    Ok(Some(entry))
}

/// Waits for jobs: their entries in order, and how many were packed now
/// (not found in the store). The first failure fails the whole set.
pub(crate) async fn finish(
    d: &Daemon,
    model_path: &str,
    jobs: Jobs,
) -> Result<(Vec<(Wanted, Entry)>, u32)> {
    let mut packed = 0u32;
    let mut entries = Vec::with_capacity(jobs.len());
    let total = jobs.len() as u32;
    for (done, (w, h)) in (1..).zip(jobs) {
        let id = h.id;
        let state = h.finished().await;
        progress::publish_finished(d, model_path, (id, &w), &state, done, total);
        match state {
            JobState::Done(p) => {
                packed += u32::from(!p.cached);
                entries.push((w, p.entry));
            }
            JobState::Failed(e) => {
                return Err(Error::new(
                    e.kind,
                    format!("{} {}: {e}", w.initializer, w.format),
                ))
            }
            other => {
                return Err(Error::cancelled(format!(
                    "{} {}: {other:?}",
                    w.initializer, w.format
                )))
            }
        }
    }
    Ok((entries, packed))
}
