//! A model's external data: the files its initializers' locations name,
//! opened with the rights the model was opened with, each mapped once for
//! the model's life and bounded in number.

use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::{map_file, Model};
use crate::error::{Error, Result};
use crate::fsutil::FileStamp;
use crate::onnx::external::{ExternalRef, ExternalRefError, MAX_EXTERNAL_FILES};
use crate::onnx::tensor::{Storage, TensorRef};

/// Why an external-data file cannot be used. The file is opened first,
/// with the rights the model was opened with, and judged on where it
/// really is: a refusal says what that opener says, never what other
/// rights would find (the daemon's read-as-caller rule relies on it).
#[derive(Debug, thiserror::Error)]
pub enum ExternalFileError {
    /// The reference's location is refused.
    #[error(transparent)]
    Location(#[from] ExternalRefError),
    /// The model folder cannot be resolved.
    #[error("model folder {}: {source}", dir.display())]
    ModelFolder {
        /// The model folder.
        dir: PathBuf,
        /// Why it cannot be resolved.
        source: std::io::Error,
    },
    /// The file cannot be opened or inspected.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file as opened (or as asked for, when it did not open).
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file opened lies outside the model folder.
    #[error("location {location:?} resolves outside the model folder (symbolic link?)")]
    OutsideFolder {
        /// The reference's location.
        location: String,
    },
    /// The model's external data lies in more files than a model may map.
    #[error(
        "the model's external data lies in more than {limit} files, more than one model may \
         map at once"
    )]
    TooManyFiles {
        /// The bound.
        limit: usize,
    },
    /// The location names something other than a regular file.
    #[error("{} is not a regular file", path.display())]
    NotAFile {
        /// The file as opened.
        path: PathBuf,
    },
    /// The file cannot be mapped.
    #[error(transparent)]
    Map(Box<Error>),
}

impl ExternalFileError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        ExternalFileError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl Model {
    /// Maps an external-data file relative to the model folder (cached per
    /// path), refusing paths that leave the folder.
    pub(crate) fn external_file(&self, location: &ExternalRef) -> Result<Bytes, ExternalFileError> {
        self.external(location).map(|(bytes, _)| bytes)
    }

    /// The stamp of an external-data file when it was opened.
    pub fn external_stamp(&self, location: &ExternalRef) -> Result<FileStamp, ExternalFileError> {
        self.external(location).map(|(_, stamp)| stamp)
    }

    fn external(&self, location: &ExternalRef) -> Result<(Bytes, FileStamp), ExternalFileError> {
        use ExternalFileError as E;
        let path = location.path_in(&self.dir)?;
        // One file per location for the model's life, whatever the path
        // leads to later.
        let mut cache = self.externals.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = cache.get(&path) {
            return Ok(b.clone());
        }
        if cache.len() >= MAX_EXTERNAL_FILES {
            return Err(E::TooManyFiles {
                limit: MAX_EXTERNAL_FILES,
            });
        }
        let confined = self.opener.confines();
        let dir = match confined {
            true => self.dir.canonicalize().map_err(|source| E::ModelFolder {
                dir: self.dir.clone(),
                source,
            })?,
            false => self.dir.clone(),
        };
        // Opened first, with the opener's rights, and judged on where the
        // file opened really is: resolving the path with other rights would
        // tell a caller about files it may not see.
        let file = self.opener.open(&path).map_err(|e| E::io(&path, e))?;
        let real = crate::access::real_path(&file).map_err(|e| E::io(&path, e))?;
        if confined && !real.starts_with(&dir) {
            return Err(E::OutsideFolder {
                location: location.location.clone(),
            });
        }
        let meta = file.metadata().map_err(|e| E::io(&real, e))?;
        if !meta.is_file() {
            return Err(E::NotAFile { path: real });
        }
        let stamp = FileStamp::of_file(&file).map_err(|e| E::io(&real, e))?;
        let bytes = map_file(&file, &real).map_err(|e| E::Map(Box::new(e)))?;
        cache.insert(path, (bytes.clone(), stamp));
        Ok((bytes, stamp))
    }

    /// The raw-form bytes of a raw or external tensor, borrowed from a mapping;
    /// `None` for typed storage.
    pub fn mapped_data(&self, t: &TensorRef) -> Result<Option<Bytes>> {
        match &t.storage {
            Storage::Raw(r) => Ok(Some(self.bytes.slice(r.clone()))),
            Storage::Typed(_) => Ok(None),
            Storage::External(ext) => {
                let file = self.external_file(ext).map_err(|p| match p {
                    ExternalFileError::TooManyFiles { .. } => Error::Limit(p.to_string()),
                    p => Error::external(&t.name, p.to_string()),
                })?;
                let range = ext
                    .range(file.len() as u64)
                    .map_err(|p| Error::external(&t.name, p.to_string()))?;
                let want = t
                    .raw_size()
                    .ok_or_else(|| Error::tensor(&t.name, "size overflows"))?;
                if range.end - range.start != want {
                    return Err(Error::external(
                        &t.name,
                        format!(
                            "length {} does not match {} x {} = {} bytes",
                            range.end - range.start,
                            t.elements,
                            t.data_type,
                            want
                        ),
                    ));
                }
                Ok(Some(file.slice(range.start as usize..range.end as usize)))
            }
        }
    }
}
