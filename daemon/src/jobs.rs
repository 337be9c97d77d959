//! The vocabulary of pack jobs shared by the scheduler's instance, the use
//! cases and the event feed: a job's identity, its result and its progress
//! as callers see it.

use std::time::Duration;

use ctcache::store::Entry;
use ctcache_kernels::Backend;

use crate::error::ErrorKind;
use crate::policy::Wanted;
use crate::scheduler::JobHandle;

/// A set of submitted jobs, each with the pair it packs.
pub(crate) type Jobs = Vec<(Wanted, JobHandle<Packed>)>;

/// Identity of a pack job: same source content, format and parameters,
/// read from the same file. Requests about different files of the same
/// content pack apart, so that one caller changing its copy fails its own
/// job only, never a job another caller joined.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct JobKey {
    pub source: [u8; 32],
    pub format: String,
    pub params: String,
    /// (device, inode) of the file holding the tensor's bytes (`None` for a
    /// model in memory).
    pub file: Option<(u64, u64)>,
}

/// A finished pack job.
#[derive(Debug, Clone)]
pub(crate) struct Packed {
    pub entry: Entry,
    /// True when nothing was packed here: the entry was in the store, or
    /// came from the fleet tier's remote.
    pub cached: bool,
    /// The backend that packed it (`None` when nothing was packed).
    pub backend: Option<Backend>,
}

/// Where a job stands, as followers see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobPhase {
    Queued,
    Running,
    /// Packed and stored now.
    Done,
    /// Found in the store; nothing was packed.
    Cached,
    Failed,
    Cancelled,
}

/// One job's progress within a request.
#[derive(Debug, Clone)]
pub(crate) struct JobProgress {
    pub job_id: u64,
    pub initializer: String,
    pub format: String,
    pub phase: JobPhase,
    /// Jobs of the request finished so far, and in all.
    pub done: u32,
    pub total: u32,
    pub entry: Option<Entry>,
    pub error: String,
    /// Why a failed or cancelled job ended, as a caller's error would say.
    pub failure: Option<ErrorKind>,
    pub backend: Option<Backend>,
    pub pack_duration: Duration,
}
