//! Builders for the output `StructTypeProto`s (docs/FORMAT.md, Structured types; D4): scalar
//! leaves, nested arrays with fixed or `dims_index` counts, named fields and
//! the named, versioned root.

use bytes::Bytes;
use ctcache::dtype::DataType;
use ctcache::pb;
use ctcache::pb::struct_type_proto::{self as st, array, field, Kind};
use ctcache::pb::type_proto::{Tensor, Value};

/// Metadata key holding the integer format version (D4).
pub const FORMAT_VERSION_KEY: &str = "ctcache.format_version";
/// Metadata key holding the packer id (D4).
pub const PACKER_KEY: &str = "ctcache.packer";

/// An array count: fixed, or `StructProto.dims[i]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// A count fixed by the format (e.g. the block size).
    Fixed(u64),
    /// The count is `StructProto.dims[i]`, set per payload.
    Dim(u32),
}

/// A scalar leaf of element type `dt`.
pub fn leaf(dt: DataType) -> pb::TypeProto {
    pb::TypeProto {
        denotation: String::new(),
        value: Some(Value::TensorType(Tensor {
            elem_type: dt.code(),
            shape: None,
        })),
    }
}

/// `count` consecutive `elem`s.
pub fn array(elem: pb::TypeProto, count: Count) -> pb::TypeProto {
    let count = Some(match count {
        Count::Fixed(n) => array::Count::Dimension(n),
        Count::Dim(i) => array::Count::DimsIndex(i),
    });
    let kind = Kind::Array(Box::new(st::Array {
        element_type: Some(Box::new(elem)),
        count,
    }));
    pb::TypeProto {
        denotation: String::new(),
        value: Some(Value::StructType(Box::new(pb::StructTypeProto {
            kind: Some(kind),
            ..Default::default()
        }))),
    }
}

/// A row-major multi-dimensional array of `elem`: `counts[0]` is the
/// outermost (slowest) axis. No counts gives `elem` itself.
pub fn nested(elem: pb::TypeProto, counts: &[Count]) -> pb::TypeProto {
    counts.iter().rev().fold(elem, |t, &c| array(t, c))
}

/// An inline (static, unnamed) structure, usable as an array element.
pub fn structure(fields: Vec<st::Field>) -> pb::TypeProto {
    pb::TypeProto {
        denotation: String::new(),
        value: Some(Value::StructType(Box::new(pb::StructTypeProto {
            kind: Some(Kind::Structure(st::Structure { field: fields })),
            ..Default::default()
        }))),
    }
}

/// A payload field.
pub fn field(name: &str, ty: pb::TypeProto, doc: &str) -> st::Field {
    st::Field {
        name: name.to_string(),
        content: Some(field::Content::Type(ty)),
        doc_string: doc.to_string(),
    }
}

/// A constant INT64 scalar field: takes no payload bits, carries a value
/// the decoder needs (for example the unpadded source length).
pub fn const_i64(name: &str, value: i64, doc: &str) -> st::Field {
    st::Field {
        name: name.to_string(),
        content: Some(field::Content::Constant(pb::TensorProto {
            data_type: DataType::INT64.code(),
            raw_data: Bytes::copy_from_slice(&value.to_le_bytes()),
            ..Default::default()
        })),
        doc_string: doc.to_string(),
    }
}

/// The concrete root: a structure of `fields` with its name, version and
/// packer metadata and `dims_param`.
pub fn root(
    name: String,
    packer: &str,
    version: u32,
    dims_param: &[&str],
    fields: Vec<st::Field>,
    doc: &str,
) -> pb::StructTypeProto {
    pb::StructTypeProto {
        kind: Some(Kind::Structure(st::Structure { field: fields })),
        decoder: None,
        encoder: None,
        name,
        doc_string: doc.to_string(),
        metadata_props: vec![
            pb::StringStringEntryProto {
                key: FORMAT_VERSION_KEY.to_string(),
                value: version.to_string(),
            },
            pb::StringStringEntryProto {
                key: PACKER_KEY.to_string(),
                value: packer.to_string(),
            },
        ],
        dims_param: dims_param.iter().map(|s| s.to_string()).collect(),
    }
}

/// Size in bits of a concrete type under `dims` (FORMAT.md, Structured types: size
/// function, for self-checks; `None` on overflow or a malformed type).
pub fn size_bits(t: &pb::StructTypeProto, dims: &[u64]) -> Option<u64> {
    match t.kind.as_ref()? {
        Kind::Array(a) => {
            let n = match a.count? {
                array::Count::Dimension(n) => n,
                array::Count::DimsIndex(i) => *dims.get(i as usize)?,
            };
            n.checked_mul(type_bits(a.element_type.as_deref()?, dims)?)
        }
        Kind::Structure(s) => s.field.iter().try_fold(0u64, |acc, f| {
            let b = match f.content.as_ref()? {
                field::Content::Type(t) => type_bits(t, dims)?,
                field::Content::Constant(_) => 0,
            };
            acc.checked_add(b)
        }),
        Kind::PackedArray(p) => {
            let n = match p.count? {
                st::packed_array::Count::Dimension(n) => n,
                st::packed_array::Count::DimsIndex(i) => *dims.get(i as usize)?,
            };
            let w: u64 = p.component.iter().map(|c| u64::from(c.bit_width)).sum();
            n.checked_mul(w)
        }
        Kind::TypeIndex(_) => None,
    }
}

fn type_bits(t: &pb::TypeProto, dims: &[u64]) -> Option<u64> {
    match t.value.as_ref()? {
        Value::TensorType(tt) => DataType::from_i32(tt.elem_type).ok()?.bit_width(),
        Value::StructType(s) => size_bits(s, dims),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_sizes() {
        // 128 x INT4 + FLOAT scale + INT64 zero point = 76 bytes.
        let t = root(
            "t".into(),
            "p",
            1,
            &[],
            vec![
                field("q", array(leaf(DataType::INT4), Count::Fixed(128)), ""),
                field("s", leaf(DataType::FLOAT), ""),
                field("z", leaf(DataType::INT64), ""),
                const_i64("k", 7, ""),
            ],
            "",
        );
        assert_eq!(size_bits(&t, &[]), Some(76 * 8));
        // uint8[N, kb, 16] with dims [3, 5].
        let t = root(
            "t".into(),
            "p",
            1,
            &["N", "kb"],
            vec![field(
                "q",
                nested(
                    leaf(DataType::UINT8),
                    &[Count::Dim(0), Count::Dim(1), Count::Fixed(16)],
                ),
                "",
            )],
            "",
        );
        assert_eq!(size_bits(&t, &[3, 5]), Some(3 * 5 * 16 * 8));
        assert_eq!(size_bits(&t, &[3]), None);
    }
}
