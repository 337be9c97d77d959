//! API requests -> the use cases' requests.

use ctcache::device::RuntimeIdentity;
use ctcache::store::EntryKey;
use ctcache_api::v1 as api;

use crate::ops::compile::CompileRequest;
use crate::ops::gc::GcRequest;
use crate::ops::lookup::{AcceptedType, LookupRequest, Target};
use crate::ops::materialize::MaterializeRequest;
use crate::ops::model::FormatRequest;
use crate::ops::pack::{BackendRequest, PrepackRequest};
use crate::ops::payload_access::Leasing;
use crate::ops::put::PutHeader;
use crate::ops::resolve::{OnMiss, ResolveRequest};
use crate::ops::status::ListRequest;
use crate::ops::{embed::EmbedRequest, Error};

pub(crate) fn key(s: &str) -> Result<EntryKey, Error> {
    ctcache_convert::key_from_str(s).map_err(|e| Error::invalid(e.to_string()))
}

fn formats(f: Vec<api::FormatSpec>) -> Vec<FormatRequest> {
    f.into_iter()
        .map(|f| FormatRequest {
            id: f.id,
            params: f.params.into_iter().collect(),
        })
        .collect()
}

fn runtime(r: Option<api::RuntimeIdentity>) -> Option<RuntimeIdentity> {
    r.filter(|r| !r.name.is_empty()).map(|r| RuntimeIdentity {
        name: r.name,
        version: r.version,
    })
}

pub(crate) fn backend(b: i32) -> Result<BackendRequest, Error> {
    match api::Backend::try_from(b) {
        Ok(api::Backend::Auto) => Ok(BackendRequest::Auto),
        Ok(api::Backend::Cpu) => Ok(BackendRequest::Cpu),
        Ok(api::Backend::Wgpu) => Ok(BackendRequest::Wgpu),
        Err(_) => Err(Error::invalid(format!("unknown backend {b}"))),
    }
}

pub(crate) fn lookup(r: api::LookupRequest) -> LookupRequest {
    LookupRequest {
        source_digest: r.source_digest.to_vec(),
        digest_algorithm: r.digest_algorithm,
        target: Target {
            devices: r.devices,
            runtime: runtime(r.runtime),
            accepted: r
                .accepted
                .into_iter()
                .map(|a| AcceptedType {
                    name: a.name,
                    versions: a.versions,
                })
                .collect(),
        },
        daemon_produced_only: r.daemon_produced_only,
    }
}

pub(crate) fn resolve(r: api::ResolveModelRequest) -> ResolveRequest {
    ResolveRequest {
        model_path: r.model_path,
        handout: r.handout,
        on_miss: match api::OnMiss::try_from(r.on_miss) {
            Ok(api::OnMiss::Background) => OnMiss::Background,
            Ok(api::OnMiss::Wait) => OnMiss::Wait,
            _ => OnMiss::Nothing,
        },
        formats: formats(r.formats),
        target: Target {
            devices: r.devices,
            runtime: runtime(r.runtime),
            accepted: Vec::new(),
        },
    }
}

pub(crate) fn prepack(r: api::PrepackRequest) -> Result<PrepackRequest, Error> {
    Ok(PrepackRequest {
        model_path: r.model_path,
        handout: r.handout,
        initializers: r.initializers,
        formats: formats(r.formats),
        backend: backend(r.backend)?,
    })
}

pub(crate) fn put_header(h: api::PutHeader) -> Result<PutHeader, Error> {
    let struct_type = h
        .struct_type
        .map(|t| t.decode())
        .transpose()
        .map_err(|e| Error::invalid(format!("struct_type: {e}")))?;
    Ok(PutHeader {
        source_digest: h.source_digest.to_vec(),
        digest_algorithm: h.digest_algorithm,
        struct_type,
        dims: h.dims,
        device: h.device,
        payload_len: h.payload_len,
        source_name: h.source_name,
        model_path: h.model_path,
        source_data_type: h.source_data_type,
        source_dims: h.source_dims,
    })
}

pub(crate) fn embed(r: api::EmbedRequest) -> EmbedRequest {
    EmbedRequest {
        model_path: r.model_path,
        handout: r.handout,
        output_path: r.output_path,
        formats: formats(r.formats),
        sidecar: r.sidecar,
        replace: r.replace,
        force: r.force,
    }
}

