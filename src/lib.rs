//! ctcache core: ONNX model access, canonical source digests (D3), structured
//! types, the checker, the loading rules and the byte-preserving rewrite (D2).
//!
//! No async runtime and no networking live here; the daemon and the clients
//! build on these types.

#![deny(missing_docs)]

pub mod access;
pub mod cancel;
pub mod check;
pub mod device;
pub mod digest;
pub mod dtype;
pub mod error;
pub mod forms;
pub mod fsutil;
pub mod hit;
pub mod materialize;
pub mod onnx;
pub use ctcache_files::outdir;
pub mod resolve;
pub mod store;
pub mod structs;
pub mod wire;

pub use ctcache_format::{chunks, paths, pb};
pub use error::{Error, Result};
