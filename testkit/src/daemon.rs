//! A real `ctcached` on temp dirs.

use std::ffi::{OsStr, OsString};
use std::ops::{Deref, DerefMut};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use tempfile::TempDir;

use crate::poll::poll;

/// How long a start may take until the socket accepts connections.
const READY: Duration = Duration::from_secs(60);
/// How long the daemon may take to exit after SIGTERM.
const STOP: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);
/// The daemon's stderr, in its temp dir.
const LOG: &str = "daemon.log";

/// Inherited variables that would point the daemon at the user's or the
/// system's socket, cache, config or service manager.
const SCRUBBED_ENV: &[&str] = &[
    "CTCACHE_CONFIG",
    "CTCACHE_SOCKET",
    "CTCACHE_CACHE_DIR",
    "CTCACHE_WATCH",
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "LISTEN_FDS",
    "LISTEN_PID",
];

/// A child process, killed and reaped when dropped (a failed test must not
/// leave a daemon behind).
pub struct KillOnDrop(pub Child);

impl Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How a [`Daemon`] starts: see [`Daemon::builder`].
#[derive(Clone, Debug)]
pub struct DaemonBuilder {
    bin: PathBuf,
    prefix: Option<String>,
    socket: PathBuf,
    cache: Option<PathBuf>,
    watch: bool,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
}

impl DaemonBuilder {
    /// The socket's path in the temp dir (default `s.sock`).
    pub fn socket(mut self, rel: impl Into<PathBuf>) -> Self {
        self.socket = rel.into();
        self
    }

    /// The cache folder (default `T/cache`), e.g. on a small file system
    /// of its own.
    pub fn cache_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cache = Some(dir.into());
        self
    }

    /// The temp dir's name prefix.
    pub fn prefix(mut self, prefix: &str) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Whether the daemon watches `T/models` (default yes).
    pub fn watch(mut self, watch: bool) -> Self {
        self.watch = watch;
        self
    }

    /// Flags for every start of the daemon, after the directory flags.
    pub fn args<S: AsRef<OsStr>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable for every start of the daemon.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    pub fn start(self) -> Result<Daemon> {
        self.start_with(&[], |_| {})
    }

    /// Starts with `extra` flags (this start only) and `adjust` applied to
    /// the command last.
    pub fn start_with(self, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Result<Daemon> {
        let mut dir = tempfile::Builder::new();
        if let Some(p) = &self.prefix {
            dir.prefix(p);
        }
        let dir = dir.tempdir()?;
        let t = dir.path();
        for d in ["models", "work", "config/ctcache"] {
            std::fs::create_dir_all(t.join(d))?;
        }
        // The user config of this daemon (a --config of the test's wins).
        std::fs::write(
            t.join("config/ctcache/ctcached.toml"),
            crate::TEST_POLICY_TOML,
        )?;
        let mut d = Daemon {
            socket: t.join(&self.socket),
            cache: self.cache.clone().unwrap_or_else(|| t.join("cache")),
            models: t.join("models"),
            dir,
            child: None,
            spec: self,
        };
        d.spawn(extra, adjust)?;
        Ok(d)
    }
}

/// A `ctcached` on a temp dir `T`: cache `T/cache`, watching `T/models`,
/// stderr in `T/daemon.log`, `XDG_CONFIG_HOME=T/config` (whose
/// `ctcache/ctcached.toml` holds [`crate::TEST_POLICY_TOML`]) and none of
/// the caller's ctcache or service-manager variables (no user or system
/// config or socket may leak into a test). `T/work` is free for the test's files.
/// Killed on drop; [`Daemon::stop`] ends it with SIGTERM.
pub struct Daemon {
    pub dir: TempDir,
    pub socket: PathBuf,
    pub cache: PathBuf,
    pub models: PathBuf,
    pub child: Option<KillOnDrop>,
    spec: DaemonBuilder,
}

impl Daemon {
    /// A daemon of binary `bin` (see [`crate::locate_bin`]), its socket at
    /// `T/s.sock`.
    pub fn builder(bin: impl Into<PathBuf>) -> DaemonBuilder {
        DaemonBuilder {
            bin: bin.into(),
            prefix: None,
            socket: "s.sock".into(),
            cache: None,
            watch: true,
            args: Vec::new(),
            env: Vec::new(),
        }
    }

    pub fn bin(&self) -> &Path {
        &self.spec.bin
    }

    /// `T/rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// What the daemon has written to stderr since its last start.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path(LOG)).unwrap_or_default()
    }

    /// (Re)starts the daemon on the same dirs with `extra` flags, `adjust`
    /// applied to the command last, and waits until its socket accepts
    /// connections.
    pub fn spawn(&mut self, extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Result<()> {
        ensure!(self.child.is_none(), "ctcached is already running");
        let mut c = Command::new(&self.spec.bin);
        c.arg("--cache-dir")
            .arg(&self.cache)
            .arg("--socket")
            .arg(&self.socket);
        if self.spec.watch {
            c.arg("--watch").arg(&self.models);
        }
        c.args(&self.spec.args)
            .args(extra)
            .env("XDG_CONFIG_HOME", self.path("config"));
        for k in SCRUBBED_ENV {
            c.env_remove(k);
        }
        c.envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.path(LOG))?);
        adjust(&mut c);
        let child = c
            .spawn()
            .with_context(|| format!("spawning {}", self.spec.bin.display()))?;
        self.child = Some(KillOnDrop(child));
        self.wait_listening()
    }

    fn wait_listening(&mut self) -> Result<()> {
        let listening = poll(READY, POLL, || {
            if UnixStream::connect(&self.socket).is_ok() {
                return Some(Ok(()));
            }
            match self.child.as_mut().map(|c| c.try_wait()) {
                None => Some(Err(anyhow::anyhow!("ctcached is not running"))),
                Some(Ok(None)) => None,
                Some(Ok(Some(status))) => {
                    Some(Err(anyhow::anyhow!("ctcached exited early ({status})")))
                }
                Some(Err(e)) => Some(Err(e.into())),
            }
        });
        match listening {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => {
                self.child = None;
                bail!("{e}:\n{}", self.log())
            }
            None => bail!(
                "ctcached not listening after {} s:\n{}",
                READY.as_secs(),
                self.log()
            ),
        }
    }

    /// SIGTERM and wait (30 s at most, then kill and fail); the exit status,
    /// `None` when the daemon was not running.
    pub fn stop(&mut self) -> Result<Option<ExitStatus>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        // SAFETY: kill(2) on the pid of a child this process spawned and has
        // not reaped yet.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        match poll(STOP, POLL, || child.try_wait().transpose()) {
            Some(status) => Ok(Some(status?)),
            None => {
                drop(child);
                bail!(
                    "ctcached did not stop within {} s of SIGTERM:\n{}",
                    STOP.as_secs(),
                    self.log()
                )
            }
        }
    }

    /// [`Daemon::stop`], failing unless the daemon exited 0.
    pub fn stop_cleanly(&mut self) -> Result<()> {
        match self.stop()? {
            Some(status) if !status.success() => {
                bail!("ctcached exited with {status}:\n{}", self.log())
            }
            _ => Ok(()),
        }
    }

    /// The temp dir, to keep after the daemon (killed if still running).
    pub fn into_dir(self) -> TempDir {
        self.dir
    }
}
