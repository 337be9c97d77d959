//! What `ctcachectl materialize` says of a built model: the human summary
//! and the `--json` answer.

use ctcache::materialize as mat;
use serde_json::json;

use super::args::MaterializeArgs;
use crate::ctx::Ctx;
use crate::human;
use crate::output::{print_json, say, Failure};
use ctcache_client::api;

pub(super) fn report(
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
