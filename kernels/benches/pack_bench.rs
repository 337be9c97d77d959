//! Packing throughput on a 4096 x 4096 FLOAT weight (random normal): input
//! GB/s of each GPU-capable packer on the CPU and on wgpu (when an adapter
//! exists; upload and read-back included), next to its anchor measured in
//! the same run on the same data: onnxruntime `quantize_matmul_4bits` and
//! gguf `quants.quantize` (through the venv's Python), the `half` crate's
//! slice conversion and a plain memcpy. Then the peak RSS of
//! `ctcachectl pack` on a model holding that weight.
//!
//!
//! Then, on the CPU only: the time of every packer with each kernel
//! instruction set of this CPU (scalar, AVX2, AVX-512; same bytes, checked),
//! and the effect of huge pages on output buffers: the first-touch cost of
//! a 1 GiB buffer as a `Vec` and as an anonymous mapping advised
//! `MADV_HUGEPAGE` (`ctcache_kernels::OutputBuffer`), and packing into a
//! fresh buffer of each kind.
//!
//! `cargo bench -p ctcache-kernels --bench pack_bench` (or
//! bench/pack_bench.sh). Environment: CTCACHE_VENV (default
//! /var/tmp/ctcache-venv), CTCACHECTL (default
//! $CARGO_TARGET_DIR/release/ctcachectl), PACK_BENCH_REPS (default 3),
//! PACK_BENCH_QUICK=1 (only the instruction-set and huge-page figures).
//!
//! Each figure of the anchored packers (per backend and per instruction
//! set) and the peak RSS are also printed as `RESULT` lines
//! (`ctcache_testkit::Figure`) for bench/all.sh.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ctcache::dtype::DataType;
use ctcache_kernels::gpu::{cpu_assist, GpuBackend};
use ctcache_kernels::{find, Isa, OutputBuffer, Params, SourceTensor};
use ctcache_testkit::{Figure, On};
use half::slice::HalfFloatSliceExt;

