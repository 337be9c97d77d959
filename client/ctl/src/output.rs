//! Output helpers shared by commands: JSON printing, aligned tables, and the
//! failure type that maps to exit codes (0 ok, 1 failure, 2 usage, 3 daemon
//! not reachable).

use std::io::Write;

/// Why a command failed; `ctcachectl` prints it and exits with its code.
#[derive(Debug)]
pub enum Failure {
    /// An operation failed or the input is invalid (exit 1).
    Failed(String),
    /// The arguments are wrong in a way clap cannot see (exit 2).
    Usage(String),
    /// The daemon could not be reached (exit 3); the message says what to do.
    Unreachable(String),
    /// Writing to stdout failed because the reader went away (exit 0, silent).
    BrokenPipe,
}

impl Failure {
    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::BrokenPipe => 0,
            Failure::Failed(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unreachable(_) => 3,
        }
    }

    /// The message for stderr, if any.
    pub fn message(&self) -> Option<&str> {
        match self {
            Failure::Failed(m) | Failure::Usage(m) | Failure::Unreachable(m) => Some(m),
            Failure::BrokenPipe => None,
        }
    }
}

impl From<ctcache_client::Error> for Failure {
    fn from(e: ctcache_client::Error) -> Self {
        if e.is_unreachable() {
            Failure::Unreachable(e.to_string())
        } else {
            Failure::Failed(e.to_string())
        }
    }
}

impl From<ctcache::store::StoreError> for Failure {
    fn from(e: ctcache::store::StoreError) -> Self {
        Failure::Failed(e.to_string())
    }
}

impl From<ctcache::Error> for Failure {
    fn from(e: ctcache::Error) -> Self {
        Failure::Failed(e.to_string())
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::BrokenPipe
        } else {
            Failure::Failed(format!("writing output: {e}"))
        }
    }
}

/// Prints a JSON value on stdout.
pub fn print_json(v: &serde_json::Value) -> Result<(), Failure> {
    let mut out = buffered_stdout();
    serde_json::to_writer_pretty(&mut out, v).map_err(std::io::Error::from)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// Stdout in blocks: its own line buffering would make a syscall per line.
fn buffered_stdout() -> std::io::BufWriter<std::io::StdoutLock<'static>> {
    std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock())
}

/// Prints one JSON value on one line (streams: one object per line).
pub fn print_json_line(v: &serde_json::Value) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, v).map_err(std::io::Error::from)?;
    writeln!(out)?;
    out.flush()?;
    Ok(())
}

/// Prints rows as a table with columns padded to their widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) -> Result<(), Failure> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = buffered_stdout();
    let line = |cells: Vec<&str>| -> String {
        let n = cells.len();
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == n {
                    c.to_string()
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for r in rows {
        writeln!(out, "{}", line(r.iter().map(String::as_str).collect()))?;
    }
    out.flush()?;
    Ok(())
}

/// Prints one line on stdout.
pub fn say(s: &str) -> Result<(), Failure> {
    writeln!(std::io::stdout().lock(), "{s}")?;
    Ok(())
}

/// Makes the folders `path` goes in that are missing, with this user's own
/// rights, through the same checked code as every output
/// (`ctcache::outdir::OutFile::create`: no link followed below the deepest
/// existing folder). Returns a guard that removes the folders made again,
/// if they are still empty, unless [`MadeDir::keep`] is called.
pub fn make_parent(path: &std::path::Path) -> Result<MadeDir, Failure> {
    Ok(create(path)?.1)
}

/// The output `path`, its folder opened (the missing ones made), and the
/// guard of the folders made.
pub fn create(path: &std::path::Path) -> Result<(ctcache::outdir::OutFile, MadeDir), Failure> {
    let (out, made) =
        ctcache::outdir::OutFile::create(path).map_err(|e| ctcache::Error::write(path, e))?;
    Ok((out, MadeDir(made)))
}

/// Folders [`make_parent`] or [`create`] made, outermost first.
pub struct MadeDir(Vec<std::path::PathBuf>);

impl MadeDir {
    /// The folders stay (something was written in them).
    pub fn keep(mut self) {
        self.0.clear();
    }
}

impl Drop for MadeDir {
    fn drop(&mut self) {
        for d in self.0.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}
