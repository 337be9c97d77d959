//! Where a cached payload's fields lie: the byte span, shape and element
//! type of each dense tensor field, read from the entry's physical type.

use super::weight::PackedWeight;
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::materialize::Target;
use crate::structs::{leaves, Leaf, LeafType, Limits};

/// Where one field of a payload lies.
#[derive(Debug, Clone, Copy)]
pub(super) struct Span {
    pub(super) offset: u64,
    pub(super) len: u64,
}

/// One dense, byte-aligned tensor field of a payload.
pub(super) struct Field {
    pub(super) span: Span,
    pub(super) shape: Vec<u64>,
    pub(super) data_type: DataType,
}

/// The entry is not a payload of `packer` for the target's weight.
pub(super) fn not_a_payload(t: &Target, packer: &str, what: String) -> Error {
    Error::Rewrite(format!(
        "materialize: the cache entry for {:?} is not an {packer} payload for this weight: {what}",
        t.weight
    ))
}

/// The fields of one payload; `bad` words what makes it unfit.
pub(super) struct PayloadFields<'a> {
    all: Vec<Leaf>,
    bad: &'a dyn Fn(String) -> Error,
}

impl<'a> PayloadFields<'a> {
    /// Every field of `w`'s entry.
    pub(super) fn read(w: &PackedWeight, bad: &'a dyn Fn(String) -> Error) -> Result<Self> {
        Ok(PayloadFields {
            all: leaves(&w.struct_type, &w.dims, &[], &Limits::default())?,
            bad,
        })
    }

    /// The dense, byte-aligned tensor field `name` (`None` when the type
    /// has no such field).
    pub(super) fn find(&self, name: &str) -> Result<Option<Field>> {
        let bad = self.bad;
        let Some(l) = self.all.iter().find(|l| l.path == name) else {
            return Ok(None);
        };
        let LeafType::Tensor(dt) = l.elem else {
            return Err(bad(format!("{name} is a packed-bits field")));
        };
        let width = l.bit_width();
        // Dense row-major, byte aligned: the field is one contiguous range.
        let mut stride = width;
        for (dim, got) in l.shape.iter().zip(&l.strides_bits).rev() {
            if *got != stride && *dim > 1 {
                return Err(bad(format!("{name} is not stored densely")));
            }
            stride = stride.saturating_mul(*dim);
        }
        if l.offset_bits % 8 != 0 || stride % 8 != 0 {
            return Err(bad(format!("{name} is not byte aligned")));
        }
        let span = Span {
            offset: l.offset_bits / 8,
            len: stride / 8,
        };
        Ok(Some(Field {
            span,
            shape: l.shape.clone(),
            data_type: dt,
        }))
    }

    /// The field `name`, which the payload must have.
    pub(super) fn get(&self, name: &str) -> Result<Field> {
        self.find(name)?
            .ok_or_else(|| (self.bad)(format!("no field {name}")))
    }
}
