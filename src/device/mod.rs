//! Device descriptors (D5): compatibility between what a payload needs and
//! what the host has, and detection of the host CPU.

mod cpu;

pub use cpu::{host_cpu, isa_family};

use crate::pb;

/// Metadata key listing the CPU features a payload needs (sorted, comma-separated).
pub const CPU_FEATURES_KEY: &str = "cpu.features";
/// Metadata key of a wgpu device: the graphics API wgpu reaches it through
/// (`vulkan`, `gl`, ...). Descriptive: device matching ignores it.
pub const WGPU_BACKEND_KEY: &str = "wgpu.backend";
/// Metadata key of a wgpu device: the adapter's name. Descriptive.
pub const WGPU_NAME_KEY: &str = "wgpu.name";
/// Metadata key that turns the runtime version rule from semver to exact.
pub(crate) const VERSION_MATCH_KEY: &str = "ctcache.version_match";
/// Metadata keys with this prefix must be present on the host with an equal value.
pub(crate) const REQUIRE_PREFIX: &str = "require.";

/// The consuming runtime's identity, when a lookup names one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RuntimeIdentity {
    /// The runtime's name, e.g. `onnxruntime`.
    pub name: String,
    /// The runtime's version, compared with the entry's requirement.
    pub version: String,
}

/// Why an entry's device does not fit a host device: the first D5 field
/// that differs, and a sentence for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The first D5 field that differs.
    pub field: String,
    /// How it differs, for humans.
    pub detail: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

fn meta<'a>(d: &'a pb::DeviceProto, key: &str) -> Option<&'a str> {
    crate::structs::metadata(&d.metadata_props, key)
}

fn mismatch(field: impl Into<String>, detail: impl Into<String>) -> Mismatch {
    Mismatch {
        field: field.into(),
        detail: detail.into(),
    }
}

/// Checks whether a payload built for `need` may run on `host` (D5), in the
/// order type, index, architecture (+ CPU features), runtime, version,
/// required metadata.
pub fn compatible(
    need: &pb::DeviceProto,
    host: &pb::DeviceProto,
    runtime: Option<&RuntimeIdentity>,
) -> Result<(), Mismatch> {
    if need.r#type != host.r#type {
        return Err(mismatch(
            "type",
            format!("needs {:?}, host has {:?}", need.r#type, host.r#type),
        ));
    }
    if let Some(i) = need.index {
        if host.index != Some(i) {
            return Err(mismatch(
                "index",
                format!("needs device ordinal {i}, host device is {:?}", host.index),
            ));
        }
    }
    architecture(need, host)?;
    if let Some(rt) = runtime.filter(|_| !need.runtime.is_empty()) {
        if need.runtime != rt.name {
            return Err(mismatch(
                "runtime",
                format!("needs {:?}, runtime is {:?}", need.runtime, rt.name),
            ));
        }
        let exact = meta(need, VERSION_MATCH_KEY) == Some("exact");
        if !version_ok(&need.runtime_version, &rt.version, exact) {
            return Err(mismatch(
                "runtime_version",
                format!(
                    "needs {} {:?}, runtime is {:?}",
                    if exact { "exactly" } else { "compatible with" },
                    need.runtime_version,
                    rt.version
                ),
            ));
        }
    }
    for p in need
        .metadata_props
        .iter()
        .filter(|p| p.key.starts_with(REQUIRE_PREFIX))
    {
        if meta(host, &p.key) != Some(p.value.as_str()) {
            return Err(mismatch(
                format!("metadata:{}", p.key),
                format!("needs {:?}, host has {:?}", p.value, meta(host, &p.key)),
            ));
        }
    }
    Ok(())
}

/// Needed CPU features up to which each is looked up in the host's list
/// directly (beyond: in a set of the host's).
const FEW_FEATURES: usize = 16;

/// The features a `cpu.features` value lists.
fn listed(features: Option<&str>) -> impl Iterator<Item = &str> {
    features.unwrap_or("").split(',').filter(|s| !s.is_empty())
}

