//! Shared helpers of the store integration tests: entry builders and an
//! independent consistency check that reads files and index through the
//! public API only.

#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::dtype::DataType;
use ctcache::hit::{KnownLayout, MissReason, SourceShape, TypeRegistry};
use ctcache::pb;
use ctcache::store::{Accept, Entry, Filter, HostFilter, NewEntry, Producer, Store};
use ctcache::structs::FORMAT_VERSION_KEY;

pub fn digest(n: u64) -> SourceDigest {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&n.to_le_bytes());
    SourceDigest {
        algorithm: Algorithm::Blake3,
        bytes,
    }
}

pub fn cpu(arch: &str, features: &str) -> pb::DeviceProto {
    let mut d = pb::DeviceProto {
        r#type: "cpu".into(),
        architecture: arch.into(),
        ..Default::default()
    };
    if !features.is_empty() {
        d.metadata_props.push(pb::StringStringEntryProto {
            key: "cpu.features".into(),
            value: features.into(),
        });
    }
    d
}

pub fn ty(name: &str, version: u32) -> pb::StructTypeProto {
    pb::StructTypeProto {
        name: name.into(),
        metadata_props: vec![pb::StringStringEntryProto {
            key: FORMAT_VERSION_KEY.into(),
            value: version.to_string(),
        }],
        ..Default::default()
    }
}

/// The source shape every test entry records.
pub fn shape() -> SourceShape {
    SourceShape {
        data_type: DataType::FLOAT,
        dims: vec![16, 16],
    }
}

/// The layout of the test type `ty(name, version)` for [`shape`].
pub fn layout(name: &str, version: u32) -> KnownLayout {
    KnownLayout {
        key: ctcache::structs::physical_type_key(&ty(name, version), &[], &Default::default())
            .unwrap(),
        type_name: name.into(),
        dims: vec![16, 16],
        source: shape(),
        packer: name.into(),
        params: String::new(),
        format_version: version,
    }
}

/// A registry of test types: each `(name, version)` listed is known, with
/// the layout [`layout`] gives for any source.
pub struct NamedTypes(pub Vec<(&'static str, u32)>);

impl TypeRegistry for NamedTypes {
    fn candidates(
        &self,
        claimed: &pb::StructTypeProto,
        source: &SourceShape,
    ) -> Result<Vec<KnownLayout>, MissReason> {
        let (name, version) = self
            .0
            .iter()
            .find(|(n, _)| *n == claimed.name)
            .ok_or_else(|| MissReason::UnknownPhysicalType {
                name: claimed.name.clone(),
                detail: "not a test type".into(),
            })?;
        let v = ctcache::structs::metadata(&claimed.metadata_props, FORMAT_VERSION_KEY);
        if v != Some(version.to_string().as_str()) {
            return Err(MissReason::UnsupportedFormatVersion {
                name: claimed.name.clone(),
                version: v.unwrap_or("").into(),
            });
        }
        let mut l = layout(name, *version);
        l.source = source.clone();
        Ok(vec![l])
    }
}

pub fn entry_for(
    source: SourceDigest,
    device: pb::DeviceProto,
    t: pb::StructTypeProto,
) -> NewEntry {
    NewEntry {
        source,
        source_shape: shape(),
        device,
        physical_type: t,
        dims: vec![16, 16],
        producer: Producer {
            packer_id: "test".into(),
            packer_version: "1".into(),
            client_uid: None,
            ..Default::default()
        },
        source_names: vec!["w".into()],
        model_paths: vec!["/models/m.onnx".into()],
        pack_duration: Duration::from_millis(1),
    }
}

/// An entry for source `n` on a plain AVX2 CPU.
pub fn entry(n: u64) -> NewEntry {
    entry_for(digest(n), cpu("x86_64-avx2", ""), ty("test.fmt", 1))
}

/// Deterministic payload bytes.
pub fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Asserts the store invariants: every entry's payload file exists, has its
/// length and blake3, is read-only; tmp/ holds nothing left from earlier
/// owners. Returns the entries.
pub fn assert_consistent(store: &Store) -> Vec<Entry> {
    let entries = store.list(&Filter::default()).expect("list");
    for e in &entries {
        let path = store.blob_path(&e.payload.blake3);
        let data = std::fs::read(&path)
            .unwrap_or_else(|err| panic!("entry {} points at {}: {err}", e.key, path.display()));
        assert_eq!(
            data.len() as u64,
            e.payload.len,
            "length of {}",
            path.display()
        );
        assert_eq!(
            *blake3::hash(&data).as_bytes(),
            e.payload.blake3,
            "content of {}",
            path.display()
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o444, "mode of {}", path.display());
        // The per-source key list knows the entry: lookups find it.
        let host = HostFilter::new(vec![e.device.clone()], None, Accept::Any);
        let found = store.lookup(e.source(), &host).expect("lookup");
        let hit = found.iter().find(|h| h.entry.key == e.key);
        let hit = hit.unwrap_or_else(|| panic!("lookup misses {}", e.key));
        // ... and returns the current record (no stale cached copy).
        assert_eq!(hit.entry.payload, e.payload, "lookup of {} is stale", e.key);
        assert_eq!(hit.entry.source_names, e.source_names);
    }
    entries
}

pub fn tmp_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("tmp")).unwrap().next().is_none()
}

/// Number of payload files under blobs/.
pub fn blob_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|s| std::fs::read_dir(s.unwrap().path()).unwrap().count())
        .sum()
}
