//! `open_payload` of a 256 MiB entry against reading the same payload file
//! directly, in the same run, page cache warm for both sides:
//!
//! - time to first byte: `open_payload` (lease RPC + map) until the first
//!   4 KiB are copied out, vs `open` + `read` of the first 4 KiB;
//! - full read: `open_payload` + copy of every byte into a reused buffer vs
//!   `open` + `read` of the whole file into the same buffer (target: the
//!   client at least 0.95x direct); also "consume" (sum every byte in place:
//!   the mapped bytes vs read() + sum). The page cache is first as the
//!   daemon's write left it; then the file is evicted (posix_fadvise
//!   DONTNEED), read back from disk once by each side (cold figures, not
//!   targets) and the full read measured again: the folio sizes the page
//!   cache holds the file in set how many page faults a map takes;
//! - sharing: 8 processes each `open_payload` the entry and touch every page;
//!   the total PSS of the 8 (smaps_rollup) should stay within 1.2x of one
//!   payload;
//! - first serve: the daemon hashes a payload file the first time it serves
//!   it after a start; the first AcquireLease after a restart vs one read()
//!   of the whole file (median of 5 restarts; the next lease is printed
//!   too).
//!
//! The entry is real: a model with a W[8192, 8192] FLOAT MatMul weight is
//! prepacked by a `ctcached` started on a temp cache dir (gemm.pack_b.f32,
//! 256 MiB). The daemon binary (`ctcache_testkit::locate_bin`):
//! `$CTCACHE_BIN_DIR/ctcached`, else the release dir this bench was built
//! in, `$CARGO_TARGET_DIR/release`, `target/release`,
//! /var/tmp/ctcache-target/release (build it with
//! `cargo build --release -p ctcached`; bench/open_payload_bench.sh does).
//!
//! `cargo bench -p ctcache-client --bench open_payload_bench`. Environment:
//! OPEN_PAYLOAD_BENCH_REPS (default 21; medians are printed). Each figure is
//! also printed as a `RESULT` line (`ctcache_testkit::Figure`) for
//! bench/all.sh.

use std::fs::File;
use std::hint::black_box;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use ctcache_client::{api, Client};
use ctcache_testkit::{locate_bin, unit_f32, xorshift, Daemon, Figure, MatMul, On};

