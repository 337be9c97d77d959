//! The sidecar file an embed writes beside its output: payloads at
//! 4096-aligned offsets, after the output's current sidecar when entries
//! still point into it.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::SIDECAR_ALIGN;
use crate::error::{Error, Result};
use crate::onnx::{ExternalRef, Model};
use crate::outdir::OutDir;
use crate::pb;

/// The sidecar being built: an optional prefix (the output's current
/// sidecar, carried whole so that entries pointing into it stay right) and
/// payloads at 4096-aligned offsets after it.
pub(super) struct Sidecar {
    name: String,
    /// The sidecar file.
    pub(super) path: PathBuf,
    /// The output's current sidecar, carried whole.
    pub(super) prefix: Option<Bytes>,
    /// The payloads after it, by offset.
    pub(super) pieces: Vec<(u64, Bytes)>,
    len: u64,
}

impl Sidecar {
    /// Its file name beside the output.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    /// An empty sidecar for the output `out`: `<out>.ctdata` beside it.
    pub(super) fn for_output(out: &Path) -> Result<Sidecar> {
        let name = super::sidecar_name(out)?;
        Ok(Sidecar {
            path: out.with_file_name(&name),
            name,
            prefix: None,
            pieces: Vec::new(),
            len: 0,
        })
    }

    /// Starts the sidecar with the output's current one, carried whole
    /// (before any payload is pushed).
    pub(super) fn carry_prefix(&mut self, whole: Bytes) {
        self.len = whole.len() as u64;
        self.prefix = Some(whole);
    }

    /// Appends a payload; returns its `external_data`.
    pub(super) fn push(&mut self, payload: Bytes) -> Vec<pb::StringStringEntryProto> {
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

    /// Writes the sidecar: a file `dir` makes, or the `handed` one.
    pub(super) fn write(&self, dir: &OutDir, handed: Option<&File>) -> Result<()> {
        super::write_whole(dir, self.name.as_ref(), handed, |w| {
            let mut pos = 0u64;
            // Mapped payloads give their pages back once written, so a
            // large model does not stay resident.
            if let Some(p) = &self.prefix {
                w.write_all(p)?;
                crate::onnx::release(p);
                pos = p.len() as u64;
            }
            for (offset, payload) in &self.pieces {
                std::io::copy(&mut std::io::repeat(0).take(offset - pos), w)?;
                w.write_all(payload)?;
                crate::onnx::release(payload);
                pos = offset + payload.len() as u64;
            }
            let copied = self.prefix.iter().chain(self.pieces.iter().map(|(_, p)| p));
            crate::onnx::ensure_intact(copied.map(|b| &b[..]))
        })
        .map_err(|e| Error::write(&self.path, e))
    }
}

/// Whether `location`, read from the input model's folder, is the
/// output's sidecar file (an existing one, `name` in the output folder
/// `dir`) under the same name: the same file (device and inode) reached
/// through the model's opener and through the open output folder, so no
/// path is resolved with anyone else's rights.
pub(super) fn is_output_sidecar(model: &Model, location: &str, dir: &OutDir, name: &str) -> bool {
    let r = ExternalRef {
        location: location.to_string(),
        offset: 0,
        length: None,
    };
    let same_name = r.path_in(Path::new("")).is_ok_and(|p| p == Path::new(name));
    let (Ok(theirs), Ok(ours)) = (model.external_stamp(&r), dir.stat(name.as_ref())) else {
        return false;
    };
    same_name && theirs.dev == ours.st_dev && theirs.ino == ours.st_ino
}
