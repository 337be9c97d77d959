//! ONNX tensor element types: widths, names and how typed fields store them.

use crate::error::{Error, Result};

/// An ONNX `TensorProto.DataType` value known to this build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DataType(i32);

/// Which `TensorProto` typed field holds a data type's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypedField {
    /// `float_data` (FLOAT, COMPLEX64).
    Float,
    /// `int32_data` (INT32, the smaller integers, BOOL, FLOAT16 and
    /// BFLOAT16 as bits, packed sub-byte types).
    Int32,
    /// `string_data` (STRING).
    String,
    /// `int64_data` (INT64).
    Int64,
    /// `double_data` (DOUBLE, COMPLEX128).
    Double,
    /// `uint64_data` (UINT32, UINT64).
    Uint64,
}

impl TypedField {
    /// Field number in `TensorProto`.
    pub fn number(self) -> u32 {
        match self {
            TypedField::Float => 4,
            TypedField::Int32 => 5,
            TypedField::String => 6,
            TypedField::Int64 => 7,
            TypedField::Double => 10,
            TypedField::Uint64 => 11,
        }
    }

    /// The typed field with `TensorProto` field number `n`, if any.
    pub(crate) fn from_number(n: u32) -> Option<TypedField> {
        Some(match n {
            4 => TypedField::Float,
            5 => TypedField::Int32,
            6 => TypedField::String,
            7 => TypedField::Int64,
            10 => TypedField::Double,
            11 => TypedField::Uint64,
            _ => return None,
        })
    }

    /// The field's name in `TensorProto`, e.g. `float_data`.
    pub fn name(self) -> &'static str {
        match self {
            TypedField::Float => "float_data",
            TypedField::Int32 => "int32_data",
            TypedField::String => "string_data",
            TypedField::Int64 => "int64_data",
            TypedField::Double => "double_data",
            TypedField::Uint64 => "uint64_data",
        }
    }
}

const NAMES: [&str; 27] = [
    "UNDEFINED",
    "FLOAT",
    "UINT8",
    "INT8",
    "UINT16",
    "INT16",
    "INT32",
    "INT64",
    "STRING",
    "BOOL",
    "FLOAT16",
    "DOUBLE",
    "UINT32",
    "UINT64",
    "COMPLEX64",
    "COMPLEX128",
    "BFLOAT16",
    "FLOAT8E4M3FN",
    "FLOAT8E4M3FNUZ",
    "FLOAT8E5M2",
    "FLOAT8E5M2FNUZ",
    "UINT4",
    "INT4",
    "FLOAT4E2M1",
    "FLOAT8E8M0",
    "UINT2",
    "INT2",
];

impl DataType {
    /// 32-bit IEEE float (code 1).
    pub const FLOAT: DataType = DataType(1);
    /// Unsigned 8-bit integer (code 2).
    pub const UINT8: DataType = DataType(2);
    /// Signed 8-bit integer (code 3).
    pub const INT8: DataType = DataType(3);
    /// Unsigned 16-bit integer (code 4).
    pub const UINT16: DataType = DataType(4);
    /// Signed 16-bit integer (code 5).
    pub const INT16: DataType = DataType(5);
    /// Signed 32-bit integer (code 6).
    pub const INT32: DataType = DataType(6);
    /// Signed 64-bit integer (code 7).
    pub const INT64: DataType = DataType(7);
    /// Variable-length byte strings (code 8); has no raw form.
    pub const STRING: DataType = DataType(8);
    /// Boolean, one byte per element (code 9).
    pub const BOOL: DataType = DataType(9);
    /// 16-bit IEEE half float (code 10).
    pub const FLOAT16: DataType = DataType(10);
    /// 64-bit IEEE float (code 11).
    pub const DOUBLE: DataType = DataType(11);
    /// Unsigned 32-bit integer (code 12).
    pub const UINT32: DataType = DataType(12);
    /// Unsigned 64-bit integer (code 13).
    pub const UINT64: DataType = DataType(13);
    /// Complex of two 32-bit floats (code 14).
    pub const COMPLEX64: DataType = DataType(14);
    /// Complex of two 64-bit floats (code 15).
    pub const COMPLEX128: DataType = DataType(15);
    /// bfloat16: the upper half of a 32-bit float (code 16).
    pub const BFLOAT16: DataType = DataType(16);
    /// Unsigned 4-bit integer, two per byte (code 21).
    pub const UINT4: DataType = DataType(21);
    /// Signed 4-bit integer, two per byte (code 22).
    pub const INT4: DataType = DataType(22);
    /// 4-bit float E2M1, two per byte (code 23).
    pub const FLOAT4E2M1: DataType = DataType(23);
    /// Unsigned 2-bit integer, four per byte (code 25).
    pub const UINT2: DataType = DataType(25);
    /// Signed 2-bit integer, four per byte (code 26).
    pub const INT2: DataType = DataType(26);

