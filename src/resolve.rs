//! The loading rules: classify each compiled entry of a model as a hit on
//! this host, or a miss with a named reason (D5/D6). Checks run in the
//! proposal's order; the first failing one is the reason.

use std::collections::{BTreeSet, HashMap};
use std::fmt;

use crate::check::{CheckOptions, Checked};
use crate::device::{self, Mismatch, RuntimeIdentity};
use crate::digest::{self, Algorithm};
use crate::error::Result;
use crate::onnx::{Model, TensorRef};
use crate::pb;
use crate::structs::{self, FORMAT_VERSION_KEY};

/// The physical types this runtime can consume: exact struct type names,
/// and packer families (every type named `<packer>` or `<packer>.<params>`
/// whose `ctcache.packer` metadata is that packer), each with the format
/// versions understood.
#[derive(Debug, Clone, Default)]
pub struct Recognized {
    names: HashMap<String, BTreeSet<u32>>,
    packers: HashMap<String, BTreeSet<u32>>,
}

impl Recognized {
    /// Recognizes one exact type name at one format version.
    pub fn insert(&mut self, name: impl Into<String>, version: u32) {
        self.names.entry(name.into()).or_default().insert(version);
    }

    /// Recognizes every type a packer produces at one format version.
    pub fn insert_packer(&mut self, packer: impl Into<String>, version: u32) {
        self.packers
            .entry(packer.into())
            .or_default()
            .insert(version);
    }

    /// The versions understood for a type name (exact names first, then the
    /// packer family the name belongs to), or `None` when it is unknown.
    pub fn versions(&self, name: &str) -> Option<&BTreeSet<u32>> {
        if let Some(v) = self.names.get(name) {
            return Some(v);
        }
        self.packers
            .iter()
            .filter(|(p, _)| {
                name == p.as_str()
                    || name
                        .strip_prefix(p.as_str())
                        .is_some_and(|r| r.starts_with('.'))
            })
            .max_by_key(|(p, _)| p.len())
            .map(|(_, v)| v)
    }

    /// The versions understood for a type: by name, and for packer families
    /// only when the type's `ctcache.packer` metadata names that packer.
    pub fn versions_of(&self, t: &pb::StructTypeProto) -> Option<&BTreeSet<u32>> {
        if let Some(v) = self.names.get(&t.name) {
            return Some(v);
        }
        let packer = structs::metadata(&t.metadata_props, structs::PACKER_KEY)?;
        let family = t.name == packer
            || t.name
                .strip_prefix(packer)
                .is_some_and(|rest| rest.starts_with('.'));
        family.then(|| self.packers.get(packer)).flatten()
    }
}

impl<S: Into<String>> FromIterator<(S, u32)> for Recognized {
    fn from_iter<I: IntoIterator<Item = (S, u32)>>(iter: I) -> Self {
        let mut r = Recognized::default();
        for (n, v) in iter {
            r.insert(n, v);
        }
        r
    }
}

/// What the host offers: its devices, the consuming runtime, the types it knows.
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub devices: Vec<pb::DeviceProto>,
    pub runtime: Option<RuntimeIdentity>,
    pub recognized: Recognized,
}

/// Why an entry cannot be used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissReason {
    /// A structural (checker) error: the entry is ignored.
    Invalid {
        rule: &'static str,
        message: String,
    },
    StaleDigest,
    UnknownDigestAlgorithm(String),
    IncompatibleDevice(Mismatch),
    UnknownPhysicalType(String),
    UnsupportedFormatVersion {
        name: String,
        version: String,
    },
}

impl MissReason {
    /// Machine-readable reason code.
    pub fn code(&self) -> &'static str {
        match self {
            MissReason::Invalid { .. } => "invalid",
            MissReason::StaleDigest => "stale_digest",
            MissReason::UnknownDigestAlgorithm(_) => "unknown_digest_algorithm",
            MissReason::IncompatibleDevice(_) => "incompatible_device",
            MissReason::UnknownPhysicalType(_) => "unknown_physical_type",
            MissReason::UnsupportedFormatVersion { .. } => "unsupported_format_version",
        }
    }
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MissReason::Invalid { rule, message } => write!(f, "invalid [{rule}]: {message}"),
            MissReason::StaleDigest => {
                f.write_str("stale_digest: the initializer changed since the entry was compiled")
            }
            MissReason::UnknownDigestAlgorithm(a) => write!(f, "unknown_digest_algorithm: {a:?}"),
            MissReason::IncompatibleDevice(m) => write!(f, "incompatible_device: {m}"),
            MissReason::UnknownPhysicalType(n) => {
                write!(f, "unknown_physical_type: {n:?} is not recognized")
            }
            MissReason::UnsupportedFormatVersion { name, version } => {
                write!(
                    f,
                    "unsupported_format_version: {name:?} version {version:?}"
                )
            }
        }
    }
}

