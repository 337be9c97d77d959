//! The Materialize RPC: plan the rewrite, pack the missing `ort.matmul_nbits`
//! entries (single-flight with every other request), then write the model
//! with its weights hard-linked from the store, under leases so that a gc
//! running meanwhile cannot remove a payload before it is linked.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ctcache::materialize::{self as mat, PackedWeight, Settings, WeightKey};
use ctcache_api::v1 as api;
use ctcache_kernels::Params;
use tonic::Status;

use crate::config::PolicyRule;
use crate::daemon::Daemon;
use crate::peer::Peer;
use crate::policy::Wanted;
use crate::scheduler::Priority;
use crate::service::{blocking, finish_jobs, give_to_peer, output_path, store_err, Model2};

/// How long the payloads stay leased while being linked.
const LEASE_TTL: Duration = Duration::from_secs(120);

/// The settings of a request: what it names, else the policy's
/// `ort.matmul_nbits` rule, else the packer's defaults.
fn settings(policy: &[PolicyRule], r: &api::MaterializeRequest) -> Result<Settings, Status> {
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
    s.bits = r.bits.unwrap_or(s.bits);
    s.block_size = r.block_size.unwrap_or(s.block_size);
    s.symmetric = r.symmetric.unwrap_or(s.symmetric);
    s.accuracy_level = r.accuracy_level;
    s.validate()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(s)
}

pub async fn materialize(
    d: Arc<Daemon>,
    peer: Peer,
    r: api::MaterializeRequest,
) -> Result<api::MaterializeResponse, Status> {
    if !r.target.is_empty() && r.target != mat::TARGET_ORT_INT4 {
        return Err(Status::invalid_argument(format!(
            "unknown target {:?} (known: {})",
            r.target,
            mat::TARGET_ORT_INT4
        )));
    }
    let out = output_path(&peer, &r.output_path)?;
    let settings = settings(&d.config.policy, &r)?;
    let mode = r.link_mode().map_err(Status::invalid_argument)?;
    let (path, model, plan) = {
        let d = d.clone();
        let model_path = r.model_path.clone();
        blocking(move || {
            let (path, model) = d.open_model(&model_path, &peer)?;
            let plan = mat::plan(&model).map_err(|e| Status::invalid_argument(e.to_string()))?;
            Ok((path, Model2(Arc::new(model)), plan))
        })
        .await?
    };
    if let Some(why) = plan.why_nothing() {
        return Err(Status::failed_precondition(format!(
            "nothing to materialize in {}: {why}",
            r.model_path
        )));
    }
    let mut wanted: Vec<(WeightKey, Wanted)> = Vec::new();
    for (weight, transposed) in plan.weights() {
        let params = Params::parse(settings.packer_params(transposed))
            .map_err(|e| Status::internal(e.to_string()))?;
        let w = Wanted {
            initializer: weight.clone(),
            format: mat::PACKER.into(),
            params,
        };
        wanted.push(((weight, transposed), w));
    }
    let jobs = {
        let (d, path, m) = (d.clone(), path.clone(), model.clone());
        let ws: Vec<Wanted> = wanted.iter().map(|(_, w)| w.clone()).collect();
        blocking(move || Ok(d.prepack_model(&path, &m.0, &ws, Priority::Client)?)).await?
    };
    let (entries, packed) = finish_jobs(jobs).await?;
    let cached = entries.len() as u32 - packed;
    blocking(move || {
        let store = &d.store;
        let mut leases = Vec::new();
        let result = (|| {
            let mut weights: HashMap<WeightKey, PackedWeight> = HashMap::new();
            for (w, e) in &entries {
                let Some((key, _)) = wanted.iter().find(|(_, x)| x == w) else {
                    continue;
                };
                leases.push(store.acquire_lease(&e.key, LEASE_TTL).map_err(store_err)?);
                let payload = store.open_payload(&e.key).map_err(store_err)?;
                weights.insert(
                    key.clone(),
                    PackedWeight {
                        payload_path: payload.path.clone(),
                        file_name: format!("{}.bin", hex::encode(payload.info.blake3)),
                        struct_type: e.physical_type().map_err(store_err)?,
                        dims: e.dims.clone(),
                    },
                );
            }
            mat::write(&model.0, &plan, &settings, &weights, &out, mode)
                .map_err(|e| Status::invalid_argument(e.to_string()))
        })();
        for id in leases {
            let _ = store.release(id);
        }
        let report = result?;
        // The model and its folder go to the caller; linked payloads keep
        // the store's owner (they are the store's inodes).
        give_to_peer(&peer, [&out, &report.data_dir].into_iter());
        Ok(api::MaterializeResponse {
            packed,
            cached,
            ..api::MaterializeResponse::from_report(&out, &plan, &report, &settings)
        })
    })
    .await
}
