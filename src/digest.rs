//! The canonical source digest (D3): `H(header || content)` over the tensor's
//! elements in raw form, whatever the storage method. Raw and external data
//! are hashed straight from the mapping (multi-threaded when large); typed
//! fields are decoded through a small reusable buffer.

use sha2::Digest as _;
use std::fmt;
use std::str::FromStr;

use crate::dtype::{DataType, TypedField};
use crate::error::{Error, Result};
use crate::onnx::{Model, Storage, TensorRef, Typed};
use crate::wire::read_varint;

/// A digest algorithm named by `CompiledTensorProto.digest_algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Algorithm {
    /// BLAKE3-256, the default.
    #[default]
    Blake3,
    /// SHA-256.
    Sha256,
}

impl Algorithm {
    /// The name written in `digest_algorithm`: `blake3` or `sha256`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Blake3 => "blake3",
            Algorithm::Sha256 => "sha256",
        }
    }

    /// Bytes of a digest of this algorithm.
    pub(crate) fn digest_len(self) -> usize {
        match self {
            Algorithm::Blake3 | Algorithm::Sha256 => 32,
        }
    }
}

impl FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "blake3" => Ok(Algorithm::Blake3),
            "sha256" => Ok(Algorithm::Sha256),
            other => Err(Error::UnknownAlgorithm(other.to_string())),
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A computed source digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SourceDigest {
    /// The algorithm that produced `bytes`.
    pub algorithm: Algorithm,
    /// The digest of the canonical raw form (D3).
    pub bytes: [u8; 32],
}

impl SourceDigest {
    /// The digest as lowercase hex (store keys and object names).
    pub fn hex(&self) -> String {
        hex::encode(self.bytes)
    }
}

impl fmt::Display for SourceDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm, self.hex())
    }
}

/// Inputs at least this large are hashed with blake3's multi-threaded mode.
const PARALLEL_THRESHOLD: usize = 1 << 20;
/// Buffer size for decoding typed fields into raw form.
const DECODE_CHUNK: usize = 64 * 1024;
/// Mapped bytes read between two releases of their pages (`feed_mapped`).
const RELEASE_WINDOW: usize = 32 << 20;

enum Hasher {
    Blake3(Box<blake3::Hasher>),
    Sha256(sha2::Sha256),
}

impl Hasher {
    fn new(alg: Algorithm) -> Hasher {
        match alg {
            Algorithm::Blake3 => Hasher::Blake3(Box::new(blake3::Hasher::new())),
            Algorithm::Sha256 => Hasher::Sha256(sha2::Sha256::new()),
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Blake3(h) if data.len() >= PARALLEL_THRESHOLD => {
                h.update_rayon(data);
            }
            Hasher::Blake3(h) => {
                h.update(data);
            }
            Hasher::Sha256(h) => h.update(data),
        }
    }

    fn finish(self) -> [u8; 32] {
        match self {
            Hasher::Blake3(h) => *h.finalize().as_bytes(),
            Hasher::Sha256(h) => h.finalize().into(),
        }
    }
}

/// The D3 header: u32le(data_type) || u32le(rank) || rank x u64le(dim).
pub fn header(data_type: DataType, dims: &[u64]) -> Vec<u8> {
    let mut h = Vec::with_capacity(8 + 8 * dims.len());
    h.extend_from_slice(&(data_type.code() as u32).to_le_bytes());
    h.extend_from_slice(&(dims.len() as u32).to_le_bytes());
    for d in dims {
        h.extend_from_slice(&d.to_le_bytes());
    }
    h
}

/// Mask for the last raw byte of `n` sub-byte elements (padding bits zeroed).
fn last_byte_mask(data_type: DataType, n: u64) -> u8 {
    let bits = data_type.bit_width().unwrap_or(8);
    if bits >= 8 {
        return 0xff;
    }
    let per_byte = 8 / bits;
    match n % per_byte {
        0 => 0xff,
        r => ((1u16 << (r * bits)) - 1) as u8,
    }
}

