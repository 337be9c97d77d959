//! `ctcachectl`: the ctcache admin CLI. Exit codes: 0 success, 1 failure or
//! invalid input, 2 usage error, 3 daemon not reachable, 4-7 refusals a
//! script may act on (see `output::Refusal`); messages on stderr.

mod admin;
mod cli;
mod compile;
mod ctx;
mod daemon_cmds;
mod extras;
mod human;
mod interrupt;
mod jobs;
mod json;
mod materialize;
mod offline;
mod output;
mod packing;
mod remote;
mod watch;
mod why_miss;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    match cli::run(cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if let Some(msg) = f.message() {
                eprintln!("ctcachectl: {msg}");
            }
            ExitCode::from(f.exit_code())
        }
    }
}
