//! Entry metadata: what a producer hands to `put` ([`NewEntry`]), what the
//! store returns ([`Entry`]), and their index encodings. Records are
//! hand-written prost messages with a `version` field; readers that only
//! need a few fields decode a shorter message over the same tags (prost
//! skips the rest), which keeps lookups and GC walks cheap.

use std::time::Duration;

use prost::Message;

use super::error::{StoreError, StoreResult};
use super::key::EntryKey;
use crate::digest::SourceDigest;
use crate::dtype::DataType;
use crate::hit::{MissReason, SourceShape};
use crate::pb;
use crate::structs::{self, PhysicalTypeKey, FORMAT_VERSION_KEY, PACKER_KEY};

/// Version of [`Record`]; a record with a higher one is refused, not guessed at.
pub(crate) const RECORD_VERSION: u32 = 1;
/// Longest source name or model path remembered (longer ones are cut).
const MAX_SEEN_LEN: usize = 1024;

/// Who produced a payload.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Producer {
    /// Id of the packer that made the payload, e.g. `ort.matmul_nbits`.
    pub packer_id: String,
    /// The packer's version as text (its format version for this build's packers).
    pub packer_version: String,
    /// The uid of the client that put the payload, when a client did.
    pub client_uid: Option<u32>,
    /// The untrusted uid whose request had the daemon pack it, when one
    /// did: gc's per-uid storage quota counts the entry against that uid.
    pub requested_by: Option<u32>,
}

/// Everything `put` needs besides the payload bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    /// Digest of the source tensor (D3): the first part of the key.
    pub source: SourceDigest,
    /// The source's data type and dims: what the packer's output type
    /// depends on besides its parameters; lookups judge the entry's layout
    /// against it (D9).
    pub source_shape: SourceShape,
    /// The device the payload needs; its device key is part of the key.
    pub device: pb::DeviceProto,
    /// The resolved concrete type (references inlined); doc strings are
    /// cleared by `put` (D4). Needs a `name` and `ctcache.format_version`.
    pub physical_type: pb::StructTypeProto,
    /// `StructProto.dims` of the compiled value.
    pub dims: Vec<u64>,
    /// Who made the payload.
    pub producer: Producer,
    /// Initializer names the source was seen under (for reports).
    pub source_names: Vec<String>,
    /// Model files the source was seen in (for reports and re-packing).
    pub model_paths: Vec<String>,
    /// How long the pack took (zero for imported or put payloads).
    pub pack_duration: Duration,
}

/// The payload file an entry points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PayloadInfo {
    /// blake3 of the payload bytes; also the payload file's name.
    pub blake3: [u8; 32],
    /// Payload length in bytes.
    pub len: u64,
}

/// A stored entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The entry's identity: source digest, device key, physical type key.
    pub key: EntryKey,
    /// `None` for entries stored before the store kept source shapes: never
    /// a hit for a lookup that judges types.
    pub source_shape: Option<SourceShape>,
    /// The physical type's `name` (a label; the key is the type's hash).
    pub type_name: String,
    /// The type's `ctcache.format_version`.
    pub format_version: u32,
    /// The canonical `StructTypeProto` encoding whose blake3 is the type key.
    pub physical_type: Vec<u8>,
    /// `StructProto.dims` of the compiled value.
    pub dims: Vec<u64>,
    /// The device the payload needs.
    pub device: pb::DeviceProto,
    /// The payload file's hash and length.
    pub payload: PayloadInfo,
    /// Who made the payload.
    pub producer: Producer,
    /// Initializer names the source was seen under (bounded, for reports).
    pub source_names: Vec<String>,
    /// Model files the source was seen in (bounded, for reports and re-packing).
    pub model_paths: Vec<String>,
    /// When the entry was stored, unix ms.
    pub created_ms: u64,
    /// Access statistics: present from `stat`, `list` and `put`; lookups
    /// leave them out (they would cost an index read per hit).
    pub access: Option<AccessStats>,
    /// How long the pack took (zero for imported or put payloads).
    pub pack_duration: Duration,
}

