//! The promise under faults (docs/operations/troubleshoot.md, "What ctcache promises"):
//! for a bounded time, clients resolve, look up, lease + map and read while
//! a writer prepacks new models of the watched folder, puts entries of its
//! own and materializes and embeds models, and a fault driver on a fixed
//! seed, every few seconds, does one of:
//! - SIGKILL of the daemon and a restart on the same folders (clients
//!   reconnect by themselves);
//! - the cache's file system full (a tmpfs of its own filled by a ballast
//!   file, then freed; only as root, else skipped and said so);
//! - a payload file of an acknowledged entry damaged on disk (a flipped
//!   byte, or a truncation);
//! - gc with a tight budget.
//!
//! Every byte a client receives is checked against `payload_blake3`. At the
//! end, after a last restart, every acknowledged entry (Put or Prepack
//! answered OK) that gc did not report removing, and whose payload the
//! driver did not damage, is read back and checked.
//!
//! The table: requests per RPC, errors by code and fault window, restarts
//! and their time to serving again, acknowledged and intact entries, damaged
//! payloads and what became of them, daemon RSS and open fds. The last line
//! is `soak: <N> requests, <R> restarts, <A> acknowledged, <L> lost, <W>
//! wrong bytes, <E> unexpected errors`; the exit status is non-zero unless
//! L, W and E are 0 and every restart served again within 2 s.
//!
//! Run with `tests/soak.sh [--seconds N] [--seed N] [--clients N]`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ctcache_client::{api, Client, Error, OpenOptions, ResolveOptions};
use ctcache_testkit::{
    digest_of_file, locate_bin, unit_f32, write_model, xorshift, Daemon, Figure, MatMul, On, Tmpfs,
};
use tonic::Code;

/// Weight side of each model (256 KiB of FLOAT per weight).
const SIDE: usize = 256;
/// Size of the cache's own file system when the disk-full fault can run.
const TMPFS_MIB: u64 = 160;
/// The longest a restarted daemon may take to serve again.
const SERVE_AGAIN_WITHIN: Duration = Duration::from_secs(2);

struct Args {
    seconds: u64,
    seed: u64,
    clients: usize,
}

fn args() -> Result<Args> {
    let mut a = Args {
        seconds: 60,
        seed: 1,
        clients: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            continue; // cargo bench passes it
        }
        let mut value = || -> Result<u64> {
            let v = it.next().with_context(|| format!("{flag} needs a value"))?;
            v.parse()
                .with_context(|| format!("{flag} {v}: not a number"))
        };
        match flag.as_str() {
            "--seconds" => a.seconds = value()?.max(1),
            "--seed" => a.seed = value()?,
            "--clients" => a.clients = value()?.max(1) as usize,
            other => bail!("unknown flag {other} (--seconds N, --seed N, --clients N)"),
        }
    }
    Ok(a)
}

fn main() {
    match args().and_then(run) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("soak: {e:#}");
            std::process::exit(2);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Restart,
    DiskFull,
    Damage,
    Gc,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Restart => "restart",
            Fault::DiskFull => "disk full",
            Fault::Damage => "damage",
            Fault::Gc => "gc",
        }
    }
}

/// An acknowledged entry: its payload's blake3 and file.
#[derive(Clone)]
struct Acked {
    blake3: String,
    path: PathBuf,
}

/// What every task shares.
#[derive(Default)]
struct Shared {
    models: Mutex<Vec<(PathBuf, [u8; 32])>>,
    acked: Mutex<HashMap<String, Acked>>,
    collected: Mutex<HashSet<String>>,
    /// Payload blake3 -> when the driver started damaging it.
    damaged: Mutex<HashMap<String, Instant>>,
    /// Fault windows: kind, start, end (`None`: still on).
    windows: Mutex<Vec<(Fault, Instant, Option<Instant>)>>,
    /// (rpc, outcome, window) -> count.
    outcomes: Mutex<BTreeMap<(&'static str, String, &'static str), u64>>,
    unexpected: Mutex<Vec<String>>,
    requests: AtomicU64,
    wrong_bytes: AtomicU64,
    /// Mapped bytes that changed after their lease began (the driver damaged
    /// the file under a live mapping: the client's own check caught it).
    changed_under_mapping: AtomicU64,
    restarts: Mutex<Vec<Duration>>,
    pid: AtomicU32,
    stop: AtomicBool,
}

