//! The use cases' answers -> API messages (core types through
//! `ctcache_convert`).

use std::sync::Arc;

use bytes::Bytes;
use ctcache::store::{Entry, SharedEntry};
use ctcache_api::served;
use ctcache_api::v1 as api;
use ctcache_convert as convert;
use ctcache_kernels::Backend;

use crate::events::Event;
use crate::jobs::{JobPhase, JobProgress};
use crate::ops::compile::Compiled;
use crate::ops::embed::Embedded;
use crate::ops::import::ImportReport;
use crate::ops::lookup::LookupOutcome;
use crate::ops::materialize::{InMemoryAnswer, Materialized};
use crate::ops::payload_access::Granted;
use crate::ops::resolve::Resolution;
use crate::ops::status::StatusReport;
use crate::ops::Miss;
use crate::state::Daemon;

use super::wire_cache::WireCache;

pub(crate) fn entry(d: &Daemon, e: Entry) -> api::Entry {
    let path = d.store.blob_path(&e.payload.blake3);
    convert::entry(e, path, false)
}

pub(crate) fn miss(m: &Miss) -> api::Miss {
    convert::miss(m.code(), m.detail.clone())
}

/// An entry as Lookup answers it, full or brief: encoded once per decoded
/// entry, then copied (see [`WireCache`]).
fn lookup_entry(d: &Daemon, wire: &WireCache, e: &Arc<SharedEntry>, brief: bool) -> Bytes {
    wire.get_or_encode(e, brief, |e| {
        let e = e.to_entry();
        let m = if brief {
            let path = d.store.blob_path(&e.payload.blake3);
            convert::entry_brief(e, path, false)
        } else {
            entry(d, e)
        };
        served::encode_entry(&m)
    })
}

pub(crate) fn lookup(
    d: &Daemon,
    wire: &WireCache,
    o: LookupOutcome,
    brief: bool,
) -> served::LookupResponse {
    match o {
        LookupOutcome::Hits(hits) => served::LookupResponse {
            entries: hits
                .iter()
                .map(|e| lookup_entry(d, wire, e, brief))
                .collect(),
            miss: None,
        },
        LookupOutcome::Miss(m) => served::LookupResponse {
            entries: vec![],
            miss: Some(miss(&m)),
        },
    }
}

pub(crate) fn resolution(d: &Daemon, r: Resolution) -> api::ResolveModelResponse {
    api::ResolveModelResponse {
        model_path: r.model_path.display().to_string(),
        tensors: r
            .tensors
            .into_iter()
            .map(|t| api::TensorResolution {
                name: t.name,
                data_type: t.data_type.code(),
                dims: t.dims,
                source_digest: bytes::Bytes::copy_from_slice(&t.digest.bytes),
                digest_algorithm: t.digest.algorithm.name().into(),
                entries: t.entries.into_iter().map(|e| entry(d, e)).collect(),
                misses: t.misses.iter().map(|m| miss(&m.miss)).collect(),
                wanted_formats: t.wanted_formats,
                refused: t.refused,
            })
            .collect(),
        not_sources: r
            .not_sources
            .into_iter()
            .map(|n| api::NotASource {
                name: n.name,
                reason: n.reason,
            })
            .collect(),
        jobs_started: r.jobs_started,
        forms: r.forms.into_iter().map(|e| entry(d, e)).collect(),
    }
}

pub(crate) fn backend(b: Option<Backend>) -> api::Backend {
    match b {
        None => api::Backend::Auto,
        Some(Backend::Cpu) => api::Backend::Cpu,
        Some(Backend::Wgpu) => api::Backend::Wgpu,
    }
}

pub(crate) fn progress(d: &Daemon, p: &JobProgress) -> api::PrepackProgress {
    let state = match p.phase {
        JobPhase::Queued => api::JobState::Queued,
        JobPhase::Running => api::JobState::Running,
        JobPhase::Done => api::JobState::Done,
        JobPhase::Cached => api::JobState::Cached,
        JobPhase::Failed => api::JobState::Failed,
        JobPhase::Cancelled => api::JobState::Cancelled,
    };
    api::PrepackProgress {
        job_id: p.job_id.to_string(),
        initializer: p.initializer.clone(),
        format: p.format.clone(),
        done: p.done,
        total: p.total,
        entry: p.entry.clone().map(|e| entry(d, e)),
        error: p.error.clone(),
        code: p
            .failure
            .map(|k| super::error_codes::code_name(k).to_string())
            .unwrap_or_default(),
        pack_duration_us: p.pack_duration.as_micros() as u64,
        state: state.into(),
        backend: backend(p.backend).into(),
    }
}

