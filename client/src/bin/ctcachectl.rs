//! `ctcachectl`: the ctcache admin CLI. Exit codes: 0 success, 1 failure or
//! invalid input, 2 usage error, 3 daemon not reachable (message on stderr).

use std::process::ExitCode;

use clap::Parser;
use ctcache_client::cli::{run, Cli};

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if let Some(msg) = f.message() {
                eprintln!("ctcachectl: {msg}");
            }
            ExitCode::from(f.exit_code())
        }
    }
}
