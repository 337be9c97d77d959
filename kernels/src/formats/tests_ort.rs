//! `ort.quantize_dynamic` and `ort.float16` against plain scalar models of
//! the reference's numpy code (written out here step by step, apart from
//! the kernels), on random and edge-case tensors, for every instruction
//! set of this CPU. The byte identity with onnxruntime itself is checked
//! by tests/python/kernels.

use ctcache::dtype::DataType;
use proptest::prelude::*;

use crate::error::PackError;
use crate::find;
use crate::isa::Isa;
use crate::packer::SourceTensor;
use crate::params::Params;

/// `compute_scale_zp` + `quantize_nparray` on one channel, as numpy does it.
fn model_channel(x: &[f32], signed: bool, symmetric: bool, rr: bool) -> (f32, i64, Vec<i64>) {
    // get_qmin_qmax_for_qType
    let (qmin, qmax): (i64, i64) = if rr {
        if signed {
            (-64, 64)
        } else {
            (0, 127)
        }
    } else if symmetric && signed {
        (-127, 127)
    } else if signed {
        (-128, 127)
    } else {
        (0, 255)
    };
    let mut rmin = x.iter().copied().fold(f32::INFINITY, f32::min);
    let mut rmax = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    rmin = if rmin < 0.0 { rmin } else { 0.0 };
    rmax = if rmax > 0.0 { rmax } else { 0.0 };
    if symmetric {
        let absmax = if rmin.abs() > rmax.abs() {
            rmin.abs()
        } else {
            rmax.abs()
        };
        rmin = -absmax;
        rmax = absmax;
    }
    let dr = rmax as f64 - rmin as f64;
    let dq = qmax as f64 - qmin as f64;
    let scale64 = dr / dq;
    let (scale, zp) = if scale64 < f32::MIN_POSITIVE as f64 {
        (1.0f32, 0i64)
    } else if symmetric {
        (
            scale64 as f32,
            ((qmin + qmax) as f64 / 2.0).round_ties_even() as i64,
        )
    } else {
        (
            scale64 as f32,
            (qmin as f64 - rmin as f64 / scale64).round_ties_even() as i64,
        )
    };
    let (lo, hi) = if signed {
        (-128.0, 127.0)
    } else {
        (0.0, 255.0)
    };
    let q = x
        .iter()
        .map(|&v| {
            let r = (v / scale).round_ties_even() + zp as f32;
            let r = if r < lo {
                lo
            } else if r > hi {
                hi
            } else {
                r
            };
            r as i64
        })
        .collect();
    (scale, zp, q)
}

/// The whole payload (scale, zero_point, quantized) of the model.
fn model_quant(x: &[f32], dims: &[u64], signed: bool, sym: bool, pc: bool, rr: bool) -> Vec<u8> {
    let cols = if pc {
        *dims.last().unwrap() as usize
    } else {
        1
    };
    let mut scales = Vec::new();
    let mut zps = Vec::new();
    let mut q = vec![0u8; x.len()];
    for c in 0..cols {
        let idx: Vec<usize> = if pc {
            (c..x.len()).step_by(cols).collect()
        } else {
            (0..x.len()).collect()
        };
        let vals: Vec<f32> = idx.iter().map(|&i| x[i]).collect();
        let (s, z, qs) = model_channel(&vals, signed, sym, rr);
        scales.extend(s.to_le_bytes());
        zps.push(z as u8);
        for (&i, v) in idx.iter().zip(qs) {
            q[i] = v as u8;
        }
    }
    [scales, zps, q].concat()
}

fn bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn pack_every_isa(
    id: &str,
    dims: &[u64],
    data: &[u8],
    params: &Params,
) -> Result<Vec<Vec<u8>>, PackError> {
    let p = find(id).unwrap();
    let layout = p.output(DataType::FLOAT, dims, params)?;
    let src = SourceTensor {
        data_type: DataType::FLOAT,
        dims,
        data,
    };
    Isa::available_all()
        .into_iter()
        .map(|isa| {
            let mut out = vec![0xa5u8; layout.payload_len as usize];
            p.pack_with(&src, params, &mut out, isa)?;
            Ok(out)
        })
        .collect()
}

