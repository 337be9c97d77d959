//! Why a packer refused or failed: the kernels' one error type.

use ctcache::dtype::DataType;

use crate::isa::Isa;

/// "known: a, b", or that the packer takes none.
fn known_params(known: &str) -> String {
    if known.is_empty() {
        "it takes no parameters".into()
    } else {
        format!("known: {known}")
    }
}

/// Why a packer refused or failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    /// A parameter without `=` or with an empty key.
    #[error("parameter {0:?} is not of the form key=value")]
    MalformedParam(String),
    /// The same key given twice.
    #[error("parameter {0:?} is given twice")]
    DuplicateParam(String),
    /// A key the packer does not accept.
    #[error("{packer}: unknown parameter {name:?} ({})", known_params(known))]
    UnknownParam {
        /// The packer's id.
        packer: &'static str,
        /// The key as given.
        name: String,
        /// The keys it does accept, comma-separated.
        known: String,
    },
    /// A known key with a value outside its allowed set.
    #[error("{packer}: parameter {name}={value:?} is not allowed (allowed: {allowed})")]
    BadParamValue {
        /// The packer's id.
        packer: &'static str,
        /// The parameter's key.
        name: &'static str,
        /// The value as given.
        value: String,
        /// The allowed values, comma-separated.
        allowed: String,
    },
    /// The packer has no kernel for the source's element type.
    #[error("{packer}: source data type {data_type} is not supported (supported: {supported})")]
    UnsupportedDataType {
        /// The packer's id.
        packer: &'static str,
        /// The source's element type.
        data_type: DataType,
        /// The element types it does accept.
        supported: &'static str,
    },
    /// The packer cannot lay out a source of this shape (rank, divisibility, ...).
    #[error("{packer}: source shape {dims:?} is not supported: {reason}")]
    BadShape {
        /// The packer's id.
        packer: &'static str,
        /// The source's dims.
        dims: Vec<u64>,
        /// What is wrong with them.
        reason: String,
    },
    /// The source holds a value the format cannot take (for example a NaN
    /// or an infinity where the reference's arithmetic is undefined).
    #[error("{packer}: {detail}")]
    BadValue {
        /// The packer's id.
        packer: &'static str,
        /// Which value (its index) and why.
        detail: String,
    },
    /// A buffer (source or output) has the wrong length for the shape.
    #[error("{what}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// Which buffer: `source data` or `output buffer`.
        what: &'static str,
        /// The length the shape calls for, in bytes.
        expected: u64,
        /// The length given, in bytes.
        actual: u64,
    },
    /// A size computed from the shape does not fit in 64 bits (or in memory).
    #[error("{packer}: sizes overflow for source shape {dims:?}")]
    Overflow {
        /// The packer's id.
        packer: &'static str,
        /// The source's dims.
        dims: Vec<u64>,
    },
    /// `pack_with` was asked for an instruction set this CPU lacks.
    #[error("instruction set {0} is not available on this CPU")]
    IsaUnavailable(Isa),
    /// No packer has this id.
    #[error("unknown packer {0:?}")]
    UnknownPacker(String),
}
