//! `materialize`: an onnxruntime-ready 4/8-bit model assembled by the daemon
//! from cached `ort.matmul_nbits` entries (hard links, not copies).

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde_json::json;

use super::ctx::Ctx;
use super::format;
use super::output::{print_json, say, Failure};
use crate::client::api;

#[derive(Debug, Args)]
pub struct MaterializeArgs {
    /// The FLOAT (or FLOAT16) ONNX model.
    model: PathBuf,
    /// The model to write; its weights go to OUTPUT.weights/ next to it.
    #[arg(short, long)]
    output: PathBuf,
    /// What the model is for.
    #[arg(long, default_value = "onnxruntime-int4", value_parser = ["onnxruntime-int4"])]
    target: String,
    /// Bits per weight (default: the daemon's policy, else 4).
    #[arg(long, value_parser = ["4", "8"])]
    bits: Option<String>,
    /// Weights per scale (default: the daemon's policy, else 32).
    #[arg(long, value_parser = ["16", "32", "64", "128", "256"])]
    block_size: Option<String>,
    /// No zero points (default: the daemon's policy, else symmetric).
    #[arg(long, conflicts_with = "asymmetric")]
    symmetric: bool,
    /// Per-block zero points.
    #[arg(long)]
    asymmetric: bool,
    /// MatMulNBits accuracy_level (0 leaves the attribute out).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..=4))]
    accuracy_level: i64,
    /// Copy the payloads instead of hard-linking them to the cache.
    #[arg(long)]
    copy: bool,
}

pub async fn materialize(ctx: &Ctx, a: MaterializeArgs) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let started = Instant::now();
    let r = c
        .materialize(api::MaterializeRequest {
            model_path: a.model.display().to_string(),
            output_path: a.output.display().to_string(),
            target: a.target.clone(),
            bits: a.bits.as_deref().and_then(|b| b.parse().ok()),
            block_size: a.block_size.as_deref().and_then(|b| b.parse().ok()),
            symmetric: match (a.symmetric, a.asymmetric) {
                (true, _) => Some(true),
                (_, true) => Some(false),
                _ => None,
            },
            accuracy_level: a.accuracy_level,
            copy: a.copy,
        })
        .await?;
    let elapsed = started.elapsed();
    if ctx.json {
        return print_json(&json!({
            "output": r.output_path,
            "data_dir": r.data_dir,
            "nodes_rewritten": r.nodes_rewritten,
            "initializers_removed": r.initializers_removed,
            "skipped": r.skipped.iter().map(|s| json!({
                "node": s.node, "op_type": s.op_type, "reason": s.reason,
            })).collect::<Vec<_>>(),
            "packed": r.packed,
            "cached": r.cached,
            "files_linked": r.files_linked,
            "files_copied": r.files_copied,
            "bytes_copied": r.bytes_copied,
            "model_bytes": r.model_bytes,
            "payload_bytes": r.payload_bytes,
            "bits": r.bits,
            "block_size": r.block_size,
            "symmetric": r.symmetric,
            "accuracy_level": r.accuracy_level,
            "elapsed_us": elapsed.as_micros() as u64,
        }));
    }
    if ctx.quiet {
        return Ok(());
    }
    for s in &r.skipped {
        say(&format!("skipped {} {}: {}", s.op_type, s.node, s.reason))?;
    }
    say(&format!(
        "{}: {} node(s) -> MatMulNBits ({} bits, block {}, {}), {} weight(s) from the cache, {} packed now",
        r.output_path,
        r.nodes_rewritten,
        r.bits,
        r.block_size,
        if r.symmetric { "symmetric" } else { "asymmetric" },
        r.cached,
        r.packed,
    ))?;
    say(&format!(
        "  {} of weights in {}: {} file(s) linked, {} copied; wrote {} in {}",
        format::size(r.payload_bytes),
        r.data_dir,
        r.files_linked,
        r.files_copied,
        format::size(r.model_bytes + r.bytes_copied),
        format::duration_us(elapsed.as_micros() as u64),
    ))
}
