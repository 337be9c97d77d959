//! The one hit rule (D9): whether a compiled entry, embedded in a model or
//! stored, may be used on a host. Every path that hands out entries asks
//! [`judge`]; the facts of an entry come through [`EntryFacts`], which the
//! model loader (`resolve`) and the store (`store::lookup`) implement.
//!
//! A hit means: the entry's device fits one of the host's (D5), its whole
//! physical type key (D4) equals the key a packer of this build produces for
//! that source shape ([`Accept::Known`]) or one the caller asked for
//! ([`Accept::Exact`]), its `dims` are the ones that packer writes, and its
//! payload hashes to the checksum recorded with it, when one is. Anything
//! else is a miss with a [`MissReason`].

mod reason;
mod registry;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

pub use reason::MissReason;
pub use registry::{KnownLayout, KnownTypes, SourceShape, TypeRegistry};

use crate::device::{self, RuntimeIdentity};
use crate::pb;
use crate::structs::PhysicalTypeKey;

/// Metadata key of a `CompiledTensorProto` holding the lowercase hex blake3
/// of its payload bytes (D9).
pub const PAYLOAD_BLAKE3_KEY: &str = "ctcache.payload.blake3";

/// Which physical types the consumer accepts.
#[derive(Debug, Clone, Default)]
pub enum Accept {
    /// Any type, unjudged: for tools that list what is there, never for a
    /// consumer of the bytes.
    #[default]
    Any,
    /// The layouts this build produces.
    Known(Arc<KnownTypes>),
    /// Exactly these layouts (callers that know the format and parameters
    /// they want, e.g. from `ctcache_kernels::registry::expected`).
    Exact(Arc<HashMap<PhysicalTypeKey, KnownLayout>>),
}

impl Accept {
    /// Exactly these layouts.
    pub fn exact(layouts: impl IntoIterator<Item = KnownLayout>) -> Accept {
        Accept::Exact(Arc::new(layouts.into_iter().map(|l| (l.key, l)).collect()))
    }
}

/// What the host offers: its devices (preferred first), the consuming
/// runtime, the accepted types and trust. Prepared once and reused (device
/// keys are computed here, not per entry).
#[derive(Debug, Clone)]
pub struct Host {
    devices: Option<Vec<pb::DeviceProto>>,
    keys: Vec<[u8; 32]>,
    runtime: Option<RuntimeIdentity>,
    accept: Accept,
    /// Type names (and format versions; empty: any) the caller can consume.
    names: Option<Arc<HashMap<String, Vec<u32>>>>,
    daemon_produced_only: bool,
}

impl Host {
    /// `runtime: None` skips the runtime checks (D5).
    pub fn new(
        devices: Vec<pb::DeviceProto>,
        runtime: Option<RuntimeIdentity>,
        accept: Accept,
    ) -> Host {
        Host {
            keys: devices.iter().map(device::device_key).collect(),
            devices: Some(devices),
            runtime,
            accept,
            names: None,
            daemon_produced_only: false,
        }
    }

    /// A host that takes entries for any device (import, which stores
    /// entries for other machines too); types are still judged.
    pub fn any_device(accept: Accept) -> Host {
        Host {
            devices: None,
            keys: Vec::new(),
            runtime: None,
            accept,
            names: None,
            daemon_produced_only: false,
        }
    }

    /// Narrows the judged types to those a consumer names (a runtime that
    /// reads only some formats): (type name, format versions; empty = any).
    /// It only ever turns a hit into a miss; the test stays the key.
    pub fn accepting_names(mut self, names: impl IntoIterator<Item = (String, Vec<u32>)>) -> Host {
        self.names = Some(Arc::new(names.into_iter().collect()));
        self
    }

    /// Refuses entries a client put (`not_daemon_produced`).
    pub fn daemon_produced_only(mut self, only: bool) -> Host {
        self.daemon_produced_only = only;
        self
    }

    /// The host devices (empty for [`Host::any_device`]).
    pub fn devices(&self) -> &[pb::DeviceProto] {
        self.devices.as_deref().unwrap_or(&[])
    }

    /// Device keys, parallel to [`Host::devices`].
    pub(crate) fn device_keys(&self) -> &[[u8; 32]] {
        &self.keys
    }

    /// The consuming runtime, when the caller named one (`None`: runtime checks are skipped).
    pub fn runtime(&self) -> Option<&RuntimeIdentity> {
        self.runtime.as_ref()
    }

    /// Which physical types the host accepts.
    pub fn accept(&self) -> &Accept {
        &self.accept
    }
}

