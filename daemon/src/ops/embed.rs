//! The Embed use case: a model -> a new model with compiled tensors
//! embedded (packing what is missing first), written next to the caller's
//! other files with the byte-preserving rewrite.

use std::path::PathBuf;
use std::sync::Arc;

use ctcache::onnx::rewrite::{self, Mode, RewriteOptions};

use super::model::{self, FormatRequest};
use super::output::output_file;
use super::pack::{self, BackendRequest};
use super::{blocking, serve, Result};
use crate::caller::Caller;
use crate::scheduler::Priority;
use crate::state::Daemon;

/// An Embed request.
#[derive(Debug, Clone, Default)]
pub(crate) struct EmbedRequest {
    pub model_path: String,
    /// A descriptor channel handout to read the model from instead.
    pub handout: String,
    pub output_path: String,
    /// Empty: the daemon's policy.
    pub formats: Vec<FormatRequest>,
    /// Every payload to the sidecar file.
    pub sidecar: bool,
    /// Drop the compiled tensors already in the model.
    pub replace: bool,
    /// The output may be the model itself (rewritten in place).
    pub force: bool,
}

/// What Embed wrote.
#[derive(Debug, Clone)]
pub(crate) struct Embedded {
    pub output_path: PathBuf,
    pub entries: u32,
    /// Entries that had to be packed now.
    pub packed: u32,
    pub report: rewrite::Report,
}

/// The Embed use case.
pub(crate) async fn embed(d: &Arc<Daemon>, caller: &Caller, r: EmbedRequest) -> Result<Embedded> {
    tracing::info!(caller = %caller.describe(), model = %r.model_path, output = %r.output_path, "embed");
    let out = output_file(caller, &r.output_path)?;
    let (d2, c2, r2) = (d.clone(), caller.clone(), r.clone());
    let (m, jobs, out) = blocking(move || {
        let m = model::open(&d2, &r2.model_path, &r2.handout, &c2)?;
        if !r2.force {
            out.refuse_input(
                m.model.stamp(),
                "model",
                Some("choose another path, or add --force (EmbedRequest.force) to rewrite it in place"),
            )
            .map_err(ctcache::Error::from)?;
        }
        let sel = model::wanted(&d2, &m.model, &r2.formats, &[])?;
        if sel.wanted.is_empty() {
            return Err(model::nothing_to_pack(&d2, &m.path, &sel, &r2.formats));
        }
        let jobs = pack::submit_all(
            &d2,
            &m,
            &sel.wanted,
            (c2.bounded_uid(), Priority::Client),
            BackendRequest::Auto,
        )?;
        Ok((m, jobs, out))
    })
    .await?;
    let (entries, packed) = pack::finish(jobs).await?;
    let (d, caller) = (d.clone(), caller.clone());
    blocking(move || {
        let mut news = Vec::with_capacity(entries.len());
        for (w, e) in &entries {
            let payload = serve::open(&d, &caller, e)?;
            news.push(rewrite::NewEntry {
                source_name: w.initializer.clone(),
                device: e.device.clone(),
                struct_type: e.physical_type()?,
                dims: e.dims.clone(),
                payload: bytes::Bytes::copy_from_slice(serve::checked(
                    &d,
                    &caller,
                    e,
                    &payload,
                    0..payload.len(),
                )?),
                source_digest: e.key.source.bytes.to_vec(),
                digest_algorithm: e.key.source.algorithm.name().into(),
                metadata_props: vec![],
            });
        }
        let opts = RewriteOptions {
            all_to_sidecar: r.sidecar,
            ..Default::default()
        };
        let mode = if r.replace { Mode::Replace } else { Mode::Add };
        let report = rewrite::embed_into(&m.model, &news, &out, mode, &opts)?;
        // The model and its sidecar went to the caller as they were made.
        Ok(Embedded {
            output_path: out.path(),
            entries: report.entries as u32,
            packed,
            report,
        })
    })
    .await
}
