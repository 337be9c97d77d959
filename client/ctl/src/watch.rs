//! Model-folder watches (`watch add|remove|list`) and the event stream
//! (`events`).

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use crate::ctx::Ctx;
use crate::human::{self, Style};
use crate::json;
use crate::output::{print_json, print_json_line, say, Failure};

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum WatchCmd {
    /// Watch a model folder (recursively); new and changed models are packed.
    Add {
        /// The folder (sent as an absolute path).
        dir: PathBuf,
    },
    /// Stop watching a folder.
    Remove {
        /// The folder, as `watch list` shows it.
        dir: PathBuf,
    },
    /// The watched folders.
    List,
}

pub async fn watch(ctx: &Ctx, cmd: WatchCmd) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let (dirs, what) = match cmd {
        WatchCmd::Add { dir } => {
            let dirs = c.add_watch(&dir).await?;
            // The folder as the daemon stores it (absolute, its real path).
            let shown = ctcache_client::absolute(&dir)
                .ok()
                .and_then(|a| std::fs::canonicalize(a).ok())
                .map(|p| p.display().to_string())
                .filter(|p| dirs.contains(p))
                .unwrap_or_else(|| dir.display().to_string());
            (dirs, Some(format!("watching {shown}")))
        }
        WatchCmd::Remove { dir } => (
            c.remove_watch(&dir).await?,
            Some(format!("no longer watching {}", dir.display())),
        ),
        WatchCmd::List => (c.list_watches().await?, None),
    };
    if ctx.json {
        return print_json(&json!({ "dirs": dirs }));
    }
    match what {
        Some(msg) => {
            if !ctx.quiet {
                say(&msg)?;
            }
        }
        None if dirs.is_empty() => say("no watched folders")?,
        None => {
            for d in &dirs {
                say(d)?;
            }
        }
    }
    Ok(())
}

/// Follows the daemon's events until it ends the stream, `count` events,
/// or Ctrl-C (a stop the user asked for: exit 0, as `tail -f` does).
pub async fn events(ctx: &Ctx, count: Option<u64>) -> Result<(), Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    // Installed before the note below says the follow is on.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let c = ctx.connect().await?;
    let mut stream = c.events().await?;
    // Subscribed from here on; the line tells a reader (or a test) so.
    ctx.note(&format!(
        "following events from {} (Ctrl-C stops)",
        c.socket().display()
    ));
    let mut seen = 0u64;
    while count.is_none_or(|n| seen < n) {
        let next = tokio::select! {
            _ = interrupt.recv() => break,
            next = stream.next() => next?,
        };
        let Some(e) = next else { break };
        seen += 1;
        if ctx.json {
            print_json_line(&json!({
                "unix_ms": e.unix_ms,
                "kind": e.kind,
                "key": e.key,
                "model_path": e.model_path,
                "detail": e.detail,
                "progress": e.progress.as_ref().map(json::progress),
            }))?;
            continue;
        }
        let style = match e.kind.as_str() {
            "entry_added" => Style::Green,
            "entry_removed" => Style::Red,
            "watcher" => Style::Yellow,
            _ => Style::Plain,
        };
        let mut parts = vec![
            human::clock(e.unix_ms),
            ctx.paint(&format!("{:<13}", e.kind), style),
        ];
        if let Some(p) = &e.progress {
            parts.push(format!(
                "{} {} {} ({}/{})",
                p.initializer,
                p.format,
                p.state().name(),
                p.done,
                p.total
            ));
            if !p.error.is_empty() {
                parts.push(p.error.clone());
            }
        } else if !e.detail.is_empty() {
            parts.push(e.detail.clone());
        }
        if !e.model_path.is_empty() {
            parts.push(e.model_path.clone());
        }
        if !e.key.is_empty() {
            parts.push(human::short_key(&e.key));
        }
        say(&parts.join("  "))?;
        std::io::Write::flush(&mut std::io::stdout())?;
    }
    Ok(())
}
