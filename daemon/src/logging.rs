//! Logging with tracing-subscriber: human format on a terminal, journald when
//! JOURNAL_STREAM says stderr is the journal, JSON on request. The level comes
//! from RUST_LOG when set, else the config.

use std::io::IsTerminal;
use std::os::unix::fs::MetadataExt;

use tracing_subscriber::prelude::*;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// True when stderr is the journal stream systemd announced.
fn stderr_is_journal() -> bool {
    let Ok(v) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.split_once(':') else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Installs the global tracing subscriber on stderr (once; later calls do nothing).
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let format = match format {
        LogFormat::Auto if stderr_is_journal() => LogFormat::Journald,
        LogFormat::Auto => LogFormat::Human,
        f => f,
    };
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Journald => match tracing_journald::layer() {
            Ok(layer) => registry.with(layer).try_init(),
            Err(_) => registry
                .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
                .try_init(),
        },
        _ => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    let _ = result;
}
