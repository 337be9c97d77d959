//! `ctcachectl`: the ctcache admin CLI. Exit codes: 0 success, 1 failure or
//! invalid input (message on stderr), 2 usage error.

use std::process::ExitCode;

use clap::Parser;
use ctcache_client::cli::{run, Cli, Failure};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) | Err(Failure::BrokenPipe) => ExitCode::SUCCESS,
        Err(Failure::Failed(msg)) => {
            eprintln!("ctcachectl: {msg}");
            ExitCode::FAILURE
        }
    }
}
