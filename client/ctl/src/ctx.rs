//! Global options and what every command gets from them: JSON or human
//! output, quiet, colour, and (for daemon commands) a runtime and a client.

use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::format::{paint, Style};
use crate::output::Failure;
use ctcache_client::Client;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// Options every command accepts, before or after its name.
#[derive(Debug, Args)]
pub struct Global {
    /// The daemon's socket (default: $CTCACHE_SOCKET, else $XDG_RUNTIME_DIR/ctcache/ctcached.sock, else ~/.cache/ctcache/ctcached.sock).
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Machine-readable JSON output (shapes: docs/CLI.md).
    #[arg(long, global = true)]
    pub json: bool,
    /// No notes, progress bars or confirmations; errors and results stay.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Colour in human output (auto: only on a terminal, and not with NO_COLOR).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN")]
    pub color: ColorChoice,
}

/// What a command runs with.
pub struct Ctx {
    pub json: bool,
    pub quiet: bool,
    pub color: bool,
    pub socket: Option<PathBuf>,
}

impl Ctx {
    pub fn new(g: Global) -> Ctx {
        let color = match g.color {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            }
        };
        Ctx {
            json: g.json,
            quiet: g.quiet,
            color,
            socket: g.socket,
        }
    }

    /// Runs a daemon command's future on a current-thread runtime: the CLI
    /// does one thing at a time, and offline commands never pay for one.
    pub fn block_on<F: Future<Output = Result<(), Failure>>>(&self, f: F) -> Result<(), Failure> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure::Failed(format!("starting the async runtime: {e}")))?
            .block_on(f)
    }

    pub async fn connect(&self) -> Result<Client, Failure> {
        let c = match &self.socket {
            Some(s) => Client::connect_to(s).await,
            None => Client::connect().await,
        };
        c.map_err(Failure::from)
    }

    /// A note on stderr (not with --quiet).
    pub fn note(&self, msg: &str) {
        if !self.quiet {
            eprintln!("ctcachectl: {msg}");
        }
    }

    /// Whether human confirmations should be printed.
    pub fn human(&self) -> bool {
        !self.json && !self.quiet
    }

    pub fn paint(&self, s: &str, style: Style) -> String {
        paint(s, style, self.color)
    }
}
