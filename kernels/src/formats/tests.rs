//! Packer tests: reference vectors produced by onnxruntime 1.32 and gguf
//! 0.19 (see tests/python/kernels for the full byte-identity suites), the
//! agreement of every kernel instruction set, and layout invariants.

use ctcache::dtype::DataType;

use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::SourceTensor;
use crate::params::Params;
use crate::struct_builders::size_bits;
use crate::{catalogue, find};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Packs with every available instruction set and checks they agree.
fn pack_all(id: &str, dt: DataType, dims: &[u64], data: &[u8], params: &Params) -> Vec<u8> {
    let p = find(id).unwrap();
    let layout = p.output(dt, dims, params).unwrap();
    assert_eq!(
        size_bits(&layout.struct_type, &layout.dims),
        Some(layout.payload_len * 8)
    );
    let src = SourceTensor {
        data_type: dt,
        dims,
        data,
    };
    let mut first: Option<Vec<u8>> = None;
    for isa in Isa::available_all() {
        // Garbage first: every byte must be written.
        let mut out = vec![0xa5u8; layout.payload_len as usize];
        p.pack_with(&src, params, &mut out, isa).unwrap();
        match &first {
            None => first = Some(out),
            Some(f) => assert!(
                f == &out,
                "{id} {dims:?} {params:?}: {isa} differs from scalar"
            ),
        }
    }
    first.unwrap()
}

fn nbits(bits: u32, bs: u32, sym: bool) -> Params {
    Params::new()
        .with("bits", &bits.to_string())
        .with("block_size", &bs.to_string())
        .with("symmetric", &sym.to_string())
}

/// Ties, +-inf, NaN, denormals and an all-zero column, W[5, 4].
fn edge_weight() -> Vec<u8> {
    hex("000000c10000803f0000c07f000000000000f0400000807fc2160100000000000000003f000040c0852d028000000000000000bf000000400000c07f00000000000020400000803ea153000000000000")
}

/// Deterministic W[33, 3]: odd K, three blocks of 16.
fn k33() -> Vec<f32> {
    (0..99).map(|i| ((i * 37 % 23) - 11) as f32 / 4.0).collect()
}

#[test]
fn matmul_nbits_onnxruntime_vectors() {
    let cases: &[(&str, u32, u32, bool, &str)] = &[
        ("edge", 4, 16, true, "f0898b00000000000888880000000000f0000f000000000088888800000000000000803f000080ffb145000000000080"),
        ("edge", 4, 16, false, "f0888a00000000000000000000000000f0000f000000000000000000000000004444843f0000807fc03700000000000088808a80"),
        ("edge", 8, 16, false, "00ff8c7cad00000000000000000000000000000000000000000000000000000000ff0000ff000000000000000000000000000000000000000000000000000000f9f8783d0000807f48030000000000008400aa00"),
        ("edge", 8, 32, true, "00f88878a8000000000000000000000000000000000000000000000000000000800080808000000000000000000000000000000000000000000000000000000000ff0000ff00000000000000000000000000000000000000000000000000000080808080800000000000000000000000000000000000000000000000000000000000803d000080ff5b04000000000080"),
        ("k33", 4, 16, true, "e08b25df7a14cf7914cf6903be58f2ad00000000000000007a14cf7914cf690352b80e63c91f74c9000000000000000014cf6903be58f2ad47f19c47f19c36e000000000000000000000b03e0000b03e0000003d0000b03e0000b0be0000a03e0000b03e0000b03e000000be"),
        ("k33", 4, 16, false, "d18b35df7a25cf7914be6913bd58f3ad00000000000000007a24cf7914ce6903ad47f19c36f09c36000000000000000014be6913bd58f3ad47f29c47e19c36e00f00000000000000bcbbbb3ebcbbbb3e8988883c3333b33eabaaaa3eabaa2a3ebcbbbb3e3333b33e8988883d888f788f8880"),
        ("k33", 8, 16, false, "01ddae805223ffd1a3744618f4c697693a0ce8ba8c5d2f01ddae805223ffd1a300000000000000000000000000000000aa7a4919ffcf9e6e3d0df3c392623100d9a673400dffcc99663300f3c08d5a27000000000000000000000000000000003a0ce8ba8c5d2f01ddae805223ffd1a37a4919ffcf9e6e3d0df3c392623100e7ff000000000000000000000000000000b1b0b03cb1b0b03c8180803aa9a8a83ca1a0a03ca1a0203cb1b0b03ca9a8a83c8180803b8080ff8673ff808600"),
        ("k33", 8, 32, true, "00ddaf805123ffd1a3744617f4c697693a0ce9ba8c5d2f00ddaf805123ffd1a30000000000000000000000000000000000000000000000000000000000000000a3744617f4c697693a0ce9ba8c5d2f00ddaf805123ffd1a3744617f4c697693a00000000000000000000000000000000000000000000000000000000000000003a0ce9ba8c5d2f00ddaf805123ffd1a3744617f4c697693a0ce9ba8c5d2f00dd00000000000000000000000000000000000000000000000000000000000000000000b03c0000003b0000b03c0000a03c0000b03c000000bc"),
    ];
    for &(w, bits, bs, sym, want) in cases {
        let (data, dims) = match w {
            "edge" => (edge_weight(), [5u64, 4]),
            _ => (f32_bytes(&k33()), [33, 3]),
        };
        let got = pack_all(
            "ort.matmul_nbits",
            DataType::FLOAT,
            &dims,
            &data,
            &nbits(bits, bs, sym),
        );
        assert_eq!(got, hex(want), "{w} bits={bits} bs={bs} sym={sym}");
    }
    // FLOAT16 source: FLOAT16 scales.
    let h: Vec<u8> = k33()
        .iter()
        .flat_map(|&x| crate::fp16::f32_to_f16_bits(x).to_le_bytes())
        .collect();
    let got = pack_all(
        "ort.matmul_nbits",
        DataType::FLOAT16,
        &[33, 3],
        &h,
        &nbits(4, 16, false),
    );
    assert_eq!(got, hex("d18b35df7a25cf7914be6913bd58f3ad00000000000000007a24cf7914ce6903ad47f19c36f09c25000000000000000014be6913bd58f3ad47f29c47e19c36e00f00000000000000de35de3544249a3555355531de359a35442c888f788f8880"));
}

