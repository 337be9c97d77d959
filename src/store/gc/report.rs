//! What gc is asked to collect and what it reports: the policy, the
//! items removed (or to remove, in a dry run) and why.

use std::path::PathBuf;
use std::time::Duration;

use crate::store::entry;
use crate::store::key::EntryKey;

/// What to collect. The default collects nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcPolicy {
    /// Remove least recently used entries until the payload files of the
    /// remaining ones take at most this many bytes.
    pub max_bytes: Option<u64>,
    /// Remove entries not accessed for this long or longer (zero: every
    /// entry not leased, like a `max_bytes` of zero).
    pub max_age: Option<Duration>,
    /// First of all, remove the least recently used entries packed for an
    /// untrusted uid's requests until each uid's take at most this many
    /// bytes.
    pub max_bytes_per_uid: Option<u64>,
    /// Remove payload files without entries and entries without files.
    pub orphans: bool,
    /// Remove temp files left by writers that are gone.
    pub temp_files: bool,
    /// Report what would go, change nothing.
    pub dry_run: bool,
}

/// Why gc removed (or, in a dry run, would remove) an item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcReason {
    /// Not accessed for `idle`.
    MaxAge {
        /// Time since the entry's last access.
        idle: Duration,
    },
    /// Least recently used while the store was over `max_bytes`.
    OverBudget,
    /// Least recently used of the entries packed for `uid` while they were
    /// over `max_bytes_per_uid`.
    OverQuota {
        /// The uid whose requests had them packed.
        uid: u32,
    },
    /// The entry's payload file is missing.
    MissingPayload,
    /// A payload file no entry references.
    OrphanPayload,
    /// A file in blobs/ that is not a payload file.
    StrayFile,
    /// A temp file of a writer that is gone.
    StaleTemp,
}

/// What a gc item removes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GcTarget {
    /// An index entry (its payload file goes with its last entry).
    Entry(EntryKey),
    /// A file under the cache dir with no entry.
    File(PathBuf),
}

/// One thing gc removed, or would remove in a dry run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcItem {
    /// The entry or file.
    pub target: GcTarget,
    /// Why it goes.
    pub reason: GcReason,
    /// Bytes of files deleted with it (0 when an entry's payload file is
    /// still referenced by other entries).
    pub bytes_freed: u64,
    /// Bytes of files unlinked with it that stay on disk through hard links
    /// outside the store (never counted as freed).
    pub bytes_still_linked: u64,
    /// What an entry was packed from, for people reading the report
    /// (`None` for files).
    pub about: Option<EntryAbout>,
}

/// An entry's physical type and the names it was packed under.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryAbout {
    /// The physical type's name.
    pub type_name: String,
    /// Initializer names the entry was packed under.
    pub source_names: Vec<String>,
    /// Model files the entry was packed from.
    pub model_paths: Vec<String>,
}

impl From<entry::Record> for EntryAbout {
    fn from(r: entry::Record) -> EntryAbout {
        EntryAbout {
            type_name: r.type_name,
            source_names: r.source_names,
            model_paths: r.model_paths,
        }
    }
}

/// What a gc run did (or, in a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// True when nothing was removed, only planned.
    pub dry_run: bool,
    /// In execution order: entries, then files, then temp files.
    pub items: Vec<GcItem>,
    /// Total bytes of the files removed.
    pub bytes_freed: u64,
    /// Bytes of the files unlinked that stay on disk through hard links
    /// outside the store: out of gc's reach, never counted as freed.
    pub bytes_still_linked: u64,
    /// Bytes of referenced payload files before and after (as planned).
    pub bytes_before: u64,
    /// Bytes of referenced payload files after the run (as planned in a dry run).
    pub bytes_after: u64,
    /// The limits applied (the policy's).
    pub max_bytes: Option<u64>,
    /// The idle-age limit applied, if any.
    pub max_age: Option<Duration>,
    /// Entries a policy selected but a lease kept.
    pub leased_kept: u64,
    /// Expired lease records removed (or, dry, that would be).
    pub expired_leases: u64,
}
