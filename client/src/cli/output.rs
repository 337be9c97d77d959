//! Output helpers shared by commands: JSON printing, aligned tables, and the
//! failure type that maps to exit codes.

use std::io::Write;

/// Why a command failed; `ctcachectl` prints it and exits 1.
#[derive(Debug)]
pub enum Failure {
    /// An operation failed or the input is invalid (exit 1).
    Failed(String),
    /// Writing to stdout failed because the reader went away (exit 0, silent).
    BrokenPipe,
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
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v).map_err(|e| Failure::Failed(e.to_string()))?;
    writeln!(out)?;
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
    let mut out = std::io::stdout().lock();
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
    Ok(())
}

/// Prints one line on stdout.
pub fn say(s: &str) -> Result<(), Failure> {
    writeln!(std::io::stdout().lock(), "{s}")?;
    Ok(())
}
