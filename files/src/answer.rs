//! Writing a materialized model that the daemon answered in memory, with
//! the caller's own rights: the daemon writes no file where a caller
//! points (its answer names the model's bytes and the cached payload each
//! file of the data folder copies), so the client places the payload files
//! (reflink, copy or hard link, as [`place`] does), checks each placed file
//! against its entry's blake3 (D12 moves with the copy), then writes the
//! model last. What a failure leaves half done is removed.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::outdir::{OutDir, OutFile};
use crate::place::{place, LinkMode, Method, Placed};
use crate::stamp::FileStamp;

/// One file of the data folder: a copy of a cached payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerFile {
    /// Its name in the data folder (one path component).
    pub name: String,
    /// The cache's payload file it is made from (read with the caller's
    /// rights).
    pub source: PathBuf,
    /// The entry's `payload_blake3`: what the placed file must hash to.
    pub blake3: [u8; 32],
}

/// A materialized model as the daemon answers it for a file.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The model's bytes; its new initializers' locations are
    /// `<data_folder>/<file name>`.
    pub model: &'a [u8],
    /// The data folder beside the model ([`data_folder_name`]).
    pub data_folder: &'a str,
    /// Every file the locations name.
    pub files: &'a [AnswerFile],
}

/// What writing an answer did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Written {
    /// The data folder.
    pub data_dir: PathBuf,
    /// Every file placed in it, and how.
    pub files: Vec<Placed>,
    /// Bytes copied into files (0 when every file is a reflink or a link).
    pub bytes_copied: u64,
    /// Size of the model file.
    pub model_bytes: u64,
}

/// The data folder of the model file named `model_name`:
/// `model.onnx` -> `model.onnx.weights`.
pub fn data_folder_name(model_name: &OsStr) -> String {
    format!("{}.weights", model_name.to_string_lossy())
}

/// The name of a payload file in a data folder, by its content:
/// `<blake3 hex>.bin` (equal payloads share one file).
pub fn data_file_name(blake3: &[u8; 32]) -> String {
    format!("{}.bin", hex::encode(blake3))
}

/// Writes `answer` to `output`: its files in the data folder placed by
/// `mode`, then the model. `input` is the source model's file (refused as
/// the output). Stops between files once `stop()` says so
/// ([`Error::Cancelled`]), removing what it made.
pub fn write_answer(
    answer: &Answer<'_>,
    output: &OutFile,
    input: Option<FileStamp>,
    mode: LinkMode,
    stop: &dyn Fn() -> bool,
) -> Result<Written> {
    output.refuse_input(input, "model", None)?;
    let folder = OsStr::new(answer.data_folder);
    let mut report = Written {
        data_dir: output.dir.shown(folder),
        ..Default::default()
    };
    let names = answer.files.iter().map(|f| f.name.as_str());
    if let Some(bad) = names.chain([answer.data_folder]).find(|n| !is_component(n)) {
        return Err(Error::BadAnswer(format!(
            "the answer names {bad:?} beside the model: not a file name"
        )));
    }
    let check = || match stop() {
        true => Err(Error::Cancelled),
        false => Ok(()),
    };
    let (dir, made_dir) = output
        .dir
        .subdir(folder)
        .map_err(|e| Error::write(report.data_dir.clone(), e))?;
    let written = place_checked(answer.files, &dir, mode, &check, &mut report)
        .and_then(|()| dir.sync().map_err(|e| Error::write(&report.data_dir, e)))
        .and_then(|()| check())
        .and_then(|()| write_model(answer.model, output));
    match written {
        Ok(n) => report.model_bytes = n,
        Err(e) => {
            for p in &report.files {
                let _ = dir.remove(p.path.file_name().unwrap_or_default());
            }
            if made_dir {
                let _ = output.dir.remove_dir(folder);
            }
            return Err(e);
        }
    }
    // Files an earlier materialize to this path left behind go; a folder
    // of none goes too.
    let keep: Vec<OsString> = answer.files.iter().map(|f| (&f.name).into()).collect();
    let keep: Vec<&OsStr> = keep.iter().map(OsString::as_os_str).collect();
    let _ = dir.prune(&keep);
    if keep.is_empty() {
        let _ = output.dir.remove_dir(folder);
    }
    Ok(report)
}

