//! The model a target's form is made of: the handed-over model
//! materialized in memory, its payloads' bytes put back inline (the worker
//! reads no file), and that model's digest (D15: the content compiled).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use ctcache::forms;
use ctcache::onnx::Model;

use super::super::materialize::{self, InMemoryAnswer, MaterializeRequest};
use super::super::{blocking, model, payload_access, serve, Error, Result};
use crate::caller::Caller;
use crate::state::Daemon;

/// The target's model of `r`'s model, whole, and its digest.
pub(super) async fn materialized(
    d: &Arc<Daemon>,
    caller: &Caller,
    r: MaterializeRequest,
) -> Result<(model::OpenedModel, [u8; 32])> {
    let path = PathBuf::from(&r.model_path);
    let made = materialize::materialize(d, caller, r).await?;
    let (d, caller) = (d.clone(), caller.clone());
    blocking(move || {
        let whole = whole(&d, &caller, &made.answer);
        for g in &made.answer.leases {
            let _ = payload_access::release(&d, &caller, g.id);
        }
        let m = whole?;
        // Every payload-backed initializer is inline: nothing to open.
        if let Some(name) =
            forms::external_initializer(&m).map_err(|e| Error::internal(e.to_string()))?
        {
            return Err(Error::internal(format!(
                "the materialized model holds {name:?} as external data"
            )));
        }
        let digest = forms::model_digest(&m).map_err(|e| Error::invalid(e.to_string()))?;
        let model = Arc::new(m);
        Ok((model::OpenedModel { path, model }, digest))
    })
    .await
}

/// The answer's model with every payload-backed initializer inline, its
/// bytes checked as they are read; refused past `max_model_bytes`.
fn whole(d: &Arc<Daemon>, caller: &Caller, a: &InMemoryAnswer) -> Result<Model> {
    let size = a.built.tensors.iter().map(|t| t.length).sum::<u64>() + a.built.model.len() as u64;
    if size > d.config.max_model_bytes {
        return Err(Error::exhausted(format!(
            "the materialized model is {size} bytes with its weights, over max_model_bytes ({})",
            d.config.max_model_bytes
        )));
    }
    let mut data = HashMap::new();
    for t in &a.built.tensors {
        let e = a
            .entries
            .get(&t.file_name)
            .ok_or_else(|| Error::internal(format!("no entry for {}", t.file_name)))?;
        let p = serve::open(d, caller, e)?;
        let range = t.offset as usize..(t.offset + t.length) as usize;
        let bytes = serve::checked(d, caller, e, &p, range)?;
        data.insert(t.name.clone(), Bytes::copy_from_slice(bytes));
    }
    let built = Model::from_bytes(Bytes::from(a.built.model.clone()), ".")?;
    let whole = forms::inline(&built, &data)?;
    Ok(Model::from_bytes(Bytes::from(whole), ".")?)
}