fn qparams(signed: bool, sym: bool, pc: bool, rr: bool) -> Params {
    Params::new()
        .with("weight_type", if signed { "int8" } else { "uint8" })
        .with("symmetric", &sym.to_string())
        .with("per_channel", &pc.to_string())
        .with("reduce_range", &rr.to_string())
}

/// Finite values of every kind: normal, tiny, subnormal, huge, ties.
fn finite() -> impl Strategy<Value = f32> {
    prop_oneof![
        -4.0f32..4.0,
        (-1000i32..1000).prop_map(|i| i as f32 / 2.0),
        (-100.0f32..100.0).prop_map(|v| v * 1e-39),
        (-3.0f32..3.0).prop_map(|v| v * 1e37),
        Just(0.0f32),
        Just(-0.0f32),
        any::<u32>().prop_map(|b| f32::from_bits(b & 0x7f7f_ffff | (b & 1) << 31)),
    ]
}

fn weight() -> impl Strategy<Value = (Vec<u64>, Vec<f32>)> {
    prop_oneof![
        (1u64..40, 1u64..40).prop_map(|(a, b)| vec![a, b]),
        (1u64..4, 1u64..9, 1u64..20).prop_map(|(a, b, c)| vec![a, b, c]),
        (1u64..100).prop_map(|a| vec![a]),
    ]
    .prop_flat_map(|dims| {
        let n = dims.iter().product::<u64>() as usize;
        (Just(dims), proptest::collection::vec(finite(), n))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn quantize_dynamic_is_the_scalar_model(
        (dims, x) in weight(),
        signed in any::<bool>(),
        sym in any::<bool>(),
        pc in any::<bool>(),
        rr in any::<bool>(),
    ) {
        let want = model_quant(&x, &dims, signed, sym, pc, rr);
        let got = pack_every_isa("ort.quantize_dynamic", &dims, &bytes(&x), &qparams(signed, sym, pc, rr)).unwrap();
        for g in got {
            prop_assert_eq!(&g, &want);
        }
    }

    #[test]
    fn float16_is_clamp_then_cast(bits in proptest::collection::vec(any::<u32>(), 0..80), lo in 0usize..2, hi in 0usize..2) {
        let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let (los, his) = (["5.96e-08", "1e-07"][lo], ["65504", "10000"][hi]);
        let (m, big) = (los.parse::<f64>().unwrap() as f32, his.parse::<f64>().unwrap() as f32);
        let want: Vec<u8> = x
            .iter()
            .map(|&v| {
                // The four np.where of convert_np_to_float16, in order.
                let v = if 0.0 < v && v < m { m } else { v };
                let v = if -m < v && v < 0.0 { -m } else { v };
                let v = if big < v && v < f32::INFINITY { big } else { v };
                let v = if f32::NEG_INFINITY < v && v < -big { -big } else { v };
                crate::fp16::f32_to_f16_bits(v)
            })
            .flat_map(u16::to_le_bytes)
            .collect();
        let params = Params::new().with("min_positive_val", los).with("max_finite_val", his);
        for g in pack_every_isa("ort.float16", &[x.len() as u64], &bytes(&x), &params).unwrap() {
            prop_assert_eq!(&g, &want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// transposed=true on W[N, K] is transposed=false on W^T, type name
    /// `.t` aside.
    #[test]
    fn quantize_dynamic_transposed_is_the_transpose(
        (n, k, x) in (1u64..30, 1u64..30).prop_flat_map(|(n, k)| {
            (Just(n), Just(k), proptest::collection::vec(finite(), (n * k) as usize))
        }),
        signed in any::<bool>(),
        sym in any::<bool>(),
        pc in any::<bool>(),
        rr in any::<bool>(),
    ) {
        let (nu, ku) = (n as usize, k as usize);
        let wt: Vec<f32> = (0..ku * nu).map(|i| x[(i % nu) * ku + i / nu]).collect();
        let want = model_quant(&wt, &[k, n], signed, sym, pc, rr);
        let p = qparams(signed, sym, pc, rr).with("transposed", "true");
        for g in pack_every_isa("ort.quantize_dynamic", &[n, k], &bytes(&x), &p).unwrap() {
            prop_assert_eq!(&g, &want);
        }
        let l = find("ort.quantize_dynamic").unwrap().output(DataType::FLOAT, &[n, k], &p).unwrap();
        prop_assert!(l.struct_type.name.ends_with(".t"));
        prop_assert_eq!(l.dims, vec![k, n]);
    }
}

#[test]
fn quantize_dynamic_edge_cases() {
    // All zero: scale 1, zero point 0 even for asymmetric uint8.
    let z = pack_every_isa(
        "ort.quantize_dynamic",
        &[4, 4],
        &[0u8; 64],
        &qparams(false, false, false, false),
    )
    .unwrap();
    assert_eq!(z[0][..5], [0, 0, 0x80, 0x3f, 0]);
    // Symmetric uint8: zero point 128 (64 with reduce_range).
    let x = bytes(&[1.0, -2.0, 3.0, 0.5]);
    let p = pack_every_isa(
        "ort.quantize_dynamic",
        &[2, 2],
        &x,
        &qparams(false, true, false, false),
    )
    .unwrap();
    assert_eq!(p[0][4], 128);
    let p = pack_every_isa(
        "ort.quantize_dynamic",
        &[2, 2],
        &x,
        &qparams(false, true, false, true),
    )
    .unwrap();
    assert_eq!(p[0][4], 64);
    // int8 symmetric, 3.0 -> 127, -2.0 -> round(-84.67) = -85.
    let p = pack_every_isa(
        "ort.quantize_dynamic",
        &[2, 2],
        &x,
        &qparams(true, true, false, false),
    )
    .unwrap();
    assert_eq!(
        f32::from_le_bytes(p[0][..4].try_into().unwrap()),
        (6.0f64 / 254.0) as f32
    );
    assert_eq!(p[0][5..], [42, (-85i8) as u8, 127, 21]);
    for g in &p {
        assert_eq!(g, &p[0]);
    }
    // NaN and infinities are refused, naming the element.
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for pc in [false, true] {
            let mut v = vec![1.0f32; 40];
            v[37] = bad;
            let e = pack_every_isa(
                "ort.quantize_dynamic",
                &[4, 10],
                &bytes(&v),
                &qparams(true, true, pc, false),
            )
            .unwrap_err();
            assert!(e.to_string().contains("element 37"), "{e}");
        }
    }
}

#[test]
fn the_two_new_types_differ_from_the_old_ones() {
    let key = |id: &str, params: &Params| {
        let l = find(id)
            .unwrap()
            .output(DataType::FLOAT, &[8, 8], params)
            .unwrap();
        ctcache::structs::physical_type_key(&l.struct_type, &[], &Default::default()).unwrap()
    };
    assert_ne!(
        key("ort.float16", &Params::new()),
        key("cast.f16", &Params::new())
    );
    assert_ne!(
        key("ort.float16", &Params::new()),
        key(
            "ort.float16",
            &Params::new().with("max_finite_val", "10000")
        )
    );
    let mut seen = std::collections::HashSet::new();
    for s in [false, true] {
        for sym in [false, true] {
            for pc in [false, true] {
                for rr in [false, true] {
                    assert!(seen.insert(key("ort.quantize_dynamic", &qparams(s, sym, pc, rr))));
                }
            }
        }
    }
}