/// Hit (with the host device index) or miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    Hit { host_device: usize },
    Miss(MissReason),
}

/// The classification of one compiled entry.
#[derive(Debug, Clone)]
pub struct EntryStatus {
    pub index: usize,
    pub source_name: String,
    /// Human form of the entry's device (empty when the index is invalid).
    pub device: String,
    /// The physical type's name (empty when it does not resolve).
    pub physical_type: String,
    pub status: Status,
}

fn invalid(e: crate::check::CheckError) -> MissReason {
    MissReason::Invalid {
        rule: e.rule,
        message: format!("{}: {}", e.field, e.message),
    }
}

/// Classifies every compiled entry of `model` for `host`.
pub fn classify(model: &Model, host: &Host, opts: &CheckOptions) -> Result<Vec<EntryStatus>> {
    let c = Checked::new(model, opts)?;
    let tensors: HashMap<String, TensorRef> = model
        .initializers()?
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    let mut digests: HashMap<(String, Algorithm), Result<[u8; 32], String>> = HashMap::new();
    let mut out = Vec::with_capacity(c.ext.compiled_tensors.len());
    for i in 0..c.ext.compiled_tensors.len() {
        let e = &c.ext.compiled_tensors[i];
        let device = usize::try_from(e.device)
            .ok()
            .and_then(|d| c.ext.devices.get(d))
            .map(device::describe)
            .unwrap_or_default();
        let physical_type = e
            .value
            .as_ref()
            .and_then(|v| structs::resolve_root(v, &c.ext.struct_types).ok())
            .map(|t| t.name.clone())
            .unwrap_or_default();
        let status = match classify_entry(&c, i, host, &tensors, &mut digests) {
            Ok(host_device) => Status::Hit { host_device },
            Err(reason) => Status::Miss(reason),
        };
        out.push(EntryStatus {
            index: i,
            source_name: e.source_name.clone(),
            device,
            physical_type,
            status,
        });
    }
    Ok(out)
}

fn classify_entry(
    c: &Checked<'_>,
    i: usize,
    host: &Host,
    tensors: &HashMap<String, TensorRef>,
    digests: &mut HashMap<(String, Algorithm), Result<[u8; 32], String>>,
) -> std::result::Result<usize, MissReason> {
    if let Some(e) = c.model_errors.first() {
        return Err(invalid(e.clone()));
    }
    let e = &c.ext.compiled_tensors[i];
    // 1. The source resolves to exactly one initializer.
    if let Some(err) = c.source_rule(i) {
        return Err(invalid(err));
    }
    // 2. The digest matches.
    if let Some(err) = c.digest_rule(i) {
        return Err(invalid(err));
    }
    let alg: Algorithm = e
        .digest_algorithm
        .parse()
        .map_err(|_| MissReason::UnknownDigestAlgorithm(e.digest_algorithm.clone()))?;
    let actual = digests
        .entry((e.source_name.clone(), alg))
        .or_insert_with(|| match tensors.get(&e.source_name) {
            Some(t) => digest::digest_tensor(c.model, t, alg)
                .map(|d| d.bytes)
                .map_err(|err| err.to_string()),
            None => Err("source initializer not found".into()),
        })
        .clone()
        .map_err(|message| MissReason::Invalid {
            rule: "source.readable",
            message,
        })?;
    if e.source_digest.as_ref() != actual {
        return Err(MissReason::StaleDigest);
    }
    // 3. The device index is valid; 4. the device is compatible.
    if let Some(err) = c.device_rule(i) {
        return Err(invalid(err));
    }
    let need = &c.ext.devices[e.device as usize];
    let (host_device, _) = device::find_compatible(need, &host.devices, host.runtime.as_ref())
        .map_err(MissReason::IncompatibleDevice)?;
    // 5. The value and its type are structurally valid.
    let root = c.value_rule(i).map_err(invalid)?;
    // 6. The runtime recognizes the type and its format version.
    let versions = host
        .recognized
        .versions_of(root)
        .ok_or_else(|| MissReason::UnknownPhysicalType(root.name.clone()))?;
    let version = structs::metadata(&root.metadata_props, FORMAT_VERSION_KEY).unwrap_or("");
    match version.parse::<u32>() {
        Ok(v) if versions.contains(&v) => Ok(host_device),
        _ => Err(MissReason::UnsupportedFormatVersion {
            name: root.name.clone(),
            version: version.to_string(),
        }),
    }
}
