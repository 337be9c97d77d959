//! `identity`: the tensor's own bytes, any whole-byte element type, any
//! shape. What a rewritten model keeps unchanged but places beside it like
//! the packed weights (a transformer's embedding table): cached, it is
//! linked or copied from the store instead of written again.

use ctcache::dtype::DataType;

use crate::decoder::{Builder, OUTPUT};
use crate::isa::Isa;
use crate::layout::{field, leaf, nested, root, size_bits, Count};
use crate::packer::{check_isa, check_lengths, PackError, PackedLayout, Packer, SourceTensor};
use crate::params::{ParamSpec, Params};

/// The identity packer.
pub struct Identity;

/// Its id.
pub const ID: &str = "identity";

impl Packer for Identity {
    fn id(&self) -> &'static str {
        ID
    }

    fn format_version(&self) -> u32 {
        1
    }

    fn describe(&self) -> &'static str {
        "the source's own bytes (raw little-endian data, any whole-byte type and shape)"
    }

    fn param_spec(&self) -> &'static [ParamSpec] {
        &[]
    }

    fn check_source(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<(), PackError> {
        params.resolve(ID, &[])?;
        let width = data_type.bit_width().filter(|b| b % 8 == 0);
        if width.is_none() {
            return Err(PackError::UnsupportedDataType {
                packer: ID,
                data_type,
                supported: "any type of whole bytes per element",
            });
        }
        crate::util::numel(dims)
            .and_then(|n| n.checked_mul(width.unwrap_or(0) / 8))
            .filter(|b| usize::try_from(*b).is_ok())
            .map(|_| ())
            .ok_or(PackError::Overflow {
                packer: ID,
                dims: dims.to_vec(),
            })
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        self.check_source(data_type, dims, params)?;
        let names: Vec<String> = (0..dims.len()).map(|i| format!("d{i}")).collect();
        let dims_param: Vec<&str> = names.iter().map(String::as_str).collect();
        let counts: Vec<Count> = (0..dims.len() as u32).map(Count::Dim).collect();
        let mut t = root(
            ID.to_string(),
            ID,
            self.format_version(),
            &dims_param,
            vec![field(
                "values",
                nested(leaf(data_type), &counts),
                "the source's elements, row-major",
            )],
            self.describe(),
        );
        let mut f = Builder::new();
        f.op_to("Identity", &["values"], OUTPUT, vec![]);
        t.decoder = Some(f.finish(ID, &["values"]));
        let bits = size_bits(&t, dims).ok_or(PackError::Overflow {
            packer: ID,
            dims: dims.to_vec(),
        })?;
        Ok(PackedLayout {
            struct_type: t,
            dims: dims.to_vec(),
            payload_len: bits / 8,
        })
    }

    fn pack_with(
        &self,
        src: &SourceTensor<'_>,
        params: &Params,
        out: &mut [u8],
        isa: Isa,
    ) -> Result<(), PackError> {
        check_isa(isa)?;
        let layout = self.output(src.data_type, src.dims, params)?;
        check_lengths(src, out, layout.payload_len)?;
        out.copy_from_slice(src.data);
        Ok(())
    }
}
