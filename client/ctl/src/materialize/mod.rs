//! `materialize`: an onnxruntime-ready model assembled by the daemon from
//! cached entries (reflinked or copied, hard-linked with `--link hard`):
//! `--target onnxruntime-int4` (MatMulNBits over `ort.matmul_nbits`) or
//! `onnxruntime-int8` (quantize_dynamic's graph over `ort.quantize_dynamic`);
//! without a daemon (or with `--local`), packed in this process into the
//! model's weights folder.

use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use ctcache::materialize::{self as mat, LinkMode, Recipe, Settings};
use serde_json::json;

use crate::ctx::Ctx;
use crate::human;
use crate::output::{print_json, say, Failure};
use ctcache_client::api;

mod bar;
mod local;

use local::materialize_local;

#[derive(Debug, Args)]
pub struct MaterializeArgs {
    /// The FLOAT (or FLOAT16) ONNX model.
    model: PathBuf,
    /// The model to write; its weights go to OUTPUT.weights/ next to it.
    #[arg(short, long)]
    output: PathBuf,
    /// What the model is for: onnxruntime-int4 (MatMulNBits),
    /// onnxruntime-int8 (quantize_dynamic: DynamicQuantizeLinear +
    /// MatMulInteger) or onnxruntime-fp16 (the float16 converter with
    /// keep_io_types: FLOAT16 weights, float inputs and outputs).
    #[arg(long, default_value = "onnxruntime-int4", value_parser = mat::TARGETS)]
    target: String,
    /// onnxruntime-int8: the quantized weight type (default int8, symmetric;
    /// uint8 is asymmetric, as quantize_dynamic).
    #[arg(long, value_parser = ["int8", "uint8"], value_name = "TYPE")]
    weight_type: Option<String>,
    /// onnxruntime-int8: one scale and zero point per output column.
    #[arg(long)]
    per_channel: bool,
    /// onnxruntime-int8: 7-bit weight ranges.
    #[arg(long)]
    reduce_range: bool,
    /// onnxruntime-int8: op types to quantize, comma-separated
    /// (op_types_to_quantize; supported: MatMul (the default), Gather, Conv).
    #[arg(long, value_delimiter = ',', value_name = "OPS")]
    op_types: Vec<String>,
    /// onnxruntime-fp16: op types kept in FLOAT behind Casts,
    /// comma-separated (the converter's op_block_list; '' keeps none;
    /// default: its DEFAULT_OP_BLOCK_LIST).
    #[arg(long, value_name = "OPS")]
    op_block_list: Option<String>,
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
    /// How the weight files are made from the cache's payload files.
    #[arg(long, value_enum, default_value_t = Link::Auto, value_name = "HOW")]
    link: Link,
    /// Same as --link copy.
    #[arg(long, conflicts_with = "link")]
    copy: bool,
    /// Pack in this process even when a daemon runs (no cache involved).
    #[arg(long)]
    local: bool,
    /// List every skipped node and its case (default: one line per reason).
    #[arg(short, long)]
    verbose: bool,
}

/// `--link`, as clap parses it (the variants' docs are its help).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Link {
    /// A reflink where the filesystem can (btrfs, XFS, bcachefs: no extra
    /// space), else a copy; onnx and onnxruntime load the model
    Auto,
    /// A reflink, or an error saying why none is possible
    Reflink,
    /// A copy
    Copy,
    /// Hard links into the cache (no bytes written, on any filesystem):
    /// onnxruntime loads the model, onnx >= 1.21 (onnx.load, onnx.checker)
    /// refuses it
    Hard,
}

impl MaterializeArgs {
    fn link_mode(&self) -> LinkMode {
        match (self.copy, self.link) {
            (true, _) | (_, Link::Copy) => LinkMode::Copy,
            (_, Link::Auto) => LinkMode::Auto,
            (_, Link::Reflink) => LinkMode::Reflink,
            (_, Link::Hard) => LinkMode::Hard,
        }
    }

