//! The rules and sizes of each form a type takes: array, packed array,
//! structure, scalar tensor leaf, nested static type and constant field.

use prost::Message;

use super::{add, mul, ArrayCount, Size, Walker};
use crate::dtype::DataType;
use crate::onnx::{Storage, TensorRef};
use crate::pb;
use crate::pb::struct_type_proto::{self as st, Kind};
use crate::pb::type_proto::Value as TypeValue;
use crate::structs::StructError;

impl Walker<'_> {
    /// Any form of type: its rules, and its size when the counts are known.
    pub(super) fn kind(&mut self, kind: &Kind, path: &str, depth: u32) -> Size {
        self.enter(path, depth)?;
        match kind {
            Kind::Array(a) => self.array(a, path, depth),
            Kind::PackedArray(pa) => self.packed_array(pa, path),
            Kind::Structure(s) => self.structure(s, path, depth),
            Kind::TypeIndex(i) => self.reference(*i, path, depth),
        }
    }

    /// An array: a count times its element type.
    fn array(&mut self, a: &st::Array, path: &str, depth: u32) -> Size {
        let p = format!("{path}.array");
        let count = self.count(a.count.as_ref().map(ArrayCount::from), &p)?;
        let elem = a
            .element_type
            .as_ref()
            .ok_or_else(|| StructError::new("struct.leaf", &p, "array without element_type"))?;
        let elem = self.type_proto(elem, &format!("{p}.element_type"), depth + 1)?;
        mul(count, elem, &p)
    }

    /// A packed array: a count times the summed width of its components
    /// (1 to 64 bits each, names unique).
    fn packed_array(&mut self, pa: &st::PackedArray, path: &str) -> Size {
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

    /// A structure: its fields one after the other (names non-empty and
    /// unique; a constant field takes no bits).
    fn structure(&mut self, s: &st::Structure, path: &str, depth: u32) -> Size {
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
                Some(st::field::Content::Type(tp)) => self.type_proto(tp, &fp, depth + 1)?,
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

    /// A constant field: a tensor with its data inline, counted against
    /// `max_constant_bytes`.
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
}
