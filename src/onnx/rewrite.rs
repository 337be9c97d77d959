//! The byte-preserving rewrite (D2): add, replace or strip the compiled
//! tensor fields (1000-1002) of a model by splicing top-level fields. Every
//! other byte of the model is copied as is, unknown fields included.

use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use crate::error::{Error, Result};
use crate::fsutil::atomic_write;
use crate::onnx::fields::{self, MODEL_COMPILED_TENSORS, MODEL_DEVICES, MODEL_STRUCT_TYPES};
use crate::onnx::{ExternalRef, Model, TopField};
use crate::pb;
use crate::wire::put_len_prefix;

/// One compiled tensor to embed.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEntry {
    pub source_name: String,
    pub device: pb::DeviceProto,
    /// A concrete, named declaration; it goes to `ModelProto.struct_types`.
    pub struct_type: pb::StructTypeProto,
    /// `StructProto.dims`, one per `dims_param`.
    pub dims: Vec<u64>,
    pub payload: Bytes,
    pub source_digest: Vec<u8>,
    pub digest_algorithm: String,
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
pub const SIDECAR_ALIGN: u64 = 4096;

/// What a rewrite wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub entries: usize,
    pub struct_types_added: usize,
    pub devices_added: usize,
    pub inline_bytes: u64,
    pub sidecar: Option<PathBuf>,
    pub sidecar_bytes: u64,
}

/// The sidecar file name used for `out` (`model.onnx` -> `model.onnx.ctdata`).
pub fn sidecar_name(out: &Path) -> Result<String> {
    out.file_name()
        .map(|n| format!("{}.ctdata", n.to_string_lossy()))
        .ok_or_else(|| Error::Rewrite(format!("{} has no file name", out.display())))
}

pub(crate) fn encoded_field(out: &mut Vec<u8>, number: u32, msg: &impl Message) {
    put_len_prefix(out, number, msg.encoded_len() as u64);
    msg.encode_raw(out);
}

/// Copies the model's top-level fields that `keep` accepts, coalescing
/// adjacent spans into single writes.
fn copy_fields(
    model: &Model,
    keep: impl Fn(&TopField) -> bool,
    w: &mut impl Write,
) -> std::io::Result<()> {
    let bytes = model.bytes();
    let mut run: Option<std::ops::Range<usize>> = None;
    for f in model.top_fields() {
        if keep(f) {
            run = Some(match run {
                Some(r) if r.end == f.span.start => r.start..f.span.end,
                Some(r) => {
                    w.write_all(&bytes[r])?;
                    f.span.clone()
                }
                None => f.span.clone(),
            });
        }
    }
    if let Some(r) = run {
        w.write_all(&bytes[r])?;
    }
    Ok(())
}

/// Writes `model` without its compiled-tensor fields.
pub fn strip(model: &Model, out: &Path) -> Result<()> {
    atomic_write(out, |w| {
        copy_fields(model, |f| !fields::is_compiled_field(f.number), w)
    })
}

/// Strips into memory (for tests and small models).
pub fn strip_to_vec(model: &Model) -> Vec<u8> {
    let mut v = Vec::with_capacity(model.bytes().len());
    copy_fields(model, |f| !fields::is_compiled_field(f.number), &mut v)
        .expect("writing to a Vec cannot fail");
    v
}

