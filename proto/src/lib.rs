//! The ctcached gRPC API, version 1: messages, client and server stubs
//! generated from `proto/ctcache/v1/ctcache.proto`.

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("ctcache.v1");
}

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ctcache_descriptor.bin"));
