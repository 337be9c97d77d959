//! The loading rules for a model's embedded entries: classify each as a hit
//! on this host or a miss with a named reason (D5/D6/D9), and pick the ones
//! worth importing into a store. The checks specific to an embedded entry
//! (it decodes, its source resolves, its digest matches) run here, in the
//! proposal's order; the rest is [`hit::judge`], the one hit rule.
//!
//! Nothing here fails a whole model: an undecodable entry, an unreadable
//! initializer or an undecodable struct type table is a miss of the entries
//! concerned, and the others are still judged.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::check::{self, CheckOptions, Checked};
use crate::digest::{self, Algorithm, SourceDigest};
use crate::hit::{self, EntryFacts, KnownLayout, SourceShape};
pub use crate::hit::{Host, MissReason};
use crate::onnx::Model;
use crate::pb;
use crate::structs::{self, PhysicalTypeKey};

/// Hit (with the host device index) or miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The entry can be used.
    Hit {
        /// Index of the first host device it fits, in [`Host::devices`](crate::hit::Host::devices).
        host_device: usize,
    },
    /// The entry cannot be used, and why.
    Miss(MissReason),
}

/// The classification of one compiled entry.
#[derive(Debug, Clone)]
pub struct EntryStatus {
    /// Position in `ModelProto.compiled_tensors`.
    pub index: usize,
    /// The initializer the entry compiles.
    pub source_name: String,
    /// Human form of the entry's device (empty when the index is invalid).
    pub device: String,
    /// The physical type's name (empty when it does not resolve).
    pub physical_type: String,
    /// Hit or miss, with the reason.
    pub status: Status,
    /// The layout a hit was recognized as (packer, parameters).
    pub layout: Option<Arc<KnownLayout>>,
}

/// Classifies every compiled entry of `model` for `host`.
pub fn classify(model: &Model, host: &Host, opts: &CheckOptions) -> Vec<EntryStatus> {
    classify_with(model, host, opts, &HashMap::new())
}

/// [`classify`] with digests already known (by initializer name, e.g. from
/// a memo), which are not computed again.
pub(crate) fn classify_with(
    model: &Model,
    host: &Host,
    opts: &CheckOptions,
    known: &HashMap<String, SourceDigest>,
) -> Vec<EntryStatus> {
    judge_each(model, host, opts, known, |c, i, judged| {
        let e = &c.ext.compiled_tensors[i];
        let device = usize::try_from(e.device)
            .ok()
            .and_then(|d| c.ext.devices.get(d))
            .map(crate::device::describe)
            .unwrap_or_default();
        let physical_type = e
            .value
            .as_ref()
            .and_then(|v| structs::resolve_root(v, &c.ext.struct_types).ok())
            .map(|t| t.name.clone())
            .unwrap_or_default();
        let (status, layout) = match judged {
            Ok((_, u)) => (
                Status::Hit {
                    host_device: u.host_device,
                },
                u.layout,
            ),
            Err(reason) => (Status::Miss(reason), None),
        };
        EntryStatus {
            index: i,
            source_name: e.source_name.clone(),
            device,
            physical_type,
            status,
            layout,
        }
    })
}

/// An embedded entry fit to be stored: everything a store put needs.
#[derive(Debug, Clone)]
pub struct ImportEntry {
    /// The source digest, checked against the model.
    pub source: SourceDigest,
    /// The source's data type and dims.
    pub source_shape: SourceShape,
    /// The entry's device.
    pub device: pb::DeviceProto,
    /// The concrete type, canonical (references inlined, doc strings cleared).
    pub physical_type: pb::StructTypeProto,
    /// `StructProto.dims` of the payload.
    pub dims: Vec<u64>,
    /// The payload bytes (borrowed from the model or sidecar mapping: copy
    /// them and check the copy with [`ImportEntry::copy_payload`] before
    /// storing; the mapping shows writes made after the checks).
    pub payload: Bytes,
    /// The payload's recorded checksum (`ctcache.payload.blake3`), if any.
    pub checksum: Option<String>,
    /// The layout the entry was recognized as; `None` when this build does not know it.
    pub layout: Option<Arc<KnownLayout>>,
}

