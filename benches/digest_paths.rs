//! Where a digest's time goes: the D3 digest of a model's external data
//! (`ctcache::digest::digest_all`, the path `ctcachectl digest` and the
//! daemon take) against blake3 of the same bytes already in memory (the
//! anchor: hashing alone), and the ways to bring file pages in that the
//! digest could use instead of its plain mapping: MAP_POPULATE,
//! MADV_SEQUENTIAL, MADV_WILLNEED, MADV_POPULATE_READ per 16 MiB chunk, and
//! pread into reused buffers. Each is hashed the way digest_all hashes (one
//! task per tensor, blake3's rayon mode inside), best of REPS, alternating.
//!
//! `cargo bench -p ctcache --bench digest_paths -- MODEL.onnx DATA.bin`;
//! `digest_paths --once MODEL.onnx` only prints the model's digests (the
//! process floor bench/digest_bench.sh times beside `ctcachectl digest`).
//! (bench/digest_bench.sh passes its model; DATA is the one external-data
//! file, whose tensors split it into equal parts). Prints `digest.memory`
//! as a RESULT line (`ctcache_testkit::Figure`) for bench/all.sh.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use ctcache::digest::{digest_all, Algorithm};
use ctcache::onnx::Model;
use ctcache_testkit::Figure;
use memmap2::{Advice, Mmap, MmapOptions};
use rayon::prelude::*;

const CHUNK: usize = 16 << 20;
const READ_BUFFER: usize = 1 << 20;

/// How a variant brings the bytes in before (or while) hashing them.
#[derive(Clone, Copy)]
enum Reading {
    Memory,
    Map,
    MapPopulate,
    Sequential,
    WillNeed,
    PopulateChunks,
    Pread,
}

impl Reading {
    fn name(self) -> &'static str {
        match self {
            Reading::Memory => "memory (resident buffer)",
            Reading::Map => "mmap",
            Reading::MapPopulate => "mmap MAP_POPULATE",
            Reading::Sequential => "mmap + MADV_SEQUENTIAL",
            Reading::WillNeed => "mmap + MADV_WILLNEED",
            Reading::PopulateChunks => "mmap + MADV_POPULATE_READ per 16 MiB",
            Reading::Pread => "pread into reused 1 MiB buffers",
        }
    }
}

fn parts(len: usize, n: usize) -> Vec<std::ops::Range<usize>> {
    let per = len / n;
    (0..n).map(|i| i * per..(i + 1) * per).collect()
}

/// Hashes `n` equal parts of `bytes`, one task per part (as digest_all).
fn hash_parts(bytes: &[u8], n: usize, populate: Option<&Mmap>) -> Vec<blake3::Hash> {
    parts(bytes.len(), n)
        .into_par_iter()
        .map(|r| {
            let mut h = blake3::Hasher::new();
            let mut at = r.start;
            while at < r.end {
                let end = if populate.is_some() {
                    (at + CHUNK).min(r.end)
                } else {
                    r.end
                };
                if let Some(map) = populate {
                    // A hint: a refusal only leaves the pages to faults.
                    let _ = map.advise_range(Advice::PopulateRead, at, end - at);
                }
                h.update_rayon(&bytes[at..end]);
                at = end;
            }
            h.finalize()
        })
        .collect()
}

fn pread_parts(file: &File, len: usize, n: usize) -> Vec<blake3::Hash> {
    parts(len, n)
        .into_par_iter()
        .map_init(
            || vec![0u8; READ_BUFFER],
            |buf, r| {
                let mut h = blake3::Hasher::new();
                let mut at = r.start;
                while at < r.end {
                    let end = (at + READ_BUFFER).min(r.end);
                    file.read_exact_at(&mut buf[..end - at], at as u64)
                        .expect("read the data file");
                    h.update(&buf[..end - at]);
                    at = end;
                }
                h.finalize()
            },
        )
        .collect()
}

