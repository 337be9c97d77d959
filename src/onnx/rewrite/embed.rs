//! Embedding compiled tensors into a model: the model's struct type and
//! device tables grown as entries need them, existing entries' payloads
//! carried along, new fields appended after the model's own bytes.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use prost::Message;

use super::sidecar::{is_output_sidecar, Sidecar};
use super::{copy_fields, encoded_field, Mode, NewEntry, Report, RewriteOptions};
use crate::check::{self, PayloadError};
use crate::error::{Error, Result};
use crate::hit::{payload_checksum, PAYLOAD_BLAKE3_KEY};
use crate::onnx::fields::{self, MODEL_COMPILED_TENSORS, MODEL_DEVICES, MODEL_STRUCT_TYPES};
use crate::onnx::{ExternalRef, Model, Storage};
use crate::outdir::{OutDir, OutFile};
use crate::pb;
use crate::structs::{self, PhysicalTypeKey};

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

/// [`embed`] into a folder already open (see [`crate::outdir`]).
pub fn embed_into(
    model: &Model,
    entries: &[NewEntry],
    output: &OutFile,
    mode: Mode,
    opts: &RewriteOptions,
) -> Result<Report> {
    embed_to(model, entries, output, None, mode, opts)
}

/// [`embed_into`] the files the caller made for the output, its model and
/// its sidecar (`files`, empty, open for writing): they are written and
/// fsynced, never renamed; the caller puts them in place, the sidecar first
/// when [`Report::sidecar_first`] says so. `output` is the output's open
/// folder and name, read only (what the model's data files and sidecar
/// need there).
pub fn embed_handed(
    model: &Model,
    entries: &[NewEntry],
    output: &OutFile,
    files: (&File, &File),
    mode: Mode,
    opts: &RewriteOptions,
) -> Result<Report> {
    embed_to(model, entries, output, Some(files), mode, opts)
}

fn embed_to(
    model: &Model,
    entries: &[NewEntry],
    output: &OutFile,
    handed: Option<(&File, &File)>,
    mode: Mode,
    opts: &RewriteOptions,
) -> Result<Report> {
    refuse_moved_external_data(model, &output.dir)?;
    let mut splice = Splice::start(model, output, mode)?;
    if mode == Mode::Add {
        splice.carry_existing()?;
    }
    for e in entries {
        splice.add(e, opts)?;
    }
    splice.write(output, handed, mode)
}

/// The output keeps the model's bytes, external-data locations included
/// (relative to the model's folder): refuses an output folder that lacks a
/// file an initializer's data lies in, which the new model would not find
/// (the model's own folder has them; another may be given copies).
fn refuse_moved_external_data(model: &Model, dir: &OutDir) -> Result<()> {
    let missing = model
        .initializers()?
        .into_iter()
        .find_map(|t| match t.storage {
            Storage::External(r) if !has_data_file(dir, &r) => Some((t.name, r.location)),
            _ => None,
        });
    match missing {
        None => Ok(()),
        Some((name, location)) => Err(Error::Rewrite(format!(
            "embed: initializer {name:?} keeps its data in {location:?} beside the model, \
             which {} does not have: write the output in the model's folder, or copy the file there first",
            dir.path().display()
        ))),
    }
}

/// Whether the output folder has the file `r` names, looked for beneath
/// it only: the location is the model's and the folder may be a caller's,
/// so nothing outside it is probed (a location leaving the folder, or a
/// link out of it, is no file there).
fn has_data_file(dir: &OutDir, r: &ExternalRef) -> bool {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let Ok(rel) = r.path_in(Path::new("")) else {
        return false;
    };
    let how = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(
        dir,
        &rel,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        how,
    ) {
        // Kernels before 5.6: a file right in the folder only.
        Err(rustix::io::Errno::NOSYS) => {
            rel.components().count() == 1 && dir.stat(rel.as_os_str()).is_ok()
        }
        found => found.is_ok(),
    }
}

/// Why the model's own entries stop an embed that keeps them.
fn unreadable(e: Error) -> Error {
    Error::Rewrite(format!(
        "the model's compiled tensors cannot be read ({e}); embed with replace to drop them"
    ))
}

/// Where a new entry's struct type is declared.
enum TypeRef {
    /// `ModelProto.struct_types[i]`.
    Index(usize),
    /// In the entry's value (the name is taken by another declaration).
    Inline,
}

