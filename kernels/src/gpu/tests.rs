//! GPU == CPU, byte for byte, for every GPU packer: random weights, ties,
//! zero and constant blocks, infinities, NaNs, denormals, K not a multiple
//! of the block size, and chunking. Skipped (with a message) when this
//! machine has no wgpu adapter.

use ctcache::dtype::DataType;

use super::{cpu_assist, pack_on, Backend, GpuBackend, GpuError};
use crate::{find, PackError, Params, SourceTensor};

fn gpu() -> Option<&'static GpuBackend> {
    match GpuBackend::shared() {
        Ok(g) => Some(g),
        Err(e) => {
            println!("skipped: {e}");
            None
        }
    }
}

/// splitmix64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Roughly normal (Box-Muller).
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit().max(1e-300), self.unit());
        ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }
}

/// Kinds of test data.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Normal values of a random scale.
    Normal,
    /// Multiples of 1/4 in [-4, 4]: many exact ties after scaling.
    Ties,
    /// Normal values with zero, constant and tiny blocks and sprinkled
    /// infinities, NaNs (several payloads), denormals and extremes.
    Edges,
}

const SPECIALS: [u32; 14] = [
    0x7f80_0000, // inf
    0xff80_0000, // -inf
    0x7fc0_0000, // NaN
    0xffc0_0001, // -NaN with payload
    0x7f80_0001, // signalling NaN
    0x0000_0001, // smallest denormal
    0x807f_ffff, // largest negative denormal
    0x0040_0000, // denormal
    0x8000_0000, // -0
    0x7f7f_ffff, // FLT_MAX
    0xff7f_ffff, // -FLT_MAX
    0x0080_0000, // smallest normal
    0x3f00_0000, // 0.5
    0x0100_0000, // tiny normal
];

fn data(kind: Kind, n: usize, run: usize, seed: u64) -> Vec<f32> {
    let mut r = Rng(seed);
    let scale = [1e-3f32, 0.05, 1.0, 300.0][r.below(4) as usize];
    match kind {
        Kind::Normal => (0..n).map(|_| r.normal() * scale).collect(),
        Kind::Ties => (0..n).map(|_| (r.below(33) as f32 - 16.0) / 4.0).collect(),
        Kind::Edges => {
            let mut v: Vec<f32> = (0..n).map(|_| r.normal() * scale).collect();
            // Runs of zeros, constants and tiny normals.
            for s in 0..n.div_ceil(run) {
                let range = s * run..((s + 1) * run).min(n);
                match r.below(8) {
                    0 => v[range].fill(0.0),
                    1 => v[range].fill(-2.5),
                    2 => v[range].iter_mut().for_each(|x| *x *= 1e-37),
                    3 => v[range].iter_mut().for_each(|x| *x = -*x * 0.0),
                    _ => {}
                }
            }
            for x in v.iter_mut() {
                if r.below(50) == 0 {
                    *x = f32::from_bits(SPECIALS[r.below(SPECIALS.len() as u64) as usize]);
                }
            }
            v
        }
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "{} bytes differ, first at {i}: cpu {:#04x} gpu {:#04x}",
            a.iter().zip(b).filter(|(x, y)| x != y).count(),
            a[i],
            b[i]
        ),
        None => "identical".into(),
    }
}

/// Packs with the CPU and with the GPU (output pre-filled with garbage, so
/// every byte must be written) and requires the same bytes.
fn check(g: &GpuBackend, id: &str, dims: &[u64], v: &[f32], params: &Params, chunk: u64) {
    let p = find(id).unwrap();
    let data = bytes(v);
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims,
        data: &data,
    };
    let (_, cpu) = crate::pack_to_vec(p, &src, params).unwrap();
    let mut out = vec![0xa5u8; cpu.len()];
    g.pack_chunked(id, &src, params, &mut out, chunk).unwrap();
    assert!(
        cpu == out,
        "{id} {dims:?} {params:?} chunk {chunk}: {}",
        first_diff(&cpu, &out)
    );
}

fn nbits(bits: u32, bs: u32, sym: bool) -> Params {
    Params::new()
        .with("bits", &bits.to_string())
        .with("block_size", &bs.to_string())
        .with("symmetric", &sym.to_string())
}

