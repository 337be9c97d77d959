//! Object names of the fleet tier, content-addressed and versioned:
//! `<prefix>/v1/<2 hex>/<alg>-<digest hex>/<device key hex>/<type key hex>/{payload,manifest}`.
//! Every component comes from the store's [`EntryKey`], so a remote entry
//! and a local one with the same name are the same entry.

use ctcache::store::EntryKey;

/// The layout version in every object name.
pub const LAYOUT: &str = "v1";

/// The two objects of one entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryObjects {
    /// The payload object, uploaded first.
    pub payload: String,
    /// Written last: an entry exists once its manifest does.
    pub manifest: String,
}

/// The folder of `key` under `prefix` (no leading or trailing `/`; empty
/// for the bucket root).
pub fn entry_dir(prefix: &str, key: &EntryKey) -> String {
    let digest = key.source.hex();
    let rel = format!(
        "{LAYOUT}/{}/{}-{digest}/{}/{}",
        &digest[..2],
        key.source.algorithm,
        hex::encode(key.device),
        key.physical_type
    );
    if prefix.is_empty() {
        rel
    } else {
        format!("{prefix}/{rel}")
    }
}

/// The payload and manifest object names of `key` under `prefix`.
pub fn objects(prefix: &str, key: &EntryKey) -> EntryObjects {
    let dir = entry_dir(prefix, key);
    EntryObjects {
        payload: format!("{dir}/payload"),
        manifest: format!("{dir}/manifest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctcache::digest::{Algorithm, SourceDigest};
    use ctcache::structs::PhysicalTypeKey;

    #[test]
    fn names_follow_the_entry_key() {
        let key = EntryKey {
            source: SourceDigest {
                algorithm: Algorithm::Blake3,
                bytes: [0xab; 32],
            },
            device: [1; 32],
            physical_type: PhysicalTypeKey([2; 32]),
        };
        let o = objects("fleet/a", &key);
        let want = format!(
            "fleet/a/v1/ab/blake3-{}/{}/{}/",
            "ab".repeat(32),
            "01".repeat(32),
            "02".repeat(32)
        );
        assert_eq!(o.payload, format!("{want}payload"));
        assert_eq!(o.manifest, format!("{want}manifest"));
        assert!(objects("", &key).payload.starts_with("v1/ab/blake3-"));
    }
}
