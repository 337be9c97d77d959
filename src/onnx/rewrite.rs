//! The byte-preserving rewrite (D2): add, replace or strip the compiled
//! tensor fields (1000-1002) of a model by splicing top-level fields. Every
//! other byte of the model is copied as is, unknown fields included.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use crate::error::{Error, Result};
use crate::fsutil::atomic_write;
use crate::onnx::fields;
use crate::onnx::{Model, TopField};
use crate::outdir::OutFile;
use crate::pb;
use crate::wire::put_len_prefix;

mod embed;
mod sidecar;
pub use embed::{embed, embed_handed, embed_into};

/// One compiled tensor to embed.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    /// The initializer the entry compiles.
    pub source_name: String,
    /// The device the payload is for; equal devices are written once.
    pub device: pb::DeviceProto,
    /// A concrete, named declaration; it goes to `ModelProto.struct_types`.
    pub struct_type: pb::StructTypeProto,
    /// `StructProto.dims`, one per `dims_param`.
    pub dims: Vec<u64>,
    /// The payload bytes, written inline or to the sidecar.
    pub payload: Bytes,
    /// The source digest (D3) of the initializer.
    pub source_digest: Vec<u8>,
    /// The digest's algorithm name, e.g. `blake3`.
    pub digest_algorithm: String,
    /// The entry's metadata; the rewrite sets `ctcache.payload.blake3`
    /// itself (a value given here is replaced).
    pub metadata_props: Vec<pb::StringStringEntryProto>,
}

/// What happens to compiled tensors already in the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Keep them; new entries are appended (a duplicate cache key is an error).
    Add,
    /// Drop them; the model's compiled tensors become exactly the new set.
    Replace,
}

/// Where payloads go.
#[derive(Debug, Clone)]
pub struct RewriteOptions {
    /// Payloads at least this large go to the sidecar file.
    pub sidecar_threshold: u64,
    /// Put every payload in the sidecar.
    pub all_to_sidecar: bool,
}

impl Default for RewriteOptions {
    fn default() -> Self {
        RewriteOptions {
            sidecar_threshold: 1 << 20,
            all_to_sidecar: false,
        }
    }
}

/// Alignment of payloads in the sidecar file.
pub(crate) const SIDECAR_ALIGN: u64 = 4096;

/// What a rewrite wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// New entries written.
    pub entries: usize,
    /// Existing entries whose external payload was copied into the new
    /// sidecar (their own file is not beside the output).
    pub payloads_carried: usize,
    /// Struct types appended to `ModelProto.struct_types` (equal ones are shared).
    pub struct_types_added: usize,
    /// Devices appended to `ModelProto.devices`.
    pub devices_added: usize,
    /// Payload bytes written inline in the model.
    pub inline_bytes: u64,
    /// The sidecar file written, if any.
    pub sidecar: Option<PathBuf>,
    /// Payload bytes written to the sidecar.
    pub sidecar_bytes: u64,
    /// The sidecar was written to go into place before the model (it
    /// keeps the old one as its prefix); else the model goes first.
    pub sidecar_first: bool,
}

/// The sidecar file name used for `out` (`model.onnx` -> `model.onnx.ctdata`).
pub fn sidecar_name(out: &Path) -> Result<String> {
    out.file_name()
        .map(|n| format!("{}.ctdata", n.to_string_lossy()))
        .ok_or_else(|| Error::Rewrite(format!("{} has no file name", out.display())))
}

/// Writes the file `name` of `dir` whole (temp, fsync, rename), or, when
/// the caller `handed` a file it made for it, into that file (fsynced; the
/// caller renames it).
fn write_whole(
    dir: &crate::outdir::OutDir,
    name: &std::ffi::OsStr,
    handed: Option<&std::fs::File>,
    fill: impl FnOnce(&mut std::io::BufWriter<&std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let Some(file) = handed else {
        return dir.write(name, fill);
    };
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    fill(&mut w)?;
    w.flush()?;
    drop(w);
    file.sync_all()
}

pub(crate) fn encoded_field(out: &mut Vec<u8>, number: u32, msg: &impl Message) {
    put_len_prefix(out, number, msg.encoded_len() as u64);
    msg.encode_raw(out);
}

/// Copies the model's top-level fields that `keep` accepts, coalescing
/// adjacent spans into single writes; a field listed in `replaced` (by its
/// index in `top_fields`) is written as those bytes instead.
fn copy_fields(
    model: &Model,
    keep: impl Fn(&TopField) -> bool,
    replaced: &HashMap<usize, Vec<u8>>,
    w: &mut impl Write,
) -> std::io::Result<()> {
    let bytes = model.bytes();
    let mut run: Option<std::ops::Range<usize>> = None;
    for (i, f) in model.top_fields().iter().enumerate() {
        if !keep(f) {
            continue;
        }
        if let Some(new) = replaced.get(&i) {
            if let Some(r) = run.take() {
                w.write_all(&bytes[r])?;
            }
            w.write_all(new)?;
            continue;
        }
        run = Some(match run {
            Some(r) if r.end == f.span.start => r.start..f.span.end,
            Some(r) => {
                w.write_all(&bytes[r])?;
                f.span.clone()
            }
            None => f.span.clone(),
        });
    }
    if let Some(r) = run {
        w.write_all(&bytes[r])?;
    }
    super::ensure_intact([&bytes[..]])
}

fn not_compiled(f: &TopField) -> bool {
    !fields::is_compiled_field(f.number)
}

/// Writes `model` without its compiled-tensor fields.
pub fn strip(model: &Model, out: &Path) -> Result<()> {
    atomic_write(out, |w| {
        copy_fields(model, not_compiled, &HashMap::new(), w)
    })
}

/// [`strip`] into a folder already open (see [`crate::outdir`]).
pub fn strip_into(model: &Model, output: &OutFile) -> Result<()> {
    output
        .dir
        .write(&output.name, |w| {
            copy_fields(model, not_compiled, &HashMap::new(), w)
        })
        .map_err(|e| Error::write(output.path(), e))
}

/// Strips into memory (for tests and small models).
pub fn strip_to_vec(model: &Model) -> Vec<u8> {
    let mut v = Vec::with_capacity(model.bytes().len());
    copy_fields(model, not_compiled, &HashMap::new(), &mut v)
        .expect("writing to a Vec cannot fail");
    v
}
