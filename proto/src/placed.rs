//! Files a client placed, as API messages: link modes, how each file was
//! placed, and a Materialize answer with what writing it did.

use std::path::Path;

use ctcache_files::answer::Written;
use ctcache_files::place::{LinkMode, Method};

use crate::v1;

/// The API form of a link mode.
pub fn link_mode(m: LinkMode) -> v1::LinkMode {
    match m {
        LinkMode::Auto => v1::LinkMode::Auto,
        LinkMode::Reflink => v1::LinkMode::Reflink,
        LinkMode::Copy => v1::LinkMode::Copy,
        LinkMode::Hard => v1::LinkMode::Hard,
    }
}

/// The files' form of an API link mode.
pub fn link_mode_of(m: v1::LinkMode) -> LinkMode {
    match m {
        v1::LinkMode::Auto => LinkMode::Auto,
        v1::LinkMode::Reflink => LinkMode::Reflink,
        v1::LinkMode::Copy => LinkMode::Copy,
        v1::LinkMode::Hard => LinkMode::Hard,
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

/// How a file was placed, in the words output uses ([`Method::name`]).
pub fn place_method_name(m: v1::PlaceMethod) -> &'static str {
    match m {
        v1::PlaceMethod::Unspecified => "unspecified",
        v1::PlaceMethod::Reflink => Method::Reflink.name(),
        v1::PlaceMethod::Copy => Method::Copy.name(),
        v1::PlaceMethod::HardLink => Method::HardLink.name(),
        v1::PlaceMethod::InPlace => Method::InPlace.name(),
    }
}

/// The Materialize answer `r` with what writing it to `output` did
/// (files placed by `link`, as `written` says).
pub fn with_files_written(
    r: v1::MaterializeResponse,
    output: &Path,
    link: LinkMode,
    written: &Written,
) -> v1::MaterializeResponse {
    let count = |m: Method| written.files.iter().filter(|f| f.method == m).count() as u32;
    v1::MaterializeResponse {
        output_path: output.display().to_string(),
        data_dir: written.data_dir.display().to_string(),
        files_linked: count(Method::HardLink),
        files_copied: count(Method::Copy),
        files_reflinked: count(Method::Reflink),
        files: written
            .files
            .iter()
            .map(|f| v1::MaterializeFile {
                path: f.path.display().to_string(),
                method: place_method(f.method) as i32,
                bytes_copied: f.bytes_copied,
            })
            .collect(),
        link: link_mode(link) as i32,
        bytes_copied: written.bytes_copied,
        model_bytes: written.model_bytes,
        ..r
    }
}