#[test]
fn ggml_gguf_vectors() {
    let base = [3.0f32, -3.0, 0.5, -1.5, 2.5, 63.5 / 127.0 * 3.0, 1e-40];
    let mut x: Vec<f32> = (0..32).map(|i| base[i % base.len()]).collect();
    let data = f32_bytes(&x);
    let p = Params::new();
    assert_eq!(
        pack_all("ggml.q8_0", DataType::FLOAT, &[32], &data, &p),
        hex("0c267f8115c06a40007f8115c06a40007f8115c06a40007f8115c06a40007f8115c0")
    );
    assert_eq!(
        pack_all("ggml.q4_0", DataType::FLOAT, &[1, 32], &data, &p),
        hex("00b670cf174c8104f870cf174c8104f870cf")
    );
    x[5] = f32::INFINITY;
    let data = f32_bytes(&x);
    assert_eq!(
        pack_all("ggml.q8_0", DataType::FLOAT, &[32], &data, &p),
        hex("007c0000000000000000000000000000000000000000000000000000000000000000")
    );
    assert_eq!(
        pack_all("ggml.q4_0", DataType::FLOAT, &[32], &data, &p),
        hex("00fc88888888888088888888888888888888")
    );
    // A NaN: canonical NaN scale (Q8_0) or the quieted NaN itself (Q4_0),
    // all codes 0.
    x[5] = f32::from_bits(0xffa0_0000);
    let data = f32_bytes(&x);
    let q8 = pack_all("ggml.q8_0", DataType::FLOAT, &[32], &data, &p);
    assert_eq!(&q8[..2], &[0x00, 0x7e]);
    assert!(q8[2..].iter().all(|&b| b == 0));
    let q4 = pack_all("ggml.q4_0", DataType::FLOAT, &[32], &data, &p);
    assert_eq!(&q4[..2], &[0x00, 0xff]);
    assert!(q4[2..].iter().all(|&b| b == 0));
}

/// A small deterministic generator (xorshift) of awkward floats.
fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            match i % 97 {
                0 => f32::NAN,
                1 => 0.0,
                2 => u * 1e-39,
                3 if seed.is_multiple_of(3) => f32::INFINITY,
                _ => u * 8.0,
            }
        })
        .collect()
}

/// `pack_all` of W[k, n] as FLOAT and FLOAT16, 4 and 8 bits, sym and asym,
/// at each block size.
fn nbits_all_settings(k: usize, n: usize, w: &[f32], block_sizes: &[u32]) {
    let f32s = f32_bytes(w);
    let f16s: Vec<u8> = w
        .iter()
        .flat_map(|&x| crate::fp16::f32_to_f16_bits(x).to_le_bytes())
        .collect();
    let dims = [k as u64, n as u64];
    for bits in [4, 8] {
        for &bs in block_sizes {
            for sym in [true, false] {
                let p = nbits(bits, bs, sym);
                pack_all("ort.matmul_nbits", DataType::FLOAT, &dims, &f32s, &p);
                pack_all("ort.matmul_nbits", DataType::FLOAT16, &dims, &f16s, &p);
            }
        }
    }
}

#[test]
fn matmul_nbits_every_isa_agrees() {
    for &(k, n) in &[
        (1usize, 1usize),
        (15, 9),
        (33, 8),
        (100, 37),
        (257, 24),
        (64, 530),
        (31, 1031),
    ] {
        let w = noise(k * n, (k * 131 + n) as u64);
        nbits_all_settings(k, n, &w, &[16, 32, 64, 128, 256]);
    }
}

