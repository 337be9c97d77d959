//! External data references (`TensorProto.external_data`, `StructProto.external_data`):
//! parsing the key/value entries and resolving them safely inside the model's folder.

use std::path::{Component, Path, PathBuf};

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

impl ExternalRef {
    /// Builds a reference from `(key, value)` entries; unknown keys (such as
    /// `checksum`) are ignored, duplicated known keys are refused.
    pub fn from_entries<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<ExternalRef, String> {
        let (mut location, mut offset, mut length) = (None, None, None);
        for (key, value) in entries {
            let slot = match key {
                "location" => &mut location,
                "offset" => &mut offset,
                "length" => &mut length,
                _ => continue,
            };
            if slot.replace(value).is_some() {
                return Err(format!("duplicated key {key:?}"));
            }
        }
        let location = location.ok_or("missing key \"location\"")?;
        let number = |key: &str, v: Option<&str>| -> Result<Option<u64>, String> {
            v.map(|s| {
                s.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("{key} {s:?} is not a non-negative integer"))
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

    pub(crate) fn path_in(&self, dir: &Path) -> Result<PathBuf, String> {
        let loc = Path::new(&self.location);
        if self.location.is_empty() {
            return Err("empty location".into());
        }
        if self.location.contains('\0') {
            return Err("location contains a NUL byte".into());
        }
        if loc.is_absolute() || self.location.starts_with(['/', '\\']) {
            return Err(format!("absolute location {:?} refused", self.location));
        }
        for c in loc.components() {
            match c {
                Component::Normal(_) | Component::CurDir => {}
                _ => {
                    return Err(format!(
                        "location {:?} leaves the model folder (`..` or a prefix)",
                        self.location
                    ))
                }
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
    pub fn range(&self, file_len: u64) -> Result<std::ops::Range<u64>, String> {
        if self.offset > file_len {
            return Err(format!(
                "offset {} is past the end of {:?} ({} bytes)",
                self.offset, self.location, file_len
            ));
        }
        let length = self.length.unwrap_or(file_len - self.offset);
        let end = self
            .offset
            .checked_add(length)
            .filter(|&end| end <= file_len)
            .ok_or_else(|| {
                format!(
                    "offset {} + length {} is past the end of {:?} ({} bytes)",
                    self.offset, length, self.location, file_len
                )
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
