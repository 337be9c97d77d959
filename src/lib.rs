//! ctcache core: ONNX model access, canonical source digests (D3), structured
//! types, the checker, the loading rules and the byte-preserving rewrite (D2).
//!
//! No async runtime and no networking live here; the daemon and the clients
//! build on these types.

#![deny(missing_docs)]

pub mod access;
pub mod check;
pub mod chunks;
pub mod device;
pub mod digest;
pub mod dtype;
pub mod error;
pub mod fsutil;
pub mod hit;
pub mod materialize;
pub mod onnx;
pub mod outdir;
pub mod paths;
pub mod resolve;
pub mod store;
pub mod structs;
pub mod wire;

pub use error::{Error, Result};

/// Rust types generated from `proto/onnx/onnx.proto` (ONNX plus the
/// compiled-tensor extension). Bytes fields are `bytes::Bytes`, so decoding
/// from a mapped model borrows payloads instead of copying them.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}
