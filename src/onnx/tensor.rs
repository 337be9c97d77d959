//! `TensorRef`: one top-level initializer, parsed at the wire level. Payload
//! bytes stay in the model's memory map; only offsets are recorded.

use std::ops::Range;

use crate::dtype::{DataType, TypedField};
use crate::error::{Error, Result};
use crate::onnx::external::ExternalRef;
use crate::wire::{read_varint, Fields, Value, WireError};

/// Where a tensor's elements live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// `raw_data`: a range of the model bytes.
    Raw(Range<usize>),
    /// A typed field (`float_data`, `int32_data`, ...).
    Typed(Typed),
    /// `data_location = EXTERNAL`.
    External(ExternalRef),
}

impl Storage {
    /// `raw`, `typed` or `external`, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Storage::Raw(_) => "raw",
            Storage::Typed(_) => "typed",
            Storage::External(_) => "external",
        }
    }
}

/// A typed field's encoded values: each segment is a range of the model bytes
/// holding a run of encoded values (a packed run, or one unpacked value; for
/// `string_data`, one string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Typed {
    /// Which typed field holds the values.
    pub field: TypedField,
    /// Ranges of the model bytes holding the encoded values.
    pub segments: Vec<Range<usize>>,
    /// Number of encoded entries across all segments.
    pub entries: u64,
}

/// One top-level graph initializer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef {
    /// The initializer's name.
    pub name: String,
    /// Its element type.
    pub data_type: DataType,
    /// Its dims, outermost first.
    pub dims: Vec<u64>,
    /// Where its elements are.
    pub storage: Storage,
    /// Number of elements (checked product of `dims`; 1 for a scalar).
    pub elements: u64,
}

impl TensorRef {
    /// Raw-form byte size (`None` for STRING).
    pub fn raw_size(&self) -> Option<u64> {
        self.data_type.raw_size(self.elements)
    }

    /// Parses a `TensorProto` whose encoded bytes are `model[range]`.
    pub fn parse(model: &[u8], range: Range<usize>) -> Result<TensorRef> {
        Parser::default().run(model, range)
    }

    /// The name of a `TensorProto` that may not parse: the last `name`
    /// field readable before the first malformed field, if any.
    pub(crate) fn name_of(model: &[u8], range: Range<usize>) -> Option<String> {
        let mut name = None;
        for field in Fields::with_base(&model[range.clone()], range.start) {
            match field {
                Ok(f) if f.number == 8 => {
                    if let Value::Bytes(b) = f.value {
                        name = std::str::from_utf8(b).ok().map(str::to_string);
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        name
    }
}

#[derive(Default)]
struct Parser {
    name: Option<String>,
    data_type: Option<i32>,
    dims: Vec<i64>,
    raw: Option<Range<usize>>,
    typed: Vec<(TypedField, Range<usize>, TypedEncoding)>,
    external: Vec<(String, String)>,
    location: i64,
    segmented: bool,
}

/// How one typed-field occurrence is encoded.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TypedEncoding {
    Packed,
    Single,
}

fn wire_err(e: WireError) -> Error {
    Error::wire("TensorProto", e)
}

fn utf8(bytes: &[u8], what: &str) -> Result<String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| Error::Model(format!("{what} is not valid UTF-8")))
}

impl Parser {
    fn run(mut self, model: &[u8], range: Range<usize>) -> Result<TensorRef> {
        let base = range.start;
        for field in Fields::with_base(&model[range], base) {
            let field = field.map_err(wire_err)?;
            self.field(&field)?;
        }
        self.finish(model)
    }