/// An embed in progress: the model's tables as they grow, the fields to
/// write, the sidecar, and the cache keys already taken.
struct Splice<'m> {
    model: &'m Model,
    /// The output model file.
    out: PathBuf,
    /// Its open folder.
    out_dir: &'m OutDir,
    types: Vec<pb::StructTypeProto>,
    devices: Vec<pb::DeviceProto>,
    /// Devices by their encoding: a new entry finds its device at once
    /// instead of comparing against each of up to 1M.
    device_index: HashMap<Vec<u8>, usize>,
    keys: HashSet<EntryKey>,
    /// Existing entries written anew (their payload moved), by their index
    /// in the model's top-level fields.
    replaced: HashMap<usize, Vec<u8>>,
    /// The new fields, written after the model's own bytes.
    tail: Vec<u8>,
    sidecar: Sidecar,
    report: Report,
}

impl<'m> Splice<'m> {
    /// Reads the tables new entries join (none with [`Mode::Replace`]);
    /// with [`Mode::Add`] every existing entry must decode, before any
    /// payload is read for one of them.
    fn start(model: &'m Model, output: &'m OutFile, mode: Mode) -> Result<Self> {
        let out = output.path();
        // The model's own entries are decoded one at a time, never all at
        // once (a field of a few bytes decodes to a much larger message).
        let (types, devices) = match mode {
            Mode::Add => {
                let tables = model.extension_tables().map_err(unreadable)?;
                for (_, c) in model.compiled_tensors() {
                    c.map_err(unreadable)?;
                }
                tables
            }
            Mode::Replace => Default::default(),
        };
        let mut device_index = HashMap::with_capacity(devices.len());
        for (i, d) in devices.iter().enumerate() {
            device_index.entry(d.encode_to_vec()).or_insert(i);
        }
        Ok(Splice {
            model,
            sidecar: Sidecar::for_output(&out)?,
            out,
            out_dir: &output.dir,
            types,
            devices,
            device_index,
            keys: HashSet::new(),
            replaced: HashMap::new(),
            tail: Vec::new(),
            report: Report::default(),
        })
    }

    /// Takes the existing entries' keys, and carries their external
    /// payloads (see [`Splice::carry`]).
    fn carry_existing(&mut self) -> Result<()> {
        let model = self.model;
        for (j, (field, c)) in model.compiled_tensors().enumerate() {
            let c = &c.map_err(unreadable)?;
            self.keys.insert(key_of(c, &self.types));
            let Some(value) = c.value.as_ref().filter(|v| !v.external_data.is_empty()) else {
                continue;
            };
            self.carry(field, c, value).map_err(|why| {
                Error::Rewrite(format!(
                    "compiled_tensors[{j}] ({:?}): its payload cannot be carried into {}: \
                     {why}; embed with replace to drop the model's compiled tensors",
                    c.source_name,
                    self.out.display()
                ))
            })?;
        }
        Ok(())
    }

    /// Carries the external payload of existing entry `c` (top-level field
    /// `field`): one in the output's own sidecar stays where it is, that
    /// sidecar becoming the new one's prefix; any other is copied into the
    /// new sidecar and the entry pointed there.
    fn carry(
        &mut self,
        field: usize,
        c: &pb::CompiledTensorProto,
        value: &pb::StructProto,
    ) -> Result<(), PayloadError> {
        let r = check::payload_ref(value)?;
        if is_output_sidecar(self.model, &r.location, self.out_dir, self.sidecar.name()) {
            if self.sidecar.prefix.is_none() {
                let whole = self.model.external_file(&r)?;
                self.sidecar.carry_prefix(whole);
            }
            return Ok(());
        }
        let payload = check::payload_bytes(self.model, value)?;
        let mut moved = c.clone();
        let v = moved.value.as_mut().expect("an external value");
        v.external_data
            .retain(|p| !matches!(p.key.as_str(), "location" | "offset" | "length"));
        let mut placed = self.sidecar.push(payload.clone());
        placed.append(&mut v.external_data);
        v.external_data = placed;
        // A checksum already there stays: the bytes are copied exactly.
        if structs::metadata(&moved.metadata_props, PAYLOAD_BLAKE3_KEY).is_none() {
            moved.metadata_props = with_checksum(moved.metadata_props, &payload);
        }
        let mut bytes = Vec::new();
        encoded_field(&mut bytes, MODEL_COMPILED_TENSORS, &moved);
        self.replaced.insert(field, bytes);
        self.report.payloads_carried += 1;
        self.report.sidecar_bytes += payload.len() as u64;
        Ok(())
    }