/// How an entry's payload has been used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AccessStats {
    /// Last `open_payload` (unix ms), or the creation time.
    pub last_ms: u64,
    /// `open_payload` calls.
    pub count: u64,
}

impl Entry {
    /// The source digest part of the key.
    pub fn source(&self) -> &SourceDigest {
        &self.key.source
    }

    /// Decodes the physical type.
    pub fn physical_type(&self) -> StoreResult<pb::StructTypeProto> {
        pb::StructTypeProto::decode(self.physical_type.as_slice())
            .map_err(|e| StoreError::record(format!("physical type of {}", self.key), e))
    }

    /// The packer id named in the type's metadata (`ctcache.packer`).
    pub fn packer(&self) -> Option<String> {
        self.physical_type()
            .ok()
            .and_then(|t| structs::metadata(&t.metadata_props, PACKER_KEY).map(str::to_string))
    }
}

/// An entry read back from the store, as the one hit rule reads it (for
/// callers that judge a listed entry themselves, e.g. to say why it is not
/// the hit a request wanted).
impl crate::hit::EntryFacts for Entry {
    fn device(&self) -> Result<&pb::DeviceProto, MissReason> {
        Ok(&self.device)
    }

    fn type_key(&self) -> Result<PhysicalTypeKey, MissReason> {
        Ok(self.key.physical_type)
    }

    fn physical_type(&self) -> Result<pb::StructTypeProto, MissReason> {
        Entry::physical_type(self).map_err(|e| MissReason::Invalid {
            rule: "store.record",
            message: e.to_string(),
        })
    }

    fn dims(&self) -> &[u64] {
        &self.dims
    }

    fn source_shape(&self) -> Option<&SourceShape> {
        self.source_shape.as_ref()
    }

    fn client_uid(&self) -> Option<u32> {
        self.producer.client_uid
    }
}

/// The stored form of an entry (the key holds source digest, device key and
/// type key). Tags 1-7 come first so that [`Head`] can stop after them.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Record {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(bytes = "vec", tag = "2")]
    pub payload_blake3: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub payload_len: u64,
    #[prost(uint64, tag = "4")]
    pub created_ms: u64,
    #[prost(string, tag = "5")]
    pub type_name: String,
    #[prost(uint32, tag = "6")]
    pub format_version: u32,
    #[prost(message, optional, tag = "7")]
    pub device: Option<pb::DeviceProto>,
    #[prost(bytes = "vec", tag = "8")]
    pub physical_type: Vec<u8>,
    #[prost(uint64, repeated, tag = "9")]
    pub dims: Vec<u64>,
    #[prost(string, tag = "10")]
    pub packer_id: String,
    #[prost(string, tag = "11")]
    pub packer_version: String,
    #[prost(uint32, optional, tag = "12")]
    pub client_uid: Option<u32>,
    #[prost(string, repeated, tag = "13")]
    pub source_names: Vec<String>,
    #[prost(string, repeated, tag = "14")]
    pub model_paths: Vec<String>,
    #[prost(uint64, tag = "15")]
    pub pack_duration_us: u64,
    /// ONNX data type code of the source (absent in records written before
    /// shapes were kept).
    #[prost(int32, optional, tag = "16")]
    pub source_data_type: Option<i32>,
    #[prost(uint64, repeated, tag = "17")]
    pub source_dims: Vec<u64>,
    #[prost(uint32, optional, tag = "18")]
    pub requested_by: Option<u32>,
}

/// The fields GC, stats and lookups read: tags 1-7 of [`Record`].
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Head {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(bytes = "vec", tag = "2")]
    pub payload_blake3: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub payload_len: u64,
    #[prost(uint64, tag = "4")]
    pub created_ms: u64,
    #[prost(string, tag = "5")]
    pub type_name: String,
    #[prost(uint32, tag = "6")]
    pub format_version: u32,
    #[prost(message, optional, tag = "7")]
    pub device: Option<pb::DeviceProto>,
}

