//! Compiling an initializer ties the packed bytes to their digest: the bytes
//! hashed are the bytes packed. The attack this stops: a model's owner asks
//! for a pack of a public weight (digest D taken on arrival), then rewrites
//! the weight in place while the job waits; the job packs from the model's
//! mapping, which shows the new bytes, and must not store them under D.

use std::io::{Seek, SeekFrom, Write};

use ctcache::digest::{digest_tensor, raw_copy, Algorithm};
use ctcache::onnx::{Model, Storage, TensorRef};
use ctcache_kernels::compile::{compile, CompileError};
use ctcache_kernels::{find, pack_to_vec, Params, SourceTensor};
use ctcache_testkit::{unit_f32, xorshift, MatMul};
use prost::Message;

fn weight(m: &Model) -> TensorRef {
    m.initializers()
        .unwrap()
        .into_iter()
        .find(|t| t.name == "W")
        .unwrap()
}

#[test]
fn a_source_written_after_its_digest_is_not_packed_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.onnx");
    let proto = MatMul::new(64, 32, xorshift(7).map(unit_f32)).proto();
    std::fs::write(&path, proto.encode_to_vec()).unwrap();
    let m = Model::open(&path).unwrap();
    let t = weight(&m);
    let taken = digest_tensor(&m, &t, Algorithm::Blake3).unwrap();

    // Rewrite the weight's bytes in place: same file, same length, so the
    // open model's mapping now shows them.
    let Storage::Raw(range) = t.storage.clone() else {
        panic!("the test model keeps W in raw_data");
    };
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(range.start as u64)).unwrap();
    f.write_all(&vec![0x3f; range.len()]).unwrap();
    f.sync_all().unwrap();
    assert_eq!(&m.bytes()[range.clone()], &vec![0x3f; range.len()][..]);

    let p = find("ggml.q8_0").unwrap();
    let params = Params::new();
    let refused = compile(&m, &t, Some(taken), p, &params).unwrap_err();
    assert!(
        matches!(&refused, CompileError::SourceChanged { name } if name == "W"),
        "{refused}"
    );

    // Without a digest to hold to, the result describes the bytes it packed:
    // the new ones, under their own digest.
    let c = compile(&m, &t, None, p, &params).unwrap();
    let fresh = Model::open(&path).unwrap();
    let now = weight(&fresh);
    assert_eq!(
        c.digest,
        digest_tensor(&fresh, &now, Algorithm::Blake3).unwrap()
    );
    assert_ne!(c.digest, taken);
    let raw = raw_copy(&fresh, &now).unwrap();
    let src = SourceTensor {
        data_type: now.data_type,
        dims: &now.dims,
        data: &raw,
    };
    let (_, want) = pack_to_vec(p, &src, &params).unwrap();
    assert_eq!(c.payload[..], want[..]);
}
