//! Generates the ONNX + compiled-tensor Rust types from proto/onnx with a
//! pure-Rust protobuf compiler (no system protoc).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../proto/onnx/onnx.proto");
    let descriptors = protox::compile(["onnx/onnx.proto"], ["../proto"])?;
    prost_build::Config::new()
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
