//! A crash near the memory bound is the memory bound. Not every runtime
//! checks every allocation: OpenVINO, out of RLIMIT_DATA, may fault
//! instead of throwing `std::bad_alloc`. A worker that faults (SIGSEGV,
//! SIGBUS) or aborts with its data segment within a quarter of the bound
//! says so and exits 4; any other crash stays the crash it is.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The bound and the page size, read once (the handler may call nothing
/// that is not async-signal-safe).
static LIMIT: AtomicU64 = AtomicU64::new(0);
static PAGE: AtomicU64 = AtomicU64::new(0);

/// The signals handled, and the actions they had before (Rust's own
/// stack-overflow handler for SIGSEGV and SIGBUS), put back for a crash
/// far from the bound.
const SIGNALS: [libc::c_int; 3] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT];
static BEFORE: OnceLock<[Action; 3]> = OnceLock::new();

/// A saved sigaction (plain data, read by the handler).
struct Action(libc::sigaction);
// SAFETY: a sigaction is plain data (a handler address, a mask, flags);
// it is written once before the handler is set and only read after.
unsafe impl Sync for Action {}
unsafe impl Send for Action {}

/// Installs the handler (on the main thread's alternate stack, where a
/// fault from its stack overflowing still runs it; other threads' run on
/// their own stacks). Without a finite RLIMIT_DATA there is nothing to
/// name, and nothing is installed.
pub fn name_crashes_near_the_bound() {
    // SAFETY: an all-zero rlimit is a valid value that getrlimit fills.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit writes only into `rl`, which this frame owns.
    if unsafe { libc::getrlimit(libc::RLIMIT_DATA, &mut rl) } != 0
        || rl.rlim_cur == libc::RLIM_INFINITY
    {
        return;
    }
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    LIMIT.store(rl.rlim_cur, Ordering::Relaxed);
    PAGE.store(page, Ordering::Relaxed);
    // SAFETY: the alternate stack is leaked memory that lives as long as
    // the process; the sigactions are fully initialized (zeroed, then
    // filled by the kernel or here) before they are used, and the handler
    // only makes async-signal-safe calls.
    unsafe {
        let before = SIGNALS.map(|sig| {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut old);
            Action(old)
        });
        if BEFORE.set(before).is_err() {
            return; // installed already
        }
        let stack: &'static mut [u8] = Box::leak(vec![0u8; 64 * 1024].into_boxed_slice());
        let alt = libc::stack_t {
            ss_sp: stack.as_mut_ptr().cast(),
            ss_flags: 0,
            ss_size: stack.len(),
        };
        libc::sigaltstack(&alt, std::ptr::null_mut());
        // Not reset on entry: threads that fault at once (a runtime's
        // workers, all short of memory) each get the handler.
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_crash as Handler as libc::sighandler_t;
        sa.sa_flags = libc::SA_ONSTACK | libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in SIGNALS {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

type Handler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

/// The handler: exit 4 with the numbers when the data segment is near the
/// bound. Else the crash ends the process as it would have: a fault finds
/// the action it had before (put back here) when it recurs on return; a
/// signal sent by a process, which does not recur, is raised again at its
/// default action.
extern "C" fn on_crash(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let (limit, page) = (LIMIT.load(Ordering::Relaxed), PAGE.load(Ordering::Relaxed));
    let data = data_pages().map_or(0, |p| p.saturating_mul(page));
    if data < limit - limit / 4 {
        // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO;
        // sigaction and raise are async-signal-safe, and the raised signal
        // stays pending until this handler returns.
        unsafe {
            let fault = !info.is_null() && (*info).si_code > 0;
            let before = BEFORE
                .get()
                .and_then(|b| SIGNALS.iter().position(|s| *s == sig).map(|i| &b[i].0));
            match before {
                Some(old) if fault => libc::sigaction(sig, old, std::ptr::null_mut()),
                _ => libc::sigaction(sig, &default_action(), std::ptr::null_mut()),
            };
            if !fault {
                libc::raise(sig);
            }
        }
        return;
    }
    let mut msg = Line::default();
    msg.push(b"the worker crashed (signal ");
    msg.number(sig as u64);
    msg.push(b") with ");
    msg.number(data >> 20);
    msg.push(b" MiB of its ");
    msg.number(limit >> 20);
    msg.push(b" MiB data bound (RLIMIT_DATA) in use: out of memory\n");
    // SAFETY: write and _exit are async-signal-safe; `msg` is this frame's.
    unsafe {
        libc::write(2, msg.buf.as_ptr().cast(), msg.len);
        libc::_exit(crate::Failure::OutOfMemory as i32);
    }
}

/// SIG_DFL, as a sigaction.
fn default_action() -> libc::sigaction {
    // SAFETY: an all-zero sigaction is SIG_DFL with no flags and an empty
    // mask.
    unsafe { std::mem::zeroed() }
}

/// The data segment in pages: the sixth field of /proc/self/statm, read
/// with async-signal-safe calls into a buffer on the stack.
fn data_pages() -> Option<u64> {
    let mut buf = [0u8; 256];
    // SAFETY: open, read and close are async-signal-safe; read writes at
    // most `buf.len()` bytes into `buf`.
    let n = unsafe {
        let fd = libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    let field = text.split(|b| *b == b' ').nth(5)?;
    field
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .try_fold(0u64, |v, b| {
            v.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })
}

/// A line built without allocating.
struct Line {
    buf: [u8; 192],
    len: usize,
}

impl Default for Line {
    fn default() -> Self {
        Line {
            buf: [0; 192],
            len: 0,
        }
    }
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn number(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_holds_its_numbers() {
        let mut l = Line::default();
        l.push(b"a ");
        l.number(0);
        l.push(b" ");
        l.number(u64::MAX);
        assert_eq!(&l.buf[..l.len], b"a 0 18446744073709551615");
    }

    #[test]
    fn the_data_segment_is_read() {
        assert!(data_pages().is_some_and(|p| p > 0));
    }
}