    /// Appends one new entry (and its type and device when new), refusing
    /// one whose cache key is taken.
    fn add(&mut self, e: &NewEntry, opts: &RewriteOptions) -> Result<()> {
        if e.struct_type.name.is_empty() {
            return Err(Error::Rewrite(format!(
                "{}: struct type has no name",
                e.source_name
            )));
        }
        let type_ref = self.type_ref(&e.struct_type);
        let device = self.device(&e.device);
        let key = (
            e.source_name.clone(),
            device as i32,
            structs::physical_type_key(&e.struct_type, &[], &Default::default()).ok(),
        );
        if !self.keys.insert(key) {
            return Err(Error::Rewrite(format!(
                "{:?} already has a compiled tensor of type {:?} for that device (use replace)",
                e.source_name, e.struct_type.name
            )));
        }
        let compiled = pb::CompiledTensorProto {
            source_name: e.source_name.clone(),
            value: Some(self.value(e, type_ref, opts)),
            device: device as i32,
            source_digest: Bytes::from(e.source_digest.clone()),
            digest_algorithm: e.digest_algorithm.clone(),
            metadata_props: with_checksum(e.metadata_props.clone(), &e.payload),
        };
        encoded_field(&mut self.tail, MODEL_COMPILED_TENSORS, &compiled);
        self.report.entries += 1;
        Ok(())
    }

    /// Where `ty` is declared: model-level types are unique by name, so a
    /// type whose name is taken by a different declaration (e.g. a format
    /// with a shape-dependent constant) is written inline in its value.
    fn type_ref(&mut self, ty: &pb::StructTypeProto) -> TypeRef {
        match self.types.iter().position(|t| t.name == ty.name) {
            Some(i) if self.types[i] == *ty => TypeRef::Index(i),
            Some(_) => TypeRef::Inline,
            None => {
                self.types.push(ty.clone());
                encoded_field(&mut self.tail, MODEL_STRUCT_TYPES, ty);
                self.report.struct_types_added += 1;
                TypeRef::Index(self.types.len() - 1)
            }
        }
    }

    /// The index of `device` in the device table, appended when new.
    fn device(&mut self, device: &pb::DeviceProto) -> usize {
        if let Some(&i) = self.device_index.get(&device.encode_to_vec()) {
            return i;
        }
        self.devices.push(device.clone());
        encoded_field(&mut self.tail, MODEL_DEVICES, device);
        self.report.devices_added += 1;
        self.device_index
            .insert(device.encode_to_vec(), self.devices.len() - 1);
        self.devices.len() - 1
    }

    /// The value of new entry `e`: its type, dims and payload, placed
    /// inline or in the sidecar.
    fn value(&mut self, e: &NewEntry, type_ref: TypeRef, opts: &RewriteOptions) -> pb::StructProto {
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
        let to_sidecar = opts.all_to_sidecar || e.payload.len() as u64 >= opts.sidecar_threshold;
        if to_sidecar {
            value.external_data = self.sidecar.push(e.payload.clone());
            self.report.sidecar_bytes += e.payload.len() as u64;
        } else {
            value.raw_data = e.payload.clone();
            self.report.inline_bytes += e.payload.len() as u64;
        }
        value
    }

    /// Writes the model and the sidecar, in the order [`embed`] explains.
    fn write(
        mut self,
        output: &OutFile,
        handed: Option<(&File, &File)>,
        mode: Mode,
    ) -> Result<Report> {
        let (model_file, sidecar_file) = (handed.map(|h| h.0), handed.map(|h| h.1));
        // Struct types and devices precede the entries that refer to them;
        // all new fields go after the model's own bytes, so existing
        // repeated-field order (and thus existing indices) is unchanged.
        let write_model = || {
            super::write_whole(&output.dir, &output.name, model_file, |w| {
                copy_fields(
                    self.model,
                    |f| mode == Mode::Add || !fields::is_compiled_field(f.number),
                    &self.replaced,
                    w,
                )?;
                w.write_all(&self.tail)
            })
            .map_err(|e| Error::write(&self.out, e))
        };
        if self.sidecar.pieces.is_empty() {
            write_model()?;
        } else {
            self.report.sidecar_first = self.sidecar.prefix.is_some();
            if self.report.sidecar_first {
                self.sidecar.write(&output.dir, sidecar_file)?;
                write_model()?;
            } else {
                write_model()?;
                self.sidecar.write(&output.dir, sidecar_file)?;
            }
            self.report.sidecar = Some(self.sidecar.path.clone());
        }
        Ok(self.report)
    }
}
