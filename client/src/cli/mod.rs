//! `ctcachectl`: argument parsing and dispatch. Each command group lives in
//! its own module over library calls; this file only wires them.

mod offline;
mod output;
mod packing;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub use output::Failure;

/// The ctcache admin tool.
#[derive(Debug, Parser)]
#[command(
    name = "ctcachectl",
    version,
    about = "Inspect, check and manage compiled ONNX tensors"
)]
pub struct Cli {
    /// Machine-readable JSON output.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate a model's compiled tensors (structural rules; no hardware needed).
    Check { model: PathBuf },
    /// Print the canonical source digest of every top-level initializer.
    Digest {
        model: PathBuf,
        /// blake3 (default) or sha256.
        #[arg(long, default_value = "blake3", value_parser = ["blake3", "sha256"])]
        algorithm: String,
    },
    /// List the compiled tensors and whether each is usable on this host.
    Inspect { model: PathBuf },
    /// Write a copy of the model without compiled tensors (all else byte-for-byte).
    Strip {
        model: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
    },
    /// The devices of this host, as compiled tensors describe them.
    Devices {
        /// Detect locally instead of asking the daemon.
        #[arg(long)]
        local: bool,
    },
    /// The packers (formats) of this build and their parameters.
    Formats,
    /// Pack one initializer and write the raw payload (what a cache entry stores).
    Pack {
        model: PathBuf,
        #[arg(long)]
        initializer: String,
        #[arg(long)]
        format: String,
        /// Packer parameter, k=v (repeatable).
        #[arg(long = "param")]
        params: Vec<String>,
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "wgpu"])]
        backend: String,
        #[arg(short, long)]
        output: PathBuf,
        /// Also write the payload's StructTypeProto (binary protobuf).
        #[arg(long)]
        type_out: Option<PathBuf>,
    },
    /// Pack initializers locally and embed them into a copy of the model.
    Embed {
        model: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        #[arg(long)]
        format: String,
        #[arg(long = "param")]
        params: Vec<String>,
        /// Initializers to compile (repeatable; default: all the format accepts).
        #[arg(long = "initializer")]
        initializers: Vec<String>,
        /// Put every payload in the sidecar file (default: payloads >= 1 MiB).
        #[arg(long)]
        sidecar: bool,
        /// Drop compiled tensors already in the model.
        #[arg(long)]
        replace: bool,
    },
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    match cli.command {
        Command::Check { model } => offline::check(&model, json),
        Command::Digest { model, algorithm } => offline::digest(&model, &algorithm, json),
        Command::Inspect { model } => offline::inspect(&model, json),
        Command::Strip { model, output } => offline::strip(&model, &output),
        Command::Devices { local: _ } => packing::devices(json),
        Command::Formats => packing::formats(json),
        Command::Pack {
            model,
            initializer,
            format,
            params,
            backend,
            output,
            type_out,
        } => packing::pack(
            packing::PackArgs {
                model: &model,
                initializer: &initializer,
                format: &format,
                params: &params,
                backend: &backend,
                output: &output,
                type_out: type_out.as_deref(),
            },
            json,
        ),
        Command::Embed {
            model,
            output,
            format,
            params,
            initializers,
            sidecar,
            replace,
        } => packing::embed(
            packing::EmbedArgs {
                model: &model,
                output: &output,
                format: &format,
                params: &params,
                initializers: &initializers,
                sidecar,
                replace,
            },
            json,
        ),
    }
}
