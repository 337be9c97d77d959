//! The digest memo: a model file's initializer digests keyed by the stamps
//! of the file and of its external-data files as they were opened (device,
//! inode, size, mtime, ctime), so unchanged models are not rehashed on
//! ResolveModel or restart.
//!
//! Bounded, since any socket peer adds models to it (one record per model
//! path it asks about): at most `max_memo_entries` models and
//! `max_memo_bytes` of records, past which the least recently used go. The
//! records kept in memory are also the only ones in the store's index (its
//! memo tree, one JSON record per model path), which carries them over a
//! restart; at start the newest that fit are loaded and the rest removed.

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
    /// When the digests were computed (ms since the epoch; 0 in records of
    /// older versions): which records a restart keeps first.
    #[serde(default)]
    written_ms: i64,
}

impl Record {
    /// What the record costs against `max_memo_bytes`: the larger of its
    /// JSON in the index (`json` bytes: names full of escaped characters
    /// grow there) and about what it takes in memory.
    fn weight(&self, path: &Path, json: usize) -> usize {
        let digests: usize = self
            .digests
            .keys()
            .map(|name| name.len() + 64 + 3 * std::mem::size_of::<String>())
            .sum();
        let memory = path.as_os_str().len()
            + self.files.len() * std::mem::size_of::<FileStamp>()
            + digests
            + 128;
        memory.max(json + path.as_os_str().len())
    }
}

/// How many records the memo keeps, and how large they may be together.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub entries: usize,
    pub bytes: usize,
}

/// The records kept (in memory and in the index alike), least recently
/// used first out.
struct Kept {
    map: LruCache<PathBuf, (Arc<Record>, usize)>,
    bytes: usize,
    bounds: Bounds,
}

impl Kept {
    /// Keeps `r` for `path` unless it alone is over the byte bound; returns
    /// whether it was kept and the paths dropped to make room (or `path`
    /// itself, when its old record goes and the new one is not kept).
    fn keep(&mut self, path: &Path, r: Arc<Record>, weight: usize) -> (bool, Vec<PathBuf>) {
        let mut dropped = Vec::new();
        if weight > self.bounds.bytes {
            if let Some((_, old)) = self.map.remove(path) {
                self.bytes -= old;
                dropped.push(path.to_path_buf());
            }
            return (false, dropped);
        }
        if let Some((_, old)) = self.map.insert(path.to_path_buf(), (r, weight)) {
            self.bytes -= old;
        }
        self.bytes += weight;
        while self.map.len() > self.bounds.entries || self.bytes > self.bounds.bytes {
            let Some((p, (_, w))) = self.map.remove_lru() else {
                break;
            };
            self.bytes -= w;
            dropped.push(p);
        }
        (true, dropped)
    }
}

/// Digests of initializers per model path.
pub struct Memo {
    store: Arc<Store>,
    kept: Mutex<Kept>,
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
    /// A memo over the store's memo tree, loaded with the newest records
    /// that fit `bounds`; the others are removed from the index. The file an
    /// older version kept in the cache dir (`digest-memo.json`) is removed
    /// too: it is only a cache.
    pub fn new(store: Arc<Store>, bounds: Bounds) -> Memo {
        let _ = std::fs::remove_file(store.dir().join("digest-memo.json"));
        let bounds = Bounds {
            entries: bounds.entries.max(1),
            bytes: bounds.bytes,
        };
        let memo = Memo {
            store,
            kept: Mutex::new(Kept {
                // Unbounded: `keep` evicts, so that it sees what goes.
                map: LruCache::new_unbounded(),
                bytes: 0,
                bounds,
            }),
        };
        memo.load();
        memo
    }

    /// Loads the index's records, newest last (the most recently used),
    /// and removes those that do not fit or do not parse.
    fn load(&self) {
        let mut found: Vec<(i64, PathBuf)> = Vec::new();
        let mut unreadable: Vec<Vec<u8>> = Vec::new();
        let scanned = self.store.memo_scan(&mut |k, v| {
            match serde_json::from_slice::<Record>(v) {
                Ok(r) => found.push((r.written_ms, PathBuf::from(std::ffi::OsStr::from_bytes(k)))),
                Err(_) => unreadable.push(k.to_vec()),
            }
            true
        });
        if let Err(e) = scanned {
            tracing::warn!(error = %e, "cannot read the digest memo; it starts empty");
            return;
        }
        found.sort();
        let mut kept = self.lock();
        for (_, path) in found {
            let record = self
                .store
                .memo_get(key(&path))
                .ok()
                .flatten()
                .and_then(|b| {
                    let r = serde_json::from_slice::<Record>(&b).ok()?;
                    let weight = r.weight(&path, b.len());
                    Some((r, weight))
                });
            let dropped = match record {
                Some((r, weight)) => match kept.keep(&path, Arc::new(r), weight) {
                    (true, dropped) => dropped,
                    (false, mut dropped) => {
                        dropped.push(path);
                        dropped
                    }
                },
                None => vec![path],
            };
            for p in dropped {
                let _ = self.store.memo_remove(key(&p));
            }
        }
        for k in unreadable {
            let _ = self.store.memo_remove(&k);
        }
    }

