//! `onnx.StructTypeProto` as the API messages carry it: its encoding, on
//! the wire exactly as the message, decoded only when someone asks.
//!
//! A struct type (with its ONNX decoder and encoder functions) is most of a
//! full entry's bytes, and the store already holds it encoded. Decoding it
//! for every entry the daemon answers, only to encode it again, and the
//! client decoding it whether it reads it or not, cost more than the rest
//! of a lookup together. Receiving copies the fields' bytes as they come
//! (no recursion, bounded by the message size limit); [`StructType::decode`]
//! is where a malformed type is refused.

use std::fmt;

use ctcache_format::pb;
use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::encoding::{
    bytes, check_wire_type, decode_varint, encode_key, encode_varint, fixed32, fixed64,
    DecodeContext, WireType,
};
use prost::{DecodeError, Message};

/// An `onnx.StructTypeProto`, held encoded.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct StructType {
    encoded: Bytes,
}

impl StructType {
    /// A struct type from its encoding (as `Message::encode` wrote it); it
    /// is checked when decoded.
    pub fn from_encoded(encoded: Bytes) -> StructType {
        StructType { encoded }
    }

    /// The encoding as received or given.
    pub fn encoded(&self) -> &Bytes {
        &self.encoded
    }

    /// The message; an error when the bytes are not a `StructTypeProto`.
    pub fn decode(&self) -> Result<pb::StructTypeProto, DecodeError> {
        pb::StructTypeProto::decode(self.encoded.clone())
    }
}

impl From<&pb::StructTypeProto> for StructType {
    fn from(t: &pb::StructTypeProto) -> StructType {
        StructType::from_encoded(t.encode_to_vec().into())
    }
}

impl From<pb::StructTypeProto> for StructType {
    fn from(t: pb::StructTypeProto) -> StructType {
        StructType::from(&t)
    }
}

impl fmt::Debug for StructType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.decode() {
            Ok(t) => t.fmt(f),
            Err(e) => write!(
                f,
                "StructType(undecodable, {} bytes: {e})",
                self.encoded.len()
            ),
        }
    }
}

impl Message for StructType {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.encoded);
    }

    /// Appends the field as it came: key, then the value's bytes. Repeated
    /// occurrences of the message merge the way decoding them would.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let mut out = BytesMut::from(std::mem::take(&mut self.encoded));
        encode_key(tag, wire_type, &mut out);
        // prost's own readers: bounds-checked, their errors.
        match wire_type {
            WireType::Varint => encode_varint(decode_varint(buf)?, &mut out),
            WireType::SixtyFourBit => {
                let mut v = 0u64;
                fixed64::merge(wire_type, &mut v, buf, ctx)?;
                out.put_u64_le(v);
            }
            WireType::ThirtyTwoBit => {
                let mut v = 0u32;
                fixed32::merge(wire_type, &mut v, buf, ctx)?;
                out.put_u32_le(v);
            }
            WireType::LengthDelimited => {
                let mut v = Bytes::new();
                bytes::merge(wire_type, &mut v, buf, ctx)?;
                encode_varint(v.len() as u64, &mut out);
                out.put(v);
            }
            // A StructTypeProto has no groups (a deprecated wire type):
            // refused as the wrong wire type.
            WireType::StartGroup | WireType::EndGroup => {
                check_wire_type(WireType::LengthDelimited, wire_type)?
            }
        }
        self.encoded = out.freeze();
        Ok(())
    }

    fn encoded_len(&self) -> usize {
        self.encoded.len()
    }

    fn clear(&mut self) {
        self.encoded = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> pb::StructTypeProto {
        pb::StructTypeProto {
            name: "t.fmt".into(),
            doc_string: "a type".into(),
            metadata_props: vec![pb::StringStringEntryProto {
                key: "ctcache.format_version".into(),
                value: "1".into(),
            }],
            decoder: Some(pb::FunctionProto {
                name: "decode".into(),
                node: vec![pb::NodeProto {
                    op_type: "Identity".into(),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            kind: Some(pb::struct_type_proto::Kind::TypeIndex(-3)),
            ..Default::default()
        }
    }

    /// A carrier with the field where the API messages have it.
    #[derive(Clone, PartialEq, Message)]
    struct Carrier {
        #[prost(message, optional, tag = "7")]
        ty: Option<StructType>,
        #[prost(string, tag = "8")]
        after: String,
    }

    /// The same carrier with the message type, as other clients see it.
    #[derive(Clone, PartialEq, Message)]
    struct Plain {
        #[prost(message, optional, tag = "7")]
        ty: Option<pb::StructTypeProto>,
        #[prost(string, tag = "8")]
        after: String,
    }

    #[test]
    fn the_wire_is_the_message_s_both_ways() {
        let plain = Plain {
            ty: Some(sample()),
            after: "next".into(),
        };
        let carried = Carrier {
            ty: Some(StructType::from(sample())),
            after: "next".into(),
        };
        assert_eq!(carried.encode_to_vec(), plain.encode_to_vec());
        assert_eq!(carried.encoded_len(), plain.encoded_len());
        let back = Carrier::decode(plain.encode_to_vec().as_slice()).unwrap();
        assert_eq!(back.after, "next");
        assert_eq!(back.ty.as_ref().unwrap().decode().unwrap(), sample());
        assert_eq!(back, carried);
    }

    #[test]
    fn repeated_occurrences_merge_like_the_message() {
        let a = Plain {
            ty: Some(pb::StructTypeProto {
                name: "first".into(),
                ..Default::default()
            }),
            after: String::new(),
        };
        let b = Plain {
            ty: Some(pb::StructTypeProto {
                doc_string: "second".into(),
                ..Default::default()
            }),
            after: String::new(),
        };
        let mut wire = a.encode_to_vec();
        wire.extend(b.encode_to_vec());
        let want = Plain::decode(wire.as_slice()).unwrap().ty.unwrap();
        let got = Carrier::decode(wire.as_slice()).unwrap().ty.unwrap();
        assert_eq!(got.decode().unwrap(), want);
    }

    #[test]
    fn malformed_bytes_are_refused_when_read_never_panic() {
        // A field claiming more bytes than the message has.
        let mut wire = Vec::new();
        encode_key(7, WireType::LengthDelimited, &mut wire);
        encode_varint(4, &mut wire);
        encode_key(8, WireType::LengthDelimited, &mut wire);
        encode_varint(100, &mut wire);
        wire.extend_from_slice(b"ab");
        assert!(Carrier::decode(wire.as_slice()).is_err());
        // Well-framed fields that are no StructTypeProto: received, refused
        // on decode (field 1 is a message, here a varint).
        let junk = Carrier {
            ty: Some(StructType::from_encoded(Bytes::from_static(&[0x08, 0x01]))),
            after: String::new(),
        };
        let back = Carrier::decode(junk.encode_to_vec().as_slice()).unwrap();
        assert!(back.ty.unwrap().decode().is_err());
        // Groups are refused at once.
        let mut wire = Vec::new();
        encode_key(7, WireType::LengthDelimited, &mut wire);
        encode_varint(1, &mut wire);
        encode_key(1, WireType::StartGroup, &mut wire);
        assert!(Carrier::decode(wire.as_slice()).is_err());
    }
}
