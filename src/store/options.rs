//! How a store is opened: index flush policy, durability switches, bounds,
//! the clock, and the write-fault hook tests use to simulate a full disk.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Called before each chunk of a payload is written to its temp file, with
/// the number of bytes written so far; an error it returns is treated as the
/// write's own error. Tests inject `ENOSPC` this way.
pub type WriteFault = Arc<dyn Fn(u64) -> io::Result<()> + Send + Sync>;

/// Milliseconds since the Unix epoch, from the system clock or a test's
/// hand-moved one (GC ages and lease expiry are computed with it).
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl Clock {
    /// The system's wall clock.
    pub fn system() -> Clock {
        Clock(Arc::new(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0)
        }))
    }

    /// A clock that reads `now` (unix ms); tests move it by storing into it.
    pub fn manual(now: Arc<AtomicU64>) -> Clock {
        Clock(Arc::new(move || now.load(Ordering::SeqCst)))
    }

    /// The current time, unix ms.
    pub fn now_ms(&self) -> u64 {
        (self.0)()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Clock({})", self.now_ms())
    }
}

/// Options of [`Store::open`](super::Store::open).
#[derive(Clone)]
pub struct StoreOptions {
    /// How often the index writes its log to disk in the background. A crash
    /// (or power loss) loses at most the entries committed in this window;
    /// their payload files become orphans that `reconcile`/GC remove.
    /// `None` flushes only on explicit [`Store::flush`](super::Store::flush),
    /// removals and drop.
    pub flush_every: Option<Duration>,
    /// Flush the index after every put, so a put that returned survives power
    /// loss (one more fsync per put).
    pub durable_puts: bool,
    /// fsync payload files and their folders before publishing. Turning it
    /// off is only for tests and benches that build large stores quickly: a
    /// process crash is still safe, a power loss is not.
    pub fsync: bool,
    /// Bytes of index pages kept in memory.
    pub index_cache_bytes: u64,
    /// Most source names and model paths remembered per entry.
    pub max_seen: usize,
    /// Pending access records written to the index once this many pile up...
    pub access_batch: usize,
    /// ...or once this much time passed since the last write.
    pub access_interval: Duration,
    /// Entries removed per GC step (one index commit each).
    pub gc_batch: usize,
    /// Sources whose decoded entries lookups keep in memory (1-2 KiB per
    /// entry, most of it the struct type, and about as much again for the
    /// encoded answers a server keeps beside it); 0 turns the cache off.
    pub lookup_cache_sources: usize,
    /// Where gc ages and lease expiry read the time.
    pub clock: Clock,
    /// A test hook that fails payload writes; `None` in production.
    pub write_fault: Option<WriteFault>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            flush_every: Some(Duration::from_millis(500)),
            durable_puts: false,
            fsync: true,
            index_cache_bytes: 64 << 20,
            max_seen: 16,
            access_batch: 1024,
            access_interval: Duration::from_secs(1),
            gc_batch: 256,
            lookup_cache_sources: 1 << 17,
            clock: Clock::system(),
            write_fault: None,
        }
    }
}

impl fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreOptions")
            .field("flush_every", &self.flush_every)
            .field("durable_puts", &self.durable_puts)
            .field("fsync", &self.fsync)
            .field("index_cache_bytes", &self.index_cache_bytes)
            .field("max_seen", &self.max_seen)
            .field("access_batch", &self.access_batch)
            .field("access_interval", &self.access_interval)
            .field("gc_batch", &self.gc_batch)
            .field("lookup_cache_sources", &self.lookup_cache_sources)
            .field("clock", &self.clock)
            .field("write_fault", &self.write_fault.is_some())
            .finish()
    }
}
