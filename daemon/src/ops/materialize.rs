//! The Materialize use case: plan the rewrite for the target, pack the
//! missing entries of its packer (single-flight with every other request),
//! then build the model in memory and lease its payloads to the caller. The
//! daemon writes no file for a caller: a client that wants a file asks for
//! its data folder's name and writes the model and the payload copies
//! itself, with its own rights (`ctcache::materialize::write_answer`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ctcache::materialize::{self as mat, PackedWeight, Plan, Recipe, Report, Settings, WeightKey};
use ctcache::store::{Entry, Payload};
use ctcache_kernels::Params;

use super::model;
use super::pack::{self, BackendRequest};
use super::payload_access::{self, Leased, Leasing};
use super::{blocking, serve, Error, Result};
use crate::caller::Caller;
use crate::config::PolicyRule;
use crate::error::ErrorKind;
use crate::policy::Wanted;
use crate::scheduler::Priority;
use crate::state::Daemon;

/// How long the payloads stay leased while the model is built.
const LEASE_TTL: Duration = Duration::from_secs(120);

/// A Materialize request; unset settings come from the policy's
/// `ort.matmul_nbits` rule, else the packer's defaults.
#[derive(Debug, Clone)]
pub(crate) struct MaterializeRequest {
    pub model_path: String,
    /// A descriptor channel handout to read the model from instead.
    pub handout: String,
    /// Empty: onnxruntime 4-bit.
    pub target: String,
    pub bits: Option<u32>,
    pub block_size: Option<u32>,
    pub symmetric: Option<bool>,
    pub accuracy_level: i64,
    /// onnxruntime-int8: `int8` (empty: that) or `uint8`.
    pub weight_type: String,
    pub per_channel: bool,
    pub reduce_range: bool,
    /// onnxruntime-int8: op types to quantize (empty: MatMul).
    pub op_types: Vec<String>,
    /// onnxruntime-fp16: op types kept FLOAT, comma-separated (`None`: the
    /// converter's default list).
    pub op_block_list: Option<String>,
    /// How the answer's payloads are leased to the caller.
    pub leasing: Leasing,
    /// The data folder of the model file the caller writes (one path
    /// component); empty: locations name the payloads in the store.
    pub data_folder: String,
}

/// What Materialize made.
#[derive(Debug, Clone)]
pub(crate) struct Materialized {
    pub plan: Plan,
    pub report: Report,
    pub recipe: Recipe,
    /// Entries packed for this request, and those already stored.
    pub packed: u32,
    pub cached: u32,
    /// The model built in memory.
    pub answer: InMemoryAnswer,
}

/// A model built in memory and what its caller needs to feed its new
/// initializers: the entry of each payload they read, and a lease on it.
#[derive(Debug, Clone)]
pub(crate) struct InMemoryAnswer {
    pub built: mat::InMemory,
    /// The entry behind each payload file name the tensors name.
    pub entries: HashMap<String, Entry>,
    /// Those entries, leased to the caller.
    pub leased: Leased,
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

/// The Materialize use case.
pub(crate) async fn materialize(
    d: &Arc<Daemon>,
    caller: &Caller,
    r: MaterializeRequest,
) -> Result<Materialized> {
    tracing::info!(caller = %caller.describe(), model = %r.model_path, "materialize");
    let recipe = recipe(&d.config.policy, &r)?;
    check_data_folder(&r.data_folder)?;
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
    let (entries, packed) = pack::finish(d, &r.model_path, jobs).await?;
    let cached = entries.len() as u32 - packed;
    let job = WriteJob {
        d: d.clone(),
        caller: caller.clone(),
        model: m,
        recipe: recipe.clone(),
        entries,
        wanted,
        data_folder: r.data_folder,
    };
    blocking(move || {
        let answer = job.build(&plan, &r.leasing)?;
        Ok(Materialized {
            plan,
            report: answer.built.report.clone(),
            recipe,
            packed,
            cached,
            answer,
        })
    })
    .await
}

/// A data folder is one path component (or none): the client makes it
/// beside the model it writes.
fn check_data_folder(name: &str) -> Result<()> {
    let component = !name.contains(['/', '\0']) && name != "." && name != "..";
    match component && name.len() <= 255 {
        true => Ok(()),
        false => Err(Error::invalid(format!(
            "data_folder {name:?} is not a folder name (one path component)"
        ))),
    }
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
    /// The caller's data folder; empty: payloads named by their place in
    /// the store.
    data_folder: String,
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

    /// The name a payload goes by in the new model: in a data folder
    /// `<blake3>.bin`; else its place in the store's payload folder (which
    /// the answer names), so that a runtime maps the file itself.
    fn file_name(&self, blake3: &[u8; 32]) -> String {
        match self.data_folder.is_empty() {
            false => ctcache::materialize::data_file_name(blake3),
            true => self.d.store.blob_in_folder(blake3).display().to_string(),
        }
    }

    /// Builds the model in memory and leases to the caller, as `leasing`
    /// says, every payload its tensors read.
    fn build(&self, plan: &Plan, leasing: &Leasing) -> Result<InMemoryAnswer> {
        let served = self.serve()?;
        let limit = self.d.config.max_message_bytes.saturating_sub(1 << 20);
        let built = mat::build_in_memory(
            &self.model.model,
            plan,
            self.recipe.clone(),
            &served.weights,
            limit as u64,
            &self.data_folder,
        )?;
        if built.model.len() > limit {
            return Err(Error::exhausted(format!(
                "the materialized model is {} bytes, more than an answer may carry \
                 (max_message_bytes less 1 MiB: {limit}); raise max_message_bytes, or \
                 materialize with --local",
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
        let leased = payload_access::lease_answer(
            &self.d,
            &self.caller,
            &entries.values().collect::<Vec<_>>(),
            leasing,
        )?;
        Ok(InMemoryAnswer {
            built,
            entries,
            leased,
        })
    }
}
