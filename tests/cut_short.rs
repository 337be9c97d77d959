//! A model's external data file cut short while the model is open: reading
//! the mapped pages past the new end would raise SIGBUS and end the process
//! (the daemon, when a socket peer truncates its own model during a digest
//! or a pack). The reads go on with zeros, and every reader refuses them.
//! And a pass over mapped external data leaves none of it resident in the
//! process (it is released as it is read), whatever the model's size.

use std::path::Path;

use ctcache::digest::{digest_tensor, raw_copy, Algorithm};
use ctcache::onnx::{intact, Model};
use ctcache::pb;
#[cfg(target_os = "linux")]
use ctcache_testkit::resident;
use ctcache_testkit::{kv, MatMul};
use prost::Message;

const ROWS: i64 = 256;
const COLS: i64 = 256;

/// A model whose weight `W` (FLOAT[256, 256], 256 KiB) is external data.
fn write_model(dir: &Path) {
    write_model_sized(dir, ROWS, COLS);
}

/// A model whose weight `W` (FLOAT[rows, cols]) is external data.
fn write_model_sized(dir: &Path, rows: i64, cols: i64) {
    let bytes: Vec<u8> = (0..rows * cols)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    std::fs::write(dir.join("weights.bin"), &bytes).unwrap();
    let mut m = MatMul::new(rows as usize, cols as usize, std::iter::repeat(0.0)).proto();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.raw_data = Default::default();
    w.data_location = pb::tensor_proto::DataLocation::External as i32;
    w.external_data = vec![
        kv("location", "weights.bin"),
        kv("offset", "0"),
        kv("length", &bytes.len().to_string()),
    ];
    std::fs::write(dir.join("m.onnx"), m.encode_to_vec()).unwrap();
}

#[test]
fn a_data_file_truncated_under_an_open_model_is_refused_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path());
    let m = Model::open(dir.path().join("m.onnx")).unwrap();
    let t = m.initializers().unwrap().remove(0);
    let before = digest_tensor(&m, &t, Algorithm::Blake3).unwrap();
    assert!(intact(&m.mapped_data(&t).unwrap().unwrap()));

    // Another open model, untouched, stays readable and intact.
    let other_dir = tempfile::tempdir().unwrap();
    write_model(other_dir.path());
    let other = Model::open(other_dir.path().join("m.onnx")).unwrap();
    let other_t = other.initializers().unwrap().remove(0);

    std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("weights.bin"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    let e = digest_tensor(&m, &t, Algorithm::Blake3).unwrap_err();
    assert!(e.to_string().contains("cut short"), "{e}");
    let e = raw_copy(&m, &t).unwrap_err();
    assert!(e.to_string().contains("cut short"), "{e}");
    assert!(!intact(&m.mapped_data(&t).unwrap().unwrap()));

    assert_eq!(
        digest_tensor(&other, &other_t, Algorithm::Blake3).unwrap(),
        before,
        "same content, same digest"
    );
    assert!(intact(&other.mapped_data(&other_t).unwrap().unwrap()));
}

/// The model file itself cut short while a rewrite copies it: the output is
/// refused (not written with zeros where the model was).
#[test]
fn a_model_truncated_while_rewritten_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inline.onnx");
    let m = MatMul::new(ROWS as usize, COLS as usize, std::iter::repeat(0.5)).proto();
    std::fs::write(&path, m.encode_to_vec()).unwrap();
    let model = Model::open(&path).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let out = dir.path().join("out.onnx");
    let e = ctcache::onnx::rewrite::strip(&model, &out).unwrap_err();
    assert!(e.to_string().contains("cut short"), "{e}");
    assert!(!out.exists());
}

#[cfg(target_os = "linux")]
#[test]
fn hashing_and_copying_mapped_data_leave_none_of_it_resident() {
    // 48 MiB: more than one window of the readers that release as they go.
    let (rows, cols) = (4096, 3072);
    let dir = tempfile::tempdir().unwrap();
    write_model_sized(dir.path(), rows, cols);
    let m = Model::open(dir.path().join("m.onnx")).unwrap();
    let t = m.initializers().unwrap().remove(0);
    let data = m.mapped_data(&t).unwrap().unwrap();
    let page = 4096 * 4;
    let digest = digest_tensor(&m, &t, Algorithm::Blake3).unwrap();
    assert!(
        resident(&data) <= page,
        "{} bytes of the data file stay resident after a digest",
        resident(&data)
    );
    let raw = raw_copy(&m, &t).unwrap();
    assert!(
        resident(&data) <= page,
        "{} bytes of the data file stay resident after a copy",
        resident(&data)
    );
    // What was released reads the same again.
    assert_eq!(raw, std::fs::read(dir.path().join("weights.bin")).unwrap());
    assert_eq!(digest_tensor(&m, &t, Algorithm::Blake3).unwrap(), digest);

    // Bytes held in memory rather than mapped are never released (the
    // advice would zero them): an inline weight reads the same twice.
    let values = (0..ROWS * COLS).map(|i| i as f32);
    let model = MatMul::new(ROWS as usize, COLS as usize, values).proto();
    let held = Model::from_bytes(model.encode_to_vec().into(), dir.path()).unwrap();
    let t = held.initializers().unwrap().remove(0);
    let first = raw_copy(&held, &t).unwrap();
    digest_tensor(&held, &t, Algorithm::Blake3).unwrap();
    assert_eq!(raw_copy(&held, &t).unwrap(), first);
    assert_eq!(
        f32::from_le_bytes(first[first.len() - 4..].try_into().unwrap()),
        (ROWS * COLS - 1) as f32
    );
}
