//! `ctcache-onnxruntime-worker`: ctcached's onnxruntime worker (not a user
//! command). `identify` prints the library's identity as JSON; `optimize`
//! reads a model on its standard input, writes the optimized model to
//! descriptor 3, the one file the daemon gives it, and prints the identity
//! of the onnxruntime that made it. Exit 2: the library is
//! not a usable onnxruntime; 3: onnxruntime refuses the model.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ctcache_onnxruntime_worker::{identify, optimize, Level, WorkerError};

#[derive(Parser)]
#[command(about = "ctcached's onnxruntime worker")]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the library's runtime, version and build as JSON.
    Identify {
        #[arg(long)]
        library: PathBuf,
    },
    /// Optimize the model on standard input; write it to descriptor 3.
    Optimize {
        #[arg(long)]
        library: PathBuf,
        #[arg(long, value_enum)]
        level: Level,
    },
}

/// The output descriptor, as onnxruntime opens a path.
const OUTPUT: &str = "/proc/self/fd/3";

fn main() -> ExitCode {
    let args = Args::parse();
    let done = match args.command {
        Command::Identify { library } => identify(&library).map(|id| {
            println!("{}", serde_json::to_string(&id).unwrap_or_default());
        }),
        Command::Optimize { library, level } => {
            if !std::fs::metadata(OUTPUT).is_ok_and(|m| m.is_file()) {
                eprintln!("the optimized model was not written: descriptor 3 is not a file");
                return ExitCode::from(1);
            }
            let mut model = Vec::new();
            if let Err(e) = std::io::stdin().lock().read_to_end(&mut model) {
                eprintln!("reading the model: {e}");
                return ExitCode::from(1);
            }
            optimize(&library, level, &model, OUTPUT.as_ref()).map(|id| {
                println!("{}", serde_json::to_string(&id).unwrap_or_default());
            })
        }
    };
    match done {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(match e {
                WorkerError::NotTheRuntime { .. } => 2,
                WorkerError::Refused(_) => 3,
                WorkerError::NoOutput(_) => 1,
            })
        }
    }
}
