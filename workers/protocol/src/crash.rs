//! A crash near the memory bound is the memory bound. Not every runtime
//! checks every allocation: OpenVINO, out of RLIMIT_DATA, may fault
//! instead of throwing `std::bad_alloc`. A worker that faults (SIGSEGV,
//! SIGBUS) or aborts with its data segment within a quarter of the bound
//! says so and exits 4; any other crash stays the crash it is.

use std::sync::atomic::{AtomicU64, Ordering};

/// The bound and the page size, read once (the handler may call nothing
/// that is not async-signal-safe).
static LIMIT: AtomicU64 = AtomicU64::new(0);
static PAGE: AtomicU64 = AtomicU64::new(0);

/// Installs the handler, on an alternate stack of its own (a fault from a
/// stack overflow leaves none). Without a finite RLIMIT_DATA there is
/// nothing to name, and nothing is installed.
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
    let stack: &'static mut [u8] = Box::leak(vec![0u8; 64 * 1024].into_boxed_slice());
    let alt = libc::stack_t {
        ss_sp: stack.as_mut_ptr().cast(),
        ss_flags: 0,
        ss_size: stack.len(),
    };
    // SAFETY: the alternate stack is leaked memory that lives as long as
    // the process; the sigaction is fully initialized before it is set,
    // and its handler only makes async-signal-safe calls.
    unsafe {
        libc::sigaltstack(&alt, std::ptr::null_mut());
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_crash as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_ONSTACK | libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT] {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The handler: exit 4 with the numbers when the data segment is near the
/// bound; else the signal again, now at its default action, which ends
/// the process as it would have (a fault would also recur on return, a
/// signal sent by another process would not).
extern "C" fn on_crash(sig: libc::c_int) {
    let (limit, page) = (LIMIT.load(Ordering::Relaxed), PAGE.load(Ordering::Relaxed));
    let data = data_pages().map_or(0, |p| p.saturating_mul(page));
    if data < limit - limit / 4 {
        // SAFETY: raise is async-signal-safe; the signal stays pending
        // until this handler returns.
        unsafe { libc::raise(sig) };
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
