//! Read-only mappings of files that someone else may cut short.
//!
//! Reading a mapped page that lies past the file's end raises SIGBUS, which
//! ends the process: a socket peer could stop the daemon by truncating its
//! own model while the daemon hashes it. Each guarded mapping registers its
//! address range; the SIGBUS handler puts a zero page over the faulting page
//! of a registered range, marks the range cut and returns, so the read goes
//! on (seeing zeros), and the reader asks [`intact`] when it is done and
//! refuses what it read. A fault outside every registered range goes to the
//! handler that was there before (Rust's stack-overflow report, else the
//! default: the process ends as it would have).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

use memmap2::Mmap;

/// Mappings guarded at once; past this a mapping is refused (an unguarded
/// one's SIGBUS would end the process). Four models at the per-model bound
/// of external-data files fit.
const SLOTS: usize = 4 * super::external::MAX_EXTERNAL_FILES;

struct Slot {
    /// First byte of the range; 0 when the slot is free.
    start: AtomicUsize,
    len: AtomicUsize,
    cut: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    cut: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
/// Registered ranges now marked cut: `intact` is one load while none is.
static CUTS: AtomicUsize = AtomicUsize::new(0);
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// The SIGBUS action found at install, restored for faults not ours.
struct Previous(libc::sigaction);
// SAFETY: a plain C struct of integers and a function address, only read.
unsafe impl Sync for Previous {}
unsafe impl Send for Previous {}
static PREVIOUS: OnceLock<Previous> = OnceLock::new();

/// A read-only mapping whose pages read as zeros, instead of ending the
/// process, once the file is cut short under it.
pub(crate) struct Guarded {
    map: Mmap,
    slot: usize,
}

impl Guarded {
    /// The mapping, guarded; `None` (and unmapped) when every slot is
    /// taken.
    pub(crate) fn new(map: Mmap) -> Option<Guarded> {
        install();
        let start = map.as_ptr() as usize;
        let slot = TABLE.iter().position(|s| {
            s.start
                .compare_exchange(0, start, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })?;
        TABLE[slot].len.store(map.len(), Ordering::Release);
        Some(Guarded { map, slot })
    }
}

impl AsRef<[u8]> for Guarded {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let i = self.slot;
        // Unregistered before the unmap (the field drops after this).
        if TABLE[i].cut.swap(false, Ordering::AcqRel) {
            CUTS.fetch_sub(1, Ordering::AcqRel);
        }
        TABLE[i].len.store(0, Ordering::Release);
        TABLE[i].start.store(0, Ordering::Release);
    }
}

/// False when `data` lies in a guarded mapping that was cut short: some of
/// it read as zeros, not as the file.
pub fn intact(data: &[u8]) -> bool {
    if CUTS.load(Ordering::Acquire) == 0 || data.is_empty() {
        return true;
    }
    let (lo, hi) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    !TABLE.iter().any(|s| {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        start != 0 && start < hi && lo < start + len && s.cut.load(Ordering::Acquire)
    })
}

/// Gives back this process's hold on the whole pages inside `data` when it
/// lies in a guarded mapping (`MADV_DONTNEED`): they stop counting toward
/// the process's resident memory, the page cache keeps them, and a later
/// read faults them in again from there. A reader that streams a large
/// tensor releases each window after reading it, so a pass over a model
/// keeps one window resident rather than the whole file. Bytes outside
/// every guarded mapping (a model held in memory) are left alone: the advice
/// would zero them.
pub fn release(data: &[u8]) {
    if data.is_empty() {
        return;
    }
    let (lo, hi) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let mapped = TABLE.iter().any(|s| {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        start != 0 && start <= lo && hi <= start + len
    });
    let page = PAGE.load(Ordering::Relaxed);
    let (first, end) = (lo.next_multiple_of(page), hi & !(page - 1));
    if mapped && first < end {
        // SAFETY: [first, end) lies inside a live read-only file mapping
        // (the caller's `data` borrows it): dropping its page-table entries
        // changes no byte a reader sees, only when the page is faulted in.
        unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_DONTNEED) };
    }
}

/// What a reader says when [`intact`] is false.
pub const CUT_SHORT: &str = "the file was cut short while being read (truncated under its mapping)";

/// An error unless every part is [`intact`] (for writers that copy mapped
/// bytes out: their output is dropped).
pub fn ensure_intact<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> std::io::Result<()> {
    if parts.into_iter().all(intact) {
        Ok(())
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            CUT_SHORT,
        ))
    }
}

fn install() {
    PREVIOUS.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::Relaxed);
        }
        // SAFETY: zeroed is a valid sigaction (no handler, empty mask); both
        // pointers are valid for the call.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGBUS, &new, &mut old);
            Previous(old)
        }
    });
}

/// Only async-signal-safe work: atomics, `mmap`, `sigaction`.
extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO.
    let addr = unsafe { (*info).si_addr() } as usize;
    let page = PAGE.load(Ordering::Relaxed);
    for s in &TABLE {
        let start = s.start.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        if start == 0 || addr < start || addr - start >= len {
            continue;
        }
        // SAFETY: the page lies in a live mapping of ours (the reader that
        // faulted holds it); a private zero page replaces it in place.
        let zero = unsafe {
            libc::mmap(
                (addr & !(page - 1)) as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if zero != libc::MAP_FAILED {
            if !s.cut.swap(true, Ordering::AcqRel) {
                CUTS.fetch_add(1, Ordering::AcqRel);
            }
            return;
        }
        break;
    }
    // Not ours (or no zero page): the previous action takes the fault when
    // the instruction runs again.
    if let Some(Previous(old)) = PREVIOUS.get() {
        // SAFETY: restoring an action the kernel gave us.
        unsafe { libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_cut_short_under_its_mapping_reads_as_zeros_and_says_so() {
        let page = PAGE.load(Ordering::Relaxed).max(4096);
        let mut cut = tempfile::tempfile().unwrap();
        cut.write_all(&vec![7u8; 3 * page]).unwrap();
        let mut kept = tempfile::tempfile().unwrap();
        kept.write_all(&vec![9u8; page]).unwrap();
        // SAFETY: test files, read-only mappings.
        let a = Guarded::new(unsafe { Mmap::map(&cut) }.unwrap()).unwrap();
        let b = Guarded::new(unsafe { Mmap::map(&kept) }.unwrap()).unwrap();
        assert!(intact(a.as_ref()) && intact(b.as_ref()));
        cut.set_len(page as u64).unwrap();
        let data = a.as_ref();
        assert_eq!(data[0], 7, "the page still in the file reads as the file");
        assert_eq!(data[2 * page + 5], 0, "a page past the end reads as zeros");
        assert!(!intact(data));
        assert!(!intact(&data[2 * page..]));
        assert!(intact(b.as_ref()), "other mappings are not marked");
        assert_eq!(b.as_ref()[0], 9);
        drop(a);
        // The slot is free again, and a new mapping starts intact.
        let c = Guarded::new(unsafe { Mmap::map(&kept) }.unwrap()).unwrap();
        assert!(intact(c.as_ref()));
    }
}