impl Shared {
    fn open(&self, f: Fault) {
        self.windows.lock().unwrap().push((f, Instant::now(), None));
    }

    fn close(&self, f: Fault) {
        let mut w = self.windows.lock().unwrap();
        if let Some(open) = w.iter_mut().rev().find(|w| w.0 == f && w.2.is_none()) {
            open.2 = Some(Instant::now());
        }
    }

    /// The fault window overlapping `[from, now]` that explains `code`, if
    /// any (the first found, else any overlapping one for the table).
    fn window(&self, from: Instant, allows: impl Fn(Fault) -> bool) -> (Option<Fault>, bool) {
        let now = Instant::now();
        let w = self.windows.lock().unwrap();
        let over = |(_, s, e): &&(Fault, Instant, Option<Instant>)| {
            *s <= now && e.is_none_or(|e| e + Duration::from_millis(500) >= from)
        };
        if let Some(hit) = w.iter().filter(over).find(|x| allows(x.0)) {
            return (Some(hit.0), true);
        }
        (w.iter().rev().find(over).map(|x| x.0), false)
    }

    /// Counts one request and its outcome; an error outside the documented
    /// codes of the fault windows it overlaps is unexpected.
    fn record(&self, rpc: &'static str, from: Instant, r: Result<(), &Error>) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let (outcome, allows): (String, Box<dyn Fn(Fault) -> bool>) = match r {
            Ok(()) => ("OK".into(), Box::new(|_| true)),
            Err(e) if e.is_unreachable() => {
                ("UNAVAILABLE".into(), Box::new(|f| f == Fault::Restart))
            }
            Err(e) => match e.code() {
                Some(Code::ResourceExhausted) => (
                    "RESOURCE_EXHAUSTED".into(),
                    Box::new(|f| f == Fault::DiskFull),
                ),
                Some(Code::NotFound) => ("NOT_FOUND".into(), Box::new(|_| true)),
                Some(Code::DataLoss) => ("DATA_LOSS".into(), Box::new(|_| true)),
                Some(c) => (format!("{c:?}"), Box::new(|_| false)),
                None => (format!("client: {e}"), Box::new(|_| false)),
            },
        };
        let (window, mut allowed) = self.window(from, allows);
        match outcome.as_str() {
            // Collected by gc or dropped as damaged: any time.
            "NOT_FOUND" => allowed = matches!(rpc, "AcquireLease" | "ReadPayload" | "Put"),
            "DATA_LOSS" => allowed = !self.damaged.lock().unwrap().is_empty(),
            _ => {}
        }
        let label = window.map_or("none", Fault::name);
        *self
            .outcomes
            .lock()
            .unwrap()
            .entry((rpc, outcome.clone(), label))
            .or_default() += 1;
        if !allowed {
            let mut u = self.unexpected.lock().unwrap();
            if let Err(e) = r {
                u.push(format!("{rpc} ({label}): {outcome}: {e}"));
            }
        }
    }

    fn ack(&self, e: &api::Entry) {
        self.acked.lock().unwrap().insert(
            e.key.clone(),
            Acked {
                blake3: e.payload_blake3.clone(),
                path: PathBuf::from(&e.payload_path),
            },
        );
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
}

fn run(a: Args) -> Result<bool> {
    let bin = locate_bin("ctcached", "debug")?;
    let root = tempfile::Builder::new().prefix("ctcache-soak").tempdir()?;
    // As root the cache gets a small file system of its own to fill.
    let tmpfs = if unsafe { libc::geteuid() } == 0 {
        Some(Tmpfs::mount_at(
            &root.path().join("fs"),
            &format!("{TMPFS_MIB}m"),
        )?)
    } else {
        None
    };
    let cache = root.path().join("fs/cache");
    let daemon = Daemon::builder(&bin)
        .prefix("ctcache-soak")
        .cache_dir(&cache)
        .args(["--log-format", "human"])
        .env("CTCACHE_LOG_LEVEL", "warn")
        .start()?;
    println!(
        "daemon: {}; {} s, {} clients, seed {}; disk-full fault: {}",
        bin.display(),
        a.seconds,
        a.clients,
        a.seed,
        if tmpfs.is_some() {
            "on (tmpfs of 160 MiB)"
        } else {
            "skipped (needs root to mount a tmpfs)"
        }
    );
    let shared = Arc::new(Shared::default());
    shared.pid.store(pid_of(&daemon), Ordering::SeqCst);
    let daemon = Arc::new(Mutex::new(daemon));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let work = root.path().join("work");
    std::fs::create_dir_all(&work)?;
    let samples = rt.block_on(drive(&a, &daemon, tmpfs.is_some(), &work, shared.clone()))?;
    let (lost, checked) = rt.block_on(final_check(&daemon, &shared))?;
    let ok = report(&a, &shared, &samples, lost, checked, &cache)?;
    daemon.lock().unwrap().stop()?;
    drop(tmpfs);
    Ok(ok)
}

