//! A reader that checks a fetched payload as it streams into the store: it
//! fails, instead of reaching end of file, when the bytes are longer or
//! shorter than the manifest says or hash to anything else, so `put`
//! discards its temp file and never publishes wrong bytes.

use std::io::{self, Read};

use ctcache::digest::{RawDigest, SourceDigest};
use ctcache::dtype::DataType;
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

/// A reader over a fetched payload that is a tensor's own raw bytes (a
/// form's moved weight): it fails at the end, before `put` publishes,
/// unless the D3 digest of those bytes as a tensor of `data_type` and
/// `dims` is the source digest its key names. Such an entry proves itself
/// and needs no audit.
pub struct SourceMatch<R> {
    inner: R,
    digest: Option<RawDigest>,
    want: SourceDigest,
    mismatch: Option<String>,
}

impl<R: Read> SourceMatch<R> {
    /// Checks that `inner` holds the tensor of `data_type` and `dims` whose
    /// digest is `want`.
    pub fn new(inner: R, data_type: DataType, dims: &[u64], want: SourceDigest) -> SourceMatch<R> {
        SourceMatch {
            inner,
            digest: Some(RawDigest::new(data_type, dims, want.algorithm)),
            want,
            mismatch: None,
        }
    }

    /// Why the bytes were refused (as opposed to the source failing).
    pub fn mismatch(&self) -> Option<&str> {
        self.mismatch.as_deref()
    }
}

impl<R: Read> Read for SourceMatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            if let Some(d) = &mut self.digest {
                d.update(&buf[..n]);
            }
            return Ok(n);
        }
        if let Some(d) = self.digest.take() {
            let got = d.finish();
            if got != self.want {
                let detail = format!(
                    "the payload is the tensor {got}, not {} its key names",
                    self.want
                );
                self.mismatch = Some(detail);
            }
        }
        match &self.mismatch {
            Some(m) => Err(io::Error::new(io::ErrorKind::InvalidData, m.clone())),
            None => Ok(0),
        }
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

    #[test]
    fn a_tensors_bytes_pass_only_as_the_tensor_their_key_names() {
        use ctcache::digest::{digest_raw, Algorithm};
        let raw: Vec<u8> = (0..64u8).collect();
        let want = digest_raw(DataType::FLOAT, &[4, 4], &raw, Algorithm::Blake3);
        let read = |data: &[u8], dims: &[u64]| {
            let mut m = SourceMatch::new(data, DataType::FLOAT, dims, want);
            let mut out = Vec::new();
            let r = m.read_to_end(&mut out);
            (r.map(|_| out).ok(), m.mismatch().map(str::to_string))
        };
        assert_eq!(read(&raw, &[4, 4]), (Some(raw.clone()), None));
        // Other bytes, or the same bytes as another shape, are refused at the end.
        let mut flipped = raw.clone();
        flipped[9] ^= 1;
        for (data, dims) in [(&flipped[..], &[4u64, 4][..]), (&raw[..], &[16, 1][..])] {
            let (r, why) = read(data, dims);
            assert!(
                r.is_none() && why.unwrap().contains("not blake3:"),
                "{dims:?}"
            );
        }
    }
}