pub(crate) fn compile(r: api::CompileRequest) -> Result<CompileRequest, Error> {
    let materialize = match r.materialize {
        Some(m) => Some(materialize(api::MaterializeRequest {
            model_path: r.model_path.clone(),
            handout: r.handout.clone(),
            in_memory: true,
            output_path: String::new(),
            copy: false,
            link: api::LinkMode::Auto as i32,
            hold: false,
            data_folder: String::new(),
            // Held while the model is made whole, released after.
            lease_ttl_ms: 60_000,
            ..m
        })?),
        None => None,
    };
    // 0: as the proto says, 30 s (a lease of 1 ms would let gc take what
    // a session maps).
    let ttl_ms = if r.lease_ttl_ms == 0 {
        30_000
    } else {
        r.lease_ttl_ms
    };
    Ok(CompileRequest {
        materialize,
        leasing: leasing(r.hold, &r.handout, ttl_ms)?,
        model_path: r.model_path,
        handout: r.handout,
        runtime: r.runtime,
        level: r.level,
        provider: r.provider,
        runtime_version: r.runtime_version,
        runtime_build: r.runtime_build,
        lookup_only: r.lookup_only,
        config: r.config.into_iter().collect(),
    })
}

/// How an answer's payloads are leased: a hold on the handout's
/// connection, or leases of `ttl_ms`.
fn leasing(hold: bool, handout: &str, ttl_ms: u64) -> Result<Leasing, Error> {
    match (hold, handout.is_empty()) {
        (false, _) => Ok(Leasing::Ttl(ttl_ms)),
        (true, false) => Ok(Leasing::Hold(handout.to_string())),
        (true, true) => Err(Error::invalid(
            "hold lasts while a handout's connection stays open: hand the model over",
        )),
    }
}

pub(crate) fn materialize(r: api::MaterializeRequest) -> Result<MaterializeRequest, Error> {
    // The daemon writes no file where a caller points: the client writes
    // the model from the in-memory answer for its data folder.
    let writes = !r.output_path.is_empty() || r.copy || r.link != api::LinkMode::Auto as i32;
    if writes || !r.in_memory {
        return Err(Error::invalid(
            "the daemon writes no file for its callers: ask in_memory (with data_folder for a \
             model file) and write the model and its payload files yourself, as ctcachectl and \
             the ctcache clients do; output_path, copy and link are the client's",
        ));
    }
    Ok(MaterializeRequest {
        model_path: r.model_path,
        target: r.target,
        bits: r.bits,
        block_size: r.block_size,
        symmetric: r.symmetric,
        accuracy_level: r.accuracy_level,
        weight_type: r.weight_type,
        per_channel: r.per_channel,
        reduce_range: r.reduce_range,
        op_types: r.op_types,
        op_block_list: r.op_block_list,
        leasing: leasing(r.hold, &r.handout, r.lease_ttl_ms)?,
        handout: r.handout,
        data_folder: r.data_folder,
    })
}

pub(crate) fn list(r: api::ListRequest) -> ListRequest {
    ListRequest {
        format: r.format,
        device: r.device,
        source_digest: r.source_digest.to_vec(),
        model_path: r.model_path,
        limit: r.limit,
    }
}

pub(crate) fn gc(r: api::GcRequest) -> GcRequest {
    GcRequest {
        // The `has_` flags tell a limit of 0 (everything) from no limit.
        max_bytes: (r.has_max_bytes || r.max_bytes > 0).then_some(r.max_bytes),
        max_age_secs: (r.has_max_age_s || r.max_age_s > 0).then_some(r.max_age_s),
        dry_run: r.dry_run,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_header_whose_struct_type_does_not_decode_is_invalid() {
        let header = |t: ctcache_api::StructType| api::PutHeader {
            struct_type: Some(t),
            ..Default::default()
        };
        let ty = ctcache::pb::StructTypeProto {
            name: "t.fmt".into(),
            ..Default::default()
        };
        let ok = put_header(header(ty.clone().into())).unwrap();
        assert_eq!(ok.struct_type, Some(ty));
        // Field 1 (a message) framed as a varint.
        let junk = ctcache_api::StructType::from_encoded(vec![0x08, 0x01].into());
        let err = put_header(header(junk)).unwrap_err();
        assert!(err.to_string().contains("struct_type"), "{err}");
    }
}
