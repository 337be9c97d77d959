//! Test harness: spawns the real `ctcached` on temp dirs, connects a gRPC
//! client over its Unix socket, and writes small models.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ctcache::pb;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use prost::Message;
use tonic::transport::{Channel, Endpoint};

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ctcached"))
}

/// A running daemon on temp dirs; SIGTERMed on drop.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub cache: PathBuf,
    pub models: PathBuf,
}

pub fn paths(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    (
        dir.join("run/ctcached.sock"),
        dir.join("cache"),
        dir.join("models"),
    )
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[], |_| {})
    }

    /// Starts with extra flags and a hook to adjust the command.
    pub fn start_with(extra: &[&str], adjust: impl FnOnce(&mut Command)) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        let (socket, cache, models) = paths(dir.path());
        std::fs::create_dir_all(&models).unwrap();
        let mut d = Daemon {
            dir,
            child: None,
            socket,
            cache,
            models,
        };
        d.spawn(extra, adjust);
        d
    }

    pub fn command(&self, extra: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.arg("--cache-dir")
            .arg(&self.cache)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--watch")
            .arg(&self.models)
            .args(extra)
            .env_remove("NOTIFY_SOCKET")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env("CTCACHE_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }

    pub fn spawn(&mut self, extra: &[&str], adjust: impl FnOnce(&mut Command)) {
        let mut c = self.command(extra);
        adjust(&mut c);
        self.child = Some(c.spawn().expect("spawning ctcached"));
        wait_for_socket(&self.socket, self.child.as_mut().unwrap());
    }

    pub async fn client(&self) -> CompiledTensorCacheClient<Channel> {
        CompiledTensorCacheClient::new(channel(&self.socket).await)
    }

    /// SIGTERM and wait; returns the exit status code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("ctcached did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn wait_for_socket(socket: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!("ctcached exited early ({status}): {err}");
        }
        assert!(
            Instant::now() < deadline,
            "ctcached did not listen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub async fn channel(socket: &Path) -> Channel {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connecting to ctcached")
}

fn kv(k: &str, v: &str) -> pb::StringStringEntryProto {
    pb::StringStringEntryProto {
        key: k.into(),
        value: v.into(),
    }
}

/// A MatMul model Y = X @ W with W[k, n] FLOAT (seeded values).
pub fn matmul_model(k: usize, n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).max(1);
    let w: Vec<u8> = (0..k * n)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ((x as f32 / u32::MAX as f32) * 2.0 - 1.0).to_le_bytes()
        })
        .collect();
    let m = pb::ModelProto {
        ir_version: 9,
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
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
                dims: vec![k as i64, n as i64],
                raw_data: Bytes::from(w),
                ..Default::default()
            }],
            ..Default::default()
        }),
        metadata_props: vec![kv("test", "ctcached")],
        ..Default::default()
    };
    m.encode_to_vec()
}

/// Writes a model atomically (temp + rename, like an editor's save).
pub fn write_model(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The blake3 D3 digest of W in a model file.
pub fn digest_of(path: &Path, name: &str) -> Vec<u8> {
    let m = ctcache::onnx::Model::open(path).unwrap();
    let t = m
        .initializers()
        .unwrap()
        .into_iter()
        .find(|t| t.name == name)
        .unwrap();
    ctcache::digest::digest_tensor(&m, &t, ctcache::digest::Algorithm::Blake3)
        .unwrap()
        .bytes
        .to_vec()
}

/// Polls `f` until it returns Some or the timeout passes.
pub async fn eventually<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