pub(crate) fn embedded(e: Embedded) -> api::EmbedResponse {
    api::EmbedResponse {
        output_path: e.output_path.display().to_string(),
        entries: e.entries,
        packed: e.packed,
        sidecar_path: e
            .report
            .sidecar
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        inline_bytes: e.report.inline_bytes,
        sidecar_bytes: e.report.sidecar_bytes,
        sidecar_first: e.report.sidecar_first,
    }
}

pub(crate) fn materialized(d: &Daemon, m: Materialized) -> api::MaterializeResponse {
    let r = api::MaterializeResponse {
        packed: m.packed,
        cached: m.cached,
        ..convert::materialize::materialize_response(
            std::path::Path::new(""),
            &m.plan,
            &m.report,
            &m.recipe,
        )
    };
    in_memory(d, m.answer, r)
}

/// `r` with the in-memory model, its tensors, their files and leases.
fn in_memory(
    d: &Daemon,
    a: InMemoryAnswer,
    r: api::MaterializeResponse,
) -> api::MaterializeResponse {
    let key_of = |file: &str| {
        a.entries
            .get(file)
            .map(|e| convert::key_to_string(&e.key))
            .unwrap_or_default()
    };
    let mut payload_files: Vec<api::MaterializedPayloadFile> = a
        .entries
        .keys()
        .map(|name| api::MaterializedPayloadFile {
            name: name.clone(),
            key: key_of(name),
        })
        .collect();
    payload_files.sort_by(|x, y| x.name.cmp(&y.name));
    api::MaterializeResponse {
        tensors: a
            .built
            .tensors
            .iter()
            .map(|t| api::MaterializedTensor {
                name: t.name.clone(),
                key: key_of(&t.file_name),
                offset: t.offset,
                length: t.length,
                data_type: t.data_type,
                dims: t.dims.clone(),
            })
            .collect(),
        payload_files,
        leases: a.leased.leases.into_iter().map(|g| lease(d, g)).collect(),
        held: a.leased.held,
        external_data_dir: a.leased.external_data_dir.display().to_string(),
        model: a.built.model.into(),
        ..r
    }
}

/// A granted lease as AcquireLease answers it.
pub(crate) fn lease(d: &Daemon, g: Granted) -> api::LeaseResponse {
    api::LeaseResponse {
        lease_id: g.id.0,
        expires_unix_ms: g.expires_unix_ms,
        entry: g.entry.map(|e| entry(d, e)),
    }
}

pub(crate) fn imported(r: ImportReport) -> api::ImportResponse {
    api::ImportResponse {
        imported: r.imported,
        already_present: r.already_present,
        skipped: r
            .skipped
            .iter()
            .map(|s| api::ImportSkip {
                index: s.index,
                source_name: s.source_name.clone(),
                reason: Some(miss(&s.miss)),
            })
            .collect(),
    }
}

pub(crate) fn status(s: StatusReport) -> api::StatusResponse {
    api::StatusResponse {
        version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: s.uptime.as_secs(),
        entries: s.stats.entries,
        bytes: s.stats.stored_bytes,
        hits: s.stats.hits,
        misses: s.stats.misses,
        jobs_running: s.jobs_running,
        jobs_queued: s.jobs_queued,
        watches: s.watches.iter().map(|p| p.display().to_string()).collect(),
        cache_dir: s.cache_dir.display().to_string(),
        socket: s
            .socket
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        pid: std::process::id(),
        gc_max_bytes: s.gc_budget.max_bytes,
        gc_max_bytes_default: s.gc_budget.max_bytes_default,
        gc_max_age_s: s.gc_budget.max_age.map(|a| a.as_secs()),
        remote: s.remote.map(remote_status),
        reconciling: s.reconciling,
        runtimes: s.runtimes.into_iter().map(runtime_status).collect(),
    }
}

fn runtime_status(r: crate::runtimes::Report) -> api::RuntimeStatus {
    let mut m = api::RuntimeStatus {
        name: r.name.into(),
        library: r.library.display().to_string(),
        checking: r.found.is_none(),
        ..Default::default()
    };
    match r.found {
        Some(Ok(id)) => {
            m.version = id.identity.version;
            m.build = id.identity.build;
            m.library_blake3 = id.library_blake3;
        }
        Some(Err(why)) => m.problem = why.to_string(),
        None => {}
    }
    m
}