/// Feeds the canonical content of `t` to `sink` in order.
pub(crate) fn for_each_content_chunk(
    model: &Model,
    t: &TensorRef,
    sink: &mut dyn FnMut(&[u8]),
) -> Result<()> {
    match model.mapped_data(t)? {
        Some(data) => {
            feed_mapped(&data, last_byte_mask(t.data_type, t.elements), sink);
            if !crate::onnx::intact(&data) {
                return Err(Error::tensor(&t.name, crate::onnx::CUT_SHORT));
            }
            Ok(())
        }
        None => match &t.storage {
            Storage::Typed(typed) => decode_typed(model.bytes(), t, typed, sink),
            _ => unreachable!("mapped_data covers raw and external storage"),
        },
    }
}

/// Feeds mapped bytes `RELEASE_WINDOW` at a time, each window released
/// once the sink has it (`onnx::release`): hashing or copying a model of
/// several GiB keeps one window of it resident, not the model.
fn feed_mapped(data: &[u8], mask: u8, sink: &mut dyn FnMut(&[u8])) {
    let (body, last) = match data.split_last() {
        Some((&last, rest)) if mask != 0xff => (rest, Some(last & mask)),
        _ => (data, None),
    };
    for window in body.chunks(RELEASE_WINDOW) {
        sink(window);
        crate::onnx::release(window);
    }
    if let Some(last) = last {
        sink(&[last]);
    }
}

/// The canonical raw form of a tensor copied into private memory (STRING is
/// refused: it has no fixed-width raw form), with the padding bits of a
/// sub-byte last byte cleared as the digest sees them.
///
/// Hash and pack one such copy: a mapping of the model shows writes made to
/// the file later, so bytes read from it twice need not be the same bytes.
pub fn raw_copy(model: &Model, t: &TensorRef) -> Result<Vec<u8>> {
    let mut out = vec![0u8; raw_len(t)?];
    raw_copy_into(model, t, &mut out)?;
    Ok(out)
}

/// The length of `t`'s raw form in memory.
pub fn raw_len(t: &TensorRef) -> Result<usize> {
    let n = t
        .raw_size()
        .ok_or_else(|| Error::tensor(&t.name, "size overflows"))?;
    usize::try_from(n).map_err(|_| Error::tensor(&t.name, "too large"))
}

/// [`raw_copy`] into `out`, which holds exactly [`raw_len`] bytes (a
/// reused buffer: every byte is written).
pub fn raw_copy_into(model: &Model, t: &TensorRef, out: &mut [u8]) -> Result<()> {
    if t.data_type == DataType::STRING {
        return Err(Error::tensor(&t.name, "STRING tensors have no raw form"));
    }
    let mut at = 0usize;
    let mut fits = true;
    for_each_content_chunk(model, t, &mut |c| {
        match out.get_mut(at..at.saturating_add(c.len())) {
            Some(dst) => dst.copy_from_slice(c),
            None => fits = false,
        }
        at = at.saturating_add(c.len());
    })?;
    if !fits || at != out.len() {
        return Err(Error::tensor(
            &t.name,
            format!(
                "its raw form has {at} bytes, not the {} expected",
                out.len()
            ),
        ));
    }
    Ok(())
}

/// The D3 digest of a tensor's raw form held in memory (as [`raw_copy`]
/// returns it).
pub fn digest_raw(data_type: DataType, dims: &[u64], raw: &[u8], alg: Algorithm) -> SourceDigest {
    let mut d = RawDigest::new(data_type, dims, alg);
    d.update(raw);
    d.finish()
}

/// The D3 digest of a tensor's raw form fed in pieces (a payload as it
/// streams in).
pub struct RawDigest {
    hasher: Hasher,
    algorithm: Algorithm,
}

