//! Entry keys (D7): (digest algorithm + source digest, device key, physical
//! type key), laid out as `alg || digest || device || type` so that all
//! entries of one source digest are one contiguous prefix of the index.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use crate::digest::{Algorithm, SourceDigest};
use crate::structs::PhysicalTypeKey;

/// An entry key (bytes or text) that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid entry key {text:?}: {detail}")]
pub struct InvalidKey {
    /// The text given (hex for bytes).
    pub text: String,
    /// What is wrong with it.
    pub detail: String,
}

/// Bytes of an encoded key: 1 algorithm byte and three 32-byte hashes.
pub const KEY_LEN: usize = 1 + 32 * 3;
/// Bytes of the prefix naming one source digest.
pub(crate) const SOURCE_PREFIX_LEN: usize = 33;

pub(crate) type KeyBytes = [u8; KEY_LEN];

/// The identity of one cache entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryKey {
    /// Digest of the source tensor (D3).
    pub source: SourceDigest,
    /// [`crate::device::device_key`] of the device the payload needs.
    pub device: [u8; 32],
    /// Hash of the canonical physical type (D4).
    pub physical_type: PhysicalTypeKey,
}

fn algorithm_code(a: Algorithm) -> u8 {
    // Stable on-disk codes: never renumber, only append.
    match a {
        Algorithm::Blake3 => 1,
        Algorithm::Sha256 => 2,
    }
}

fn algorithm_from_code(c: u8) -> Option<Algorithm> {
    match c {
        1 => Some(Algorithm::Blake3),
        2 => Some(Algorithm::Sha256),
        _ => None,
    }
}

/// The index prefix of every entry of `source`.
pub(crate) fn source_prefix(source: &SourceDigest) -> [u8; SOURCE_PREFIX_LEN] {
    let mut p = [0u8; SOURCE_PREFIX_LEN];
    p[0] = algorithm_code(source.algorithm);
    p[1..].copy_from_slice(&source.bytes);
    p
}

impl EntryKey {
    /// The key under which `put` stores a payload of `physical_type` for
    /// `device` compiled from `source` (the same derivation `put` uses).
    pub fn derive(
        source: SourceDigest,
        device: &crate::pb::DeviceProto,
        physical_type: &crate::pb::StructTypeProto,
    ) -> Result<EntryKey, crate::structs::StructError> {
        Ok(EntryKey {
            source,
            device: crate::device::device_key(device),
            physical_type: crate::structs::physical_type_key(
                physical_type,
                &[],
                &Default::default(),
            )?,
        })
    }

    /// The fixed-length index key: source prefix, device key, type key.
    pub fn to_bytes(&self) -> KeyBytes {
        let mut k = [0u8; KEY_LEN];
        k[..SOURCE_PREFIX_LEN].copy_from_slice(&source_prefix(&self.source));
        k[33..65].copy_from_slice(&self.device);
        k[65..].copy_from_slice(&self.physical_type.0);
        k
    }

    /// Parses an index key written by [`EntryKey::to_bytes`]; malformed
    /// bytes are an error, not a panic.
    pub fn from_bytes(b: &[u8]) -> Result<EntryKey, InvalidKey> {
        let bad = |detail: &str| InvalidKey {
            text: hex::encode(b),
            detail: detail.to_string(),
        };
        if b.len() != KEY_LEN {
            return Err(bad("wrong length"));
        }
        let algorithm = algorithm_from_code(b[0]).ok_or_else(|| bad("unknown algorithm code"))?;
        let mut k = EntryKey {
            source: SourceDigest {
                algorithm,
                bytes: [0; 32],
            },
            device: [0; 32],
            physical_type: PhysicalTypeKey([0; 32]),
        };
        k.source.bytes.copy_from_slice(&b[1..33]);
        k.device.copy_from_slice(&b[33..65]);
        k.physical_type.0.copy_from_slice(&b[65..]);
        Ok(k)
    }
}

impl PartialOrd for EntryKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Index order (the byte order of the encoded keys).
impl Ord for EntryKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.to_bytes().cmp(&other.to_bytes())
    }
}

/// `blake3:<source hex>/<device key hex>/<type key hex>`.
impl fmt::Display for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}",
            self.source,
            hex::encode(self.device),
            self.physical_type
        )
    }
}

fn hex32(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

impl FromStr for EntryKey {
    type Err = InvalidKey;
    fn from_str(s: &str) -> Result<Self, InvalidKey> {
        let bad = |detail: &str| InvalidKey {
            text: s.to_string(),
            detail: detail.to_string(),
        };
        let (alg, rest) = s
            .split_once(':')
            .ok_or_else(|| bad("expected <algorithm>:<digest>/<device>/<type>"))?;
        let algorithm: Algorithm = alg.parse().map_err(|_| bad("unknown algorithm"))?;
        let parts: Vec<&str> = rest.split('/').collect();
        let [digest, device, ty] = parts[..] else {
            return Err(bad("expected <algorithm>:<digest>/<device>/<type>"));
        };
        Ok(EntryKey {
            source: SourceDigest {
                algorithm,
                bytes: hex32(digest).ok_or_else(|| bad("digest is not 64 hex digits"))?,
            },
            device: hex32(device).ok_or_else(|| bad("device key is not 64 hex digits"))?,
            physical_type: PhysicalTypeKey(
                hex32(ty).ok_or_else(|| bad("type key is not 64 hex digits"))?,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> EntryKey {
        EntryKey {
            source: SourceDigest {
                algorithm: Algorithm::Sha256,
                bytes: [7; 32],
            },
            device: [8; 32],
            physical_type: PhysicalTypeKey([9; 32]),
        }
    }

    #[test]
    fn bytes_round_trip_and_prefix() {
        let k = key();
        let b = k.to_bytes();
        assert_eq!(b[0], 2);
        assert_eq!(&b[..SOURCE_PREFIX_LEN], &source_prefix(&k.source));
        assert_eq!(EntryKey::from_bytes(&b).unwrap(), k);
        assert!(EntryKey::from_bytes(&b[1..]).is_err());
        let mut bad = b;
        bad[0] = 99;
        assert!(EntryKey::from_bytes(&bad).is_err());
    }

    #[test]
    fn text_round_trip() {
        let k = key();
        let s = k.to_string();
        assert!(s.starts_with("sha256:0707"));
        assert_eq!(s.parse::<EntryKey>().unwrap(), k);
        assert!("md5:00/00/00".parse::<EntryKey>().is_err());
        assert!("blake3:00".parse::<EntryKey>().is_err());
    }
}