fn pid_of(d: &Daemon) -> u32 {
    d.child.as_ref().map_or(0, |c| c.0.id())
}

/// Runs writer, clients, sampler and fault driver for `a.seconds`; returns
/// the (RSS KiB, open fds) samples.
async fn drive(
    a: &Args,
    daemon: &Arc<Mutex<Daemon>>,
    can_fill: bool,
    work: &Path,
    shared: Arc<Shared>,
) -> Result<Vec<(u64, u64)>> {
    let (socket, models) = {
        let d = daemon.lock().unwrap();
        (d.socket.clone(), d.models.clone())
    };
    let admin = Client::connect_to(&socket).await?;
    let writer = tokio::spawn(writer(
        admin.clone(),
        models,
        work.to_path_buf(),
        shared.clone(),
    ));
    while shared.acked.lock().unwrap().is_empty() {
        if writer.is_finished() {
            writer.await??;
            bail!("the writer stopped before its first acknowledged entry");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut tasks = Vec::new();
    for i in 0..a.clients {
        let c = Client::connect_to(&socket).await?;
        tasks.push(tokio::spawn(client_loop(c, i as u64, shared.clone())));
    }
    let driver = tokio::spawn(fault_driver(
        a.seed,
        daemon.clone(),
        admin,
        can_fill,
        shared.clone(),
    ));
    let mut samples = Vec::new();
    let end = Instant::now() + Duration::from_secs(a.seconds);
    while Instant::now() < end && !driver.is_finished() && !writer.is_finished() {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if let Some(s) = sample(shared.pid.load(Ordering::SeqCst)) {
            samples.push(s);
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    driver.await??;
    writer.await??;
    for t in tasks {
        t.await??;
    }
    Ok(samples)
}

/// The daemon's RSS (KiB) and open file descriptors.
fn sample(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((rss, fds))
}

/// Writes a model into the watched folder and prepacks it (its entries
/// acknowledged), puts an entry of its own now and then, and materializes
/// and embeds recent models into `work`.
async fn writer(c: Client, models: PathBuf, work: PathBuf, shared: Arc<Shared>) -> Result<()> {
    let mut i = 0u32;
    while !shared.stopped() {
        i += 1;
        let path = models.join(format!("m{i}.onnx"));
        let w = xorshift(i.wrapping_mul(2654435761).max(1)).map(unit_f32);
        write_model(&path, &MatMul::new(SIDE, SIDE, w).encode());
        let digest: [u8; 32] = digest_of_file(&path, "W")
            .try_into()
            .map_err(|_| anyhow::anyhow!("digest is not 32 bytes"))?;
        shared.models.lock().unwrap().push((path.clone(), digest));
        prepack(&c, &path, &shared).await;
        if i.is_multiple_of(3) {
            put_copy(&c, i, &shared).await;
        }
        if i.is_multiple_of(4) {
            let out = work.join(format!("mat{i}.onnx"));
            let t = Instant::now();
            let req = api::MaterializeRequest {
                model_path: path.display().to_string(),
                target: "onnxruntime-int4".into(),
                ..Default::default()
            };
            let r = c
                .materialize_to(req, &out, Default::default(), &Default::default())
                .await;
            shared.record("Materialize", t, r.as_ref().map(|_| ()));
            let t = Instant::now();
            let r = c
                .embed(api::EmbedRequest {
                    model_path: path.display().to_string(),
                    output_path: work.join(format!("emb{i}.onnx")).display().to_string(),
                    ..Default::default()
                })
                .await;
            shared.record("Embed", t, r.as_ref().map(|_| ()));
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    Ok(())
}

/// Prepacks `path` and acknowledges every entry its jobs answered.
async fn prepack(c: &Client, path: &Path, shared: &Shared) {
    let t = Instant::now();
    let mut s = match c
        .prepack(api::PrepackRequest {
            model_path: path.display().to_string(),
            ..Default::default()
        })
        .await
    {
        Ok(s) => s,
        Err(e) => return shared.record("Prepack", t, Err(&e)),
    };
    loop {
        match s.next().await {
            Ok(Some(p)) => {
                let state = api::JobState::try_from(p.state).unwrap_or_default();
                match (state, &p.entry) {
                    (api::JobState::Done | api::JobState::Cached, Some(e)) => shared.ack(e),
                    (api::JobState::Failed, _) => {
                        // A job that failed for want of space is the
                        // RESOURCE_EXHAUSTED of a stream.
                        let full = p.error.contains("space") || p.error.contains("full");
                        let e = Error::Rpc {
                            rpc: "Prepack",
                            code: if full {
                                Code::ResourceExhausted
                            } else {
                                Code::Internal
                            },
                            message: p.error.clone(),
                        };
                        shared.record("Prepack job", t, Err(&e));
                    }
                    _ => {}
                }
            }
            Ok(None) => return shared.record("Prepack", t, Ok(())),
            Err(e) => return shared.record("Prepack", t, Err(&e)),
        }
    }
}

/// Puts the bytes of an acknowledged entry under a source digest of the
/// writer's own (a client-produced entry).
async fn put_copy(c: &Client, n: u32, shared: &Shared) {
    let t = Instant::now();
    let Ok(entries) = c
        .list(api::ListRequest {
            limit: 1,
            ..Default::default()
        })
        .await
    else {
        return;
    };
    let Some(e) = entries.into_iter().next() else {
        return;
    };
    let data = match c.read_payload(&e.key, 0, 0).await {
        Ok(d) => d,
        Err(err) => return shared.record("ReadPayload", t, Err(&err)),
    };
    if blake3::hash(&data).to_hex().as_str() != e.payload_blake3 {
        shared.wrong_bytes.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let mut digest = [0u8; 32];
    digest[..4].copy_from_slice(&n.to_le_bytes());
    digest[4..8].copy_from_slice(b"soak");
    let header = api::PutHeader {
        source_digest: bytes::Bytes::copy_from_slice(&digest),
        digest_algorithm: "blake3".into(),
        struct_type: e.struct_type.clone(),
        dims: e.dims.clone(),
        device: e.device.clone(),
        payload_len: e.payload_len,
        source_name: "W".into(),
        model_path: String::new(),
        source_data_type: 1,
        source_dims: vec![SIDE as u64, SIDE as u64],
    };
    let t = Instant::now();
    let r = c.put(header, bytes::Bytes::from(data)).await;
    shared.record("Put", t, r.as_ref().map(|_| ()));
    if let Ok(api::PutResponse {
        entry: Some(entry), ..
    }) = r
    {
        shared.ack(&entry);
    }
}

/// One client: ResolveModel, Lookup, lease + map and ReadPayload of an
/// entry found, every byte checked.
async fn client_loop(c: Client, seed: u64, shared: Arc<Shared>) -> Result<()> {
    let mut rng = xorshift((seed as u32).wrapping_add(7).max(1));
    let opts = OpenOptions {
        ttl: Duration::from_secs(30),
        verify: false,
        ..Default::default()
    };
    let no_packing = ResolveOptions {
        on_miss: api::OnMiss::None,
        ..Default::default()
    };
    while !shared.stopped() {
        let (path, digest) = {
            let m = shared.models.lock().unwrap();
            let back = (rng.next().unwrap_or(0) as usize % 8).min(m.len() - 1);
            m[m.len() - 1 - back].clone()
        };
        let t = Instant::now();
        let r = c.resolve_model(&path, &no_packing).await;
        shared.record("ResolveModel", t, r.as_ref().map(|_| ()));
        let t = Instant::now();
        let r = c
            .lookup(api::LookupRequest {
                source_digest: bytes::Bytes::copy_from_slice(&digest),
                digest_algorithm: "blake3".into(),
                ..Default::default()
            })
            .await;
        shared.record("Lookup", t, r.as_ref().map(|_| ()));
        let Some(entry) = r.ok().and_then(|r| r.entries.into_iter().next()) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let start = Instant::now();
        match c.open_payload_with(&entry, &opts).await {
            Ok(p) => {
                shared.record("AcquireLease", start, Ok(()));
                if blake3::hash(p.as_bytes()).to_hex().as_str() != entry.payload_blake3 {
                    // Damage the driver began after this lease was taken
                    // reached a live mapping: not a serve of wrong bytes.
                    let since = shared
                        .damaged
                        .lock()
                        .unwrap()
                        .get(&entry.payload_blake3)
                        .copied();
                    if since.is_some_and(|d| d > start) {
                        shared.changed_under_mapping.fetch_add(1, Ordering::Relaxed);
                    } else {
                        shared.wrong_bytes.fetch_add(1, Ordering::Relaxed);
                    }
                }
                let t = Instant::now();
                let r = p.release().await;
                shared.record("ReleaseLease", t, r.as_ref().map(|_| ()));
            }
            Err(e) => shared.record("AcquireLease", start, Err(&e)),
        }
        let t = Instant::now();
        match c.read_payload(&entry.key, 0, 0).await {
            Ok(data) => {
                shared.record("ReadPayload", t, Ok(()));
                if blake3::hash(&data).to_hex().as_str() != entry.payload_blake3 {
                    shared.wrong_bytes.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => shared.record("ReadPayload", t, Err(&e)),
        }
    }
    Ok(())
}

/// Every ~2.5 s one fault: restarts alternate with the others in an order
/// the seed shuffles.
async fn fault_driver(
    seed: u64,
    daemon: Arc<Mutex<Daemon>>,
    admin: Client,
    can_fill: bool,
    shared: Arc<Shared>,
) -> Result<()> {
    let mut rng = xorshift((seed as u32).wrapping_mul(2654435761).max(1));
    let mut others = Vec::new();
    let mut n = 0u64;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while !shared.stopped() {
        let fault = if n.is_multiple_of(2) {
            Fault::Restart
        } else {
            if others.is_empty() {
                others = vec![Fault::Damage, Fault::Gc];
                if can_fill {
                    others.push(Fault::DiskFull);
                }
                // Fisher-Yates on the seed.
                for i in (1..others.len()).rev() {
                    let j = rng.next().unwrap_or(0) as usize % (i + 1);
                    others.swap(i, j);
                }
            }
            others.pop().expect("refilled above")
        };
        n += 1;
        let pause = u64::from(rng.next().unwrap_or(0) % 300);
        match fault {
            Fault::Restart => restart(&daemon, &shared, pause).await?,
            Fault::DiskFull => fill_disk(&daemon, &shared).await?,
            Fault::Damage => damage(&shared, n),
            Fault::Gc => {
                shared.open(Fault::Gc);
                let t = Instant::now();
                let r = admin
                    .gc(api::GcRequest {
                        max_bytes: 2 << 20,
                        has_max_bytes: true,
                        ..Default::default()
                    })
                    .await;
                shared.record("Gc", t, r.as_ref().map(|_| ()));
                if let Ok(r) = r {
                    let mut c = shared.collected.lock().unwrap();
                    c.extend(r.removed.into_iter().map(|i| i.key));
                }
                shared.close(Fault::Gc);
            }
        }
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    Ok(())
}

/// SIGKILL, a pause of `pause_ms` (systemd's RestartSec), a new daemon on
/// the same folders; the time from its start to its first answer.
async fn restart(daemon: &Arc<Mutex<Daemon>>, shared: &Shared, pause_ms: u64) -> Result<()> {
    shared.open(Fault::Restart);
    let d = daemon.clone();
    let (socket, started) = tokio::task::spawn_blocking(move || -> Result<_> {
        let mut d = d.lock().unwrap();
        drop(d.child.take()); // SIGKILL, reaped
        std::thread::sleep(Duration::from_millis(pause_ms));
        let started = Instant::now();
        d.spawn(&[], |_| {})?;
        Ok((d.socket.clone(), started))
    })
    .await??;
    shared
        .pid
        .store(pid_of(&daemon.lock().unwrap()), Ordering::SeqCst);
    let probe = Client::connect_to(&socket).await?.retry_for(Duration::ZERO);
    loop {
        if probe.status().await.is_ok() {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the restarted daemon did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    shared.restarts.lock().unwrap().push(started.elapsed());
    shared.close(Fault::Restart);
    Ok(())
}

/// Fills the cache's file system with a ballast file, holds it 2 s, frees it.
async fn fill_disk(daemon: &Arc<Mutex<Daemon>>, shared: &Shared) -> Result<()> {
    let ballast = daemon
        .lock()
        .unwrap()
        .cache
        .parent()
        .context("cache folder has no parent")?
        .join("ballast");
    shared.open(Fault::DiskFull);
    let b = ballast.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut f = std::fs::File::create(&b)?;
        let chunk = vec![0x5au8; 1 << 20];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(e.into()),
            }
        }
        let _ = f.sync_all();
        Ok(())
    })
    .await??;
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::remove_file(&ballast)?;
    shared.close(Fault::DiskFull);
    Ok(())
}

/// Damages the payload file of an acknowledged entry: a flipped byte, or
/// (every other time) a truncation.
fn damage(shared: &Shared, n: u64) {
    let victim = {
        let acked = shared.acked.lock().unwrap();
        let damaged = shared.damaged.lock().unwrap();
        acked
            .values()
            .filter(|a| !damaged.contains_key(&a.blake3) && a.path.exists())
            .max_by_key(|a| a.blake3.clone())
            .cloned()
    };
    let Some(v) = victim else {
        return;
    };
    shared.open(Fault::Damage);
    shared
        .damaged
        .lock()
        .unwrap()
        .insert(v.blake3.clone(), Instant::now());
    let Ok(mut bytes) = std::fs::read(&v.path) else {
        return shared.close(Fault::Damage);
    };
    if n % 4 == 1 {
        bytes.truncate(bytes.len() / 2);
    } else if let Some(b) = {
        let at = bytes.len() / 3;
        bytes.get_mut(at)
    } {
        *b ^= 0x40;
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(&v.path, std::fs::Permissions::from_mode(0o644));
    let _ = std::fs::write(&v.path, &bytes);
    shared.close(Fault::Damage);
}

/// After a last restart, reads back every acknowledged entry gc did not
/// report removing and the driver did not damage; returns (lost, checked).
async fn final_check(daemon: &Arc<Mutex<Daemon>>, shared: &Arc<Shared>) -> Result<(u64, u64)> {
    restart(daemon, shared, 0).await?;
    let socket = daemon.lock().unwrap().socket.clone();
    let c = Client::connect_to(&socket).await?;
    let acked = shared.acked.lock().unwrap().clone();
    let collected = shared.collected.lock().unwrap().clone();
    let damaged = shared.damaged.lock().unwrap().clone();
    let (mut lost, mut checked) = (0, 0);
    for (key, a) in &acked {
        if collected.contains(key) || damaged.contains_key(&a.blake3) {
            continue;
        }
        checked += 1;
        match c.read_payload(key, 0, 0).await {
            Ok(data) if blake3::hash(&data).to_hex().as_str() == a.blake3 => {}
            Ok(_) => {
                shared.wrong_bytes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                lost += 1;
                shared
                    .unexpected
                    .lock()
                    .unwrap()
                    .push(format!("acknowledged {key} lost: {e}"));
            }
        }
    }
    Ok((lost, checked))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(
    a: &Args,
    shared: &Shared,
    samples: &[(u64, u64)],
    lost: u64,
    checked: u64,
    cache: &Path,
) -> Result<bool> {
    println!("\nrequests and outcomes (rpc, outcome, fault window):");
    let mut per_rpc: BTreeMap<&str, u64> = BTreeMap::new();
    for ((rpc, outcome, window), n) in shared.outcomes.lock().unwrap().iter() {
        *per_rpc.entry(rpc).or_default() += n;
        if outcome != "OK" {
            println!("  {rpc:>14}  {outcome:<20} {window:<10} {n:>7}");
        }
    }
    for (rpc, n) in &per_rpc {
        println!("  {rpc:>14}  {n:>7} requests");
    }
    let windows = shared.windows.lock().unwrap().clone();
    let mut by_kind: BTreeMap<Fault, u64> = BTreeMap::new();
    for w in &windows {
        *by_kind.entry(w.0).or_default() += 1;
    }
    println!(
        "faults: {}",
        by_kind
            .iter()
            .map(|(f, n)| format!("{} x{n}", f.name()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut restarts = shared.restarts.lock().unwrap().clone();
    restarts.sort();
    let (p50, p99) = (percentile(&restarts, 0.5), percentile(&restarts, 0.99));
    let slow = restarts.iter().filter(|d| **d > SERVE_AGAIN_WITHIN).count();
    println!(
        "restarts: {} (the last one after the run), serving again p50 {p50:.0?}, p99 {p99:.0?}, over {SERVE_AGAIN_WITHIN:?}: {slow}",
        restarts.len()
    );
    let damaged = shared.damaged.lock().unwrap().clone();
    let (mut repaired, mut gone, mut left) = (0, 0, 0);
    for blake3 in damaged.keys() {
        // Payload files are `<blake3>.<tag>` (the tag is the store's secret).
        let named = std::fs::read_dir(cache.join("blobs").join(&blake3[..2]))
            .into_iter()
            .flatten()
            .flatten()
            .find(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{blake3}."))
            });
        match named.map_or_else(
            || Err(std::io::ErrorKind::NotFound.into()),
            |e| std::fs::read(e.path()),
        ) {
            Ok(b) if blake3::hash(&b).to_hex().as_str() == blake3 => repaired += 1,
            Ok(_) => left += 1,
            Err(_) => gone += 1,
        }
    }
    println!(
        "damaged payloads: {} (repacked intact {repaired}, removed {gone}, still damaged on disk and never served {left}); changed under a live mapping and caught by the client: {}",
        damaged.len(),
        shared.changed_under_mapping.load(Ordering::Relaxed)
    );
    let acked = shared.acked.lock().unwrap().len() as u64;
    println!(
        "acknowledged entries: {acked}; gc reported removing {}; read back after the last restart: {checked}, lost {lost}",
        shared.collected.lock().unwrap().len()
    );
    let (rss_min, rss_max) = samples
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s.0), hi.max(s.0)));
    let (fd_min, fd_max) = samples
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), s| (lo.min(s.1), hi.max(s.1)));
    println!(
        "daemon RSS {}-{} MiB, open fds {fd_min}-{fd_max} over {} samples",
        rss_min.min(rss_max) >> 10,
        rss_max >> 10,
        samples.len()
    );
    let unexpected = shared.unexpected.lock().unwrap().clone();
    let mut distinct: BTreeMap<&str, u64> = BTreeMap::new();
    for u in &unexpected {
        *distinct.entry(u.as_str()).or_default() += 1;
    }
    for (u, n) in distinct.iter().take(30) {
        println!("unexpected (x{n}): {u}");
    }
    let requests = shared.requests.load(Ordering::Relaxed);
    let wrong = shared.wrong_bytes.load(Ordering::Relaxed);
    let errors = (unexpected.len() as u64).saturating_sub(lost);
    Figure::new(
        "soak.restart_p99",
        &format!(
            "{} s soak with faults: time from a restart to serving again, p99",
            a.seconds
        ),
        p99.as_secs_f64(),
        "s",
    )
    .target(On::Value, "<", SERVE_AGAIN_WITHIN.as_secs_f64())
    .print();
    Figure::new(
        "soak.wrong_bytes",
        "bytes served that differ from payload_blake3, under faults",
        wrong as f64,
        "payloads",
    )
    .target(On::Value, "<=", 0.0)
    .print();
    Figure::new(
        "soak.lost",
        "acknowledged entries lost under faults",
        lost as f64,
        "entries",
    )
    .target(On::Value, "<=", 0.0)
    .print();
    println!(
        "soak: {requests} requests, {} restarts, {acked} acknowledged, {lost} lost, {wrong} wrong bytes, {errors} unexpected errors",
        restarts.len()
    );
    Ok(lost == 0 && wrong == 0 && errors == 0 && slow == 0)
}
