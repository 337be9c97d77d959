//! Conversions between store / core types and the gRPC API messages, in one
//! place.

use ctcache::store::{Entry, EntryKey, GcItem, GcReason, GcReport, GcTarget, Stats};
use ctcache_api::v1 as api;
use prost::Message;

/// The API form of an entry key: hex of its index bytes.
pub fn key_to_string(k: &EntryKey) -> String {
    hex::encode(k.to_bytes())
}

/// Parses an API entry key.
pub fn key_from_string(s: &str) -> Result<EntryKey, tonic::Status> {
    let bytes = hex::decode(s.trim())
        .map_err(|_| tonic::Status::invalid_argument(format!("entry key {s:?} is not hex")))?;
    EntryKey::from_bytes(&bytes).map_err(|e| tonic::Status::invalid_argument(e.to_string()))
}

pub fn entry(e: &Entry, payload_path: String, leased: bool) -> api::Entry {
    api::Entry {
        struct_type: ctcache::pb::StructTypeProto::decode(e.physical_type.as_slice()).ok(),
        device: Some(e.device.clone()),
        source_names: e.source_names.clone(),
        model_paths: e.model_paths.clone(),
        ..entry_brief(e, payload_path, leased)
    }
}

/// An entry without its bulky fields (struct type, device, names, paths).
pub fn entry_brief(e: &Entry, payload_path: String, leased: bool) -> api::Entry {
    api::Entry {
        key: key_to_string(&e.key),
        source_digest: bytes::Bytes::copy_from_slice(&e.key.source.bytes),
        digest_algorithm: e.key.source.algorithm.name().into(),
        physical_type: e.type_name.clone(),
        format_version: e.format_version,
        type_key: e.key.physical_type.hex(),
        struct_type: None,
        dims: e.dims.clone(),
        device: None,
        payload_blake3: hex::encode(e.payload.blake3),
        payload_len: e.payload.len,
        payload_path,
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

pub fn miss(reason: &str, detail: impl Into<String>) -> api::Miss {
    api::Miss {
        reason: reason.into(),
        detail: detail.into(),
    }
}

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

pub fn gc(r: &GcReport) -> api::GcResponse {
    api::GcResponse {
        removed: r
            .items
            .iter()
            .map(|i: &GcItem| api::GcItem {
                key: match &i.target {
                    GcTarget::Entry(k) => key_to_string(k),
                    GcTarget::File(p) => p.display().to_string(),
                },
                bytes: i.bytes_freed,
                reason: match &i.reason {
                    GcReason::MaxAge { .. } => "max_age",
                    GcReason::OverBudget => "size_budget",
                    GcReason::MissingPayload => "orphan_entry",
                    GcReason::OrphanPayload | GcReason::StrayFile => "orphan_file",
                    GcReason::StaleTemp => "temp_file",
                }
                .into(),
            })
            .collect(),
        bytes_freed: r.bytes_freed,
        dry_run: r.dry_run,
        skipped_leased: 0,
    }
}
