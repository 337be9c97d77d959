//! What the formats that keep the source's shape element by element share
//! (`cast.f16`, `cast.bf16`, `ort.float16`, `identity`): one `values` field
//! of the payload's element type in the source shape (dims_param `d0..`),
//! decoded by one op, and the check that the source fits in memory.

use ctcache::dtype::DataType;
use ctcache::pb;

use crate::decoder::{Builder, OUTPUT};
use crate::error::PackError;
use crate::packer::PackedLayout;
use crate::struct_builders::{field, leaf, nested, root, size_bits, Count};

/// An element-by-element output type.
pub(crate) struct Elementwise<'a> {
    /// The type's name (also the decoder's).
    pub name: &'a str,
    pub packer: &'static str,
    pub version: u32,
    /// The payload's element type.
    pub elem: DataType,
    /// What the `values` field holds.
    pub values_doc: &'a str,
    /// The type's doc (the packer's description).
    pub doc: &'a str,
    /// The decoder's one op from `values` to the source, and its attributes.
    pub op: &'a str,
    pub attrs: Vec<pb::AttributeProto>,
}

impl Elementwise<'_> {
    /// The output type for a source of `dims`, and its payload length.
    pub(crate) fn layout(self, dims: &[u64]) -> Result<PackedLayout, PackError> {
        let names: Vec<String> = (0..dims.len()).map(|i| format!("d{i}")).collect();
        let dims_param: Vec<&str> = names.iter().map(String::as_str).collect();
        let counts: Vec<Count> = (0..dims.len() as u32).map(Count::Dim).collect();
        let mut t = root(
            self.name.to_string(),
            self.packer,
            self.version,
            &dims_param,
            vec![field(
                "values",
                nested(leaf(self.elem), &counts),
                self.values_doc,
            )],
            self.doc,
        );
        let mut f = Builder::new();
        f.op_to(self.op, &["values"], OUTPUT, self.attrs);
        t.decoder = Some(f.finish(self.name, &["values"]));
        let bits = size_bits(&t, dims).ok_or(PackError::Overflow {
            packer: self.packer,
            dims: dims.to_vec(),
        })?;
        Ok(PackedLayout {
            struct_type: t,
            dims: dims.to_vec(),
            payload_len: bits / 8,
        })
    }
}

/// Refuses a source of `dims` whose bytes (`width` per element) would not
/// fit in memory.
pub(crate) fn check_fits(packer: &'static str, dims: &[u64], width: u64) -> Result<(), PackError> {
    crate::util::numel(dims)
        .and_then(|n| n.checked_mul(width))
        .filter(|b| usize::try_from(*b).is_ok())
        .map(|_| ())
        .ok_or(PackError::Overflow {
            packer,
            dims: dims.to_vec(),
        })
}