    fn field(&mut self, f: &crate::wire::Field<'_>) -> Result<()> {
        match (f.number, f.value) {
            (1, Value::Varint(v)) => self.dims.push(v as i64),
            (1, Value::Bytes(b)) => {
                let mut pos = 0;
                while pos < b.len() {
                    let (v, next) = read_varint(b, pos).map_err(|e| {
                        wire_err(WireError {
                            offset: f.value_start + e.offset,
                            problem: e.problem,
                        })
                    })?;
                    self.dims.push(v as i64);
                    pos = next;
                }
            }
            (2, Value::Varint(v)) => self.data_type = Some(v as i32),
            (3, _) => self.segmented = true,
            (8, Value::Bytes(b)) => self.name = Some(utf8(b, "tensor name")?),
            (9, Value::Bytes(b)) => self.raw = Some(f.value_start..f.value_start + b.len()),
            (13, Value::Bytes(b)) => self.external.push(parse_entry(b, f.value_start)?),
            (14, Value::Varint(v)) => self.location = v as i64,
            (12 | 16, Value::Bytes(_)) => {}
            (n, value) => {
                if let Some(tf) = TypedField::from_number(n) {
                    let ok = matches!(
                        (tf, value),
                        (_, Value::Bytes(_))
                            | (TypedField::Float, Value::Fixed32(_))
                            | (TypedField::Double, Value::Fixed64(_))
                            | (
                                TypedField::Int32 | TypedField::Int64 | TypedField::Uint64,
                                Value::Varint(_)
                            )
                    );
                    if !ok {
                        return Err(self.wrong_wire(f));
                    }
                    let len = match value {
                        Value::Bytes(b) => b.len(),
                        _ => f.span.end - f.value_start,
                    };
                    let enc = match (tf, value) {
                        (TypedField::String, _) => TypedEncoding::Single,
                        (_, Value::Bytes(_)) => TypedEncoding::Packed,
                        _ => TypedEncoding::Single,
                    };
                    self.typed
                        .push((tf, f.value_start..f.value_start + len, enc));
                } else if matches!(n, 1 | 2 | 8 | 9 | 12 | 13 | 14 | 16) {
                    return Err(self.wrong_wire(f));
                }
                // Unknown fields are ignored, as protobuf parsers do.
            }
        }
        Ok(())
    }

    fn wrong_wire(&self, f: &crate::wire::Field<'_>) -> Error {
        Error::Wire {
            context: format!("TensorProto field {}", f.number),
            offset: f.span.start,
            problem: crate::wire::WireProblem::UnexpectedWireType {
                field: f.number,
                got: f.value.kind(),
                expected: "the type declared in onnx.proto",
            },
        }
    }

    fn finish(mut self, model: &[u8]) -> Result<TensorRef> {
        let name = self.name.take().unwrap_or_default();
        let err = |p: String| Error::tensor(&name, p);
        let code = self.data_type.unwrap_or(0);
        let data_type = DataType::from_i32(code).map_err(|_| {
            err(if code == 0 {
                "data_type is UNDEFINED (0)".to_string()
            } else {
                format!("unknown data_type {code}")
            })
        })?;
        if self.segmented {
            return Err(err(
                "segmented tensors (TensorProto.segment) are not supported".into(),
            ));
        }
        let mut dims = Vec::with_capacity(self.dims.len());
        let mut elements: u64 = 1;
        for (i, &d) in self.dims.iter().enumerate() {
            let d = u64::try_from(d).map_err(|_| err(format!("dims[{i}] = {d} is negative")))?;
            elements = elements
                .checked_mul(d)
                .ok_or_else(|| err("dims product overflows 64 bits".into()))?;
            dims.push(d);
        }
        let storage = self.storage(model, data_type, elements, &name)?;
        Ok(TensorRef {
            name,
            data_type,
            dims,
            storage,
            elements,
        })
    }

