//! Hidden helper commands for packagers: shell completions and the man page,
//! generated from the same clap definition as the parser (the caller hands
//! it over: the parser's module dispatches to these).

use std::io::Write;
use std::path::Path;

use clap_complete::Shell;

use crate::output::Failure;

/// Rendered into memory first: clap_complete panics on a write error, and a
/// closed pipe (`| head`) must stay a quiet exit 0.
pub fn completions(cli: clap::Command, shell: Shell) -> Result<(), Failure> {
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut visible(cli), "ctcachectl", &mut buf);
    std::io::stdout().lock().write_all(&buf)?;
    Ok(())
}

/// `cmd` without its hidden subcommands (`completions`, `man`): the
/// generators offer every subcommand they are given.
fn visible(mut cmd: clap::Command) -> clap::Command {
    cmd.build();
    let top = clap::Command::new("ctcachectl")
        .disable_help_subcommand(true)
        .args(
            cmd.get_arguments()
                .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
                .cloned(),
        )
        .subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
        .version(env!("CARGO_PKG_VERSION"));
    top
}

/// The top page of `cli` on stdout, or, with `dir`, a page for every
/// command that is not hidden (`ctcachectl.1`, `ctcachectl-gc.1`,
/// `ctcachectl-watch-add.1`).
pub fn man(cli: clap::Command, dir: Option<&Path>) -> Result<(), Failure> {
    if let Some(dir) = dir {
        return clap_mangen::generate_to(cli, dir)
            .map_err(|e| Failure::Failed(format!("writing man pages to {}: {e}", dir.display())));
    }
    let mut buf = Vec::new();
    clap_mangen::Man::new(cli).render(&mut buf)?;
    std::io::stdout().lock().write_all(&buf)?;
    Ok(())
}