#[test]
fn matmul_nbits_rounding_and_blocks() {
    // One column, symmetric 4-bit, block of 16: -8 sets scale 1, so code =
    // round(v + 8) with halves away from zero, clamped to 0..15.
    let mut col = vec![0f32; 16];
    col[0] = -8.0;
    col[1] = 7.5; // 15.5 -> 16 -> 15
    col[2] = -7.5; // 0.5 -> 1
    col[3] = 0.5; // 8.5 -> 9
    col[4] = -0.5; // 7.5 -> 8
    col[5] = 2.49; // 10.49 -> 10
    let out = pack_all(
        "ort.matmul_nbits",
        DataType::FLOAT,
        &[16, 1],
        &f32_bytes(&col),
        &nbits(4, 16, true),
    );
    assert_eq!(&out[..3], &[0xf0, 0x91, 0xa8]);
    assert_eq!(&out[8..12], &1f32.to_le_bytes());
    // Constant blocks: symmetric keeps the sign of the value; asymmetric
    // rectifies to include 0.
    let c = f32_bytes(&[2.0f32; 16]);
    let sym = pack_all(
        "ort.matmul_nbits",
        DataType::FLOAT,
        &[16, 1],
        &c,
        &nbits(4, 16, true),
    );
    assert_eq!(&sym[8..12], &(-0.25f32).to_le_bytes());
    assert!(sym[..8].iter().all(|&b| b == 0x00)); // 2 * -4 + 8 = 0
    let asym = pack_all(
        "ort.matmul_nbits",
        DataType::FLOAT,
        &[16, 1],
        &c,
        &nbits(4, 16, false),
    );
    assert_eq!(&asym[8..12], &(2.0f32 / 15.0).to_le_bytes());
    assert!(asym[..8].iter().all(|&b| b == 0xff));
    assert_eq!(asym[12], 0x80); // zp 0, spare nibble 8
                                // K not a multiple of the block: codes past K are 0 (odd K keeps the
                                // previous high code, see matmul_nbits::kernel).
    let w = f32_bytes(&[-1.0f32, 1.0, 0.5]);
    let out = pack_all(
        "ort.matmul_nbits",
        DataType::FLOAT,
        &[3, 1],
        &w,
        &nbits(4, 16, true),
    );
    // scale = 1/8: codes 0, 16 -> 15, 12; the unpaired third takes 15 as
    // its high nibble.
    assert_eq!(&out[..8], &[0xf0, 0xfc, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn ggml_and_cast_every_isa_agree() {
    for n in [32usize, 64, 32 * 33, 32 * 1000] {
        let x = noise(n, n as u64 * 3);
        let f32s = f32_bytes(&x);
        let f16s: Vec<u8> = x
            .iter()
            .flat_map(|&v| crate::fp16::f32_to_f16_bits(v).to_le_bytes())
            .collect();
        for id in ["ggml.q8_0", "ggml.q4_0"] {
            pack_all(id, DataType::FLOAT, &[n as u64], &f32s, &Params::new());
            pack_all(id, DataType::FLOAT16, &[1, n as u64], &f16s, &Params::new());
        }
    }
    for n in [0usize, 1, 15, 16, 17, 1000, 70_000] {
        let mut x = noise(n, 9);
        for (i, v) in x.iter_mut().enumerate().filter(|(i, _)| i % 13 == 5) {
            *v = f32::from_bits(0x7f80_0001 + i as u32); // signalling NaNs
        }
        let data = f32_bytes(&x);
        let f16 = pack_all(
            "cast.f16",
            DataType::FLOAT,
            &[n as u64],
            &data,
            &Params::new(),
        );
        let bf16 = pack_all(
            "cast.bf16",
            DataType::FLOAT,
            &[n as u64],
            &data,
            &Params::new(),
        );
        for (i, v) in x.iter().enumerate() {
            let h = u16::from_le_bytes([f16[2 * i], f16[2 * i + 1]]);
            assert_eq!(h, crate::fp16::f32_to_f16_bits(*v));
            let b = u16::from_le_bytes([bf16[2 * i], bf16[2 * i + 1]]);
            assert_eq!(b, crate::fp16::f32_to_bf16_bits(*v));
        }
    }
}

#[test]
fn gemm_pack_b_roundtrip() {
    use super::gemm_pack_b::{pack, unpack};
    for &(k, n, nr) in &[
        (1usize, 1usize, 8usize),
        (3, 7, 8),
        (5, 16, 16),
        (9, 33, 16),
        (4, 100, 32),
    ] {
        let w = f32_bytes(&noise(k * n, 5));
        let p = Params::new().with("panel", &nr.to_string());
        let out = pack_all(
            "gemm.pack_b.f32",
            DataType::FLOAT,
            &[k as u64, n as u64],
            &w,
            &p,
        );
        assert_eq!(out.len(), n.div_ceil(nr) * k * nr * 4);
        let mut direct = vec![0u8; out.len()];
        pack(&w, k, n, nr, &mut direct);
        assert_eq!(direct, out);
        let mut back = vec![0u8; w.len()];
        unpack(&out, k, n, nr, &mut back);
        assert_eq!(back, w);
        // Panel p, row kk, lane j holds W[kk, p*nr + j].
        let at = |p: usize, kk: usize, j: usize| &out[((p * k + kk) * nr + j) * 4..][..4];
        assert_eq!(at(0, k - 1, 0), &w[(k - 1) * n * 4..][..4]);
        if n % nr != 0 {
            assert_eq!(at(n / nr, 0, nr - 1), &[0, 0, 0, 0]);
        }
    }
}

#[test]
fn layouts_are_named_and_versioned() {
    for p in catalogue() {
        let (dt, dims): (DataType, &[u64]) = (DataType::FLOAT, &[64, 64]);
        let l = p.output(dt, dims, &Params::new()).unwrap();
        let t = &l.struct_type;
        assert!(t.name.starts_with(p.id()), "{}", t.name);
        let meta: Vec<(&str, &str)> = t
            .metadata_props
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert!(meta.contains(&("ctcache.format_version", "1")));
        assert!(meta.contains(&("ctcache.packer", p.id())));
        assert_eq!(t.dims_param.len(), l.dims.len());
        assert_eq!(size_bits(t, &l.dims), Some(l.payload_len * 8));
        assert!(p.device(&Params::new()).unwrap().r#type == "cpu");
    }
    let m = find("ort.matmul_nbits").unwrap();
    let l = m
        .output(DataType::FLOAT16, &[100, 7], &nbits(4, 32, false))
        .unwrap();
    assert_eq!(l.struct_type.name, "ort.matmul_nbits.b4.bs32.asym.f16");
    assert_eq!(l.struct_type.dims_param, ["N", "k_blocks", "zp_bytes"]);
    assert_eq!(l.dims, [7, 4, 2]);
    assert_eq!(l.payload_len, 7 * 4 * 16 + 7 * 4 * 2 + 7 * 2);
    let l = m
        .output(DataType::FLOAT, &[64, 64], &Params::new())
        .unwrap();
    assert_eq!(l.struct_type.name, "ort.matmul_nbits.b4.bs32.sym");
    let g = find("gemm.pack_b.f32").unwrap();
    let l = g
        .output(
            DataType::FLOAT,
            &[3, 17],
            &Params::new().with("panel", "16"),
        )
        .unwrap();
    assert_eq!(l.struct_type.name, "gemm.pack_b.f32.nr16");
    assert_eq!(l.dims, [2, 3]);
    let d = g.device(&Params::new().with("panel", "16")).unwrap();
    if cfg!(target_arch = "x86_64") {
        assert_eq!(d.architecture, "x86_64-avx2");
        assert_eq!(d.metadata_props[0].value, "avx2,fma");
    }
}

#[test]
fn refusals_are_clear() {
    let m = find("ort.matmul_nbits").unwrap();
    let e = m
        .check_source(DataType::INT8, &[4, 4], &Params::new())
        .unwrap_err();
    assert!(matches!(e, PackError::UnsupportedDataType { .. }), "{e}");
    let e = m
        .check_source(DataType::FLOAT, &[4], &Params::new())
        .unwrap_err();
    assert!(e.to_string().contains("2-D"), "{e}");
    let e = m
        .check_source(
            DataType::FLOAT,
            &[4, 4],
            &Params::new().with("block_size", "24"),
        )
        .unwrap_err();
    assert!(e.to_string().contains("block_size"), "{e}");
    let q = find("ggml.q4_0").unwrap();
    let e = q
        .check_source(DataType::FLOAT, &[3, 40], &Params::new())
        .unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    // Wrong buffer sizes.
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims: &[32],
        data: &[0u8; 64],
    };
    let e = q.pack(&src, &Params::new(), &mut [0u8; 18]).unwrap_err();
    assert!(
        matches!(
            e,
            PackError::SizeMismatch {
                what: "source data",
                ..
            }
        ),
        "{e}"
    );
    let src = SourceTensor {
        data: &[0u8; 128],
        ..src
    };
    let e = q.pack(&src, &Params::new(), &mut [0u8; 17]).unwrap_err();
    assert!(
        matches!(
            e,
            PackError::SizeMismatch {
                what: "output buffer",
                ..
            }
        ),
        "{e}"
    );
    assert!(find("nope").is_none());
}

/// Every output type passes the core crate's validator (docs/FORMAT.md, Structured types),
/// its size is the payload length, and its decoder takes exactly the
/// type's leaves, in order, and yields `output`.
#[test]
fn types_pass_core_validation_and_decoders_take_the_leaves() {
    use ctcache::structs::{check_value, leaves, Limits};
    let cases: Vec<(&str, DataType, Vec<u64>, Params)> = vec![
        (
            "ort.matmul_nbits",
            DataType::FLOAT,
            vec![100, 7],
            nbits(4, 32, true),
        ),
        (
            "ort.matmul_nbits",
            DataType::FLOAT,
            vec![100, 7],
            nbits(4, 32, false),
        ),
        (
            "ort.matmul_nbits",
            DataType::FLOAT16,
            vec![33, 5],
            nbits(4, 16, false),
        ),
        (
            "ort.matmul_nbits",
            DataType::FLOAT,
            vec![100, 7],
            nbits(8, 64, false),
        ),
        (
            "ort.matmul_nbits",
            DataType::FLOAT,
            vec![7, 100],
            nbits_t(4, 32, false),
        ),
        (
            "ort.matmul_nbits",
            DataType::FLOAT16,
            vec![5, 33],
            nbits_t(8, 16, true),
        ),
        ("ggml.q8_0", DataType::FLOAT, vec![3, 5, 64], Params::new()),
        ("ggml.q4_0", DataType::FLOAT16, vec![96], Params::new()),
        ("cast.f16", DataType::FLOAT, vec![2, 3], Params::new()),
        ("cast.bf16", DataType::FLOAT, vec![], Params::new()),
        (
            "gemm.pack_b.f32",
            DataType::FLOAT,
            vec![9, 37],
            Params::new().with("panel", "8"),
        ),
        (
            "ort.quantize_dynamic",
            DataType::FLOAT,
            vec![9, 37],
            Params::new().with("per_channel", "true"),
        ),
        (
            "ort.quantize_dynamic",
            DataType::FLOAT,
            vec![2, 9, 37],
            Params::new().with("weight_type", "uint8"),
        ),
        ("ort.float16", DataType::FLOAT, vec![], Params::new()),
        ("ort.float16", DataType::FLOAT, vec![4, 5], Params::new()),
    ];
    let limits = Limits::default();
    for (id, dt, dims, params) in cases {
        let l = find(id).unwrap().output(dt, &dims, &params).unwrap();
        let t = &l.struct_type;
        let v = check_value(t, &l.dims, &[], &limits).unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert_eq!(v.byte_len, l.payload_len, "{}", t.name);
        let paths: Vec<String> = leaves(t, &l.dims, &[], &limits)
            .unwrap()
            .into_iter()
            .map(|leaf| leaf.path)
            .collect();
        let d = t.decoder.as_ref().expect("decoder");
        assert_eq!(d.input, paths, "{}", t.name);
        assert_eq!(d.output, ["output"]);
        assert_eq!(d.domain, crate::decoder::DOMAIN);
    }
}

/// W[rows, cols] (element bytes `es`) -> W^T.
fn transpose_bytes(data: &[u8], rows: usize, cols: usize, es: usize) -> Vec<u8> {
    let mut t = vec![0u8; data.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (from, to) = ((r * cols + c) * es, (c * rows + r) * es);
            t[to..to + es].copy_from_slice(&data[from..from + es]);
        }
    }
    t
}

/// Awkward values for the transposed tests: `noise` plus runs that make
/// whole blocks constant, zero (mixed signs), NaN, infinite or denormal,
/// and exact .5 ties.
fn special_noise(n: usize, seed: u64) -> Vec<f32> {
    let mut x = noise(n, seed);
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut i = 0;
    while i < n {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        let run = 1 + (s >> 58) as usize; // 1..=64
        let end = n.min(i + run);
        match (s >> 8) % 11 {
            0 => x[i..end].fill(2.5),
            1 => {
                for (j, v) in x[i..end].iter_mut().enumerate() {
                    *v = if (j + (s as usize >> 20)).is_multiple_of(3) {
                        -0.0
                    } else {
                        0.0
                    };
                }
            }
            2 => x[i..end].fill(f32::NAN),
            3 => x[i..end].fill(f32::NEG_INFINITY),
            4 => {
                for (j, v) in x[i..end].iter_mut().enumerate() {
                    *v =
                        f32::from_bits(1 + j as u32) * if j.is_multiple_of(2) { 1.0 } else { -1.0 };
                }
            }
            5 => {
                // Ties: with -8 in the block the symmetric 4-bit scale is 1.
                for (j, v) in x[i..end].iter_mut().enumerate() {
                    *v = [-8.0, 0.5, -0.5, 7.5, -7.5, 1.5, 2.5, 3.5][j % 8];
                }
            }
            6 => x[i..end].fill(-0.0),
            7 => x[i..end].fill(f32::INFINITY),
            _ => {}
        }
        i = end + (s >> 50) as usize % 40;
    }
    x
}

fn nbits_t(bits: u32, bs: u32, sym: bool) -> Params {
    nbits(bits, bs, sym).with("transposed", "true")
}

#[test]
fn matmul_nbits_transposed_equals_packing_the_transpose() {
    // (K, N): odd K, K not a multiple of any block, K < the block, N = 1,
    // a single element, wide and tall.
    let shapes: &[(usize, usize)] = &[
        (1, 1),
        (1, 7),
        (2, 3),
        (3, 1),
        (15, 9),
        (16, 1),
        (17, 5),
        (31, 4),
        (33, 8),
        (47, 3),
        (64, 2),
        (100, 37),
        (255, 3),
        (257, 24),
        (300, 1),
        (513, 6),
        (1024, 3),
        (31, 300),
    ];
    for (si, &(k, n)) in shapes.iter().enumerate() {
        for special in [false, true] {
            let seed = (k * 131 + n) as u64 + si as u64;
            let w = if special {
                special_noise(k * n, seed)
            } else {
                noise(k * n, seed)
            };
            // w is B[K, N]; the transposed source is W = B^T [N, K].
            let f32s = f32_bytes(&w);
            let f16s: Vec<u8> = w
                .iter()
                .flat_map(|&x| crate::fp16::f32_to_f16_bits(x).to_le_bytes())
                .collect();
            for (dt, b, es) in [(DataType::FLOAT, &f32s, 4), (DataType::FLOAT16, &f16s, 2)] {
                let wt = transpose_bytes(b, k, n, es);
                for bits in [4, 8] {
                    for bs in [16, 32, 64, 128, 256] {
                        for sym in [true, false] {
                            let want = pack_all(
                                "ort.matmul_nbits",
                                dt,
                                &[k as u64, n as u64],
                                b,
                                &nbits(bits, bs, sym),
                            );
                            let got = pack_all(
                                "ort.matmul_nbits",
                                dt,
                                &[n as u64, k as u64],
                                &wt,
                                &nbits_t(bits, bs, sym),
                            );
                            assert!(
                                got == want,
                                "K={k} N={n} {dt:?} bits={bits} bs={bs} sym={sym} special={special}: {}",
                                first_diff(&got, &want)
                            );
                        }
                    }
                }
            }
        }
    }
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        return format!("lengths {} != {}", a.len(), b.len());
    }
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => format!(
            "first difference at byte {i}: {:#04x} != {:#04x}",
            a[i], b[i]
        ),
        None => "identical".into(),
    }
}

