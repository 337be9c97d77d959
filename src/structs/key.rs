//! The physical type key (D4): the resolved concrete type with references
//! inlined and doc strings cleared, encoded deterministically, hashed.

use std::fmt;

use prost::Message;

use super::StructError;
use crate::pb;
use crate::pb::struct_type_proto::{self as st, Kind};
use crate::pb::type_proto::Value as TypeValue;

/// blake3 of the canonical type encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysicalTypeKey(pub [u8; 32]);

impl PhysicalTypeKey {
    /// The key as lowercase hex (store keys and object names).
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for PhysicalTypeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.hex())
    }
}

/// The canonical form of a concrete root type: `type_index` references
/// replaced by the referenced kind, every doc string cleared.
pub fn canonical_type(
    root: &pb::StructTypeProto,
    table: &[pb::StructTypeProto],
    max_depth: u32,
) -> Result<pb::StructTypeProto, StructError> {
    let mut t = root.clone();
    t.doc_string.clear();
    clear_function_docs(t.decoder.as_mut());
    clear_function_docs(t.encoder.as_mut());
    if let Some(kind) = t.kind.as_mut() {
        inline_kind(kind, table, 0, max_depth)?;
    }
    Ok(t)
}

/// Computes the key of a concrete root type.
pub fn physical_type_key(
    root: &pb::StructTypeProto,
    table: &[pb::StructTypeProto],
    max_depth: u32,
) -> Result<PhysicalTypeKey, StructError> {
    let t = canonical_type(root, table, max_depth)?;
    Ok(PhysicalTypeKey(
        *blake3::hash(&t.encode_to_vec()).as_bytes(),
    ))
}

fn clear_function_docs(f: Option<&mut pb::FunctionProto>) {
    if let Some(f) = f {
        f.doc_string.clear();
        for n in &mut f.node {
            n.doc_string.clear();
        }
    }
}

fn inline_kind(
    kind: &mut Kind,
    table: &[pb::StructTypeProto],
    depth: u32,
    max_depth: u32,
) -> Result<(), StructError> {
    if depth > max_depth {
        return Err(StructError::new(
            "struct.depth",
            "value",
            "nesting too deep",
        ));
    }
    if let Kind::TypeIndex(i) = *kind {
        let target = usize::try_from(i)
            .ok()
            .and_then(|u| table.get(u))
            .and_then(|t| t.kind.clone())
            .ok_or_else(|| {
                StructError::new(
                    "struct.reference",
                    "value",
                    format!("type_index {i} unresolved"),
                )
            })?;
        *kind = target;
        return inline_kind(kind, table, depth + 1, max_depth);
    }
    match kind {
        Kind::Array(a) => {
            if let Some(tp) = a.element_type.as_mut() {
                inline_type_proto(tp, table, depth + 1, max_depth)?;
            }
        }
        Kind::Structure(s) => {
            for f in &mut s.field {
                f.doc_string.clear();
                if let Some(st::field::Content::Type(tp)) = f.content.as_mut() {
                    inline_type_proto(tp, table, depth + 1, max_depth)?;
                }
            }
        }
        Kind::PackedArray(_) | Kind::TypeIndex(_) => {}
    }
    Ok(())
}

fn inline_type_proto(
    tp: &mut pb::TypeProto,
    table: &[pb::StructTypeProto],
    depth: u32,
    max_depth: u32,
) -> Result<(), StructError> {
    if let Some(TypeValue::StructType(s)) = tp.value.as_mut() {
        s.doc_string.clear();
        if let Some(kind) = s.kind.as_mut() {
            inline_kind(kind, table, depth + 1, max_depth)?;
        }
    }
    Ok(())
}