const K: usize = 8192;
const N: usize = 8192;
const FORMAT: &str = "gemm.pack_b.f32";
const PAGE: usize = 4096;
const CHILDREN: usize = 8;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        if let Err(e) = child(&args[2..]) {
            eprintln!("open_payload_bench child: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = run() {
        eprintln!("open_payload_bench: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let reps: usize = std::env::var("OPEN_PAYLOAD_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(21);
    let mut daemon = start_daemon()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = rt.block_on(Client::connect_to(&daemon.socket))?;

    // The entry: prepack the weight of a model written here.
    let model = daemon.dir.path().join("work/model.onnx");
    std::fs::write(&model, matmul_model())?;
    let t = Instant::now();
    let entry = rt.block_on(prepack(&client, &model))?;
    let pack_s = t.elapsed().as_secs_f64();
    // Its dirty pages would be written back during the measurements.
    std::fs::remove_file(&model)?;
    let len = entry.payload_len as usize;
    ensure!(
        len == K * N * 4,
        "the {FORMAT} payload is {len} bytes, not {}",
        K * N * 4
    );
    let path = PathBuf::from(&entry.payload_path);
    ensure!(
        path.is_file(),
        "the payload file {} is not readable here",
        path.display()
    );
    println!(
        "payload: {len} bytes ({} MiB), {FORMAT} of a {K} x {N} FLOAT weight (prepacked in {pack_s:.1} s), file {}",
        len >> 20,
        path.display()
    );
    println!(
        "page cache warm for both sides (as the daemon's write left it); median of {reps} runs each, direct and client interleaved"
    );

    // Warm the page cache (and the buffer), check both sides see the same bytes.
    let mut buf = vec![0u8; len];
    read_full(&path, &mut buf)?;
    let p = rt.block_on(client.open_payload(&entry))?;
    ensure!(p.is_mapped(), "open_payload did not map the payload file");
    ensure!(p[..] == buf[..], "the mapped bytes differ from the file's");
    rt.block_on(p.release())?;

    // Each measurement: (direct, client), in alternating order.
    let ttfb_direct = |buf: &mut [u8]| -> Result<Duration> {
        let t = Instant::now();
        let mut f = File::open(&path)?;
        let n = f.read(&mut buf[..PAGE])?;
        let d = t.elapsed();
        ensure!(n > 0, "empty read");
        Ok(d)
    };
    let ttfb_client = |buf: &mut [u8]| -> Result<Duration> {
        let t = Instant::now();
        let p = rt.block_on(client.open_payload(&entry))?;
        buf[..PAGE].copy_from_slice(&p[..PAGE]);
        let d = t.elapsed();
        rt.block_on(p.release())?;
        Ok(d)
    };
    let full_direct = |buf: &mut [u8]| -> Result<Duration> {
        let t = Instant::now();
        read_full(&path, buf)?;
        Ok(t.elapsed())
    };
    let full_client = |buf: &mut [u8]| -> Result<Duration> {
        let t = Instant::now();
        let p = rt.block_on(client.open_payload(&entry))?;
        buf.copy_from_slice(&p);
        let d = t.elapsed();
        rt.block_on(p.release())?;
        Ok(d)
    };
    let sum_direct = |buf: &mut [u8]| -> Result<Duration> {
        let t = Instant::now();
        read_full(&path, buf)?;
        black_box(sum(buf));
        Ok(t.elapsed())
    };
    let sum_client = |_: &mut [u8]| -> Result<Duration> {
        let t = Instant::now();
        let p = rt.block_on(client.open_payload(&entry))?;
        black_box(sum(&p));
        let d = t.elapsed();
        rt.block_on(p.release())?;
        Ok(d)
    };
    let fresh_faults = || -> Result<Duration> {
        let p = rt.block_on(client.open_payload(&entry))?;
        let t = Instant::now();
        let mut s = 0u8;
        for i in (0..p.len()).step_by(PAGE) {
            s = s.wrapping_add(black_box(p[i]));
        }
        let d = t.elapsed();
        black_box(s);
        rt.block_on(p.release())?;
        Ok(d)
    };
    let mut ttfb = Pairs::default();
    let mut full = Pairs::default();
    let mut consume = Pairs::default();
    let mut lease_rpc = Vec::new();
    let mut faults = Vec::new();
    for i in 0..reps {
        let client_first = i % 2 == 1;
        ttfb.run(client_first, &mut buf, &ttfb_direct, &ttfb_client)?;
        full.run(client_first, &mut buf, &full_direct, &full_client)?;
        consume.run(client_first, &mut buf, &sum_direct, &sum_client)?;
        black_box(&mut buf);
        // The parts of the client's time: the AcquireLease round trip, and
        // the page faults of a fresh map (one touch per 4 KiB page).
        let t = Instant::now();
        let l = rt.block_on(client.acquire_lease(&entry.key, Duration::from_secs(60)))?;
        lease_rpc.push(t.elapsed());
        rt.block_on(client.release_lease(l.lease_id))?;
        faults.push(fresh_faults()?);
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let gbps = |d: Duration| len as f64 / d.as_secs_f64() / 1e9;
    let (td, tc) = ttfb.medians();
    println!(
        "open_payload ttfb: {:.0} µs (direct {:.0} µs); of which the AcquireLease round trip alone: {:.0} µs",
        us(tc),
        us(td),
        us(median(lease_rpc))
    );
    Figure::new(
        "open_payload.ttfb",
        "open_payload time to first 4 KiB vs open + read",
        us(tc),
        "µs",
    )
    .anchor(us(td), us(td) / us(tc))
    .print();
    let (fd, fc) = full.medians();
    let direct_read = fd;
    let (fd, fc) = (gbps(fd), gbps(fc));
    let r = fc / fd;
    println!(
        "throughput: client {fc:.2} GB/s, direct {fd:.2} GB/s, ratio {r:.3} (target >= 0.95): {}",
        verdict(r >= 0.95)
    );
    Figure::new(
        "open_payload.throughput",
        &format!(
            "open_payload + copy of a {} MiB entry vs read() of its file",
            len >> 20
        ),
        fc,
        "GB/s",
    )
    .anchor(fd, r)
    .target(On::Ratio, ">=", 0.95)
    .print();
    println!(
        "  of the client's time: page faults of a fresh map {:.1} ms (one touch per 4 KiB page), the rest is the copy",
        median(faults).as_secs_f64() * 1e3
    );
    let (sd, sc) = consume.medians();
    let (sd, sc) = (gbps(sd), gbps(sc));
    println!(
        "consume (sum every byte): client {sc:.2} GB/s (mapped, no copy), direct {sd:.2} GB/s (read + sum), ratio {:.3}",
        sc / sd
    );
    Figure::new(
        "open_payload.consume",
        "sum of every byte: mapped entry vs read() + sum",
        sc,
        "GB/s",
    )
    .anchor(sd, sc / sd)
    .print();

    // The same once the payload has been read back from disk (as after a
    // reboot or an eviction): how the page cache holds the file (its folio
    // sizes: the daemon's writes and a read-back leave it differently) sets
    // how many page faults a map of it takes.
    evict(&path)?;
    let cold_direct = full_direct(&mut buf)?;
    evict(&path)?;
    let t = Instant::now();
    let p = rt.block_on(client.open_payload(&entry))?;
    buf.copy_from_slice(&p);
    let cold = t.elapsed();
    rt.block_on(p.release())?;
    let mut back = Pairs::default();
    let mut back_faults = Vec::new();
    for i in 0..reps {
        back.run(i % 2 == 1, &mut buf, &full_direct, &full_client)?;
        back_faults.push(fresh_faults()?);
    }
    let (bd, bc) = back.medians();
    let (bd, bc) = (gbps(bd), gbps(bc));
    println!(
        "read back from disk (file evicted before each): cold read client {:.2} GB/s, direct {:.2} GB/s (disk-bound, noisy)",
        gbps(cold),
        gbps(cold_direct),
    );
    println!(
        "  then warm, as the client's read-back left the page cache: client {bc:.2} GB/s, direct {bd:.2} GB/s, ratio {:.3}; page faults of a fresh map {:.1} ms",
        bc / bd,
        median(back_faults).as_secs_f64() * 1e3
    );
    drop(buf);

    pss(&daemon.socket, &entry, &path, len)?;
    drop(client);

    // Integrity on serve: the first time a payload is served after the
    // daemon starts, the daemon hashes its file (then remembers it).
    let (first, later) = first_serves(&rt, &mut daemon, &entry.key, FIRST_SERVE_REPS)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (first, later, read) = (ms(median(first)), ms(median(later)), ms(direct_read));
    println!(
        "first serve after a daemon start (hashes the {} MiB file): AcquireLease {first:.1} ms, the next one {:.0} µs; read() of the whole file {read:.1} ms, ratio {:.2} (median of {FIRST_SERVE_REPS} restarts)",
        len >> 20,
        later * 1e3,
        read / first
    );
    Figure::new(
        "open_payload.first_serve",
        "first AcquireLease after a daemon start (hashes the payload) vs read() of the file",
        first,
        "ms",
    )
    .anchor(read, read / first)
    .print();

    drop(rt);
    daemon.stop_cleanly()
}

/// Daemon restarts the first-serve figure takes.
const FIRST_SERVE_REPS: usize = 5;

/// After each of `reps` daemon restarts, the first AcquireLease of `key`
/// (the daemon hashes the payload file before granting it) and the one
/// right after (the file is known good by then), both timed.
fn first_serves(
    rt: &tokio::runtime::Runtime,
    daemon: &mut Daemon,
    key: &str,
    reps: usize,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let (mut first, mut later) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        daemon.stop_cleanly()?;
        daemon.spawn(&[], |_| {})?;
        let client = rt.block_on(Client::connect_to(&daemon.socket))?;
        for times in [&mut first, &mut later] {
            let t = Instant::now();
            let l = rt.block_on(client.acquire_lease(key, Duration::from_secs(60)))?;
            times.push(t.elapsed());
            rt.block_on(client.release_lease(l.lease_id))?;
        }
    }
    Ok((first, later))
}

/// Times of one measurement, direct and through the client.
#[derive(Default)]
struct Pairs {
    direct: Vec<Duration>,
    client: Vec<Duration>,
}

type Measure<'a> = &'a dyn Fn(&mut [u8]) -> Result<Duration>;

impl Pairs {
    fn run(
        &mut self,
        client_first: bool,
        buf: &mut [u8],
        direct: Measure,
        client: Measure,
    ) -> Result<()> {
        if client_first {
            self.client.push(client(buf)?);
            self.direct.push(direct(buf)?);
        } else {
            self.direct.push(direct(buf)?);
            self.client.push(client(buf)?);
        }
        Ok(())
    }

    /// (direct, client) medians.
    fn medians(self) -> (Duration, Duration) {
        (median(self.direct), median(self.client))
    }
}

/// PSS of 8 processes that each open_payload the entry and touch every page.
/// This process holds no map of the file meanwhile (it would take a share).
fn pss(socket: &Path, entry: &api::Entry, path: &Path, len: usize) -> Result<()> {
    let me = std::env::current_exe()?;
    let mut kids = Children(Vec::new());
    for _ in 0..CHILDREN {
        let c = Command::new(&me)
            .arg("--child")
            .arg(socket)
            .arg(&entry.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("spawning a child")?;
        kids.0.push(c);
    }
    for c in &mut kids.0 {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().expect("piped"))
            .read_line(&mut line)
            .context("reading a child's readiness")?;
        ensure!(
            line.starts_with("ready"),
            "child {} failed before mapping the payload",
            c.id()
        );
    }
    let canon = path.canonicalize()?;
    let mut total_kib = 0u64;
    let mut map_pss_kib = 0u64;
    let mut map_rss_kib = 0u64;
    for c in &kids.0 {
        let pid = c.id();
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .with_context(|| format!("reading /proc/{pid}/smaps_rollup"))?;
        total_kib += field_kib(&rollup, "Pss:")
            .ok_or_else(|| anyhow!("no Pss in /proc/{pid}/smaps_rollup"))?;
        let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
        let (p, r) = mapping_kib(&smaps, &canon);
        ensure!(
            r > 0,
            "child {pid} has no resident map of {}",
            canon.display()
        );
        map_pss_kib += p;
        map_rss_kib += r;
    }
    let mib = |kib: u64| kib as f64 / 1024.0;
    let one = len as f64 / (1 << 20) as f64;
    let q = mib(total_kib) / one;
    println!(
        "pss: {CHILDREN} processes total {:.1} MiB for a {one:.0} MiB payload, ratio {q:.3} (target <= 1.2): {}",
        mib(total_kib),
        verdict(q <= 1.2)
    );
    Figure::new(
        "open_payload.pss",
        &format!("total PSS of {CHILDREN} processes mapping the entry vs one payload"),
        mib(total_kib),
        "MiB",
    )
    .anchor(one, q)
    .target(On::Ratio, "<=", 1.2)
    .print();
    println!(
        "pss of the payload map alone: {:.1} MiB in all ({:.1} MiB each), rss of the map {:.1} MiB each; one payload: {one:.0} MiB",
        mib(map_pss_kib),
        mib(map_pss_kib) / CHILDREN as f64,
        mib(map_rss_kib) / CHILDREN as f64
    );
    kids.finish()
}

/// The 8 children: closing stdin makes each release its lease and exit.
struct Children(Vec<Child>);

impl Children {
    fn finish(mut self) -> Result<()> {
        for c in &mut self.0 {
            c.stdin.take();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for c in &mut self.0 {
            loop {
                if let Some(s) = c.try_wait()? {
                    ensure!(s.success(), "child {} exited with {s}", c.id());
                    break;
                }
                ensure!(Instant::now() < deadline, "child {} did not exit", c.id());
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.0.clear();
        Ok(())
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `--child SOCKET KEY`: open_payload, touch every page, say "ready", wait
/// for stdin to close, release.
fn child(args: &[String]) -> Result<()> {
    let [socket, key] = args else {
        bail!("usage: --child SOCKET KEY");
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let client = rt.block_on(Client::connect_to(socket))?;
    let entry = api::Entry {
        key: key.clone(),
        ..Default::default()
    };
    let p = rt.block_on(client.open_payload(&entry))?;
    ensure!(p.is_mapped(), "the payload is not mapped");
    let mut s = 0u64;
    for i in (0..p.len()).step_by(PAGE) {
        s = s.wrapping_add(u64::from(black_box(p[i])));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {s}")?;
    out.flush()?;
    drop(out);
    let mut sink = Vec::new();
    std::io::stdin().read_to_end(&mut sink)?;
    rt.block_on(p.release())?;
    Ok(())
}

/// Drops the file's pages from the page cache (they are clean: the store
/// fsyncs payloads; nothing maps the file now).
fn evict(path: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = File::open(path)?;
    // SAFETY: posix_fadvise only reads its integer arguments.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    ensure!(r == 0, "posix_fadvise(DONTNEED): error {r}");
    Ok(())
}

fn read_full(path: &Path, buf: &mut [u8]) -> Result<()> {
    let mut f = File::open(path)?;
    f.read_exact(buf)?;
    Ok(())
}

fn sum(bytes: &[u8]) -> u64 {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .fold(0u64, u64::wrapping_add)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "PASS"
    } else {
        "MISS"
    }
}

/// `NAME   123 kB` in a smaps file.
fn field_kib(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// (Pss, Rss) in KiB of the maps of `file` in a /proc/PID/smaps text.
fn mapping_kib(smaps: &str, file: &Path) -> (u64, u64) {
    let want = file.to_string_lossy();
    let (mut pss, mut rss) = (0, 0);
    let mut inside = false;
    for line in smaps.lines() {
        let mut it = line.split_whitespace();
        let Some(first) = it.next() else { continue };
        if !first.ends_with(':') {
            // A map header: range perms offset dev inode [path].
            let path = line.splitn(6, char::is_whitespace).nth(5).unwrap_or("");
            inside = path.trim() == want;
            continue;
        }
        if inside {
            let v = it.next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            match first {
                "Pss:" => pss += v,
                "Rss:" => rss += v,
                _ => {}
            }
        }
    }
    (pss, rss)
}

/// Prepacks W with gemm.pack_b.f32 on the CPU and returns the entry.
async fn prepack(client: &Client, model: &Path) -> Result<api::Entry> {
    let req = api::PrepackRequest {
        model_path: model.display().to_string(),
        initializers: vec!["W".into()],
        formats: vec![api::FormatSpec {
            id: FORMAT.into(),
            params: Default::default(),
        }],
        backend: api::Backend::Cpu.into(),
        handout: String::new(),
    };
    let mut stream = client.prepack(req).await?;
    let mut last = None;
    while let Some(p) = stream.next().await? {
        match p.state() {
            api::JobState::Failed | api::JobState::Cancelled => {
                bail!("prepack failed: {}", p.error)
            }
            api::JobState::Done | api::JobState::Cached => last = p.entry,
            _ => {}
        }
    }
    last.ok_or_else(|| anyhow!("prepack ended without an entry"))
}

/// Y = X @ W with W[K, N] FLOAT (xorshift values), inline raw_data.
fn matmul_model() -> Vec<u8> {
    MatMul::new(K, N, xorshift(0x9E37_79B9).map(unit_f32))
        .producer("open_payload_bench")
        .encode()
}

/// A ctcached on `T/cache`, `T/s.sock` (see the module doc for its binary).
fn start_daemon() -> Result<Daemon> {
    let bin = locate_bin("ctcached", "release")?;
    println!("daemon: {}", bin.display());
    Daemon::builder(bin)
        .prefix("ctcache-open-bench")
        .args(["--log-format", "human"])
        .start()
}