/// One timed run of `reading` over the data file (hashing only, for Memory).
fn run(reading: Reading, file: &File, resident: &[u8], n: usize) -> (Duration, Vec<blake3::Hash>) {
    let len = resident.len();
    // SAFETY (all maps here): the bench's own data file, read-only, not
    // modified while mapped.
    let map = || unsafe { Mmap::map(file) }.expect("map the data file");
    let t = Instant::now();
    let hashes = match reading {
        Reading::Memory => hash_parts(resident, n, None),
        Reading::Map => hash_parts(&map(), n, None),
        Reading::MapPopulate => {
            let m = unsafe { MmapOptions::new().populate().map(file) }.expect("map");
            hash_parts(&m, n, None)
        }
        Reading::Sequential | Reading::WillNeed => {
            let m = map();
            let advice = match reading {
                Reading::Sequential => Advice::Sequential,
                _ => Advice::WillNeed,
            };
            m.advise(advice).expect("madvise");
            hash_parts(&m, n, None)
        }
        Reading::PopulateChunks => {
            let m = map();
            hash_parts(&m, n, Some(&m))
        }
        Reading::Pread => pread_parts(file, len, n),
    };
    (t.elapsed(), hashes)
}

fn best(times: &[Duration]) -> Duration {
    times.iter().copied().min().unwrap_or_default()
}

/// `--once MODEL`: the digest of MODEL as `ctcachectl digest` computes it,
/// printed, and nothing else: bench/digest_bench.sh times this process as
/// the floor of the command (no command line, a small binary to start).
fn once(model_path: &str) {
    let model = Model::open(model_path).expect("open the model");
    let tensors = model.initializers().expect("list initializers");
    let mut out = String::new();
    for (t, d) in tensors
        .iter()
        .zip(digest_all(&model, &tensors, Algorithm::Blake3))
    {
        out.push_str(&format!("{} {}\n", t.name, d.expect("digest").hex()));
    }
    std::io::stdout()
        .write_all(out.as_bytes())
        .expect("write the digests");
}

fn main() {
    let all: Vec<String> = std::env::args().collect();
    if let Some(i) = all.iter().position(|a| a == "--once") {
        let Some(model) = all.get(i + 1) else {
            eprintln!("usage: digest_paths --once MODEL.onnx");
            std::process::exit(2);
        };
        return once(model);
    }
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let [model_path, data_path] = &args[..] else {
        eprintln!("usage: digest_paths MODEL.onnx DATA.bin");
        std::process::exit(2);
    };
    let reps: usize = std::env::var("DIGEST_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let file = File::open(data_path).expect("open the data file");
    let resident = std::fs::read(data_path).expect("read the data file");
    let bytes = resident.len() as f64;
    let model = Model::open(model_path).expect("open the model");
    let tensors = model.initializers().expect("list initializers");
    let n = tensors.len().max(1);

    let readings = [
        Reading::Memory,
        Reading::Map,
        Reading::MapPopulate,
        Reading::Sequential,
        Reading::WillNeed,
        Reading::PopulateChunks,
        Reading::Pread,
    ];
    let mut times = vec![Vec::new(); readings.len()];
    let mut digest_times = Vec::new();
    let want = hash_parts(&resident, n, None);
    for _ in 0..reps {
        let t = Instant::now();
        for d in digest_all(&model, &tensors, Algorithm::Blake3) {
            d.expect("digest");
        }
        digest_times.push(t.elapsed());
        for (i, &p) in readings.iter().enumerate() {
            let (t, hashes) = run(p, &file, &resident, n);
            assert_eq!(hashes, want, "{} hashed other bytes", p.name());
            times[i].push(t);
        }
    }
    let gbs = |d: Duration| bytes / d.as_secs_f64() / 1e9;
    let memory = best(&times[0]);
    let digest = best(&digest_times);
    println!(
        "{} MiB in {n} parts, best of {reps} (GB/s; time over the in-memory hash):",
        resident.len() >> 20
    );
    println!(
        "  {:<40} {:>6.2} GB/s  {:.2}x",
        "ctcache digest_all (plain mmap)",
        gbs(digest),
        digest.as_secs_f64() / memory.as_secs_f64()
    );
    for (p, t) in readings.iter().zip(&times) {
        let b = best(t);
        println!(
            "  {:<40} {:>6.2} GB/s  {:.2}x",
            p.name(),
            gbs(b),
            b.as_secs_f64() / memory.as_secs_f64()
        );
    }
    Figure::new(
        "digest.memory",
        "D3 digest of the mapped external data vs blake3 of the same bytes in memory",
        gbs(digest),
        "GB/s",
    )
    .anchor(gbs(memory), memory.as_secs_f64() / digest.as_secs_f64())
    .print();
}
