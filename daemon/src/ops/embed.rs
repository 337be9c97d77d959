//! The Embed use case: a model -> a new model with compiled tensors
//! embedded (packing what is missing first), written with the
//! byte-preserving rewrite into the files the caller made and handed over.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ctcache::onnx::rewrite::{self, Mode, RewriteOptions};
use ctcache::outdir::{OutDir, OutFile};

use super::model::{self, FormatRequest};
use super::pack::{self, BackendRequest};
use super::{blocking, serve, Result};
use crate::caller::Caller;
use crate::handouts::Outputs;
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
    // The daemon writes nothing where a caller points (D14): only into the
    // files the caller made and handed over with its model.
    let handed = match r.handout.is_empty() {
        true => None,
        false => d.handouts.outputs(&r.handout, caller)?,
    };
    let Some(handed) = handed else {
        return Err(super::Error::invalid(format!(
            "{}: ctcached writes no file where a caller points; the client makes the output's \
             files and hands them over with the model, as ctcachectl and the client libraries do",
            r.output_path
        )));
    };
    let out = handed_output(&handed, &r.output_path)?;
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
    let (entries, packed) = pack::finish(d, &r.model_path, jobs).await?;
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
        let files = (&handed.model, &handed.sidecar);
        let report = rewrite::embed_handed(&m.model, &news, &out, files, mode, &opts)?;
        // The model and its sidecar are the caller's: it made them.
        Ok(Embedded {
            output_path: out.path(),
            entries: report.entries as u32,
            packed,
            report,
        })
    })
    .await
}

/// The output a caller made and handed over: its folder (read through the
/// caller's descriptor only) and the name `output_path` gives the model.
fn handed_output(o: &Outputs, output_path: &str) -> Result<OutFile> {
    let path = Path::new(output_path);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(super::Error::invalid(
            "output_path needs a folder and a file name",
        ));
    };
    let folder = o
        .folder
        .try_clone()
        .map_err(|e| super::Error::internal(format!("the output folder: {e}")))?;
    Ok(OutFile {
        dir: OutDir::from_open(folder, dir),
        name: name.to_os_string(),
    })
}
