//! The Materialize use case: plan the rewrite for the target, pack the
//! missing `ort.matmul_nbits` / `ort.quantize_dynamic` entries (single-flight with every other request), then
//! write the model with its weights reflinked, copied or hard-linked from the
//! store (`LinkMode`), under
//! leases so that a gc running meanwhile cannot remove a payload first.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ctcache::cancel::Cancel;
use ctcache::materialize::{
    self as mat, LinkMode, PackedWeight, Plan, Recipe, Report, Settings, WeightKey,
};
use ctcache::outdir::OutFile;
use ctcache::store::{Entry, Payload};
use ctcache_kernels::Params;

use super::model;
use super::output::output_file;
use super::pack::{self, BackendRequest};
use super::payload::{self, Granted};
use super::{blocking, serve, Error, Result};
use crate::caller::Caller;
use crate::config::PolicyRule;
use crate::error::ErrorKind;
use crate::policy::Wanted;
use crate::scheduler::Priority;
use crate::state::Daemon;

/// How long the payloads stay leased while being linked.
const LEASE_TTL: Duration = Duration::from_secs(120);

/// A Materialize request; unset settings come from the policy's
/// `ort.matmul_nbits` rule, else the packer's defaults.
#[derive(Debug, Clone)]
pub(crate) struct MaterializeRequest {
    pub model_path: String,
    /// A descriptor channel handout to read the model from instead.
    pub handout: String,
    pub output_path: String,
    /// Empty: onnxruntime 4-bit.
    pub target: String,
    pub bits: Option<u32>,
    pub block_size: Option<u32>,
    pub symmetric: Option<bool>,
    pub accuracy_level: i64,
    /// How weight files are placed (reflink or copy by default).
    pub link: LinkMode,
    /// onnxruntime-int8: `int8` (empty: that) or `uint8`.
    pub weight_type: String,
    pub per_channel: bool,
    pub reduce_range: bool,
    /// onnxruntime-int8: op types to quantize (empty: MatMul).
    pub op_types: Vec<String>,
    /// onnxruntime-fp16: op types kept FLOAT, comma-separated (`None`: the
    /// converter's default list).
    pub op_block_list: Option<String>,
    /// Write nothing: answer the model's bytes and lease its payloads to
    /// the caller for this long (see [`InMemoryAnswer`]).
    pub in_memory: Option<u64>,
}

/// What Materialize wrote.
#[derive(Debug, Clone)]
pub(crate) struct Materialized {
    pub output_path: PathBuf,
    pub plan: Plan,
    pub report: Report,
    pub recipe: Recipe,
    /// Entries packed for this request, and those already stored.
    pub packed: u32,
    pub cached: u32,
    /// The model built in memory, when asked for (nothing written then).
    pub in_memory: Option<InMemoryAnswer>,
}

/// A model built in memory and what its caller needs to feed its new
/// initializers: the entry of each payload they read, and a lease on it.
#[derive(Debug, Clone)]
pub(crate) struct InMemoryAnswer {
    pub built: mat::InMemory,
    /// The entry behind each payload file name the tensors name.
    pub entries: HashMap<String, Entry>,
    /// A lease for the caller on each of those entries.
    pub leases: Vec<Granted>,
    /// The folder the model's external data locations are relative to:
    /// the store's payload folder.
    pub external_data_dir: PathBuf,
}

/// Where a materialize puts the model.
enum Destination {
    /// A file, its payload files placed in its data folder.
    File { out: OutFile, mode: LinkMode },
    /// Nothing written; payloads leased to the caller for this long (ms).
    Memory { lease_ttl_ms: u64 },
}

