//! Manifests: the signed record next to every remote payload. A host seals
//! the entries it uploads with its key; a reader opens a manifest only when
//! a trusted key signed exactly its bytes and it names the entry asked for.

use std::collections::BTreeMap;

use bytes::Bytes;
use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::hit::SourceShape;
use ctcache::pb;
use ctcache::store::{Entry, EntryKey, NewEntry, PayloadInfo, Producer, StoreError};
use ctcache::structs::{check_value, Limits};
use ctcache_api::v1::{ManifestSignature, RemoteEntry, RemoteManifest};
use ed25519_dalek::{Signature, VerifyingKey};
use prost::Message;

use crate::signing_keys::{PublicKey, SecretKey};

/// What a signature covers comes after this prefix, so that no other
/// message signed with the same key can pass for a manifest.
const SIGNING_CONTEXT: &[u8] = b"ctcache-manifest-v1\0";
/// The [`RemoteEntry`] version this build writes and reads.
pub const ENTRY_VERSION: u32 = 1;
/// Largest manifest read: a record with a type tree, never near this.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// Why a manifest was not accepted. Each is a miss with this name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The manifest or its entry does not decode, or a field is out of range.
    #[error("the manifest is malformed: {0}")]
    Malformed(String),
    /// The manifest carries no signature.
    #[error("the manifest is unsigned")]
    Unsigned,
    /// The signing key is not among the trusted keys.
    #[error("the manifest is signed by {name:?}, which is not a trusted key")]
    UntrustedKey {
        /// The key name the manifest gives.
        name: String,
    },
    /// The signature does not verify over the manifest's bytes.
    #[error("the signature of {name:?} does not match the manifest")]
    BadSignature {
        /// The name of the trusted key that was checked.
        name: String,
    },
    /// The manifest describes another entry than the one requested (the text is its key).
    #[error("the manifest describes another entry ({0})")]
    OtherEntry(String),
    /// The payload is larger than the limit the reader gave (`max_object_bytes`).
    #[error("the payload has {len} bytes, over the limit of {max}")]
    TooLarge {
        /// The payload length the manifest names, bytes.
        len: u64,
        /// The configured limit, bytes.
        max: u64,
    },
}

impl Rejected {
    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Rejected::Malformed(_) => "malformed",
            Rejected::Unsigned => "unsigned",
            Rejected::UntrustedKey { .. } => "untrusted_key",
            Rejected::BadSignature { .. } => "bad_signature",
            Rejected::OtherEntry(_) => "other_entry",
            Rejected::TooLarge { .. } => "too_large",
        }
    }
}

/// The keys whose manifests this host accepts.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    keys: Vec<PublicKey>,
}

impl Trust {
    /// Trusts exactly `keys`.
    pub fn new(keys: Vec<PublicKey>) -> Trust {
        Trust { keys }
    }

    fn find(&self, key: &[u8]) -> Option<&PublicKey> {
        self.keys.iter().find(|k| k.key.as_bytes() == key)
    }

    /// The keys of this and `other`.
    pub fn and(&self, other: &Trust) -> Trust {
        let mut keys = self.keys.clone();
        keys.extend(other.keys.iter().cloned());
        Trust { keys }
    }

    /// The trusted keys' labels.
    pub fn names(&self) -> Vec<String> {
        self.keys.iter().map(|k| k.name.clone()).collect()
    }

