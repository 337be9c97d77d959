//! The ctcached gRPC API, version 1: messages, client and server stubs
//! generated from `proto/ctcache/v1/ctcache.proto`, and the conversions
//! between the core's types and these messages ([`convert`]). Struct types
//! travel encoded ([`StructType`]).

#![deny(missing_docs)]

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("ctcache.v1");
}

pub mod convert;
pub mod served;
mod struct_type;

pub use struct_type::StructType;

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ctcache_descriptor.bin"));

use ctcache::materialize::{self as mat, Method, Plan, Recipe, Report, Settings};

impl From<mat::LinkMode> for v1::LinkMode {
    fn from(m: mat::LinkMode) -> Self {
        match m {
            mat::LinkMode::Auto => v1::LinkMode::Auto,
            mat::LinkMode::Reflink => v1::LinkMode::Reflink,
            mat::LinkMode::Copy => v1::LinkMode::Copy,
            mat::LinkMode::Hard => v1::LinkMode::Hard,
        }
    }
}

impl From<v1::LinkMode> for mat::LinkMode {
    fn from(m: v1::LinkMode) -> Self {
        match m {
            v1::LinkMode::Auto => mat::LinkMode::Auto,
            v1::LinkMode::Reflink => mat::LinkMode::Reflink,
            v1::LinkMode::Copy => mat::LinkMode::Copy,
            v1::LinkMode::Hard => mat::LinkMode::Hard,
        }
    }
}

impl From<Method> for v1::PlaceMethod {
    fn from(m: Method) -> Self {
        match m {
            Method::Reflink => v1::PlaceMethod::Reflink,
            Method::Copy => v1::PlaceMethod::Copy,
            Method::HardLink => v1::PlaceMethod::HardLink,
            Method::InPlace => v1::PlaceMethod::InPlace,
        }
    }
}

impl v1::PlaceMethod {
    /// The method's name in output (the core's names).
    pub fn name(self) -> &'static str {
        match self {
            v1::PlaceMethod::Unspecified => "unspecified",
            v1::PlaceMethod::Reflink => Method::Reflink.name(),
            v1::PlaceMethod::Copy => Method::Copy.name(),
            v1::PlaceMethod::HardLink => Method::HardLink.name(),
            v1::PlaceMethod::InPlace => Method::InPlace.name(),
        }
    }
}

impl v1::MaterializeRequest {
    /// How the payload files are to be placed: `link`, or `Copy` when the
    /// older `copy` flag is set (with `link` left at auto or copy). An
    /// unknown `link` value or `copy` with another mode is refused.
    pub fn link_mode(&self) -> Result<mat::LinkMode, String> {
        let link = v1::LinkMode::try_from(self.link)
            .map_err(|_| format!("unknown link mode {}", self.link))?;
        match (self.copy, link) {
            (false, m) => Ok(m.into()),
            (true, v1::LinkMode::Auto | v1::LinkMode::Copy) => Ok(mat::LinkMode::Copy),
            (true, m) => Err(format!(
                "copy is link mode copy; it contradicts link mode {}",
                mat::LinkMode::from(m).name()
            )),
        }
    }
}

impl v1::MaterializeResponse {
    /// The answer for `plan` written to `output` with `settings`, as
    /// `report` says; `packed` and `cached` (entries packed now / found in
    /// the store) are the caller's to set.
    pub fn from_report(
        output: &std::path::Path,
        plan: &Plan,
        report: &Report,
        recipe: &Recipe,
    ) -> Self {
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
                    method: v1::PlaceMethod::from(f.method) as i32,
                    bytes_copied: f.bytes_copied,
                })
                .collect(),
            link: v1::LinkMode::from(report.link) as i32,
            bytes_copied: report.bytes_copied,
            model_bytes: report.model_bytes,
            payload_bytes: report.payload_bytes,
            bits: settings.bits,
            block_size: settings.block_size,
            symmetric: settings.symmetric,
            accuracy_level: settings.accuracy_level,
        }
    }
}

impl v1::JobState {
    /// The word people and JSON output see: `queued`, `running`, `done`,
    /// `cached`, `failed`, `cancelled`.
    pub fn name(self) -> &'static str {
        match self {
            v1::JobState::Unspecified => "unknown",
            v1::JobState::Queued => "queued",
            v1::JobState::Running => "running",
            v1::JobState::Done => "done",
            v1::JobState::Cached => "cached",
            v1::JobState::Failed => "failed",
            v1::JobState::Cancelled => "cancelled",
        }
    }

    /// Whether the job is over (it will not change again).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            v1::JobState::Done
                | v1::JobState::Cached
                | v1::JobState::Failed
                | v1::JobState::Cancelled
        )
    }

    /// Whether the job ended with an entry.
    pub fn succeeded(self) -> bool {
        matches!(self, v1::JobState::Done | v1::JobState::Cached)
    }
}

impl v1::Backend {
    /// `auto`, `cpu` or `wgpu`.
    pub fn name(self) -> &'static str {
        match self {
            v1::Backend::Auto => "auto",
            v1::Backend::Cpu => "cpu",
            v1::Backend::Wgpu => "wgpu",
        }
    }

    /// The backend named `name` (`auto`, `cpu`, `wgpu`).
    pub fn from_name(name: &str) -> Option<v1::Backend> {
        [v1::Backend::Auto, v1::Backend::Cpu, v1::Backend::Wgpu]
            .into_iter()
            .find(|b| b.name() == name)
    }
}
