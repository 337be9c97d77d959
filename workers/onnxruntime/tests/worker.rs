//! The worker against a real onnxruntime library: `CTCACHE_TEST_ORT_LIBRARY`
//! (tests/run.sh sets it to the test venv's `libonnxruntime.so`; under CI
//! its absence fails these tests).

use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use ctcache::pb;
use prost::Message;

const WORKER: &str = env!("CARGO_BIN_EXE_ctcache-onnxruntime-worker");

/// The configured library; `None` (with a note) outside CI when unset.
fn library() -> Option<PathBuf> {
    match std::env::var_os("CTCACHE_TEST_ORT_LIBRARY") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("CI").is_some() => {
            panic!("CTCACHE_TEST_ORT_LIBRARY is not set; tests/run.sh sets it")
        }
        None => {
            eprintln!("CTCACHE_TEST_ORT_LIBRARY is not set: not run here (tests/run.sh sets it)");
            None
        }
    }
}

/// Runs the worker with `stdin` as its input and a fresh file as
/// descriptor 3; returns its output and what it wrote there.
fn run(args: &[&str], stdin: &[u8]) -> (Output, Vec<u8>) {
    let mut input = tempfile::tempfile().unwrap();
    input.write_all(stdin).unwrap();
    input.rewind().unwrap();
    let mut out = tempfile::tempfile().unwrap();
    let fd = out.as_raw_fd();
    let mut cmd = Command::new(WORKER);
    cmd.args(args)
        .stdin(Stdio::from(input))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            // When the file already is descriptor 3, dup2 leaves its
            // close-on-exec flag set: clear it either way.
            if libc::dup2(fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = cmd.output().unwrap();
    let mut written = Vec::new();
    out.rewind().unwrap();
    out.read_to_end(&mut written).unwrap();
    (output, written)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn identify_reports_the_version_and_build() {
    let Some(lib) = library() else { return };
    let (out, _) = run(&["identify", "--library", lib.to_str().unwrap()], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(id["runtime"], "onnxruntime");
    assert!(id["version"].as_str().unwrap().starts_with("1."), "{id}");
    assert!(
        id["build"].as_str().unwrap().contains("git-commit-id"),
        "{id}"
    );
}

#[test]
fn a_library_that_is_not_onnxruntime_is_named_as_such() {
    for not_ort in [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/etc/hostname",
        "/nonexistent.so",
    ] {
        let (out, _) = run(&["identify", "--library", not_ort], b"");
        assert_eq!(
            out.status.code(),
            Some(2),
            "{not_ort}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains(not_ort) && err.contains("not an onnxruntime library"),
            "{err}"
        );
    }
}

#[test]
fn a_model_onnxruntime_refuses_is_its_refusal() {
    let Some(lib) = library() else { return };
    let lib = lib.to_str().unwrap();
    let (out, written) = run(
        &["optimize", "--library", lib, "--level", "extended"],
        b"not a model",
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).starts_with("onnxruntime refuses the model:"));
    assert!(written.is_empty());
}

#[test]
fn optimize_writes_the_optimized_model_to_descriptor_3() {
    let Some(lib) = library() else { return };
    let lib = lib.to_str().unwrap();
    // Y = X + (A + B): constant folding makes A + B one initializer.
    let model = folding_model();
    let (out, written) = run(
        &["optimize", "--library", lib, "--level", "extended"],
        &model,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let optimized = pb::ModelProto::decode(written.as_slice()).expect("an ONNX model");
    let g = optimized.graph.unwrap();
    assert_eq!(g.node.len(), 1, "{:?}", g.node);
    assert_eq!(g.node[0].input[0], "X");
    assert_eq!(g.initializer.len(), 1);
}

fn folding_model() -> Vec<u8> {
    use ctcache_testkit::{f32_tensor, node, tensor_info};
    let graph = pb::GraphProto {
        name: "g".into(),
        node: vec![
            node("Add", "ab", &["A", "B"], "C"),
            node("Add", "y", &["X", "C"], "Y"),
        ],
        initializer: vec![
            f32_tensor("A", &[4], &[1.0, 2.0, 3.0, 4.0]),
            f32_tensor("B", &[4], &[0.5; 4]),
        ],
        input: vec![tensor_info("X", &[1, 4])],
        output: vec![tensor_info("Y", &[1, 4])],
        ..Default::default()
    };
    pb::ModelProto {
        ir_version: 8,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn no_output_descriptor_is_a_failure_not_an_empty_form() {
    let Some(lib) = library() else { return };
    let mut cmd = Command::new(WORKER);
    cmd.args([
        "optimize",
        "--library",
        lib.to_str().unwrap(),
        "--level",
        "basic",
    ])
    .stdin(Stdio::from(
        std::fs::File::open(tempfile_with(&folding_model())).unwrap(),
    ));
    // SAFETY: close is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(3);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("the optimized model was not written"),
        "{}",
        text(&out.stderr)
    );
}

fn tempfile_with(bytes: &[u8]) -> PathBuf {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    f.into_temp_path().keep().unwrap()
}
