//! The byte-preserving rewrite (D2): add, replace or strip the compiled
//! tensor fields (1000-1002) of a model by splicing top-level fields. Every
//! other byte of the model is copied as is, unknown fields included.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use crate::check;
use crate::error::{Error, Result};
use crate::fsutil::atomic_write;
use crate::hit::{payload_checksum, PAYLOAD_BLAKE3_KEY};
use crate::onnx::fields::{self, MODEL_COMPILED_TENSORS, MODEL_DEVICES, MODEL_STRUCT_TYPES};
use crate::onnx::{ExternalRef, Model, TopField};
use crate::outdir::{OutDir, OutFile};
use crate::pb;
use crate::structs::{self, PhysicalTypeKey};
use crate::wire::put_len_prefix;

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
pub const SIDECAR_ALIGN: u64 = 4096;

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

/// The sidecar being built: an optional prefix (the output's current
/// sidecar, carried whole so that entries pointing into it stay right) and
/// payloads at 4096-aligned offsets after it.
struct Sidecar {
    name: String,
    path: PathBuf,
    prefix: Option<Bytes>,
    pieces: Vec<(u64, Bytes)>,
    len: u64,
}

impl Sidecar {
    /// Appends a payload; returns its `external_data`.
    fn push(&mut self, payload: Bytes) -> Vec<pb::StringStringEntryProto> {
        let offset = self.len.next_multiple_of(SIDECAR_ALIGN);
        self.len = offset + payload.len() as u64;
        let length = payload.len() as u64;
        self.pieces.push((offset, payload));
        ExternalRef {
            location: self.name.clone(),
            offset,
            length: Some(length),
        }
        .to_entries()
    }

    fn write(&self, dir: &OutDir) -> Result<()> {
        dir.write(self.name.as_ref(), |w| {
            let mut pos = 0u64;
            if let Some(p) = &self.prefix {
                w.write_all(p)?;
                pos = p.len() as u64;
            }
            for (offset, payload) in &self.pieces {
                std::io::copy(&mut std::io::repeat(0).take(offset - pos), w)?;
                w.write_all(payload)?;
                pos = offset + payload.len() as u64;
            }
            let copied = self.prefix.iter().chain(self.pieces.iter().map(|(_, p)| p));
            super::ensure_intact(copied.map(|b| &b[..]))
        })
        .map_err(|e| Error::write(&self.path, e))
    }
}

/// Whether `location`, read from the input model's folder and from the
/// output's, names the output's sidecar file (an existing one).
fn is_output_sidecar(model: &Model, location: &str, sidecar: &Path) -> bool {
    let Ok(target) = sidecar.canonicalize() else {
        return false;
    };
    let out_dir = match sidecar.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let r = ExternalRef {
        location: location.to_string(),
        offset: 0,
        length: None,
    };
    [model.dir(), out_dir].iter().all(|dir| {
        r.path_in(dir)
            .ok()
            .and_then(|p| p.canonicalize().ok())
            .is_some_and(|p| p == target)
    })
}

/// Sets `ctcache.payload.blake3` of an entry to the checksum of `payload`
/// (replacing any value given) — the one place entries get their checksum.
fn with_checksum(
    mut props: Vec<pb::StringStringEntryProto>,
    payload: &[u8],
) -> Vec<pb::StringStringEntryProto> {
    props.retain(|p| p.key != PAYLOAD_BLAKE3_KEY);
    props.push(pb::StringStringEntryProto {
        key: PAYLOAD_BLAKE3_KEY.into(),
        value: payload_checksum(payload),
    });
    props
}

/// The key the checker's `key.unique` rule uses: (source, device, type key).
type EntryKey = (String, i32, Option<PhysicalTypeKey>);

fn key_of(c: &pb::CompiledTensorProto, types: &[pb::StructTypeProto]) -> EntryKey {
    let ty = c
        .value
        .as_ref()
        .and_then(|v| structs::resolve_root(v, types).ok())
        .and_then(|t| structs::physical_type_key(t, types, &Default::default()).ok());
    (c.source_name.clone(), c.device, ty)
}

/// Embeds `entries` into `model`, writing the result to `out` (and large
/// payloads to a sidecar `<out>.ctdata` beside it).
///
/// With [`Mode::Add`] the entries already in the model stay right wherever
/// `out` is: entries whose payload is inline, or in the output's own current
/// sidecar (embedding in place), are copied as they are, and that sidecar is
/// carried whole into the new one; every other external payload is copied
/// into the new sidecar and its entry pointed there. Every entry written or
/// moved gets `ctcache.payload.blake3` (D9).
///
/// Both files are written to temp files and renamed. Which goes first is
/// chosen so that a crash between the two renames leaves no entry pointing
/// at the wrong bytes without a checksum to catch it: a sidecar that keeps
/// the old one as its prefix goes first (the old model stays right with
/// it); otherwise the model goes first (all its sidecar entries carry
/// checksums).
pub fn embed(
    model: &Model,
    entries: &[NewEntry],
    out: &Path,
    mode: Mode,
    opts: &RewriteOptions,
) -> Result<Report> {
    let output = OutFile::open(out).map_err(|e| Error::write(out, e))?;
    embed_into(model, entries, &output, mode, opts)
}

