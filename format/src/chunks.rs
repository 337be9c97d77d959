//! Per-chunk digests of a payload (D12), used by the store and by clients
//! that check mapped bytes as they read them: the blake3 chaining values of its
//! 256 KiB groups, which merge into the payload's blake3 itself. So they
//! need no checksum of their own (they are right exactly when they merge
//! into the entry's `payload_blake3`), and a copy or stream checks each
//! group as it sends it: a damaged group is never sent, and no byte needs
//! to be read twice.

use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root};
use blake3::hazmat::{ChainingValue, HasherExt, Mode};
use rayon::prelude::*;

/// log2 of the group size: 256 KiB, a power of two of blake3 chunks, so
/// every group is a subtree of blake3's tree.
const GROUP_LOG: u32 = 18;
/// Bytes per group (the last may be shorter).
pub const GROUP: usize = 1 << GROUP_LOG;
/// Payloads at least this large are hashed group by group on the pool.
const PARALLEL: usize = 4 * GROUP;

/// The group digests of one payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkDigests {
    len: u64,
    /// One chaining value per group; for a payload of one group, that
    /// group's root hash (a lone group is the whole tree).
    cvs: Vec<ChainingValue>,
}

/// The digest of group `i` of a payload of `len` bytes.
fn group_digest(i: usize, bytes: &[u8], len: u64) -> ChainingValue {
    if len <= GROUP as u64 {
        return *blake3::hash(bytes).as_bytes();
    }
    let mut h = blake3::Hasher::new();
    h.set_input_offset((i as u64) << GROUP_LOG);
    h.update(bytes);
    h.finalize_non_root()
}

impl ChunkDigests {
    /// The digests of `bytes`, hashed on the rayon pool when large (never
    /// call with `parallel` while holding a blob stripe).
    pub fn of(bytes: &[u8], parallel: bool) -> ChunkDigests {
        let len = bytes.len() as u64;
        let digest = |(i, g): (usize, &[u8])| group_digest(i, g, len);
        let cvs = if parallel && bytes.len() >= PARALLEL {
            bytes.par_chunks(GROUP).enumerate().map(digest).collect()
        } else if bytes.is_empty() {
            vec![*blake3::hash(&[]).as_bytes()]
        } else {
            bytes.chunks(GROUP).enumerate().map(digest).collect()
        };
        ChunkDigests { len, cvs }
    }

    /// The blake3 of the whole payload.
    pub fn root(&self) -> [u8; 32] {
        if self.cvs.len() == 1 {
            return self.cvs[0];
        }
        let (l, r) = self.halves(0, self.len);
        *merge_subtrees_root(&l, &r, Mode::Hash).as_bytes()
    }

    /// The chaining values of the two children of the subtree that starts
    /// at byte `start` and holds `len` (more than one group) bytes.
    fn halves(&self, start: u64, len: u64) -> (ChainingValue, ChainingValue) {
        let left = left_subtree_len(len);
        (
            self.subtree(start, left),
            self.subtree(start + left, len - left),
        )
    }

    fn subtree(&self, start: u64, len: u64) -> ChainingValue {
        if len <= GROUP as u64 {
            return self.cvs[(start >> GROUP_LOG) as usize];
        }
        let (l, r) = self.halves(start, len);
        merge_subtrees_non_root(&l, &r, Mode::Hash)
    }

    /// The byte range of group `i`.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = i << GROUP_LOG;
        start..(start + GROUP).min(self.len as usize)
    }

    /// Number of groups.
    pub fn count(&self) -> usize {
        self.cvs.len()
    }

    /// Whether `bytes` are group `i` as hashed.
    pub fn check(&self, i: usize, bytes: &[u8]) -> bool {
        i < self.cvs.len()
            && bytes.len() == self.range(i).len()
            && group_digest(i, bytes, self.len) == self.cvs[i]
    }
}

/// Group digests computed while a payload is written, a piece at a time.
#[derive(Default)]
pub struct ChunkHasher {
    len: u64,
    /// The group being filled.
    open: blake3::Hasher,
    cvs: Vec<ChainingValue>,
}

impl ChunkHasher {
    /// Adds the next bytes of the payload.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let room = GROUP - (self.len % GROUP as u64) as usize;
            if room == GROUP && self.len > 0 {
                let full = std::mem::take(&mut self.open);
                self.cvs.push(full.finalize_non_root());
                self.open.set_input_offset(self.len);
            }
            let n = room.min(bytes.len());
            self.open.update(&bytes[..n]);
            self.len += n as u64;
            bytes = &bytes[n..];
        }
    }

    /// The digests of everything added.
    pub fn finish(mut self) -> ChunkDigests {
        let last = if self.len <= GROUP as u64 {
            *self.open.finalize().as_bytes()
        } else {
            self.open.finalize_non_root()
        };
        self.cvs.push(last);
        ChunkDigests {
            len: self.len,
            cvs: self.cvs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn digests_merge_into_the_payloads_blake3() {
        let lens = [
            0,
            1,
            1024,
            GROUP - 1,
            GROUP,
            GROUP + 1,
            2 * GROUP,
            3 * GROUP + 5,
            5 * GROUP,
            7 * GROUP + 1023,
        ];
        for n in lens {
            let b = bytes(n);
            let want = *blake3::hash(&b).as_bytes();
            for parallel in [false, true] {
                let d = ChunkDigests::of(&b, parallel);
                assert_eq!(d.root(), want, "len {n}");
                for i in 0..d.count() {
                    assert!(d.check(i, &b[d.range(i)]), "len {n} group {i}");
                }
            }
            // Streamed in uneven pieces, as a put writes.
            let mut h = ChunkHasher::default();
            for piece in b.chunks(100_003) {
                h.update(piece);
            }
            assert_eq!(h.finish(), ChunkDigests::of(&b, false), "len {n}");
        }
    }

    #[test]
    fn a_changed_byte_fails_only_its_group() {
        let mut b = bytes(3 * GROUP + 7);
        let d = ChunkDigests::of(&b, true);
        b[GROUP + 9] ^= 1;
        let bad: Vec<usize> = (0..d.count())
            .filter(|&i| !d.check(i, &b[d.range(i)]))
            .collect();
        assert_eq!(bad, [1]);
        assert!(!d.check(3, &b[d.range(3)][1..]), "a short group fails");
        assert!(!d.check(4, &[]), "no such group");
    }
}