fn architecture(need: &pb::DeviceProto, host: &pb::DeviceProto) -> Result<(), Mismatch> {
    if need.r#type != "cpu" {
        if need.architecture != host.architecture {
            return Err(mismatch(
                "architecture",
                format!(
                    "needs {:?}, host has {:?}",
                    need.architecture, host.architecture
                ),
            ));
        }
        return Ok(());
    }
    if isa_family(&need.architecture) != isa_family(&host.architecture) {
        return Err(mismatch(
            "architecture",
            format!(
                "needs ISA {:?}, host is {:?}",
                need.architecture, host.architecture
            ),
        ));
    }
    let (need_features, host_features) =
        (meta(need, CPU_FEATURES_KEY), meta(host, CPU_FEATURES_KEY));
    // The common case, an entry packed on this host: the same list.
    if need_features == host_features {
        return Ok(());
    }
    // A packer needs a few features and the host lists ~100: scanning the
    // host's list per needed feature is cheaper than a set of the host's
    // built per judged entry; a long need list (a client's put) gets the set.
    let missing: Vec<&str> = if listed(need_features).nth(FEW_FEATURES).is_none() {
        listed(need_features)
            .filter(|f| !listed(host_features).any(|h| h == *f))
            .collect()
    } else {
        let host: std::collections::HashSet<&str> = listed(host_features).collect();
        listed(need_features)
            .filter(|f| !host.contains(f))
            .collect()
    };
    if !missing.is_empty() {
        return Err(mismatch(
            CPU_FEATURES_KEY,
            format!("host lacks {}", missing.join(",")),
        ));
    }
    Ok(())
}

/// D5 version rule: semver-compatible (same major, host not older) unless
/// `exact`; versions that are not semver compare as exact strings.
pub(crate) fn version_ok(need: &str, have: &str, exact: bool) -> bool {
    if exact || need.is_empty() {
        return need.is_empty() || need == have;
    }
    match (semver::Version::parse(need), semver::Version::parse(have)) {
        (Ok(n), Ok(h)) => n.major == h.major && h >= n,
        _ => need == have,
    }
}

/// Picks the host device that fits `need`, or the most specific mismatch
/// (from a host device of the same type when there is one).
pub(crate) fn find_compatible<'a>(
    need: &pb::DeviceProto,
    hosts: &'a [pb::DeviceProto],
    runtime: Option<&RuntimeIdentity>,
) -> Result<(usize, &'a pb::DeviceProto), Mismatch> {
    let mut best: Option<Mismatch> = None;
    for (i, h) in hosts.iter().enumerate() {
        match compatible(need, h, runtime) {
            Ok(()) => return Ok((i, h)),
            Err(m) if m.field != "type" || best.is_none() => best = Some(m),
            Err(_) => {}
        }
    }
    Err(best.unwrap_or_else(|| mismatch("type", format!("host has no {:?} device", need.r#type))))
}

/// A stable identity of a descriptor for cache keys: blake3 of its encoding
/// with metadata sorted by key.
pub(crate) fn device_key(d: &pb::DeviceProto) -> [u8; 32] {
    use prost::Message;
    let mut d = d.clone();
    d.metadata_props
        .sort_by(|a, b| (&a.key, &a.value).cmp(&(&b.key, &b.value)));
    *blake3::hash(&d.encode_to_vec()).as_bytes()
}

/// Short human form: `cpu x86_64-avx2`, `wgpu 10de-2330 (runtime 1.2)`.
pub fn describe(d: &pb::DeviceProto) -> String {
    let mut s = format!("{} {}", d.r#type, d.architecture);
    if let Some(i) = d.index {
        s.push_str(&format!(" #{i}"));
    }
    if !d.runtime.is_empty() {
        s.push_str(&format!(" ({} {})", d.runtime, d.runtime_version));
    }
    s
}

#[cfg(test)]
mod tests;
