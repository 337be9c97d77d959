//! `ctcache-onnxruntime-worker`: ctcached's onnxruntime worker (not a user
//! command). `identify` prints the library's identity as JSON; `optimize`
//! reads a model on its standard input, writes the optimized model to
//! descriptor 3, the one file the daemon gives it, and prints the identity
//! of the onnxruntime that made it. Exit 2: the library is
//! not a usable onnxruntime; 3: onnxruntime refuses the model; 4: out of its
//! memory bound (a failed allocation, or a crash near RLIMIT_DATA).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ctcache_onnxruntime_worker::{identify, optimize, Level};
use ctcache_worker_protocol::{finish, model_in, name_crashes_near_the_bound, OUTPUT};

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

fn main() -> ExitCode {
    name_crashes_near_the_bound();
    let done = match Args::parse().command {
        Command::Identify { library } => identify(&library),
        Command::Optimize { library, level } => match model_in("optimized model") {
            Ok(model) => optimize(&library, level, &model, OUTPUT.as_ref()),
            Err(code) => return code,
        },
    };
    finish(done)
}
