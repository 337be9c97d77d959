//! Service behaviour test: starts the real `ctcached` the way systemd runs
//! `ctcached.service` behind `ctcached.socket` (socket activation, sd_notify,
//! watchdog) and checks the daemon keeps its side of that contract.
//!
//! The test plays the service manager: it binds the listening Unix socket
//! and the descriptor channel's SOCK_SEQPACKET socket itself and hands them
//! to the child as fds 3 and 4 with `LISTEN_FDS=2` and
//! `LISTEN_PID` = the child's pid, listens on a `NOTIFY_SOCKET` datagram
//! socket, and sets `WATCHDOG_USEC` / `WATCHDOG_PID`. The pids are only known
//! in the child, so they are set between fork and exec (`pre_exec`).

mod support;

use std::ffi::CString;
use std::io::Read;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctcache_api::v1 as api;
use support::poll;

/// Watchdog interval given to the daemon (200 ms: it must ping every 100 ms).
const WATCHDOG_USEC: u64 = 200_000;

/// Collects the datagrams sent to `NOTIFY_SOCKET`, one message per datagram.
fn notifications(sock: UnixDatagram) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        loop {
            match sock.recv(&mut buf) {
                Ok(n) => {
                    if tx
                        .send(String::from_utf8_lossy(&buf[..n]).into_owned())
                        .is_err()
                    {
                        return;
                    }
                }
                // A socket with a read timeout fails its wait with EINTR
                // after any handled signal (another test's SIGCHLD).
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    // Stop once the test dropped the receiver.
                    if tx.send(String::new()).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    rx
}

/// Reads notifications until one has `line` as a line; returns every message
/// read meanwhile (including the matching one).
fn wait_for(
    rx: &mpsc::Receiver<String>,
    line: &str,
    timeout: Duration,
    child: &mut Child,
    log: &Log,
) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::new();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("ctcached exited ({status}) before sending {line}; notifications {seen:?}; stderr:\n{}", log.text());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no {line} within {timeout:?}; notifications {seen:?}; stderr:\n{}",
            log.text()
        );
        if let Ok(m) = rx.recv_timeout(left.min(Duration::from_millis(200))) {
            if m.is_empty() {
                continue;
            }
            let hit = m.lines().any(|l| l == line);
            seen.push(m);
            if hit {
                return seen;
            }
        }
    }
}