/// The target and settings of a request (the core's rule, `mat::Ask`);
/// a setting another target takes is refused, naming it.
fn recipe(policy: &[PolicyRule], r: &MaterializeRequest) -> Result<Recipe> {
    let ask = mat::Ask {
        target: r.target.clone(),
        bits: r.bits,
        block_size: r.block_size,
        symmetric: r.symmetric,
        accuracy_level: r.accuracy_level,
        weight_type: (!r.weight_type.is_empty()).then(|| r.weight_type.clone()),
        per_channel: r.per_channel,
        reduce_range: r.reduce_range,
        op_types: r.op_types.clone(),
        op_block_list: r.op_block_list.as_deref().map(mat::op_list),
    };
    let convert = ctcache_kernels::formats::float16_clamp::convert_default;
    ask.recipe(policy_settings(policy), convert)
        .map_err(|e| match e {
            mat::AskError::Misplaced { setting, target } => {
                Error::invalid(setting.refused_for(target, field_name(setting), |t| t.to_string()))
            }
            e => Error::invalid(e.to_string()),
        })
}

/// A setting as the request's field names it.
fn field_name(s: mat::Setting) -> &'static str {
    use mat::Setting as S;
    match s {
        S::Bits => "bits",
        S::BlockSize => "block_size",
        S::Symmetric => "symmetric",
        S::AccuracyLevel => "accuracy_level",
        S::WeightType => "weight_type",
        S::PerChannel => "per_channel",
        S::ReduceRange => "reduce_range",
        S::OpTypes => "op_types",
        S::OpBlockList => "op_block_list",
    }
}

/// The int4 settings of the policy's `ort.matmul_nbits` rule over the
/// packer's defaults: what a request leaves unset.
fn policy_settings(policy: &[PolicyRule]) -> Settings {
    let mut s = Settings::default();
    if let Some(rule) = policy.iter().find(|p| p.format == mat::PACKER) {
        let get = |k: &str| rule.params.get(k).map(String::as_str);
        if let Some(b) = get("bits").and_then(|v| v.parse().ok()) {
            s.bits = b;
        }
        if let Some(b) = get("block_size").and_then(|v| v.parse().ok()) {
            s.block_size = b;
        }
        if let Some(b) = get("symmetric").and_then(|v| v.parse().ok()) {
            s.symmetric = b;
        }
    }
    s
}

/// Cancels its token when dropped: an async call dropped before its
/// blocking part ended.
struct StopOnDrop(Cancel);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// The Materialize use case.
pub(crate) async fn materialize(
    d: &Arc<Daemon>,
    caller: &Caller,
    r: MaterializeRequest,
) -> Result<Materialized> {
    tracing::info!(caller = %caller.describe(), model = %r.model_path, output = %r.output_path, "materialize");
    let recipe = recipe(&d.config.policy, &r)?;
    let dest = destination(caller, &r)?;
    let (d2, c2, named, r2) = (
        d.clone(),
        caller.clone(),
        (r.model_path.clone(), r.handout.clone()),
        recipe.clone(),
    );
    let (m, plan) = blocking(move || {
        let m = model::open(&d2, &named.0, &named.1, &c2)?;
        let plan = mat::plan_for(&m.model, &r2).map_err(|e| Error::invalid(e.to_string()))?;
        Ok((m, plan))
    })
    .await?;
    if let Some(why) = plan.why_nothing() {
        return Err(Error::new(
            ErrorKind::NothingToRewrite,
            format!("nothing to materialize in {}: {why}", r.model_path),
        ));
    }
    let wanted = wanted(&plan, &recipe)?;
    let jobs = {
        let (d, m) = (d.clone(), m.clone());
        let ws: Vec<Wanted> = wanted.iter().map(|(_, w)| w.clone()).collect();
        let who = (caller.bounded_uid(), Priority::Client);
        blocking(move || pack::submit_all(&d, &m, &ws, who, BackendRequest::Auto)).await?
    };
    let (entries, packed) = pack::finish(jobs).await?;
    let cached = entries.len() as u32 - packed;
    // A caller that goes away (the call dropped, as on its Ctrl-C) stops
    // the write, which removes what it made.
    let stop = StopOnDrop(Cancel::new());
    let job = WriteJob {
        d: d.clone(),
        caller: caller.clone(),
        model: m,
        recipe: recipe.clone(),
        entries,
        wanted,
        cancel: stop.0.clone(),
        in_memory: matches!(dest, Destination::Memory { .. }),
    };
    blocking(move || {
        let (output_path, report, in_memory) = match dest {
            Destination::File { out, mode } => (out.path(), job.write(&plan, &out, mode)?, None),
            Destination::Memory { lease_ttl_ms } => {
                let answer = job.build(&plan, lease_ttl_ms)?;
                (PathBuf::new(), answer.built.report.clone(), Some(answer))
            }
        };
        Ok(Materialized {
            output_path,
            plan,
            report,
            recipe,
            packed,
            cached,
            in_memory,
        })
    })
    .await
}

