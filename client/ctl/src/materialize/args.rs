//! `ctcachectl materialize`'s arguments, and the target settings they ask
//! for (the core's rule, `mat::Ask`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use ctcache::materialize::{self as mat, LinkMode, Recipe, Settings};

use crate::output::Failure;

#[derive(Debug, Args)]
pub struct MaterializeArgs {
    /// The FLOAT (or FLOAT16) ONNX model.
    pub(super) model: PathBuf,
    /// The model to write; its weights go to OUTPUT.weights/ next to it.
    #[arg(short, long)]
    pub(super) output: PathBuf,
    /// What the model is for: onnxruntime-int4 (MatMulNBits),
    /// onnxruntime-int8 (quantize_dynamic: DynamicQuantizeLinear +
    /// MatMulInteger) or onnxruntime-fp16 (the float16 converter with
    /// keep_io_types: FLOAT16 weights, float inputs and outputs).
    #[arg(long, default_value = "onnxruntime-int4", value_parser = mat::TARGETS)]
    pub(super) target: String,
    /// onnxruntime-int8: the quantized weight type (default int8, symmetric;
    /// uint8 is asymmetric, as quantize_dynamic).
    #[arg(long, value_parser = ["int8", "uint8"], value_name = "TYPE")]
    pub(super) weight_type: Option<String>,
    /// onnxruntime-int8: one scale and zero point per output column.
    #[arg(long)]
    pub(super) per_channel: bool,
    /// onnxruntime-int8: 7-bit weight ranges.
    #[arg(long)]
    pub(super) reduce_range: bool,
    /// onnxruntime-int8: op types to quantize, comma-separated
    /// (op_types_to_quantize; supported: MatMul (the default), Gather, Conv).
    #[arg(long, value_delimiter = ',', value_name = "OPS")]
    pub(super) op_types: Vec<String>,
    /// onnxruntime-fp16: op types kept in FLOAT behind Casts,
    /// comma-separated (the converter's op_block_list; '' keeps none;
    /// default: its DEFAULT_OP_BLOCK_LIST).
    #[arg(long, value_name = "OPS")]
    pub(super) op_block_list: Option<String>,
    /// Bits per weight (default: the daemon's policy, else 4).
    #[arg(long, value_parser = ["4", "8"])]
    pub(super) bits: Option<String>,
    /// Weights per scale (default: the daemon's policy, else 32).
    #[arg(long, value_parser = ["16", "32", "64", "128", "256"])]
    pub(super) block_size: Option<String>,
    /// No zero points (default: the daemon's policy, else symmetric).
    #[arg(long, conflicts_with = "asymmetric")]
    pub(super) symmetric: bool,
    /// Per-block zero points.
    #[arg(long)]
    pub(super) asymmetric: bool,
    /// MatMulNBits accuracy_level (0 leaves the attribute out).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..=4))]
    pub(super) accuracy_level: i64,
    /// How the weight files are made from the cache's payload files.
    #[arg(long, value_enum, default_value_t = Link::Auto, value_name = "HOW")]
    link: Link,
    /// Same as --link copy.
    #[arg(long, conflicts_with = "link")]
    pub(super) copy: bool,
    /// Pack in this process even when a daemon runs (no cache involved).
    #[arg(long)]
    pub(super) local: bool,
    /// List every skipped node and its case (default: one line per reason).
    #[arg(short, long)]
    pub(super) verbose: bool,
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
    pub(super) fn link_mode(&self) -> LinkMode {
        match (self.copy, self.link) {
            (true, _) | (_, Link::Copy) => LinkMode::Copy,
            (_, Link::Auto) => LinkMode::Auto,
            (_, Link::Reflink) => LinkMode::Reflink,
            (_, Link::Hard) => LinkMode::Hard,
        }
    }

    pub(super) fn symmetric(&self) -> Option<bool> {
        match (self.symmetric, self.asymmetric) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    pub(super) fn number<T: std::str::FromStr>(v: &Option<String>) -> Option<T> {
        v.as_deref().and_then(|b| b.parse().ok())
    }

    /// The target and its settings for a local run (the core's rule,
    /// `mat::Ask`); flags of another target are refused, naming them.
    pub(super) fn recipe(&self) -> Result<Recipe, Failure> {
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
