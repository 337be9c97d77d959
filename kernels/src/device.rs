//! What a payload requires from the CPU that consumes it (D5).
//!
//! The rule: `type` is always `cpu`; `architecture` is `<isa>-<tier>` with
//! `<isa>` the family the payload was packed for (the host's,
//! `std::env::consts::ARCH`), and `cpu.features` lists, sorted and
//! comma-separated, exactly the features the consuming kernel needs.
//! Portable payloads (quantized blocks, casts: plain little-endian data
//! any kernel can read) need no feature: tier `baseline`, empty
//! `cpu.features`. D5 has no "any architecture", so even those name the
//! host family; a host of another family packs its own copy. Layouts shaped
//! for one micro-kernel (GEMM panels) name that kernel's tier and features.

use ctcache::pb;

/// Metadata key with the sorted, comma-separated required CPU features.
pub const CPU_FEATURES_KEY: &str = "cpu.features";

/// The ISA family of this build (`x86_64`, `aarch64`, ...).
pub fn isa_family() -> &'static str {
    std::env::consts::ARCH
}

/// A CPU requirement: `<family>-<tier>` plus the needed features (sorted
/// and deduplicated here).
pub fn cpu_requirement(tier: &str, features: &[&str]) -> pb::DeviceProto {
    let mut f: Vec<&str> = features.to_vec();
    f.sort_unstable();
    f.dedup();
    pb::DeviceProto {
        r#type: "cpu".to_string(),
        index: None,
        architecture: format!("{}-{tier}", isa_family()),
        runtime: String::new(),
        runtime_version: String::new(),
        metadata_props: vec![pb::StringStringEntryProto {
            key: CPU_FEATURES_KEY.to_string(),
            value: f.join(","),
        }],
    }
}

/// The requirement of a portable payload: host family, no features.
pub fn portable_cpu() -> pb::DeviceProto {
    cpu_requirement("baseline", &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let d = cpu_requirement("avx2", &["fma", "avx2", "fma"]);
        assert_eq!(d.r#type, "cpu");
        assert_eq!(d.architecture, format!("{}-avx2", std::env::consts::ARCH));
        assert_eq!(d.metadata_props[0].key, CPU_FEATURES_KEY);
        assert_eq!(d.metadata_props[0].value, "avx2,fma");
        let p = portable_cpu();
        assert!(p.architecture.ends_with("-baseline"));
        assert_eq!(p.metadata_props[0].value, "");
    }
}