#[test]
fn matmul_nbits_equals_cpu() {
    let Some(g) = gpu() else { return };
    let mut seed = 1;
    for bits in [4, 8] {
        for bs in [16u32, 32, 64, 128, 256] {
            for sym in [true, false] {
                let params = nbits(bits, bs, sym);
                let b = bs as u64;
                // K: one row, shorter than a block, odd across blocks, an
                // odd block count with one spare row, exact blocks.
                let shapes = [
                    (1, 5),
                    (b - 1, 3),
                    (2 * b + 1, 7),
                    (3 * b + 1, 2),
                    (2 * b, 33),
                ];
                for (k, n) in shapes {
                    for kind in [Kind::Normal, Kind::Ties, Kind::Edges] {
                        seed += 1;
                        let v = data(kind, (k * n) as usize, bs as usize / 2, seed);
                        check(g, "ort.matmul_nbits", &[k, n], &v, &params, 64 << 20);
                    }
                }
            }
        }
    }
}

#[test]
fn matmul_nbits_chunks() {
    let Some(g) = gpu() else { return };
    for (i, (bits, bs, sym)) in [
        (4, 32, true),
        (4, 16, false),
        (8, 64, false),
        (4, 256, true),
    ]
    .into_iter()
    .enumerate()
    {
        let params = nbits(bits, bs, sym);
        let (k, n) = (5 * bs as u64 + 3, 40);
        let v = data(Kind::Edges, (k * n) as usize, 7, 100 + i as u64);
        // Several block rows per chunk, one, and column splits of one.
        for chunk in [u64::from(bs) * n * 4 * 2, 0, u64::from(bs) * 4 * 9] {
            check(g, "ort.matmul_nbits", &[k, n], &v, &params, chunk);
        }
    }
}

#[test]
fn ggml_equals_cpu() {
    let Some(g) = gpu() else { return };
    let mut seed = 1000;
    for id in ["ggml.q8_0", "ggml.q4_0"] {
        for dims in [vec![32u64], vec![3, 64], vec![5, 7, 96], vec![130, 32]] {
            let n: u64 = dims.iter().product();
            for kind in [Kind::Normal, Kind::Ties, Kind::Edges] {
                seed += 1;
                let v = data(kind, n as usize, 32, seed);
                check(g, id, &dims, &v, &Params::new(), 64 << 20);
                // Two blocks per chunk, then 1 KiB of source per chunk.
                check(g, id, &dims, &v, &Params::new(), 0);
                check(g, id, &dims, &v, &Params::new(), 1024 + 256);
            }
        }
    }
}