/// The daemon's stderr, drained by a thread so the pipe never fills.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn drain(&self, mut from: impl Read + Send + 'static) {
        let buf = self.0.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = from.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                buf.lock().unwrap().extend_from_slice(&chunk[..n]);
            }
        });
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Writes `NAME=<n in decimal>\0` into `buf` without allocating (it runs
/// between fork and exec); returns the C string.
fn env_entry(buf: &mut [u8; 40], name: &[u8], mut n: u32) -> *const libc::c_char {
    let mut digits = [0u8; 10];
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf[..name.len()].copy_from_slice(name);
    buf[name.len()] = b'=';
    for i in 0..len {
        buf[name.len() + 1 + i] = digits[len - 1 - i];
    }
    buf[name.len() + 1 + len] = 0;
    buf.as_ptr().cast()
}

/// `ctcached` as `ctcached.service` would start it, with `listener` as its
/// socket-activated fd 3.
///
/// `LISTEN_PID` and `WATCHDOG_PID` must name the daemon's own pid, known only
/// in the forked child. Setting them there with setenv(3) does not work: once
/// a `Command` has any environment change, std execs the environment block it
/// built before the fork, so the child's setenv never reaches the daemon
/// (seen in /proc/<pid>/environ). The child therefore execs the daemon itself,
/// with an environment block prepared before the fork plus the two pid
/// entries formatted into fixed buffers.
fn spawn_activated(
    listener: &UnixListener,
    channel: &std::os::fd::OwnedFd,
    dir: &Path,
    notify: &Path,
) -> Child {
    let config = dir.join("ctcached.toml");
    std::fs::write(&config, "# empty: defaults, paths from the environment\n").unwrap();
    let mut vars: Vec<(String, String)> = vec![
        ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
        ("HOME".into(), dir.display().to_string()),
        // What the unit's Environment= lines set, pointed at the temp dir.
        (
            "CTCACHE_CACHE_DIR".into(),
            dir.join("cache").display().to_string(),
        ),
        // The daemon must serve the passed socket, never bind this path.
        (
            "CTCACHE_SOCKET".into(),
            dir.join("not-bound.sock").display().to_string(),
        ),
        ("CTCACHE_CONFIG".into(), config.display().to_string()),
        ("CTCACHE_LOG_LEVEL".into(), "info".into()),
        // What systemd sets for every service it runs.
        (
            "INVOCATION_ID".into(),
            "0123456789abcdef0123456789abcdef".into(),
        ),
        ("LISTEN_FDS".into(), "2".into()),
        (
            "LISTEN_FDNAMES".into(),
            "ctcached.socket:ctcached.socket".into(),
        ),
        ("NOTIFY_SOCKET".into(), notify.display().to_string()),
        ("WATCHDOG_USEC".into(), WATCHDOG_USEC.to_string()),
    ];
    // The Vulkan loader (lavapipe) wants it; tests/run.sh sets one.
    if let Ok(v) = std::env::var("XDG_RUNTIME_DIR") {
        vars.push(("XDG_RUNTIME_DIR".into(), v));
    }
    let env: Vec<CString> = vars
        .iter()
        .map(|(k, v)| CString::new(format!("{k}={v}")).unwrap())
        .collect();
    const MAX_ENV: usize = 61;
    assert!(env.len() <= MAX_ENV);
    let prog = CString::new(support::bin().into_os_string().into_encoded_bytes()).unwrap();
    let mut listen_pid = [0u8; 40];
    let mut watchdog_pid = [0u8; 40];
    let (fd, channel) = (listener.as_raw_fd(), channel.as_raw_fd());

    let mut cmd = Command::new(support::bin());
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child after std set up stdio.
    // It only makes system calls (fcntl, dup2, getpid, execve) and writes
    // into buffers it owns; nothing allocates or takes a lock.
    unsafe {
        cmd.pre_exec(move || {
            // Both out of the way first (either may be 3 or 4 now), then
            // into place: dup2 leaves fds 3 and 4 without close-on-exec.
            let (high, high_channel) = (
                libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100),
                libc::fcntl(channel, libc::F_DUPFD_CLOEXEC, 100),
            );
            if high < 0
                || high_channel < 0
                || libc::dup2(high, 3) < 0
                || libc::dup2(high_channel, 4) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            let pid = libc::getpid() as u32;
            let mut envp: [*const libc::c_char; MAX_ENV + 3] = [std::ptr::null(); MAX_ENV + 3];
            for (slot, e) in envp.iter_mut().zip(&env) {
                *slot = e.as_ptr();
            }
            envp[env.len()] = env_entry(&mut listen_pid, b"LISTEN_PID", pid);
            envp[env.len() + 1] = env_entry(&mut watchdog_pid, b"WATCHDOG_PID", pid);
            let argv = [prog.as_ptr(), std::ptr::null()];
            libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
            // Only reached when execve failed; std reports it from spawn().
            Err(std::io::Error::last_os_error())
        });
    }
    cmd.spawn().expect("spawning ctcached")
}

/// What the socket unit's ListenSequentialPacket= does.
fn bind_channel(sock_path: &Path) -> std::os::fd::OwnedFd {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let path = ctcache_api::handout::socket_path(sock_path);
    rustix::net::bind(&fd, &SocketAddrUnix::new(path).unwrap()).unwrap();
    rustix::net::listen(&fd, 16).unwrap();
    fd
}