/// Like [`Head`] without the device, with the uid a quota charges (GC
/// walks).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Brief {
    #[prost(uint32, tag = "1")]
    pub version: u32,
    #[prost(bytes = "vec", tag = "2")]
    pub payload_blake3: Vec<u8>,
    #[prost(uint64, tag = "3")]
    pub payload_len: u64,
    #[prost(uint64, tag = "4")]
    pub created_ms: u64,
    #[prost(uint32, optional, tag = "18")]
    pub requested_by: Option<u32>,
}

fn check_version(v: u32, key: &[u8]) -> StoreResult<()> {
    if v == 0 || v > RECORD_VERSION {
        return Err(StoreError::record(
            format!("entry {}", hex::encode(key)),
            format!("record version {v} (this build reads 1..={RECORD_VERSION})"),
        ));
    }
    Ok(())
}

fn blob32(b: &[u8], key: &[u8]) -> StoreResult<[u8; 32]> {
    b.try_into().map_err(|_| {
        StoreError::record(
            format!("entry {}", hex::encode(key)),
            "payload hash is not 32 bytes",
        )
    })
}

macro_rules! decoder {
    ($name:ident, $ty:ty) => {
        pub(crate) fn $name(key: &[u8], value: &[u8]) -> StoreResult<$ty> {
            let r = <$ty>::decode(value)
                .map_err(|e| StoreError::record(format!("entry {}", hex::encode(key)), e))?;
            check_version(r.version, key)?;
            blob32(&r.payload_blake3, key)?;
            Ok(r)
        }
    };
}

decoder!(decode_record, Record);
decoder!(decode_head, Head);
decoder!(decode_brief, Brief);

impl Brief {
    pub fn blob(&self) -> [u8; 32] {
        self.payload_blake3.as_slice().try_into().unwrap_or([0; 32])
    }
}

impl Head {
    pub fn blob(&self) -> [u8; 32] {
        self.payload_blake3.as_slice().try_into().unwrap_or([0; 32])
    }
}

impl Record {
    pub fn blob(&self) -> [u8; 32] {
        self.payload_blake3.as_slice().try_into().unwrap_or([0; 32])
    }

    /// The recorded source shape (`None`: not recorded, or an unknown type).
    pub fn source_shape(&self) -> Option<SourceShape> {
        let data_type = DataType::from_i32(self.source_data_type?).ok()?;
        Some(SourceShape {
            data_type,
            dims: self.source_dims.clone(),
        })
    }

    pub(crate) fn into_entry(self, key: EntryKey, access: Option<Access>) -> Entry {
        let blake3 = self.blob();
        Entry {
            key,
            source_shape: self.source_shape(),
            type_name: self.type_name,
            format_version: self.format_version,
            physical_type: self.physical_type,
            dims: self.dims,
            device: self.device.unwrap_or_default(),
            payload: PayloadInfo {
                blake3,
                len: self.payload_len,
            },
            producer: Producer {
                packer_id: self.packer_id,
                packer_version: self.packer_version,
                client_uid: self.client_uid,
                requested_by: self.requested_by,
            },
            source_names: self.source_names,
            model_paths: self.model_paths,
            access: access.map(|a| AccessStats {
                last_ms: a.last_ms.max(self.created_ms),
                count: a.count,
            }),
            created_ms: self.created_ms,
            pack_duration: Duration::from_micros(self.pack_duration_us),
        }
    }

    /// Adds names and paths not yet recorded, up to `max` each; returns
    /// whether anything changed.
    pub(crate) fn merge_seen(&mut self, names: &[String], paths: &[String], max: usize) -> bool {
        let a = merge(&mut self.source_names, names, max);
        let b = merge(&mut self.model_paths, paths, max);
        a || b
    }

