//! Validation and the size function of struct-types.md, in one bounded walk.
//! Sizes are in bits, with checked u64 arithmetic; a walk without concrete
//! `dims` (model-level declarations) validates structure only.

use std::cell::Cell;
use std::collections::HashMap;

use prost::Message;

use super::{Limits, StructError};
use crate::dtype::DataType;
use crate::onnx::{Storage, TensorRef};
use crate::pb;
use crate::pb::struct_type_proto::{self as st, Kind};
use crate::pb::type_proto::Value as TypeValue;

/// The size of a valid structured value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ValueLayout {
    /// Size in bits.
    pub size_bits: u64,
    /// Size in whole bytes (`size_bits / 8`; a valid value is byte-aligned).
    pub byte_len: u64,
}

struct Walker<'a> {
    table: &'a [pb::StructTypeProto],
    limits: &'a Limits,
    /// Nodes left to the model's walks together (`max_model_nodes`).
    budget: &'a Cell<u64>,
    dims: Option<&'a [u64]>,
    params: usize,
    used: Vec<bool>,
    stack: Vec<i32>,
    nodes: u64,
    constant_bytes: u64,
    memo: HashMap<i32, Option<u64>>,
}

type Size = Result<Option<u64>, StructError>;

fn overflow(path: &str) -> StructError {
    StructError::new("struct.size_overflow", path, "size overflows 64 bits")
}

fn mul(a: Option<u64>, b: Option<u64>, path: &str) -> Size {
    match (a, b) {
        (Some(a), Some(b)) => a.checked_mul(b).map(Some).ok_or_else(|| overflow(path)),
        _ => Ok(None),
    }
}

fn add(a: Option<u64>, b: Option<u64>, path: &str) -> Size {
    match (a, b) {
        (Some(a), Some(b)) => a.checked_add(b).map(Some).ok_or_else(|| overflow(path)),
        _ => Ok(None),
    }
}

impl<'a> Walker<'a> {
    fn new(
        table: &'a [pb::StructTypeProto],
        limits: &'a Limits,
        budget: &'a Cell<u64>,
        dims: Option<&'a [u64]>,
    ) -> Self {
        Walker {
            table,
            limits,
            budget,
            dims,
            params: 0,
            used: Vec::new(),
            stack: Vec::new(),
            nodes: 0,
            constant_bytes: 0,
            memo: HashMap::new(),
        }
    }

    fn enter(&mut self, path: &str, depth: u32) -> Result<(), StructError> {
        let left = self.budget.get();
        if left == 0 {
            return Err(StructError::new(
                "struct.limits",
                path,
                format!(
                    "the model's types walk more than {} nodes in all",
                    self.limits.max_model_nodes
                ),
            ));
        }
        self.budget.set(left - 1);
        self.nodes += 1;
        if self.nodes > self.limits.max_nodes {
            return Err(StructError::new(
                "struct.limits",
                path,
                format!("type walk exceeds {} nodes", self.limits.max_nodes),
            ));
        }
        if depth > self.limits.max_depth {
            return Err(StructError::new(
                "struct.depth",
                path,
                format!("nesting depth exceeds {}", self.limits.max_depth),
            ));
        }
        Ok(())
    }

    /// A concrete declaration: exactly one of array, structure, packed_array.
    fn declaration(&mut self, t: &pb::StructTypeProto, path: &str, depth: u32) -> Size {
        match &t.kind {
            Some(Kind::TypeIndex(_)) => Err(StructError::new(
                "struct.kind",
                path,
                "a concrete declaration cannot be a type_index reference",
            )),
            None => Err(StructError::new(
                "struct.unconstrained",
                path,
                "unconstrained static type (kind unset) where a concrete type is required",
            )),
            Some(kind) => self.kind(kind, path, depth),
        }
    }

