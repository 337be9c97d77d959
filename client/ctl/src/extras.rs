//! Hidden helper commands for packagers: shell completions and the man page,
//! generated from the same clap definition as the parser.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::output::Failure;

/// Rendered into memory first: clap_complete panics on a write error, and a
/// closed pipe (`| head`) must stay a quiet exit 0.
pub fn completions(shell: Shell) -> Result<(), Failure> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "ctcachectl", &mut buf);
    std::io::stdout().lock().write_all(&buf)?;
    Ok(())
}

pub fn man() -> Result<(), Failure> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut buf)?;
    std::io::stdout().lock().write_all(&buf)?;
    Ok(())
}