    /// Whether no key is trusted (then no manifest can be accepted).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// The remote record of a stored entry; fails when the entry's physical
/// type does not decode.
pub fn describe(
    e: &Entry,
    params: &BTreeMap<String, String>,
    producer_version: &str,
) -> Result<RemoteEntry, StoreError> {
    let physical_type = e.physical_type()?;
    Ok(RemoteEntry {
        version: ENTRY_VERSION,
        digest_algorithm: e.key.source.algorithm.name().to_string(),
        source_digest: Bytes::copy_from_slice(&e.key.source.bytes),
        device: Some(e.device.clone()),
        physical_type: Some(physical_type.into()),
        dims: e.dims.clone(),
        payload_len: e.payload.len,
        payload_blake3: Bytes::copy_from_slice(&e.payload.blake3),
        packer_id: e.producer.packer_id.clone(),
        packer_version: e.producer.packer_version.clone(),
        producer_version: producer_version.to_string(),
        created_unix_ms: i64::try_from(e.created_ms).unwrap_or(i64::MAX),
        pack_duration_us: u64::try_from(e.pack_duration.as_micros()).unwrap_or(u64::MAX),
        packer_params: params.clone().into_iter().collect(),
    })
}

fn signed_message(entry: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(SIGNING_CONTEXT.len() + entry.len());
    m.extend_from_slice(SIGNING_CONTEXT);
    m.extend_from_slice(entry);
    m
}

/// The manifest object of `entry`: signed when `key` is given.
pub fn seal(entry: &RemoteEntry, key: Option<&SecretKey>) -> Vec<u8> {
    let body = entry.encode_to_vec();
    let signature = key.map(|k| ManifestSignature {
        key_name: k.name.clone(),
        public_key: Bytes::copy_from_slice(k.public().key.as_bytes()),
        signature: Bytes::copy_from_slice(&k.sign(&signed_message(&body))),
    });
    RemoteManifest {
        entry: body.into(),
        signature,
    }
    .encode_to_vec()
}

/// A manifest that passed every check.
#[derive(Debug, Clone)]
pub struct Accepted {
    /// The decoded record of the entry.
    pub entry: RemoteEntry,
    /// The payload's length and blake3, which the fetched bytes must match.
    pub payload: PayloadInfo,
    /// The name of the key that signed it.
    pub signer: String,
}

/// Checks a manifest read for `expected`: a trusted key signed exactly its
/// entry bytes, the record is well formed, derives `expected`, and its
/// payload is at most `max_payload` bytes.
pub fn open(
    bytes: &[u8],
    trust: &Trust,
    expected: &EntryKey,
    max_payload: u64,
) -> Result<Accepted, Rejected> {
    let malformed = |d: String| Rejected::Malformed(d);
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(malformed(format!("{} bytes", bytes.len())));
    }
    let m = RemoteManifest::decode(bytes).map_err(|e| malformed(e.to_string()))?;
    let sig = m.signature.ok_or(Rejected::Unsigned)?;
    let signer = trust
        .find(&sig.public_key)
        .ok_or_else(|| Rejected::UntrustedKey {
            name: sig.key_name.clone(),
        })?;
    let bad_sig = || Rejected::BadSignature {
        name: signer.name.clone(),
    };
    let signature: [u8; 64] = sig.signature.as_ref().try_into().map_err(|_| bad_sig())?;
    VerifyingKey::verify_strict(
        &signer.key,
        &signed_message(&m.entry),
        &Signature::from_bytes(&signature),
    )
    .map_err(|_| bad_sig())?;
    let entry = RemoteEntry::decode(m.entry.as_ref()).map_err(|e| malformed(e.to_string()))?;
    let payload = check_entry(&entry, expected, max_payload)?;
    Ok(Accepted {
        entry,
        payload,
        signer: signer.name.clone(),
    })
}

fn bytes32(b: &[u8], what: &str) -> Result<[u8; 32], Rejected> {
    b.try_into()
        .map_err(|_| Rejected::Malformed(format!("{what} has {} bytes, not 32", b.len())))
}

fn check_entry(e: &RemoteEntry, expected: &EntryKey, max: u64) -> Result<PayloadInfo, Rejected> {
    let malformed = |d: String| Rejected::Malformed(d);
    if e.version != ENTRY_VERSION {
        return Err(malformed(format!(
            "entry version {} (this build reads {ENTRY_VERSION})",
            e.version
        )));
    }
    let key = entry_key(e)?;
    if key != *expected {
        return Err(Rejected::OtherEntry(key.to_string()));
    }
    if e.payload_len > max {
        return Err(Rejected::TooLarge {
            len: e.payload_len,
            max,
        });
    }
    // The key names the type, not the length: a record whose length is not
    // the type's size for its dims would be a hit of the wrong size.
    let layout = check_value(&physical_type(e)?, &e.dims, &[], &Limits::default())
        .map_err(|err| malformed(format!("physical type with dims {:?}: {err}", e.dims)))?;
    if layout.byte_len != e.payload_len {
        return Err(malformed(format!(
            "payload_len {} is not the type's size {} for dims {:?}",
            e.payload_len, layout.byte_len, e.dims
        )));
    }
    Ok(PayloadInfo {
        blake3: bytes32(&e.payload_blake3, "payload_blake3")?,
        len: e.payload_len,
    })
}