    /// Where the tensor's data is (inline raw bytes, typed fields or
    /// external data), checked against its type and element count.
    fn storage(
        &self,
        model: &[u8],
        data_type: DataType,
        elements: u64,
        name: &str,
    ) -> Result<Storage> {
        let err = |p: String| Error::tensor(name, p);
        let expected_field = data_type.typed_field();
        if let Some((tf, _, _)) = self.typed.iter().find(|(tf, _, _)| *tf != expected_field) {
            return Err(err(format!(
                "{} is not a valid field for data type {} (expected {})",
                tf.name(),
                data_type,
                expected_field.name()
            )));
        }
        let has_typed = !self.typed.is_empty();
        Ok(match self.location {
            0 => {
                if !self.external.is_empty() {
                    return Err(err(
                        "external_data entries without data_location = EXTERNAL".into(),
                    ));
                }
                match (self.raw.clone(), has_typed) {
                    (Some(_), true) => {
                        return Err(err(format!(
                            "both raw_data and {} are set",
                            expected_field.name()
                        )))
                    }
                    (Some(raw), false) => {
                        if data_type == DataType::STRING {
                            return Err(err("STRING tensors cannot use raw_data".into()));
                        }
                        let want = data_type
                            .raw_size(elements)
                            .ok_or_else(|| err("size overflows".into()))?;
                        if raw.len() as u64 != want {
                            return Err(err(format!(
                                "raw_data has {} bytes, {} x {} needs {}",
                                raw.len(),
                                elements,
                                data_type,
                                want
                            )));
                        }
                        Storage::Raw(raw)
                    }
                    (None, _) => Storage::Typed(typed_storage(
                        model,
                        &self.typed,
                        expected_field,
                        data_type,
                        elements,
                        name,
                    )?),
                }
            }
            1 => {
                if self.raw.is_some() || has_typed {
                    return Err(err(
                        "data_location is EXTERNAL but the tensor also holds data inline".into(),
                    ));
                }
                if data_type == DataType::STRING {
                    return Err(err("STRING tensors cannot use external data".into()));
                }
                let r = ExternalRef::from_entries(
                    self.external.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                )
                .map_err(|p| Error::external(name, p.to_string()))?;
                Storage::External(r)
            }
            other => return Err(err(format!("unknown data_location {other}"))),
        })
    }
}

fn parse_entry(b: &[u8], base: usize) -> Result<(String, String)> {
    let (mut key, mut value) = (String::new(), String::new());
    for f in Fields::with_base(b, base) {
        let f = f.map_err(wire_err)?;
        match f.number {
            1 => key = utf8(f.bytes().map_err(wire_err)?, "external_data key")?,
            2 => value = utf8(f.bytes().map_err(wire_err)?, "external_data value")?,
            _ => {}
        }
    }
    Ok((key, value))
}

/// Counts and validates the entries of a typed field without decoding them.
fn typed_storage(
    model: &[u8],
    occurrences: &[(TypedField, Range<usize>, TypedEncoding)],
    field: TypedField,
    data_type: DataType,
    elements: u64,
    name: &str,
) -> Result<Typed> {
    let mut entries: u64 = 0;
    let mut segments = Vec::with_capacity(occurrences.len());
    for (_, range, enc) in occurrences {
        let bytes = &model[range.clone()];
        let n = match (field, enc) {
            (TypedField::String, _) => 1,
            (TypedField::Float, TypedEncoding::Packed)
            | (TypedField::Double, TypedEncoding::Packed) => {
                let w = if field == TypedField::Float { 4 } else { 8 };
                if !bytes.len().is_multiple_of(w) {
                    return Err(Error::tensor(
                        name,
                        format!(
                            "packed {} length {} is not a multiple of {w}",
                            field.name(),
                            bytes.len()
                        ),
                    ));
                }
                (bytes.len() / w) as u64
            }
            (_, TypedEncoding::Single) => 1,
            (_, TypedEncoding::Packed) => count_varints(bytes).ok_or_else(|| {
                Error::tensor(
                    name,
                    format!("packed {} holds a malformed varint", field.name()),
                )
            })?,
        };
        entries += n;
        segments.push(range.clone());
    }
    let want = data_type
        .typed_entries(elements)
        .ok_or_else(|| Error::tensor(name, "size overflows"))?;
    if entries != want {
        return Err(Error::tensor(
            name,
            format!(
                "{} holds {entries} entries, {elements} x {data_type} needs {want}",
                field.name()
            ),
        ));
    }
    Ok(Typed {
        field,
        segments,
        entries,
    })
}

/// Number of varints in a packed run, or `None` when the run is malformed.
fn count_varints(bytes: &[u8]) -> Option<u64> {
    let mut count = 0u64;
    let mut pos = 0;
    while pos < bytes.len() {
        pos = read_varint(bytes, pos).ok()?.1;
        count += 1;
    }
    Some(count)
}