#[test]
fn ggml_block_edges() {
    let Some(g) = gpu() else { return };
    // One block per case: ties of both rounding rules, a first-of-equal
    // maximum of either sign, zeros, constants, and each special alone.
    let mut cases: Vec<Vec<f32>> = vec![
        (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect(),
        (0..32)
            .map(|i| if i % 2 == 0 { 127.0 } else { 63.5 })
            .collect(),
        (0..32)
            .map(|i| {
                if i == 3 {
                    -8.0
                } else if i == 9 {
                    8.0
                } else {
                    0.5 * i as f32 - 6.0
                }
            })
            .collect(),
        vec![0.0; 32],
        vec![-0.0; 32],
        vec![3.25; 32],
    ];
    for s in SPECIALS {
        let mut v: Vec<f32> = (0..32).map(|i| i as f32 / 8.0 - 2.0).collect();
        v[17] = f32::from_bits(s);
        cases.push(v);
    }
    for id in ["ggml.q8_0", "ggml.q4_0"] {
        for v in &cases {
            check(g, id, &[32], v, &Params::new(), 64 << 20);
        }
    }
}

#[test]
fn cast_f16_equals_cpu() {
    let Some(g) = gpu() else { return };
    // A stride through every f32 bit pattern, the half subnormal/normal
    // and overflow boundaries in full, and odd lengths.
    let mut bits: Vec<u32> = (0..=u32::MAX).step_by(4093).collect();
    bits.extend(0x3300_0000..0x3301_0000u32);
    bits.extend(0x387f_c000..0x3880_4000u32);
    bits.extend(0x477f_e000..0x4780_2000u32);
    bits.extend(SPECIALS);
    let v: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let n = v.len() as u64;
    check(g, "cast.f16", &[n], &v, &Params::new(), 64 << 20);
    check(g, "cast.f16", &[n - 1], &v[1..], &Params::new(), 4096);
    check(g, "cast.f16", &[], &v[7..8], &Params::new(), 64 << 20);
    check(g, "cast.f16", &[3, 1], &v[..3], &Params::new(), 64 << 20);
    check(g, "cast.f16", &[0, 4], &[], &Params::new(), 64 << 20);
}

#[test]
fn cpu_assist_paths_run() {
    let Some(g) = gpu() else { return };
    let before = cpu_assist();
    // Random values put a few elements near a boundary (fix-ups);
    // specials force CPU blocks; a chunk of ties overflows the fix-up list.
    let params = nbits(4, 16, true);
    let normal = data(Kind::Normal, 256 * 64, 16, 3);
    check(
        g,
        "ort.matmul_nbits",
        &[256, 64],
        &normal,
        &params,
        64 << 20,
    );
    let ties: Vec<f32> = (0..64 * 64).map(|i| (i % 33) as f32 * 0.25 - 4.0).collect();
    check(g, "ort.matmul_nbits", &[64, 64], &ties, &params, 64 << 20);
    let edges = data(Kind::Edges, 96 * 8, 16, 7);
    check(g, "ort.matmul_nbits", &[96, 8], &edges, &params, 64 << 20);
    let ties = data(Kind::Ties, 1 << 16, 32, 9);
    check(g, "ggml.q4_0", &[1 << 16], &ties, &Params::new(), 1 << 16);
    let after = cpu_assist();
    assert!(after.elements > before.elements, "{before:?} {after:?}");
    assert!(after.blocks > before.blocks, "{before:?} {after:?}");
    assert!(after.chunks > before.chunks, "{before:?} {after:?}");
}

#[test]
fn refusals_are_errors() {
    let Some(g) = gpu() else { return };
    let data = vec![0u8; 64 * 2];
    let f16 = SourceTensor {
        data_type: DataType::FLOAT16,
        dims: &[2, 32],
        data: &data,
    };
    let mut out = vec![0u8; 68];
    let e = g.pack("ggml.q8_0", &f16, &Params::new(), &mut out);
    assert!(matches!(e, Err(GpuError::Unsupported { .. })), "{e:?}");
    let f32src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[32],
        data: &data,
    };
    let e = g.pack("cast.bf16", &f32src, &Params::new(), &mut out[..64]);
    assert!(matches!(e, Err(GpuError::Unsupported { .. })), "{e:?}");
    let e = g.pack("no.such", &f32src, &Params::new(), &mut out);
    assert_eq!(
        e,
        Err(GpuError::Pack(PackError::UnknownPacker("no.such".into())))
    );
    let e = g.pack("ggml.q8_0", &f32src, &Params::new(), &mut out[..5]);
    assert!(
        matches!(e, Err(GpuError::Pack(PackError::SizeMismatch { .. }))),
        "{e:?}"
    );
    let bad = Params::new().with("bits", "3");
    let e = g.pack("ort.matmul_nbits", &f32src, &bad, &mut out);
    assert!(
        matches!(e, Err(GpuError::Pack(PackError::BadParamValue { .. }))),
        "{e:?}"
    );
}

/// transposed=true (a W[N, K] source) has no GPU kernel: the GPU refuses
/// it as unsupported and `pack_auto` packs it on the CPU.
#[test]
fn matmul_nbits_transposed_goes_to_the_cpu() {
    let v = data(Kind::Normal, 64 * 96, 32, 11);
    let data = bytes(&v);
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[64, 96],
        data: &data,
    };
    let p = find("ort.matmul_nbits").unwrap();
    let params = nbits(4, 32, false).with("transposed", "true");
    let (_, cpu) = crate::pack_to_vec(p, &src, &params).unwrap();
    let mut out = vec![0u8; cpu.len()];
    assert_eq!(
        super::pack_auto(p, &src, &params, &mut out).unwrap(),
        Backend::Cpu
    );
    assert_eq!(out, cpu);
    let Some(g) = gpu() else { return };
    let e = g.pack("ort.matmul_nbits", &src, &params, &mut out);
    assert!(matches!(e, Err(GpuError::Unsupported { .. })), "{e:?}");
    let e = pack_on(Backend::Wgpu, p, &src, &params, &mut out);
    assert!(matches!(e, Err(GpuError::Unsupported { .. })), "{e:?}");
}

