//! The index interface: a few ordered key-value trees with atomic,
//! conditional multi-tree commits. The store speaks only this trait; sled is
//! one implementation (`sled_index.rs`), and replacing it means writing
//! another implementation of these six methods (any embedded ordered KV
//! store with multi-tree transactions fits: redb, fjall, RocksDB).
//!
//! Values are opaque bytes; their encodings live in `entry.rs` and `lease.rs`.

use super::error::StoreResult;

/// The trees of the index. Keys are shown as `a || b` (concatenation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Tree {
    /// entry key (97 bytes) -> entry record.
    Entries,
    /// payload blake3 (32) || entry key -> empty. Which entries share one
    /// payload file; a blob with no record here is unreferenced.
    BlobRefs,
    /// entry key -> access statistics (16 bytes), updated in batches apart
    /// from the record so that reads never rewrite metadata.
    Access,
    /// lease id (u64 big-endian) -> lease record.
    Leases,
    /// source prefix (algorithm || digest, 33 bytes) -> the sorted
    /// concatenation of the 64-byte key suffixes (device key || type key)
    /// of its entries. Lets a lookup read the entries of one source with
    /// point reads instead of a range scan.
    Sources,
    /// key -> value records a store user keeps beside the entries (the
    /// daemon's digest memo: model path -> file identities and digests).
    /// Opaque to the store: gc, verify and stats never look at it.
    Memo,
    /// counter name (`hits`, `misses`, `puts`) -> u64 big-endian: the
    /// statistics that outlive a restart.
    Counters,
}

impl Tree {
    /// The sled tree's name on disk.
    pub fn name(self) -> &'static str {
        match self {
            Tree::Entries => "entries",
            Tree::BlobRefs => "blob_refs",
            Tree::Access => "access",
            Tree::Leases => "leases",
            Tree::Sources => "sources",
            Tree::Memo => "memo",
            Tree::Counters => "counters",
        }
    }
}

/// One write of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Set `key` to `value` in a tree.
    Put(Tree, Vec<u8>, Vec<u8>),
    /// Remove `key` from a tree (absent is fine).
    Delete(Tree, Vec<u8>),
}

/// What a key must look like for a commit to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Expect {
    /// The key must not exist.
    Absent,
    /// The key must exist, with any value.
    Present,
    /// The key must hold exactly these bytes.
    Equals(Vec<u8>),
}

/// A condition on one key, checked atomically with the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Precondition {
    /// The tree the key is in.
    pub tree: Tree,
    /// The key checked.
    pub key: Vec<u8>,
    /// What it must look like.
    pub expect: Expect,
}

impl Precondition {
    /// A condition that `tree[key]` meets `expect`.
    pub fn new(tree: Tree, key: &[u8], expect: Expect) -> Self {
        Precondition {
            tree,
            key: key.to_vec(),
            expect,
        }
    }
}

/// The index a store keeps its metadata in.
pub trait Index: Send + Sync {
    /// The value of `key`, if any.
    fn get(&self, tree: Tree, key: &[u8]) -> StoreResult<Option<Vec<u8>>>;

    /// Visits, in key order, the pairs whose key starts with `prefix` and
    /// (when given) sorts strictly after `after`, until `visit` returns false.
    /// Iteration sees a consistent-enough snapshot for a cache: each pair is
    /// one committed value, concurrent commits may or may not be seen.
    fn scan(
        &self,
        tree: Tree,
        prefix: &[u8],
        after: Option<&[u8]>,
        visit: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> StoreResult<()>;

    /// Applies `ops` atomically (all or none, also across a crash) if every
    /// precondition holds; returns whether it applied.
    fn commit(&self, when: &[Precondition], ops: &[Op]) -> StoreResult<bool>;

    /// A unique, increasing id (never reused, also across restarts).
    fn next_id(&self) -> StoreResult<u64>;

    /// Makes every commit so far durable.
    fn flush(&self) -> StoreResult<()>;

    /// Bytes the index occupies on disk (for stats).
    fn disk_bytes(&self) -> u64;

    /// Whether the index was opened again after a failed write since the
    /// last call: commits it had not written are lost, so the store brings
    /// it and the record files to agree.
    fn take_reopened(&self) -> bool {
        false
    }

    /// Undoes [`Index::take_reopened`] (the sync it asked for failed).
    fn still_reopened(&self) {}

    /// Opens a failed index again now when that is due, so that the store
    /// brings it and the records to agree before an operation reads it,
    /// not in the middle of one; a failed attempt leaves it as it was.
    fn reopen_if_due(&self) {}
}
