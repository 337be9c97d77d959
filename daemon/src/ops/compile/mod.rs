//! The Compile use case (D15): a model handed over by its caller -> the
//! runtime's own compiled form of it, made by that runtime's worker once
//! per key and kept as a store entry (leases, gc, verify and the checks on
//! every serve come with it). Concurrent requests of one key share one
//! compile, which stops when none of them waits any more. A miss names why:
//! no usable runtime, the caller's runtime another than the daemon's, or
//! (looking only) the part in which the stored forms' keys differ.

mod fetched;
mod job;
pub(crate) mod rules;
mod served;
mod source;

pub(crate) use served::ServedForm;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ctcache::forms::{self, FormKey, KeyPart, RuntimeIdentity};
use ctcache::hit::MissReason;
use ctcache::store::{EntryKey, Filter};
use futures_util::future::FutureExt;

use super::materialize::MaterializeRequest;
use super::payload_access::Leasing;
use super::{blocking, model, Error, Miss, Result};
use crate::caller::Caller;
use crate::error::ErrorKind;
use crate::runtimes::Configured;
use crate::state::Daemon;
use job::{Job, Made};
use source::Source;

/// The onnxruntime provider forms are made for.
const CPU_PROVIDER: &str = "CPUExecutionProvider";

/// The OpenVINO device forms are made for.
const CPU_DEVICE: &str = "CPU";

/// A Compile request.
#[derive(Debug, Clone)]
pub(crate) struct CompileRequest {
    pub model_path: String,
    pub handout: String,
    pub runtime: String,
    pub level: String,
    pub provider: String,
    /// The caller's runtime version and build (empty: the daemon's).
    pub runtime_version: String,
    pub runtime_build: String,
    pub leasing: Leasing,
    pub lookup_only: bool,
    /// The form of this target's model instead of the model as it is.
    pub materialize: Option<MaterializeRequest>,
    /// OpenVINO's compile config.
    pub config: BTreeMap<String, String>,
}

impl CompileRequest {
    /// What the form is made with beyond the runtime: its provider or
    /// device, and the options that change it.
    fn made_with(&self) -> MadeWith {
        match self.runtime.as_str() {
            "openvino" => MadeWith::openvino(self.config.clone()),
            _ => MadeWith::onnxruntime(&self.level),
        }
    }
}

/// A form's provider (or device) and options, the key's parts a request
/// names.
#[derive(Debug, Clone)]
pub(crate) struct MadeWith {
    pub provider: String,
    pub options: BTreeMap<String, String>,
}

impl MadeWith {
    /// onnxruntime's form: the CPU provider at `level`.
    fn onnxruntime(level: &str) -> MadeWith {
        MadeWith {
            provider: CPU_PROVIDER.into(),
            options: BTreeMap::from([("level".to_string(), level.to_string())]),
        }
    }

    /// OpenVINO's form: the CPU device with `config`.
    fn openvino(config: BTreeMap<String, String>) -> MadeWith {
        MadeWith {
            provider: CPU_DEVICE.into(),
            options: config,
        }
    }
}

/// What Compile answers.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    pub model_digest: [u8; 32],
    /// The form, served to the caller; `None` on a miss.
    pub form: Option<ServedForm>,
    pub miss: Option<Miss>,
    /// Made for this request (or for one it joined).
    pub compiled: bool,
    pub compile_time: Duration,
}