impl RawDigest {
    /// Starts the digest of a tensor of `data_type` and `dims`.
    pub fn new(data_type: DataType, dims: &[u64], algorithm: Algorithm) -> RawDigest {
        let mut hasher = Hasher::new(algorithm);
        hasher.update(&header(data_type, dims));
        RawDigest { hasher, algorithm }
    }

    /// Feeds the next raw bytes.
    pub fn update(&mut self, raw: &[u8]) {
        self.hasher.update(raw);
    }

    /// The digest of everything fed.
    pub fn finish(self) -> SourceDigest {
        SourceDigest {
            algorithm: self.algorithm,
            bytes: self.hasher.finish(),
        }
    }
}

/// Computes the D3 digest of one tensor.
pub fn digest_tensor(model: &Model, t: &TensorRef, alg: Algorithm) -> Result<SourceDigest> {
    let mut h = Hasher::new(alg);
    h.update(&header(t.data_type, &t.dims));
    for_each_content_chunk(model, t, &mut |c| h.update(c))?;
    Ok(SourceDigest {
        algorithm: alg,
        bytes: h.finish(),
    })
}

/// Digests of all given tensors, computed in parallel.
pub fn digest_all(
    model: &Model,
    tensors: &[TensorRef],
    alg: Algorithm,
) -> Vec<Result<SourceDigest>> {
    use rayon::prelude::*;
    tensors
        .par_iter()
        .map(|t| digest_tensor(model, t, alg))
        .collect()
}

/// Decodes a typed field into raw form, `DECODE_CHUNK` bytes at a time.
fn decode_typed(
    model: &[u8],
    t: &TensorRef,
    typed: &Typed,
    sink: &mut dyn FnMut(&[u8]),
) -> Result<()> {
    let dt = t.data_type;
    match typed.field {
        // Packed fixed-width floats are already in raw form.
        TypedField::Float | TypedField::Double => {
            for seg in &typed.segments {
                sink(&model[seg.clone()]);
            }
            Ok(())
        }
        TypedField::String => {
            for seg in &typed.segments {
                sink(&(seg.len() as u64).to_le_bytes());
                sink(&model[seg.clone()]);
            }
            Ok(())
        }
        TypedField::Int32 | TypedField::Int64 | TypedField::Uint64 => {
            let width = dt.typed_entry_bytes();
            let mut buf = Vec::with_capacity(DECODE_CHUNK);
            for seg in &typed.segments {
                let bytes = &model[seg.clone()];
                let mut pos = 0;
                while pos < bytes.len() {
                    let (v, next) = read_varint(bytes, pos)
                        .map_err(|_| Error::tensor(&t.name, "malformed varint in typed data"))?;
                    pos = next;
                    if buf.len() + width > DECODE_CHUNK {
                        sink(&buf);
                        buf.clear();
                    }
                    // Truncation to the element width keeps the bit pattern
                    // (sign-extended negatives included).
                    buf.extend_from_slice(&v.to_le_bytes()[..width]);
                }
            }
            if let Some(last) = buf.last_mut() {
                *last &= last_byte_mask(dt, t.elements);
            }
            sink(&buf);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout() {
        let h = header(DataType::FLOAT, &[2, 3]);
        assert_eq!(h.len(), 8 + 16);
        assert_eq!(&h[..8], &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(&h[8..16], &2u64.to_le_bytes());
    }

    #[test]
    fn masks() {
        assert_eq!(last_byte_mask(DataType::INT4, 3), 0x0f);
        assert_eq!(last_byte_mask(DataType::INT4, 4), 0xff);
        assert_eq!(last_byte_mask(DataType::INT2, 5), 0x03);
        assert_eq!(last_byte_mask(DataType::INT2, 7), 0x3f);
        assert_eq!(last_byte_mask(DataType::FLOAT, 7), 0xff);
    }

    #[test]
    fn algorithm_names() {
        assert_eq!("sha256".parse::<Algorithm>().unwrap(), Algorithm::Sha256);
        assert!("md5".parse::<Algorithm>().is_err());
    }
}
