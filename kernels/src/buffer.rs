//! Payload output buffers. A large payload (at least [`MAPPED_MIN`] bytes)
//! is written into an anonymous mapping advised `MADV_HUGEPAGE`, so that
//! with transparent huge pages in `madvise` (or `always`) mode its first
//! touch faults in 2 MiB pages instead of 4 KiB ones; a smaller one is a
//! plain `Vec`. Both start zeroed and become [`Bytes`] without a copy.
//!
//! Mappings are reused: when the last `Bytes` of a mapped payload is
//! dropped, the mapping goes to a small pool, and [`OutputBuffer::reusable`]
//! takes it for the next large pack with its pages already faulted in (first
//! touch costs about 0.4 s per GiB with 4 KiB pages, and still some with
//! huge pages). A reused buffer holds old bytes: only for writers that write
//! every byte, as every packer does (tested for each packer).
//!
//! The mapping reserves one spare huge page of address space and the data
//! starts on a 2 MiB boundary, so every 2 MiB window of the data can be a
//! huge page whatever address the kernel picks. The last window is whole
//! too, which costs at most 2 MiB of memory beyond the payload (the packers
//! write every byte, so the rest is touched anyway).

use std::io;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

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

/// An anonymous mapping and the range of it that holds the data. Dropped,
/// it goes back to the pool when the pool has room.
struct Mapped {
    map: Option<MmapMut>,
    start: usize,
    len: usize,
}

impl Mapped {
    fn map(&self) -> &MmapMut {
        self.map.as_ref().expect("present until drop")
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map()[self.start..self.start + self.len]
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if let Some(map) = self.map.take() {
            let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
            let held: usize = pool.iter().map(|m| m.len()).sum();
            if held + map.len() <= POOL_MAX_BYTES && pool.len() < POOL_MAX_MAPS {
                pool.push(map);
            }
        }
    }
}

/// Mappings kept for reuse, and how much of them at most.
static POOL: Mutex<Vec<MmapMut>> = Mutex::new(Vec::new());
const POOL_MAX_BYTES: usize = 1 << 30;
const POOL_MAX_MAPS: usize = 8;

/// Mapping length for `len` data bytes: whole huge pages plus one spare, so
/// the data can start on a huge-page boundary.
fn map_len(len: usize) -> io::Result<usize> {
    len.checked_next_multiple_of(HUGE_PAGE)
        .and_then(|l| l.checked_add(HUGE_PAGE))
        .ok_or_else(|| io::Error::new(io::ErrorKind::OutOfMemory, "length overflows"))
}

fn aligned_start(map: &MmapMut) -> usize {
    let addr = map.as_ptr() as usize;
    addr.next_multiple_of(HUGE_PAGE) - addr
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
        let map_len = map_len(len)?;
        let map = MmapMut::map_anon(map_len)?;
        let start = aligned_start(&map);
        #[cfg(target_os = "linux")]
        {
            // Advice only: without THP support the pages stay small.
            let _ = map.advise_range(memmap2::Advice::HugePage, start, map_len - start);
        }
        Ok(OutputBuffer {
            inner: Inner::Mapped(Mapped {
                map: Some(map),
                start,
                len,
            }),
        })
    }

    /// `len` bytes of unspecified content for a writer that writes every
    /// byte: a pooled mapping of the right size class when one is free
    /// (pages already present), else as [`OutputBuffer::zeroed`].
    pub fn reusable(len: usize) -> OutputBuffer {
        if len >= MAPPED_MIN {
            if let Ok(want) = map_len(len) {
                let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
                // Same size class: at most twice the mapping this needs.
                let fit = (0..pool.len())
                    .filter(|&i| (want..=2 * want).contains(&pool[i].len()))
                    .min_by_key(|&i| pool[i].len());
                if let Some(i) = fit {
                    let map = pool.swap_remove(i);
                    drop(pool);
                    let start = aligned_start(&map);
                    return OutputBuffer {
                        inner: Inner::Mapped(Mapped {
                            map: Some(map),
                            start,
                            len,
                        }),
                    };
                }
            }
        }
        OutputBuffer::zeroed(len)
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
            Inner::Mapped(m) => {
                let (start, len) = (m.start, m.len);
                &mut m.map.as_mut().expect("present until drop")[start..start + len]
            }
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

    #[test]
    fn a_dropped_mapping_is_reused_for_the_next_large_buffer() {
        // A size no other test uses, so parallel tests do not take it.
        let len = 7 * HUGE_PAGE + 4321;
        let mut a = OutputBuffer::reusable(len);
        a.fill(0xAB);
        let ptr = a.as_ptr();
        let bytes = a.into_bytes();
        drop(bytes);
        let b = OutputBuffer::reusable(len - 100);
        assert!(b.is_mapped());
        assert_eq!(b.as_ptr(), ptr, "the pooled mapping was taken");
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
        assert_eq!(b[0], 0xAB, "reused, not re-zeroed");
        // A much smaller buffer does not take a large mapping.
        drop(b);
        let small = OutputBuffer::reusable(MAPPED_MIN);
        assert_ne!(small.as_ptr(), ptr);
        // `zeroed` never hands out old bytes.
        let z = OutputBuffer::zeroed(len);
        assert!(z.iter().all(|&x| x == 0));
    }
}