/// The Compile use case.
pub(crate) async fn compile(
    d: &Arc<Daemon>,
    caller: &Caller,
    r: CompileRequest,
) -> Result<Compiled> {
    check(&r)?;
    let (d2, c2, named) = (
        d.clone(),
        caller.clone(),
        (r.model_path.clone(), r.handout.clone()),
    );
    let opened = match r.materialize.clone() {
        Some(target) => Ok(source::materialized(d, caller, target).await?),
        None => {
            blocking(move || {
                let m = model::open(&d2, &named.0, &named.1, &c2)?;
                let digest = digest_of(&d2, c2.bounded_uid(), &m)?;
                Ok(digest.map(|digest| (Source::Opened(m), digest)))
            })
            .await?
        }
    };
    let (m, model_digest) = match opened {
        Ok(found) => found,
        Err(why) => return Ok(missed([0; 32], MissReason::NotASource(why).into())),
    };
    let answer = |miss: Miss| missed(model_digest, miss);
    let (rt, key) = match runtime_key(d, &r.runtime, model_digest, r.made_with()).await {
        Ok(found) => found,
        Err(miss) => return Ok(answer(miss)),
    };
    let mut asked = key.clone();
    asked.runtime = RuntimeIdentity {
        name: r.runtime.clone(),
        version: or(&r.runtime_version, &key.runtime.version),
        build: or(&r.runtime_build, &key.runtime.build),
    };
    if let Some(part) = key.difference(&asked) {
        return Ok(answer(Miss::from(MissReason::FormKeyDiffers(part))));
    }
    let entry_key = entry_key_of(&key)?;
    let job = Job {
        d: d.clone(),
        rt,
        key,
        entry_key,
        model: m,
        requested_by: caller.bounded_uid(),
    };
    let (form, made) = match d.store.stat(&entry_key)? {
        Some(e) => match served::serve_form(d, caller, &e, &r.leasing) {
            Ok(f) => (f, None),
            // A stored form one of whose payloads rotted or went (gc) is
            // made again: never served incomplete.
            Err(err) if incomplete(&err) && !r.lookup_only => {
                tracing::warn!(key = %entry_key, "a stored form is incomplete ({err}): compiling it again");
                made_and_served(d, caller, job, entry_key, &r.leasing).await?
            }
            Err(err) if incomplete(&err) => {
                return Ok(answer(Miss::new(MissReason::NoEntry, err.message)))
            }
            Err(err) => return Err(err),
        },
        None if r.lookup_only => {
            let (d, path) = (d.clone(), job.model.path().display().to_string());
            let miss = blocking(move || explain(&d, &job.key, &path)).await?;
            return Ok(answer(miss));
        }
        None => made_and_served(d, caller, job, entry_key, &r.leasing).await?,
    };
    Ok(Compiled {
        model_digest,
        form: Some(form),
        miss: None,
        compiled: made.as_ref().is_some_and(|(_, took)| took.is_some()),
        compile_time: made.and_then(|(_, took)| took).unwrap_or_default(),
    })
}

/// A stored form that cannot be served whole: one of its payloads is gone
/// or rotted.
fn incomplete(err: &Error) -> bool {
    err.kind == ErrorKind::DataLoss
}

/// The daemon's `runtime` and the key of the form of `model` it makes
/// `made_with`; a miss when it has no usable such runtime. Every form is
/// keyed by the host's exact CPU tier: onnxruntime's `all` and OpenVINO's
/// compiled model are made for it, and no test here shows `extended`
/// portable across tiers.
async fn runtime_key(
    d: &Daemon,
    runtime: &str,
    model: [u8; 32],
    made_with: MadeWith,
) -> std::result::Result<(Arc<Configured>, FormKey), Miss> {
    let unavailable = |why: String| Miss::from(MissReason::RuntimeUnavailable(why));
    let Some(rt) = d.runtimes.named(runtime).cloned() else {
        let key = if runtime == "openvino" {
            "openvino_library"
        } else {
            "ort_library"
        };
        return Err(unavailable(format!(
            "{runtime} is not configured in the daemon ({key})"
        )));
    };
    let identified = rt
        .identified()
        .await
        .map_err(|why| unavailable(format!("{runtime} cannot be used: {why}")))?;
    let key = FormKey {
        model,
        runtime: identified.identity,
        provider: made_with.provider,
        options: made_with.options,
        device: Some(d.host_tier.clone()),
    };
    Ok((rt, key))
}

/// One of `uid`'s compile places (none is counted for a trusted caller):
/// RESOURCE_EXHAUSTED when it waits for as many compiles as it may.
fn compile_place(d: &Daemon, uid: Option<u32>) -> Result<Option<crate::shares::Share>> {
    d.compile_shares.take(uid).ok_or_else(|| {
        Error::exhausted(format!(
            "uid {} waits for {} compiles already: one must end before another starts",
            uid.unwrap_or_default(),
            crate::state::COMPILES_PER_UID
        ))
    })
}

fn entry_key_of(key: &FormKey) -> Result<EntryKey> {
    key.entry_key()
        .ok_or_else(|| Error::internal("the runtime has no form type"))?
        .map_err(|e| Error::internal(e.to_string()))
}

/// Runs (or joins) the compile of `job` and serves its form to the caller.
async fn made_and_served(
    d: &Arc<Daemon>,
    caller: &Caller,
    job: Job,
    entry_key: EntryKey,
    leasing: &Leasing,
) -> Result<(ServedForm, Option<Made>)> {
    let _place = compile_place(d, caller.bounded_uid())?;
    let flight = d.compiles.join(entry_key, move || job.run().boxed());
    let made = flight.await?;
    Ok((served::serve_form(d, caller, &made.0, leasing)?, Some(made)))
}

fn or(asked: &str, daemon: &str) -> String {
    if asked.is_empty() { daemon } else { asked }.to_string()
}

/// A miss, answered for the model of digest `model_digest`.
fn missed(model_digest: [u8; 32], miss: Miss) -> Compiled {
    Compiled {
        model_digest,
        form: None,
        miss: Some(miss),
        compiled: false,
        compile_time: Duration::ZERO,
    }
}

