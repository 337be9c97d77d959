//! `ctcachectl`: argument parsing and dispatch. Each command group lives in
//! its own module over library calls; this file only wires them.

mod offline;
mod output;

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
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    match cli.command {
        Command::Check { model } => offline::check(&model, json),
        Command::Digest { model, algorithm } => offline::digest(&model, &algorithm, json),
        Command::Inspect { model } => offline::inspect(&model, json),
        Command::Strip { model, output } => offline::strip(&model, &output),
    }
}