    fn kind(&mut self, kind: &Kind, path: &str, depth: u32) -> Size {
        self.enter(path, depth)?;
        match kind {
            Kind::Array(a) => {
                let p = format!("{path}.array");
                let count = self.count(a.count.as_ref().map(ArrayCount::from), &p)?;
                let elem = a.element_type.as_ref().ok_or_else(|| {
                    StructError::new("struct.leaf", &p, "array without element_type")
                })?;
                let elem = self.type_proto(elem, &format!("{p}.element_type"), depth + 1)?;
                mul(count, elem, &p)
            }
            Kind::PackedArray(pa) => {
                let p = format!("{path}.packed_array");
                let count = self.count(pa.count.as_ref().map(ArrayCount::from), &p)?;
                if pa.component.is_empty() {
                    return Err(StructError::new(
                        "struct.packed_component",
                        &p,
                        "no components",
                    ));
                }
                if pa.component.len() > self.limits.max_fields {
                    return Err(StructError::new("struct.limits", &p, "too many components"));
                }
                let mut width = 0u64;
                let mut names = std::collections::HashSet::new();
                for (i, c) in pa.component.iter().enumerate() {
                    if c.bit_width == 0 || c.bit_width > 64 {
                        return Err(StructError::new(
                            "struct.packed_component",
                            format!("{p}.component[{i}]"),
                            format!("bit_width {} is not in 1..=64", c.bit_width),
                        ));
                    }
                    if !c.name.is_empty() && !names.insert(c.name.as_str()) {
                        return Err(StructError::new(
                            "struct.packed_component",
                            format!("{p}.component[{i}]"),
                            format!("duplicated component name {:?}", c.name),
                        ));
                    }
                    width += u64::from(c.bit_width);
                }
                mul(count, Some(width), &p)
            }
            Kind::Structure(s) => {
                let p = format!("{path}.structure");
                if s.field.len() > self.limits.max_fields {
                    return Err(StructError::new("struct.limits", &p, "too many fields"));
                }
                let mut names = std::collections::HashSet::new();
                let mut total = Some(0u64);
                for (i, f) in s.field.iter().enumerate() {
                    let fp = format!("{p}.field[{i}:{}]", f.name);
                    if f.name.is_empty() || !names.insert(f.name.as_str()) {
                        return Err(StructError::new(
                            "struct.field_name",
                            &fp,
                            "field names must be non-empty and unique",
                        ));
                    }
                    let size = match &f.content {
                        Some(st::field::Content::Type(tp)) => {
                            self.type_proto(tp, &fp, depth + 1)?
                        }
                        Some(st::field::Content::Constant(c)) => {
                            self.constant(c, &fp)?;
                            Some(0)
                        }
                        None => {
                            return Err(StructError::new(
                                "struct.field_content",
                                &fp,
                                "a field needs exactly one of type or constant",
                            ))
                        }
                    };
                    total = add(total, size, &fp)?;
                }
                Ok(total)
            }
            Kind::TypeIndex(i) => self.reference(*i, path, depth),
        }
    }

    /// A `TypeProto` used as an element or field type.
    fn type_proto(&mut self, tp: &pb::TypeProto, path: &str, depth: u32) -> Size {
        self.enter(path, depth)?;
        match &tp.value {
            Some(TypeValue::TensorType(t)) => {
                if t.shape.as_ref().is_some_and(|s| !s.dim.is_empty()) {
                    return Err(StructError::new(
                        "struct.leaf",
                        path,
                        "a leaf must be a scalar (no shape)",
                    ));
                }
                let dt = DataType::from_i32(t.elem_type).map_err(|_| {
                    StructError::new(
                        "struct.leaf",
                        path,
                        format!("elem_type {} is not a data type", t.elem_type),
                    )
                })?;
                let bits = dt.bit_width().ok_or_else(|| {
                    StructError::new(
                        "struct.leaf",
                        path,
                        format!("{dt} is not a fixed-width leaf type"),
                    )
                })?;
                Ok(Some(bits))
            }
            Some(TypeValue::StructType(s)) => {
                if s.decoder.is_some()
                    || s.encoder.is_some()
                    || !s.name.is_empty()
                    || !s.dims_param.is_empty()
                    || !s.metadata_props.is_empty()
                {
                    return Err(StructError::new(
                        "struct.static_form",
                        path,
                        "a nested (static) struct type carries no decoder, encoder, name, dims_param or metadata",
                    ));
                }
                match &s.kind {
                    None => Err(StructError::new(
                        "struct.unconstrained",
                        path,
                        "unconstrained static struct type (kind unset)",
                    )),
                    Some(kind) => self.kind(kind, &format!("{path}.struct_type"), depth + 1),
                }
            }
            _ => Err(StructError::new(
                "struct.leaf",
                path,
                "element and field types must be scalar tensor types or struct types",
            )),
        }
    }

