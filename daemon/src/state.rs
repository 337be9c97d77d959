//! The daemon's shared state: config, store, host description, scheduler,
//! digest memo, watcher and event feed. Use cases (`ops/`) take it by
//! reference; nothing here knows gRPC.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctcache::hit::{Accept, Host};
use ctcache::store::{Entry, HostFilter, Store};

use crate::config::Config;
use crate::cpu_budget::CpuBudget;
use crate::events::Events;
use crate::fleet::Fleet;
use crate::flights::Flights;
use crate::handouts::Handouts;
use crate::hash_budget::HashBudget;
use crate::jobs::{JobKey, Packed};
use crate::memo::Memo;
use crate::runtimes::Runtimes;
use crate::scheduler::Scheduler;
use crate::shares::Shares;
use crate::watcher::Watcher;

/// Everything the use cases share.
pub(crate) struct Daemon {
    pub config: Config,
    pub store: Arc<Store>,
    /// This host's devices, runtime and the layouts its packers produce.
    pub host: Host,
    /// The lookup filter of `host` (only daemon-packed entries when so
    /// configured), prepared once.
    pub host_filter: HostFilter,
    pub scheduler: Scheduler<JobKey, Packed>,
    pub events: Events,
    pub watcher: Watcher,
    pub memo: Memo,
    /// Hashing each untrusted uid may make the daemon do.
    pub hash_budget: HashBudget,
    /// Each untrusted uid's CPU time in the last hour.
    pub cpu_budget: Arc<CpuBudget>,
    pub started: Instant,
    /// The Unix socket's path, for `status`.
    pub socket: Option<PathBuf>,
    /// The fleet tier, when `[remote]` is configured.
    pub fleet: Option<Fleet>,
    /// The models callers handed over on the descriptor channel.
    pub handouts: Handouts,
    /// The start-up reconcile of the store has ended (Status says so).
    pub reconciled: AtomicBool,
    /// The runtimes the admin configured, as their workers found them.
    pub runtimes: Runtimes,
    /// The host CPU's exact tier (`x86_64-avx2`), which every runtime
    /// form is keyed by.
    pub host_tier: String,
    /// The compiles running, shared by the requests of one key: the form,
    /// and how long its compile took (`None`: fetched from the fleet).
    pub compiles:
        Flights<ctcache::store::EntryKey, crate::error::Result<(Entry, Option<Duration>)>>,
    /// How many workers compile at once (each is a whole runtime).
    pub compile_slots: tokio::sync::Semaphore,
    /// The form fetches running, shared by the compiles and pulls of one
    /// form (`None`: not taken).
    pub form_fetches: Flights<ctcache::store::EntryKey, crate::error::Result<Option<Entry>>>,
    /// Each untrusted uid's compiles waiting or running.
    pub compile_shares: Shares,
    /// The digest of each materialized model a target's form was asked
    /// of, by the identity of its in-memory answer: a warm request is
    /// spared putting its weights inline and hashing them.
    pub target_digests: std::sync::Mutex<hashlink::LruCache<[u8; 32], [u8; 32]>>,
}

/// Materialized models whose digests are remembered (64 bytes each).
const TARGET_DIGESTS: usize = 4096;

/// Workers compiling at once: one, so that a compile never takes more
/// than a core or two from packing and serving.
const COMPILE_SLOTS: usize = 1;

/// Compiles an untrusted uid may wait for at once: each holds the one
/// slot for up to 600 s, so more would only queue ahead of other users.
pub(crate) const COMPILES_PER_UID: usize = 2;

impl Daemon {
    pub fn new(
        config: Config,
        store: Arc<Store>,
        socket: Option<PathBuf>,
        fleet: Option<Fleet>,
    ) -> Daemon {
        let host = Host::new(
            ctcache_kernels::compile::host_devices(),
            None,
            Accept::Known(ctcache_kernels::registry::known_types()),
        );
        let host_filter = host
            .clone()
            .daemon_produced_only(config.daemon_produced_only);
        // A GPU lane only for a hardware adapter: a software one (lavapipe)
        // is slower than the CPU kernels.
        let gpu_workers = usize::from(config.gpu && ctcache_kernels::compile::hardware_gpu());
        let scheduler = Scheduler::new(
            config.worker_count(),
            gpu_workers,
            config.memory_budget,
            config.max_queued_jobs_per_uid,
        );
        let memo = Memo::new(
            store.clone(),
            crate::memo::Bounds {
                entries: config.max_memo_entries,
                bytes: usize::try_from(config.max_memo_bytes).unwrap_or(usize::MAX),
            },
        );
        let watcher = Watcher::new(&config.watch, config.max_watches_per_uid);
        let events = Events::new(config.max_event_subscribers);
        let hash_budget = HashBudget::new(config.max_hashed_bytes_per_uid_per_hour);
        let cpu_budget = CpuBudget::new(config.max_cpu_secs_per_uid_per_hour);
        let runtimes = Runtimes::of(&config);
        Daemon {
            config,
            store,
            host,
            host_filter,
            scheduler,
            events,
            watcher,
            memo,
            hash_budget,
            cpu_budget,
            started: Instant::now(),
            socket,
            fleet,
            handouts: Handouts::new(crate::handouts::files_per_uid()),
            reconciled: AtomicBool::new(false),
            runtimes,
            host_tier: ctcache::device::host_cpu().architecture,
            compiles: Flights::default(),
            form_fetches: Flights::default(),
            compile_slots: tokio::sync::Semaphore::new(COMPILE_SLOTS),
            compile_shares: Shares::new(COMPILES_PER_UID),
            target_digests: std::sync::Mutex::new(hashlink::LruCache::new(TARGET_DIGESTS)),
        }
    }
}
