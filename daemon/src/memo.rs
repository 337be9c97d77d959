//! The digest memo: a model file's initializer digests keyed by the stamps
//! of the file and of its external-data files as they were opened (device,
//! inode, size, mtime, ctime), so unchanged models are not rehashed on ResolveModel or restart.
//! Persisted in the store's index (its memo tree, one JSON record per model
//! path) and cached in memory, at most `max_memo_entries` models (past
//! that, the least recently used one is dropped from memory; the index
//! keeps it).

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hashlink::LruCache;

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
    map: Mutex<LruCache<PathBuf, Record>>,
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
    pub fn new(store: Arc<Store>, max_in_memory: usize) -> Memo {
        let _ = std::fs::remove_file(store.dir().join("digest-memo.json"));
        Memo {
            store,
            map: Mutex::new(LruCache::new(max_in_memory.max(1))),
        }
    }

    /// Keeps `r` in memory, dropping the least recently used model when
    /// the bound is reached.
    fn remember(&self, model_path: &Path, r: Record) {
        self.lock().insert(model_path.to_path_buf(), r);
    }

    /// Models kept in memory.
    #[cfg(test)]
    fn in_memory(&self) -> usize {
        self.lock().len()
    }

    /// Whether the model's record is in memory (without marking it used).
    #[cfg(test)]
    fn holds(&self, model_path: &Path) -> bool {
        self.lock().contains_key(model_path)
    }

    /// The record of a model: from memory (now the most recently used),
    /// else from the index.
    fn record(&self, model_path: &Path) -> Option<Record> {
        if let Some(r) = self.lock().get(model_path) {
            return Some(r.clone());
        }
        let bytes = self.store.memo_get(key(model_path)).ok().flatten()?;
        let r: Record = serde_json::from_slice(&bytes).ok()?;
        self.remember(model_path, r.clone());
        Some(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<PathBuf, Record>> {
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
        self.remember(model_path, record);
        Ok((out, true))
    }

    /// Forgets a model (deleted or replaced).
    pub fn forget(&self, model_path: &Path) {
        self.lock().remove(model_path);
        let _ = self.store.memo_remove(key(model_path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memo of at most `bound` models over a fresh store in `dir`.
    fn memo_in(dir: &Path, bound: usize) -> Memo {
        let store = Arc::new(Store::open(dir.join("cache"), Default::default()).unwrap());
        Memo::new(store, bound)
    }

    /// Writes model `i` under `dir` and takes its digests through `memo`;
    /// returns its path, the digests and whether they were computed.
    fn digest_model(
        memo: &Memo,
        dir: &Path,
        i: u32,
    ) -> (PathBuf, HashMap<String, SourceDigest>, bool) {
        let path = dir.join(format!("m{i}.onnx"));
        if !path.exists() {
            let w = ctcache_testkit::xorshift(i + 1).map(ctcache_testkit::unit_f32);
            std::fs::write(&path, ctcache_testkit::MatMul::new(4, 4, w).encode()).unwrap();
        }
        let model = Model::open(&path).unwrap();
        let tensors = model.initializers().unwrap();
        let (d, computed) = memo.digests(&path, &model, &tensors).unwrap();
        (path, d, computed)
    }

    #[test]
    fn memory_holds_at_most_the_bound_and_the_index_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let memo = memo_in(dir.path(), 3);
        let mut digests = Vec::new();
        for i in 0..10u32 {
            let (path, d, computed) = digest_model(&memo, dir.path(), i);
            assert!(computed);
            digests.push((path, d));
            assert!(memo.in_memory() <= 3);
        }
        // A model dropped from memory is served from the index, not rehashed.
        for (i, (path, d)) in (0..10u32).zip(digests) {
            let (_, again, computed) = digest_model(&memo, dir.path(), i);
            assert!(!computed, "{}", path.display());
            assert_eq!(again, d);
        }
        assert!(memo.in_memory() <= 3);
    }

    #[test]
    fn the_model_used_last_survives_eviction_and_the_least_recent_goes() {
        let dir = tempfile::tempdir().unwrap();
        let memo = memo_in(dir.path(), 3);
        let (hot, _, _) = digest_model(&memo, dir.path(), 0);
        for i in 1..30u32 {
            // The hot model is asked for between every new one.
            let (_, _, computed) = digest_model(&memo, dir.path(), 0);
            assert!(!computed);
            let (path, _, _) = digest_model(&memo, dir.path(), i);
            assert!(memo.holds(&hot), "the hot model was dropped at model {i}");
            assert!(memo.holds(&path));
            assert_eq!(memo.in_memory(), (i as usize + 1).min(3));
            // With m0 and m(i-1) and m(i) the last three used, m(i-2) went.
            if i >= 3 {
                let gone = dir.path().join(format!("m{}.onnx", i - 2));
                assert!(!memo.holds(&gone), "m{} outlived newer models", i - 2);
            }
        }
    }
}
