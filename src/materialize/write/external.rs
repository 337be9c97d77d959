//! The files the new model's external data lives in: the payload files
//! placed in `<out>.weights/` (reflinked, copied or linked), and the data of
//! the initializers it keeps copied there when the model changes folder.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::path::PathBuf;

use prost::Message;

use super::report::Report;
use super::weight::{PackedWeight, Source};
use crate::cancel::Cancel;
use crate::error::{Error, Result};
use crate::onnx::fields::GRAPH_INITIALIZER;
use crate::onnx::rewrite::encoded_field;
use crate::onnx::{ExternalRef, Storage};
use crate::outdir::{OutDir, OutFile};
use crate::pb;
use ctcache_files::answer::data_folder_name;
use ctcache_files::place::{place, LinkMode, Method, Placed};

/// Name of the file holding kept initializers' external data (below).
const KEPT_DATA: &str = "kept.data";

/// Alignment of kept tensors in `kept.data` (any element type reads aligned).
const KEPT_ALIGN: u64 = 64;

/// The folder beside the output model that its external data lives in.
pub(super) struct DataFolder<'a> {
    output: &'a OutFile,
    /// `<out>.weights`: the new model's locations start with it.
    name: String,
}

/// A data folder with every file the new model points into.
pub(super) struct Filled<'a> {
    dir: OutDir,
    /// This call made the folder (so a failure removes it and what it holds).
    made_dir: bool,
    /// The folder it is in, and its name there.
    parent: &'a OutDir,
    name: &'a str,
    /// Kept initializers re-encoded to point into `kept.data`, by
    /// initializer index.
    pub(super) relocated: HashMap<usize, Vec<u8>>,
    /// The files that belong to the new model.
    keep: Vec<OsString>,
}

impl Filled<'_> {
    /// Removes the files this call placed, and the folder when it made it:
    /// the model that would have pointed into them was not written.
    pub(super) fn discard(self, report: &Report) {
        if self.made_dir {
            remove_placed(&self.dir, report);
            let _ = self.parent.remove_dir(self.name.as_ref());
        }
    }

    /// Removes files an earlier materialize to this path left behind.
    pub(super) fn prune(&self) {
        let keep: Vec<&OsStr> = self.keep.iter().map(OsString::as_os_str).collect();
        let _ = self.dir.prune(&keep);
        // Nothing placed (every weight is in the model): no folder of none.
        if keep.is_empty() {
            let _ = self.parent.remove_dir(self.name.as_ref());
        }
    }
}

/// The kept initializers' data as laid out in `kept.data`.
struct KeptData {
    /// Each tensor's data at its offset.
    parts: Vec<(u64, bytes::Bytes)>,
    /// The file's length.
    len: u64,
    /// The initializers re-encoded to point there, by initializer index.
    encoded: HashMap<usize, Vec<u8>>,
}

impl<'a> DataFolder<'a> {
    /// The data folder of `output`.
    pub(super) fn of(output: &'a OutFile) -> Self {
        DataFolder {
            output,
            name: data_folder_name(&output.name),
        }
    }

    /// Its name, as locations in the new model start.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// Its path, as reports and errors show it.
    pub(super) fn shown(&self) -> PathBuf {
        self.output.dir.shown(self.name.as_ref())
    }

    /// Places the payload `files` and the data of the kept initializers
    /// (those not `dropped`), noting each file in `report`. What a failure
    /// leaves half done is removed: only what this call made.
    pub(super) fn fill(
        &self,
        src: &Source<'_>,
        files: &[&PackedWeight],
        dropped: &HashSet<&str>,
        mode: LinkMode,
        cancel: &Cancel,
        report: &mut Report,
    ) -> Result<Filled<'_>> {
        let (dir, made_dir) = self
            .output
            .dir
            .subdir(self.name.as_ref())
            .map_err(|e| Error::write(self.shown(), e))?;
        let placed = place_all(files, &dir, mode, cancel, report)
            .and_then(|()| cancel.check())
            .and_then(|()| self.relocate_external(src, dropped, &dir, report));
        let relocated = match placed {
            Ok(r) => r,
            Err(e) => {
                if made_dir {
                    remove_placed(&dir, report);
                    let _ = self.output.dir.remove_dir(self.name.as_ref());
                }
                return Err(e);
            }
        };
        let mut keep: Vec<OsString> = files.iter().map(|w| (&w.file_name).into()).collect();
        if !relocated.is_empty() {
            keep.push(KEPT_DATA.into());
        }
        dir.sync().map_err(|e| Error::write(self.shown(), e))?;
        Ok(Filled {
            dir,
            made_dir,
            parent: &self.output.dir,
            name: &self.name,
            relocated,
            keep,
        })
    }

    /// External data of the initializers the new model keeps, when it
    /// lives in another folder (locations are relative to the model's
    /// folder). Their bytes are copied into `<out>.weights/kept.data` and
    /// the initializers re-encoded to point there: linking the user's own
    /// data file instead would tie the new model to a mutable file and give
    /// that file a second link (which onnx.load then refuses, for the
    /// original model too). Returns the re-encoded initializer fields by
    /// initializer index.
    fn relocate_external(
        &self,
        src: &Source<'_>,
        dropped: &HashSet<&str>,
        dir: &OutDir,
        report: &mut Report,
    ) -> Result<HashMap<usize, Vec<u8>>> {
        if fs::canonicalize(src.model.dir()).ok() == fs::canonicalize(self.output.dir.path()).ok() {
            return Ok(HashMap::new());
        }
        let kept = kept_data(src, dropped, &format!("{}/{KEPT_DATA}", self.name))?;
        if kept.parts.is_empty() {
            return Ok(kept.encoded);
        }
        let path = dir.shown(KEPT_DATA.as_ref());
        dir.write(KEPT_DATA.as_ref(), |w| {
            let mut pos = 0u64;
            for (offset, data) in &kept.parts {
                w.write_all(&vec![0u8; (offset - pos) as usize])?;
                w.write_all(data)?;
                // Written: its mapped pages need not stay resident.
                crate::onnx::release(data);
                pos = offset + data.len() as u64;
            }
            crate::onnx::ensure_intact(kept.parts.iter().map(|(_, d)| &d[..]))
        })
        .map_err(|e| Error::write(&path, e))?;
        report.files.push(Placed {
            path,
            method: Method::Copy,
            bytes_copied: kept.len,
        });
        report.bytes_copied += kept.len;
        Ok(kept.encoded)
    }
}

