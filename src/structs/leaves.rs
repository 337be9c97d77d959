//! The leaf reader: every scalar leaf of a concrete type as a strided view
//! (element type, array shape, bit strides) over the payload, bounds-checked.

use super::{Limits, StructError};
use crate::dtype::DataType;
use crate::pb;
use crate::pb::struct_type_proto::{self as st, Kind};
use crate::pb::type_proto::Value as TypeValue;

/// What one leaf element is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafType {
    /// A scalar ONNX element type.
    Tensor(DataType),
    /// A packed-array component of this many bits (unsigned).
    Bits(u32),
}

/// One leaf: `path` names it by field names (`codes`, `block.scale`, ...).
/// Element `i` (row-major multi-index over `shape`) starts at bit
/// `offset_bits + sum(i_k * strides_bits[k])`.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaf {
    /// The dotted field path, e.g. `block.scale`.
    pub path: String,
    /// The element type.
    pub elem: LeafType,
    /// Elements per dimension, outermost first.
    pub shape: Vec<u64>,
    /// Bits between consecutive elements along each dimension.
    pub strides_bits: Vec<u64>,
    /// Bit offset of the first element in the payload.
    pub offset_bits: u64,
    /// Set for `constant` fields, which take no payload bits.
    pub constant: Option<pb::TensorProto>,
}

impl Leaf {
    /// Bits per element (0 for STRING).
    pub fn bit_width(&self) -> u64 {
        match &self.elem {
            LeafType::Tensor(dt) => dt.bit_width().unwrap_or(0),
            LeafType::Bits(w) => u64::from(*w),
        }
    }

    /// Number of elements (product of the shape; a zero anywhere makes it
    /// 0 before the other dims can overflow the product).
    pub fn len(&self) -> u64 {
        if self.shape.contains(&0) {
            return 0;
        }
        self.shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .unwrap_or(u64::MAX)
    }

    /// Whether the leaf has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Enumerates the leaves of a validated concrete type (see `check_value`).
pub fn leaves(
    root: &pb::StructTypeProto,
    dims: &[u64],
    table: &[pb::StructTypeProto],
    limits: &Limits,
) -> Result<Vec<Leaf>, StructError> {
    let kind = root
        .kind
        .as_ref()
        .ok_or_else(|| StructError::new("struct.unconstrained", "value", "kind unset"))?;
    let mut r = Reader {
        table,
        limits,
        dims,
        count: 0,
    };
    Ok(r.kind(kind, 0)?.1)
}

struct Reader<'a> {
    table: &'a [pb::StructTypeProto],
    limits: &'a Limits,
    dims: &'a [u64],
    count: usize,
}

fn err(msg: &str) -> StructError {
    StructError::new("struct.leaf", "value", msg)
}

fn overflow() -> StructError {
    StructError::new("struct.size_overflow", "value", "size overflows")
}