impl ImportEntry {
    /// The payload copied out of the mapping and judged again on the copy
    /// (its checksum, and a file cut short under it): the bytes checked
    /// are the bytes stored.
    pub fn copy_payload(&self) -> Result<Vec<u8>, MissReason> {
        let copy = self.payload.to_vec();
        if !crate::onnx::intact(&self.payload) {
            return Err(MissReason::Invalid {
                rule: "payload.external",
                message: crate::onnx::CUT_SHORT.into(),
            });
        }
        if let Some(want) = &self.checksum {
            hit::check_payload(want, &copy)?;
        }
        Ok(copy)
    }
}

/// One entry of a model as import sees it.
#[derive(Debug, Clone)]
pub struct Importable {
    /// Position in `ModelProto.compiled_tensors`.
    pub index: usize,
    /// The initializer the entry compiles.
    pub source_name: String,
    /// The entry to store, or why it is not imported.
    pub entry: Result<ImportEntry, MissReason>,
}

/// The entries of `model` that may be imported: those the judge accepts on
/// `host` (usually [`Host::any_device`] over the known types: import keeps
/// entries for other machines, never unknown layouts or bad bytes).
pub fn importable(
    model: &Model,
    host: &Host,
    opts: &CheckOptions,
    known: &HashMap<String, SourceDigest>,
) -> Vec<Importable> {
    judge_each(model, host, opts, known, |c, i, judged| Importable {
        index: i,
        source_name: c.ext.compiled_tensors[i].source_name.clone(),
        entry: judged.and_then(|(facts, u)| {
            Ok(ImportEntry {
                source: facts.digest,
                source_shape: facts.shape.clone(),
                device: facts.device()?.clone(),
                physical_type: facts.physical_type()?,
                dims: facts.dims().to_vec(),
                payload: facts.payload()?,
                checksum: facts.payload_checksum().map(str::to_string),
                layout: u.layout,
            })
        }),
    })
}

/// Judges every entry of `model` and maps each judgement with `f`.
fn judge_each<T>(
    model: &Model,
    host: &Host,
    opts: &CheckOptions,
    known: &HashMap<String, SourceDigest>,
    mut f: impl for<'c> FnMut(&'c Checked<'c>, usize, Judged<'c>) -> T,
) -> Vec<T> {
    let c = Checked::new(model, opts);
    let mut digests = Digests::new(known);
    (0..c.ext.compiled_tensors.len())
        .map(|i| f(&c, i, judge_entry(&c, i, host, &mut digests)))
        .collect()
}

/// The judgement of one embedded entry, with its facts when usable.
type Judged<'c> = Result<(Embedded<'c>, hit::Usable), MissReason>;

/// Source digests computed once per (source, algorithm).
struct Digests<'k> {
    known: &'k HashMap<String, SourceDigest>,
    /// A failure is shared by every entry of the same source.
    computed: HashMap<(String, Algorithm), Result<SourceDigest, Arc<crate::Error>>>,
}

impl<'k> Digests<'k> {
    fn new(known: &'k HashMap<String, SourceDigest>) -> Self {
        Digests {
            known,
            computed: HashMap::new(),
        }
    }

    fn of(
        &mut self,
        model: &Model,
        t: &crate::onnx::TensorRef,
        alg: Algorithm,
    ) -> Result<SourceDigest, Arc<crate::Error>> {
        if let Some(d) = self.known.get(&t.name).filter(|d| d.algorithm == alg) {
            return Ok(*d);
        }
        self.computed
            .entry((t.name.clone(), alg))
            .or_insert_with(|| digest::digest_tensor(model, t, alg).map_err(Arc::new))
            .clone()
    }
}