/// The model's digest (D15), its initializers' digests taken through the
/// memo (and charged to `payer` as a Prepack's are); or why it has no
/// form (it cannot be given to a worker whole).
fn digest_of(
    d: &Daemon,
    payer: Option<u32>,
    m: &model::OpenedModel,
) -> Result<std::result::Result<[u8; 32], String>> {
    if let Some(why) = too_large_whole(d, &m.model)? {
        return Ok(Err(why));
    }
    let (tensors, known) = model::digests(d, payer, &m.path, &m.model)?;
    Ok(Ok(model::form_digest(&m.model, &tensors, &known)?))
}

/// The runtime, level, provider and config a request names.
fn check(r: &CompileRequest) -> Result<()> {
    match r.runtime.as_str() {
        "onnxruntime" => check_onnxruntime(r),
        "openvino" => check_openvino(r),
        other => Err(Error::invalid(format!(
            "runtime {other:?}: the daemon compiles for onnxruntime and openvino"
        ))),
    }
}

fn check_onnxruntime(r: &CompileRequest) -> Result<()> {
    if !forms::ONNXRUNTIME_LEVELS.contains(&r.level.as_str()) {
        return Err(Error::invalid(format!(
            "level {:?} is not one of {}",
            r.level,
            forms::ONNXRUNTIME_LEVELS.join(", ")
        )));
    }
    if !r.provider.is_empty() && r.provider != CPU_PROVIDER {
        return Err(Error::invalid(format!(
            "provider {:?}: forms are made for {CPU_PROVIDER} only",
            r.provider
        )));
    }
    if !r.config.is_empty() {
        return Err(Error::invalid(
            "config is OpenVINO's; onnxruntime's form takes a level",
        ));
    }
    Ok(())
}

fn check_openvino(r: &CompileRequest) -> Result<()> {
    if !r.level.is_empty() {
        return Err(Error::invalid(format!(
            "level {:?}: OpenVINO's form takes a device and a config, no level",
            r.level
        )));
    }
    if !r.provider.is_empty() && r.provider != CPU_DEVICE {
        return Err(Error::invalid(format!(
            "device {:?}: OpenVINO forms are made for {CPU_DEVICE} only",
            r.provider
        )));
    }
    forms::check_openvino_config(r.config.iter()).map_err(|e| Error::invalid(e.to_string()))
}

/// The most a model may hold with its external data put inline: one
/// protobuf message (2 GiB), less room for the rest.
const MAX_WHOLE_BYTES: u64 = (2 << 30) - (1 << 20);

/// Why a model has no form: its worker is given it whole, its external
/// data put inline (D14: the worker opens no file), in one copy the daemon
/// holds while the one compile runs; a model past one protobuf message or
/// the daemon's `memory_budget` that way cannot be (`None`: it can).
fn too_large_whole(d: &Daemon, m: &ctcache::onnx::Model) -> Result<Option<String>> {
    let invalid = |e: ctcache::Error| Error::invalid(e.to_string());
    let mut size = m.bytes().len() as u64;
    for t in m.initializers().map_err(invalid)? {
        if matches!(t.storage, ctcache::onnx::Storage::External(_)) {
            size = size.saturating_add(t.raw_size().unwrap_or(u64::MAX));
        }
    }
    let limit = MAX_WHOLE_BYTES.min(d.config.memory_budget);
    Ok((size > limit).then(|| {
        format!(
            "the model is {size} bytes with its external data put inline, more than a runtime's \
             worker is given whole (one protobuf message, 2 GiB, and memory_budget: {limit})"
        )
    }))
}

/// Why no form of `key` is stored: a form of the same content under
/// another key (the first part that differs), a form of the same path
/// with other content, or none at all.
fn explain(d: &Daemon, key: &FormKey, path: &str) -> Result<Miss> {
    let same_content = Filter {
        source: Some(key.source()),
        ..Default::default()
    };
    for e in d.store.list(&same_content)? {
        if let Some(part) = FormKey::of_entry(&e).and_then(|k| k.difference(key)) {
            return Ok(Miss::from(MissReason::FormKeyDiffers(part)));
        }
    }
    let forms = Filter {
        format: forms::form_type_name(&key.runtime.name).map(str::to_string),
        ..Default::default()
    };
    let other_content = |e: &ctcache::store::Entry| e.key.source != key.source();
    if d.store
        .list(&forms)?
        .iter()
        .any(|e| other_content(e) && e.model_paths.iter().any(|p| p == path))
    {
        return Ok(Miss::from(MissReason::FormKeyDiffers(KeyPart::Model)));
    }
    Ok(Miss::new(
        MissReason::NoEntry,
        "no form of this model's content is stored: compile it",
    ))
}
