//! The server side of the API, and the two answers it sends differently
//! from the client's types: `LookupResponse` and `BatchLookupResponse`
//! carry each entry as the bytes of its `Entry` message, encoded once.
//!
//! On the wire a repeated message field and a repeated bytes field with the
//! same number are the same bytes (key, length, body), so clients decode
//! these answers as the messages the proto declares. What it buys: the
//! daemon keeps an entry's encoding beside the entry it caches and answers
//! a hit with a copy of those bytes instead of building the message's
//! strings, encoding them and dropping them again (most of a BatchLookup's
//! time before).

use prost::bytes::Bytes;
use prost::Message;

use crate::v1;

#[allow(clippy::all, missing_docs)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/served/ctcache.v1.rs"));
}

pub use generated::compiled_tensor_cache_server;

/// `ctcache.v1.LookupResponse`, entries encoded.
#[derive(Clone, PartialEq, Message)]
pub struct LookupResponse {
    /// `Entry` messages, encoded (see [`encode_entry`]), best first.
    #[prost(bytes = "bytes", repeated, tag = "1")]
    pub entries: Vec<Bytes>,
    /// Set when `entries` is empty.
    #[prost(message, optional, tag = "2")]
    pub miss: Option<v1::Miss>,
}

/// `ctcache.v1.BatchLookupResponse` of [`LookupResponse`]s.
#[derive(Clone, PartialEq, Message)]
pub struct BatchLookupResponse {
    /// One answer per request, in order.
    #[prost(message, repeated, tag = "1")]
    pub responses: Vec<LookupResponse>,
}

/// An entry as [`LookupResponse::entries`] holds it.
pub fn encode_entry(e: &v1::Entry) -> Bytes {
    e.encode_to_vec().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str, struct_type: &[u8]) -> v1::Entry {
        v1::Entry {
            key: key.into(),
            physical_type: "blocked_q4".into(),
            struct_type: Some(crate::StructType::from_encoded(Bytes::copy_from_slice(
                struct_type,
            ))),
            dims: vec![3, 0, 7],
            device: Some(ctcache_format::pb::DeviceProto {
                r#type: "cpu".into(),
                ..Default::default()
            }),
            payload_len: 12,
            ..Default::default()
        }
    }

    /// The served answers are, byte for byte, the declared messages.
    #[test]
    fn same_bytes_as_the_declared_messages() {
        // A struct type with a name (field 1); the empty entry encodes to
        // no bytes at all, which must still count as one entry.
        let entries = vec![
            entry("a", b"\x0a\x02q4"),
            v1::Entry::default(),
            entry("b", b""),
        ];
        let miss = v1::Miss {
            reason: "no_entry".into(),
            detail: "none".into(),
        };
        let declared = v1::BatchLookupResponse {
            responses: vec![
                v1::LookupResponse {
                    entries: entries.clone(),
                    miss: None,
                },
                v1::LookupResponse {
                    entries: vec![],
                    miss: Some(miss.clone()),
                },
            ],
        };
        let served = BatchLookupResponse {
            responses: vec![
                LookupResponse {
                    entries: entries.iter().map(encode_entry).collect(),
                    miss: None,
                },
                LookupResponse {
                    entries: vec![],
                    miss: Some(miss),
                },
            ],
        };
        let bytes = served.encode_to_vec();
        assert_eq!(bytes, declared.encode_to_vec());
        assert_eq!(
            v1::BatchLookupResponse::decode(&bytes[..]).unwrap(),
            declared
        );
        assert_eq!(
            served.responses[0].encoded_len(),
            declared.responses[0].encoded_len()
        );
    }
}