/// What the judge reads of an entry. Each accessor is called at most once
/// per judgement, in the loading rules' order, and only when the earlier
/// checks passed (so expensive ones, like reading the payload, run last).
pub trait EntryFacts {
    /// The device the payload needs.
    fn device(&self) -> Result<&pb::DeviceProto, MissReason>;
    /// The physical type key; fails when the value or its type is invalid.
    fn type_key(&self) -> Result<PhysicalTypeKey, MissReason>;
    /// The concrete type (for the registry; called on verdict-cache misses).
    fn physical_type(&self) -> Result<pb::StructTypeProto, MissReason>;
    /// `StructProto.dims` of the value.
    fn dims(&self) -> &[u64];
    /// The source's shape (`None`: not recorded).
    fn source_shape(&self) -> Option<&SourceShape>;
    /// The uid of the client that put the entry, when a client did.
    fn client_uid(&self) -> Option<u32> {
        None
    }
    /// The recorded payload checksum (`ctcache.payload.blake3`), if any.
    fn payload_checksum(&self) -> Option<&str> {
        None
    }
    /// The payload bytes (read only when a checksum is recorded).
    fn payload(&self) -> Result<Bytes, MissReason> {
        Err(MissReason::PayloadChecksum(
            "the payload cannot be read to check its checksum".into(),
        ))
    }
}

/// A usable entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Usable {
    /// Index into the host's devices of the device it runs on (0 for
    /// [`Host::any_device`]).
    pub host_device: usize,
    /// The layout it was recognized as (`None` with [`Accept::Any`]).
    pub layout: Option<Arc<KnownLayout>>,
}

/// Decides hit or miss for one entry on `host` (see the module docs). The
/// first failing check is the reason: device, type, layout, trust, payload.
pub fn judge(e: &dyn EntryFacts, host: &Host) -> Result<Usable, MissReason> {
    let need = e.device()?;
    let host_device = match &host.devices {
        Some(devices) => {
            device::find_compatible(need, devices, host.runtime.as_ref())
                .map_err(MissReason::IncompatibleDevice)?
                .0
        }
        None => 0,
    };
    let layout = match &host.accept {
        Accept::Any => None,
        accept => {
            let key = e.type_key()?;
            let source = e.source_shape().ok_or(MissReason::NoSourceShape)?;
            let layout = match accept {
                Accept::Known(types) => types.layout(&key, source, || e.physical_type())?,
                Accept::Exact(want) => {
                    let l = want.get(&key).ok_or_else(|| not_requested(e))?;
                    if l.source != *source {
                        return Err(MissReason::UnknownPhysicalType {
                            name: l.type_name.clone(),
                            detail: format!(
                                "the entry was made for a {source} source, the request is for {}",
                                l.source
                            ),
                        });
                    }
                    Arc::new(l.clone())
                }
                Accept::Any => unreachable!("handled above"),
            };
            if e.dims() != layout.dims.as_slice() {
                return Err(MissReason::UnknownPhysicalType {
                    name: layout.type_name.clone(),
                    detail: format!(
                        "value dims {:?}, the packer writes {:?} for this source",
                        e.dims(),
                        layout.dims
                    ),
                });
            }
            if let Some(names) = &host.names {
                let named = names.get(&layout.type_name).is_some_and(|versions| {
                    versions.is_empty() || versions.contains(&layout.format_version)
                });
                if !named {
                    return Err(MissReason::UnknownPhysicalType {
                        name: layout.type_name.clone(),
                        detail: "not among the types the caller accepts".into(),
                    });
                }
            }
            Some(layout)
        }
    };
    if let (true, Some(uid)) = (host.daemon_produced_only, e.client_uid()) {
        return Err(MissReason::NotDaemonProduced { uid });
    }
    if let Some(want) = e.payload_checksum() {
        let payload = e.payload()?;
        let checked = check_payload(want, &payload);
        // Hashed once: a mapped payload's pages need not stay resident.
        crate::onnx::release(&payload);
        checked?;
    }
    Ok(Usable {
        host_device,
        layout,
    })
}

fn not_requested(e: &dyn EntryFacts) -> MissReason {
    MissReason::UnknownPhysicalType {
        name: e.physical_type().map(|t| t.name).unwrap_or_default(),
        detail: "not the layout requested (another format, parameters or source shape)".into(),
    }
}

/// The lowercase hex blake3 of a payload (the `ctcache.payload.blake3` value).
pub fn payload_checksum(payload: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    if payload.len() >= 1 << 20 {
        h.update_rayon(payload);
    } else {
        h.update(payload);
    }
    h.finalize().to_hex().to_string()
}

/// Checks payload bytes against a recorded `ctcache.payload.blake3` value.
pub fn check_payload(want: &str, payload: &[u8]) -> Result<(), MissReason> {
    let well_formed =
        want.len() == 64 && want.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !well_formed {
        return Err(MissReason::PayloadChecksum(format!(
            "{PAYLOAD_BLAKE3_KEY} {want:?} is not 64 lowercase hex digits"
        )));
    }
    let got = payload_checksum(payload);
    if got != want {
        return Err(MissReason::PayloadChecksum(format!(
            "the payload hashes to {got}, its {PAYLOAD_BLAKE3_KEY} says {want}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