#[test]
fn matmul_nbits_transposed_zero_signs_and_odd_k() {
    // Mixed-sign zero blocks: the stored scale's sign is that of the first
    // zero of the block (the sequential min/max scan), wherever the lanes
    // put it.
    for k in [16usize, 17, 33, 40, 64, 65, 256] {
        for first_neg in [false, true] {
            for at in [0usize, 1, 5, 15, 16, 17, 31] {
                // NaNs (skipped) before the first zero at `at`, then zeros
                // of the other sign.
                let at = at.min(k - 1);
                let (first, rest) = if first_neg { (-0.0, 0.0) } else { (0.0, -0.0) };
                let mut b = vec![rest; k];
                b[..at].fill(f32::NAN);
                b[at] = first;
                let src = f32_bytes(&b);
                for bits in [4, 8] {
                    for bs in [16, 32, 64] {
                        for sym in [true, false] {
                            let want = pack_all(
                                "ort.matmul_nbits",
                                DataType::FLOAT,
                                &[k as u64, 1],
                                &src,
                                &nbits(bits, bs, sym),
                            );
                            let got = pack_all(
                                "ort.matmul_nbits",
                                DataType::FLOAT,
                                &[1, k as u64],
                                &src,
                                &nbits_t(bits, bs, sym),
                            );
                            assert_eq!(
                                got, want,
                                "k={k} at={at} neg={first_neg} {bits} {bs} {sym}"
                            );
                        }
                    }
                }
            }
        }
    }
    // Odd K = 2*bs + 1 (one-element last block, even index: high nibble 0)
    // and 3*bs + 1 (odd index: the previous block's last high code).
    for k in [33usize, 49, 17, 97] {
        let b: Vec<f32> = (0..k).map(|i| (i % 13) as f32 - 6.0).collect();
        let src = f32_bytes(&b);
        let want = pack_all(
            "ort.matmul_nbits",
            DataType::FLOAT,
            &[k as u64, 1],
            &src,
            &nbits(4, 16, false),
        );
        let got = pack_all(
            "ort.matmul_nbits",
            DataType::FLOAT,
            &[1, k as u64],
            &src,
            &nbits_t(4, 16, false),
        );
        assert_eq!(got, want, "k={k}");
    }
}