    /// Every defined, non-UNDEFINED data type.
    pub fn all() -> impl Iterator<Item = DataType> {
        (1..NAMES.len() as i32).map(DataType)
    }

    /// Accepts a defined, non-UNDEFINED `TensorProto.DataType` value.
    pub fn from_i32(v: i32) -> Result<DataType> {
        if v >= 1 && (v as usize) < NAMES.len() {
            Ok(DataType(v))
        } else {
            Err(Error::UnknownDataType(v))
        }
    }

    /// Parses an ONNX name such as `FLOAT16`, case-insensitively; `None` for UNDEFINED or unknown.
    pub fn from_name(name: &str) -> Option<DataType> {
        NAMES
            .iter()
            .position(|n| n.eq_ignore_ascii_case(name))
            .filter(|&i| i > 0)
            .map(|i| DataType(i as i32))
    }

    /// The `TensorProto.DataType` code.
    pub fn code(self) -> i32 {
        self.0
    }

    /// The ONNX name, e.g. `FLOAT16`.
    pub fn name(self) -> &'static str {
        NAMES[self.0 as usize]
    }

    /// Bits per element in raw form; `None` for STRING (variable length).
    pub fn bit_width(self) -> Option<u64> {
        Some(match self.0 {
            8 => return None,
            2 | 3 | 9 | 17..=20 | 24 => 8,
            4 | 5 | 10 | 16 => 16,
            1 | 6 | 12 => 32,
            7 | 11 | 13 | 14 => 64,
            15 => 128,
            21..=23 => 4,
            25 | 26 => 2,
            _ => unreachable!("DataType holds only defined codes"),
        })
    }

    /// The typed field that stores this type's values.
    pub(crate) fn typed_field(self) -> TypedField {
        match self.0 {
            1 | 14 => TypedField::Float,
            7 => TypedField::Int64,
            8 => TypedField::String,
            11 | 15 => TypedField::Double,
            12 | 13 => TypedField::Uint64,
            _ => TypedField::Int32,
        }
    }

    /// Elements (for sub-byte types: raw bytes, for complex: halves) per
    /// typed-field entry relation: returns the number of typed entries for
    /// `n` elements.
    pub(crate) fn typed_entries(self, n: u64) -> Option<u64> {
        match self.0 {
            14 | 15 => n.checked_mul(2),
            21..=23 => Some(n.div_ceil(2)),
            25 | 26 => Some(n.div_ceil(4)),
            _ => Some(n),
        }
    }

    /// Bytes of one typed entry in raw form (sub-byte types: one packed byte).
    pub(crate) fn typed_entry_bytes(self) -> usize {
        match self.0 {
            14 => 4,
            15 => 8,
            21..=23 | 25 | 26 => 1,
            _ => self.bit_width().map(|b| (b / 8) as usize).unwrap_or(0),
        }
    }

    /// Raw-form byte size of `n` elements (sub-byte types round up).
    pub fn raw_size(self, n: u64) -> Option<u64> {
        let bits = n.checked_mul(self.bit_width()?)?;
        Some(bits.div_ceil(8))
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widths_and_fields() {
        assert_eq!(DataType::FLOAT.bit_width(), Some(32));
        assert_eq!(DataType::COMPLEX128.bit_width(), Some(128));
        assert_eq!(DataType::INT4.raw_size(3), Some(2));
        assert_eq!(DataType::INT2.raw_size(5), Some(2));
        assert_eq!(DataType::STRING.bit_width(), None);
        assert_eq!(DataType::UINT32.typed_field(), TypedField::Uint64);
        assert_eq!(DataType::INT4.typed_entries(5), Some(3));
        assert!(DataType::from_i32(0).is_err());
        assert!(DataType::from_i32(27).is_err());
        assert_eq!(DataType::from_name("bfloat16"), Some(DataType::BFLOAT16));
        assert_eq!(DataType::all().count(), 26);
    }
}