/// The store key a remote record derives (as `put` would derive it).
fn entry_key(e: &RemoteEntry) -> Result<EntryKey, Rejected> {
    let malformed = |d: String| Rejected::Malformed(d);
    let algorithm: Algorithm = e
        .digest_algorithm
        .parse()
        .map_err(|_| malformed(format!("digest algorithm {:?}", e.digest_algorithm)))?;
    let source = SourceDigest {
        algorithm,
        bytes: bytes32(&e.source_digest, "source_digest")?,
    };
    let device = e
        .device
        .as_ref()
        .ok_or_else(|| malformed("no device".into()))?;
    EntryKey::derive(source, device, &physical_type(e)?)
        .map_err(|e| malformed(format!("physical type: {e}")))
}

fn physical_type(e: &RemoteEntry) -> Result<pb::StructTypeProto, Rejected> {
    e.physical_type
        .as_ref()
        .ok_or_else(|| Rejected::Malformed("no physical type".into()))?
        .decode()
        .map_err(|e| Rejected::Malformed(format!("physical type: {e}")))
}

/// What `put` needs to store an accepted entry fetched for the local
/// tensor of `source_shape` named `source_names` in the models at
/// `model_paths`.
pub fn new_entry(
    a: &Accepted,
    source_shape: SourceShape,
    source_names: Vec<String>,
    model_paths: Vec<String>,
) -> NewEntry {
    let e = &a.entry;
    let algorithm = e.digest_algorithm.parse().unwrap_or_default();
    let mut bytes = [0u8; 32];
    // Lengths were checked by `open`.
    bytes.copy_from_slice(&e.source_digest[..32.min(e.source_digest.len())]);
    NewEntry {
        source: SourceDigest { algorithm, bytes },
        source_shape,
        device: e.device.clone().unwrap_or_default(),
        physical_type: e
            .physical_type
            .as_ref()
            .and_then(|t| t.decode().ok())
            .unwrap_or_default(),
        dims: e.dims.clone(),
        producer: Producer {
            packer_id: e.packer_id.clone(),
            packer_version: e.packer_version.clone(),
            client_uid: None,
            ..Default::default()
        },
        source_names,
        model_paths,
        pack_duration: std::time::Duration::from_micros(e.pack_duration_us),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctcache::pb::struct_type_proto::{self as st, Kind};

    fn record() -> RemoteEntry {
        let device = pb::DeviceProto {
            r#type: "cpu".into(),
            architecture: "x86_64-avx2".into(),
            ..Default::default()
        };
        // UINT8[a][b]: 10 bytes for dims [2, 5].
        let byte = pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: 2,
                shape: None,
            })),
            denotation: String::new(),
        };
        let array = |elem: pb::TypeProto, dim: u32| st::Array {
            element_type: Some(Box::new(elem)),
            count: Some(st::array::Count::DimsIndex(dim)),
        };
        let row = pb::TypeProto {
            value: Some(pb::type_proto::Value::StructType(Box::new(
                pb::StructTypeProto {
                    kind: Some(Kind::Array(Box::new(array(byte, 1)))),
                    ..Default::default()
                },
            ))),
            denotation: String::new(),
        };
        let ty = pb::StructTypeProto {
            name: "t.fmt".into(),
            metadata_props: vec![pb::StringStringEntryProto {
                key: "ctcache.format_version".into(),
                value: "1".into(),
            }],
            dims_param: vec!["a".into(), "b".into()],
            kind: Some(Kind::Array(Box::new(array(row, 0)))),
            ..Default::default()
        };
        RemoteEntry {
            version: ENTRY_VERSION,
            digest_algorithm: "blake3".into(),
            source_digest: Bytes::from(vec![5u8; 32]),
            device: Some(device),
            physical_type: Some(ty.into()),
            dims: vec![2, 5],
            payload_len: 10,
            payload_blake3: Bytes::copy_from_slice(blake3::hash(b"0123456789").as_bytes()),
            packer_id: "t.fmt".into(),
            ..Default::default()
        }
    }

    fn key_of(e: &RemoteEntry) -> EntryKey {
        entry_key(e).unwrap()
    }

    fn setup() -> (SecretKey, Trust, RemoteEntry, EntryKey) {
        let k = SecretKey::generate("a").unwrap();
        let trust = Trust::new(vec![k.public()]);
        let e = record();
        let key = key_of(&e);
        (k, trust, e, key)
    }

    #[test]
    fn a_signed_manifest_opens_with_the_trusted_key() {
        let (k, trust, e, key) = setup();
        let a = open(&seal(&e, Some(&k)), &trust, &key, 100).unwrap();
        assert_eq!(a.entry, e);
        assert_eq!(a.signer, "a");
        assert_eq!(a.payload.len, 10);
        let shape = SourceShape {
            data_type: ctcache::dtype::DataType::FLOAT,
            dims: vec![4, 4],
        };
        let n = new_entry(&a, shape, vec!["w".into()], vec![]);
        assert_eq!(
            EntryKey::derive(n.source, &n.device, &n.physical_type).unwrap(),
            key
        );
    }

    #[test]
    fn unsigned_manifests_are_rejected() {
        let (_, trust, e, key) = setup();
        assert_eq!(
            open(&seal(&e, None), &trust, &key, 100).unwrap_err(),
            Rejected::Unsigned
        );
    }

    #[test]
    fn another_key_is_not_trusted() {
        let (_, trust, e, key) = setup();
        let other = SecretKey::generate("b").unwrap();
        let err = open(&seal(&e, Some(&other)), &trust, &key, 100).unwrap_err();
        assert_eq!(err, Rejected::UntrustedKey { name: "b".into() });
    }

    #[test]
    fn a_tampered_entry_fails_the_signature() {
        let (k, trust, e, key) = setup();
        let mut m = RemoteManifest::decode(seal(&e, Some(&k)).as_slice()).unwrap();
        let mut changed = e.clone();
        changed.payload_blake3 = Bytes::from(vec![0u8; 32]);
        m.entry = changed.encode_to_vec().into();
        let err = open(&m.encode_to_vec(), &trust, &key, 100).unwrap_err();
        assert_eq!(err, Rejected::BadSignature { name: "a".into() });
        // A flipped signature bit, and a truncated signature, fail too.
        let mut m = RemoteManifest::decode(seal(&e, Some(&k)).as_slice()).unwrap();
        let s = m.signature.as_mut().unwrap();
        let mut sig = s.signature.to_vec();
        sig[0] ^= 1;
        s.signature = sig.into();
        assert!(matches!(
            open(&m.encode_to_vec(), &trust, &key, 100),
            Err(Rejected::BadSignature { .. })
        ));
        m.signature.as_mut().unwrap().signature = Bytes::from(vec![1u8; 10]);
        assert!(matches!(
            open(&m.encode_to_vec(), &trust, &key, 100),
            Err(Rejected::BadSignature { .. })
        ));
    }

    #[test]
    fn a_signed_manifest_of_another_entry_is_rejected() {
        let (k, trust, e, _) = setup();
        let mut other = e.clone();
        other.dims = vec![9];
        other.source_digest = Bytes::from(vec![6u8; 32]);
        let asked = key_of(&other);
        assert!(matches!(
            open(&seal(&e, Some(&k)), &trust, &asked, 100),
            Err(Rejected::OtherEntry(_))
        ));
    }

    #[test]
    fn limits_and_garbage() {
        let (k, trust, e, key) = setup();
        assert_eq!(
            open(&seal(&e, Some(&k)), &trust, &key, 9).unwrap_err(),
            Rejected::TooLarge { len: 10, max: 9 }
        );
        assert!(matches!(
            open(b"\xff\xff\xff", &trust, &key, 100),
            Err(Rejected::Malformed(_))
        ));
        let mut future = e.clone();
        future.version = ENTRY_VERSION + 1;
        assert!(matches!(
            open(&seal(&future, Some(&k)), &trust, &key, 100),
            Err(Rejected::Malformed(_))
        ));
        let mut short = e.clone();
        short.payload_blake3 = Bytes::from(vec![1u8; 31]);
        assert!(matches!(
            open(&seal(&short, Some(&k)), &trust, &key, 100),
            Err(Rejected::Malformed(_))
        ));
    }

    /// A trusted signer's record of the right key whose length is not the
    /// type's size for its dims (the key names the type, not the dims or
    /// the length): a hit of the wrong size if it were stored.
    #[test]
    fn a_length_other_than_the_types_size_is_rejected() {
        let (k, trust, e, key) = setup();
        for (dims, len) in [(vec![2, 5], 9), (vec![2, 5], 11), (vec![3, 5], 10)] {
            let mut wrong = e.clone();
            wrong.dims = dims.clone();
            wrong.payload_len = len;
            assert_eq!(key_of(&wrong), key, "dims are not in the key");
            let err = open(&seal(&wrong, Some(&k)), &trust, &key, 100).unwrap_err();
            assert!(
                matches!(&err, Rejected::Malformed(m) if m.contains("not the type's size")),
                "{dims:?} {len}: {err}"
            );
        }
        let mut no_dims = e.clone();
        no_dims.dims = vec![10];
        assert!(matches!(
            open(&seal(&no_dims, Some(&k)), &trust, &key, 100),
            Err(Rejected::Malformed(_))
        ));
    }
}
