//! Opening a cache dir: its lock and layout, tmp/ cleared, the index
//! (set aside and rebuilt from the record files when damaged) and the
//! record sync an unclean close or a new index asks for.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use super::error::{StoreError, StoreResult};
use super::layout::{self, Paths};
use super::options::StoreOptions;
use super::rebuild::RecordSync;
use super::{blobs, cache, integrity, lease, sled_index, stats, use_stats, verity, Store};

/// What `open` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReport {
    /// The layout version found (`None`: a new cache dir).
    pub layout_found: Option<u32>,
    /// Leftovers of interrupted writes removed from tmp/.
    pub temp_removed: usize,
    /// The index could not be opened: it was set aside and rebuilt from
    /// the record files.
    pub index_reset: Option<IndexReset>,
    /// What the record sync at open did: it runs when the last owner did
    /// not close the dir cleanly (a crash), when the index was rebuilt or
    /// found empty, and after a layout upgrade; `None` otherwise.
    pub record_sync: Option<RecordSync>,
}

/// A damaged index set aside at open and rebuilt from the record files
/// (D13): every entry whose record and payload file are intact is back;
/// leases, access times (reset to the rebuild's time), the hit/miss
/// counters and the digest memo start anew. Nothing wrong is ever served
/// from the old one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexReset {
    /// Where the corrupt index now lies, for a bug report.
    pub moved_to: PathBuf,
    /// What the index library reported.
    pub detail: String,
}

/// Opens the index; a damaged one (a crash can tear sled 0.34's log even
/// with fsync, and files can rot) is moved to `quarantine/index-<unix ms>`
/// and replaced by an empty index, which the caller fills from the record
/// files. sled panics on some damage: that is damage too.
fn open_index(
    paths: &Paths,
    opts: &StoreOptions,
) -> StoreResult<(sled_index::SledIndex, Option<IndexReset>)> {
    let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        sled_index::SledIndex::open(&paths.index, opts)
    }));
    let detail = match opened {
        Ok(Err(StoreError::IndexCorrupt { detail, .. })) => detail,
        Ok(r) => return r.map(|i| (i, None)),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            format!("the index library panicked: {what}")
        }
    };
    let moved_to = paths
        .quarantine
        .join(format!("index-{}", opts.clock.now_ms()));
    fs::create_dir_all(&paths.quarantine)
        .map_err(|e| StoreError::io("create", &paths.quarantine, e))?;
    fs::rename(&paths.index, &moved_to)
        .map_err(|e| StoreError::io("set aside", &paths.index, e))?;
    let index = sled_index::SledIndex::open(&paths.index, opts)?;
    Ok((index, Some(IndexReset { moved_to, detail })))
}

impl Store {
    /// Opens (creating if needed) the store in `dir`; fails with
    /// [`StoreError::Locked`] when another process owns it.
    pub fn open(dir: impl AsRef<Path>, opts: StoreOptions) -> StoreResult<Store> {
        let root = dir.as_ref();
        fs::create_dir_all(root).map_err(|e| StoreError::io("create", root, e))?;
        let lock = layout::lock(root)?;
        let (paths, layout_found) = layout::prepare(root)?;
        let temp_removed = layout::clean_tmp(&paths)?;
        let clean = layout::take_clean_mark(&paths)?;
        let (index, index_reset) = open_index(&paths, &opts)?;
        layout::restrict(&paths)?;
        let must_sync = !clean || index_reset.is_some() || !index.recovered();
        let now = opts.clock.now_ms();
        let counters = stats::Counters::load(&index, now)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut store = Store {
            session: format!("{:x}-{:x}{:08x}", std::process::id(), now, nanos),
            paths,
            index: Box::new(index),
            stripes: blobs::Stripes::new(),
            gate: Mutex::new(lease::Book::default()),
            access: use_stats::AccessLog::new(now),
            counters,
            cache: cache::LookupCache::new(opts.lookup_cache_sources),
            dropped: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            pending_drops: Mutex::new(HashMap::new()),
            tmp_seq: AtomicU64::new(0),
            opened: OpenReport {
                layout_found,
                temp_removed,
                index_reset,
                record_sync: None,
            },
            verified: integrity::Verified::default(),
            verity: verity::Verity::default(),
            opts,
            _lock: lock,
        };
        if must_sync {
            store.opened.record_sync = Some(store.sync_records()?);
        }
        Ok(store)
    }
}
