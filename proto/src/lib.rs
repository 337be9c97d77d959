//! The ctcached gRPC API, version 1: messages, client and server stubs
//! generated from `proto/ctcache/v1/ctcache.proto`.

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("ctcache.v1");
}

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ctcache_descriptor.bin"));

use ctcache::materialize::{Plan, Report, Settings};

impl v1::MaterializeResponse {
    /// The answer for `plan` written to `output` with `settings`, as
    /// `report` says; `packed` and `cached` (entries packed now / found in
    /// the store) are the caller's to set.
    pub fn from_report(
        output: &std::path::Path,
        plan: &Plan,
        report: &Report,
        settings: &Settings,
    ) -> Self {
        v1::MaterializeResponse {
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
                })
                .collect(),
            packed: 0,
            cached: 0,
            files_linked: report.files_linked as u32,
            files_copied: report.files_copied as u32,
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