#[test]
fn matmul_nbits_transposed_layout() {
    let m = find("ort.matmul_nbits").unwrap();
    for dt in [DataType::FLOAT, DataType::FLOAT16] {
        for sym in [true, false] {
            let plain = m.output(dt, &[100, 7], &nbits(4, 32, sym)).unwrap();
            let t = m.output(dt, &[7, 100], &nbits_t(4, 32, sym)).unwrap();
            assert_ne!(plain.struct_type.name, t.struct_type.name);
            assert_eq!(t.struct_type.name, format!("{}.t", plain.struct_type.name));
            assert_eq!(t.payload_len, plain.payload_len);
            assert_eq!(t.dims, plain.dims);
            assert_eq!(t.struct_type.dims_param, plain.struct_type.dims_param);
            // Same fields (K included), docs aside.
            let strip = |st: &ctcache::pb::StructTypeProto| {
                let mut st = st.clone();
                st.name.clear();
                st.doc_string.clear();
                st.decoder = None;
                if let Some(ctcache::pb::struct_type_proto::Kind::Structure(s)) = st.kind.as_mut() {
                    for f in &mut s.field {
                        f.doc_string.clear();
                    }
                }
                st
            };
            assert_eq!(strip(&t.struct_type), strip(&plain.struct_type));
            assert_ne!(t.struct_type.decoder, plain.struct_type.decoder);
        }
    }
    let l = m
        .output(DataType::FLOAT16, &[7, 100], &nbits_t(4, 32, false))
        .unwrap();
    assert_eq!(l.struct_type.name, "ort.matmul_nbits.b4.bs32.asym.f16.t");
    let l = m
        .output(
            DataType::FLOAT,
            &[64, 64],
            &Params::new().with("transposed", "false"),
        )
        .unwrap();
    assert_eq!(l.struct_type.name, "ort.matmul_nbits.b4.bs32.sym");
    // The final Transpose of the decoder goes away.
    let ops = |t: &ctcache::pb::StructTypeProto| -> Vec<String> {
        let d = t.decoder.as_ref().unwrap();
        d.node.iter().map(|n| n.op_type.clone()).collect()
    };
    let t = m
        .output(DataType::FLOAT, &[7, 100], &nbits_t(4, 32, true))
        .unwrap();
    assert_eq!(ops(&t.struct_type).last().unwrap(), "Slice");
    let p = m
        .output(DataType::FLOAT, &[100, 7], &nbits(4, 32, true))
        .unwrap();
    assert_eq!(ops(&p.struct_type).last().unwrap(), "Transpose");
}

