//! `ctcachectl compile`: the daemon makes a runtime's own compiled form of
//! a model (D15), once per key, or says why it has none.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::ctx::Ctx;
use crate::json;
use crate::output::{print_json, say, Failure};
use ctcache_client::api;

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// The runtime whose form to make (the daemon's configured library).
    #[arg(long, default_value = "onnxruntime", value_parser = ["onnxruntime"])]
    runtime: String,
    /// onnxruntime's graph optimization level the form is made at.
    #[arg(long, default_value = "extended", value_parser = ["basic", "extended", "layout", "all"])]
    level: String,
    /// Look only: say whether a form is stored, and which part of the key
    /// differs when not, without compiling.
    #[arg(long)]
    lookup: bool,
}

pub async fn compile(ctx: &Ctx, a: CompileArgs) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let r = c
        .compile(api::CompileRequest {
            model_path: a.model.display().to_string(),
            runtime: a.runtime.clone(),
            level: a.level.clone(),
            lookup_only: a.lookup,
            // The answer is printed, not mapped: the lease may end at once.
            lease_ttl_ms: 1,
            ..Default::default()
        })
        .await?;
    let entry = r.form.as_ref().and_then(|f| f.entry.as_ref());
    let compile = Duration::from_micros(r.compile_us);
    if ctx.json {
        print_json(&json!({
            "model": a.model.display().to_string(),
            "runtime": a.runtime,
            "level": a.level,
            "model_digest": hex::encode(&r.model_digest),
            "compiled": r.compiled,
            "compile_seconds": compile.as_secs_f64(),
            "form": entry.map(json::entry),
            "weights": r.tensors.iter().map(|t| json!({
                "name": t.name, "key": t.key, "length": t.length,
            })).collect::<Vec<_>>(),
            "miss": r.miss.as_ref().map(json::miss),
        }))?;
    } else if !ctx.quiet {
        match (entry, &r.miss) {
            (Some(e), _) => say(&format!(
                "{}: {} form at level {}: {} (its model {} bytes, {} weight(s) in {} bytes of \
                 entries of their own; {})",
                a.model.display(),
                a.runtime,
                a.level,
                if r.compiled {
                    format!("compiled in {:.2} s", compile.as_secs_f64())
                } else {
                    "stored".to_string()
                },
                e.payload_len,
                r.tensors.len(),
                r.tensors.iter().map(|t| t.length).sum::<u64>(),
                e.key
            ))?,
            (None, m) => {
                let m = m.clone().unwrap_or_default();
                say(&format!(
                    "{}: no {} form at level {}: {}: {}",
                    a.model.display(),
                    a.runtime,
                    a.level,
                    m.reason,
                    m.detail
                ))?
            }
        }
    }
    match (&r.form, &r.miss) {
        (None, Some(m)) if !a.lookup => Err(Failure::Failed(format!(
            "{}: no form: {}",
            a.model.display(),
            m.detail
        ))),
        _ => Ok(()),
    }
}
