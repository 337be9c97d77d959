//! The store's entries, statistics and gc and verify reports as API
//! messages.

use std::path::PathBuf;

use ctcache::store::{
    Damage, Entry, EntryKey, GcReason, GcReport, GcTarget, InvalidKey, ReconcileReport, Stats,
    StoreError, VerifyReport,
};

use ctcache_api::hex_string;
use ctcache_api::v1 as api;

/// The API form of an entry key: hex of its index bytes.
pub fn key_to_string(k: &EntryKey) -> String {
    hex_string(&k.to_bytes())
}

/// Parses the API form of an entry key.
pub fn key_from_str(s: &str) -> Result<EntryKey, StoreError> {
    let s = s.trim();
    let bytes = hex::decode(s).map_err(|e| InvalidKey {
        text: s.to_string(),
        detail: e.to_string(),
    })?;
    Ok(EntryKey::from_bytes(&bytes)?)
}

/// An entry with every field; `payload_path` is where its file lives. The
/// entry's fields move into the message (no copies of its struct type,
/// device or names).
pub fn entry(mut e: Entry, payload_path: PathBuf, leased: bool) -> api::Entry {
    let struct_type = std::mem::take(&mut e.physical_type);
    let device = std::mem::take(&mut e.device);
    let source_names = std::mem::take(&mut e.source_names);
    let model_paths = std::mem::take(&mut e.model_paths);
    api::Entry {
        // As stored (the canonical encoding its type key hashes), not
        // decoded and encoded again.
        struct_type: Some(ctcache_api::StructType::from_encoded(struct_type.into())),
        device: Some(device),
        source_names,
        model_paths,
        ..entry_brief(e, payload_path, leased)
    }
}

/// An entry without its bulky fields (struct type, device, names, paths).
pub fn entry_brief(e: Entry, payload_path: PathBuf, leased: bool) -> api::Entry {
    api::Entry {
        key: key_to_string(&e.key),
        source_digest: bytes_of(&e.key.source.bytes),
        digest_algorithm: e.key.source.algorithm.name().into(),
        physical_type: e.type_name,
        format_version: e.format_version,
        type_key: hex_string(&e.key.physical_type.0),
        struct_type: None,
        dims: e.dims,
        device: None,
        payload_blake3: hex_string(&e.payload.blake3),
        payload_len: e.payload.len,
        payload_path: payload_path
            .into_os_string()
            .into_string()
            .unwrap_or_else(|p| p.to_string_lossy().into_owned()),
        producer: match e.producer.client_uid {
            Some(uid) => format!("uid:{uid}"),
            None => format!("{}@{}", e.producer.packer_id, e.producer.packer_version),
        },
        created_unix_ms: e.created_ms as i64,
        last_access_unix_ms: e.access.map_or(e.created_ms, |a| a.last_ms) as i64,
        access_count: e.access.map_or(0, |a| a.count),
        pack_duration_us: e.pack_duration.as_micros() as u64,
        source_names: vec![],
        model_paths: vec![],
        leased,
    }
}

fn bytes_of(b: &[u8]) -> prost::bytes::Bytes {
    prost::bytes::Bytes::copy_from_slice(b)
}

/// A miss: its stable reason code and a sentence.
pub fn miss(reason: &str, detail: impl Into<String>) -> api::Miss {
    api::Miss {
        reason: reason.into(),
        detail: detail.into(),
    }
}

/// Store statistics.
pub fn stats(s: &Stats, active_leases: u64) -> api::StatsResponse {
    let list = |m: &std::collections::BTreeMap<String, ctcache::store::Usage>| {
        m.iter()
            .map(|(name, u)| api::CountBytes {
                name: name.clone(),
                entries: u.entries,
                bytes: u.bytes,
            })
            .collect()
    };
    api::StatsResponse {
        entries: s.entries,
        bytes: s.stored_bytes,
        by_format: list(&s.by_format),
        by_device: list(&s.by_device),
        hits: s.hits,
        misses: s.misses,
        active_leases,
    }
}

/// The reason name of a gc item.
pub fn gc_reason(r: &GcReason) -> &'static str {
    match r {
        GcReason::MaxAge { .. } => "max_age",
        GcReason::OverBudget => "size_budget",
        GcReason::OverQuota { .. } => "uid_quota",
        GcReason::MissingPayload => "orphan_entry",
        GcReason::OrphanPayload | GcReason::StrayFile => "orphan_file",
        GcReason::StaleTemp => "temp_file",
    }
}

/// What a gc removed (or would remove), and the limits it applied.
pub fn gc(r: &GcReport) -> api::GcResponse {
    api::GcResponse {
        removed: r
            .items
            .iter()
            .map(|i| {
                let about = i.about.clone().unwrap_or_default();
                api::GcItem {
                    key: match &i.target {
                        GcTarget::Entry(k) => key_to_string(k),
                        GcTarget::File(p) => p.display().to_string(),
                    },
                    bytes: i.bytes_freed,
                    reason: gc_reason(&i.reason).into(),
                    source_names: about.source_names,
                    model_paths: about.model_paths,
                    physical_type: about.type_name,
                }
            })
            .collect(),
        bytes_freed: r.bytes_freed,
        dry_run: r.dry_run,
        skipped_leased: r.leased_kept as u32,
        max_bytes: r.max_bytes,
        max_age_s: r.max_age.map(|a| a.as_secs()),
        bytes_before: r.bytes_before,
        bytes_after: r.bytes_after,
        bytes_still_linked: r.bytes_still_linked,
    }
}

/// What a verify found (and, with a repair, dropped and removed).
pub fn verify(v: &VerifyReport, repair: Option<&ReconcileReport>) -> api::VerifyResponse {
    let keys = |missing: bool| -> Vec<String> {
        v.problems
            .iter()
            .filter(|p| (p.damage == Damage::Missing) == missing)
            .flat_map(|p| {
                let keys = if v.repaired {
                    &p.entries_dropped
                } else {
                    &p.entries
                };
                keys.iter().map(key_to_string)
            })
            .collect()
    };
    let removed = repair
        .into_iter()
        .flat_map(|r| r.orphan_files_removed.iter().chain(&r.stray_files_removed));
    let orphans = v
        .orphan_files
        .iter()
        .chain(removed)
        .map(|p| p.display().to_string())
        .collect();
    api::VerifyResponse {
        checked: v.blobs_checked,
        bytes_checked: v.bytes_checked,
        corrupt: keys(false),
        missing: keys(true),
        orphans,
        clean: v.problems.is_empty(),
        repaired: v.repaired,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_junk_is_refused() {
        let key = EntryKey::from_bytes(&[1u8; ctcache::store::KEY_LEN]).unwrap();
        assert_eq!(key_from_str(&key_to_string(&key)).unwrap(), key);
        assert!(key_from_str("not a key").is_err());
        assert!(key_from_str("00").is_err());
    }
}
