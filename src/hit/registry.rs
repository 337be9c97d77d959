//! The registry of known physical types (D9): which layouts this build
//! produces. The core knows no packer; the kernels crate implements
//! [`TypeRegistry`] over its catalogue. [`KnownTypes`] puts a verdict cache
//! in front of it, so that judging a stored entry costs a hash-map read
//! once its (type key, source shape) has been seen.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use super::MissReason;
use crate::dtype::DataType;
use crate::pb;
use crate::structs::PhysicalTypeKey;

/// The shape of a source tensor: what a packer's output type depends on
/// besides its parameters (a constant K field, the rank, ...).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceShape {
    /// The source's element type.
    pub data_type: DataType,
    /// The source's dims, outermost first.
    pub dims: Vec<u64>,
}

impl fmt::Display for SourceShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.data_type, self.dims)
    }
}

/// A layout this build produces: the packer and parameters that make it,
/// for one source shape, and what an entry of it must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownLayout {
    /// The physical type key (D4) of the packer's output type.
    pub key: PhysicalTypeKey,
    /// The output type's name (a label).
    pub type_name: String,
    /// `StructProto.dims` the packer writes for this source.
    pub dims: Vec<u64>,
    /// The source shape this layout is for.
    pub source: SourceShape,
    /// Id of the packer that produces it.
    pub packer: String,
    /// The parameters, `key=value` joined by `,`, defaults filled in.
    pub params: String,
    /// The packer's `ctcache.format_version`.
    pub format_version: u32,
}

/// What this build produces, asked per claimed type and source shape.
///
/// Names and `ctcache.packer` metadata may be used to *find* the packer a
/// type claims to come from; whether the entry is usable is decided by the
/// core comparing keys ([`KnownTypes::layout`]), never here.
pub trait TypeRegistry: Send + Sync {
    /// Every layout the claimed packer produces for a source of this shape
    /// (over all its parameter values). `Err`: no packer of this build is
    /// claimed (`unknown_physical_type`) or the claimed packer writes
    /// another `ctcache.format_version` (`unsupported_format_version`).
    fn candidates(
        &self,
        claimed: &pb::StructTypeProto,
        source: &SourceShape,
    ) -> Result<Vec<KnownLayout>, MissReason>;
}

type Verdict = Result<Arc<KnownLayout>, MissReason>;

/// Verdicts kept before the cache starts over (a few hundred bytes each).
const MAX_VERDICTS: usize = 1 << 16;

/// A registry with a verdict cache, shared by every judge of a process.
pub struct KnownTypes {
    registry: Box<dyn TypeRegistry>,
    verdicts: RwLock<HashMap<[u8; 32], Verdict>>,
}

impl fmt::Debug for KnownTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.verdicts.read().map(|v| v.len()).unwrap_or(0);
        write!(f, "KnownTypes({n} verdicts)")
    }
}

/// The cache key of a verdict: a hash of the type key and the source shape
/// (collision-resistant, like the type key itself).
fn verdict_key(key: &PhysicalTypeKey, source: &SourceShape) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&key.0);
    h.update(&source.data_type.code().to_le_bytes());
    h.update(&(source.dims.len() as u64).to_le_bytes());
    for d in &source.dims {
        h.update(&d.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

impl KnownTypes {
    /// Wraps `registry` with an empty verdict cache.
    pub fn new(registry: impl TypeRegistry + 'static) -> KnownTypes {
        KnownTypes {
            registry: Box::new(registry),
            verdicts: RwLock::new(HashMap::new()),
        }
    }

    /// The known layout an entry of type `key` for a source of shape
    /// `source` is, or why it is none. `claimed` gives the entry's concrete
    /// type (only called when the verdict is not cached yet).
    pub fn layout(
        &self,
        key: &PhysicalTypeKey,
        source: &SourceShape,
        claimed: impl FnOnce() -> Result<pb::StructTypeProto, MissReason>,
    ) -> Verdict {
        let vk = verdict_key(key, source);
        if let Some(v) = self
            .verdicts
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&vk)
        {
            return v.clone();
        }
        let claimed = claimed()?;
        let verdict = self
            .registry
            .candidates(&claimed, source)
            .and_then(|layouts| {
                // The test: the whole type key, never the name.
                layouts
                    .into_iter()
                    .find(|l| l.key == *key)
                    .map(Arc::new)
                    .ok_or_else(|| MissReason::UnknownPhysicalType {
                        name: claimed.name.clone(),
                        detail: format!(
                            "its layout is not one this build's packers produce for a {source} source"
                        ),
                    })
            });
        let mut v = self.verdicts.write().unwrap_or_else(|p| p.into_inner());
        if v.len() >= MAX_VERDICTS {
            v.clear();
        }
        v.insert(vk, verdict.clone());
        verdict
    }
}