/// The link mode the daemon uses for `caller`: hard links only for a caller
/// the kernel would let link the store's files itself (root, or the
/// store's owner: `fs.protected_hardlinks`); anyone else gets copies, as a
/// refused link gives. A hard link of another user's payload would live on
/// outside gc and the user's quota.
fn link_for(caller: &Caller, asked: LinkMode) -> LinkMode {
    if asked == LinkMode::Hard && !caller.is_self_or_root() {
        tracing::info!(caller = %caller.describe(), "hard links refused: copies");
        return LinkMode::Copy;
    }
    asked
}

/// Where the request wants the model: an in-memory request names no
/// output and no link mode.
fn destination(caller: &Caller, r: &MaterializeRequest) -> Result<Destination> {
    let Some(lease_ttl_ms) = r.in_memory else {
        return Ok(Destination::File {
            out: output_file(caller, &r.output_path)?,
            mode: link_for(caller, r.link),
        });
    };
    if !r.output_path.is_empty() {
        return Err(Error::invalid(
            "in_memory writes nothing: output_path must be empty",
        ));
    }
    if r.link != LinkMode::default() {
        return Err(Error::invalid(format!(
            "in_memory writes nothing: link {} places no file",
            r.link.name()
        )));
    }
    Ok(Destination::Memory { lease_ttl_ms })
}

/// The packer and parameters of each payload the plan's write reads.
fn wanted(plan: &Plan, recipe: &Recipe) -> Result<Vec<(WeightKey, Wanted)>> {
    plan.packs(recipe)
        .into_iter()
        .map(|p| {
            let params = Params::parse(p.params).map_err(|e| Error::internal(e.to_string()))?;
            let w = Wanted {
                initializer: p.key.0.clone(),
                format: p.packer.into(),
                params,
            };
            Ok((p.key, w))
        })
        .collect()
}

/// The write of a materialize, once its entries are packed.
struct WriteJob {
    d: Arc<Daemon>,
    caller: Caller,
    model: model::OpenedModel,
    recipe: Recipe,
    entries: Vec<(Wanted, Entry)>,
    wanted: Vec<(WeightKey, Wanted)>,
    cancel: Cancel,
    /// Built in memory (payloads named by their place in the store).
    in_memory: bool,
}

/// The packed weights of a write, each leased and opened (checked as it is
/// served); the leases end when this is dropped.
struct Served<'j> {
    job: &'j WriteJob,
    leases: Vec<ctcache::store::LeaseId>,
    payloads: Vec<(Entry, Arc<Payload>)>,
    weights: HashMap<WeightKey, PackedWeight>,
}

impl Drop for Served<'_> {
    fn drop(&mut self) {
        for id in self.leases.drain(..) {
            let _ = self.job.d.store.release(id);
        }
    }
}

