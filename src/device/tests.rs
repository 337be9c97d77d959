//! Table test of the D5 matching rules.

use super::*;

fn dev(ty: &str, arch: &str, meta: &[(&str, &str)]) -> pb::DeviceProto {
    pb::DeviceProto {
        r#type: ty.into(),
        architecture: arch.into(),
        metadata_props: meta
            .iter()
            .map(|(k, v)| pb::StringStringEntryProto {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

fn with_runtime(mut d: pb::DeviceProto, rt: &str, ver: &str) -> pb::DeviceProto {
    d.runtime = rt.into();
    d.runtime_version = ver.into();
    d
}

fn with_index(mut d: pb::DeviceProto, i: i32) -> pb::DeviceProto {
    d.index = Some(i);
    d
}

#[test]
fn d5_table() {
    let host_avx2 = dev(
        "cpu",
        "x86_64-avx2",
        &[("cpu.features", "avx,avx2,f16c,fma,sse2")],
    );
    let host_gpu = with_index(dev("wgpu", "10de-2330", &[("require.driver", "550")]), 0);
    let ort = RuntimeIdentity {
        name: "onnxruntime".into(),
        version: "1.20.3".into(),
    };
    // (need, host, runtime, expected mismatching field or "" for a match)
    let cases: Vec<(
        pb::DeviceProto,
        &pb::DeviceProto,
        Option<&RuntimeIdentity>,
        &str,
    )> = vec![
        (
            dev("cpu", "x86_64-avx2", &[("cpu.features", "avx2,fma")]),
            &host_avx2,
            None,
            "",
        ),
        // The tier is informative: features decide.
        (dev("cpu", "x86_64-sse2", &[]), &host_avx2, None, ""),
        (
            dev("cpu", "x86_64-avx512", &[("cpu.features", "avx512f")]),
            &host_avx2,
            None,
            "cpu.features",
        ),
        (
            dev("cpu", "aarch64-neon", &[]),
            &host_avx2,
            None,
            "architecture",
        ),
        (dev("cuda", "sm_80", &[]), &host_avx2, None, "type"),
        (dev("wgpu", "10de-2330", &[]), &host_gpu, None, ""),
        (
            dev("wgpu", "10de-2331", &[]),
            &host_gpu,
            None,
            "architecture",
        ),
        (
            with_index(dev("wgpu", "10de-2330", &[]), 1),
            &host_gpu,
            None,
            "index",
        ),
        (
            with_index(dev("wgpu", "10de-2330", &[]), 0),
            &host_gpu,
            None,
            "",
        ),
        (
            dev("wgpu", "10de-2330", &[("require.driver", "550")]),
            &host_gpu,
            None,
            "",
        ),
        (
            dev("wgpu", "10de-2330", &[("require.driver", "560")]),
            &host_gpu,
            None,
            "metadata:require.driver",
        ),
        (
            dev("wgpu", "10de-2330", &[("note", "informative")]),
            &host_gpu,
            None,
            "",
        ),
        // Runtime rules.
        (
            with_runtime(dev("cpu", "x86_64-avx2", &[]), "onnxruntime", "1.18.0"),
            &host_avx2,
            Some(&ort),
            "",
        ),
        (
            with_runtime(dev("cpu", "x86_64-avx2", &[]), "onnxruntime", "1.21.0"),
            &host_avx2,
            Some(&ort),
            "runtime_version",
        ),
        (
            with_runtime(dev("cpu", "x86_64-avx2", &[]), "onnxruntime", "0.9.0"),
            &host_avx2,
            Some(&ort),
            "runtime_version",
        ),
        (
            with_runtime(dev("cpu", "x86_64-avx2", &[]), "tensorrt", "1.18.0"),
            &host_avx2,
            Some(&ort),
            "runtime",
        ),
        (
            with_runtime(
                dev("cpu", "x86_64-avx2", &[("ctcache.version_match", "exact")]),
                "onnxruntime",
                "1.20.0",
            ),
            &host_avx2,
            Some(&ort),
            "runtime_version",
        ),
        (
            with_runtime(
                dev("cpu", "x86_64-avx2", &[("ctcache.version_match", "exact")]),
                "onnxruntime",
                "1.20.3",
            ),
            &host_avx2,
            Some(&ort),
            "",
        ),
        // No runtime named by the lookup: runtime checks skipped.
        (
            with_runtime(dev("cpu", "x86_64-avx2", &[]), "tensorrt", "9"),
            &host_avx2,
            None,
            "",
        ),
        // Empty runtime on the entry: no constraint.
        (dev("cpu", "x86_64-avx2", &[]), &host_avx2, Some(&ort), ""),
    ];
    for (i, (need, host, rt, want)) in cases.iter().enumerate() {
        let got = compatible(need, host, *rt);
        match (got, *want) {
            (Ok(()), "") => {}
            (Err(m), w) if m.field == w => {}
            (got, w) => panic!("case {i}: expected {w:?}, got {got:?}"),
        }
    }
}

#[test]
fn version_rule() {
    assert!(version_ok("1.2.0", "1.3.0", false));
    assert!(!version_ok("1.3.0", "1.2.9", false));
    assert!(!version_ok("1.0.0", "2.0.0", false));
    assert!(version_ok("v7", "v7", false));
    assert!(!version_ok("1.2.0", "1.3.0", true));
}

#[test]
fn host_cpu_is_self_compatible() {
    let h = host_cpu();
    assert_eq!(h.r#type, "cpu");
    assert!(h.architecture.starts_with(std::env::consts::ARCH));
    compatible(&h, &h, None).unwrap();
}

#[test]
fn device_key_ignores_metadata_order() {
    let a = dev("cpu", "x", &[("a", "1"), ("b", "2")]);
    let b = dev("cpu", "x", &[("b", "2"), ("a", "1")]);
    assert_eq!(device_key(&a), device_key(&b));
    assert_ne!(device_key(&a), device_key(&dev("cpu", "y", &[])));
}

#[test]
fn cpu_features_judged_alike_for_short_and_long_need_lists() {
    let all: Vec<String> = (0..40).map(|i| format!("f{i:02}")).collect();
    let host = dev(
        "cpu",
        "x86_64-avx2",
        &[("cpu.features", all.join(",").as_str())],
    );
    for n in [1, 3, FEW_FEATURES, FEW_FEATURES + 1, 40] {
        let need = dev(
            "cpu",
            "x86_64-avx2",
            &[("cpu.features", all[..n].join(",").as_str())],
        );
        assert!(
            compatible(&need, &host, None).is_ok(),
            "{n} present features"
        );
        let lacking = format!("{},zz9,,{}", all[..n - 1].join(","), "zz8");
        let need = dev("cpu", "x86_64-avx2", &[("cpu.features", lacking.as_str())]);
        let m = compatible(&need, &host, None).unwrap_err();
        assert_eq!(m.field, "cpu.features", "{n}");
        assert_eq!(m.detail, "host lacks zz9,zz8", "{n}");
    }
}
