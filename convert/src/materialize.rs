//! The materializer's settings, plans and reports as API messages.

use ctcache::materialize::{self as mat, Method, Plan, Recipe, Report, Settings};
use ctcache_api::v1;

/// The API form of a link mode.
pub fn link_mode(m: mat::LinkMode) -> v1::LinkMode {
    match m {
        mat::LinkMode::Auto => v1::LinkMode::Auto,
        mat::LinkMode::Reflink => v1::LinkMode::Reflink,
        mat::LinkMode::Copy => v1::LinkMode::Copy,
        mat::LinkMode::Hard => v1::LinkMode::Hard,
    }
}

/// The core's form of an API link mode.
pub fn link_mode_of(m: v1::LinkMode) -> mat::LinkMode {
    match m {
        v1::LinkMode::Auto => mat::LinkMode::Auto,
        v1::LinkMode::Reflink => mat::LinkMode::Reflink,
        v1::LinkMode::Copy => mat::LinkMode::Copy,
        v1::LinkMode::Hard => mat::LinkMode::Hard,
    }
}

/// The API form of how a file was placed.
pub fn place_method(m: Method) -> v1::PlaceMethod {
    match m {
        Method::Reflink => v1::PlaceMethod::Reflink,
        Method::Copy => v1::PlaceMethod::Copy,
        Method::HardLink => v1::PlaceMethod::HardLink,
        Method::InPlace => v1::PlaceMethod::InPlace,
    }
}

/// How a file was placed, in the words output uses (the core's names).
pub fn place_method_name(m: v1::PlaceMethod) -> &'static str {
    match m {
        v1::PlaceMethod::Unspecified => "unspecified",
        v1::PlaceMethod::Reflink => Method::Reflink.name(),
        v1::PlaceMethod::Copy => Method::Copy.name(),
        v1::PlaceMethod::HardLink => Method::HardLink.name(),
        v1::PlaceMethod::InPlace => Method::InPlace.name(),
    }
}

/// A materialize request whose placement cannot be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkModeError {
    /// `link` is no known mode.
    #[error("unknown link mode {0}")]
    Unknown(i32),
    /// The older `copy` flag with another link mode.
    #[error("copy is link mode copy; it contradicts link mode {0}")]
    Contradicts(&'static str),
}

/// How the payload files of `r` are to be placed: `link`, or `Copy` when
/// the older `copy` flag is set (with `link` left at auto or copy).
pub fn requested_link_mode(r: &v1::MaterializeRequest) -> Result<mat::LinkMode, LinkModeError> {
    let link = v1::LinkMode::try_from(r.link).map_err(|_| LinkModeError::Unknown(r.link))?;
    match (r.copy, link) {
        (false, m) => Ok(link_mode_of(m)),
        (true, v1::LinkMode::Auto | v1::LinkMode::Copy) => Ok(mat::LinkMode::Copy),
        (true, m) => Err(LinkModeError::Contradicts(link_mode_of(m).name())),
    }
}

/// The answer for `plan` written to `output` with `recipe`, as `report`
/// says; `packed` and `cached` (entries packed now / found in the store)
/// are the caller's to set.
pub fn materialize_response(
    output: &std::path::Path,
    plan: &Plan,
    report: &Report,
    recipe: &Recipe,
) -> v1::MaterializeResponse {
    let nbits = match recipe {
        Recipe::Nbits(s) => *s,
        Recipe::Int8(_) | Recipe::Fp16(_) => Settings {
            bits: 0,
            block_size: 0,
            symmetric: false,
            accuracy_level: 0,
        },
    };
    let int8 = match recipe {
        Recipe::Int8(s) => Some(s),
        Recipe::Nbits(_) | Recipe::Fp16(_) => None,
    };
    let settings = &nbits;
    v1::MaterializeResponse {
        target: recipe.target().into(),
        weight_type: int8
            .map(|s| s.weight_type().to_string())
            .unwrap_or_default(),
        per_channel: int8.is_some_and(|s| s.per_channel),
        reduce_range: int8.is_some_and(|s| s.reduce_range),
        op_types: int8.map(|s| s.op_types.clone()).unwrap_or_default(),
        output_path: output.display().to_string(),
        data_dir: report.data_dir.display().to_string(),
        nodes_rewritten: report.nodes_rewritten as u32,
        initializers_removed: report.initializers_removed as u32,
        skipped: plan
            .skipped
            .iter()
            .map(|s| v1::MaterializeSkip {
                node: s.node.clone(),
                op_type: s.op_type.clone(),
                reason: s.reason.clone(),
                detail: s.detail.clone(),
            })
            .collect(),
        packed: 0,
        cached: 0,
        files_linked: report.count(Method::HardLink) as u32,
        files_copied: report.count(Method::Copy) as u32,
        files_reflinked: report.count(Method::Reflink) as u32,
        files: report
            .files
            .iter()
            .map(|f| v1::MaterializeFile {
                path: f.path.display().to_string(),
                method: place_method(f.method) as i32,
                bytes_copied: f.bytes_copied,
            })
            .collect(),
        link: link_mode(report.link) as i32,
        bytes_copied: report.bytes_copied,
        model_bytes: report.model_bytes,
        payload_bytes: report.payload_bytes,
        bits: settings.bits,
        block_size: settings.block_size,
        symmetric: settings.symmetric,
        accuracy_level: settings.accuracy_level,
        // In-memory answers: the daemon's to fill.
        model: Default::default(),
        tensors: Vec::new(),
        leases: Vec::new(),
        external_data_dir: String::new(),
    }
}
