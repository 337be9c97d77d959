//! `identity`: the tensor's own bytes, any whole-byte element type, any
//! shape. What a rewritten model keeps unchanged but places beside it like
//! the packed weights (a transformer's embedding table): cached, it is
//! linked or copied from the store instead of written again.

use ctcache::dtype::DataType;

use super::elementwise::{check_fits, Elementwise};
use crate::error::PackError;
use crate::isa::Isa;
use crate::packer::{check_isa, check_lengths, PackedLayout, Packer, SourceTensor};
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
        let Some(width) = data_type.bit_width().filter(|b| b % 8 == 0) else {
            return Err(PackError::UnsupportedDataType {
                packer: ID,
                data_type,
                supported: "any type of whole bytes per element",
            });
        };
        check_fits(ID, dims, width / 8)
    }

    fn output(
        &self,
        data_type: DataType,
        dims: &[u64],
        params: &Params,
    ) -> Result<PackedLayout, PackError> {
        self.check_source(data_type, dims, params)?;
        Elementwise {
            name: ID,
            packer: ID,
            version: self.format_version(),
            elem: data_type,
            values_doc: "the source's elements, row-major",
            doc: self.describe(),
            op: "Identity",
            attrs: vec![],
        }
        .layout(dims)
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
