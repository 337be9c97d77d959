//! Host CPU detection: the ISA tier and the full feature list (D5).

use crate::pb;

/// The ISA family of an architecture string (`x86_64-avx2` -> `x86_64`).
pub fn isa_family(architecture: &str) -> &str {
    architecture.split('-').next().unwrap_or(architecture)
}

#[cfg(target_arch = "x86_64")]
fn features() -> (Vec<&'static str>, &'static str) {
    macro_rules! detect {
        ($($f:tt),*) => {{
            let mut v = Vec::new();
            $( if std::arch::is_x86_feature_detected!($f) { v.push($f); } )*
            v
        }};
    }
    let f = detect!(
        "sse2",
        "sse3",
        "ssse3",
        "sse4.1",
        "sse4.2",
        "popcnt",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi1",
        "bmi2",
        "lzcnt",
        "movbe",
        "avx512f",
        "avx512bw",
        "avx512cd",
        "avx512dq",
        "avx512vl",
        "avx512vnni",
        "avx512bf16",
        "avx512fp16",
        "avx512vbmi",
        "avxvnni",
        "gfni",
        "vaes",
        "vpclmulqdq",
        "sha",
        "aes"
    );
    let tier = if f.contains(&"avx512f") && f.contains(&"avx512bw") && f.contains(&"avx512vl") {
        "avx512"
    } else if f.contains(&"avx2") && f.contains(&"fma") {
        "avx2"
    } else if f.contains(&"sse4.2") {
        "sse4"
    } else {
        "sse2"
    };
    (f, tier)
}

#[cfg(target_arch = "aarch64")]
fn features() -> (Vec<&'static str>, &'static str) {
    macro_rules! detect {
        ($($f:tt),*) => {{
            let mut v = Vec::new();
            $( if std::arch::is_aarch64_feature_detected!($f) { v.push($f); } )*
            v
        }};
    }
    let f = detect!(
        "neon", "fp16", "dotprod", "i8mm", "bf16", "sve", "sve2", "fhm", "rdm", "aes", "sha2"
    );
    let tier = if f.contains(&"sve") { "sve" } else { "neon" };
    (f, tier)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn features() -> (Vec<&'static str>, &'static str) {
    (Vec::new(), "baseline")
}

/// The host CPU as a DeviceProto: `type` "cpu", `architecture`
/// `<isa>-<tier>`, metadata `cpu.features` = every detected feature, sorted.
pub fn host_cpu() -> pb::DeviceProto {
    let (mut f, tier) = features();
    f.sort_unstable();
    pb::DeviceProto {
        r#type: "cpu".into(),
        index: None,
        architecture: format!("{}-{tier}", std::env::consts::ARCH),
        runtime: String::new(),
        runtime_version: String::new(),
        metadata_props: vec![pb::StringStringEntryProto {
            key: super::CPU_FEATURES_KEY.into(),
            value: f.join(","),
        }],
    }
}
