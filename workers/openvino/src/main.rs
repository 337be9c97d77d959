//! `ctcache-openvino-worker`: ctcached's OpenVINO worker (not a user
//! command). `identify` prints the library's identity as JSON; `compile`
//! reads an ONNX model on its standard input, writes the compiled model to
//! descriptor 3, the one file the daemon gives it, and prints the identity
//! of the OpenVINO that made it. Exit 2: the library is not a usable
//! OpenVINO; 3: OpenVINO refuses the model or its options; 4: out of its
//! memory bound (a failed allocation, or a crash near RLIMIT_DATA).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ctcache_openvino_worker::{compile, identify};
use ctcache_worker_protocol::{finish, model_in, name_crashes_near_the_bound, option, OUTPUT};

#[derive(Parser)]
#[command(about = "ctcached's OpenVINO worker")]
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
    /// Compile the ONNX model on standard input; export it to descriptor 3.
    Compile {
        #[arg(long)]
        library: PathBuf,
        #[arg(long, default_value = "CPU")]
        device: String,
        /// A property of compile_model's config, NAME=VALUE (repeatable).
        #[arg(long = "config", value_parser = option)]
        config: Vec<(String, String)>,
    },
}

fn main() -> ExitCode {
    name_crashes_near_the_bound();
    let done = match Args::parse().command {
        Command::Identify { library } => identify(&library),
        Command::Compile {
            library,
            device,
            config,
        } => match model_in("compiled model") {
            Ok(model) => compile(&library, &device, &config, &model, OUTPUT.as_ref()),
            Err(code) => return code,
        },
    };
    finish(done)
}