    /// Follows a `type_index` reference into the model-level table.
    fn reference(&mut self, i: i32, path: &str, depth: u32) -> Size {
        let target = usize::try_from(i)
            .ok()
            .and_then(|u| self.table.get(u))
            .ok_or_else(|| {
                StructError::new(
                    "struct.reference",
                    path,
                    format!(
                        "type_index {i} is out of range ({} struct types)",
                        self.table.len()
                    ),
                )
            })?;
        if self.stack.contains(&i) {
            return Err(StructError::new(
                "struct.cycle",
                path,
                format!(
                    "type_index {i} closes a reference cycle (struct_types {:?})",
                    self.stack
                ),
            ));
        }
        if let Some(size) = self.memo.get(&i) {
            return Ok(*size);
        }
        if !target.dims_param.is_empty() {
            return Err(StructError::new(
                "struct.param_nesting",
                path,
                format!("struct_types[{i}] declares dims_param and cannot be nested"),
            ));
        }
        // A referenced declaration sees no parameters: its counts are static.
        let saved = (
            self.params,
            std::mem::take(&mut self.used),
            self.dims.take(),
        );
        self.params = 0;
        self.stack.push(i);
        let size = self.declaration(target, &format!("struct_types[{i}]"), depth + 1);
        self.stack.pop();
        (self.params, self.used, self.dims) = saved;
        let size = size?;
        self.memo.insert(i, size);
        Ok(size)
    }

    fn count(&mut self, count: Option<ArrayCount>, path: &str) -> Size {
        match count {
            None => Err(StructError::new(
                "struct.count",
                path,
                "count (dimension or dims_index) is not set",
            )),
            Some(ArrayCount::Dimension(n)) => Ok(Some(n)),
            Some(ArrayCount::DimsIndex(k)) => {
                let k = k as usize;
                if k >= self.params {
                    return Err(StructError::new(
                        "struct.dims_param",
                        path,
                        format!(
                            "dims_index {k} is out of range ({} dims_param)",
                            self.params
                        ),
                    ));
                }
                self.used[k] = true;
                Ok(self.dims.map(|d| d[k]))
            }
        }
    }

    fn constant(&mut self, c: &pb::TensorProto, path: &str) -> Result<(), StructError> {
        let encoded = c.encode_to_vec();
        self.constant_bytes = self.constant_bytes.saturating_add(encoded.len() as u64);
        if self.constant_bytes > self.limits.max_constant_bytes {
            return Err(StructError::new(
                "struct.limits",
                path,
                format!("constants exceed {} bytes", self.limits.max_constant_bytes),
            ));
        }
        let len = encoded.len();
        let t = TensorRef::parse(&encoded, 0..len)
            .map_err(|e| StructError::new("struct.constant", path, e.to_string()))?;
        if matches!(t.storage, Storage::External(_)) {
            return Err(StructError::new(
                "struct.constant",
                path,
                "a constant cannot use external data",
            ));
        }
        Ok(())
    }

