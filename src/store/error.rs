//! The store's error type: every failure names the cache dir, file, entry or
//! lease concerned, and what to do about it where there is something to do.

use std::path::PathBuf;

use super::key::EntryKey;
use super::lease::LeaseId;

pub type StoreResult<T> = Result<T, StoreError>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot {op} {}: {source}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cache dir {} is in use by another process{}; only one process may own a cache dir",
        .dir.display(),
        owner(.pid)
    )]
    Locked { dir: PathBuf, pid: Option<u32> },
    #[error(
        "cache dir {} has store layout version {found}, newer than this build supports \
         ({supported}); upgrade ctcache or point it at another cache dir",
        .dir.display()
    )]
    NewerLayout {
        dir: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("cache dir {}: unreadable LAYOUT file: {detail}", .dir.display())]
    BadLayout { dir: PathBuf, detail: String },
    #[error("store index ({op}): {message}")]
    Index { op: &'static str, message: String },
    /// The index's files do not decode (sled's log torn or damaged); the
    /// store sets it aside and starts an empty one at open.
    #[error("store index {} is corrupt: {detail}", .path.display())]
    IndexCorrupt { path: PathBuf, detail: String },
    #[error("corrupt index record ({what}): {detail}")]
    Record { what: String, detail: String },
    #[error(
        "no space left on device in {} after writing {written} payload bytes; \
         nothing was stored and the store is unchanged",
        .dir.display()
    )]
    NoSpace { dir: PathBuf, written: u64 },
    #[error("reading the payload to store failed after {read} bytes: {source}")]
    PayloadRead {
        read: u64,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid entry: {0}")]
    InvalidEntry(String),
    #[error("invalid entry key {text:?}: {detail}")]
    InvalidKey { text: String, detail: String },
    #[error("no entry {0}")]
    NotFound(EntryKey),
    #[error("entry {key} is leased until {until_ms} (unix ms); release the lease first")]
    Leased { key: EntryKey, until_ms: u64 },
    #[error("unknown or expired lease {0}")]
    UnknownLease(LeaseId),
    #[error("{0} belongs to another holder")]
    NotLeaseOwner(LeaseId),
    #[error("{} holds {max} live leases, the most allowed; release some first", match .owner { Some(u) => format!("uid {u}"), None => "this holder".to_string() })]
    TooManyLeases { owner: Option<u32>, max: usize },
    #[error("payload of {key} ({}) is damaged: {detail}; run verify", .path.display())]
    PayloadDamaged {
        // Boxed: keeps every `StoreResult` small.
        key: Box<EntryKey>,
        path: PathBuf,
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
        key: Box<EntryKey>,
        path: PathBuf,
        dropped: Vec<EntryKey>,
        quarantined: Option<PathBuf>,
    },
}

fn owner(pid: &Option<u32>) -> String {
    match pid {
        Some(p) => format!(" (pid {p})"),
        None => String::new(),
    }
}

impl StoreError {
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
