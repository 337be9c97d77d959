//! Running a runtime's worker: a child process beside `ctcached` with a
//! memory bound (RLIMIT_DATA), a time limit, killed when dropped, given no
//! descriptor but its standard streams.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use ctcache::forms::RuntimeIdentity;

use super::error::RuntimeProblem;

/// The onnxruntime worker's file name.
pub(super) const ONNXRUNTIME: &str = "ctcache-onnxruntime-worker";

/// How long identifying a library may take (loading it included).
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the daemon keeps of each of a worker's output streams.
const MAX_WORKER_OUTPUT: u64 = 64 << 10;

/// The data segment a worker may grow to (the library and its arenas).
const WORKER_DATA_LIMIT: u64 = 4 << 30;

/// The worker `name` beside the daemon's own executable.
fn worker_path(name: &'static str) -> Result<PathBuf, RuntimeProblem> {
    let exe = std::env::current_exe().map_err(|e| RuntimeProblem::OwnPath(e.to_string()))?;
    let path = exe.with_file_name(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(RuntimeProblem::NoWorker {
            name,
            dir: exe.parent().unwrap_or(Path::new("/")).display().to_string(),
        })
    }
}

/// Asks the worker `name` which runtime `library` is.
pub(super) async fn identify(
    name: &'static str,
    library: &Path,
) -> Result<RuntimeIdentity, RuntimeProblem> {
    let mut cmd = tokio::process::Command::new(worker_path(name)?);
    cmd.arg("identify")
        .arg("--library")
        .arg(library)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    confine(&mut cmd);
    let out = tokio::time::timeout(IDENTIFY_TIMEOUT, bounded_output(cmd))
        .await
        .map_err(|_| RuntimeProblem::Timeout {
            name,
            library: library.to_path_buf(),
            limit: IDENTIFY_TIMEOUT,
        })?
        .map_err(|e| RuntimeProblem::Start {
            name,
            problem: e.to_string(),
        })?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let said = said.trim();
        return Err(RuntimeProblem::Refused(if said.is_empty() {
            format!("{name} failed ({})", out.status)
        } else {
            said.to_string()
        }));
    }
    let no_identity = |problem: String| RuntimeProblem::NoIdentity { name, problem };
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| no_identity(e.to_string()))?;
    let field = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| no_identity(format!("no {k}")))
    };
    Ok(RuntimeIdentity {
        name: field("runtime")?,
        version: field("version")?,
        build: field("build")?,
    })
}

/// Runs `cmd` to its end, keeping at most [`MAX_WORKER_OUTPUT`] of each of
/// its streams (a worker that writes more is stopped by its time limit).
async fn bounded_output(mut cmd: tokio::process::Command) -> std::io::Result<Output> {
    use tokio::io::AsyncReadExt;
    let mut child = cmd.spawn()?;
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let read_out = async {
        match out.as_mut() {
            Some(s) => s.take(MAX_WORKER_OUTPUT).read_to_end(&mut stdout).await,
            None => Ok(0),
        }
    };
    let read_err = async {
        match err.as_mut() {
            Some(s) => s.take(MAX_WORKER_OUTPUT).read_to_end(&mut stderr).await,
            None => Ok(0),
        }
    };
    let (o, e) = tokio::join!(read_out, read_err);
    o?;
    e?;
    let status = child.wait().await?;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// The worker holds no descriptor of the daemon's (store files, sockets,
/// whatever lacks close-on-exec) but its standard streams, and its data
/// segment is bounded, so a leak in a runtime ends the worker, not the
/// host's memory.
fn confine(cmd: &mut tokio::process::Command) {
    // SAFETY: close_range, fcntl, getrlimit and setrlimit are
    // async-signal-safe, and nothing here allocates.
    unsafe {
        cmd.pre_exec(|| {
            // Close-on-exec rather than closed: std's own pipe that reports
            // a failed exec must stay open until the exec.
            let cloexec = libc::CLOSE_RANGE_CLOEXEC;
            if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, cloexec) != 0 {
                for fd in 3..4096 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            // The soft limit only: a lower hard limit the service manager
            // set stays, and lowering it needs no privilege.
            let hard = rustix::process::getrlimit(rustix::process::Resource::Data).maximum;
            let limit = rustix::process::Rlimit {
                current: Some(hard.map_or(WORKER_DATA_LIMIT, |h| h.min(WORKER_DATA_LIMIT))),
                maximum: hard,
            };
            rustix::process::setrlimit(rustix::process::Resource::Data, limit)
                .map_err(std::io::Error::from)
        });
    }
}
