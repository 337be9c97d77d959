//! This build's packers as the core's registry of known physical types
//! (D9): for an entry's claimed type and its source shape, the layouts the
//! claimed packer produces over all its parameter values; and, for callers
//! that know what they want, the one layout of a (packer, parameters,
//! source shape). The core compares keys; nothing here accepts a type by
//! its name.

use std::sync::Arc;

use ctcache::digest::SourceDigest;
use ctcache::hit::{KnownLayout, KnownTypes, MissReason, SourceShape, TypeRegistry};
use ctcache::pb;
use ctcache::store::EntryKey;
use ctcache::structs::{self, FORMAT_VERSION_KEY, PACKER_KEY};

use crate::{PackError, Packer, Params};

/// Most parameter combinations enumerated for one packer (every packer of
/// this build has far fewer: `ort.matmul_nbits` has 40).
const MAX_COMBINATIONS: usize = 4096;

/// The catalogue as a [`TypeRegistry`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Catalogue;

/// A registry of this build's packers behind a verdict cache. Build one per
/// process (or per long-lived component) and share it: the cache is what
/// keeps judging stored entries cheap.
pub fn known_types() -> Arc<KnownTypes> {
    Arc::new(KnownTypes::new(Catalogue))
}

/// The layout `packer` with `params` produces for a source of `shape`: the
/// key an entry must have to answer a request for exactly that.
pub fn expected(
    packer: &dyn Packer,
    params: &Params,
    shape: &SourceShape,
) -> Result<KnownLayout, PackError> {
    let layout = packer.output(shape.data_type, &shape.dims, params)?;
    let key =
        structs::physical_type_key(&layout.struct_type, &[], &Default::default()).map_err(|e| {
            PackError::BadShape {
                packer: packer.id(),
                dims: shape.dims.clone(),
                reason: format!("the output type has no key: {e}"),
            }
        })?;
    Ok(KnownLayout {
        key,
        type_name: layout.struct_type.name,
        dims: layout.dims,
        source: shape.clone(),
        packer: packer.id().to_string(),
        params: resolved_params(packer, params),
        format_version: packer.format_version(),
    })
}

/// The key of the entry `packer` with `params` produces from the source of
/// digest `source` and shape `shape`, and that entry's dims: what a request
/// for exactly that must hit.
pub fn entry_key(
    packer: &dyn Packer,
    params: &Params,
    source: SourceDigest,
    shape: &SourceShape,
) -> Result<(EntryKey, Vec<u64>), PackError> {
    let layout = packer.output(shape.data_type, &shape.dims, params)?;
    let device = packer.device(params)?;
    let key = EntryKey::derive(source, &device, &layout.struct_type).map_err(|e| {
        PackError::BadShape {
            packer: packer.id(),
            dims: shape.dims.clone(),
            reason: format!("the output type has no key: {e}"),
        }
    })?;
    Ok((key, layout.dims))
}

