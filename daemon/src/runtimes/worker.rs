//! Running a runtime's worker: a child process beside `ctcached` with a
//! memory bound (RLIMIT_DATA), a time limit, killed when dropped, given no
//! descriptor but its standard streams.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use bytes::Bytes;
use ctcache::forms::{FormKey, RuntimeIdentity};

use super::error::{CompileFailure, RuntimeProblem};

/// The onnxruntime worker's file name.
pub(super) const ONNXRUNTIME: &str = "ctcache-onnxruntime-worker";

/// The OpenVINO worker's file name.
pub(super) const OPENVINO: &str = "ctcache-openvino-worker";

/// How long identifying a library may take (loading it included).
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(30);

/// What the daemon keeps of each of a worker's output streams.
const MAX_WORKER_OUTPUT: u64 = 64 << 10;

/// The data segment a worker may grow to (the library and its arenas).
const WORKER_DATA_LIMIT: u64 = 4 << 30;

/// The largest form a worker may write (RLIMIT_FSIZE: past it the
/// worker gets SIGXFSZ).
const MAX_FORM_BYTES: u64 = 4 << 30;

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

/// The worker `name` running `command` on `library`, confined, its
/// standard error kept, killed when dropped.
fn command(
    name: &'static str,
    command: &str,
    library: &Path,
) -> Result<tokio::process::Command, RuntimeProblem> {
    let mut cmd = tokio::process::Command::new(worker_path(name)?);
    cmd.arg(command)
        .arg("--library")
        .arg(library)
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    confine(&mut cmd);
    Ok(cmd)
}

/// Asks the worker `name` which runtime `library` is.
pub(super) async fn identify(
    name: &'static str,
    library: &Path,
) -> Result<RuntimeIdentity, RuntimeProblem> {
    let mut cmd = command(name, "identify", library)?;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
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
    identity_in(name, &out.stdout)
}

/// The identity a worker printed (`{"runtime", "version", "build"}`).
fn identity_in(name: &'static str, stdout: &[u8]) -> Result<RuntimeIdentity, RuntimeProblem> {
    let no_identity = |problem: String| RuntimeProblem::NoIdentity { name, problem };
    let v: serde_json::Value =
        serde_json::from_slice(stdout).map_err(|e| no_identity(e.to_string()))?;
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

/// The worker `name`'s command line for the form of `key`: onnxruntime's
/// optimized model at the key's level, OpenVINO's compiled model for its
/// device with its config.
pub(super) fn compile_args(name: &'static str, key: &FormKey) -> Vec<String> {
    if name == ONNXRUNTIME {
        let level = key.options.get("level").cloned().unwrap_or_default();
        return vec!["optimize".into(), "--level".into(), level];
    }
    let mut args = vec!["compile".into(), "--device".into(), key.provider.clone()];
    for (k, v) in &key.options {
        args.push("--config".into());
        args.push(format!("{k}={v}"));
    }
    args
}

/// Has the worker `name` run `args` (its subcommand first) with `library`
/// on `model`, writing the form to `out` (its descriptor 3, the one file
/// it gets) within `limit`: the identity of the runtime that made it, with
/// the CPU time it used (ended workers' usage, RUSAGE_CHILDREN, before and
/// after: compiles run one at a time). The worker is killed when this is
/// dropped (its caller went away).
pub(super) async fn compile(
    name: &'static str,
    library: &Path,
    args: Vec<String>,
    model: Bytes,
    out: &std::fs::File,
    limit: Duration,
) -> (Result<RuntimeIdentity, CompileFailure>, Duration) {
    let before = children_cpu();
    let outcome = async {
        let (sub, rest) = args
            .split_first()
            .map_or(("", &[][..]), |(s, r)| (s.as_str(), r));
        let mut cmd = command(name, sub, library).map_err(CompileFailure::Start)?;
        cmd.args(rest).stdin(Stdio::piped()).stdout(Stdio::piped());
        give_output(&mut cmd, out.as_raw_fd());
        let out = tokio::time::timeout(limit, bounded_run(cmd, Some(model)))
            .await
            .map_err(|_| CompileFailure::Timeout { name, limit })?
            .map_err(|e| {
                CompileFailure::Start(RuntimeProblem::Start {
                    name,
                    problem: e.to_string(),
                })
            })?;
        let said = String::from_utf8_lossy(&out.stderr).trim().to_string();
        match out.status.code() {
            Some(0) => identity_in(name, &out.stdout).map_err(CompileFailure::Start),
            Some(3) => Err(CompileFailure::Refused(said)),
            Some(4) => Err(CompileFailure::OutOfMemory {
                name,
                limit_gib: WORKER_DATA_LIMIT >> 30,
                said,
            }),
            _ => Err(CompileFailure::Failed {
                name,
                status: out.status.to_string(),
                said,
            }),
        }
    }
    .await;
    (outcome, children_cpu().saturating_sub(before))
}

/// The CPU time of this process's ended (waited for) children.
fn children_cpu() -> Duration {
    // SAFETY: an all-zero rusage is a valid value, and getrusage writes
    // only into the one this frame owns.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let t = |v: libc::timeval| {
        Duration::from_secs(v.tv_sec.max(0) as u64) + Duration::from_micros(v.tv_usec.max(0) as u64)
    };
    t(u.ru_utime) + t(u.ru_stime)
}

