//! A `ctcached` run in this process through `ctcached::run`, on temp dirs:
//! its own thread and async runtime, its own Unix socket (and a TCP
//! listener when the configuration names one); stopped (drained)
//! by [`InProcessDaemon::stop`] or on drop. For tests that need no separate
//! process (signals, sd_notify and kill tests spawn the binary instead).

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{anyhow, Context, Result};
use ctcached::config::{Config, Overrides};
use tempfile::TempDir;
use tokio::sync::oneshot;

/// A daemon on a temp dir `T`: cache `T/cache`, socket `T/run/ctcached.sock`,
/// watching `T/models`; `T/work` is free for the test's files.
pub struct InProcessDaemon {
    /// `T` (taken by [`InProcessDaemon::into_dir`]).
    dir: Option<TempDir>,
    root: PathBuf,
    pub socket: PathBuf,
    pub cache: PathBuf,
    pub models: PathBuf,
    /// The configuration it runs with.
    pub config: Config,
    /// Where its TCP listener is bound (when `config.listen_tcp` is set;
    /// port 0 there picks a free port at each start).
    pub tcp_addr: Option<std::net::SocketAddr>,
    running: Option<Running>,
}

struct Running {
    stop: oneshot::Sender<()>,
    thread: JoinHandle<Result<()>>,
}

impl InProcessDaemon {
    /// Starts with the default configuration and the tests' policy (on the
    /// temp dirs).
    pub fn start() -> Result<InProcessDaemon> {
        Self::start_with(|_| {})
    }

    /// Starts with `adjust` applied to the configuration first.
    pub fn start_with(adjust: impl FnOnce(&mut Config)) -> Result<InProcessDaemon> {
        let dir = tempfile::Builder::new().prefix("ctcached-").tempdir()?;
        let t = dir.path();
        for d in ["models", "work", "run"] {
            std::fs::create_dir_all(t.join(d))?;
        }
        // No environment: nothing of the caller's setup leaks in; the
        // tests' policy (`TEST_POLICY_TOML`).
        let mut config = Config::load(None, &|_| None, &Overrides::default())?;
        config.policy = Config::from_toml(crate::TEST_POLICY_TOML)?.policy;
        config.cache_dir = t.join("cache");
        config.socket = t.join("run/ctcached.sock");
        config.watch = vec![t.join("models")];
        config.workers = 2;
        adjust(&mut config);
        let mut d = InProcessDaemon {
            socket: config.socket.clone(),
            cache: config.cache_dir.clone(),
            models: t.join("models"),
            root: t.to_path_buf(),
            dir: Some(dir),
            config,
            tcp_addr: None,
            running: None,
        };
        d.restart()?;
        Ok(d)
    }

    /// `T/rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// (Re)starts on the same dirs and configuration; returns once the
    /// socket accepts connections.
    pub fn restart(&mut self) -> Result<()> {
        anyhow::ensure!(self.running.is_none(), "ctcached is already running");
        let _ = std::fs::remove_file(&self.socket);
        let unix = std::os::unix::net::UnixListener::bind(&self.socket)
            .with_context(|| format!("binding {}", self.socket.display()))?;
        let tcp = match &self.config.listen_tcp {
            Some(a) => {
                let l = std::net::TcpListener::bind(a).with_context(|| format!("binding {a}"))?;
                self.tcp_addr = Some(l.local_addr()?);
                Some(l)
            }
            None => None,
        };
        let listeners = ctcached::Listeners {
            unix,
            socket_path: Some(self.socket.clone()),
            tcp,
            handouts: Some(bind_channel(&self.socket)?),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let config = self.config.clone();
        let thread = std::thread::Builder::new()
            .name("ctcached-in-process".into())
            .spawn(move || -> Result<()> {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()?
                    .block_on(ctcached::run(config, listeners, async move {
                        let _ = stopped.await;
                    }))
                    .map_err(|e| anyhow!("ctcached::run: {e}"))
            })?;
        self.running = Some(Running { stop, thread });
        self.wait_ready()
    }

    /// Waits until a health check answers (the store is open and the
    /// service serves), or the daemon ended.
    fn wait_ready(&mut self) -> Result<()> {
        let every = std::time::Duration::from_millis(20);
        let ready = crate::poll::poll(std::time::Duration::from_secs(60), every, || {
            let ended = || {
                self.running
                    .as_ref()
                    .is_some_and(|r| r.thread.is_finished())
            };
            match std::os::unix::net::UnixStream::connect(&self.socket).is_ok() && self.serving() {
                true => Some(true),
                false => ended().then_some(false),
            }
        });
        match ready {
            Some(true) => Ok(()),
            Some(false) => self
                .stop()
                .and_then(|()| Err(anyhow!("ctcached ended at start-up"))),
            None => Err(anyhow!("ctcached not serving after 60 s")),
        }
    }

    /// The daemon answers gRPC (it accepts connections before the store is
    /// open; the first answer proves it serves).
    fn serving(&self) -> bool {
        // An HTTP/2 preface on the socket is answered only by a serving
        // daemon: write it and wait for the server's SETTINGS frame.
        use std::io::{Read, Write};
        let Ok(mut s) = std::os::unix::net::UnixStream::connect(&self.socket) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_millis(500)));
        if s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .is_err()
        {
            return false;
        }
        let mut buf = [0u8; 9];
        s.read_exact(&mut buf).is_ok() && buf[3] == 4
    }

    /// Shuts the daemon down (drain included) and waits for it.
    pub fn stop(&mut self) -> Result<()> {
        let Some(r) = self.running.take() else {
            return Ok(());
        };
        let _ = r.stop.send(());
        r.thread
            .join()
            .map_err(|_| anyhow!("the ctcached thread panicked"))?
    }

    /// Whether it is running.
    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// Stops it and returns its temp dir (the cache stays for offline checks).
    pub fn into_dir(mut self) -> TempDir {
        let _ = self.stop();
        self.dir.take().expect("the temp dir is taken only here")
    }
}

impl Drop for InProcessDaemon {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The descriptor channel's SOCK_SEQPACKET socket beside the gRPC socket
/// `grpc`, as `ctcached` binds it: clients hand models over on it (the
/// daemon opens no path a caller names).
fn bind_channel(grpc: &Path) -> Result<std::os::fd::OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let path = ctcache_api::handout::socket_path(grpc);
    let _ = std::fs::remove_file(&path);
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    let fd = rustix::net::socket_with(AddressFamily::UNIX, SocketType::SEQPACKET, flags, None)?;
    rustix::net::bind(&fd, &SocketAddrUnix::new(&path)?)
        .with_context(|| format!("binding {}", path.display()))?;
    rustix::net::listen(&fd, 128)?;
    Ok(fd)
}