/// A single normal path component.
fn is_component(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// Places every file, each checked against its blake3 once in place (a
/// file that is not the entry's bytes is removed, and nothing more is
/// placed), noting each in `report`.
fn place_checked(
    files: &[AnswerFile],
    dir: &OutDir,
    mode: LinkMode,
    check: &dyn Fn() -> Result<()>,
    report: &mut Written,
) -> Result<()> {
    for f in files {
        check()?;
        let name = OsStr::new(&f.name);
        let placed = place(&f.source, None, dir, name, mode)?;
        let hashed = hash_placed(dir, name).map_err(|e| Error::write(&placed.path, e))?;
        if hashed != f.blake3 {
            if placed.method != Method::InPlace {
                let _ = dir.remove(name);
            }
            return Err(Error::PayloadChanged {
                path: f.source.clone(),
                problem: format!(
                    "its bytes hash to {}, the entry says {}",
                    hex::encode(hashed),
                    hex::encode(f.blake3)
                ),
            });
        }
        report.bytes_copied += placed.bytes_copied;
        report.files.push(placed);
    }
    Ok(())
}

/// The blake3 of the file `name` in `dir`.
fn hash_placed(dir: &OutDir, name: &OsStr) -> std::io::Result<[u8; 32]> {
    let file = dir.open_file(name)?;
    let mut h = blake3::Hasher::new();
    if file.metadata()?.len() > 0 {
        // SAFETY: a private read-only map of a file this call just made;
        // only hashed, and dropped before returning.
        let map = unsafe { memmap2::Mmap::map(&file)? };
        h.update_rayon(&map);
    }
    Ok(*h.finalize().as_bytes())
}

/// Writes the model file whole or not at all; returns its size.
fn write_model(model: &[u8], output: &OutFile) -> Result<u64> {
    output
        .dir
        .write(&output.name, |w| w.write_all(model))
        .map_err(|e| Error::write(output.path(), e))?;
    Ok(model.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payload file in `dir` holding `bytes`, and its answer entry.
    fn payload(dir: &std::path::Path, name: &str, bytes: &[u8]) -> AnswerFile {
        let source = dir.join(format!("src-{name}"));
        std::fs::write(&source, bytes).unwrap();
        AnswerFile {
            name: name.into(),
            source,
            blake3: *blake3::hash(bytes).as_bytes(),
        }
    }

    fn write(files: &[AnswerFile], out: &std::path::Path) -> Result<Written> {
        let answer = Answer {
            model: b"model bytes",
            data_folder: "m.onnx.weights",
            files,
        };
        let (output, _) = OutFile::create(out).unwrap();
        write_answer(&answer, &output, None, LinkMode::Auto, &|| false)
    }

    #[test]
    fn files_then_the_model_are_written_and_stale_files_go() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out/m.onnx");
        let stale = t.path().join("out/m.onnx.weights/old.bin");
        std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
        std::fs::write(&stale, b"old").unwrap();
        let files = [
            payload(t.path(), "a.bin", b"aaaa"),
            payload(t.path(), "b.bin", b""),
        ];
        let r = write(&files, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"model bytes");
        assert_eq!(r.model_bytes, 11);
        assert_eq!(r.files.len(), 2);
        let weights = t.path().join("out/m.onnx.weights");
        assert_eq!(std::fs::read(weights.join("a.bin")).unwrap(), b"aaaa");
        assert!(weights.join("b.bin").is_file() && !stale.exists());
    }

    /// A source whose bytes are not the entry's: nothing placed stays, no
    /// model is written (D12 on the client's copy).
    #[test]
    fn a_copy_that_is_not_the_entrys_bytes_leaves_nothing() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("m.onnx");
        let good = payload(t.path(), "a.bin", b"aaaa");
        let mut bad = payload(t.path(), "b.bin", b"bbbb");
        bad.blake3 = *blake3::hash(b"other").as_bytes();
        let e = write(&[good, bad], &out).unwrap_err();
        assert!(matches!(e, Error::PayloadChanged { .. }), "{e}");
        assert!(!out.exists() && !t.path().join("m.onnx.weights").exists());
    }

    #[test]
    fn names_that_leave_the_data_folder_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("m.onnx");
        for name in ["../x.bin", "a/b.bin", "..", ""] {
            let mut f = payload(t.path(), "x.bin", b"x");
            f.name = name.into();
            assert!(write(&[f], &out).is_err(), "{name:?}");
        }
        assert!(!out.exists() && !t.path().join("x.bin").exists());
    }
}