/// Runs `cmd` to its end, keeping at most [`MAX_WORKER_OUTPUT`] of each of
/// its streams (a worker that writes more is stopped by its time limit).
async fn bounded_output(cmd: tokio::process::Command) -> std::io::Result<Output> {
    bounded_run(cmd, None).await
}

/// [`bounded_output`], writing `input` (when given) to the child's
/// standard input meanwhile.
async fn bounded_run(
    mut cmd: tokio::process::Command,
    input: Option<Bytes>,
) -> std::io::Result<Output> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut child = cmd.spawn()?;
    let stdin = child.stdin.take();
    let write_in = async move {
        if let (Some(mut w), Some(b)) = (stdin, input) {
            // A worker that stops reading (it failed) closes the pipe: its
            // exit status says why, not this write.
            let _ = w.write_all(&b).await;
        }
    };
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
    let (o, e, ()) = tokio::join!(read_out, read_err, write_in);
    o?;
    e?;
    let status = child.wait().await?;
    Ok(Output {
        status,
        stdout,
        stderr,
    })
}

/// The worker's descriptor 3 is `fd` (set after [`confine`]'s sweep,
/// which would mark it close-on-exec too), and no file it writes may grow
/// past [`MAX_FORM_BYTES`].
fn give_output(cmd: &mut tokio::process::Command, fd: std::os::fd::RawFd) {
    // SAFETY: dup2, fcntl and setrlimit are async-signal-safe, and nothing
    // here allocates.
    unsafe {
        cmd.pre_exec(move || {
            let moved = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if moved < 0 {
                return Err(std::io::Error::last_os_error());
            }
            lower_soft_limit(rustix::process::Resource::Fsize, MAX_FORM_BYTES)
        });
    }
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
            lower_soft_limit(rustix::process::Resource::Data, WORKER_DATA_LIMIT)
        });
    }
}

/// Sets the soft limit of `resource` to `to` (or the hard limit, if
/// lower). The soft limit only: a lower hard limit the service manager set
/// stays, and lowering it needs no privilege. Async-signal-safe (between
/// fork and exec).
fn lower_soft_limit(resource: rustix::process::Resource, to: u64) -> std::io::Result<()> {
    let hard = rustix::process::getrlimit(resource).maximum;
    let limit = rustix::process::Rlimit {
        current: Some(hard.map_or(to, |h| h.min(to))),
        maximum: hard,
    };
    rustix::process::setrlimit(resource, limit).map_err(std::io::Error::from)
}
