//! Global options and what every command gets from them: JSON or human
//! output, quiet, colour, and (for daemon commands) a runtime and a client.

use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::human::{paint, Style};
use crate::output::Failure;
use ctcache_client::Client;

/// The heading the options every command accepts are listed under.
pub const GLOBAL: &str = "Global options";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// Only on a terminal, and not with NO_COLOR.
    Auto,
    Always,
    Never,
}

/// Options every command accepts, before or after its name.
#[derive(Debug, Args)]
pub struct Global {
    /// The daemon's socket (default: $CTCACHE_SOCKET, else $XDG_RUNTIME_DIR/ctcache/ctcached.sock, else ~/.cache/ctcache/ctcached.sock). A socket named here or in CTCACHE_SOCKET must answer.
    #[arg(long, global = true, value_name = "PATH", help_heading = GLOBAL)]
    pub socket: Option<PathBuf>,
    /// Machine-readable JSON output (shapes: docs/CLI.md).
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,
    /// No notes, progress bars or confirmations; errors and results stay.
    #[arg(short, long, global = true, help_heading = GLOBAL)]
    pub quiet: bool,
    /// Colour in human output (auto: only on a terminal, and not with NO_COLOR).
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto, value_name = "WHEN", help_heading = GLOBAL)]
    pub color: ColorChoice,
}

/// What a command runs with.
pub struct Ctx {
    pub json: bool,
    pub quiet: bool,
    pub color: bool,
    pub socket: Option<PathBuf>,
    /// The user named a socket (`--socket` or `CTCACHE_SOCKET`): a daemon
    /// that does not answer there is an error, never a reason to work
    /// without it.
    pub socket_named: bool,
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
        let socket_named =
            g.socket.is_some() || std::env::var_os("CTCACHE_SOCKET").is_some_and(|v| !v.is_empty());
        Ctx {
            json: g.json,
            quiet: g.quiet,
            color,
            socket: g.socket,
            socket_named,
        }
    }

    /// Runs a daemon command's future on a current-thread runtime: the CLI
    /// does one thing at a time, and offline commands never pay for one.
    pub fn block_on<T, F: Future<Output = Result<T, Failure>>>(&self, f: F) -> Result<T, Failure> {
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

    /// The daemon, or `None` when no socket was named and none answers at
    /// the default one: then the command does `what` here instead, and
    /// says so in one note.
    pub async fn connect_or_local(&self, what: &str) -> Result<Option<Client>, Failure> {
        match self.connect().await {
            Err(Failure::Unreachable(_)) if !self.socket_named => {
                self.note(&format!(
                    "note: no ctcached at {}; {what} here, without the cache",
                    ctcache_client::default_socket().display()
                ));
                Ok(None)
            }
            other => other.map(Some),
        }
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