impl WriteJob {
    /// Leases and opens every payload the write reads.
    fn serve(&self) -> Result<Served<'_>> {
        let store = &self.d.store;
        let mut served = Served {
            job: self,
            leases: Vec::new(),
            payloads: Vec::new(),
            weights: HashMap::new(),
        };
        for (w, e) in &self.entries {
            let Some((key, _)) = self.wanted.iter().find(|(_, x)| x == w) else {
                continue;
            };
            served.leases.push(store.acquire_lease(&e.key, LEASE_TTL)?);
            let payload = Arc::new(serve::open(&self.d, &self.caller, e)?);
            served.payloads.push((e.clone(), payload.clone()));
            served.weights.insert(
                key.clone(),
                PackedWeight {
                    payload_path: payload.path.clone(),
                    file_name: self.file_name(&payload.info.blake3),
                    struct_type: e.physical_type()?,
                    dims: e.dims.clone(),
                    checked: Some(payload),
                },
            );
        }
        Ok(served)
    }

    /// The name a payload goes by in the new model: in its data folder
    /// `<blake3>.bin`; in memory its place in the store's payload folder
    /// (which the answer names), so that a runtime maps the file itself.
    fn file_name(&self, blake3: &[u8; 32]) -> String {
        match self.in_memory {
            false => format!("{}.bin", hex::encode(blake3)),
            true => self.d.store.blob_in_folder(blake3).display().to_string(),
        }
    }

    /// Writes the model to `out` with its payloads placed by `mode`. The
    /// model, its folder and copies go to the caller as they are made;
    /// linked payloads keep the store's owner (the store's inodes).
    fn write(&self, plan: &Plan, out: &OutFile, mode: LinkMode) -> Result<Report> {
        let served = self.serve()?;
        let (model, recipe) = (&self.model.model, self.recipe.clone());
        mat::write(
            model,
            plan,
            recipe,
            &served.weights,
            out,
            mode,
            &self.cancel,
        )
        .map_err(|err| self.write_error(err, &served.payloads))
    }

    /// Builds the model in memory and leases to the caller, for
    /// `lease_ttl_ms`, every payload its tensors read.
    fn build(&self, plan: &Plan, lease_ttl_ms: u64) -> Result<InMemoryAnswer> {
        let served = self.serve()?;
        let limit = self.d.config.max_message_bytes.saturating_sub(1 << 20);
        let built = mat::build_in_memory(
            &self.model.model,
            plan,
            self.recipe.clone(),
            &served.weights,
            limit as u64,
        )?;
        if built.model.len() > limit {
            return Err(Error::exhausted(format!(
                "the in-memory model is {} bytes, more than an answer may carry \
                 (max_message_bytes less 1 MiB: {limit}); materialize it to a file",
                built.model.len()
            )));
        }
        // The entry behind each payload file the tensors name.
        let mut entries = HashMap::new();
        for t in &built.tensors {
            if entries.contains_key(&t.file_name) {
                continue;
            }
            let (e, _) = served
                .payloads
                .iter()
                .find(|(_, p)| self.file_name(&p.info.blake3) == t.file_name)
                .ok_or_else(|| Error::internal(format!("no entry for {}", t.file_name)))?;
            entries.insert(t.file_name.clone(), e.clone());
        }
        let leases = self.lease_to_caller(entries.values(), lease_ttl_ms)?;
        Ok(InMemoryAnswer {
            built,
            entries,
            leases,
            external_data_dir: self.d.store.payload_folder().to_path_buf(),
        })
    }

    /// A lease for the caller on each entry, as AcquireLease grants it; on
    /// a refusal the ones granted are released.
    fn lease_to_caller<'e>(
        &self,
        entries: impl Iterator<Item = &'e Entry>,
        ttl_ms: u64,
    ) -> Result<Vec<Granted>> {
        let mut granted: Vec<Granted> = Vec::new();
        for e in entries {
            match payload::acquire(&self.d, &self.caller, &e.key, ttl_ms) {
                Ok(g) => granted.push(g),
                Err(err) => {
                    for g in granted {
                        let _ = payload::release(&self.d, &self.caller, g.id);
                    }
                    return Err(err);
                }
            }
        }
        Ok(granted)
    }

    /// A payload found changed while placed is the store's damage (repacked
    /// at once); the rest are the write's errors.
    fn write_error(&self, err: ctcache::Error, served: &[(Entry, Arc<Payload>)]) -> Error {
        match &err {
            ctcache::Error::PayloadChanged { path, .. } => {
                match served.iter().find(|(_, p)| p.path == *path) {
                    Some((e, p)) => serve::changed(&self.d, &self.caller, e, p, &err),
                    None => Error::new(crate::error::ErrorKind::DataLoss, err.to_string()),
                }
            }
            _ => Error::from(err),
        }
    }
}