    fn symmetric(&self) -> Option<bool> {
        match (self.symmetric, self.asymmetric) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    fn number<T: std::str::FromStr>(v: &Option<String>) -> Option<T> {
        v.as_deref().and_then(|b| b.parse().ok())
    }

    /// The target and its settings for a local run (the core's rule,
    /// `mat::Ask`); flags of another target are refused, naming them.
    fn recipe(&self) -> Result<Recipe, Failure> {
        let ask = mat::Ask {
            target: self.target.clone(),
            bits: MaterializeArgs::number(&self.bits),
            block_size: MaterializeArgs::number(&self.block_size),
            symmetric: self.symmetric(),
            accuracy_level: self.accuracy_level,
            weight_type: self.weight_type.clone(),
            per_channel: self.per_channel,
            reduce_range: self.reduce_range,
            op_types: self.op_types.clone(),
            op_block_list: self.op_block_list.as_deref().map(mat::op_list),
        };
        let convert = ctcache_kernels::formats::float16_clamp::convert_default;
        ask.recipe(Settings::default(), convert)
            .map_err(|e| match e {
                mat::AskError::Misplaced { setting, target } => Failure::Usage(
                    setting.refused_for(target, flag_name(setting), |t| format!("--target {t}")),
                ),
                mat::AskError::Invalid(e) => e.into(),
                e => Failure::Usage(e.to_string()),
            })
    }
}

/// A setting as its flag names it.
fn flag_name(s: mat::Setting) -> &'static str {
    use mat::Setting as S;
    match s {
        S::Bits => "--bits",
        S::BlockSize => "--block-size",
        S::Symmetric => "--symmetric/--asymmetric",
        S::AccuracyLevel => "--accuracy-level",
        S::WeightType => "--weight-type",
        S::PerChannel => "--per-channel",
        S::ReduceRange => "--reduce-range",
        S::OpTypes => "--op-types",
        S::OpBlockList => "--op-block-list",
    }
}

/// Through the daemon; here with `--local`, or when no socket was named
/// and none answers.
pub fn materialize(ctx: &Ctx, a: MaterializeArgs) -> Result<(), Failure> {
    // Flags of another target are refused before anything is asked or written.
    a.recipe()?;
    if !a.local && ctx.block_on(materialize_daemon(ctx, &a))? {
        return Ok(());
    }
    materialize_local(ctx, &a)
}