#[test]
fn matmul_nbits_transposed_check_source() {
    let m = find("ort.matmul_nbits").unwrap();
    let t = Params::new().with("transposed", "true");
    m.check_source(DataType::FLOAT, &[3, 100], &t).unwrap();
    m.check_source(DataType::FLOAT16, &[1, 1], &t).unwrap();
    let e = m
        .check_source(DataType::FLOAT, &[2, 3, 100], &t)
        .unwrap_err();
    assert!(matches!(e, PackError::BadShape { .. }), "{e}");
    assert!(e.to_string().contains("2-D [N, K]"), "{e}");
    let e = m.check_source(DataType::FLOAT, &[100], &t).unwrap_err();
    assert!(e.to_string().contains("2-D"), "{e}");
    let e = m.check_source(DataType::FLOAT, &[0, 4], &t).unwrap_err();
    assert!(matches!(e, PackError::BadShape { .. }), "{e}");
    let e = m.check_source(DataType::INT8, &[4, 4], &t).unwrap_err();
    assert!(matches!(e, PackError::UnsupportedDataType { .. }), "{e}");
    let e = m
        .check_source(
            DataType::FLOAT,
            &[4, 4],
            &Params::new().with("transposed", "yes"),
        )
        .unwrap_err();
    assert!(matches!(e, PackError::BadParamValue { .. }), "{e}");
}