#[test]
fn pack_on_backends_agree() {
    let v = data(Kind::Normal, 256 * 64, 32, 5);
    let data = bytes(&v);
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[256, 64],
        data: &data,
    };
    let p = find("ort.matmul_nbits").unwrap();
    let params = Params::new();
    let (_, cpu) = crate::pack_to_vec(p, &src, &params).unwrap();
    let mut out = vec![0u8; cpu.len()];
    pack_on(Backend::Cpu, p, &src, &params, &mut out).unwrap();
    assert_eq!(out, cpu);
    out.fill(0);
    match pack_on(Backend::Wgpu, p, &src, &params, &mut out) {
        Ok(()) => assert_eq!(out, cpu),
        Err(e @ GpuError::Unavailable(_)) => println!("skipped wgpu: {e}"),
        Err(e) => panic!("{e}"),
    }
    out.fill(0);
    super::pack_auto(p, &src, &params, &mut out).unwrap();
    assert_eq!(out, cpu);
}

#[test]
fn adapter_summary() {
    let Some(g) = gpu() else { return };
    let a = g.adapter_info();
    println!("adapter: {a:?}");
    assert!(!a.backend.is_empty());
    let listed = super::devices::wgpu_devices();
    assert!(
        listed
            .iter()
            .any(|d| d.architecture == format!("{:04x}-{:04x}", a.vendor, a.device)),
        "{listed:?}"
    );
}

/// Packs on the GPU with the shaders' test error set to `jitter`.
fn gpu_with_jitter(
    g: &GpuBackend,
    id: &str,
    dims: &[u64],
    v: &[f32],
    params: &Params,
    jitter: f32,
) -> Vec<u8> {
    let data = bytes(v);
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims,
        data: &data,
    };
    let len = find(id)
        .unwrap()
        .output(DataType::FLOAT, dims, params)
        .unwrap()
        .payload_len;
    let mut out = vec![0u8; len as usize];
    super::session::JITTER.with(|j| j.set(jitter));
    let r = g.pack(id, &src, params, &mut out);
    super::session::JITTER.with(|j| j.set(0.0));
    r.unwrap();
    out
}

/// A GPU whose products are off by up to half the flagging margin (fused
/// multiply-add, inexact multiply, flushed denormal products are all far
/// smaller) still gives the CPU's bytes; twice the margin does not, which
/// shows the perturbation is real.
#[test]
fn tolerates_inexact_gpu_arithmetic() {
    let Some(g) = gpu() else { return };
    let delta = 1.0 / 1024.0;
    let cases: Vec<(&str, Vec<u64>, Params)> = vec![
        ("ort.matmul_nbits", vec![512, 64], nbits(4, 32, true)),
        ("ort.matmul_nbits", vec![513, 24], nbits(4, 16, false)),
        ("ort.matmul_nbits", vec![256, 32], nbits(8, 64, false)),
        ("ggml.q8_0", vec![64, 256], Params::new()),
        ("ggml.q4_0", vec![64, 256], Params::new()),
    ];
    for (i, (id, dims, params)) in cases.iter().enumerate() {
        let n = dims.iter().product::<u64>() as usize;
        for kind in [Kind::Normal, Kind::Edges] {
            let v = data(kind, n, 16, 500 + i as u64);
            let cpu = {
                let data = bytes(&v);
                let src = SourceTensor {
                    data_type: DataType::FLOAT,
                    dims,
                    data: &data,
                };
                crate::pack_to_vec(find(id).unwrap(), &src, params)
                    .unwrap()
                    .1
            };
            let ok = gpu_with_jitter(g, id, dims, &v, params, delta / 2.0);
            assert!(
                ok == cpu,
                "{id} {dims:?} {kind:?}: {}",
                first_diff(&cpu, &ok)
            );
            if matches!(kind, Kind::Normal) {
                let bad = gpu_with_jitter(g, id, dims, &v, params, delta * 2.0);
                assert!(bad != cpu, "{id}: a jitter past the margin changed nothing");
            }
        }
    }
}