    /// The record of a model, now the most recently used.
    fn record(&self, model_path: &Path) -> Option<Arc<Record>> {
        self.lock().map.get(model_path).map(|(r, _)| r.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `record` in memory and in the index, dropping the least
    /// recently used models over the bounds from both. Under the lock, so
    /// that the index holds exactly what memory does.
    fn remember(&self, model_path: &Path, record: Record) {
        let bytes = match serde_json::to_vec(&record) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode a memo record");
                return;
            }
        };
        let weight = record.weight(model_path, bytes.len());
        let mut kept = self.lock();
        let (is_kept, dropped) = kept.keep(model_path, Arc::new(record), weight);
        for p in dropped {
            let _ = self.store.memo_remove(key(&p));
        }
        if !is_kept {
            return;
        }
        // A memo that cannot be written only costs a rehash after a restart.
        if let Err(e) = self.store.memo_put(key(model_path), &bytes) {
            tracing::warn!(error = %e, "cannot record digests in the memo");
        }
    }

    /// The digests of `tensors` the memo holds for the model at
    /// `model_path`, when its files are unchanged since they were taken.
    pub fn remembered(
        &self,
        model_path: &Path,
        model: &Model,
        tensors: &[TensorRef],
    ) -> Option<HashMap<String, SourceDigest>> {
        let files = identity(model, tensors)?;
        let r = self.record(model_path)?;
        if r.files != files || !tensors.iter().all(|t| r.digests.contains_key(&t.name)) {
            return None;
        }
        tensors
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
            .collect()
    }

    /// The blake3 digests of `tensors` of the model at `model_path`,
    /// computed (in parallel) and remembered, whatever the memo holds.
    pub fn compute(
        &self,
        model_path: &Path,
        model: &Model,
        tensors: &[TensorRef],
    ) -> ctcache::Result<HashMap<String, SourceDigest>> {
        let files = identity(model, tensors);
        let computed = ctcache::digest::digest_all(model, tensors, Algorithm::Blake3);
        let mut out = HashMap::new();
        for (t, d) in tensors.iter().zip(computed) {
            out.insert(t.name.clone(), d?);
        }
        // Without stamps (a model in memory, an unreadable external file)
        // nothing is remembered.
        let Some(files) = files else {
            return Ok(out);
        };
        let record = Record {
            files,
            digests: out.iter().map(|(n, d)| (n.clone(), d.hex())).collect(),
            written_ms: crate::events::now_ms(),
        };
        self.remember(model_path, record);
        Ok(out)
    }

    /// Forgets a model (deleted or replaced).
    pub fn forget(&self, model_path: &Path) {
        let mut kept = self.lock();
        if let Some((_, w)) = kept.map.remove(model_path) {
            kept.bytes -= w;
        }
        let _ = self.store.memo_remove(key(model_path));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Memo {
        /// The blake3 digests of `tensors` of the model at `model_path`, from the
        /// memo when the files are unchanged, else computed (in parallel) and
        /// remembered. Returns (digests by name, whether they were computed).
        fn digests(
            &self,
            model_path: &Path,
            model: &Model,
            tensors: &[TensorRef],
        ) -> ctcache::Result<(HashMap<String, SourceDigest>, bool)> {
            if let Some(known) = self.remembered(model_path, model, tensors) {
                return Ok((known, false));
            }
            Ok((self.compute(model_path, model, tensors)?, true))
        }
    }

    fn store_in(dir: &Path) -> Arc<Store> {
        Arc::new(Store::open(dir.join("cache"), Default::default()).unwrap())
    }

    fn bounds(entries: usize, bytes: usize) -> Bounds {
        Bounds { entries, bytes }
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

    /// The model paths the index holds records of.
    fn on_disk(store: &Store) -> Vec<PathBuf> {
        let mut out = Vec::new();
        store
            .memo_scan(&mut |k, _| {
                out.push(PathBuf::from(std::ffi::OsStr::from_bytes(k)));
                true
            })
            .unwrap();
        out
    }

    fn in_memory(memo: &Memo) -> usize {
        memo.lock().map.len()
    }

    fn holds(memo: &Memo, path: &Path) -> bool {
        memo.lock().map.contains_key(path)
    }

    /// Peers add a record per model path they ask about: neither memory nor
    /// the index grows past the bound, and the index holds what memory does.
    #[test]
    fn memory_and_index_hold_at_most_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let memo = Memo::new(store.clone(), bounds(3, usize::MAX));
        for i in 0..10u32 {
            let (_, _, computed) = digest_model(&memo, dir.path(), i);
            assert!(computed);
            assert!(in_memory(&memo) <= 3);
            let mut disk = on_disk(&store);
            disk.sort();
            let mut held: Vec<PathBuf> = memo.lock().map.iter().map(|(p, _)| p.clone()).collect();
            held.sort();
            assert_eq!(disk, held, "after model {i}");
        }
        // The three used last are served, the others computed again.
        for i in 7..10u32 {
            assert!(!digest_model(&memo, dir.path(), i).2, "m{i}");
        }
        assert!(digest_model(&memo, dir.path(), 0).2);
    }

    #[test]
    fn records_are_bounded_in_bytes_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let probe = Memo::new(store_in(&dir.path().join("probe")), bounds(100, usize::MAX));
        digest_model(&probe, dir.path(), 0);
        let one = probe.lock().bytes;
        let memo = Memo::new(store.clone(), bounds(100, 3 * one + one / 2));
        for i in 0..10u32 {
            digest_model(&memo, dir.path(), i);
            let kept = memo.lock();
            assert!(kept.bytes <= 3 * one + one / 2, "{} bytes", kept.bytes);
            assert!(kept.map.len() <= 3);
        }
        assert_eq!(on_disk(&store).len(), 3);
        // A record larger than the whole bound is neither kept nor written.
        let tiny = Memo::new(store_in(&dir.path().join("tiny")), bounds(100, one - 1));
        assert!(digest_model(&tiny, dir.path(), 0).2);
        assert!(digest_model(&tiny, dir.path(), 0).2);
        assert_eq!(in_memory(&tiny), 0);
        assert!(on_disk(&tiny.store).is_empty());
    }