    /// What a repeated put of the same key adds to the record: source names
    /// and model paths, and the source shape of a record stored before
    /// shapes were kept, when the daemon itself packed it again (a client's
    /// claim does not complete a record it did not make). Returns whether
    /// anything changed.
    pub(crate) fn merge_put(&mut self, new: &NewEntry, max: usize) -> bool {
        let seen = self.merge_seen(&new.source_names, &new.model_paths, max);
        let heal = self.source_data_type.is_none() && new.producer.client_uid.is_none();
        if heal {
            self.source_data_type = Some(new.source_shape.data_type.code());
            self.source_dims = new.source_shape.dims.clone();
        }
        seen || heal
    }
}

fn cut(s: &str) -> String {
    let mut end = s.len().min(MAX_SEEN_LEN);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn merge(list: &mut Vec<String>, new: &[String], max: usize) -> bool {
    let mut changed = false;
    for n in new {
        let n = cut(n);
        if list.len() >= max {
            break;
        }
        if !n.is_empty() && !list.contains(&n) {
            list.push(n);
            changed = true;
        }
    }
    changed
}

/// A validated [`NewEntry`]: its key and the record to store (without the
/// payload fields, which `put` fills in).
pub(crate) struct Prepared {
    pub key: EntryKey,
    pub record: Record,
}

/// Canonicalizes the physical type, checks the D4 metadata, derives the key.
pub(crate) fn prepare(new: &NewEntry, now_ms: u64, max_seen: usize) -> StoreResult<Prepared> {
    let canonical = structs::canonical_type(&new.physical_type, &[], &Default::default())
        .map_err(|e| StoreError::InvalidEntry(format!("physical type: {e}")))?;
    if canonical.name.is_empty() {
        return Err(StoreError::InvalidEntry(
            "physical type has no name (D4)".into(),
        ));
    }
    let format_version = structs::metadata(&canonical.metadata_props, FORMAT_VERSION_KEY)
        .ok_or_else(|| {
            StoreError::InvalidEntry(format!(
                "physical type {:?} lacks metadata {FORMAT_VERSION_KEY} (D4)",
                canonical.name
            ))
        })?
        .parse::<u32>()
        .map_err(|_| {
            StoreError::InvalidEntry(format!(
                "physical type {:?}: {FORMAT_VERSION_KEY} is not an integer",
                canonical.name
            ))
        })?;
    if new.device.r#type.is_empty() {
        return Err(StoreError::InvalidEntry("device has no type".into()));
    }
    let physical_type = canonical.encode_to_vec();
    let key = EntryKey {
        source: new.source,
        device: crate::device::device_key(&new.device),
        physical_type: PhysicalTypeKey(*blake3::hash(&physical_type).as_bytes()),
    };
    let mut record = Record {
        version: RECORD_VERSION,
        payload_blake3: Vec::new(),
        payload_len: 0,
        created_ms: now_ms,
        type_name: canonical.name,
        format_version,
        device: Some(new.device.clone()),
        physical_type,
        dims: new.dims.clone(),
        packer_id: new.producer.packer_id.clone(),
        packer_version: new.producer.packer_version.clone(),
        client_uid: new.producer.client_uid,
        source_names: Vec::new(),
        model_paths: Vec::new(),
        pack_duration_us: new.pack_duration.as_micros().min(u64::MAX as u128) as u64,
        source_data_type: Some(new.source_shape.data_type.code()),
        source_dims: new.source_shape.dims.clone(),
        requested_by: new.producer.requested_by,
    };
    record.merge_seen(&new.source_names, &new.model_paths, max_seen);
    Ok(Prepared { key, record })
}

/// Access statistics: last access (unix ms) and count, 16 bytes big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Access {
    pub last_ms: u64,
    pub count: u64,
}

