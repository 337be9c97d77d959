//! Load on ctcached within its bounds: for a bounded time, `LOAD_BENCH_CLIENTS`
//! (default 32) clients, each on its own connection, loop over ResolveModel
//! (no packing), Lookup, AcquireLease + map + ReleaseLease (`open_payload`,
//! bytes checked against `payload_blake3`) and ReadPayload (checked the same
//! way), while models keep landing in the watched folder and a gc with a
//! small size budget runs every 200 ms.
//!
//! Pass criteria, printed with a verdict each:
//! - no error other than RESOURCE_EXHAUSTED (a documented bound) and
//!   NOT_FOUND of an entry gc collected between its Lookup and the lease or
//!   read (the documented race; counted and printed);
//! - no wrong bytes: every mapped or streamed payload hashes to its entry's
//!   `payload_blake3`;
//! - no entry served after it was collected: a lease or read that starts
//!   after a gc reported its entry removed fails with NOT_FOUND (models are
//!   never packed again: each lands once, under a new name and new weights);
//! - daemon RSS flat: its largest RSS in the second half of the run is at
//!   most 1.25x its largest in the first half (after a warm-up).
//!
//! It prints p50/p99 per RPC, also as `RESULT` lines
//! (`ctcache_testkit::Figure`, `load.*`) for bench/all.sh. The daemon binary as for open_payload_bench
//! (`ctcache_testkit::locate_bin`, release). Run with bench/load_bench.sh or
//! `cargo bench -p ctcache-client --bench load_bench`; environment:
//! LOAD_BENCH_SECS (default 20), LOAD_BENCH_CLIENTS (default 32).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use ctcache_client::{api, Client, Error, OpenOptions, ResolveOptions};
use ctcache_testkit::{
    digest_of_file, locate_bin, unit_f32, write_model, xorshift, Daemon, Figure, MatMul, On,
};
use tonic::Code;

/// The timed calls and the figure names their percentiles go under.
const FIGURES: [(&str, &str); 6] = [
    ("ResolveModel", "resolve"),
    ("Lookup", "lookup"),
    ("AcquireLease+map", "open"),
    ("ReleaseLease", "release"),
    ("ReadPayload", "read"),
    ("Gc", "gc"),
];

/// Size budget of the concurrent gc: a few models' entries.
const GC_BUDGET: u64 = 4 << 20;
/// Weight side of each model (256 KiB of FLOAT per weight).
const SIDE: usize = 256;

fn env_or(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn main() {
    if let Err(e) = run() {
        eprintln!("load_bench: {e:#}");
        std::process::exit(1);
    }
}

/// What every task shares: models written so far, keys gc removed (with
/// when it reported them), latencies and outcomes per RPC.
#[derive(Default)]
struct Shared {
    models: Mutex<Vec<(PathBuf, [u8; 32])>>,
    collected: Mutex<HashMap<String, Instant>>,
    latency: Mutex<BTreeMap<&'static str, Vec<Duration>>>,
    outcomes: Mutex<BTreeMap<(&'static str, String), u64>>,
    wrong_bytes: AtomicU64,
    served_after_gc: AtomicU64,
    stop: AtomicBool,
}

impl Shared {
    fn time(&self, rpc: &'static str, d: Duration) {
        self.latency.lock().unwrap().entry(rpc).or_default().push(d);
    }

    fn count(&self, rpc: &'static str, outcome: String) {
        *self
            .outcomes
            .lock()
            .unwrap()
            .entry((rpc, outcome))
            .or_default() += 1;
    }

    /// Whether gc reported `key` removed before `start`.
    fn collected_before(&self, key: &str, start: Instant) -> bool {
        self.collected
            .lock()
            .unwrap()
            .get(key)
            .is_some_and(|&t| t < start)
    }

    /// Records a refusal; fails on an error the bench does not allow.
    fn refused(&self, rpc: &'static str, e: &Error) -> Result<()> {
        let code = match e {
            Error::Rpc { code, .. } => *code,
            other => bail!("{rpc}: {other}"),
        };
        match code {
            Code::ResourceExhausted => self.count(rpc, "RESOURCE_EXHAUSTED".into()),
            Code::NotFound if matches!(rpc, "AcquireLease" | "ReadPayload") => {
                self.count(rpc, "NOT_FOUND (collected)".into())
            }
            _ => {
                self.count(rpc, format!("{code:?}"));
                bail!("{rpc}: {code:?}: {e}")
            }
        }
        Ok(())
    }
}

fn run() -> Result<()> {
    let secs = env_or("LOAD_BENCH_SECS", 20);
    let clients = env_or("LOAD_BENCH_CLIENTS", 32) as usize;
    let bin = locate_bin("ctcached", "release")?;
    println!("daemon: {}", bin.display());
    let mut daemon = Daemon::builder(bin)
        .prefix("ctcache-load-bench")
        .args(["--log-format", "human"])
        .env("CTCACHE_LOG_LEVEL", "warn")
        .start()?;
    let pid = daemon.child.as_ref().context("no daemon process")?.0.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let shared = Arc::new(Shared::default());
    let result = rt.block_on(drive(&daemon, pid, secs, clients, shared.clone()));
    daemon.stop_cleanly()?;
    let rss = result?;
    report(&shared, clients, secs, rss)
}

/// Runs the feeder, the gc loop, the clients and the RSS sampler for
/// `secs`; returns the RSS samples (KiB, one per 250 ms).
async fn drive(
    daemon: &Daemon,
    pid: u32,
    secs: u64,
    clients: usize,
    shared: Arc<Shared>,
) -> Result<Vec<u64>> {
    let admin = Client::connect_to(&daemon.socket).await?;
    // A first model, so clients have work from the start.
    let feeder = tokio::spawn(feed(daemon.models.clone(), shared.clone()));
    while shared.models.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gc = tokio::spawn(collect(admin, shared.clone()));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let c = Client::connect_to(&daemon.socket).await?;
        tasks.push(tokio::spawn(client_loop(c, i as u64, shared.clone())));
    }
    let mut rss = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        rss.push(rss_kib(pid)?);
        if tasks.iter().any(|t| t.is_finished()) || gc.is_finished() || feeder.is_finished() {
            break;
        }
    }
    shared.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await??;
    }
    gc.await??;
    feeder.await??;
    Ok(rss)
}

