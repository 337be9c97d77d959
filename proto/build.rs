//! Generates the gRPC API (client and server) from proto/ctcache/v1 with a
//! pure-Rust protobuf compiler; the ONNX messages come from ctcache-format.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=ctcache/v1/ctcache.proto");
    println!("cargo:rerun-if-changed=onnx/onnx.proto");
    let fds = protox::compile(["ctcache/v1/ctcache.proto"], ["."])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("ctcache_descriptor.bin"), fds.encode_to_vec())?;
    // Messages and the client.
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .bytes(".")
        .extern_path(".onnx", "::ctcache_format::pb")
        // Struct types travel as their encoding (see src/struct_type.rs).
        .extern_path(".onnx.StructTypeProto", "crate::StructType")
        .compile_fds(fds.clone())?;
    // The server, over the same messages except the lookup answers, which
    // it sends with entries already encoded (see src/served.rs).
    let served = out.join("served");
    std::fs::create_dir_all(&served)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .out_dir(served)
        .extern_path(".onnx", "::ctcache_format::pb")
        .extern_path(".ctcache.v1", "crate::v1")
        .extern_path(
            ".ctcache.v1.LookupResponse",
            "crate::served::LookupResponse",
        )
        .extern_path(
            ".ctcache.v1.BatchLookupResponse",
            "crate::served::BatchLookupResponse",
        )
        .compile_fds(fds)?;
    Ok(())
}
