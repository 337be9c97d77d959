//! The digest memo: a model file's initializer digests keyed by the identity
//! of the file and of its external-data files (device, inode, size, mtime,
//! ctime), so unchanged models are not rehashed on ResolveModel or restart.
//! Kept in memory and persisted as a small file in the cache dir.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::onnx::{Model, Storage, TensorRef};
use serde::{Deserialize, Serialize};

/// File identity: changes whenever the file's content may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl FileId {
    pub fn of(path: &Path) -> std::io::Result<FileId> {
        let m = std::fs::metadata(path)?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    files: Vec<FileId>,
    digests: HashMap<String, String>,
}

/// Digests of initializers per model path.
pub struct Memo {
    path: PathBuf,
    map: Mutex<HashMap<PathBuf, Record>>,
}

/// Identities of the model file and every external-data file it uses.
fn identity(model_path: &Path, tensors: &[TensorRef], dir: &Path) -> Vec<FileId> {
    let mut files = vec![FileId::of(model_path).ok()];
    let mut locations: Vec<&str> = tensors
        .iter()
        .filter_map(|t| match &t.storage {
            Storage::External(e) => Some(e.location.as_str()),
            _ => None,
        })
        .collect();
    locations.sort_unstable();
    locations.dedup();
    files.extend(locations.into_iter().map(|l| FileId::of(&dir.join(l)).ok()));
    files.into_iter().flatten().collect()
}

impl Memo {
    /// Loads the persisted memo (a missing or unreadable file starts empty).
    pub fn load(path: PathBuf) -> Memo {
        let map = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Memo {
            path,
            map: Mutex::new(map),
        }
    }

    /// The blake3 digests of `tensors` of the model at `model_path`, from the
    /// memo when the files are unchanged, else computed (in parallel) and
    /// remembered. Returns (digests by name, whether they were computed).
    pub fn digests(
        &self,
        model_path: &Path,
        model: &Model,
        tensors: &[TensorRef],
    ) -> ctcache::Result<(HashMap<String, SourceDigest>, bool)> {
        let files = identity(model_path, tensors, model.dir());
        let key = model_path.to_path_buf();
        if let Some(r) = self.map.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            if r.files == files && tensors.iter().all(|t| r.digests.contains_key(&t.name)) {
                let parsed: Option<HashMap<String, SourceDigest>> = tensors
                    .iter()
                    .map(|t| {
                        let mut bytes = [0u8; 32];
                        hex::decode_to_slice(&r.digests[&t.name], &mut bytes).ok()?;
                        Some((
                            t.name.clone(),
                            SourceDigest {
                                algorithm: Algorithm::Blake3,
                                bytes,
                            },
                        ))
                    })
                    .collect();
                if let Some(p) = parsed {
                    return Ok((p, false));
                }
            }
        }
        let computed = ctcache::digest::digest_all(model, tensors, Algorithm::Blake3);
        let mut out = HashMap::new();
        for (t, d) in tensors.iter().zip(computed) {
            out.insert(t.name.clone(), d?);
        }
        let record = Record {
            files,
            digests: out.iter().map(|(n, d)| (n.clone(), d.hex())).collect(),
        };
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, record);
        Ok((out, true))
    }

    /// Forgets a model (deleted or replaced).
    pub fn forget(&self, model_path: &Path) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(model_path);
    }

    /// Writes the memo atomically.
    pub fn persist(&self) {
        let bytes = {
            let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            serde_json::to_vec(&*map).unwrap_or_default()
        };
        if let Err(e) =
            ctcache::fsutil::atomic_write(&self.path, |w| std::io::Write::write_all(w, &bytes))
        {
            tracing::warn!(error = %e, "cannot persist the digest memo");
        }
    }
}