impl Reader<'_> {
    fn push(&mut self, leaves: &mut Vec<Leaf>, leaf: Leaf) -> Result<(), StructError> {
        self.count += 1;
        if self.count > self.limits.max_leaves {
            return Err(StructError::new(
                "struct.limits",
                "value",
                format!("more than {} leaves", self.limits.max_leaves),
            ));
        }
        leaves.push(leaf);
        Ok(())
    }

    fn count_of(&self, dimension: Option<u64>, index: Option<u32>) -> Result<u64, StructError> {
        match (dimension, index) {
            (Some(n), _) => Ok(n),
            (_, Some(k)) => self
                .dims
                .get(k as usize)
                .copied()
                .ok_or_else(|| err("dims_index out of range")),
            _ => Err(err("count unset")),
        }
    }

    /// Returns (size in bits, leaves at offset 0).
    fn kind(&mut self, kind: &Kind, depth: u32) -> Result<(u64, Vec<Leaf>), StructError> {
        if depth > self.limits.max_depth {
            return Err(StructError::new(
                "struct.depth",
                "value",
                "nesting too deep",
            ));
        }
        match kind {
            Kind::Array(a) => self.array(a, depth),
            Kind::PackedArray(pa) => self.packed_array(pa),
            Kind::Structure(s) => self.structure(s, depth),
            Kind::TypeIndex(i) => {
                let t = usize::try_from(*i)
                    .ok()
                    .and_then(|u| self.table.get(u))
                    .ok_or_else(|| err("type_index out of range"))?;
                let kind = t
                    .kind
                    .as_ref()
                    .ok_or_else(|| err("referenced type is unconstrained"))?;
                self.kind(kind, depth + 1)
            }
        }
    }

    /// An array: its element's leaves, each with the array's dimension
    /// in front (constants stay as they are).
    fn array(&mut self, a: &st::Array, depth: u32) -> Result<(u64, Vec<Leaf>), StructError> {
        let (dim, idx) = match a.count {
            Some(st::array::Count::Dimension(n)) => (Some(n), None),
            Some(st::array::Count::DimsIndex(k)) => (None, Some(k)),
            None => (None, None),
        };
        let count = self.count_of(dim, idx)?;
        let elem = a
            .element_type
            .as_ref()
            .ok_or_else(|| err("array without element_type"))?;
        let (esize, mut inner) = self.type_proto(elem, depth + 1)?;
        for leaf in &mut inner {
            if leaf.constant.is_none() {
                leaf.shape.insert(0, count);
                leaf.strides_bits.insert(0, esize);
            }
        }
        Ok((count.checked_mul(esize).ok_or_else(overflow)?, inner))
    }

    /// A packed array: one leaf of bits per component, strided by the
    /// packed element's width.
    fn packed_array(&mut self, pa: &st::PackedArray) -> Result<(u64, Vec<Leaf>), StructError> {
        let (dim, idx) = match pa.count {
            Some(st::packed_array::Count::Dimension(n)) => (Some(n), None),
            Some(st::packed_array::Count::DimsIndex(k)) => (None, Some(k)),
            None => (None, None),
        };
        let count = self.count_of(dim, idx)?;
        let width: u64 = pa.component.iter().map(|c| u64::from(c.bit_width)).sum();
        let mut out = Vec::new();
        let mut offset = 0;
        for (i, c) in pa.component.iter().enumerate() {
            let path = if c.name.is_empty() {
                format!("component{i}")
            } else {
                c.name.clone()
            };
            self.push(
                &mut out,
                Leaf {
                    path,
                    elem: LeafType::Bits(c.bit_width),
                    shape: vec![count],
                    strides_bits: vec![width],
                    offset_bits: offset,
                    constant: None,
                },
            )?;
            offset += u64::from(c.bit_width);
        }
        Ok((count.checked_mul(width).ok_or_else(overflow)?, out))
    }

    /// A structure: its fields' leaves one after the other, named under
    /// the field; a constant field is a leaf of its own, taking no bits.
    fn structure(
        &mut self,
        s: &st::Structure,
        depth: u32,
    ) -> Result<(u64, Vec<Leaf>), StructError> {
        let mut out = Vec::new();
        let mut offset = 0u64;
        for f in &s.field {
            match &f.content {
                Some(st::field::Content::Type(tp)) => {
                    let (size, inner) = self.type_proto(tp, depth + 1)?;
                    for mut leaf in inner {
                        leaf.path = join(&f.name, &leaf.path);
                        leaf.offset_bits =
                            leaf.offset_bits.checked_add(offset).ok_or_else(overflow)?;
                        out.push(leaf);
                    }
                    offset = offset.checked_add(size).ok_or_else(overflow)?;
                }
                Some(st::field::Content::Constant(c)) => {
                    let elem =
                        DataType::from_i32(c.data_type).map_err(|_| err("constant data type"))?;
                    self.push(
                        &mut out,
                        Leaf {
                            path: f.name.clone(),
                            elem: LeafType::Tensor(elem),
                            shape: c.dims.iter().map(|&d| d.max(0) as u64).collect(),
                            strides_bits: Vec::new(),
                            offset_bits: 0,
                            constant: Some(c.clone()),
                        },
                    )?;
                }
                None => return Err(err("field without content")),
            }
        }
        Ok((offset, out))
    }

    fn type_proto(
        &mut self,
        tp: &pb::TypeProto,
        depth: u32,
    ) -> Result<(u64, Vec<Leaf>), StructError> {
        match &tp.value {
            Some(TypeValue::TensorType(t)) => {
                let dt = DataType::from_i32(t.elem_type).map_err(|_| err("leaf data type"))?;
                let bits = dt
                    .bit_width()
                    .ok_or_else(|| err("leaf is not fixed-width"))?;
                let mut out = Vec::new();
                self.push(
                    &mut out,
                    Leaf {
                        path: String::new(),
                        elem: LeafType::Tensor(dt),
                        shape: Vec::new(),
                        strides_bits: Vec::new(),
                        offset_bits: 0,
                        constant: None,
                    },
                )?;
                Ok((bits, out))
            }
            Some(TypeValue::StructType(s)) => {
                let kind = s
                    .kind
                    .as_ref()
                    .ok_or_else(|| err("unconstrained struct type"))?;
                self.kind(kind, depth + 1)
            }
            _ => Err(err("unsupported element type")),
        }
    }
}

