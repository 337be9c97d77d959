//! Test harness: `ctcached` on temp dirs (the binary or in this process),
//! `ctcachectl` runs against it, and MatMul models written through the prost
//! types.

#![allow(dead_code, unused_imports)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ctcache_testkit::{xorshift, MatMul};
use serde_json::Value;

pub use ctcache_testkit::eventually;

/// The daemon binary, built by `cargo build -p ctcached` (binaries of other
/// packages have no CARGO_BIN_EXE_ variable): see `ctcache_testkit::locate_bin`
/// (`$CTCACHE_BIN_DIR`, next to ctcachectl, `$CARGO_TARGET_DIR/debug`, ...).
pub fn ctcached_bin() -> PathBuf {
    ctcache_testkit::locate_bin("ctcached", "debug").unwrap_or_else(|e| panic!("{e:#}"))
}

pub fn ctl_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ctcachectl")
}

/// One ctcachectl run.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }

    pub fn ok(self) -> Out {
        assert_eq!(self.code, 0, "{self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        self
    }
}

/// Runs ctcachectl with `args` (no daemon socket added).
pub fn ctl_raw(args: &[&str]) -> Out {
    ctl_env(args, &[])
}

/// Runs ctcachectl with `args` and these environment variables (and no
/// `CTCACHE_SOCKET` unless `env` sets it).
pub fn ctl_env(args: &[&str], env: &[(&str, &str)]) -> Out {
    let o = ctl_command(args, env)
        .stdin(Stdio::null())
        .output()
        .expect("running ctcachectl");
    Out::of(o)
}

/// The ctcachectl command `ctl_env` runs, to spawn it another way.
pub fn ctl_command(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(ctl_bin());
    c.args(args)
        .env_remove("CTCACHE_SOCKET")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied());
    c
}

impl Out {
    pub fn of(o: std::process::Output) -> Out {
        let out = Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        };
        assert!(!out.stderr.contains("panicked"), "panic: {out:#?}");
        out
    }
}

/// A running ctcached on temp dirs `T` (cache `T/cache`, watching
/// `T/models`; `T/work` is free for the test's files): the real binary
/// (`start`, socket `T/s.sock`), or `ctcached::run` in this process
/// (`in_process`, socket `T/run/ctcached.sock`).
pub struct Daemon {
    pub socket: PathBuf,
    inner: Inner,
}

// One per test: the size of either variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Inner {
    Binary(ctcache_testkit::Daemon),
    InProcess(ctcache_testkit::InProcessDaemon),
}

impl Daemon {
    pub fn start() -> Daemon {
        let d = ctcache_testkit::Daemon::builder(ctcached_bin())
            .args(["--log-format", "human"])
            .start()
            .unwrap_or_else(|e| panic!("{e:#}"));
        Daemon {
            socket: d.socket.clone(),
            inner: Inner::Binary(d),
        }
    }

    pub fn in_process() -> Daemon {
        let d = ctcache_testkit::InProcessDaemon::start().unwrap_or_else(|e| panic!("{e:#}"));
        Daemon {
            socket: d.socket.clone(),
            inner: Inner::InProcess(d),
        }
    }

    /// In this process, with a gc budget configured (`gc_max_bytes`,
    /// `gc_max_age_secs`; 0: none).
    pub fn in_process_with_gc_budget(max_bytes: u64, max_age_secs: u64) -> Daemon {
        Daemon::in_process_with(|c| {
            c.gc_max_bytes = max_bytes;
            c.gc_max_age_secs = max_age_secs;
        })
    }

    /// In this process, with `adjust` applied to its config before it
    /// starts.
    pub fn in_process_with(adjust: impl FnOnce(&mut ctcache_testkit::DaemonConfig)) -> Daemon {
        let d = ctcache_testkit::InProcessDaemon::start_with(adjust)
            .unwrap_or_else(|e| panic!("{e:#}"));
        Daemon {
            socket: d.socket.clone(),
            inner: Inner::InProcess(d),
        }
    }

    /// `T/rel`.
    pub fn path(&self, rel: &str) -> PathBuf {
        match &self.inner {
            Inner::Binary(d) => d.path(rel),
            Inner::InProcess(d) => d.path(rel),
        }
    }

    pub fn socket_arg(&self) -> String {
        self.socket.display().to_string()
    }