    /// Walks a declaration as a root with its own `dims_param`.
    fn root(&mut self, t: &pb::StructTypeProto, path: &str) -> Size {
        if t.dims_param.len() > self.limits.max_dims {
            return Err(StructError::new(
                "struct.limits",
                path,
                "too many dims_param",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for p in &t.dims_param {
            if p.is_empty() || !names.insert(p.as_str()) {
                return Err(StructError::new(
                    "struct.dims_param",
                    path,
                    "dims_param names must be non-empty and unique",
                ));
            }
        }
        self.params = t.dims_param.len();
        self.used = vec![false; self.params];
        let size = self.declaration(t, path, 0)?;
        if let Some(k) = self.used.iter().position(|u| !u) {
            return Err(StructError::new(
                "struct.dims_param",
                path,
                format!("dims_param {:?} is never used", t.dims_param[k]),
            ));
        }
        Ok(size)
    }
}

enum ArrayCount {
    Dimension(u64),
    DimsIndex(u32),
}

impl From<&st::array::Count> for ArrayCount {
    fn from(c: &st::array::Count) -> Self {
        match *c {
            st::array::Count::Dimension(n) => ArrayCount::Dimension(n),
            st::array::Count::DimsIndex(k) => ArrayCount::DimsIndex(k),
        }
    }
}

impl From<&st::packed_array::Count> for ArrayCount {
    fn from(c: &st::packed_array::Count) -> Self {
        match *c {
            st::packed_array::Count::Dimension(n) => ArrayCount::Dimension(n),
            st::packed_array::Count::DimsIndex(k) => ArrayCount::DimsIndex(k),
        }
    }
}

/// Validates `ModelProto.struct_types`: names, concrete declarations,
/// static forms, references (in range, acyclic), dims_param use, limits.
pub fn validate_table(table: &[pb::StructTypeProto], limits: &Limits) -> Result<(), StructError> {
    if table.len() > limits.max_struct_types {
        return Err(StructError::new(
            "struct.limits",
            "struct_types",
            format!(
                "{} struct types exceed the limit of {}",
                table.len(),
                limits.max_struct_types
            ),
        ));
    }
    let mut names = std::collections::HashSet::new();
    let budget = Cell::new(limits.max_model_nodes);
    for (i, t) in table.iter().enumerate() {
        let path = format!("struct_types[{i}]");
        if t.name.is_empty() {
            return Err(StructError::new(
                "struct.name",
                &path,
                "model-level struct types need a name",
            ));
        }
        if !names.insert(t.name.as_str()) {
            return Err(StructError::new(
                "struct.name",
                &path,
                format!("duplicated name {:?}", t.name),
            ));
        }
        let mut w = Walker::new(table, limits, &budget, None);
        w.stack.push(i as i32);
        w.root(t, &path)?;
    }
    Ok(())
}

/// Validates a value's concrete root type against its `dims` and returns
/// its size; the byte length must then equal the payload length.
pub fn check_value(
    root: &pb::StructTypeProto,
    dims: &[u64],
    table: &[pb::StructTypeProto],
    limits: &Limits,
) -> Result<ValueLayout, StructError> {
    check_value_within(
        root,
        dims,
        table,
        limits,
        &Cell::new(limits.max_model_nodes),
    )
}

/// [`check_value`] for one of a model's values: the walk also spends the
/// nodes left to the model's values together (`budget`, started at
/// `max_model_nodes`).
pub fn check_value_within(
    root: &pb::StructTypeProto,
    dims: &[u64],
    table: &[pb::StructTypeProto],
    limits: &Limits,
    budget: &Cell<u64>,
) -> Result<ValueLayout, StructError> {
    if dims.len() != root.dims_param.len() {
        return Err(StructError::new(
            "struct.dims",
            "dims",
            format!(
                "StructProto.dims has {} values, the type declares {} dims_param",
                dims.len(),
                root.dims_param.len()
            ),
        ));
    }
    let mut w = Walker::new(table, limits, budget, Some(dims));
    let size_bits = w.root(root, "value")?.ok_or_else(|| {
        StructError::new("struct.dims", "value", "size depends on unresolved dims")
    })?;
    if !size_bits.is_multiple_of(8) {
        return Err(StructError::new(
            "struct.byte_aligned",
            "value",
            format!("size {size_bits} bits is not a whole number of bytes"),
        ));
    }
    Ok(ValueLayout {
        size_bits,
        byte_len: size_bits / 8,
    })
}
