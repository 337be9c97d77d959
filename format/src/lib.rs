//! What a ctcache client shares with the daemon and the core, and nothing
//! of the store: the ONNX and compiled-tensor protobuf types, the per-chunk
//! digests payloads are checked with, and the default paths (D8).

#![deny(missing_docs)]

pub mod chunks;
pub mod paths;

/// Rust types generated from `proto/onnx/onnx.proto` (ONNX plus the
/// compiled-tensor extension). Bytes fields are `bytes::Bytes`, so decoding
/// from a mapped model borrows payloads instead of copying them.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
