//! Test harness: `ctcached` on temp dirs (`ctcache_testkit`), either run
//! in this process through `ctcached::run` ([`InProc`]) or as the real
//! binary ([`Daemon`], for signals, sd_notify and start-up failures), a gRPC
//! client over its Unix socket, and small models.

#![allow(dead_code, unused_imports)]

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tokio_stream::StreamExt;

use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use ctcache_testkit::MatMul;
use tonic::transport::Channel;

pub use ctcache_testkit::{
    digest_of_file as digest_of, eventually_async as eventually, poll, rot_payload, write_model,
};

/// Waits (at most two minutes) for the file `flag` to exist: a helper
/// process tells where it is by making it.
pub fn wait_for_flag(flag: &Path, what: &str) {
    poll(Duration::from_secs(120), Duration::from_millis(20), || {
        flag.exists().then_some(())
    })
    .unwrap_or_else(|| panic!("{what}: {} never came", flag.display()));
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ctcached"))
}

/// A running daemon on temp dirs (socket `T/run/ctcached.sock`); SIGTERMed
/// by `stop`, killed on drop. Derefs to the testkit's daemon (`dir`,
/// `socket`, `cache`, `models`, `child`, `spawn`).
pub struct Daemon(ctcache_testkit::Daemon);

impl Deref for Daemon {
    type Target = ctcache_testkit::Daemon;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[], |_| {})
    }

    /// Starts with extra flags and a hook to adjust the command.
    pub fn start_with(extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Daemon {
        let d = ctcache_testkit::Daemon::builder(bin())
            .socket("run/ctcached.sock")
            .env("CTCACHE_LOG_LEVEL", "info")
            .start_with(extra, adjust);
        Daemon(d.unwrap_or_else(|e| panic!("{e:#}")))
    }

    /// Restarts on the same dirs.
    pub fn spawn(&mut self, extra: &[&str], adjust: impl FnOnce(&mut Command)) {
        self.0
            .spawn(extra, adjust)
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    pub async fn client(&self) -> Conn {
        Conn::at(&self.socket).await
    }

    /// SIGTERM and wait; returns the exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let status = self.0.stop().unwrap_or_else(|e| panic!("{e:#}"));
        status.and_then(|s| s.code())
    }
}

/// `ctcached::run` in this process on temp dirs (socket
/// `T/run/ctcached.sock`, cache `T/cache`, watching `T/models`); stopped by
/// `stop` or on drop. Derefs to the testkit's in-process daemon.
pub struct InProc(ctcache_testkit::InProcessDaemon);

