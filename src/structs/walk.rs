//! Validation and the size function of docs/FORMAT.md's Structured types, in one bounded walk.
//! Sizes are in bits, with checked u64 arithmetic; a walk without concrete
//! `dims` (model-level declarations) validates structure only.

use std::cell::Cell;
use std::collections::HashMap;

use super::{Limits, StructError};
use crate::pb;
use crate::pb::struct_type_proto::{self as st, Kind};

mod forms;

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