fn join(a: &str, b: &str) -> String {
    if b.is_empty() {
        a.to_string()
    } else {
        format!("{a}.{b}")
    }
}

/// A leaf over a payload. Every read is bounds-checked against the payload.
#[derive(Debug, Clone, Copy)]
pub struct LeafView<'a> {
    /// The leaf being read.
    pub leaf: &'a Leaf,
    /// The whole payload the leaf lies in.
    pub payload: &'a [u8],
}

impl<'a> LeafView<'a> {
    /// Bit offset of the element with row-major linear index `i`.
    fn bit_offset(&self, mut i: u64) -> Option<u64> {
        let mut off = self.leaf.offset_bits;
        for (&n, &stride) in self.leaf.shape.iter().zip(&self.leaf.strides_bits).rev() {
            if n == 0 {
                return None;
            }
            off = off.checked_add((i % n).checked_mul(stride)?)?;
            i /= n;
        }
        (i == 0).then_some(off)
    }

    /// The raw bits of element `i` (LSB-first, as the payload stores them).
    pub fn bits_at(&self, i: u64) -> Result<u64, StructError> {
        let oob = || {
            StructError::new(
                "struct.leaf",
                &self.leaf.path,
                format!("element {i} is out of bounds"),
            )
        };
        let width = self.leaf.bit_width();
        if width > 64 {
            return Err(StructError::new(
                "struct.leaf",
                &self.leaf.path,
                "elements wider than 64 bits: use to_raw",
            ));
        }
        let start = self.bit_offset(i).ok_or_else(oob)?;
        let end = start.checked_add(width).ok_or_else(oob)?;
        if end > (self.payload.len() as u64) * 8 {
            return Err(oob());
        }
        let mut v = 0u64;
        for b in 0..width {
            let bit = start + b;
            let byte = self.payload[(bit / 8) as usize];
            v |= u64::from((byte >> (bit % 8)) & 1) << b;
        }
        Ok(v)
    }

    /// The leaf's elements in ONNX raw form (row-major, sub-byte types
    /// packed LSB-first), ready to be a `TensorProto.raw_data`.
    pub fn to_raw(&self) -> Result<Vec<u8>, StructError> {
        let width = self.leaf.bit_width();
        let n = self.leaf.len();
        let total_bits = n.checked_mul(width).ok_or_else(|| {
            StructError::new("struct.size_overflow", &self.leaf.path, "too large")
        })?;
        let last = if n == 0 { None } else { Some(n - 1) };
        // Bounds: the last element must lie inside the payload.
        if let Some(last) = last {
            let start = self.bit_offset(last).unwrap_or(u64::MAX);
            if start.saturating_add(width) > (self.payload.len() as u64) * 8 {
                return Err(StructError::new(
                    "struct.leaf",
                    &self.leaf.path,
                    "leaf extends past the payload",
                ));
            }
        }
        let mut out = vec![0u8; total_bits.div_ceil(8) as usize];
        let dense = self.is_dense();
        if width.is_multiple_of(8) && self.leaf.offset_bits.is_multiple_of(8) && dense {
            let start = (self.leaf.offset_bits / 8) as usize;
            let len = out.len();
            out.copy_from_slice(&self.payload[start..start + len]);
            return Ok(out);
        }
        for i in 0..n {
            let start = self.bit_offset(i).unwrap_or(0);
            for b in 0..width {
                let src = start + b;
                let bit = (self.payload[(src / 8) as usize] >> (src % 8)) & 1;
                let dst = i * width + b;
                out[(dst / 8) as usize] |= bit << (dst % 8);
            }
        }
        Ok(out)
    }

    /// True when elements are back to back in row-major order.
    fn is_dense(&self) -> bool {
        let mut expect = self.leaf.bit_width();
        for (&n, &s) in self.leaf.shape.iter().zip(&self.leaf.strides_bits).rev() {
            if s != expect {
                return false;
            }
            expect = expect.saturating_mul(n);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_leaf_of_huge_dims_has_no_elements() {
        let leaf = |shape: Vec<u64>| Leaf {
            path: "w".into(),
            elem: LeafType::Bits(4),
            strides_bits: vec![0; shape.len()],
            shape,
            offset_bits: 0,
            constant: None,
        };
        assert_eq!(leaf(vec![1 << 40, 1 << 40, 0]).len(), 0);
        assert!(leaf(vec![1 << 40, 1 << 40, 0]).is_empty());
        assert_eq!(leaf(vec![3, 5]).len(), 15);
    }
}
