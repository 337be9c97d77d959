//! The Put use case: a payload a runtime produced itself, header first then
//! data chunks, checked against its declared type and stored under the key
//! the store derives (trusted callers only).

use std::sync::Arc;
use std::time::Duration;

use ctcache::digest::SourceDigest;
use ctcache::dtype::DataType;
use ctcache::hit::SourceShape;
use ctcache::pb;
use ctcache::store::{NewEntry, Producer, Stored};

use super::{Error, Result};
use crate::caller::Caller;
use crate::state::Daemon;

/// What a Put declares before its data.
#[derive(Debug, Clone, Default)]
pub(crate) struct PutHeader {
    pub source_digest: Vec<u8>,
    pub digest_algorithm: String,
    pub struct_type: Option<pb::StructTypeProto>,
    pub dims: Vec<u64>,
    pub device: Option<pb::DeviceProto>,
    pub payload_len: u64,
    pub source_name: String,
    pub model_path: String,
    /// The source tensor's ONNX data type and dims (required: lookups judge
    /// the entry's layout against them).
    pub source_data_type: i32,
    pub source_dims: Vec<u64>,
}

/// A Put whose header was accepted, collecting its data.
pub(crate) struct PutSession {
    new: NewEntry,
    expected: u64,
    data: Vec<u8>,
}

/// Checks a Put header: trusted caller, known digest algorithm, a valid type
/// whose size is the declared length, within `max_payload_bytes` and the
/// memory budget.
pub(crate) fn begin(d: &Daemon, caller: &Caller, h: PutHeader) -> Result<PutSession> {
    caller.require_trusted("put entries")?;
    let algorithm = h.digest_algorithm.parse().map_err(|_| {
        Error::invalid(format!("unknown digest algorithm {:?}", h.digest_algorithm))
    })?;
    let bytes: [u8; 32] = h
        .source_digest
        .as_slice()
        .try_into()
        .map_err(|_| Error::invalid("source_digest must be 32 bytes"))?;
    let ty = h
        .struct_type
        .ok_or_else(|| Error::invalid("struct_type is required"))?;
    let device = h
        .device
        .ok_or_else(|| Error::invalid("device is required"))?;
    let source_shape = SourceShape {
        data_type: DataType::from_i32(h.source_data_type).map_err(|_| {
            Error::invalid(format!(
                "source_data_type {} is not an ONNX data type (the source's shape is required)",
                h.source_data_type
            ))
        })?,
        dims: h.source_dims,
    };
    let layout =
        ctcache::structs::check_value(&ty, &h.dims, &[], &ctcache::structs::Limits::default())
            .map_err(|e| Error::invalid(format!("struct_type: {e}")))?;
    if layout.byte_len != h.payload_len {
        return Err(Error::invalid(format!(
            "payload_len {} does not match the type's size {}",
            h.payload_len, layout.byte_len
        )));
    }
    let max = d.config.payload_limit();
    if h.payload_len > max {
        return Err(Error::exhausted(format!(
            "payload of {} bytes, over the limit of {max} (max_payload_bytes, memory_budget)",
            h.payload_len
        )));
    }
    let non_empty = |s: String| (!s.is_empty()).then_some(s).into_iter().collect();
    Ok(PutSession {
        expected: h.payload_len,
        data: Vec::with_capacity(h.payload_len as usize),
        new: NewEntry {
            source: SourceDigest { algorithm, bytes },
            source_shape,
            device,
            physical_type: ty,
            dims: h.dims,
            producer: Producer {
                client_uid: caller.uid(),
                ..Default::default()
            },
            source_names: non_empty(h.source_name),
            model_paths: non_empty(h.model_path),
            pack_duration: Duration::ZERO,
        },
    })
}

impl PutSession {
    /// Appends a data chunk; more than the declared length is an error.
    pub fn push(&mut self, chunk: &[u8]) -> Result<()> {
        if self.data.len() as u64 + chunk.len() as u64 > self.expected {
            return Err(Error::invalid("more data than payload_len"));
        }
        self.data.extend_from_slice(chunk);
        Ok(())
    }

    /// Stores the payload once all of it arrived.
    pub async fn finish(self, d: &Arc<Daemon>) -> Result<Stored> {
        if self.data.len() as u64 != self.expected {
            return Err(Error::invalid(format!(
                "got {} bytes, payload_len is {}",
                self.data.len(),
                self.expected
            )));
        }
        let d = d.clone();
        super::blocking(move || Ok(d.store.put(&self.new, &self.data[..])?)).await
    }
}