const K: usize = 4096;
const N: usize = 4096;
const PACKERS: [&str; 4] = ["ort.matmul_nbits", "ggml.q8_0", "ggml.q4_0", "cast.f16"];
/// The instruction-set table's case of each of `PACKERS` (FLOAT source,
/// default parameters), in the same order.
const ANCHORED_CASES: [&str; 4] = ["matmul_nbits b4 sym", "ggml.q8_0", "ggml.q4_0", "cast.f16"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--rss-child") {
        rss_child(&args[2..]);
        return;
    }
    let reps: usize = std::env::var("PACK_BENCH_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let data = weight();
    let bytes = data.len() as f64;
    let gbps = |d: Duration| bytes / d.as_secs_f64() / 1e9;
    println!(
        "weight: {K} x {N} FLOAT, random normal ({} MiB); best of {reps}",
        data.len() >> 20
    );
    if std::env::var("PACK_BENCH_ONLY").is_ok_and(|v| v == "reference") {
        reference_table(&data, reps);
        return;
    }
    if std::env::var("PACK_BENCH_QUICK").is_ok_and(|v| v == "1") {
        isa_table(&data, reps, &[]);
        huge_pages(&data, reps);
        return;
    }
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[K as u64, N as u64],
        data: &data,
    };
    let params = Params::new();
    let gpu = GpuBackend::shared();
    match &gpu {
        Ok(g) => println!("wgpu adapter: {:?}", g.adapter_info()),
        Err(e) => println!("wgpu: {e} (GPU figures skipped)"),
    }
    let mut cpu = Vec::new();
    let mut wgpu = Vec::new();
    for id in PACKERS {
        let p = find(id).expect("packer");
        let len = p
            .output(src.data_type, src.dims, &params)
            .expect("layout")
            .payload_len;
        let mut out = vec![0u8; len as usize];
        cpu.push(gbps(best(reps, || {
            p.pack(&src, &params, &mut out).expect("pack");
            black_box(&mut out);
        })));
        let want = out.clone();
        wgpu.push(gpu.as_ref().ok().map(|g| {
            let t = best(reps, || {
                g.pack(id, &src, &params, &mut out).expect("gpu pack");
                black_box(&mut out);
            });
            assert!(out == want, "{id}: GPU bytes differ from the CPU's");
            gbps(t)
        }));
    }
    // Anchors.
    let floats: Vec<f32> = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let mut halves = vec![half::f16::ZERO; floats.len()];
    let half_gbps = gbps(best(reps, || {
        halves.convert_from_f32_slice(black_box(&floats));
        black_box(&mut halves);
    }));
    let mut copy = vec![0u8; data.len()];
    let memcpy_gbps = gbps(best(reps, || {
        copy.copy_from_slice(black_box(&data));
        black_box(&mut copy);
    }));
    let dir = std::env::temp_dir().join(format!("ctcache-pack-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let raw = dir.join("weights.bin");
    std::fs::write(&raw, &data).expect("write weight");
    let py = python_anchors(&raw, reps);
    let anchor = |name: &str| py.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
    let anchors: [Anchor; 4] = [
        ("onnxruntime quantize_matmul_4bits", anchor("ort"), 4.0),
        ("gguf quantize Q8_0", anchor("q8_0"), 5.0),
        ("gguf quantize Q4_0", anchor("q4_0"), 5.0),
        ("half convert_from_f32_slice", Some(half_gbps), 0.8),
    ];
    println!();
    println!(
        "{:<18} {:>9} {:>9}   {:<34} {:>9} {:>10} {:>10} {:>7}",
        "packer", "cpu GB/s", "wgpu GB/s", "anchor", "GB/s", "cpu/anchor", "wgpu/anch", "target"
    );
    for (i, id) in PACKERS.iter().enumerate() {
        let (name, a, target) = anchors[i];
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let ratio = |v: Option<f64>| match (v, a) {
            (Some(v), Some(a)) => format!("{:.2}x", v / a),
            _ => "-".into(),
        };
        let verdict = match a {
            Some(a) if cpu[i] / a >= target => "met",
            Some(_) => "MISSED",
            None => "n/a",
        };
        println!(
            "{:<18} {:>9.3} {:>9}   {:<34} {:>9} {:>10} {:>10} {:>5}x {verdict}",
            id,
            cpu[i],
            fmt(wgpu[i]),
            name,
            fmt(a),
            ratio(Some(cpu[i])),
            ratio(wgpu[i]),
            target
        );
        let mut f = figure(id, "cpu", cpu[i], &anchors[i]);
        if a.is_some() {
            f = f.target(On::Ratio, ">=", target);
        }
        f.print();
        if let Some(w) = wgpu[i] {
            figure(id, "wgpu", w, &anchors[i]).print();
        }
    }
    println!(
        "{:<18} {:>9.3}   (plain copy of the same bytes)",
        "memcpy", memcpy_gbps
    );
    if gpu.is_ok() {
        println!("GPU work redone on the CPU: {:?}", cpu_assist());
    }
    println!();
    peak_rss(&dir, &raw, data.len() as u64);
    std::fs::remove_dir_all(&dir).ok();
    println!();
    reference_table(&data, reps);
    isa_table(&data, reps, &anchors);
    huge_pages(&data, reps);
}

/// The CPU-only packers of onnxruntime's own Python tools against that
/// code on the same weight (`quantize_dynamic`'s `quantize_data`, per
/// tensor and per channel as its per-channel loop does it; the float16
/// converter's `convert_np_to_float16`), target >= 10x; the bytes are
/// compared too.
fn reference_table(data: &[u8], reps: usize) {
    let dir = std::env::temp_dir().join(format!("ctcache-ref-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let raw = dir.join("weights.bin");
    std::fs::write(&raw, data).expect("write weight");
    let out_dir = dir.join("out");
    std::fs::create_dir_all(&out_dir).expect("out dir");
    let py = reference_anchors(&raw, &out_dir, reps);
    let cases: [(&str, &str, &str, Params); 3] = [
        (
            "quantize_dynamic int8 per tensor",
            "ort.quantize_dynamic",
            "qd_tensor",
            Params::new(),
        ),
        (
            "quantize_dynamic uint8 per channel",
            "ort.quantize_dynamic",
            "qd_channel",
            Params::new()
                .with("weight_type", "uint8")
                .with("symmetric", "false")
                .with("per_channel", "true"),
        ),
        ("float16 converter", "ort.float16", "fp16", Params::new()),
    ];
    println!("onnxruntime's Python tools vs ctcache, {K} x {N} FLOAT; best of {reps}");
    println!(
        "{:<36} {:>10} {:>12} {:>9} {:>7}  bytes",
        "case", "ctcache ms", "reference ms", "speed-up", "target"
    );
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[K as u64, N as u64],
        data,
    };
    for (label, id, key, params) in cases {
        let p = find(id).expect("packer");
        let len = p
            .output(src.data_type, src.dims, &params)
            .expect("layout")
            .payload_len;
        let mut out = vec![0u8; len as usize];
        let t = best(reps, || {
            p.pack(&src, &params, &mut out).expect("pack");
            black_box(&mut out);
        });
        let reference = py.iter().find(|(n, _)| n == key).map(|(_, v)| *v);
        let same = match std::fs::read(out_dir.join(format!("{key}.bin"))) {
            Ok(want) => {
                if want == out {
                    "identical"
                } else {
                    "DIFFER"
                }
            }
            Err(_) => "-",
        };
        let ms = t.as_secs_f64() * 1e3;
        let (r, ratio, verdict) = match reference {
            Some(r) => (
                format!("{r:.1}"),
                format!("{:.1}x", r / ms),
                if r / ms >= 10.0 { "met" } else { "MISSED" },
            ),
            None => ("-".into(), "-".into(), "n/a"),
        };
        println!(
            "{label:<36} {ms:>10.2} {r:>12} {ratio:>9} {:>5}x {verdict}  {same}",
            10
        );
        let gbps = data.len() as f64 / t.as_secs_f64() / 1e9;
        let mut f = Figure::new(
            &format!("pack.{id}.{key}"),
            &format!("{label}, {K} x {N} FLOAT, vs onnxruntime's numpy code"),
            gbps,
            "GB/s",
        );
        if let Some(r) = reference {
            let anchor_gbps = data.len() as f64 / (r / 1e3) / 1e9;
            f = f.anchor(anchor_gbps, r / ms).target(On::Ratio, ">=", 10.0);
        }
        f.print();
    }
    std::fs::remove_dir_all(&dir).ok();
    println!();
}

/// Milliseconds of the reference code per case (best of `reps`), its
/// payload bytes written to `out/<case>.bin` (scale, zero point, quantized
/// as the packer lays them out; FLOAT16 values).
fn reference_anchors(raw: &Path, out: &Path, reps: usize) -> Vec<(String, f64)> {
    const SCRIPT: &str = r##"
import sys, time
import numpy as np
path, out, k, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
w = np.fromfile(path, dtype="<f4").reshape(k, n)
def best(name, f):
    r = f()
    times = []
    for _ in range(reps):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    print(name, min(times) * 1e3, flush=True)
    return r
try:
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import quantize_data
    zp, s, q = best("qd_tensor", lambda: quantize_data(w.flatten(), TensorProto.INT8, True, False))
    open(f"{out}/qd_tensor.bin", "wb").write(np.float32(s).tobytes() + np.int8(zp).tobytes() + q.tobytes())
    def per_channel():
        # quantize_weight_per_channel_impl's loop, axis -1.
        r = [quantize_data(w.take(i, 1).flatten(), TensorProto.UINT8, False, False) for i in range(n)]
        q = np.concatenate([x[2].reshape(k, 1) for x in r], 1)
        return np.hstack([x[1] for x in r]).astype(np.float32), np.hstack([x[0] for x in r]), q
    s, zp, q = best("qd_channel", per_channel)
    open(f"{out}/qd_channel.bin", "wb").write(s.tobytes() + zp.tobytes() + q.tobytes())
except ImportError as e:
    print("# onnxruntime.quantization:", e)
try:
    from onnxruntime.transformers.float16 import convert_np_to_float16
    h = best("fp16", lambda: convert_np_to_float16(w.reshape(-1)))
    open(f"{out}/fp16.bin", "wb").write(h.tobytes())
except ImportError as e:
    print("# onnxruntime.transformers:", e)
"##;
    let Some(py) = venv_python() else {
        println!("reference: no venv python (set CTCACHE_VENV); figures skipped");
        return Vec::new();
    };
    let res = Command::new(py)
        .args(["-c", SCRIPT])
        .arg(raw)
        .arg(out)
        .args([K.to_string(), N.to_string(), reps.to_string()])
        .output();
    match res {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| {
                if l.starts_with('#') {
                    println!("reference: {l}");
                }
                let (name, v) = l.split_once(' ')?;
                Some((name.to_string(), v.trim().parse().ok()?))
            })
            .collect(),
        Ok(o) => {
            println!("reference failed: {}", String::from_utf8_lossy(&o.stderr));
            Vec::new()
        }
        Err(e) => {
            println!("reference: cannot run python: {e}");
            Vec::new()
        }
    }
}

/// An anchored packer's anchor: name, GB/s (None: not measured), target ratio.
type Anchor = (&'static str, Option<f64>, f64);

/// The figure `pack.ID.HOW` (HOW: cpu, wgpu or an instruction set) of
/// `gbps` against the packer's anchor, without a target.
fn figure(id: &str, how: &str, gbps: f64, anchor: &Anchor) -> Figure {
    let (name, a, _) = anchor;
    let f = Figure::new(
        &format!("pack.{id}.{how}"),
        &format!("{id} on {how}, {K} x {N} FLOAT, vs {name}"),
        gbps,
        "GB/s",
    );
    match a {
        Some(a) => f.anchor(*a, gbps / a),
        None => f,
    }
}

/// Every CPU packer with each instruction set of this CPU: milliseconds
/// (best of `reps`) and the gains; the bytes must be the same. The cases
/// of the anchored packers (`anchors`, in `PACKERS` order; empty: not
/// measured) print their figures too.
fn isa_table(data: &[u8], reps: usize, anchors: &[Anchor]) {
    let isas = Isa::available_all();
    let halves: Vec<u8> = data
        .chunks_exact(4)
        .flat_map(|b| {
            half::f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes()
        })
        .collect();
    let nbits = |bits: &str, sym: &str| {
        Params::new()
            .with("bits", bits)
            .with("block_size", "32")
            .with("symmetric", sym)
    };
    let cases: Vec<(&str, &str, bool, Params)> = vec![
        (
            "matmul_nbits b4 sym",
            "ort.matmul_nbits",
            false,
            nbits("4", "true"),
        ),
        (
            "matmul_nbits b4 asym",
            "ort.matmul_nbits",
            false,
            nbits("4", "false"),
        ),
        (
            "matmul_nbits b8 asym",
            "ort.matmul_nbits",
            false,
            nbits("8", "false"),
        ),
        (
            "matmul_nbits b4 sym f16",
            "ort.matmul_nbits",
            true,
            nbits("4", "true"),
        ),
        (
            "matmul_nbits b4 sym transp",
            "ort.matmul_nbits",
            false,
            nbits("4", "true").with("transposed", "true"),
        ),
        ("ggml.q8_0", "ggml.q8_0", false, Params::new()),
        ("ggml.q4_0", "ggml.q4_0", false, Params::new()),
        ("ggml.q8_0 f16", "ggml.q8_0", true, Params::new()),
        ("ggml.q4_0 f16", "ggml.q4_0", true, Params::new()),
        ("cast.f16", "cast.f16", false, Params::new()),
        ("cast.bf16", "cast.bf16", false, Params::new()),
        ("gemm.pack_b.f32", "gemm.pack_b.f32", false, Params::new()),
        (
            "quantize_dynamic int8 tensor",
            "ort.quantize_dynamic",
            false,
            Params::new(),
        ),
        (
            "quantize_dynamic u8 channel",
            "ort.quantize_dynamic",
            false,
            Params::new()
                .with("weight_type", "uint8")
                .with("symmetric", "false")
                .with("per_channel", "true"),
        ),
        ("ort.float16", "ort.float16", false, Params::new()),
    ];
    println!(
        "per instruction set, {K} x {N} (FLOAT unless f16), {} rayon threads; ms, best of {reps}",
        rayon::current_num_threads()
    );
    let mut head = format!("{:<28}", "packer");
    for isa in &isas {
        head += &format!(" {:>9}", format!("{isa} ms"));
    }
    for pair in isas.windows(2) {
        head += &format!(" {:>14}", format!("{}/{}", pair[1], pair[0]));
    }
    head += &format!(" {:>12}", "best GB/s");
    println!("{head}");
    for (label, id, f16, params) in cases {
        let p = find(id).expect("packer");
        let (dt, bytes) = if f16 {
            (DataType::FLOAT16, &halves[..])
        } else {
            (DataType::FLOAT, data)
        };
        let src = SourceTensor {
            data_type: dt,
            dims: &[K as u64, N as u64],
            data: bytes,
        };
        let len = p.output(dt, src.dims, &params).expect("layout").payload_len;
        let mut out = vec![0u8; len as usize];
        let mut first: Option<Vec<u8>> = None;
        for &isa in &isas {
            p.pack_with(&src, &params, &mut out, isa).expect("pack"); // warm-up
            match &first {
                None => first = Some(out.clone()),
                Some(f) => assert!(f == &out, "{label}: {isa} bytes differ from scalar"),
            }
        }
        // Round robin, so that a burst of other load hits every set alike.
        let mut times = vec![Duration::MAX; isas.len()];
        for _ in 0..reps.max(1) {
            for (t, &isa) in times.iter_mut().zip(&isas) {
                let start = Instant::now();
                p.pack_with(&src, &params, &mut out, isa).expect("pack");
                black_box(&mut out);
                *t = (*t).min(start.elapsed());
            }
        }
        let mut row = format!("{label:<28}");
        for t in &times {
            row += &format!(" {:>9.2}", t.as_secs_f64() * 1e3);
        }
        for pair in times.windows(2) {
            row += &format!(" {:>13.2}x", pair[0].as_secs_f64() / pair[1].as_secs_f64());
        }
        let fastest = times.iter().min().expect("an isa");
        row += &format!(
            " {:>12.2}",
            bytes.len() as f64 / fastest.as_secs_f64() / 1e9
        );
        println!("{row}");
        if let Some(i) = ANCHORED_CASES.iter().position(|&c| c == label) {
            for (t, isa) in times.iter().zip(&isas) {
                let gbps = bytes.len() as f64 / t.as_secs_f64() / 1e9;
                let none = ("its anchor (not measured)", None, 0.0);
                figure(
                    PACKERS[i],
                    isa.name(),
                    gbps,
                    anchors.get(i).unwrap_or(&none),
                )
                .print();
            }
        }
    }
    println!();
}

/// First-touch cost of a 1 GiB output buffer, `Vec` against an anonymous
/// mapping advised MADV_HUGEPAGE, and packing into a fresh buffer of each
/// kind and into a reused pooled mapping (allocation included; `compile`
/// takes the reused one).
fn huge_pages(data: &[u8], reps: usize) {
    const GIB: usize = 1 << 30;
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    println!("huge pages: transparent_hugepage/enabled = {mode}");
    println!(
        "{:<52} {:>10} {:>10} {:>14}",
        "first touch of a 1 GiB output (1 write/4 KiB)", "touch ms", "free ms", "AnonHugePages"
    );
    for mapped in [false, true] {
        let mut touch = Duration::MAX;
        let mut free = Duration::MAX;
        let mut huge = 0;
        for _ in 0..reps.max(1) {
            let t = Instant::now();
            let mut b = buffer(GIB, mapped);
            let bytes: &mut [u8] = &mut b;
            for i in (0..bytes.len()).step_by(4096) {
                bytes[i] = 1;
            }
            black_box(bytes);
            touch = touch.min(t.elapsed());
            huge = anon_huge_kib();
            let t = Instant::now();
            drop(b);
            free = free.min(t.elapsed());
        }
        println!(
            "{:<52} {:>10.1} {:>10.1} {:>10} MiB",
            kind(mapped),
            touch.as_secs_f64() * 1e3,
            free.as_secs_f64() * 1e3,
            huge / 1024
        );
    }
    // Freed heap memory may be reused (glibc raises its mmap threshold up
    // to 32 MiB after a free), so a small Vec need not be fresh pages in
    // this loop; the 4x taller weight's output is past that threshold.
    let tall: Vec<u8> = data.repeat(4);
    println!(
        "{:<52} {:>10} {:>10}",
        "pack into a fresh buffer (alloc + pack)", "ms", "out MiB"
    );
    for (id, rows, src) in [
        ("ort.matmul_nbits", K, data),
        ("cast.f16", K, data),
        ("cast.f16", 4 * K, &tall[..]),
    ] {
        let dims = [rows as u64, N as u64];
        let src = SourceTensor {
            data_type: DataType::FLOAT,
            dims: &dims,
            data: src,
        };
        let p = find(id).expect("packer");
        let params = Params::new();
        let len = p
            .output(src.data_type, src.dims, &params)
            .expect("layout")
            .payload_len as usize;
        for mapped in [false, true] {
            let t = best(reps, || {
                let mut b = buffer(len, mapped);
                p.pack(&src, &params, &mut b).expect("pack");
                black_box(&mut b[..]);
            });
            println!(
                "{:<52} {:>10.2} {:>10.1}",
                format!("{id} {rows}x{N}, {}", kind(mapped)),
                t.as_secs_f64() * 1e3,
                len as f64 / (1 << 20) as f64
            );
        }
        // What compile() does: a pooled mapping from the previous pack.
        let t = best(reps, || {
            let mut b = OutputBuffer::reusable(len);
            p.pack(&src, &params, &mut b).expect("pack");
            black_box(b.into_bytes());
        });
        println!(
            "{:<52} {:>10.2} {:>10.1}",
            format!("{id} {rows}x{N}, reused mapping (compile)"),
            t.as_secs_f64() * 1e3,
            len as f64 / (1 << 20) as f64
        );
    }
    println!();
}

fn buffer(len: usize, mapped: bool) -> OutputBuffer {
    if mapped {
        OutputBuffer::mapped(len).expect("anonymous mapping")
    } else {
        OutputBuffer::heap(len)
    }
}

fn kind(mapped: bool) -> &'static str {
    if mapped {
        "mmap + MADV_HUGEPAGE"
    } else {
        "Vec (calloc)"
    }
}

/// This process's AnonHugePages (KiB), from /proc/self/smaps_rollup.
fn anon_huge_kib() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("AnonHugePages:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// 4096 x 4096 normal samples (Box-Muller over splitmix64), raw LE bytes.
fn weight() -> Vec<u8> {
    let mut state = 0x5eed_u64;
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(K * N * 4);
    for _ in 0..K * N / 2 {
        let (u, v) = (next().max(1e-300), next());
        let r = (-2.0 * u.ln()).sqrt();
        let t = std::f64::consts::TAU * v;
        out.extend_from_slice(&((r * t.cos()) as f32).to_le_bytes());
        out.extend_from_slice(&((r * t.sin()) as f32).to_le_bytes());
    }
    out
}

fn best(reps: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm-up: page faults, thread pools, GPU buffers
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .expect("at least one run")
}

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var("CTCACHE_VENV").unwrap_or_else(|_| "/var/tmp/ctcache-venv".into());
    let py = Path::new(&venv).join("bin/python");
    py.exists().then_some(py)
}

/// Times onnxruntime and gguf on the raw weight; returns (name, GB/s).
fn python_anchors(raw: &Path, reps: usize) -> Vec<(String, f64)> {
    const SCRIPT: &str = r##"
import sys, time
import numpy as np
path, k, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = np.fromfile(path, dtype="<f4").reshape(k, n)
def best(f):
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter(); f(); times.append(time.perf_counter() - t)
    return w.nbytes / min(times) / 1e9
try:
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits
    bs = 32
    kb = (k + bs - 1) // bs
    q = np.zeros((n, kb, bs // 2), np.uint8)
    s = np.zeros((n, kb), np.float32)
    z = np.zeros((n, (kb + 1) // 2), np.uint8)
    print("ort", best(lambda: quantize_matmul_4bits(q, w, s, z, bs, n, k, True)), flush=True)
except ImportError as e:
    print("# onnxruntime:", e)
try:
    from gguf import quants, GGMLQuantizationType as T
    for name, t in (("q8_0", T.Q8_0), ("q4_0", T.Q4_0)):
        print(name, best(lambda: quants.quantize(w, t)), flush=True)
except ImportError as e:
    print("# gguf:", e)
"##;
    let Some(py) = venv_python() else {
        println!("anchors: no venv python (set CTCACHE_VENV); ORT and gguf figures skipped");
        return Vec::new();
    };
    let out = Command::new(py)
        .args(["-c", SCRIPT])
        .arg(raw)
        .args([K.to_string(), N.to_string(), reps.to_string()])
        .output();
    let out = match out {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            println!("anchors failed: {}", String::from_utf8_lossy(&o.stderr));
            return Vec::new();
        }
        Err(e) => {
            println!("anchors: cannot run python: {e}");
            return Vec::new();
        }
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            if l.starts_with('#') {
                println!("anchors: {l}");
            }
            let (name, v) = l.split_once(' ')?;
            Some((name.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Runs `ctcachectl pack` on a model whose initializer `w` is the weight
/// (external data) and reports its peak RSS against the target.
fn peak_rss(dir: &Path, raw: &Path, source: u64) {
    let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let ctl = std::env::var("CTCACHECTL")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(&target_dir).join("release/ctcachectl"));
    if !ctl.exists() {
        println!(
            "peak RSS: skipped, no {} (cargo build --release -p ctcachectl)",
            ctl.display()
        );
        return;
    }
    let Some(py) = venv_python() else {
        println!("peak RSS: skipped, no venv python to write the model");
        return;
    };
    const MODEL: &str = r#"
import os, sys
from onnx import helper, TensorProto, save
raw, k, n, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[k, n])
t.data_location = TensorProto.EXTERNAL
for key, v in (("location", os.path.basename(raw)), ("offset", "0"), ("length", str(os.path.getsize(raw)))):
    e = t.external_data.add(); e.key, e.value = key, v
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "bench", [x], [y], [t])
save(helper.make_model(g), out)
"#;
    let model = dir.join("model.onnx");
    let made = Command::new(&py)
        .args(["-c", MODEL])
        .arg(raw)
        .args([K.to_string(), N.to_string()])
        .arg(&model)
        .status();
    if !made.is_ok_and(|s| s.success()) {
        println!("peak RSS: skipped, could not write the model (onnx missing?)");
        return;
    }
    let payload = dir.join("payload.bin");
    // A fresh process whose only child is ctcachectl: its children's
    // max RSS is exactly ctcachectl's.
    let me = std::env::current_exe().expect("own path");
    let out = Command::new(me)
        .arg("--rss-child")
        .arg(&ctl)
        .args([
            "pack",
            "--initializer",
            "w",
            "--format",
            "ort.matmul_nbits",
            "-o",
        ])
        .arg(&payload)
        .arg(&model)
        .output()
        .expect("run rss child");
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(kib) = text
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kib "))
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        println!(
            "peak RSS: ctcachectl pack failed ({}): {}",
            text.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return;
    };
    let output = std::fs::metadata(&payload).map(|m| m.len()).unwrap_or(0);
    let limit = source + output + (64 << 20);
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "peak RSS of ctcachectl pack (ort.matmul_nbits): {:.1} MiB; target <= source {:.0} + output {:.1} + 64 = {:.1} MiB: {}",
        mib(kib * 1024),
        mib(source),
        mib(output),
        mib(limit),
        if kib * 1024 <= limit { "met" } else { "MISSED" }
    );
    Figure::new(
        "pack.rss",
        "peak RSS of ctcachectl pack (ort.matmul_nbits) vs source + output + 64 MiB",
        mib(kib * 1024),
        "MiB",
    )
    .anchor(mib(limit), (kib * 1024) as f64 / limit as f64)
    .target(On::Ratio, "<=", 1.0)
    .print();
}

/// `--rss-child CMD ARGS..`: runs CMD, prints its peak RSS (KiB).
fn rss_child(args: &[String]) {
    let status = Command::new(&args[0]).args(&args[1..]).status();
    match status {
        Ok(s) if s.success() => {
            // SAFETY: getrusage only writes the struct it is given.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
            println!("maxrss_kib {}", ru.ru_maxrss);
        }
        Ok(s) => println!("{s}"),
        Err(e) => println!("cannot run {}: {e}", args[0]),
    }
}