pub(crate) fn transfer(t: crate::ops::remote::Transfer) -> api::RemoteTransferResponse {
    api::RemoteTransferResponse {
        done: t.done,
        present: t.present,
        missing: t.missing,
        failed: t.failed,
        bytes: t.bytes,
        first_error: t.first_error,
    }
}

pub(crate) fn remote_status(r: crate::fleet::Report) -> api::RemoteStatus {
    let c = r.counters;
    api::RemoteStatus {
        remote: r.remote,
        read: r.read,
        write: r.write,
        fetch: r.fetch,
        breaker: r.breaker.into(),
        last_error: r.last_error,
        queue_depth: r.queue_depth,
        queue_capacity: r.queue_capacity,
        hits: c.hits,
        misses: c.misses,
        errors: c.errors,
        rejected: c.rejected,
        bytes_in: c.bytes_in,
        bytes_out: c.bytes_out,
        uploads: c.uploads,
        upload_drops: c.upload_drops,
        skipped: c.skipped,
        chose_fetch: c.chose_fetch,
        chose_pack: c.chose_pack,
        pack_bytes_per_s: (r.pack_rates.into_iter())
            .map(|(format, backend, rate)| (format!("{format}/{backend}"), rate))
            .collect(),
        remote_bytes_per_s: r.remote_rate.unwrap_or(0.0),
        audits: c.audits,
        audit_mismatches: c.audit_mismatches,
        probed: r.reachable.is_some(),
        reachable: matches!(r.reachable, Some(Ok(()))),
        probe_error: (r.reachable.and_then(Result::err))
            .map(|e| e.to_string())
            .unwrap_or_default(),
        trusted_keys: r.trusted_keys,
        trusted_form_keys: r.trusted_form_keys,
    }
}

pub(crate) fn event(d: &Daemon, e: &Event) -> api::Event {
    api::Event {
        unix_ms: e.unix_ms,
        kind: e.kind.name().into(),
        key: e
            .key
            .as_ref()
            .map(convert::key_to_string)
            .unwrap_or_default(),
        model_path: e.model_path.clone(),
        detail: e.detail.clone(),
        progress: e.progress.as_ref().map(|p| progress(d, p)),
    }
}

pub(crate) fn formats(d: &Daemon) -> api::ListFormatsResponse {
    let gpu = d.scheduler.has_gpu_lane();
    api::ListFormatsResponse {
        formats: ctcache_kernels::catalogue()
            .iter()
            .map(|p| {
                let mut backends = vec![api::Backend::Cpu.into()];
                if gpu && ctcache_kernels::gpu::supports(p.id()) {
                    backends.push(api::Backend::Wgpu.into());
                }
                api::FormatInfo {
                    id: p.id().into(),
                    version: p.format_version(),
                    description: p.describe().into(),
                    params: p
                        .param_spec()
                        .iter()
                        .map(|s| api::FormatParam {
                            name: s.name.into(),
                            default_value: s.default.into(),
                            allowed: s.allowed.iter().map(|a| a.to_string()).collect(),
                            description: s.doc.into(),
                        })
                        .collect(),
                    backends,
                }
            })
            .collect(),
    }
}

pub(crate) fn watches(dirs: Vec<std::path::PathBuf>) -> Vec<String> {
    dirs.iter().map(|p| p.display().to_string()).collect()
}

pub(crate) fn compiled(d: &Daemon, c: Compiled) -> api::CompileResponse {
    let mut r = api::CompileResponse {
        miss: c.miss.as_ref().map(miss),
        compiled: c.compiled,
        model_digest: c.model_digest.to_vec().into(),
        compile_us: c.compile_time.as_micros().min(u64::MAX as u128) as u64,
        ..Default::default()
    };
    if let Some(f) = c.form {
        r.form = Some(lease(d, f.form));
        r.held = f.leased.held;
        r.model = f.model.into();
        r.tensors = f
            .tensors
            .into_iter()
            .map(|(t, key)| api::MaterializedTensor {
                key: convert::key_to_string(&key),
                name: t.name,
                offset: 0,
                length: t.length,
                data_type: t.data_type,
                dims: t.dims,
            })
            .collect();
        r.leases = f.leased.leases.into_iter().map(|g| lease(d, g)).collect();
        r.external_data_dir = f.leased.external_data_dir.display().to_string();
    }
    r
}
