//! The JSON forms of API messages, shared by every command so that one
//! entry or device looks the same everywhere (shapes: docs/CLI.md).

use serde_json::{json, Value};

use ctcache_client::api;

pub fn device(d: &ctcache::pb::DeviceProto) -> Value {
    json!({
        "type": d.r#type,
        "index": d.index,
        "architecture": d.architecture,
        "runtime": d.runtime,
        "runtime_version": d.runtime_version,
        "metadata": d.metadata_props.iter().map(|p| (p.key.clone(), json!(p.value))).collect::<serde_json::Map<_, _>>(),
    })
}

pub fn describe_device(d: Option<&ctcache::pb::DeviceProto>) -> String {
    d.map(ctcache::device::describe)
        .unwrap_or_else(|| "?".into())
}

pub fn entry(e: &api::Entry) -> Value {
    json!({
        "key": e.key,
        "source_digest": hex::encode(&e.source_digest),
        "digest_algorithm": e.digest_algorithm,
        "physical_type": e.physical_type,
        "format_version": e.format_version,
        "type_key": e.type_key,
        "dims": e.dims,
        "device": e.device.as_ref().map(device),
        "device_description": describe_device(e.device.as_ref()),
        "payload_blake3": e.payload_blake3,
        "payload_len": e.payload_len,
        "payload_path": e.payload_path,
        "producer": e.producer,
        "created_unix_ms": e.created_unix_ms,
        "last_access_unix_ms": e.last_access_unix_ms,
        "access_count": e.access_count,
        "pack_duration_us": e.pack_duration_us,
        "source_names": e.source_names,
        "model_paths": e.model_paths,
        "leased": e.leased,
    })
}

pub fn miss(m: &api::Miss) -> Value {
    json!({ "reason": m.reason, "detail": m.detail })
}

pub fn progress(p: &api::PrepackProgress) -> Value {
    json!({
        "job_id": p.job_id,
        "initializer": p.initializer,
        "format": p.format,
        "state": p.state().name(),
        "done": p.done,
        "total": p.total,
        "key": p.entry.as_ref().map(|e| e.key.clone()),
        "payload_len": p.entry.as_ref().map(|e| e.payload_len),
        "pack_duration_us": p.pack_duration_us,
        "backend": p.backend().name(),
        "error": (!p.error.is_empty()).then(|| p.error.clone()),
        "code": (!p.code.is_empty()).then(|| p.code.clone()),
    })
}
