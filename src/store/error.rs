//! The store's error type: every failure names the cache dir, file, entry or
//! lease concerned, and what to do about it where there is something to do.

use std::path::PathBuf;

use super::key::{EntryKey, InvalidKey};
use super::lease::record::LeaseId;

/// The store's result type.
pub(crate) type StoreResult<T> = Result<T, StoreError>;

/// Why a store operation failed; every variant names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file system call failed.
    #[error("cannot {op} {}: {source}", .path.display())]
    Io {
        /// What was being done, e.g. `open`, `write`, `publish`.
        op: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Another process holds the cache dir's lock.
    #[error(
        "cache dir {} is in use by another process{}; only one process may own a cache dir",
        .dir.display(),
        owner(.pid)
    )]
    Locked {
        /// The cache dir.
        dir: PathBuf,
        /// The holder's pid, when its lock file names one.
        pid: Option<u32>,
    },
    /// The cache dir was written by a newer build with another layout.
    #[error(
        "cache dir {} has store layout version {found}, newer than this build supports \
         ({supported}); upgrade ctcache or point it at another cache dir",
        .dir.display()
    )]
    NewerLayout {
        /// The cache dir.
        dir: PathBuf,
        /// The layout version found in its `LAYOUT` file.
        found: u32,
        /// The newest layout version this build reads.
        supported: u32,
    },
    /// The cache dir's `LAYOUT` file does not read or parse.
    #[error("cache dir {}: unreadable LAYOUT file: {detail}", .dir.display())]
    BadLayout {
        /// The cache dir.
        dir: PathBuf,
        /// What is wrong with the file.
        detail: String,
    },
    /// The index (sled) failed an operation.
    #[error("store index ({op}): {message}")]
    Index {
        /// The operation, e.g. `open`, `get`, `commit`.
        op: &'static str,
        /// sled's error, as text.
        message: String,
    },
    /// The index's files do not decode (sled's log torn or damaged); the
    /// store sets it aside and starts an empty one at open.
    #[error("store index {} is corrupt: {detail}", .path.display())]
    IndexCorrupt {
        /// The index folder.
        path: PathBuf,
        /// sled's error, as text.
        detail: String,
    },
    /// An index record does not decode or contradicts its key.
    #[error("corrupt index record ({what}): {detail}")]
    Record {
        /// Which record, e.g. its key.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The file system filled up while a payload was written; nothing was stored.
    #[error(
        "no space left on device in {} after writing {written} payload bytes; \
         nothing was stored and the store is unchanged",
        .dir.display()
    )]
    NoSpace {
        /// The folder written to.
        dir: PathBuf,
        /// Payload bytes written before the failure.
        written: u64,
    },
    /// The index's file system is full; the change was not made.
    #[error("store index ({op}): no space left on device; the change was not made")]
    IndexNoSpace {
        /// What the index was doing.
        op: &'static str,
    },
    /// The caller's payload reader failed; nothing was stored.
    #[error("reading the payload to store failed after {read} bytes: {source}")]
    PayloadRead {
        /// Bytes read before the failure.
        read: u64,
        /// The reader's error.
        #[source]
        source: std::io::Error,
    },
    /// A new entry breaks a rule (payload length, type, dims, ...); the text says which.
    #[error("invalid entry: {0}")]
    InvalidEntry(String),
    /// An entry key does not parse.
    #[error(transparent)]
    InvalidKey(#[from] InvalidKey),
    /// No entry has this key.
    #[error("no entry {0}")]
    NotFound(EntryKey),
    /// The entry cannot be removed while a lease holds it.
    #[error("entry {key} is leased until {until_ms} (unix ms); release the lease first")]
    Leased {
        /// The leased entry.
        key: EntryKey,
        /// When the last lease on it ends, unix ms.
        until_ms: u64,
    },
    /// No live lease of this holder has this id (never issued, released,
    /// expired, or another holder's: one answer, so that lease ids cannot
    /// be probed).
    #[error("unknown or expired lease {0}")]
    UnknownLease(LeaseId),
    /// A renewal past the most a lease may last from when it was taken.
    #[error(
        "{id} is {}s old, the most a lease may last: take a new one",
        .max.as_secs()
    )]
    LeaseLifetimeOver {
        /// The lease.
        id: LeaseId,
        /// Its lifetime cap.
        max: std::time::Duration,
    },
    /// The holder already has the most live leases allowed.
    #[error("{} holds {max} live leases, the most allowed; release some first", match .owner { Some(u) => format!("uid {u}"), None => "this holder".to_string() })]
    TooManyLeases {
        /// The holder's uid; `None` for an unnamed holder.
        owner: Option<u32>,
        /// The limit per holder.
        max: usize,
    },
    /// A payload's bytes differ from what its entry records (length or hash).
    #[error("payload of {key} ({}) is damaged: {detail}; run verify", .path.display())]
    PayloadDamaged {
        // Boxed: keeps every `StoreResult` small.
        /// The entry read.
        key: Box<EntryKey>,
        /// The payload file.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The payload's bytes do not hash to its name: it was quarantined and
    /// the entries using it dropped (pack them again from their model paths).
    #[error(
        "payload of {key} ({}) does not hash to its name: quarantined{}, {} entr{} dropped",
        .path.display(),
        .quarantined.as_ref().map(|q| format!(" to {}", q.display())).unwrap_or_default(),
        .dropped.len(),
        if .dropped.len() == 1 { "y" } else { "ies" }
    )]
    PayloadCorrupt {
        /// The entry read.
        key: Box<EntryKey>,
        /// The payload file, at its old place.
        path: PathBuf,
        /// Every entry that used the payload, now removed from the index.
        dropped: Vec<EntryKey>,
        /// Where the file was moved; `None` when moving it failed.
        quarantined: Option<PathBuf>,
    },
}

fn owner(pid: &Option<u32>) -> String {
    match pid {
        Some(p) => format!(" (pid {p})"),
        None => String::new(),
    }
}

/// Whether an I/O error means the file system (or the user's quota) is
/// full: the one rule for payloads, records and the index.
pub(crate) fn io_is_no_space(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    ) || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl StoreError {
    /// Whether the file system is full (a payload, record or index write).
    pub fn is_no_space(&self) -> bool {
        matches!(
            self,
            StoreError::NoSpace { .. } | StoreError::IndexNoSpace { .. }
        )
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn record(what: impl Into<String>, detail: impl ToString) -> Self {
        StoreError::Record {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}
