//! Payload output buffers. A large payload (at least [`MAPPED_MIN`] bytes)
//! is written into an anonymous mapping advised `MADV_HUGEPAGE`, so that
//! with transparent huge pages in `madvise` (or `always`) mode its first
//! touch faults in 2 MiB pages instead of 4 KiB ones; a smaller one is a
//! plain `Vec`. Both start zeroed and become [`Bytes`] without a copy.
//!
//! The mapping reserves one spare huge page of address space and the data
//! starts on a 2 MiB boundary, so every 2 MiB window of the data can be a
//! huge page whatever address the kernel picks. The last window is whole
//! too, which costs at most 2 MiB of memory beyond the payload (the packers
//! write every byte, so the rest is touched anyway).

use std::io;
use std::ops::{Deref, DerefMut};

use bytes::Bytes;
use memmap2::MmapMut;

/// The transparent huge page size of x86-64 and most aarch64 kernels.
pub const HUGE_PAGE: usize = 2 << 20;
/// Payloads from this length on are mapped.
pub const MAPPED_MIN: usize = HUGE_PAGE;

/// A zeroed, writable payload buffer.
pub struct OutputBuffer {
    inner: Inner,
}

enum Inner {
    Heap(Vec<u8>),
    Mapped(Mapped),
}

/// An anonymous mapping and the range of it that holds the data.
struct Mapped {
    map: MmapMut,
    start: usize,
    len: usize,
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

impl OutputBuffer {
    /// `len` zero bytes: mapped with huge pages advised from
    /// [`MAPPED_MIN`] on (a `Vec` if the mapping fails), else a `Vec`.
    pub fn zeroed(len: usize) -> OutputBuffer {
        if len >= MAPPED_MIN {
            if let Ok(b) = OutputBuffer::mapped(len) {
                return b;
            }
        }
        OutputBuffer::heap(len)
    }

    /// `len` zero bytes in a `Vec`.
    pub fn heap(len: usize) -> OutputBuffer {
        OutputBuffer {
            inner: Inner::Heap(vec![0u8; len]),
        }
    }

    /// `len` zero bytes in an anonymous mapping advised `MADV_HUGEPAGE`
    /// (whatever the length; the advice is best effort).
    pub fn mapped(len: usize) -> io::Result<OutputBuffer> {
        let map_len = len
            .checked_next_multiple_of(HUGE_PAGE)
            .and_then(|l| l.checked_add(HUGE_PAGE))
            .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "length overflows"))?;
        let map = MmapMut::map_anon(map_len)?;
        let addr = map.as_ptr() as usize;
        let start = addr.next_multiple_of(HUGE_PAGE) - addr;
        #[cfg(target_os = "linux")]
        {
            // Advice only: without THP support the pages stay small.
            let _ = map.advise_range(memmap2::Advice::HugePage, start, map_len - start);
        }
        Ok(OutputBuffer {
            inner: Inner::Mapped(Mapped { map, start, len }),
        })
    }

    /// Whether the bytes live in an anonymous mapping.
    pub fn is_mapped(&self) -> bool {
        matches!(self.inner, Inner::Mapped(_))
    }

    /// The bytes, without a copy (the mapping is unmapped when the last
    /// `Bytes` referring to it is dropped).
    pub fn into_bytes(self) -> Bytes {
        match self.inner {
            Inner::Heap(v) => Bytes::from(v),
            Inner::Mapped(m) => Bytes::from_owner(m),
        }
    }
}

impl Deref for OutputBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.inner {
            Inner::Heap(v) => v,
            Inner::Mapped(m) => m.as_ref(),
        }
    }
}

impl DerefMut for OutputBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.inner {
            Inner::Heap(v) => v,
            Inner::Mapped(m) => &mut m.map[m.start..m.start + m.len],
        }
    }
}

impl std::fmt::Debug for OutputBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputBuffer")
            .field("len", &self.len())
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_is_heap_large_is_mapped_and_bytes_share_the_memory() {
        let small = OutputBuffer::zeroed(MAPPED_MIN - 1);
        assert!(!small.is_mapped());
        assert_eq!(small.len(), MAPPED_MIN - 1);
        assert!(OutputBuffer::zeroed(0).is_empty());
        for len in [MAPPED_MIN, MAPPED_MIN + 12_345, 3 * HUGE_PAGE] {
            let mut b = OutputBuffer::zeroed(len);
            assert!(b.is_mapped(), "{len}");
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            b[0] = 1;
            b[len - 1] = 2;
            let ptr = b.as_ptr();
            let bytes = b.into_bytes();
            assert_eq!(bytes.as_ptr(), ptr, "no copy");
            assert_eq!(bytes.len(), len);
            assert_eq!((bytes[0], bytes[len - 1]), (1, 2));
            let tail = bytes.slice(len - 1..);
            drop(bytes);
            assert_eq!(&tail[..], &[2]);
        }
        let mut h = OutputBuffer::heap(5);
        h.copy_from_slice(b"hello");
        let ptr = h.as_ptr();
        let bytes = h.into_bytes();
        assert_eq!((&bytes[..], bytes.as_ptr()), (&b"hello"[..], ptr));
        let m = OutputBuffer::mapped(3).unwrap();
        assert!(m.is_mapped() && m.len() == 3);
    }
}