#[test]
fn env_entry_formats_pids() {
    for n in [0u32, 7, 10, 4_194_304, u32::MAX] {
        let mut b = [0u8; 40];
        let p = env_entry(&mut b, b"WATCHDOG_PID", n);
        // SAFETY: env_entry returns `b` NUL-terminated.
        let s = unsafe { std::ffi::CStr::from_ptr(p) };
        assert_eq!(s.to_str().unwrap(), format!("WATCHDOG_PID={n}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_under_systemd_socket_activation_notify_and_watchdog() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let sock_path = run.join("ctcached.sock");
    let notify_path = dir.path().join("notify.sock");

    // What ctcached.socket does: bind and listen before the daemon exists.
    let listener = UnixListener::bind(&sock_path).unwrap();
    let channel = bind_channel(&sock_path);
    let rx = notifications(UnixDatagram::bind(&notify_path).unwrap());
    let mut child = spawn_activated(&listener, &channel, dir.path(), &notify_path);
    let log = Log::default();
    log.drain(child.stderr.take().unwrap());
    // The daemon holds its own copy now (systemd would keep one too; this test
    // drops its so that only the daemon can accept).
    drop(listener);
    drop(channel);

    // Type=notify: READY=1 once it serves, with a STATUS= line.
    let before_ready = wait_for(&rx, "READY=1", Duration::from_secs(120), &mut child, &log);
    let ready = before_ready.last().unwrap();
    assert!(
        ready
            .lines()
            .any(|l| l.starts_with("STATUS=") && l.contains(sock_path.to_str().unwrap())),
        "READY=1 comes with a STATUS= naming the activated socket: {ready:?}; stderr:\n{}",
        log.text()
    );

    // WatchdogSec: WATCHDOG=1 every WATCHDOG_USEC / 2.
    let start = Instant::now();
    wait_for(&rx, "WATCHDOG=1", Duration::from_secs(10), &mut child, &log);
    wait_for(&rx, "WATCHDOG=1", Duration::from_secs(10), &mut child, &log);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "two watchdog pings took {:?} with WATCHDOG_USEC={WATCHDOG_USEC}",
        start.elapsed()
    );

    // A client that knows only the socket's path gets answers.
    let channel = support::channel(&sock_path).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    for service in ["", "ctcache.v1.CompiledTensorCache"] {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("health check of {service:?}: {e}"))
            .into_inner();
        assert_eq!(
            r.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    let mut client = api::compiled_tensor_cache_client::CompiledTensorCacheClient::new(channel);
    let devices = client
        .get_host_devices(api::GetHostDevicesRequest::default())
        .await
        .expect("GetHostDevices over the activated socket")
        .into_inner()
        .devices;
    assert!(
        devices.iter().any(|d| d.r#type == "cpu"),
        "the host's CPU is listed: {devices:?}"
    );
    let status = client
        .status(api::StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        status.socket,
        sock_path.display().to_string(),
        "the daemon reports the activated socket"
    );
    assert_eq!(status.pid, child.id());
    assert_eq!(
        Path::new(&status.cache_dir),
        dir.path().join("cache"),
        "CTCACHE_CACHE_DIR applies"
    );
    assert!(
        !dir.path().join("not-bound.sock").exists(),
        "an activated daemon binds no socket of its own"
    );
    // The second socket is the descriptor channel: a model is handed over.
    let model = dir.path().join("m.onnx");
    support::write_model(&model, &support::matmul_model(8, 4, 1));
    let c = ctcache_client::Client::connect_to(&sock_path)
        .await
        .unwrap();
    c.hand_over(model.to_str().unwrap())
        .await
        .expect("the activated channel answers");
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap();
    let pid_line = format!("LISTEN_PID={}", child.id());
    assert!(
        environ.split(|b| *b == 0).any(|v| v == pid_line.as_bytes()),
        "the daemon runs with {pid_line}"
    );

    // systemctl stop: SIGTERM, STOPPING=1, a clean exit.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    wait_for(&rx, "STOPPING=1", Duration::from_secs(30), &mut child, &log);
    let exited = poll(Duration::from_secs(45), Duration::from_millis(20), || {
        child.try_wait().unwrap()
    });
    let Some(code) = exited.map(|s| s.code()) else {
        let _ = child.kill();
        panic!(
            "ctcached did not exit within 45 s of SIGTERM; stderr:\n{}",
            log.text()
        );
    };
    assert_eq!(
        code,
        Some(0),
        "exit status after SIGTERM; stderr:\n{}",
        log.text()
    );
    // The socket belongs to the socket unit: the daemon leaves it in place.
    assert!(
        sock_path.exists(),
        "the activated socket's file was removed by the daemon"
    );
}

#[test]
fn ignores_listen_fds_meant_for_another_process() {
    // LISTEN_PID of another process: the daemon must not take fd 3 and binds
    // its own socket instead (what happens when the variables leak into a
    // child of some other service).
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own.sock");
    let notify = dir.path().join("notify.sock");
    let rx = notifications(UnixDatagram::bind(&notify).unwrap());
    let mut cmd = Command::new(support::bin());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .env("CTCACHE_CACHE_DIR", dir.path().join("cache"))
        .env("CTCACHE_SOCKET", &own)
        .env("LISTEN_FDS", "1")
        .env("LISTEN_PID", "1")
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(v) = std::env::var_os("XDG_RUNTIME_DIR") {
        cmd.env("XDG_RUNTIME_DIR", v);
    }
    let mut child = cmd.spawn().unwrap();
    let log = Log::default();
    log.drain(child.stderr.take().unwrap());
    // SIGTERM only once READY=1 came: the daemon handles SIGTERM from then on.
    wait_for(&rx, "READY=1", Duration::from_secs(120), &mut child, &log);
    assert!(
        std::os::unix::net::UnixStream::connect(&own).is_ok(),
        "the daemon bound {}",
        own.display()
    );
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "stderr:\n{}", log.text());
    assert!(
        !own.exists(),
        "a socket the daemon bound itself is removed on exit"
    );
}
