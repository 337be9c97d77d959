//! A minimal, bounds-checked reader of the protobuf wire format over borrowed
//! bytes. ctcache walks models at this level so that it can borrow payloads
//! from a memory map and splice fields without re-encoding (D2).

use std::ops::Range;

/// What was wrong with the bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireProblem {
    /// The input ends inside a field.
    #[error("truncated input")]
    Truncated,
    /// A varint runs past 10 bytes or 64 bits.
    #[error("varint longer than 10 bytes")]
    VarintTooLong,
    /// A tag with field number 0.
    #[error("field number 0")]
    FieldZero,
    /// A field number above the protobuf maximum.
    #[error("field number beyond 2^29")]
    FieldNumberTooLarge,
    /// Wire type 3, 4 (groups) or above 5.
    #[error("unsupported wire type {0} (groups are not used by ONNX)")]
    BadWireType(u8),
    /// A length prefix larger than the rest of the input.
    #[error("declared length {0} exceeds the remaining input")]
    LengthTooLarge(u64),
    /// A field has another wire type than its schema gives.
    #[error("field {field} has wire type {got}, expected {expected}")]
    UnexpectedWireType {
        /// The field number.
        field: u32,
        /// The wire type found.
        got: &'static str,
        /// The wire type the schema gives.
        expected: &'static str,
    },
}

/// The value of one field occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0.
    Varint(u64),
    /// Wire type 1.
    Fixed64(u64),
    /// Wire type 2: the value bytes.
    Bytes(&'a [u8]),
    /// Wire type 5.
    Fixed32(u32),
}

impl Value<'_> {
    /// The wire type's name, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Varint(_) => "varint",
            Value::Fixed64(_) => "fixed64",
            Value::Bytes(_) => "length-delimited",
            Value::Fixed32(_) => "fixed32",
        }
    }
}

/// One field occurrence: its number, value and the byte range it occupies
/// (tag included) in the buffer being walked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field<'a> {
    /// The field number.
    pub number: u32,
    /// The decoded value.
    pub value: Value<'a>,
    /// Tag to end of value, relative to the walker's base.
    pub span: Range<usize>,
    /// Offset of the value bytes (for `Bytes`: the payload start).
    pub value_start: usize,
}

impl<'a> Field<'a> {
    /// The payload of a length-delimited field, or an error naming the field.
    pub fn bytes(&self) -> Result<&'a [u8], WireError> {
        match self.value {
            Value::Bytes(b) => Ok(b),
            other => Err(self.unexpected(other.kind(), "length-delimited")),
        }
    }

    /// The value of a varint field, or an error naming the field.
    pub fn varint(&self) -> Result<u64, WireError> {
        match self.value {
            Value::Varint(v) => Ok(v),
            other => Err(self.unexpected(other.kind(), "varint")),
        }
    }

    fn unexpected(&self, got: &'static str, expected: &'static str) -> WireError {
        WireError {
            offset: self.span.start,
            problem: WireProblem::UnexpectedWireType {
                field: self.number,
                got,
                expected,
            },
        }
    }
}

/// A malformed buffer: what was wrong and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError {
    /// Byte offset of the bad field or varint.
    pub offset: usize,
    /// What was wrong.
    pub problem: WireProblem,
}

/// Reads a varint at `pos`, returning the value and the position after it.
pub(crate) fn read_varint(buf: &[u8], mut pos: usize) -> Result<(u64, usize), WireError> {
    let start = pos;
    let mut value = 0u64;
    for shift in (0..70).step_by(7) {
        let Some(&byte) = buf.get(pos) else {
            return Err(WireError {
                offset: start,
                problem: WireProblem::Truncated,
            });
        };
        pos += 1;
        if shift == 63 && byte > 1 {
            return Err(WireError {
                offset: start,
                problem: WireProblem::VarintTooLong,
            });
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value, pos));
        }
    }
    Err(WireError {
        offset: start,
        problem: WireProblem::VarintTooLong,
    })
}

/// Iterates the fields of one message. Offsets are relative to `base`, so
/// spans of a nested message can be expressed in file coordinates.
pub(crate) struct Fields<'a> {
    buf: &'a [u8],
    pos: usize,
    base: usize,
    failed: bool,
}

