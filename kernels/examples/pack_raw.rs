//! Test driver: packs one raw little-endian source file with one packer.
//!
//! ```text
//! pack_raw --list-isa
//! pack_raw FORMAT DTYPE DIMS IN.raw OUT.bin [--isa scalar|avx2|avx512|neon] [--type T.pb]
//!          [--decoder F.pb] [key=value ...]
//! ```
//! `--type` writes the output `StructTypeProto`, `--decoder` its decoder
//! `FunctionProto` (protobuf binary).
//! DTYPE is an ONNX type name (FLOAT, FLOAT16), DIMS comma-separated (empty
//! string for a scalar). Prints `name=`, `dims=`, `payload_len=` lines.

use std::error::Error;
use std::process::ExitCode;

use ctcache::dtype::DataType;
use ctcache_kernels::{find, Isa, Params, SourceTensor};
use prost::Message;

fn run(args: Vec<String>) -> Result<(), Box<dyn Error>> {
    if args.first().map(String::as_str) == Some("--list-isa") {
        let names: Vec<&str> = Isa::available_all().into_iter().map(Isa::name).collect();
        println!("{}", names.join(","));
        return Ok(());
    }
    if args.len() < 5 {
        return Err(
            "usage: pack_raw FORMAT DTYPE DIMS IN OUT [--isa scalar|avx2|avx512|neon] [k=v ...]"
                .into(),
        );
    }
    let packer = find(&args[0]).ok_or_else(|| format!("unknown packer {:?}", args[0]))?;
    let dt =
        DataType::from_name(&args[1]).ok_or_else(|| format!("unknown data type {:?}", args[1]))?;
    let dims: Vec<u64> = if args[2].is_empty() {
        Vec::new()
    } else {
        args[2]
            .split(',')
            .map(|d| d.trim().parse().map_err(|e| format!("bad dim {d:?}: {e}")))
            .collect::<Result<_, _>>()?
    };
    let data = std::fs::read(&args[3]).map_err(|e| format!("{}: {e}", args[3]))?;
    let mut isa = Isa::detect();
    let mut kv = Vec::new();
    let mut type_out = None;
    let mut decoder_out = None;
    let mut rest = args[5..].iter();
    while let Some(a) = rest.next() {
        if a == "--isa" {
            let n = rest.next().ok_or("--isa needs a value")?;
            isa = Isa::from_name(n).ok_or_else(|| format!("unknown isa {n:?}"))?;
        } else if a == "--type" {
            type_out = Some(rest.next().ok_or("--type needs a path")?.clone());
        } else if a == "--decoder" {
            decoder_out = Some(rest.next().ok_or("--decoder needs a path")?.clone());
        } else {
            kv.push(a.clone());
        }
    }
    let params = Params::parse(&kv)?;
    let layout = packer.output(dt, &dims, &params)?;
    let mut out = vec![0u8; layout.payload_len as usize];
    let src = SourceTensor {
        data_type: dt,
        dims: &dims,
        data: &data,
    };
    packer.pack_with(&src, &params, &mut out, isa)?;
    std::fs::write(&args[4], &out).map_err(|e| format!("{}: {e}", args[4]))?;
    if let Some(path) = type_out {
        std::fs::write(&path, layout.struct_type.encode_to_vec())
            .map_err(|e| format!("{path}: {e}"))?;
    }
    if let Some(path) = decoder_out {
        let d = layout
            .struct_type
            .decoder
            .as_ref()
            .ok_or("the type has no decoder")?;
        std::fs::write(&path, d.encode_to_vec()).map_err(|e| format!("{path}: {e}"))?;
    }
    println!("name={}", layout.struct_type.name);
    let d: Vec<String> = layout.dims.iter().map(u64::to_string).collect();
    println!("dims={}", d.join(","));
    println!("payload_len={}", layout.payload_len);
    Ok(())
}

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pack_raw: {e}");
            ExitCode::from(2)
        }
    }
}
