//! The audit of fetched entries: packers are deterministic, so a sampled
//! fraction of what the remote gives is packed again here and must equal it
//! byte for byte. A signer whose entries fail is named, not trusted blindly.

use std::io::{self, Read};

use bytes::Bytes;

/// Whether this fetch is audited, at `rate` (0 to 1). Randomness the
/// signer cannot predict; without any, it audits (the safe side).
pub fn due(rate: f64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate.is_nan() || rate <= 0.0 {
        return false;
    }
    match getrandom::u64() {
        // u64 -> f64 rounds, harmless for a sampling rate.
        Ok(r) => (r as f64) < rate * (u64::MAX as f64),
        Err(_) => true,
    }
}

/// Where the fetched payload parted from the local pack.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    /// The fetched payload ended at another length than the pack's.
    #[error("the remote's payload has {fetched} bytes, the local pack {packed}")]
    Length {
        /// Bytes fetched.
        fetched: u64,
        /// Bytes of the local pack.
        packed: u64,
    },
    /// A byte differs.
    #[error("the remote's payload differs from the local pack at byte {at} of {packed}")]
    Byte {
        /// The offset of the first differing byte.
        at: u64,
        /// Bytes of the local pack.
        packed: u64,
    },
    /// The fetched payload goes on past the pack's end.
    #[error("the remote's payload is longer than the local pack's {packed} bytes")]
    Longer {
        /// Bytes of the local pack.
        packed: u64,
    },
}

/// A reader over the fetched payload that compares it with the local pack
/// as it passes. It sits outside the blake3 check, so a payload damaged in
/// storage fails that check first and never blames its signer; bytes that
/// pass it but differ from the pack fail at the end, before `put` publishes.
pub struct Matching<R> {
    inner: R,
    packed: Bytes,
    seen: u64,
    mismatch: Option<Mismatch>,
}

impl<R: Read> Matching<R> {
    /// Reads `inner` and compares it with `packed`, this host's own pack.
    pub fn new(inner: R, packed: Bytes) -> Matching<R> {
        Matching {
            inner,
            packed,
            seen: 0,
            mismatch: None,
        }
    }

    /// Where the fetched bytes parted from the local pack.
    pub fn mismatch(&self) -> Option<&Mismatch> {
        self.mismatch.as_ref()
    }
}

impl<R: Read> Read for Matching<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let total = self.packed.len() as u64;
        if n == 0 {
            if self.mismatch.is_none() && self.seen != total {
                self.mismatch = Some(Mismatch::Length {
                    fetched: self.seen,
                    packed: total,
                });
            }
            return match &self.mismatch {
                Some(m) => Err(io::Error::new(io::ErrorKind::InvalidData, m.clone())),
                None => Ok(0),
            };
        }
        if self.mismatch.is_none() {
            // Bounded by `total`: a longer payload is noted, not indexed past.
            let start = usize::try_from(self.seen.min(total)).unwrap_or(usize::MAX);
            let want = &self.packed[start..];
            let got = &buf[..n];
            if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
                let at = self.seen + i as u64;
                self.mismatch = Some(Mismatch::Byte { at, packed: total });
            } else if got.len() > want.len() {
                self.mismatch = Some(Mismatch::Longer { packed: total });
            }
        }
        self.seen = self.seen.saturating_add(n as u64);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_zero_and_one_are_exact_and_between_samples() {
        assert!((0..1000).all(|_| due(1.0)));
        assert!((0..1000).all(|_| !due(0.0)));
        assert!(!due(f64::NAN));
        let hits = (0..4000).filter(|_| due(0.5)).count();
        // 0.5 +- 10 standard deviations (about 316): fails only when broken.
        assert!((1684..=2316).contains(&hits), "{hits}");
    }

    /// Reads `fetched` through a `Matching` in chunks of `chunk` bytes.
    fn matched(fetched: &[u8], packed: &[u8], chunk: usize) -> Result<Vec<u8>, Mismatch> {
        struct Chunks<'a>(&'a [u8], usize);
        impl Read for Chunks<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(self.1).min(buf.len());
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut m = Matching::new(Chunks(fetched, chunk), Bytes::copy_from_slice(packed));
        let mut out = Vec::new();
        match m.read_to_end(&mut out) {
            Ok(_) => {
                assert!(m.mismatch().is_none());
                Ok(out)
            }
            Err(e) => {
                let mismatch = m
                    .mismatch()
                    .cloned()
                    .expect("a failed read names its mismatch");
                assert_eq!(mismatch.to_string(), e.to_string());
                Err(mismatch)
            }
        }
    }

    #[test]
    fn equal_bytes_pass_and_the_first_difference_is_named_at_the_end() {
        for chunk in [1, 3, 64] {
            assert_eq!(matched(b"abcdefg", b"abcdefg", chunk).unwrap(), b"abcdefg");
            let e = matched(b"abcdeXg", b"abcdefg", chunk)
                .unwrap_err()
                .to_string();
            assert!(e.contains("byte 5 of 7"), "{e}");
            let e = matched(b"abc", b"abcdefg", chunk).unwrap_err().to_string();
            assert!(e.contains("3 bytes") && e.contains("local pack 7"), "{e}");
            let e = matched(b"abcdefgh", b"abcdefg", chunk)
                .unwrap_err()
                .to_string();
            assert!(e.contains("longer"), "{e}");
        }
        assert!(matched(b"", b"", 1).is_ok());
    }

    #[test]
    fn a_failing_source_fails_before_any_verdict() {
        struct Broken;
        impl Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("network"))
            }
        }
        let mut m = Matching::new(Broken, Bytes::from_static(b"x"));
        assert!(m.read(&mut [0u8; 4]).is_err());
        assert!(
            m.mismatch().is_none(),
            "a transport failure is not a mismatch"
        );
    }
}
