//! Output helpers shared by commands: JSON printing, aligned tables, and the
//! failure type that maps to exit codes (0 ok, 1 failure, 2 usage, 3 daemon
//! not reachable, 4-7 refusals a script may act on: see [`Refusal`]).

use std::io::Write;

use ctcache_client::Code;

/// Why a command failed; `ctcachectl` prints it and exits with its code.
#[derive(Debug)]
pub enum Failure {
    /// An operation failed or the input is invalid (exit 1).
    Failed(String),
    /// The arguments are wrong in a way clap cannot see (exit 2).
    Usage(String),
    /// The daemon could not be reached (exit 3); the message says what to do.
    Unreachable(String),
    /// A refusal of a kind a script may act on (exit 4 to 7).
    Refused(String, Refusal),
    /// Writing to stdout failed because the reader went away (exit 0, silent).
    BrokenPipe,
    /// The user interrupted the work (Ctrl-C) and what it wrote was removed
    /// (exit 130, as a shell reports SIGINT).
    Interrupted(String),
}

impl Failure {
    /// The failure of an interrupted command; `what` says what became of
    /// its work.
    pub fn interrupted(what: &str) -> Failure {
        Failure::Interrupted(format!("interrupted; {what}"))
    }

    /// The process exit code for this failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::BrokenPipe => 0,
            Failure::Failed(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unreachable(_) => 3,
            Failure::Refused(_, r) => r.exit_code(),
            Failure::Interrupted(_) => 130,
        }
    }

    /// The message for stderr, if any.
    pub fn message(&self) -> Option<&str> {
        match self {
            Failure::Failed(m)
            | Failure::Usage(m)
            | Failure::Unreachable(m)
            | Failure::Refused(m, _)
            | Failure::Interrupted(m) => Some(m),
            Failure::BrokenPipe => None,
        }
    }
}

/// Failures a script may tell apart by the exit code, one per kind of
/// answer (the daemon's gRPC code, or the same cause found locally).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A bound was reached or a disk is full (RESOURCE_EXHAUSTED): exit 4.
    Exhausted,
    /// The caller may not read or write that (PERMISSION_DENIED): exit 5.
    Denied,
    /// Stored bytes were found damaged and not served (DATA_LOSS): exit 6.
    DataLoss,
    /// A passing state: the same call may succeed later (UNAVAILABLE,
    /// ABORTED), such as a model written while it was packed: exit 7.
    TryAgain,
}

impl Refusal {
    /// The refusal a gRPC code is, if any.
    pub fn of(code: Code) -> Option<Refusal> {
        match code {
            Code::ResourceExhausted => Some(Refusal::Exhausted),
            Code::PermissionDenied => Some(Refusal::Denied),
            Code::DataLoss => Some(Refusal::DataLoss),
            Code::Unavailable | Code::Aborted => Some(Refusal::TryAgain),
            _ => None,
        }
    }

    /// The refusal a job's code name (`PrepackProgress.code`) is, if any.
    pub fn of_name(name: &str) -> Option<Refusal> {
        ctcache_api::code_named(name).and_then(Refusal::of)
    }

    /// The refusal a local I/O error is, if any.
    fn of_io(e: &std::io::Error) -> Option<Refusal> {
        match e.kind() {
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => {
                Some(Refusal::Exhausted)
            }
            std::io::ErrorKind::PermissionDenied => Some(Refusal::Denied),
            _ => None,
        }
    }

    /// The process exit code.
    pub fn exit_code(self) -> u8 {
        match self {
            Refusal::Exhausted => 4,
            Refusal::Denied => 5,
            Refusal::DataLoss => 6,
            Refusal::TryAgain => 7,
        }
    }
}

impl Failure {
    /// `message`, refused as `refusal` when there is one, else failed.
    pub fn with(message: String, refusal: Option<Refusal>) -> Failure {
        match refusal {
            Some(r) => Failure::Refused(message, r),
            None => Failure::Failed(message),
        }
    }
}

impl From<ctcache_client::Error> for Failure {
    fn from(e: ctcache_client::Error) -> Self {
        if let ctcache_client::Error::Write(e) = e {
            return Failure::from(e);
        }
        if e.is_unreachable() {
            Failure::Unreachable(e.to_string())
        } else {
            Failure::with(e.to_string(), e.code().and_then(Refusal::of))
        }
    }
}

impl From<ctcache::store::StoreError> for Failure {
    fn from(e: ctcache::store::StoreError) -> Self {
        use ctcache::store::StoreError as S;
        let refusal = match &e {
            S::NoSpace { .. } | S::IndexNoSpace { .. } | S::TooManyLeases { .. } => {
                Some(Refusal::Exhausted)
            }
            S::PayloadDamaged { .. } | S::PayloadCorrupt { .. } => Some(Refusal::DataLoss),
            S::Io { source, .. } => Refusal::of_io(source),
            _ => None,
        };
        Failure::with(e.to_string(), refusal)
    }
}

impl From<ctcache::Error> for Failure {
    fn from(e: ctcache::Error) -> Self {
        if let ctcache::Error::Cancelled = e.cause() {
            return Failure::interrupted("what was written is removed");
        }
        let refusal = match e.cause() {
            ctcache::Error::Io { source, .. } => Refusal::of_io(source),
            ctcache::Error::PayloadChanged { .. } => Some(Refusal::DataLoss),
            _ => None,
        };
        Failure::with(e.to_string(), refusal)
    }
}

impl From<ctcache_files::Error> for Failure {
    fn from(e: ctcache_files::Error) -> Self {
        Failure::from(ctcache::Error::from(e))
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

/// The output `path`, its folder opened (the missing ones made with this
/// user's own rights, no link followed below the deepest existing folder),
/// and a guard that removes the folders made again, if they are still
/// empty, unless [`MadeDir::keep`] is called.
pub fn create(path: &std::path::Path) -> Result<(ctcache::outdir::OutFile, MadeDir), Failure> {
    let (out, made) =
        ctcache::outdir::OutFile::create(path).map_err(|e| ctcache::Error::write(path, e))?;
    Ok((out, MadeDir(made)))
}

/// Folders [`create`] made, outermost first.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_have_codes_of_their_own() {
        let all = [
            (Code::ResourceExhausted, Refusal::Exhausted, 4),
            (Code::PermissionDenied, Refusal::Denied, 5),
            (Code::DataLoss, Refusal::DataLoss, 6),
            (Code::Unavailable, Refusal::TryAgain, 7),
            (Code::Aborted, Refusal::TryAgain, 7),
        ];
        for (code, refusal, exit) in all {
            assert_eq!(Refusal::of(code), Some(refusal));
            assert_eq!(
                Refusal::of_name(ctcache_api::code_name(code)),
                Some(refusal)
            );
            assert_eq!(refusal.exit_code(), exit);
        }
        for code in [Code::InvalidArgument, Code::NotFound, Code::Internal] {
            assert_eq!(Refusal::of(code), None);
        }
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let e = ctcache::Error::write("/out/m.onnx", full);
        assert_eq!(Failure::from(e).exit_code(), 4);
    }
}