/// Embeds `entries` into `model`, writing the result to `out` (and large
/// payloads to a sidecar next to it).
pub fn embed(
    model: &Model,
    entries: &[NewEntry],
    out: &Path,
    mode: Mode,
    opts: &RewriteOptions,
) -> Result<Report> {
    let existing = match mode {
        Mode::Add => model.extension()?,
        Mode::Replace => Default::default(),
    };
    let mut types = existing.struct_types.clone();
    let mut devices = existing.devices.clone();
    let mut report = Report::default();
    let mut tail = Vec::new();
    let mut sidecar: Vec<(u64, Bytes)> = Vec::new();
    let mut sidecar_len = 0u64;
    let sidecar_file = sidecar_name(out)?;
    let mut keys: Vec<(String, i32, String)> = existing
        .compiled_tensors
        .iter()
        .map(|c| {
            let ty = c
                .value
                .as_ref()
                .and_then(|v| usize::try_from(v.r#type).ok())
                .and_then(|t| types.get(t))
                .map(|t| t.name.clone())
                .unwrap_or_default();
            (c.source_name.clone(), c.device, ty)
        })
        .collect();
    for e in entries {
        if e.struct_type.name.is_empty() {
            return Err(Error::Rewrite(format!(
                "{}: struct type has no name",
                e.source_name
            )));
        }
        // Model-level types are unique by name; a type whose name is taken by
        // a different declaration (e.g. a format with a shape-dependent
        // constant) is written inline in its value instead.
        let type_ref = match types.iter().position(|t| t.name == e.struct_type.name) {
            Some(i) if types[i] == e.struct_type => TypeRef::Index(i),
            Some(_) => TypeRef::Inline,
            None => {
                types.push(e.struct_type.clone());
                encoded_field(&mut tail, MODEL_STRUCT_TYPES, &e.struct_type);
                report.struct_types_added += 1;
                TypeRef::Index(types.len() - 1)
            }
        };
        let device_index = match devices.iter().position(|d| *d == e.device) {
            Some(i) => i,
            None => {
                devices.push(e.device.clone());
                encoded_field(&mut tail, MODEL_DEVICES, &e.device);
                report.devices_added += 1;
                devices.len() - 1
            }
        };
        let key = (
            e.source_name.clone(),
            device_index as i32,
            e.struct_type.name.clone(),
        );
        if keys.contains(&key) {
            return Err(Error::Rewrite(format!(
                "{:?} already has a compiled tensor of type {:?} for that device (use replace)",
                e.source_name, e.struct_type.name
            )));
        }
        keys.push(key);
        let to_sidecar = opts.all_to_sidecar || e.payload.len() as u64 >= opts.sidecar_threshold;
        let mut value = pb::StructProto {
            dims: e.dims.clone(),
            ..Default::default()
        };
        match type_ref {
            TypeRef::Index(i) => value.r#type = i as i32,
            TypeRef::Inline => {
                value.r#type = -1;
                value.struct_type = Some(e.struct_type.clone());
            }
        }
        if to_sidecar {
            let offset = sidecar_len.next_multiple_of(SIDECAR_ALIGN);
            sidecar_len = offset + e.payload.len() as u64;
            sidecar.push((offset, e.payload.clone()));
            value.external_data = ExternalRef {
                location: sidecar_file.clone(),
                offset,
                length: Some(e.payload.len() as u64),
            }
            .to_entries();
            report.sidecar_bytes += e.payload.len() as u64;
        } else {
            value.raw_data = e.payload.clone();
            report.inline_bytes += e.payload.len() as u64;
        }
        let compiled = pb::CompiledTensorProto {
            source_name: e.source_name.clone(),
            value: Some(value),
            device: device_index as i32,
            source_digest: Bytes::from(e.source_digest.clone()),
            digest_algorithm: e.digest_algorithm.clone(),
            metadata_props: e.metadata_props.clone(),
        };
        encoded_field(&mut tail, MODEL_COMPILED_TENSORS, &compiled);
        report.entries += 1;
    }
    if !sidecar.is_empty() {
        let path = out.with_file_name(&sidecar_file);
        atomic_write(&path, |w| {
            let mut pos = 0u64;
            for (offset, payload) in &sidecar {
                w.write_all(&vec![0u8; (offset - pos) as usize])?;
                w.write_all(payload)?;
                pos = offset + payload.len() as u64;
            }
            Ok(())
        })?;
        report.sidecar = Some(path);
    }
    // Struct types and devices precede the entries that refer to them; all
    // new fields go after the model's own bytes, so existing repeated-field
    // order (and thus existing indices) is unchanged.
    atomic_write(out, |w| {
        copy_fields(
            model,
            |f| mode == Mode::Add || !fields::is_compiled_field(f.number),
            w,
        )?;
        w.write_all(&tail)
    })?;
    Ok(report)
}

enum TypeRef {
    Index(usize),
    Inline,
}
