//! A reader that checks a fetched payload as it streams into the store: it
//! fails, instead of reaching end of file, when the bytes are longer or
//! shorter than the manifest says or hash to anything else, so `put`
//! discards its temp file and never publishes wrong bytes.

use std::io::{self, Read};

use ctcache::store::PayloadInfo;

/// A reader over a fetched payload that fails with `InvalidData` on a length or blake3 mismatch.
pub struct Checked<R> {
    inner: R,
    want: PayloadInfo,
    seen: u64,
    hasher: blake3::Hasher,
    mismatch: Option<String>,
}

impl<R: Read> Checked<R> {
    /// Checks `inner` against `want` as it is read.
    pub fn new(inner: R, want: PayloadInfo) -> Checked<R> {
        Checked {
            inner,
            want,
            seen: 0,
            hasher: blake3::Hasher::new(),
            mismatch: None,
        }
    }

    /// Why the bytes were refused (as opposed to the source failing).
    pub fn mismatch(&self) -> Option<&str> {
        self.mismatch.as_deref()
    }

    fn bad(&mut self, detail: String) -> io::Error {
        self.mismatch = Some(detail.clone());
        io::Error::new(io::ErrorKind::InvalidData, detail)
    }
}

impl<R: Read> Read for Checked<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.seen = self.seen.saturating_add(n as u64);
        if self.seen > self.want.len {
            let want = self.want.len;
            return Err(self.bad(format!(
                "the payload is longer than the {want} bytes its manifest names"
            )));
        }
        self.hasher.update(&buf[..n]);
        if n == 0 {
            if self.seen != self.want.len {
                let (seen, want) = (self.seen, self.want.len);
                return Err(self.bad(format!(
                    "the payload has {seen} bytes, its manifest names {want}"
                )));
            }
            if *self.hasher.finalize().as_bytes() != self.want.blake3 {
                return Err(self.bad("the payload's blake3 differs from its manifest".into()));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(data: &[u8], want: PayloadInfo) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        Checked::new(data, want).read_to_end(&mut out)?;
        Ok(out)
    }

    fn info(data: &[u8]) -> PayloadInfo {
        PayloadInfo {
            blake3: *blake3::hash(data).as_bytes(),
            len: data.len() as u64,
        }
    }

    #[test]
    fn exact_bytes_pass_and_anything_else_fails() {
        let data = b"compiled tensor bytes";
        assert_eq!(read_all(data, info(data)).unwrap(), data);
        let mut flipped = data.to_vec();
        flipped[3] ^= 1;
        let mut c = Checked::new(&flipped[..], info(data));
        assert!(c.read_to_end(&mut Vec::new()).is_err());
        assert!(c.mismatch().unwrap().contains("blake3"));
        assert!(read_all(&data[..5], info(data)).is_err());
        let mut longer = data.to_vec();
        longer.push(0);
        assert!(read_all(&longer, info(data)).is_err());
        assert!(read_all(b"", info(b"")).is_ok());
    }
}
