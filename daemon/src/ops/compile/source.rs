//! The model a form is made of: a model opened as it is, or a target's
//! model, materialized in memory with its payloads' bytes put back inline
//! (the worker reads no file), and that model's digest (D15: the content
//! compiled). A target model's digest is remembered by the identity of the
//! in-memory answer (its model's bytes and, for each payload-backed
//! initializer, the payload's blake3 and range), which fixes the whole
//! model's bytes: a warm request then puts nothing inline and hashes
//! nothing, and the whole model is made only when a compile needs it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use ctcache::forms;
use ctcache::onnx::Model;

use super::super::materialize::{self, InMemoryAnswer, MaterializeRequest};
use super::super::{blocking, model, payload_access, serve, Error, Result};
use crate::caller::Caller;
use crate::locks::lock;
use crate::state::Daemon;

/// The model a form is made of.
pub(crate) enum Source {
    Opened(model::OpenedModel),
    /// A target's model, made whole only when a compile needs it.
    Target(Box<Pending>),
}

impl Source {
    /// The path the model was asked by.
    pub(super) fn path(&self) -> &std::path::Path {
        match self {
            Source::Opened(m) => &m.path,
            Source::Target(p) => &p.path,
        }
    }

    /// The model, whole.
    pub(super) async fn opened(self) -> Result<model::OpenedModel> {
        match self {
            Source::Opened(m) => Ok(m),
            Source::Target(p) => p.whole().await,
        }
    }
}

/// A target's materialized model: its digest, and what makes it whole.
pub(crate) struct Pending {
    d: Arc<Daemon>,
    caller: Caller,
    pub path: PathBuf,
    answer: InMemoryAnswer,
}

/// The target's model of `r`'s model and its digest: made whole at once
/// when the digest is not remembered, else pending until a compile needs
/// it.
pub(super) async fn materialized(
    d: &Arc<Daemon>,
    caller: &Caller,
    r: MaterializeRequest,
) -> Result<(Source, [u8; 32])> {
    let path = PathBuf::from(&r.model_path);
    let made = materialize::materialize(d, caller, r).await?;
    let pending = Pending {
        d: d.clone(),
        caller: caller.clone(),
        path,
        answer: made.answer,
    };
    let identity = pending.identity()?;
    if let Some(digest) = lock(&d.target_digests).get(&identity).copied() {
        return Ok((Source::Target(Box::new(pending)), digest));
    }
    let opened = pending.whole().await?;
    let digest = blocking(move || {
        forms::model_digest(&opened.model)
            .map(|digest| (opened, digest))
            .map_err(|e| Error::invalid(e.to_string()))
    })
    .await?;
    lock(&d.target_digests).insert(identity, digest.1);
    Ok((Source::Opened(digest.0), digest.1))
}

impl Pending {
    /// What fixes the whole model's bytes: the answer's model, and each
    /// payload-backed initializer's name, payload digest and range.
    fn identity(&self) -> Result<[u8; 32]> {
        let a = &self.answer;
        let mut h = blake3::Hasher::new();
        h.update(&(a.built.model.len() as u64).to_le_bytes());
        h.update(&a.built.model);
        for t in &a.built.tensors {
            let e = a
                .entries
                .get(&t.file_name)
                .ok_or_else(|| Error::internal(format!("no entry for {}", t.file_name)))?;
            h.update(&(t.name.len() as u64).to_le_bytes());
            h.update(t.name.as_bytes());
            h.update(&e.payload.blake3);
            h.update(&t.offset.to_le_bytes());
            h.update(&t.length.to_le_bytes());
        }
        Ok(*h.finalize().as_bytes())
    }

    /// The whole model (its leases released once its bytes are read).
    pub(super) async fn whole(self) -> Result<model::OpenedModel> {
        blocking(move || {
            let m = whole(&self.d, &self.caller, &self.answer)?;
            // Every payload-backed initializer is inline: nothing to open.
            if let Some(name) =
                forms::external_initializer(&m).map_err(|e| Error::internal(e.to_string()))?
            {
                return Err(Error::internal(format!(
                    "the materialized model holds {name:?} as external data"
                )));
            }
            Ok(model::OpenedModel {
                path: self.path.clone(),
                model: Arc::new(m),
            })
        })
        .await
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        for g in &self.answer.leased.leases {
            let _ = payload_access::release(&self.d, &self.caller, g.id);
        }
    }
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