/// Writes a new model into the watched folder every 100 ms.
async fn feed(models: PathBuf, shared: Arc<Shared>) -> Result<()> {
    let mut i = 0u32;
    while !shared.stop.load(Ordering::SeqCst) {
        i += 1;
        let path = models.join(format!("m{i}.onnx"));
        let w = xorshift(i.wrapping_mul(2654435761).max(1)).map(unit_f32);
        write_model(&path, &MatMul::new(SIDE, SIDE, w).encode());
        let digest: [u8; 32] = digest_of_file(&path, "W")
            .try_into()
            .map_err(|_| anyhow::anyhow!("digest is not 32 bytes"))?;
        shared.models.lock().unwrap().push((path, digest));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Collects down to `GC_BUDGET` every 200 ms, noting what it removed.
async fn collect(admin: Client, shared: Arc<Shared>) -> Result<()> {
    while !shared.stop.load(Ordering::SeqCst) {
        let t = Instant::now();
        let r = admin
            .gc(api::GcRequest {
                max_bytes: GC_BUDGET,
                has_max_bytes: true,
                ..Default::default()
            })
            .await;
        shared.time("Gc", t.elapsed());
        match r {
            Ok(r) => {
                let now = Instant::now();
                let mut c = shared.collected.lock().unwrap();
                for item in r.removed {
                    c.entry(item.key).or_insert(now);
                }
                shared.count("Gc", "OK".into());
            }
            Err(e) => shared.refused("Gc", &e)?,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// One client: ResolveModel, Lookup, then lease + map and ReadPayload of
/// one entry found, until told to stop.
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
    while !shared.stop.load(Ordering::SeqCst) {
        let (path, digest) = {
            let m = shared.models.lock().unwrap();
            // Mostly recent models (likely packed and not yet collected).
            let back = (rng.next().unwrap_or(0) as usize % 8).min(m.len() - 1);
            m[m.len() - 1 - back].clone()
        };
        let t = Instant::now();
        let r = c.resolve_model(&path, &no_packing).await;
        shared.time("ResolveModel", t.elapsed());
        match r {
            Ok(_) => shared.count("ResolveModel", "OK".into()),
            Err(e) => shared.refused("ResolveModel", &e)?,
        }

        let t = Instant::now();
        let r = c
            .lookup(api::LookupRequest {
                source_digest: bytes::Bytes::copy_from_slice(&digest),
                digest_algorithm: "blake3".into(),
                ..Default::default()
            })
            .await;
        shared.time("Lookup", t.elapsed());
        let entries = match r {
            Ok(r) => {
                shared.count("Lookup", "OK".into());
                r.entries
            }
            Err(e) => {
                shared.refused("Lookup", &e)?;
                continue;
            }
        };
        let Some(entry) = entries.into_iter().next() else {
            continue;
        };

        let start = Instant::now();
        match c.open_payload_with(&entry, &opts).await {
            Ok(p) => {
                let open = start.elapsed();
                shared.time("AcquireLease+map", open);
                shared.count("AcquireLease", "OK".into());
                if shared.collected_before(&entry.key, start) {
                    shared.served_after_gc.fetch_add(1, Ordering::Relaxed);
                }
                if blake3::hash(p.as_bytes()).to_hex().as_str() != entry.payload_blake3 {
                    shared.wrong_bytes.fetch_add(1, Ordering::Relaxed);
                }
                let t = Instant::now();
                p.release().await.context("ReleaseLease")?;
                shared.time("ReleaseLease", t.elapsed());
            }
            Err(e) => shared.refused("AcquireLease", &e)?,
        }

        let start = Instant::now();
        let r = c.read_payload(&entry.key, 0, 0).await;
        shared.time("ReadPayload", start.elapsed());
        match r {
            Ok(data) => {
                shared.count("ReadPayload", "OK".into());
                if shared.collected_before(&entry.key, start) {
                    shared.served_after_gc.fetch_add(1, Ordering::Relaxed);
                }
                if blake3::hash(&data).to_hex().as_str() != entry.payload_blake3 {
                    shared.wrong_bytes.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => shared.refused("ReadPayload", &e)?,
        }
    }
    Ok(())
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS")
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "FAIL"
    }
}

fn report(shared: &Shared, clients: usize, secs: u64, rss: Vec<u64>) -> Result<()> {
    println!(
        "{clients} clients for {secs} s; {} models landed in the watched folder; gc budget {} MiB every 200 ms",
        shared.models.lock().unwrap().len(),
        GC_BUDGET >> 20
    );
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let mut latency = shared.latency.lock().unwrap();
    for (rpc, times) in latency.iter_mut() {
        times.sort();
        println!(
            "{rpc:>18}: {:>7} calls, p50 {:>8.0} µs, p99 {:>8.0} µs",
            times.len(),
            us(percentile(times, 0.5)),
            us(percentile(times, 0.99))
        );
    }
    for (rpc, figure) in FIGURES {
        let Some(times) = latency.get(rpc).filter(|t| !t.is_empty()) else {
            bail!("no {rpc} call completed");
        };
        for (p, q) in [("p50", 0.5), ("p99", 0.99)] {
            Figure::new(
                &format!("load.{figure}_{p}"),
                &format!("{rpc} under load ({clients} clients, watcher and gc busy), {p}"),
                us(percentile(times, q)),
                "µs",
            )
            .print();
        }
    }
    drop(latency);
    let mut bad = 0;
    for ((rpc, outcome), n) in shared.outcomes.lock().unwrap().iter() {
        let allowed = outcome == "OK"
            || outcome == "RESOURCE_EXHAUSTED"
            || outcome == "NOT_FOUND (collected)";
        if !allowed {
            bad += n;
        }
        println!("{rpc:>18}: {outcome}: {n}");
    }
    let collected = shared.collected.lock().unwrap().len();
    println!(
        "errors other than RESOURCE_EXHAUSTED / NOT_FOUND of a collected entry: {bad}: {}",
        verdict(bad == 0)
    );
    let wrong = shared.wrong_bytes.load(Ordering::Relaxed);
    println!(
        "payloads with wrong bytes: {wrong}: {}",
        verdict(wrong == 0)
    );
    let after = shared.served_after_gc.load(Ordering::Relaxed);
    println!(
        "entries served after gc reported them collected ({collected} collected): {after}: {}",
        verdict(after == 0)
    );
    // The first second is warm-up (connections, first packs).
    let steady = &rss[rss.len().min(4)..];
    let (first, second) = steady.split_at(steady.len() / 2);
    let peak = |s: &[u64]| s.iter().copied().max().unwrap_or(0);
    let ratio = peak(second) as f64 / peak(first).max(1) as f64;
    println!(
        "daemon RSS: peak {} MiB in the first half, {} MiB in the second: ratio {ratio:.2} (target <= 1.25): {}",
        peak(first) >> 10,
        peak(second) >> 10,
        verdict(ratio <= 1.25)
    );
    Figure::new(
        "load.rss_growth",
        "daemon peak RSS, second half of the run over the first",
        ratio,
        "x",
    )
    .target(On::Value, "<=", 1.25)
    .print();
    if bad > 0 || wrong > 0 || after > 0 || ratio > 1.25 {
        bail!("the load bench failed (see above)");
    }
    Ok(())
}
