//! ctcache packers: turn a source tensor (canonical raw form) into a
//! compiled payload whose layout is a named, versioned `StructTypeProto`
//! (D4), byte-identical with the reference tools of each format.
//!
//! Every packer implements [`Packer`]; [`catalogue`] lists them and [`find`]
//! looks one up by id.

#![deny(missing_docs)]

pub mod buffer;
pub mod compile;
pub mod copies;
pub mod decoder;
pub mod device;
pub mod error;
pub mod formats;
pub mod fp16;
pub mod gpu;
pub mod isa;
pub mod packer;
pub mod params;
pub mod registry;
pub mod struct_builders;
mod util;

pub use buffer::OutputBuffer;
pub use error::PackError;
pub use gpu::{pack_on, Backend};
pub use isa::Isa;
pub use packer::{Orientation, PackedLayout, Packer, SourceTensor};
pub use params::{ParamSpec, Params};

static CATALOGUE: [&dyn Packer; 9] = [
    &formats::matmul_nbits::MatMulNbits,
    &formats::ggml::Q8_0,
    &formats::ggml::Q4_0,
    &formats::cast::F16,
    &formats::cast::BF16,
    &formats::gemm_pack_b::GemmPackB,
    &formats::quantize_dynamic::QuantizeDynamic,
    &formats::float16_clamp::Float16Clamp,
    &formats::identity::Identity,
];

/// Every packer of this build.
pub fn catalogue() -> &'static [&'static dyn Packer] {
    &CATALOGUE
}

/// The packer with this id.
pub fn find(id: &str) -> Option<&'static dyn Packer> {
    CATALOGUE.iter().copied().find(|p| p.id() == id)
}

/// Convenience: validates, allocates the payload and packs with the best
/// kernel. Returns the layout and the payload (a plain `Vec`; `compile`
/// packs into an [`OutputBuffer`], huge pages for large payloads).
pub fn pack_to_vec(
    packer: &dyn Packer,
    src: &SourceTensor<'_>,
    params: &Params,
) -> Result<(PackedLayout, Vec<u8>), PackError> {
    let layout = packer.output(src.data_type, src.dims, params)?;
    let mut out = vec![0u8; util::us(layout.payload_len)];
    packer.pack(src, params, &mut out)?;
    Ok((layout, out))
}