/// False when no daemon answers and the model is to be materialized here.
async fn materialize_daemon(ctx: &Ctx, a: &MaterializeArgs) -> Result<bool, Failure> {
    let Some(c) = ctx.connect_or_local("materializing").await? else {
        return Ok(false);
    };
    let started = Instant::now();
    let req = api::MaterializeRequest {
        model_path: a.model.display().to_string(),
        target: a.target.clone(),
        bits: MaterializeArgs::number(&a.bits),
        block_size: MaterializeArgs::number(&a.block_size),
        symmetric: a.symmetric(),
        accuracy_level: a.accuracy_level,
        weight_type: a.weight_type.clone().unwrap_or_default(),
        per_channel: a.per_channel,
        reduce_range: a.reduce_range,
        op_types: a.op_types.clone(),
        op_block_list: a.op_block_list.clone(),
        ..Default::default()
    };
    let call = c.materialize_for_file(req, &a.output);
    let mut call = Box::pin(call);
    let mut bar = None;
    let built = tokio::select! {
        r = &mut call => r,
        () = bar::follow(ctx, &c, &a.model, &mut bar) => unreachable!("follow never returns"),
        // The dropped call tells the daemon, which stops packing.
        _ = tokio::signal::ctrl_c() => {
            bar.inspect(|b: &indicatif::ProgressBar| b.finish_and_clear());
            return Err(crate::interrupt::interrupted("nothing was written"));
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let built = built?;
    // This process writes the model, with the user's own rights; Ctrl-C
    // stops the write, which removes what it made.
    let stop = crate::interrupt::on_ctrl_c_flag()?;
    let r = c.write_materialized(built, a.link_mode(), &stop).await?;
    report(ctx, a, "daemon", &r, started.elapsed())?;
    Ok(true)
}

fn report(
    ctx: &Ctx,
    a: &MaterializeArgs,
    via: &str,
    r: &api::MaterializeResponse,
    elapsed: std::time::Duration,
) -> Result<(), Failure> {
    if ctx.json {
        return print_json(&report_json(via, r, elapsed));
    }
    if ctx.quiet {
        return Ok(());
    }
    say(&format!(
        "{}: {} node(s) -> {}, {} weight(s) from the cache, {} packed now",
        r.output_path,
        r.nodes_rewritten,
        rewritten_to(r),
        r.cached,
        r.packed,
    ))?;
    let wrote = format!(
        "wrote {} in {}",
        human::size(r.model_bytes + r.bytes_copied),
        human::duration_us(elapsed.as_micros() as u64),
    );
    if r.files.is_empty() {
        // Every weight is in the model itself (an fp16 model whose weights
        // are Constant nodes): no weights folder to speak of.
        say(&format!("  every weight is in the model; {wrote}"))?;
    } else {
        say(&format!(
            "  {} of weights in {} (--link {}): {}; {wrote}",
            human::size(r.payload_bytes),
            r.data_dir,
            link_name(r.link),
            placed_summary(&r.files),
        ))?;
    }
    if r.files_linked > 0 {
        say(&format!(
            "  note: {} file(s) hard-linked into the cache: onnxruntime loads this model, \
             onnx >= 1.21 (onnx.load, onnx.checker) refuses it; --link auto gives files of their own",
            r.files_linked
        ))?;
    }
    say_skipped(r, a.verbose)
}

/// The answer as `--json` prints it.
fn report_json(
    via: &str,
    r: &api::MaterializeResponse,
    elapsed: std::time::Duration,
) -> serde_json::Value {
    json!({
        "via": via,
        "output": r.output_path,
        "data_dir": r.data_dir,
        "nodes_rewritten": r.nodes_rewritten,
        "initializers_removed": r.initializers_removed,
        "skipped": r.skipped.iter().map(|s| json!({
            "node": s.node, "op_type": s.op_type, "reason": s.reason, "detail": s.detail,
        })).collect::<Vec<_>>(),
        "packed": r.packed,
        "cached": r.cached,
        "link": link_name(r.link),
        "files": r.files.iter().map(|f| json!({
            "path": f.path, "method": ctcache_convert::materialize::place_method_name(f.method()), "bytes_copied": f.bytes_copied,
        })).collect::<Vec<_>>(),
        "files_reflinked": r.files_reflinked,
        "files_linked": r.files_linked,
        "files_copied": r.files_copied,
        "bytes_copied": r.bytes_copied,
        "model_bytes": r.model_bytes,
        "payload_bytes": r.payload_bytes,
        "target": r.target,
        "bits": r.bits,
        "block_size": r.block_size,
        "symmetric": r.symmetric,
        "accuracy_level": r.accuracy_level,
        "weight_type": r.weight_type,
        "per_channel": r.per_channel,
        "reduce_range": r.reduce_range,
        "op_types": r.op_types,
        "elapsed_us": elapsed.as_micros() as u64,
    })
}

/// What the nodes became, with the target's settings:
/// "MatMulNBits (4 bits, block 32, symmetric)".
fn rewritten_to(r: &api::MaterializeResponse) -> String {
    if r.target == mat::TARGET_ORT_FP16 {
        "FLOAT16 (float inputs and outputs kept)".to_string()
    } else if r.target == mat::TARGET_ORT_INT8 {
        format!(
            "{} ({}, {}{})",
            int8_ops(&r.op_types),
            r.weight_type,
            if r.per_channel {
                "per channel"
            } else {
                "per tensor"
            },
            if r.reduce_range {
                ", reduced range"
            } else {
                ""
            },
        )
    } else {
        format!(
            "MatMulNBits ({} bits, block {}, {})",
            r.bits,
            r.block_size,
            if r.symmetric {
                "symmetric"
            } else {
                "asymmetric"
            },
        )
    }
}

/// What quantize_dynamic makes of the op types asked: "MatMulInteger,
/// ConvInteger".
fn int8_ops(op_types: &[String]) -> String {
    let made: Vec<&str> = op_types
        .iter()
        .map(|o| match o.as_str() {
            "Conv" => "ConvInteger",
            "Gather" => "Gather of a quantized table",
            _ => "MatMulInteger",
        })
        .collect();
    if made.is_empty() {
        "MatMulInteger".into()
    } else {
        made.join(", ")
    }
}

/// Nodes left as they are (expected for attention MatMuls): a summary
/// after the result, one line per reason (`verbose`: one per node).
fn say_skipped(r: &api::MaterializeResponse, verbose: bool) -> Result<(), Failure> {
    let groups = mat::group_skips(
        r.skipped
            .iter()
            .map(|s| (s.op_type.as_str(), s.reason.as_str())),
    );
    for g in &groups {
        say(&format!("  {g}"))?;
        if verbose {
            for s in r
                .skipped
                .iter()
                .filter(|s| s.op_type == g.op_type && s.reason == g.reason)
            {
                say(&format!("    {} {}: {}", s.op_type, s.node, s.detail))?;
            }
        }
    }
    Ok(())
}

fn link_name(link: i32) -> &'static str {
    api::LinkMode::try_from(link).map_or("unknown", |m| {
        ctcache_convert::materialize::link_mode_of(m).name()
    })
}

/// "8 reflinked, 1 copied": how many files each method placed.
fn placed_summary(files: &[api::MaterializeFile]) -> String {
    let mut parts = Vec::new();
    for (method, said) in [
        (api::PlaceMethod::Reflink, "reflinked"),
        (api::PlaceMethod::Copy, "copied"),
        (api::PlaceMethod::HardLink, "hard-linked"),
        (api::PlaceMethod::InPlace, "packed here"),
    ] {
        let n = files.iter().filter(|f| f.method() == method).count();
        if n > 0 {
            parts.push(format!("{n} file(s) {said}"));
        }
    }
    parts.join(", ")
}