/// Widths that exercise every vector-group shape of the wide kernels: N
/// from 1024 on packs 128-column tiles, 256 .. 1023 32-column tiles, below
/// that 8-column tiles; the last tile of each N below is partial (1, 3 or
/// 4 full 16-lane vectors plus a masked one, or only a masked one), K is
/// odd or shorter than the block, and the values are `special_noise`.
#[test]
fn matmul_nbits_every_isa_agrees_on_partial_vectors() {
    for &(k, n) in &[
        (67usize, 1024 + 100),
        (5, 1024 + 127),
        (33, 1024 + 48),
        (40, 256 + 13),
        (17, 256 + 40),
        (3, 15),
        (66, 16),
        (1, 17),
    ] {
        let w = special_noise(k * n, (k * 7 + n) as u64);
        nbits_all_settings(k, n, &w, &[16, 32, 64]);
    }
}

/// ggml blocks with the deciding element (largest magnitude, a tie of it,
/// a NaN, an infinity) at every lane of either vector half.
#[test]
fn ggml_every_isa_agrees_on_every_lane() {
    let mut x = Vec::new();
    for lane in 0..32 {
        for case in 0..6 {
            let mut b: Vec<f32> = (0..32).map(|i| ((i * 7 % 11) as f32 - 5.0) / 4.0).collect();
            match case {
                0 => b[lane] = 9.0,
                1 => b[lane] = -9.0,
                2 => {
                    // A tie of magnitudes: the first one decides Q4_0's sign.
                    b[lane] = -9.0;
                    b[31 - lane] = 9.0;
                }
                3 => b[lane] = f32::NAN,
                4 => b[lane] = f32::NEG_INFINITY,
                _ => b[lane] = 1e-42,
            }
            x.extend_from_slice(&b);
        }
    }
    x.extend(std::iter::repeat_n(0.0, 32));
    x.extend(std::iter::repeat_n(-0.0, 32));
    x.extend(std::iter::repeat_n(1e-40, 32)); // Q8_0: 1/d overflows
    let n = x.len() as u64;
    let f32s = f32_bytes(&x);
    let f16s: Vec<u8> = x
        .iter()
        .flat_map(|&v| crate::fp16::f32_to_f16_bits(v).to_le_bytes())
        .collect();
    for id in ["ggml.q8_0", "ggml.q4_0"] {
        pack_all(id, DataType::FLOAT, &[n], &f32s, &Params::new());
        pack_all(id, DataType::FLOAT16, &[n], &f16s, &Params::new());
    }
}

