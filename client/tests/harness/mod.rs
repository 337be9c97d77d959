//! Test harness: a real `ctcached` on temp dirs, `ctcachectl` runs against
//! it, and MatMul models written through the prost types.

#![allow(dead_code)]

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctcache::pb;
use ctcache::pb::type_proto::{Tensor, Value as TypeValue};
use prost::Message;
use serde_json::Value;

/// The daemon binary, built by `cargo build -p ctcached` (binaries of other
/// packages have no CARGO_BIN_EXE_ variable): next to ctcachectl, else in
/// `$CARGO_TARGET_DIR/debug`, else in /var/tmp/ctcache-target/debug.
pub fn ctcached_bin() -> PathBuf {
    let beside = Path::new(ctl_bin()).with_file_name("ctcached");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/ctcache-target"));
    let candidates = [beside, target.join("debug").join("ctcached")];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!("ctcached is missing ({candidates:?}): run `cargo build -p ctcached` first")
        })
}

pub fn ctl_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ctcachectl")
}

/// One ctcachectl run.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }

    pub fn ok(self) -> Out {
        assert_eq!(self.code, 0, "{self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        self
    }
}

/// Runs ctcachectl with `args` (no daemon socket added).
pub fn ctl_raw(args: &[&str]) -> Out {
    let o = Command::new(ctl_bin())
        .args(args)
        .env_remove("CTCACHE_SOCKET")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("running ctcachectl");
    let out = Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into(),
        stderr: String::from_utf8_lossy(&o.stderr).into(),
    };
    assert!(!out.stderr.contains("panicked"), "panic: {out:#?}");
    out
}

/// A running ctcached on `T/cache`, `T/s.sock`, watching `T/models`.
pub struct Daemon {
    dir: Option<tempfile::TempDir>,
    pub socket: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    pub fn start() -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        for d in ["models", "work", "config"] {
            std::fs::create_dir_all(t.join(d)).unwrap();
        }
        let socket = t.join("s.sock");
        let log = std::fs::File::create(t.join("daemon.log")).unwrap();
        let child = Command::new(ctcached_bin())
            .arg("--cache-dir")
            .arg(t.join("cache"))
            .arg("--socket")
            .arg(&socket)
            .arg("--watch")
            .arg(t.join("models"))
            .args(["--log-format", "human"])
            // No user or system config file may leak into the test.
            .env("XDG_CONFIG_HOME", t.join("config"))
            .env_remove("CTCACHE_CONFIG")
            .env_remove("CTCACHE_SOCKET")
            .env_remove("CTCACHE_CACHE_DIR")
            .env_remove("CTCACHE_WATCH")
            .env_remove("INVOCATION_ID")
            .env_remove("LISTEN_FDS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawning ctcached");
        let mut d = Daemon {
            dir: Some(dir),
            socket,
            child: Some(child),
        };
        d.wait_ready();
        d
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        while UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("ctcached exited early ({status}):\n{}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "ctcached not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.as_ref().unwrap().path().join(rel)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.path("daemon.log")).unwrap_or_default()
    }

    pub fn socket_arg(&self) -> String {
        self.socket.display().to_string()
    }

    /// Runs ctcachectl against this daemon.
    pub fn ctl(&self, args: &[&str]) -> Out {
        let mut all = vec!["--socket", self.socket.to_str().unwrap()];
        all.extend_from_slice(args);
        ctl_raw(&all)
    }

    /// Runs `ctcachectl --json ARGS`, expects exit 0, parses stdout.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        self.ctl(&all).ok().json()
    }

    /// SIGTERM; the daemon must exit 0 within 30 s. Returns its temp dir
    /// (the cache stays for offline checks).
    pub fn stop(mut self) -> tempfile::TempDir {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on the pid of a child this test spawned.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "ctcached exited with {status}:\n{}",
                    self.log()
                );
                return self.dir.take().unwrap();
            }
            if start.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!(
                    "ctcached did not stop within 30 s of SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A failed test must not leave a daemon behind.
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `f` until it returns true (10 s at most).
pub fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn io(name: &str, dims: &[i64]) -> pb::ValueInfoProto {
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(TypeValue::TensorType(Tensor {
                elem_type: 1,
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| pb::tensor_shape_proto::Dimension {
                            value: Some(pb::tensor_shape_proto::dimension::Value::DimValue(d)),
                            denotation: String::new(),
                        })
                        .collect(),
                }),
            })),
            denotation: String::new(),
        }),
        ..Default::default()
    }
}

/// Y = X @ W with W[512, 256] FLOAT (131,072 elements: the default policy
/// packs it with gemm.pack_b.f32 and ort.matmul_nbits). `seed` varies W.
pub fn matmul_model(seed: u32) -> Vec<u8> {
    let (k, n) = (512i64, 256i64);
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let w: Vec<u8> = (0..k * n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((x % 2000) as f32 / 1000.0 - 1.0).to_le_bytes()
        })
        .collect();
    let model = pb::ModelProto {
        ir_version: 10,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 21,
        }],
        producer_name: "ctcache-client-tests".into(),
        graph: Some(pb::GraphProto {
            name: "g".into(),
            node: vec![pb::NodeProto {
                input: vec!["X".into(), "W".into()],
                output: vec!["Y".into()],
                op_type: "MatMul".into(),
                ..Default::default()
            }],
            initializer: vec![pb::TensorProto {
                name: "W".into(),
                data_type: 1,
                dims: vec![k, n],
                raw_data: Bytes::from(w),
                ..Default::default()
            }],
            input: vec![io("X", &[1, k])],
            output: vec![io("Y", &[1, n])],
            ..Default::default()
        }),
        ..Default::default()
    };
    model.encode_to_vec()
}

/// Writes a model file and returns its path as a string.
pub fn write_model(path: &Path, seed: u32) -> String {
    std::fs::write(path, matmul_model(seed)).unwrap();
    path.display().to_string()
}