/// [`embed`] into a folder already open (see [`crate::outdir`]): what the
/// daemon uses to write for a caller.
pub fn embed_into(
    model: &Model,
    entries: &[NewEntry],
    output: &OutFile,
    mode: Mode,
    opts: &RewriteOptions,
) -> Result<Report> {
    let out = &output.path();
    let unreadable = |e: Error| {
        Error::Rewrite(format!(
            "the model's compiled tensors cannot be read ({e}); embed with replace to drop them"
        ))
    };
    // The model's own entries are decoded one at a time below, never all
    // at once (a field of a few bytes decodes to a much larger message).
    let (mut types, mut devices) = match mode {
        Mode::Add => model.extension_tables().map_err(unreadable)?,
        Mode::Replace => Default::default(),
    };
    if mode == Mode::Add {
        // Every entry decodes, before any payload is read for one of them.
        for (_, c) in model.compiled_tensors() {
            c.map_err(unreadable)?;
        }
    }
    // Devices by their encoding: a new entry finds its device at once
    // instead of comparing against each of up to 1M.
    let mut device_index: HashMap<Vec<u8>, usize> = HashMap::with_capacity(devices.len());
    for (i, d) in devices.iter().enumerate() {
        device_index.entry(d.encode_to_vec()).or_insert(i);
    }
    let mut report = Report::default();
    let mut tail = Vec::new();
    let sidecar_file = sidecar_name(out)?;
    let mut sidecar = Sidecar {
        path: out.with_file_name(&sidecar_file),
        name: sidecar_file,
        prefix: None,
        pieces: Vec::new(),
        len: 0,
    };
    let mut keys: HashSet<EntryKey> = HashSet::new();
    // Existing entries: keep the inline ones and those in the output's own
    // sidecar; copy every other external payload into the new sidecar.
    let mut replaced = HashMap::new();
    let existing = match mode {
        Mode::Add => Some(model.compiled_tensors()),
        Mode::Replace => None,
    };
    for (j, (field, c)) in existing.into_iter().flatten().enumerate() {
        let c = &c.map_err(unreadable)?;
        keys.insert(key_of(c, &types));
        let Some(value) = c.value.as_ref().filter(|v| !v.external_data.is_empty()) else {
            continue;
        };
        let cant = |why: String| {
            Error::Rewrite(format!(
                "compiled_tensors[{j}] ({:?}): its payload cannot be carried into {}: {why}; \
                 embed with replace to drop the model's compiled tensors",
                c.source_name,
                out.display()
            ))
        };
        let r = check::payload_ref(value).map_err(&cant)?;
        if is_output_sidecar(model, &r.location, &sidecar.path) {
            if sidecar.prefix.is_none() {
                let whole = model.external_file(&r).map_err(&cant)?;
                sidecar.len = whole.len() as u64;
                sidecar.prefix = Some(whole);
            }
            continue;
        }
        let payload = check::payload_bytes(model, value).map_err(&cant)?;
        let mut moved = c.clone();
        let v = moved.value.as_mut().expect("checked above");
        v.external_data
            .retain(|p| !matches!(p.key.as_str(), "location" | "offset" | "length"));
        let mut placed = sidecar.push(payload.clone());
        placed.append(&mut v.external_data);
        v.external_data = placed;
        // A checksum already there stays: the bytes are copied exactly.
        if structs::metadata(&moved.metadata_props, PAYLOAD_BLAKE3_KEY).is_none() {
            moved.metadata_props = with_checksum(moved.metadata_props, &payload);
        }
        let mut bytes = Vec::new();
        encoded_field(&mut bytes, MODEL_COMPILED_TENSORS, &moved);
        replaced.insert(field, bytes);
        report.payloads_carried += 1;
        report.sidecar_bytes += payload.len() as u64;
    }
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
        let device_index = match device_index.get(&e.device.encode_to_vec()) {
            Some(&i) => i,
            None => {
                devices.push(e.device.clone());
                encoded_field(&mut tail, MODEL_DEVICES, &e.device);
                report.devices_added += 1;
                device_index.insert(e.device.encode_to_vec(), devices.len() - 1);
                devices.len() - 1
            }
        };
        let key = (
            e.source_name.clone(),
            device_index as i32,
            structs::physical_type_key(&e.struct_type, &[], &Default::default()).ok(),
        );
        if !keys.insert(key) {
            return Err(Error::Rewrite(format!(
                "{:?} already has a compiled tensor of type {:?} for that device (use replace)",
                e.source_name, e.struct_type.name
            )));
        }
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
            value.external_data = sidecar.push(e.payload.clone());
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
            metadata_props: with_checksum(e.metadata_props.clone(), &e.payload),
        };
        encoded_field(&mut tail, MODEL_COMPILED_TENSORS, &compiled);
        report.entries += 1;
    }
    // Struct types and devices precede the entries that refer to them; all
    // new fields go after the model's own bytes, so existing repeated-field
    // order (and thus existing indices) is unchanged.
    let write_model = || {
        output
            .dir
            .write(&output.name, |w| {
                copy_fields(
                    model,
                    |f| mode == Mode::Add || !fields::is_compiled_field(f.number),
                    &replaced,
                    w,
                )?;
                w.write_all(&tail)
            })
            .map_err(|e| Error::write(out, e))
    };
    if sidecar.pieces.is_empty() {
        write_model()?;
    } else {
        if sidecar.prefix.is_some() {
            sidecar.write(&output.dir)?;
            write_model()?;
        } else {
            write_model()?;
            sidecar.write(&output.dir)?;
        }
        report.sidecar = Some(sidecar.path.clone());
    }
    Ok(report)
}

enum TypeRef {
    Index(usize),
    Inline,
}