/// Removes the files `report` says were placed in `dir`.
fn remove_placed(dir: &OutDir, report: &Report) {
    for f in &report.files {
        let _ = dir.remove(f.path.file_name().unwrap_or_default());
    }
}

/// Places every payload file in the weights folder, noting each in `report`.
fn place_all(
    files: &[&PackedWeight],
    dir: &OutDir,
    mode: LinkMode,
    cancel: &Cancel,
    report: &mut Report,
) -> Result<()> {
    for w in files {
        cancel.check()?;
        let p = place(
            &w.payload_path,
            w.checked
                .as_deref()
                .map(|p| p as &dyn ctcache_files::place::Checked),
            dir,
            OsStr::new(&w.file_name),
            mode,
        )?;
        report.bytes_copied += p.bytes_copied;
        report.files.push(p);
    }
    Ok(())
}

/// Every initializer the new model keeps with external data: its index,
/// its data (mapped) and its proto as the source has it.
fn kept_external(
    src: &Source<'_>,
    dropped: &HashSet<&str>,
) -> Result<Vec<(usize, bytes::Bytes, pb::TensorProto)>> {
    let model = src.model;
    let ranges = model.graph_fields(GRAPH_INITIALIZER)?;
    let mut kept = Vec::new();
    for (i, t) in src.initializers.iter().enumerate() {
        if dropped.contains(t.name.as_str()) || !matches!(t.storage, Storage::External(_)) {
            continue;
        }
        let data = model
            .mapped_data(t)?
            .ok_or_else(|| Error::external(&t.name, "no data"))?;
        let proto = pb::TensorProto::decode(&model.bytes()[ranges[i].clone()])
            .map_err(|e| Error::decode("TensorProto", e))?;
        kept.push((i, data, proto));
    }
    Ok(kept)
}

/// The bytes the kept initializers with external data declare (what
/// inlining them would copy), read from their sizes, not their data.
pub(super) fn kept_external_len(src: &Source<'_>, dropped: &HashSet<&str>) -> Result<u64> {
    let mut total = 0u64;
    for t in &src.initializers {
        if dropped.contains(t.name.as_str()) || !matches!(t.storage, Storage::External(_)) {
            continue;
        }
        let size = t
            .raw_size()
            .ok_or_else(|| Error::tensor(&t.name, "size overflows"))?;
        total = total.saturating_add(size);
    }
    Ok(total)
}

/// The bytes of the source's initializer fields that the new model drops
/// (the splice leaves them out): what its size is below the source's.
pub(super) fn dropped_len(src: &Source<'_>, dropped: &HashSet<&str>) -> Result<u64> {
    let ranges = src.model.graph_fields(GRAPH_INITIALIZER)?;
    Ok(src
        .initializers
        .iter()
        .zip(&ranges)
        .filter(|(t, _)| dropped.contains(t.name.as_str()))
        .map(|(_, r)| r.len() as u64)
        .sum())
}

/// The data of every kept initializer with external data, laid out
/// aligned, and the initializer re-encoded to point at `location`.
fn kept_data(src: &Source<'_>, dropped: &HashSet<&str>, location: &str) -> Result<KeptData> {
    let mut kept = KeptData {
        parts: Vec::new(),
        len: 0,
        encoded: HashMap::new(),
    };
    for (i, data, mut proto) in kept_external(src, dropped)? {
        let offset = kept.len.next_multiple_of(KEPT_ALIGN);
        kept.len = offset + data.len() as u64;
        proto.external_data = ExternalRef {
            location: location.into(),
            offset,
            length: Some(data.len() as u64),
        }
        .to_entries();
        let mut field = Vec::new();
        encoded_field(&mut field, GRAPH_INITIALIZER, &proto);
        kept.encoded.insert(i, field);
        kept.parts.push((offset, data));
    }
    Ok(kept)
}

/// Every kept initializer with external data re-encoded with its bytes
/// inline (an in-memory model reads no file of the source's), by
/// initializer index.
pub(super) fn inline_kept(
    src: &Source<'_>,
    dropped: &HashSet<&str>,
) -> Result<HashMap<usize, Vec<u8>>> {
    let mut inlined = HashMap::new();
    for (i, data, mut proto) in kept_external(src, dropped)? {
        proto.external_data.clear();
        proto.data_location = pb::tensor_proto::DataLocation::Default as i32;
        proto.raw_data = data.to_vec().into();
        crate::onnx::ensure_intact([&data[..]])
            .map_err(|e| Error::io(src.model.path().unwrap_or(src.model.dir()), e))?;
        crate::onnx::release(&data);
        let mut field = Vec::new();
        encoded_field(&mut field, GRAPH_INITIALIZER, &proto);
        inlined.insert(i, field);
    }
    Ok(inlined)
}