/// Casts of every length up to 100 (whole 32-element steps, a masked
/// 16-lane tail, both), NaNs in the tail included.
#[test]
fn cast_every_isa_agrees_on_every_tail() {
    for n in 1usize..=100 {
        let mut x = noise(n, n as u64);
        x[n - 1] = f32::from_bits(0x7f80_0001); // a signalling NaN, last
        if n > 20 {
            x[n - 18] = f32::from_bits(0xffc0_1234);
        }
        let data = f32_bytes(&x);
        for id in ["cast.f16", "cast.bf16"] {
            pack_all(id, DataType::FLOAT, &[n as u64], &data, &Params::new());
        }
    }
}

/// The NEON half-precision conversions (integer code) against the scalar
/// rules: every FLOAT16 pattern widened, and FLOAT patterns around every
/// rounding boundary of every exponent (ties, subnormal halves, overflow,
/// NaN payloads) plus pseudo-random ones, narrowed to FLOAT16 and BFLOAT16.
#[cfg(target_arch = "aarch64")]
#[test]
fn neon_half_conversions_match_the_scalar_rules() {
    use super::cast::target::Target;
    use super::fp16_neon::f16x4_to_f32;
    use crate::fp16::{f16_bits_to_f32, f32_to_bf16_bits, f32_to_f16_bits};
    use std::arch::aarch64::*;

    for h0 in (0..=u16::MAX).step_by(4) {
        let h = [h0, h0 + 1, h0 + 2, h0 + 3];
        let mut got = [0u32; 4];
        // SAFETY: NEON is aarch64's baseline; the arrays hold four lanes.
        unsafe {
            let v = f16x4_to_f32(vld1_u16(h.as_ptr()));
            vst1q_u32(got.as_mut_ptr(), vreinterpretq_u32_f32(v));
        }
        for (j, &g) in got.iter().enumerate() {
            assert_eq!(g, f16_bits_to_f32(h[j]).to_bits(), "f16 {:#06x}", h[j]);
        }
    }
    let mut xs = Vec::new();
    let lows = [
        0u32, 1, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x2001, 0x3000, 0x3fff, 0x7fff, 0x8000,
        0x8001,
    ];
    for sign in [0u32, 1 << 31] {
        for e in 0u32..256 {
            for hi in [0u32, 0x2000, 0x4000, 0x40_0000, 0x7f_c000] {
                for lo in lows {
                    for sub in [0u32, 0x1_0000, 0x7_ffff & !0x3fff] {
                        xs.push(sign | (e << 23) | ((hi | sub | lo) & 0x7f_ffff));
                    }
                }
            }
        }
    }
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..100_000 {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        xs.push(s as u32);
    }
    while xs.len() % 8 != 0 {
        xs.push(0);
    }
    let src: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    for (t, f) in [
        (Target::F16, f32_to_f16_bits as fn(f32) -> u16),
        (Target::Bf16, f32_to_bf16_bits),
    ] {
        let mut out = vec![0u8; 2 * xs.len()];
        // SAFETY: as above.
        let done = unsafe { super::cast::neon::convert_run(t, &src, &mut out) };
        assert_eq!(done, xs.len());
        for (x, o) in xs.iter().zip(out.chunks_exact(2)) {
            let got = u16::from_le_bytes([o[0], o[1]]);
            assert_eq!(got, f(f32::from_bits(*x)), "{t:?} {x:#010x}");
        }
    }
}

/// `identity` keeps the source's bytes for any whole-byte type and shape,
/// and refuses with a clear error what has no whole bytes per element
/// (STRING, 4-bit types), a parameter it does not take, and a shape whose
/// bytes would not fit in memory.
#[test]
fn identity_keeps_the_bytes_and_refuses_what_it_cannot_hold() {
    let data: Vec<u8> = (0..48u8).collect();
    for (dt, dims) in [
        (DataType::INT64, vec![2u64, 3]),
        (DataType::FLOAT16, vec![24]),
        (DataType::UINT8, vec![4, 3, 4]),
    ] {
        assert_eq!(pack_all("identity", dt, &dims, &data, &Params::new()), data);
    }
    let p = find("identity").unwrap();
    for dt in [DataType::STRING, DataType::UINT4] {
        let e = p.check_source(dt, &[4], &Params::new()).unwrap_err();
        assert!(
            matches!(e, PackError::UnsupportedDataType { .. })
                && e.to_string().contains("whole bytes"),
            "{dt:?}: {e}"
        );
    }
    let e = p
        .check_source(DataType::FLOAT, &[4], &Params::new().with("bits", "4"))
        .unwrap_err();
    assert!(e.to_string().contains("bits"), "{e}");
    let e = p
        .check_source(DataType::FLOAT, &[u64::MAX / 2, 4], &Params::new())
        .unwrap_err();
    assert!(matches!(e, PackError::Overflow { .. }), "{e}");
}
