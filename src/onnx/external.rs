//! External data references (`TensorProto.external_data`, `StructProto.external_data`):
//! parsing the key/value entries and resolving them safely inside the model's folder.

use std::path::{Component, Path, PathBuf};

/// External-data files one model maps at most: each mapping takes a slot of
/// the process's truncation guard, which every request shares.
pub const MAX_EXTERNAL_FILES: usize = 4096;

/// A parsed external-data reference. `length` is optional for tensors (the
/// rest of the file) and mandatory for structured payloads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalRef {
    /// The file, relative to the model's folder.
    pub location: String,
    /// Byte offset in the file.
    pub offset: u64,
    /// Byte count; `None`: to the end of the file.
    pub length: Option<u64>,
}

/// Why an external-data reference is unusable: its entries do not parse,
/// its location is refused, or its range does not fit the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExternalRefError {
    /// A known key (`location`, `offset`, `length`) given twice.
    #[error("duplicated key {0:?}")]
    DuplicatedKey(String),
    /// No `location` entry.
    #[error("missing key \"location\"")]
    MissingLocation,
    /// An `offset` or `length` that is not a non-negative integer.
    #[error("{key} {value:?} is not a non-negative integer")]
    NotANumber {
        /// `offset` or `length`.
        key: &'static str,
        /// The value as written.
        value: String,
    },
    /// An empty `location`.
    #[error("empty location")]
    EmptyLocation,
    /// A `location` with a NUL byte.
    #[error("location contains a NUL byte")]
    NulInLocation,
    /// An absolute `location`.
    #[error("absolute location {0:?} refused")]
    Absolute(String),
    /// A `location` with `..` or a prefix.
    #[error("location {0:?} leaves the model folder (`..` or a prefix)")]
    LeavesFolder(String),
    /// An `offset` past the end of the file.
    #[error("offset {offset} is past the end of {location:?} ({file_len} bytes)")]
    OffsetPastEnd {
        /// The reference's offset.
        offset: u64,
        /// The reference's location.
        location: String,
        /// The file's length.
        file_len: u64,
    },
    /// An `offset + length` past the end of the file.
    #[error(
        "offset {offset} + length {length} is past the end of {location:?} ({file_len} bytes)"
    )]
    RangePastEnd {
        /// The reference's offset.
        offset: u64,
        /// The length asked for (the rest of the file when not given).
        length: u64,
        /// The reference's location.
        location: String,
        /// The file's length.
        file_len: u64,
    },
}

impl ExternalRef {
    /// Builds a reference from `(key, value)` entries; unknown keys (such as
    /// `checksum`) are ignored, duplicated known keys are refused.
    pub(crate) fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<ExternalRef, ExternalRefError> {
        let (mut location, mut offset, mut length) = (None, None, None);
        for (key, value) in entries {
            let slot = match key {
                "location" => &mut location,
                "offset" => &mut offset,
                "length" => &mut length,
                _ => continue,
            };
            if slot.replace(value).is_some() {
                return Err(ExternalRefError::DuplicatedKey(key.to_string()));
            }
        }
        let location = location.ok_or(ExternalRefError::MissingLocation)?;
        let number =
            |key: &'static str, v: Option<&str>| -> Result<Option<u64>, ExternalRefError> {
                v.map(|s| {
                    s.trim()
                        .parse::<u64>()
                        .map_err(|_| ExternalRefError::NotANumber {
                            key,
                            value: s.to_string(),
                        })
                })
                .transpose()
            };
        Ok(ExternalRef {
            location: location.to_string(),
            offset: number("offset", offset)?.unwrap_or(0),
            length: number("length", length)?,
        })
    }

    /// Checks the location is a plain relative path inside the model folder
    /// (no absolute path, no `..`) and returns it joined to `dir`.
    /// The file this reference names for a model in `dir` (`None` for a
    /// location that is refused: absolute, or leaving the folder).
    pub fn file_in(&self, dir: &Path) -> Option<PathBuf> {
        self.path_in(dir).ok()
    }

    pub(crate) fn path_in(&self, dir: &Path) -> Result<PathBuf, ExternalRefError> {
        let loc = Path::new(&self.location);
        if self.location.is_empty() {
            return Err(ExternalRefError::EmptyLocation);
        }
        if self.location.contains('\0') {
            return Err(ExternalRefError::NulInLocation);
        }
        if loc.is_absolute() || self.location.starts_with(['/', '\\']) {
            return Err(ExternalRefError::Absolute(self.location.clone()));
        }
        for c in loc.components() {
            match c {
                Component::Normal(_) | Component::CurDir => {}
                _ => return Err(ExternalRefError::LeavesFolder(self.location.clone())),
            }
        }
        Ok(dir.join(loc))
    }

    /// The `external_data` entries that say this (the inverse of
    /// [`ExternalRef::from_entries`]; `length` only when known).
    pub(crate) fn to_entries(&self) -> Vec<crate::pb::StringStringEntryProto> {
        let entry = |key: &str, value: String| crate::pb::StringStringEntryProto {
            key: key.into(),
            value,
        };
        let mut v = vec![
            entry("location", self.location.clone()),
            entry("offset", self.offset.to_string()),
        ];
        v.extend(self.length.map(|l| entry("length", l.to_string())));
        v
    }

    /// The byte range inside a file of `file_len` bytes, checked.
    pub fn range(&self, file_len: u64) -> Result<std::ops::Range<u64>, ExternalRefError> {
        if self.offset > file_len {
            return Err(ExternalRefError::OffsetPastEnd {
                offset: self.offset,
                location: self.location.clone(),
                file_len,
            });
        }
        let length = self.length.unwrap_or(file_len - self.offset);
        let end = self
            .offset
            .checked_add(length)
            .filter(|&end| end <= file_len)
            .ok_or_else(|| ExternalRefError::RangePastEnd {
                offset: self.offset,
                length,
                location: self.location.clone(),
                file_len,
            })?;
        Ok(self.offset..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        let r =
            ExternalRef::from_entries([("location", "w.bin"), ("offset", "4096"), ("length", "8")])
                .unwrap();
        assert_eq!(r.offset, 4096);
        assert_eq!(r.range(5000).unwrap(), 4096..4104);
        assert!(r.range(4100).is_err());
        assert!(ExternalRef::from_entries([("offset", "1")]).is_err());
        assert!(ExternalRef::from_entries([("location", "a"), ("offset", "-1")]).is_err());
        let abs = ExternalRef::from_entries([("location", "/etc/passwd")]).unwrap();
        assert!(abs.path_in(Path::new("/m")).is_err());
        let up = ExternalRef::from_entries([("location", "a/../../x")]).unwrap();
        assert!(up.path_in(Path::new("/m")).is_err());
        let ok = ExternalRef::from_entries([("location", "./d/x.bin")]).unwrap();
        assert_eq!(
            ok.path_in(Path::new("/m")).unwrap(),
            Path::new("/m/./d/x.bin")
        );
        let huge = ExternalRef::from_entries([
            ("location", "a"),
            ("offset", "1"),
            ("length", "18446744073709551615"),
        ])
        .unwrap();
        assert!(huge.range(10).is_err());
        // to_entries is the inverse of from_entries.
        let entries = r.to_entries();
        let back =
            ExternalRef::from_entries(entries.iter().map(|e| (e.key.as_str(), e.value.as_str())))
                .unwrap();
        assert_eq!(back, r);
    }
}