/// `key=value,...` over the packer's whole spec, defaults filled in.
fn resolved_params(packer: &dyn Packer, params: &Params) -> String {
    packer
        .param_spec()
        .iter()
        .map(|s| format!("{}={}", s.name, params.get(s.name).unwrap_or(s.default)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Every combination of the packer's allowed parameter values.
fn combinations(packer: &dyn Packer) -> Vec<Params> {
    let mut all = vec![Params::new()];
    for spec in packer.param_spec() {
        all = all
            .iter()
            .flat_map(|p| spec.allowed.iter().map(|v| p.clone().with(spec.name, v)))
            .take(MAX_COMBINATIONS)
            .collect();
    }
    all
}

/// The packer a type claims to come from: its `ctcache.packer` metadata,
/// else the longest packer id its name starts with (`<id>` or `<id>.`).
fn claimed_packer(t: &pb::StructTypeProto) -> Option<&'static dyn Packer> {
    if let Some(id) = structs::metadata(&t.metadata_props, PACKER_KEY) {
        return crate::find(id);
    }
    crate::catalogue()
        .iter()
        .copied()
        .filter(|p| {
            t.name == p.id()
                || t.name
                    .strip_prefix(p.id())
                    .is_some_and(|r| r.starts_with('.'))
        })
        .max_by_key(|p| p.id().len())
}

impl TypeRegistry for Catalogue {
    fn candidates(
        &self,
        claimed: &pb::StructTypeProto,
        source: &SourceShape,
    ) -> Result<Vec<KnownLayout>, MissReason> {
        let packer = claimed_packer(claimed).ok_or_else(|| MissReason::UnknownPhysicalType {
            name: claimed.name.clone(),
            detail: "no packer of this build makes it".into(),
        })?;
        let version = structs::metadata(&claimed.metadata_props, FORMAT_VERSION_KEY).unwrap_or("");
        if version.parse::<u32>().ok() != Some(packer.format_version()) {
            return Err(MissReason::UnsupportedFormatVersion {
                name: claimed.name.clone(),
                version: version.to_string(),
            });
        }
        Ok(combinations(packer)
            .iter()
            .filter_map(|p| expected(packer, p, source).ok())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctcache::dtype::DataType;

    fn w(k: u64, n: u64) -> SourceShape {
        SourceShape {
            data_type: DataType::FLOAT,
            dims: vec![k, n],
        }
    }

    #[test]
    fn every_combination_of_every_packer() {
        let nbits = crate::find("ort.matmul_nbits").unwrap();
        assert_eq!(combinations(nbits).len(), 2 * 5 * 2 * 2);
        for p in crate::catalogue() {
            let n: usize = p.param_spec().iter().map(|s| s.allowed.len()).product();
            assert_eq!(combinations(*p).len(), n, "{}", p.id());
        }
    }

    #[test]
    fn the_known_layout_of_a_packed_type_is_its_own() {
        let types = known_types();
        let nbits = crate::find("ort.matmul_nbits").unwrap();
        let b4 = Params::parse(["bits=4"]).unwrap();
        let want = expected(nbits, &b4, &w(64, 8)).unwrap();
        let t = nbits
            .output(DataType::FLOAT, &[64, 8], &b4)
            .unwrap()
            .struct_type;
        let got = types
            .layout(&want.key, &w(64, 8), || Ok(t.clone()))
            .unwrap();
        assert_eq!(*got, want);
        assert_eq!(
            got.params,
            "bits=4,block_size=32,symmetric=true,transposed=false"
        );
        // The same type judged for another source shape (another K) is not
        // what the packer makes for that source.
        let other = types.layout(&want.key, &w(96, 8), || Ok(t.clone()));
        assert_eq!(other.unwrap_err().code(), "unknown_physical_type");
    }

    #[test]
    fn an_8_bit_entry_never_answers_a_4_bit_request() {
        let nbits = crate::find("ort.matmul_nbits").unwrap();
        let b4 = expected(nbits, &Params::parse(["bits=4"]).unwrap(), &w(64, 8)).unwrap();
        let b8 = expected(nbits, &Params::parse(["bits=8"]).unwrap(), &w(64, 8)).unwrap();
        assert_ne!(b4.key, b8.key);
        assert_ne!(b4.type_name, b8.type_name);
    }

    #[test]
    fn unknown_packer_and_other_version() {
        let types = known_types();
        let nbits = crate::find("ort.matmul_nbits").unwrap();
        let mut t = nbits
            .output(DataType::FLOAT, &[64, 8], &Params::new())
            .unwrap()
            .struct_type;
        for m in &mut t.metadata_props {
            if m.key == FORMAT_VERSION_KEY {
                m.value = "2".into();
            }
        }
        let key = structs::physical_type_key(&t, &[], &Default::default()).unwrap();
        let r = types.layout(&key, &w(64, 8), || Ok(t.clone()));
        assert_eq!(r.unwrap_err().code(), "unsupported_format_version");
        t.name = "vendor.secret".into();
        t.metadata_props.clear();
        let key = structs::physical_type_key(&t, &[], &Default::default()).unwrap();
        let r = types.layout(&key, &w(64, 8), || Ok(t.clone()));
        assert_eq!(r.unwrap_err().code(), "unknown_physical_type");
    }
}
