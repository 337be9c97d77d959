//! Property test: mutated valid models never panic anywhere in the read path
//! (parse, initializers, digests, checker, loading rules, strip).

mod common;

use bytes::Bytes;
use common::*;
use ctcache::check::{check_model, CheckOptions};
use ctcache::digest::{digest_all, Algorithm};
use ctcache::onnx::{rewrite, Model};
use ctcache::resolve::classify;
use proptest::prelude::*;
use prost::Message;

fn seeds() -> Vec<Vec<u8>> {
    let mut typed = compiled_model();
    let g = typed.graph.as_mut().unwrap();
    g.initializer.push(ctcache::pb::TensorProto {
        name: "T".into(),
        data_type: 10,
        dims: vec![3],
        int32_data: vec![1, 2, 65535],
        ..Default::default()
    });
    g.initializer.push(ctcache::pb::TensorProto {
        name: "E".into(),
        data_type: 1,
        dims: vec![2],
        data_location: 1,
        external_data: vec![
            kv("location", "data.bin"),
            kv("offset", "0"),
            kv("length", "8"),
        ],
        ..Default::default()
    });
    vec![
        compiled_model().encode_to_vec(),
        typed.encode_to_vec(),
        base_model().encode_to_vec(),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Truncate(usize),
    Insert(usize, Vec<u8>),
    Overwrite(usize, Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..12))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..12))
            .prop_map(|(i, v)| Mutation::Overwrite(i, v)),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    for m in muts {
        if b.is_empty() {
            break;
        }
        match m {
            Mutation::Flip(i, x) => {
                let n = b.len();
                b[i % n] ^= x
            }
            Mutation::Truncate(i) => b.truncate(i % b.len()),
            Mutation::Insert(i, v) => {
                let at = i % b.len();
                b.splice(at..at, v.iter().copied());
            }
            Mutation::Overwrite(i, v) => {
                let at = i % b.len();
                for (k, x) in v.iter().enumerate() {
                    if let Some(slot) = b.get_mut(at + k) {
                        *slot = *x;
                    }
                }
            }
        }
    }
    b
}

/// Runs the whole read path; errors are fine, panics are not.
fn exercise(bytes: Vec<u8>, dir: &std::path::Path) {
    let Ok(model) = Model::from_bytes(Bytes::from(bytes), dir) else {
        return;
    };
    if let Ok(tensors) = model.initializers() {
        let _ = digest_all(&model, &tensors, Algorithm::Blake3);
        let _ = digest_all(&model, &tensors, Algorithm::Sha256);
        for t in &tensors {
            let _ = ctcache::digest::raw_copy(&model, t);
        }
    }
    let _ = model.nodes();
    let _ = check_model(&model, &CheckOptions::default());
    let _ = classify(&model, &test_host(), &CheckOptions::default());
    let _ = rewrite::strip_to_vec(&model);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_models_never_panic(seed in 0usize..3, muts in prop::collection::vec(mutation(), 1..6)) {
        let dir = std::env::temp_dir().join("ctcache-fuzz-models");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("data.bin"), [0u8; 8]).unwrap();
        let bytes = apply(seeds()[seed].clone(), &muts);
        exercise(bytes, &dir);
    }
}

/// Millions of 3-byte top-level fields (an unknown varint field, repeated):
/// the index of top-level fields would cost ~40 bytes for each, so such a
/// file is refused past the count any model can need, not indexed.
#[test]
fn a_model_of_millions_of_tiny_fields_is_refused_before_indexing_them() {
    let mut bytes = ctcache_testkit::MatMul::new(4, 4, [0.5f32; 16]).encode();
    // Field 99, varint 0.
    for _ in 0..(2 << 20) + 10_000 {
        bytes.extend_from_slice(&[0x98, 0x06, 0x00]);
    }
    let e = ctcache::onnx::Model::from_bytes(bytes.into(), ".").unwrap_err();
    assert!(e.to_string().contains("top-level fields"), "{e}");
}