    /// Runs ctcachectl against this daemon.
    pub fn ctl(&self, args: &[&str]) -> Out {
        let mut all = vec!["--socket", self.socket.to_str().unwrap()];
        all.extend_from_slice(args);
        ctl_raw(&all)
    }

    /// Runs `ctcachectl --json ARGS`, expects exit 0, parses stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        self.ctl(&all).ok().json()
    }

    /// Runs `ctcachectl ARGS` against this daemon (the binary) and kills
    /// the daemon with SIGKILL while the call is open: the daemon is stopped
    /// (SIGSTOP) first, so the call is surely under way and unanswered when
    /// the daemon dies. Starts the daemon again afterwards.
    pub fn kill_during(&mut self, args: &[&str]) -> Out {
        let Inner::Binary(d) = &mut self.inner else {
            panic!("kill_during needs the daemon binary (Daemon::start)");
        };
        let pid = d.child.as_ref().expect("running").id() as i32;
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let mut all = vec!["--socket", self.socket.to_str().unwrap()];
        all.extend_from_slice(args);
        let child = ctl_command(&all, &[])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running ctcachectl");
        wait_call_open(&child);
        drop(d.child.take()); // SIGKILL and reap
        let out = Out::of(child.wait_with_output().expect("waiting for ctcachectl"));
        d.spawn(&[], |_| {})
            .unwrap_or_else(|e| panic!("restarting ctcached: {e:#}"));
        out
    }

    /// Sends `signal` to the daemon binary (SIGSTOP holds every call it
    /// has unanswered; SIGCONT lets it go on).
    pub fn signal(&self, signal: i32) {
        let Inner::Binary(d) = &self.inner else {
            panic!("signal needs the daemon binary (Daemon::start)");
        };
        let pid = d.child.as_ref().expect("running").id() as i32;
        // SAFETY: kill(2) on our own child, not reaped yet.
        unsafe { libc::kill(pid, signal) };
    }

    /// What the daemon binary logged since its last start.
    pub fn log(&self) -> String {
        match &self.inner {
            Inner::Binary(d) => d.log(),
            Inner::InProcess(_) => panic!("an in-process daemon logs to the test's subscriber"),
        }
    }

    /// Stops the daemon and starts it again on the same dirs.
    pub fn restart(&mut self) {
        match &mut self.inner {
            Inner::Binary(d) => {
                d.stop_cleanly().unwrap_or_else(|e| panic!("{e:#}"));
                d.spawn(&[], |_| {}).unwrap_or_else(|e| panic!("{e:#}"));
            }
            Inner::InProcess(d) => {
                d.stop().unwrap_or_else(|e| panic!("{e:#}"));
                d.restart().unwrap_or_else(|e| panic!("{e:#}"));
            }
        }
    }

    /// Stops the daemon (the binary must exit 0 within 30 s of SIGTERM).
    /// Returns its temp dir (the cache stays for offline checks).
    pub fn stop(self) -> tempfile::TempDir {
        match self.inner {
            Inner::Binary(mut d) => {
                d.stop_cleanly().unwrap_or_else(|e| panic!("{e:#}"));
                d.into_dir()
            }
            Inner::InProcess(mut d) => {
                d.stop().unwrap_or_else(|e| panic!("{e:#}"));
                d.into_dir()
            }
        }
    }
}

/// Waits until `child` (a ctcachectl) has its call open: it holds a
/// connected socket (the probe's is dropped at once; the channel's stays)
/// and sent its request a moment later.
pub fn wait_call_open(child: &std::process::Child) {
    let fds = format!("/proc/{}/fd", child.id());
    eventually("ctcachectl connects", || {
        std::fs::read_dir(&fds).is_ok_and(|rd| {
            rd.flatten().any(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
        })
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
}

/// Y = X @ W with W[512, 256] FLOAT (131,072 elements: the default policy
/// packs it with gemm.pack_b.f32 and ort.matmul_nbits). `seed` varies W.
pub fn matmul_model(seed: u32) -> Vec<u8> {
    let w = xorshift(seed.wrapping_mul(2_654_435_761).wrapping_add(1));
    MatMul::new(512, 256, w.map(|x| (x % 2000) as f32 / 1000.0 - 1.0))
        .opset(10, 21)
        .producer("ctcache-client-tests")
        .with_io()
        .encode()
}

/// Writes a model file (atomically) and returns its path as a string.
pub fn write_model(path: &Path, seed: u32) -> String {
    ctcache_testkit::write_model(path, &matmul_model(seed));
    path.display().to_string()
}