impl Deref for InProc {
    type Target = ctcache_testkit::InProcessDaemon;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for InProc {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl InProc {
    pub fn start() -> InProc {
        Self::start_with(|_| {})
    }

    /// Starts with `adjust` applied to the configuration.
    pub fn start_with(adjust: impl FnOnce(&mut ctcached::config::Config)) -> InProc {
        InProc(
            ctcache_testkit::InProcessDaemon::start_with(adjust)
                .unwrap_or_else(|e| panic!("{e:#}")),
        )
    }

    pub async fn client(&self) -> Conn {
        Conn::at(&self.socket).await
    }

    /// Shuts down (drained) and waits; `Some(0)` when `run` returned Ok,
    /// like a clean exit of the binary.
    pub fn stop(&mut self) -> Option<i32> {
        match self.0.stop() {
            Ok(()) => Some(0),
            Err(e) => panic!("{e:#}"),
        }
    }

    /// Starts again on the same dirs and configuration.
    pub fn restart(&mut self) {
        self.0.restart().unwrap_or_else(|e| panic!("{e:#}"));
    }
}

/// A gRPC client of the daemon at `socket` (it derefs to the generated
/// client) that hands models over on the daemon's descriptor channel: the
/// daemon opens no path a caller names.
#[derive(Clone)]
pub struct Conn {
    grpc: CompiledTensorCacheClient<Channel>,
    pub socket: PathBuf,
}

impl Deref for Conn {
    type Target = CompiledTensorCacheClient<Channel>;

    fn deref(&self) -> &Self::Target {
        &self.grpc
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.grpc
    }
}

impl Conn {
    pub async fn at(socket: &Path) -> Conn {
        Conn {
            grpc: CompiledTensorCacheClient::new(channel(socket).await),
            socket: socket.to_path_buf(),
        }
    }

    /// `model` handed over with this process's rights: a request names
    /// `handout.name()` while the handout lives.
    pub async fn hand(&self, model: &Path) -> ctcache_client::Handout {
        self.try_hand(model)
            .await
            .unwrap_or_else(|e| panic!("handing {} over: {e}", model.display()))
    }

    /// [`Conn::hand`], its refusal returned.
    pub async fn try_hand(
        &self,
        model: &Path,
    ) -> Result<ctcache_client::Handout, ctcache_client::Error> {
        let c = ctcache_client::Client::connect_to(&self.socket).await?;
        c.hand_over(&model.display().to_string()).await
    }

    /// The client library's client of the same daemon (it hands models
    /// over, and makes Embed's output files, for each call).
    pub async fn library(&self) -> ctcache_client::Client {
        ctcache_client::Client::connect_to(&self.socket)
            .await
            .expect("connecting to ctcached")
    }
}

pub async fn channel(socket: &Path) -> Channel {
    ctcache_client::channel_to(socket)
        .await
        .expect("connecting to ctcached")
}

/// A MatMul model Y = X @ W with W[k, n] FLOAT (seeded values).
pub fn matmul_model(k: usize, n: usize, seed: u32) -> Vec<u8> {
    let w = ctcache_testkit::xorshift(seed.wrapping_mul(2654435761).max(1));
    MatMul::new(k, n, w.map(ctcache_testkit::unit_f32))
        .metadata("test", "ctcached")
        .encode()
}

pub async fn entries_for(
    c: &mut CompiledTensorCacheClient<Channel>,
    digest: &[u8],
) -> Vec<api::Entry> {
    c.lookup(lookup_req(digest))
        .await
        .unwrap()
        .into_inner()
        .entries
}

/// Waits (up to 60 s) until `digest` has `n` entries; returns them.
pub async fn wait_for_entries(
    c: &CompiledTensorCacheClient<Channel>,
    digest: &[u8],
    n: usize,
    what: &str,
) -> Vec<api::Entry> {
    eventually(Duration::from_secs(60), || {
        let mut c = c.clone();
        let digest = digest.to_vec();
        async move {
            let e = entries_for(&mut c, &digest).await;
            (e.len() == n).then_some(e)
        }
    })
    .await
    .unwrap_or_else(|| panic!("{what}: {n} entries within 60 s"))
}

/// A Lookup of a blake3 source digest.
pub fn lookup_req(digest: &[u8]) -> api::LookupRequest {
    api::LookupRequest {
        source_digest: bytes::Bytes::copy_from_slice(digest),
        digest_algorithm: "blake3".into(),
        ..Default::default()
    }
}

/// Prepacks a model by the policy and waits for every job.
pub async fn prepack_all(c: &mut Conn, model: &std::path::Path) -> Vec<api::PrepackProgress> {
    let h = c.hand(model).await;
    let mut s = c
        .prepack(api::PrepackRequest {
            model_path: model.display().to_string(),
            handout: h.name().into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(p) = s.next().await {
        out.push(p.unwrap());
    }
    out
}

/// Whether the entry's payload file hashes to the blake3 it names.
pub fn intact(e: &api::Entry) -> bool {
    ctcache_testkit::payload_intact(&e.payload_path, &e.payload_blake3)
}

/// The error of an AcquireLease of `key` that must fail.
pub async fn lease_refused(c: &mut CompiledTensorCacheClient<Channel>, key: &str) -> tonic::Status {
    c.acquire_lease(api::AcquireLeaseRequest {
        key: key.to_string(),
        ttl_ms: 60_000,
    })
    .await
    .expect_err("the lease is refused")
}

/// Imports the model at `path`.
pub async fn import(c: &mut Conn, path: &Path) -> api::ImportResponse {
    let h = c.hand(path).await;
    c.import(api::ImportRequest {
        model_path: path.display().to_string(),
        handout: h.name().into(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// The whole payload of `key`, through ReadPayload.
pub async fn read_all(c: &mut CompiledTensorCacheClient<Channel>, key: &str) -> Vec<u8> {
    let mut chunks = c
        .read_payload(api::ReadPayloadRequest {
            key: key.to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut data = Vec::new();
    while let Some(ch) = chunks.next().await {
        data.extend_from_slice(&ch.unwrap().data);
    }
    data
}

/// A Put of `e`'s payload, packed from a FLOAT weight of `source_dims`,
/// under the source digest `[n; 32]`: the header, then `data` in one chunk.
pub fn put_requests(
    e: &api::Entry,
    n: u8,
    source_dims: &[u64],
    data: Vec<u8>,
) -> Vec<api::PutRequest> {
    put_messages(put_header(e, n, source_dims), data)
}

/// The Put header of `e`'s payload, packed from a FLOAT weight `W` of
/// `source_dims`, under the source digest `[n; 32]`.
pub fn put_header(e: &api::Entry, n: u8, source_dims: &[u64]) -> api::PutHeader {
    api::PutHeader {
        source_digest: bytes::Bytes::from(vec![n; 32]),
        digest_algorithm: "blake3".into(),
        struct_type: e.struct_type.clone(),
        dims: e.dims.clone(),
        device: e.device.clone(),
        payload_len: e.payload_len,
        source_name: "W".into(),
        model_path: String::new(),
        source_data_type: 1,
        source_dims: source_dims.to_vec(),
    }
}

/// A Put stream: `header`, then `data` in one chunk.
pub fn put_messages(header: api::PutHeader, data: Vec<u8>) -> Vec<api::PutRequest> {
    vec![
        api::PutRequest {
            part: Some(api::put_request::Part::Header(header)),
        },
        api::PutRequest {
            part: Some(api::put_request::Part::Data(bytes::Bytes::from(data))),
        },
    ]
}

/// The uid (and gid) attacks run as.
pub const NOBODY: u32 = 65534;

/// Whether this test may act as another uid (root, with `setpriv`).
pub fn can_switch_uid() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Command::new("setpriv").arg("--version").output().is_ok()
}

/// Whether this test can act as uid 65534; says the test is skipped when
/// not.
pub fn uid_switch_or_skip() -> bool {
    let can = can_switch_uid();
    if !can {
        eprintln!("skipped: needs root and setpriv to act as another uid");
    }
    can
}

/// Lets anyone search (and read) the folder `p`.
pub fn open_to_all(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The test `helper` of this binary, to be run as `uid` (its own group, no
/// others).
pub fn helper_as(uid: u32, helper: &str) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.args([
        format!("--reuid={uid}"),
        format!("--regid={uid}"),
        "--clear-groups".into(),
    ])
    .arg(std::env::current_exe().unwrap())
    .args(["--exact", helper, "--nocapture", "--test-threads=1"]);
    cmd
}

/// Runs the attack `helper` (a test of this binary) as uid 65534 with `env`
/// against the daemon `d`; returns its stdout after checking it printed
/// `marker`, and asserts what the attack cost the daemon
/// ([`assert_attack_cost`]): every attack is bounded in memory and CPU too.
pub fn run_as_nobody<V: AsRef<std::ffi::OsStr>>(
    d: &Daemon,
    helper: &str,
    env: &[(&str, V)],
    marker: &str,
) -> String {
    let pid = d.child.as_ref().expect("a daemon process").id();
    let before = usage(pid);
    let mut cmd = helper_as(NOBODY, helper);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains(marker),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_attack_cost(pid, before);
    stdout
}

/// A daemon binary whose socket uid 65534 may use, with `config` (TOML;
/// the tests' policy unless it has one).
pub fn daemon_for_nobody(config: &str) -> Daemon {
    let dir = tempfile::tempdir().unwrap().keep();
    let cfg = dir.join("ctcached.toml");
    let mut config = config.to_string();
    if !config.contains("[[policy]]") {
        config.push('\n');
        config.push_str(ctcache_testkit::TEST_POLICY_TOML);
    }
    std::fs::write(&cfg, config).unwrap();
    let d = Daemon::start_with(&["--config", cfg.to_str().unwrap()], |c| {
        c.env("CTCACHE_SOCKET_GROUP", NOBODY.to_string());
    });
    open_to_all(d.dir.path());
    open_to_all(d.socket.parent().unwrap());
    d
}

/// The daemon's event feed, followed from now.
pub async fn follow_events(c: &CompiledTensorCacheClient<Channel>) -> tonic::Streaming<api::Event> {
    c.clone()
        .events(api::EventsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The next event of `events` within `secs` seconds (panics naming `what`
/// when none comes or the stream ends).
pub async fn next_event(
    events: &mut tonic::Streaming<api::Event>,
    secs: u64,
    what: &str,
) -> api::Event {
    tokio::time::timeout(Duration::from_secs(secs), events.message())
        .await
        .unwrap_or_else(|_| panic!("{what} within {secs} s"))
        .unwrap()
        .expect("the stream stays open")
}

/// Materializes `req`'s model into `out` as a client does: the daemon
/// builds it in memory, this process writes the files (`link` places them).
pub async fn materialize_file(
    socket: &Path,
    req: api::MaterializeRequest,
    out: &Path,
    link: ctcache::materialize::LinkMode,
) -> Result<api::MaterializeResponse, ctcache_client::Error> {
    let c = ctcache_client::Client::connect_to(socket).await?;
    c.materialize_to(req, out, link, &Default::default()).await
}

/// The file name the store at `cache` gives the payload `blake3`: the
/// digest and the tag of its name key (`NAMEKEY`), as a root test may read.
pub fn payload_file_name(cache: &Path, blake3: &[u8; 32]) -> String {
    let text = std::fs::read_to_string(cache.join("NAMEKEY")).unwrap();
    let mut key = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut key).unwrap();
    let tag = blake3::keyed_hash(&key, blake3);
    format!(
        "{}.{}",
        hex::encode(blake3),
        hex::encode(&tag.as_bytes()[..16])
    )
}

/// What a daemon process has used so far: its peak resident memory (VmHWM,
/// KiB) and its CPU time (user and system), from /proc; an attack test
/// bounds what the attack made the daemon hold and spend.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub peak_kib: u64,
    pub cpu: Duration,
}

pub fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    // utime and stime, fields 14 and 15 of stat(5): the 12th and 13th after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Usage {
        peak_kib,
        cpu: Duration::from_millis(ticks * 1000 / per_sec),
    }
}

/// Asserts what an attack cost the daemon `pid` since `before`: under
/// 512 MiB at its peak and under 10 s of CPU time.
pub fn assert_attack_cost(pid: u32, before: Usage) {
    let after = usage(pid);
    assert!(after.peak_kib < 512 << 10, "{after:?}");
    assert!(
        after.cpu - before.cpu < Duration::from_secs(10),
        "{before:?} -> {after:?}"
    );
}