/// The checks proper to an embedded entry, in the proposal's order, then
/// the judge.
fn judge_entry<'c>(
    c: &'c Checked<'c>,
    i: usize,
    host: &Host,
    digests: &mut Digests<'_>,
) -> Judged<'c> {
    if let Some(e) = c.undecodable.get(&i) {
        return Err(MissReason::invalid(e.clone()));
    }
    if let Some(e) = c.model_errors.first() {
        return Err(MissReason::invalid(e.clone()));
    }
    let e = &c.ext.compiled_tensors[i];
    // 1. The source resolves to exactly one readable initializer.
    let source = c.source(i);
    if let Some(err) = c.source_rule(i) {
        return Err(match (&c.graph_error, source) {
            (Some(_), Err(why)) => MissReason::NotASource(why.to_string()),
            _ => MissReason::invalid(err),
        });
    }
    let t = source.map_err(|why| MissReason::NotASource(why.to_string()))?;
    // 2. The digest is well-formed, its algorithm known, its value current.
    if let Some(err) = c.digest_rule(i) {
        return Err(MissReason::invalid(err));
    }
    let alg: Algorithm = e
        .digest_algorithm
        .parse()
        .map_err(|_| MissReason::UnknownDigestAlgorithm(e.digest_algorithm.clone()))?;
    let actual = digests
        .of(c.model, t, alg)
        .map_err(|why| MissReason::NotASource(why.to_string()))?;
    if e.source_digest.as_ref() != actual.bytes {
        return Err(MissReason::StaleDigest);
    }
    // 3-6 and the payload checksum: the one hit rule.
    let facts = Embedded {
        c,
        i,
        digest: actual,
        shape: SourceShape {
            data_type: t.data_type,
            dims: t.dims.clone(),
        },
    };
    let usable = hit::judge(&facts, host)?;
    Ok((facts, usable))
}

/// One embedded entry, as the judge reads it.
struct Embedded<'c> {
    c: &'c Checked<'c>,
    i: usize,
    digest: SourceDigest,
    shape: SourceShape,
}

impl Embedded<'_> {
    fn entry(&self) -> &pb::CompiledTensorProto {
        &self.c.ext.compiled_tensors[self.i]
    }

    fn root(&self) -> Result<&pb::StructTypeProto, MissReason> {
        self.c.value_rule(self.i).map_err(MissReason::invalid)
    }

    fn struct_err(&self, e: structs::StructError) -> MissReason {
        MissReason::Invalid {
            rule: e.rule,
            message: format!("value.{}: {}", e.path, e.message),
        }
    }
}

impl EntryFacts for Embedded<'_> {
    fn device(&self) -> Result<&pb::DeviceProto, MissReason> {
        if let Some(err) = self.c.device_rule(self.i) {
            return Err(MissReason::invalid(err));
        }
        Ok(&self.c.ext.devices[self.entry().device as usize])
    }

    fn type_key(&self) -> Result<PhysicalTypeKey, MissReason> {
        let root = self.root()?;
        self.c.type_key(root).map_err(|e| self.struct_err(e))
    }

    fn physical_type(&self) -> Result<pb::StructTypeProto, MissReason> {
        let root = self.root()?;
        structs::canonical_type(root, &self.c.ext.struct_types, &self.c.limits)
            .map_err(|e| self.struct_err(e))
    }

    fn dims(&self) -> &[u64] {
        self.entry()
            .value
            .as_ref()
            .map(|v| v.dims.as_slice())
            .unwrap_or(&[])
    }

    fn source_shape(&self) -> Option<&SourceShape> {
        Some(&self.shape)
    }

    fn payload_checksum(&self) -> Option<&str> {
        structs::metadata(&self.entry().metadata_props, hit::PAYLOAD_BLAKE3_KEY)
    }

    fn payload(&self) -> Result<Bytes, MissReason> {
        let value = self
            .entry()
            .value
            .as_ref()
            .ok_or_else(|| MissReason::Invalid {
                rule: "value.present",
                message: "value: no StructProto value".into(),
            })?;
        check::payload_bytes(self.c.model, value).map_err(|m| MissReason::Invalid {
            rule: "payload.external",
            message: format!("value.external_data: {m}"),
        })
    }
}