impl Access {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&self.last_ms.to_be_bytes());
        v.extend_from_slice(&self.count.to_be_bytes());
        v
    }

    /// Unreadable stats read as none: they are statistics, not truth.
    pub fn decode(b: &[u8]) -> Access {
        if b.len() != 16 {
            return Access::default();
        }
        Access {
            last_ms: u64::from_be_bytes(b[..8].try_into().unwrap()),
            count: u64::from_be_bytes(b[8..].try_into().unwrap()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::Algorithm;

    fn new_entry() -> NewEntry {
        NewEntry {
            source: SourceDigest {
                algorithm: Algorithm::Blake3,
                bytes: [1; 32],
            },
            device: pb::DeviceProto {
                r#type: "cpu".into(),
                architecture: "x86_64-avx2".into(),
                ..Default::default()
            },
            physical_type: pb::StructTypeProto {
                name: "t.fmt".into(),
                doc_string: "dropped".into(),
                metadata_props: vec![pb::StringStringEntryProto {
                    key: FORMAT_VERSION_KEY.into(),
                    value: "3".into(),
                }],
                ..Default::default()
            },
            dims: vec![4, 5],
            source_shape: SourceShape {
                data_type: DataType::FLOAT,
                dims: vec![4, 5],
            },
            source_names: vec!["w".into(), "w".into(), "x".repeat(5000)],
            model_paths: vec![],
            producer: Producer::default(),
            pack_duration: Duration::ZERO,
        }
    }

    #[test]
    fn prepare_canonicalizes_and_keys() {
        let p = prepare(&new_entry(), 42, 16).unwrap();
        assert_eq!(p.record.format_version, 3);
        assert_eq!(p.record.type_name, "t.fmt");
        let t = pb::StructTypeProto::decode(p.record.physical_type.as_slice()).unwrap();
        assert!(t.doc_string.is_empty());
        assert_eq!(
            p.key.physical_type,
            crate::structs::physical_type_key(&new_entry().physical_type, &[], &Default::default())
                .unwrap()
        );
        assert_eq!(p.record.source_names.len(), 2);
        assert_eq!(p.record.source_names[1].len(), MAX_SEEN_LEN);
        assert_eq!(p.record.source_shape(), Some(new_entry().source_shape));
        let mut old = p.record.clone();
        old.source_data_type = None;
        assert_eq!(
            old.source_shape(),
            None,
            "records without a shape stay without"
        );
    }

    #[test]
    fn prepare_refuses_missing_d4_metadata() {
        let mut n = new_entry();
        n.physical_type.metadata_props.clear();
        assert!(matches!(
            prepare(&n, 0, 16),
            Err(StoreError::InvalidEntry(_))
        ));
        let mut n = new_entry();
        n.physical_type.name.clear();
        assert!(prepare(&n, 0, 16).is_err());
    }

    #[test]
    fn record_round_trip_and_partial_decoders() {
        let mut p = prepare(&new_entry(), 42, 16).unwrap();
        p.record.payload_blake3 = vec![9; 32];
        p.record.payload_len = 77;
        let bytes = p.record.encode_to_vec();
        let k = p.key.to_bytes();
        assert_eq!(decode_record(&k, &bytes).unwrap(), p.record);
        let h = decode_head(&k, &bytes).unwrap();
        assert_eq!((h.payload_len, h.created_ms), (77, 42));
        assert_eq!(h.device.unwrap().architecture, "x86_64-avx2");
        assert_eq!(decode_brief(&k, &bytes).unwrap().blob(), [9; 32]);
        let mut future = p.record.clone();
        future.version = RECORD_VERSION + 1;
        assert!(decode_record(&k, &future.encode_to_vec()).is_err());
    }

    #[test]
    fn a_daemon_put_completes_a_record_without_a_shape() {
        let mut old = prepare(&new_entry(), 1, 16).unwrap().record;
        old.source_data_type = None;
        old.source_dims.clear();
        let mut by_client = new_entry();
        by_client.producer.client_uid = Some(1000);
        let mut rec = old.clone();
        assert!(!rec.merge_put(&by_client, 16));
        assert_eq!(rec.source_shape(), None);
        assert!(rec.merge_put(&new_entry(), 16));
        assert_eq!(rec.source_shape(), Some(new_entry().source_shape));
        assert!(!rec.merge_put(&new_entry(), 16), "once");
    }

    #[test]
    fn access_encoding() {
        let a = Access {
            last_ms: 5,
            count: 6,
        };
        assert_eq!(Access::decode(&a.encode()), a);
        assert_eq!(Access::decode(b"x"), Access::default());
    }
}
