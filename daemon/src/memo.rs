//! The digest memo: a model file's initializer digests keyed by the stamps
//! of the file and of its external-data files as they were opened (device,
//! inode, size, mtime, ctime), so unchanged models are not rehashed on ResolveModel or restart.
//! Persisted in the store's index (its memo tree, one JSON record per model
//! path) and cached in memory.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use ctcache::digest::{Algorithm, SourceDigest};
use ctcache::fsutil::FileStamp;
use ctcache::onnx::{Model, Storage, TensorRef};
use ctcache::store::Store;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    files: Vec<FileStamp>,
    digests: HashMap<String, String>,
}

/// Digests of initializers per model path.
pub struct Memo {
    store: Arc<Store>,
    map: Mutex<HashMap<PathBuf, Record>>,
}

fn key(path: &Path) -> &[u8] {
    path.as_os_str().as_bytes()
}

/// Stamps of the model file and every external-data file it uses, taken
/// from the files as they were opened (so they describe the bytes read).
fn identity(model: &Model, tensors: &[TensorRef]) -> Option<Vec<FileStamp>> {
    let mut files = vec![model.stamp()?];
    let mut seen = std::collections::HashSet::new();
    for t in tensors {
        if let Storage::External(e) = &t.storage {
            if seen.insert(e.location.as_str()) {
                files.push(model.external_stamp(e).ok()?);
            }
        }
    }
    Some(files)
}

impl Memo {
    /// A memo over the store's memo tree. The file an older version kept
    /// in the cache dir (`digest-memo.json`) is removed: it is only a cache.
    pub fn new(store: Arc<Store>) -> Memo {
        let _ = std::fs::remove_file(store.dir().join("digest-memo.json"));
        Memo {
            store,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// The record of a model: from memory, else from the index.
    fn record(&self, model_path: &Path) -> Option<Record> {
        if let Some(r) = self.lock().get(model_path) {
            return Some(r.clone());
        }
        let bytes = self.store.memo_get(key(model_path)).ok().flatten()?;
        let r: Record = serde_json::from_slice(&bytes).ok()?;
        self.lock().insert(model_path.to_path_buf(), r.clone());
        Some(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Record>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
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
        let files = identity(model, tensors);
        if let Some(r) = self.record(model_path) {
            if Some(&r.files) == files.as_ref()
                && tensors.iter().all(|t| r.digests.contains_key(&t.name))
            {
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
        // Without stamps (a model in memory, an unreadable external file)
        // nothing is remembered.
        let Some(files) = files else {
            return Ok((out, true));
        };
        let record = Record {
            files,
            digests: out.iter().map(|(n, d)| (n.clone(), d.hex())).collect(),
        };
        // A memo that cannot be written only costs a rehash later.
        match serde_json::to_vec(&record) {
            Ok(bytes) => {
                if let Err(e) = self.store.memo_put(key(model_path), &bytes) {
                    tracing::warn!(error = %e, "cannot record digests in the memo");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot encode a memo record"),
        }
        self.lock().insert(model_path.to_path_buf(), record);
        Ok((out, true))
    }

    /// Forgets a model (deleted or replaced).
    pub fn forget(&self, model_path: &Path) {
        self.lock().remove(model_path);
        let _ = self.store.memo_remove(key(model_path));
    }
}