    /// Initializer names of control characters take six bytes each in the
    /// index's JSON: the byte bound counts what is written.
    #[test]
    fn the_byte_bound_counts_the_json_written() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let memo = Memo::new(store.clone(), bounds(10, usize::MAX));
        let name = "\u{1}".repeat(4000);
        let graph = ctcache::pb::GraphProto {
            initializer: vec![ctcache::pb::TensorProto {
                name,
                data_type: 1,
                dims: vec![1],
                raw_data: vec![0u8; 4].into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let m = ctcache::pb::ModelProto {
            ir_version: 8,
            graph: Some(graph),
            ..Default::default()
        };
        let path = dir.path().join("escaped.onnx");
        std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
        let model = Model::open(&path).unwrap();
        let tensors = model.initializers().unwrap();
        memo.digests(&path, &model, &tensors).unwrap();
        let json = store.memo_get(key(&path)).unwrap().unwrap().len();
        assert!(json > 6 * 4000, "{json}");
        assert!(memo.lock().bytes >= json, "{} < {json}", memo.lock().bytes);
    }

    #[test]
    fn a_restart_keeps_the_newest_records_that_fit() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_in(dir.path());
        let before = Memo::new(store.clone(), bounds(10, usize::MAX));
        let mut paths = Vec::new();
        for i in 0..6u32 {
            paths.push(digest_model(&before, dir.path(), i).0);
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
        drop(before);
        let after = Memo::new(store.clone(), bounds(3, usize::MAX));
        let mut disk = on_disk(&store);
        disk.sort();
        assert_eq!(disk, paths[3..].to_vec());
        for p in &paths[3..] {
            assert!(holds(&after, p), "{}", p.display());
        }
        for i in 3..6u32 {
            assert!(!digest_model(&after, dir.path(), i).2, "m{i} was rehashed");
        }
        assert!(digest_model(&after, dir.path(), 0).2);
        // Records larger than the byte bound are removed at start.
        let one = after.lock().bytes / 3;
        drop(after);
        let _ = Memo::new(store.clone(), bounds(10, one - 1));
        assert!(on_disk(&store).is_empty());
        let _ = digest_model(
            &Memo::new(store.clone(), bounds(10, usize::MAX)),
            dir.path(),
            0,
        );
        // A record that does not parse is removed at start.
        store.memo_put(b"/not/json", b"{").unwrap();
        let _ = Memo::new(store.clone(), bounds(10, usize::MAX));
        assert!(!on_disk(&store).contains(&PathBuf::from("/not/json")));
    }

    #[test]
    fn the_model_used_last_survives_eviction_and_the_least_recent_goes() {
        let dir = tempfile::tempdir().unwrap();
        let memo = Memo::new(store_in(dir.path()), bounds(3, usize::MAX));
        let (hot, _, _) = digest_model(&memo, dir.path(), 0);
        for i in 1..30u32 {
            // The hot model is asked for between every new one.
            let (_, _, computed) = digest_model(&memo, dir.path(), 0);
            assert!(!computed);
            let (path, _, _) = digest_model(&memo, dir.path(), i);
            assert!(holds(&memo, &hot), "the hot model was dropped at model {i}");
            assert!(holds(&memo, &path));
            assert_eq!(in_memory(&memo), (i as usize + 1).min(3));
            // With m0 and m(i-1) and m(i) the last three used, m(i-2) went.
            if i >= 3 {
                let gone = dir.path().join(format!("m{}.onnx", i - 2));
                assert!(!holds(&memo, &gone), "m{} outlived newer models", i - 2);
            }
        }
    }
}
