//! The physical type key (D4): the resolved concrete type with references
//! inlined and doc strings cleared, encoded deterministically, hashed.

use std::fmt;

use prost::Message;

use super::{Limits, StructError};
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
///
/// Inlining expands shared references into a tree, which can be far larger
/// than the table it comes from (a few types of many fields that all point
/// at the next one), so the expansion counts what it builds (kinds, fields,
/// packed components) against `limits.max_nodes`, as well as its depth.
pub fn canonical_type(
    root: &pb::StructTypeProto,
    table: &[pb::StructTypeProto],
    limits: &Limits,
) -> Result<pb::StructTypeProto, StructError> {
    let mut t = root.clone();
    t.doc_string.clear();
    clear_function_docs(t.decoder.as_mut());
    clear_function_docs(t.encoder.as_mut());
    if let Some(kind) = t.kind.as_mut() {
        let mut inliner = Inliner {
            table,
            limits,
            nodes: 0,
        };
        inliner.kind(kind, 0)?;
    }
    Ok(t)
}

/// Computes the key of a concrete root type.
pub fn physical_type_key(
    root: &pb::StructTypeProto,
    table: &[pb::StructTypeProto],
    limits: &Limits,
) -> Result<PhysicalTypeKey, StructError> {
    let t = canonical_type(root, table, limits)?;
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

/// Replaces references by what they name, within the limits' budget.
struct Inliner<'a> {
    table: &'a [pb::StructTypeProto],
    limits: &'a Limits,
    /// Kinds, fields and packed components of the expansion so far.
    nodes: u64,
}

impl Inliner<'_> {
    fn count(&mut self, n: usize) -> Result<(), StructError> {
        self.nodes = self.nodes.saturating_add(n as u64);
        if self.nodes > self.limits.max_nodes {
            return Err(StructError::new(
                "struct.limits",
                "value",
                format!(
                    "the type with references inlined exceeds {} nodes",
                    self.limits.max_nodes
                ),
            ));
        }
        Ok(())
    }

    fn kind(&mut self, kind: &mut Kind, depth: u32) -> Result<(), StructError> {
        if depth > self.limits.max_depth {
            return Err(StructError::new(
                "struct.depth",
                "value",
                "nesting too deep",
            ));
        }
        self.count(1)?;
        if let Kind::TypeIndex(i) = *kind {
            let target = usize::try_from(i)
                .ok()
                .and_then(|u| self.table.get(u))
                .and_then(|t| t.kind.as_ref())
                .ok_or_else(|| {
                    StructError::new(
                        "struct.reference",
                        "value",
                        format!("type_index {i} unresolved"),
                    )
                })?;
            // Each copy is charged as the walk below visits it, so copies
            // stop once the budget is spent.
            *kind = target.clone();
            return self.kind(kind, depth + 1);
        }
        match kind {
            Kind::Array(a) => {
                if let Some(tp) = a.element_type.as_mut() {
                    self.type_proto(tp, depth + 1)?;
                }
            }
            Kind::Structure(s) => {
                self.count(s.field.len())?;
                for f in &mut s.field {
                    f.doc_string.clear();
                    if let Some(st::field::Content::Type(tp)) = f.content.as_mut() {
                        self.type_proto(tp, depth + 1)?;
                    }
                }
            }
            Kind::PackedArray(p) => self.count(p.component.len())?,
            Kind::TypeIndex(_) => {}
        }
        Ok(())
    }

    fn type_proto(&mut self, tp: &mut pb::TypeProto, depth: u32) -> Result<(), StructError> {
        if let Some(TypeValue::StructType(s)) = tp.value.as_mut() {
            s.doc_string.clear();
            if let Some(kind) = s.kind.as_mut() {
                self.kind(kind, depth + 1)?;
            }
        }
        Ok(())
    }
}