impl<'a> Fields<'a> {
    /// Walks `buf` with offsets from 0.
    pub fn new(buf: &'a [u8]) -> Self {
        Self::with_base(buf, 0)
    }

    /// Walks `buf` with offsets from `base` (the position of `buf` in the file).
    pub(crate) fn with_base(buf: &'a [u8], base: usize) -> Self {
        Fields {
            buf,
            pos: 0,
            base,
            failed: false,
        }
    }

    fn next_field(&mut self) -> Result<Field<'a>, WireError> {
        let buf = self.buf;
        let start = self.pos;
        let err = |offset: usize, problem| WireError {
            offset: self.base + offset,
            problem,
        };
        let (key, pos) = read_varint(buf, start).map_err(|e| err(e.offset, e.problem))?;
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|&n| n < 1 << 29)
            .ok_or(err(start, WireProblem::FieldNumberTooLarge))?;
        if number == 0 {
            return Err(err(start, WireProblem::FieldZero));
        }
        let (value, value_start, end) = match (key & 7) as u8 {
            0 => {
                let (v, end) = read_varint(buf, pos).map_err(|e| err(e.offset, e.problem))?;
                (Value::Varint(v), pos, end)
            }
            1 => {
                let b = buf
                    .get(pos..pos + 8)
                    .ok_or(err(pos, WireProblem::Truncated))?;
                let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
                (Value::Fixed64(v), pos, pos + 8)
            }
            2 => {
                let (len, data) = read_varint(buf, pos).map_err(|e| err(e.offset, e.problem))?;
                let remaining = (buf.len() - data) as u64;
                if len > remaining {
                    return Err(err(pos, WireProblem::LengthTooLarge(len)));
                }
                let end = data + len as usize;
                (Value::Bytes(&buf[data..end]), data, end)
            }
            5 => {
                let b = buf
                    .get(pos..pos + 4)
                    .ok_or(err(pos, WireProblem::Truncated))?;
                let v = u32::from_le_bytes(b.try_into().expect("4 bytes"));
                (Value::Fixed32(v), pos, pos + 4)
            }
            other => return Err(err(start, WireProblem::BadWireType(other))),
        };
        self.pos = end;
        Ok(Field {
            number,
            value,
            span: self.base + start..self.base + end,
            value_start: self.base + value_start,
        })
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.buf.len() {
            return None;
        }
        let item = self.next_field();
        self.failed = item.is_err();
        Some(item)
    }
}

/// Appends a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends the tag and length prefix of a length-delimited field.
pub fn put_len_prefix(out: &mut Vec<u8>, number: u32, len: u64) {
    put_varint(out, (u64::from(number) << 3) | 2);
    put_varint(out, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_fields_with_spans() {
        // field 1 varint 150, field 2 bytes "hi", field 5 fixed32
        let buf = [0x08, 0x96, 0x01, 0x12, 0x02, b'h', b'i', 0x2d, 1, 0, 0, 0];
        let fields: Vec<_> = Fields::new(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(fields.len(), 3);
        assert_eq!(fields[0].value, Value::Varint(150));
        assert_eq!(fields[1].value, Value::Bytes(b"hi"));
        assert_eq!(fields[1].span, 3..7);
        assert_eq!(fields[2].value, Value::Fixed32(1));
    }

    #[test]
    fn rejects_bad_input() {
        let too_long = [0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        let e = Fields::new(&too_long).next().unwrap().unwrap_err();
        assert!(matches!(e.problem, WireProblem::LengthTooLarge(_)));
        let varint11 = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(
            Fields::new(&varint11).next().unwrap().unwrap_err().problem,
            WireProblem::VarintTooLong
        );
        assert_eq!(
            Fields::new(&[0x0b]).next().unwrap().unwrap_err().problem,
            WireProblem::BadWireType(3)
        );
        assert_eq!(
            Fields::new(&[0x00, 0x00])
                .next()
                .unwrap()
                .unwrap_err()
                .problem,
            WireProblem::FieldZero
        );
        assert_eq!(
            Fields::new(&[0x0d, 1, 2])
                .next()
                .unwrap()
                .unwrap_err()
                .problem,
            WireProblem::Truncated
        );
    }

    #[test]
    fn varint_roundtrip() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            assert_eq!(read_varint(&out, 0).unwrap(), (v, out.len()));
        }
    }
}
