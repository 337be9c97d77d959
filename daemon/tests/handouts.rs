//! The descriptor channel (#41 point 1): the daemon reads a caller's model
//! and data files only through descriptors the caller opened and handed
//! over, so a daemon that runs as its own user reads a user's private model
//! and nothing of anyone else's; every descriptor that is not a readable
//! regular file is a clear refusal at once (no hang on a FIFO, no endless
//! read of a device); a handout is its uid's alone and ends with its
//! connection; a model of more data files than allowed is a bound, not a
//! crash.

mod support;

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ctcache::pb::tensor_proto::DataLocation;
use ctcache_api::handout as wire;
use ctcache_api::v1 as api;
use ctcache_api::v1::compiled_tensor_cache_client::CompiledTensorCacheClient;
use ctcache_api::v1::{handout_reply, handout_request};
use support::*;
use tonic::Code;

/// The daemon runs as uid 65534, as the unit runs it as its own user: its
/// folders are made its own before it starts.
fn as_own_user(c: &mut Command) {
    let args: Vec<PathBuf> = c.get_args().map(PathBuf::from).collect();
    let after = |flag: &str| {
        let i = args.iter().position(|a| a == Path::new(flag)).unwrap();
        args[i + 1].clone()
    };
    let (cache, socket) = (after("--cache-dir"), after("--socket"));
    let top = cache.parent().unwrap().to_path_buf();
    open_to_all(&top);
    for d in [
        cache,
        socket.parent().unwrap().to_path_buf(),
        top.join("models"),
    ] {
        std::fs::create_dir_all(&d).unwrap();
        std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    c.uid(NOBODY).gid(NOBODY);
}

/// A root-only folder (0700) holding a 0600 model whose weight is external
/// data in `w.bin`: the model's path.
fn private_model(top: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = top.join("private");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (k, n) = (64, 32);
    let values: Vec<f32> = (0..k * n).map(|i| (i % 7) as f32 * 0.25).collect();
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut m = ctcache_testkit::MatMul::new(k, n, values).proto();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.float_data.clear();
    w.raw_data = Default::default();
    w.data_location = DataLocation::External as i32;
    w.external_data = vec![
        ctcache_testkit::kv("location", "w.bin"),
        ctcache_testkit::kv("length", &raw.len().to_string()),
    ];
    let path = dir.join("m.onnx");
    std::fs::write(dir.join("w.bin"), &raw).unwrap();
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    for p in [&path, &dir.join("w.bin")] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    path
}

/// A connection to the daemon's descriptor channel; a read waits at most
/// 20 s, so a daemon that hangs fails the test instead of holding it.
fn connect(socket: &Path) -> OwnedFd {
    use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
    let conn = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .unwrap();
    let addr = SocketAddrUnix::new(wire::socket_path(socket)).unwrap();
    rustix::net::connect(&conn, &addr).unwrap();
    rustix::net::sockopt::set_socket_timeout(
        &conn,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_secs(20)),
    )
    .unwrap();
    conn
}

fn send_model(conn: &OwnedFd, path: &Path, fds: &[BorrowedFd<'_>]) {
    send_model_with(conn, path, &[], fds);
}

/// HandoutModel naming `outputs`, with the model's descriptor and theirs.
fn send_model_with(conn: &OwnedFd, path: &Path, outputs: &[&str], fds: &[BorrowedFd<'_>]) {
    let msg = api::HandoutRequest {
        step: Some(handout_request::Step::Model(api::HandoutModel {
            model_path: path.display().to_string(),
            outputs: outputs.iter().map(|o| o.to_string()).collect(),
        })),
    };
    wire::send(conn, &msg, fds).unwrap();
}

fn reply(conn: &OwnedFd) -> handout_reply::Step {
    let (r, _) = wire::recv::<api::HandoutReply>(conn)
        .expect("an answer within 20 s")
        .expect("an answer, not a close");
    r.step.unwrap()
}

/// The gRPC code name of the refusal that ends the exchange.
fn refusal(step: handout_reply::Step) -> String {
    match step {
        handout_reply::Step::Error(e) => {
            assert!(!e.message.is_empty());
            e.code
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Hands `model` over, answering the daemon's request for `w.bin` with
/// `data`: the handout's name and its connection.
fn hand_over(socket: &Path, model: &Path, data: BorrowedFd<'_>) -> (String, OwnedFd) {
    let conn = connect(socket);
    let file = File::open(model).unwrap();
    send_model(&conn, model, &[file.as_fd()]);
    match reply(&conn) {
        handout_reply::Step::Needs(n) => assert_eq!(n.names, ["w.bin"]),
        other => panic!("{other:?}"),
    }
    let files = api::HandoutRequest {
        step: Some(handout_request::Step::Files(api::HandoutFiles {
            names: vec!["w.bin".into()],
            missing: vec![],
        })),
    };
    wire::send(&conn, &files, &[data]).unwrap();
    match reply(&conn) {
        handout_reply::Step::Ready(r) => (r.handout, conn),
        other => panic!("{other:?}"),
    }
}

async fn resolve(
    socket: &Path,
    model: &Path,
    handout: &str,
) -> Result<api::ResolveModelResponse, tonic::Status> {
    let mut c = CompiledTensorCacheClient::new(channel(socket).await);
    c.resolve_model(api::ResolveModelRequest {
        model_path: model.display().to_string(),
        handout: handout.into(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

#[test]
fn a_daemon_as_its_own_user_reads_a_private_model_only_through_handed_descriptors() {
    if !uid_switch_or_skip() {
        return;
    }
    let d = Daemon::start_with(&[], as_own_user);
    let top = tempfile::tempdir().unwrap();
    let model = private_model(top.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    // By path the daemon does not open it (D14), and says how to ask.
    let by_path = rt.block_on(resolve(&d.socket, &model, "")).unwrap_err();
    assert_eq!(by_path.code(), Code::InvalidArgument, "{by_path:?}");
    assert!(
        by_path
            .message()
            .contains("opens no path a caller names; hand the model over"),
        "{by_path:?}"
    );
    // The client library hands it over and the daemon reads those files.
    let answer = rt.block_on(async {
        let c = ctcache_client::Client::connect_to(&d.socket).await.unwrap();
        c.resolve_model(&model, &Default::default()).await.unwrap()
    });
    let t = &answer.tensors[0];
    assert_eq!(t.source_digest.to_vec(), digest_of(&model, &t.name));
    assert_eq!(answer.model_path, model.display().to_string());
}

#[test]
fn descriptors_that_are_no_readable_file_are_refused_at_once() {
    let d = Daemon::start();
    let top = tempfile::tempdir().unwrap();
    let model = private_model(top.path());
    let fifo = top.path().join("fifo");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    // Opened without blocking: no writer will ever come.
    let open = |p: &Path, flags: rustix::fs::OFlags| {
        rustix::fs::open(
            p,
            flags | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    };
    use rustix::fs::OFlags;
    let bad: Vec<(&str, OwnedFd)> = vec![
        ("a FIFO", open(&fifo, OFlags::RDONLY | OFlags::NONBLOCK)),
        ("/dev/zero", open(Path::new("/dev/zero"), OFlags::RDONLY)),
        ("an O_PATH handle", open(&model, OFlags::PATH)),
        ("a write-only file", open(&model, OFlags::WRONLY)),
        (
            "a folder",
            open(top.path(), OFlags::RDONLY | OFlags::DIRECTORY),
        ),
    ];
    for (what, fd) in &bad {
        // As the model itself.
        let conn = connect(&d.socket);
        send_model(&conn, &model, &[fd.as_fd()]);
        assert_eq!(
            refusal(reply(&conn)),
            "INVALID_ARGUMENT",
            "{what} as the model"
        );
        // As its data file.
        let conn = connect(&d.socket);
        let file = File::open(&model).unwrap();
        send_model(&conn, &model, &[file.as_fd()]);
        assert!(matches!(reply(&conn), handout_reply::Step::Needs(_)));
        let files = api::HandoutRequest {
            step: Some(handout_request::Step::Files(api::HandoutFiles {
                names: vec!["w.bin".into()],
                missing: vec![],
            })),
        };
        wire::send(&conn, &files, &[fd.as_fd()]).unwrap();
        assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT", "{what} as data");
    }
    // No descriptor, or two, for the model.
    for fds in [
        vec![],
        vec![File::open(&model).unwrap(), File::open(&model).unwrap()],
    ] {
        let conn = connect(&d.socket);
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        send_model(&conn, &model, &borrowed);
        assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT");
    }
    // The daemon serves on.
    let data = File::open(model.parent().unwrap().join("w.bin")).unwrap();
    let (name, _conn) = hand_over(&d.socket, &model, data.as_fd());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(resolve(&d.socket, &model, &name)).unwrap();
}

/// Messages out of protocol end the exchange with a clear refusal, and
/// the daemon serves on.
#[test]
fn messages_out_of_protocol_are_refused_at_once() {
    let d = Daemon::start();
    let top = tempfile::tempdir().unwrap();
    let model = private_model(top.path());
    let files = |names: &[&str], missing: &[&str]| api::HandoutRequest {
        step: Some(handout_request::Step::Files(api::HandoutFiles {
            names: names.iter().map(|n| n.to_string()).collect(),
            missing: missing.iter().map(|n| n.to_string()).collect(),
        })),
    };
    // Bytes that are no message.
    let conn = connect(&d.socket);
    rustix::net::send(&conn, &[0xff; 64], rustix::net::SendFlags::empty()).unwrap();
    assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT");
    // Files before the model, and a message without its step (an empty
    // packet reads as the close, so it carries a descriptor).
    let stray = File::open(&model).unwrap();
    for (first, fds) in [
        (files(&["w.bin"], &[]), vec![]),
        (api::HandoutRequest::default(), vec![stray.as_fd()]),
    ] {
        let conn = connect(&d.socket);
        wire::send(&conn, &first, &fds).unwrap();
        assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT", "{first:?}");
    }
    // Answers that are not what was asked: another name, the name twice,
    // a name without its descriptor, the model again.
    let data = File::open(model.parent().unwrap().join("w.bin")).unwrap();
    let answers: Vec<(api::HandoutRequest, Vec<BorrowedFd<'_>>)> = vec![
        (files(&["other.bin"], &[]), vec![data.as_fd()]),
        (files(&["w.bin"], &["w.bin"]), vec![data.as_fd()]),
        (files(&["w.bin"], &[]), vec![]),
        (
            api::HandoutRequest {
                step: Some(handout_request::Step::Model(api::HandoutModel::default())),
            },
            vec![data.as_fd()],
        ),
    ];
    for (answer, fds) in &answers {
        let conn = connect(&d.socket);
        let file = File::open(&model).unwrap();
        send_model(&conn, &model, &[file.as_fd()]);
        assert!(matches!(reply(&conn), handout_reply::Step::Needs(_)));
        wire::send(&conn, answer, fds).unwrap();
        assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT", "{answer:?}");
    }
    // A data file the client could not open: the handout is made, and a
    // request that needs that file says which one is missing.
    let conn = connect(&d.socket);
    let file = File::open(&model).unwrap();
    send_model(&conn, &model, &[file.as_fd()]);
    assert!(matches!(reply(&conn), handout_reply::Step::Needs(_)));
    wire::send(&conn, &files(&[], &["w.bin"]), &[]).unwrap();
    let handout_reply::Step::Ready(ready) = reply(&conn) else {
        panic!("a handout with a file missing is still made");
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt
        .block_on(async {
            let mut c = CompiledTensorCacheClient::new(channel(&d.socket).await);
            c.prepack(api::PrepackRequest {
                model_path: model.display().to_string(),
                handout: ready.handout.clone(),
                initializers: vec!["W".into()],
                formats: vec![api::FormatSpec {
                    id: "gemm.pack_b.f32".into(),
                    params: Default::default(),
                }],
                ..Default::default()
            })
            .await
        })
        .unwrap_err();
    assert!(e.message().contains("not handed over"), "{e:?}");
    let (name, _conn) = hand_over(&d.socket, &model, data.as_fd());
    rt.block_on(resolve(&d.socket, &model, &name)).unwrap();
}

/// A model's compiled tensors may keep their payloads in a sidecar: the
/// daemon asks for that file too (Import and Embed read it).
#[test]
fn the_sidecar_of_compiled_tensors_is_asked_for() {
    let d = Daemon::start();
    let model = d.path("work/m.onnx");
    write_model(&model, &matmul_model(512, 256, 3));
    let out = d.path("work/m.ct.onnx");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let embedded = rt.block_on(async {
        let c = ctcache_client::Client::connect_to(&d.socket).await.unwrap();
        c.embed(api::EmbedRequest {
            model_path: model.display().to_string(),
            output_path: out.display().to_string(),
            formats: vec![api::FormatSpec {
                id: "gemm.pack_b.f32".into(),
                params: Default::default(),
            }],
            sidecar: true,
            ..Default::default()
        })
        .await
        .unwrap()
    });
    let sidecar = Path::new(&embedded.sidecar_path);
    assert!(sidecar.is_file(), "{embedded:?}");
    let conn = connect(&d.socket);
    let file = File::open(&out).unwrap();
    send_model(&conn, &out, &[file.as_fd()]);
    match reply(&conn) {
        handout_reply::Step::Needs(n) => {
            let name = sidecar.file_name().unwrap().to_str().unwrap();
            assert_eq!(n.names, [name]);
        }
        other => panic!("{other:?}"),
    }
}

/// The other uid's half of `a_handout_is_its_uids_and_ends_with_its_connection`.
#[tokio::test]
async fn foreign_handout_helper() {
    let (Some(socket), Ok(name)) = (
        std::env::var_os("CT_TEST_SOCKET").map(PathBuf::from),
        std::env::var("CT_TEST_HANDOUT"),
    ) else {
        return;
    };
    let e = resolve(&socket, Path::new(""), &name).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    println!("FOREIGN-HANDOUT-REFUSED");
}

#[test]
fn a_handout_is_its_uids_and_ends_with_its_connection() {
    if !uid_switch_or_skip() {
        return;
    }
    let d = daemon_for_nobody("");
    let top = tempfile::tempdir().unwrap();
    let model = private_model(top.path());
    let data = File::open(model.parent().unwrap().join("w.bin")).unwrap();
    let (name, conn) = hand_over(&d.socket, &model, data.as_fd());
    run_as_nobody(
        &d,
        "foreign_handout_helper",
        &[
            ("CT_TEST_SOCKET", d.socket.display().to_string()),
            ("CT_TEST_HANDOUT", name.clone()),
        ],
        "FOREIGN-HANDOUT-REFUSED",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(resolve(&d.socket, &model, &name)).unwrap();
    // Another path than the one handed over is refused.
    let other = rt
        .block_on(resolve(&d.socket, Path::new("/elsewhere.onnx"), &name))
        .unwrap_err();
    assert_eq!(other.code(), Code::InvalidArgument, "{other:?}");
    drop(conn);
    let gone = rt.block_on(resolve(&d.socket, &model, &name)).unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}

#[test]
fn a_model_of_too_many_data_files_is_refused_and_the_daemon_serves_on() {
    let d = Daemon::start_with(&[], |c| {
        if can_switch_uid() {
            as_own_user(c)
        }
    });
    let top = tempfile::tempdir().unwrap();
    open_to_all(top.path());
    let mut m = ctcache_testkit::MatMul::new(2, 2, [0.0; 4]).proto();
    let g = m.graph.as_mut().unwrap();
    for i in 0..4200 {
        g.initializer.push(ctcache::pb::TensorProto {
            name: format!("t{i}"),
            data_type: 1,
            dims: vec![1],
            data_location: DataLocation::External as i32,
            external_data: vec![
                ctcache_testkit::kv("location", &format!("f{i}.bin")),
                ctcache_testkit::kv("length", "4"),
            ],
            ..Default::default()
        });
    }
    let path = top.path().join("many.onnx");
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    let conn = connect(&d.socket);
    let file = File::open(&path).unwrap();
    send_model(&conn, &path, &[file.as_fd()]);
    assert_eq!(refusal(reply(&conn)), "RESOURCE_EXHAUSTED");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = CompiledTensorCacheClient::new(channel(&d.socket).await);
        c.status(api::StatusRequest {}).await.unwrap();
    });
}

/// Output files the daemon would write into must be what the client made
/// for it: a folder open for reading, empty regular files open for writing
/// at their start; anything else is refused before the model is read.
#[test]
fn output_descriptors_that_are_not_new_files_are_refused() {
    use std::os::unix::fs::OpenOptionsExt;
    let d = Daemon::start();
    let top = tempfile::tempdir().unwrap();
    let model = private_model(top.path());
    let out = top.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let model_file = File::open(&model).unwrap();
    let folder = File::open(&out).unwrap();
    let new = |name: &str| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(out.join(name))
            .unwrap()
    };
    let (m, s) = (new("m"), new("s"));
    let read_only = File::open(out.join("m")).unwrap();
    let full = new("full");
    std::io::Write::write_all(&mut &full, b"x").unwrap();
    let appending = std::fs::OpenOptions::new()
        .append(true)
        .open(out.join("s"))
        .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        out.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let fifo = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(out.join("fifo"))
        .unwrap();
    let names = ["folder", "model", "sidecar"];
    let cases: Vec<(&str, [BorrowedFd<'_>; 3])> = vec![
        ("a file as the folder", [m.as_fd(), m.as_fd(), s.as_fd()]),
        (
            "a read-only model",
            [folder.as_fd(), read_only.as_fd(), s.as_fd()],
        ),
        (
            "a file that is not empty",
            [folder.as_fd(), full.as_fd(), s.as_fd()],
        ),
        (
            "an appending sidecar",
            [folder.as_fd(), m.as_fd(), appending.as_fd()],
        ),
        ("a FIFO", [folder.as_fd(), fifo.as_fd(), s.as_fd()]),
    ];
    for (what, outs) in &cases {
        let conn = connect(&d.socket);
        let fds: Vec<BorrowedFd<'_>> = std::iter::once(model_file.as_fd()).chain(*outs).collect();
        send_model_with(&conn, &model, &names, &fds);
        assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT", "{what}");
    }
    // Names that are not the three, and a descriptor short.
    for (outputs, n) in [
        (&["folder", "model"][..], 2),
        (&["folder", "model", "model"][..], 3),
    ] {
        let conn = connect(&d.socket);
        let all = [folder.as_fd(), m.as_fd(), s.as_fd()];
        let fds: Vec<BorrowedFd<'_>> = std::iter::once(model_file.as_fd())
            .chain(all[..n].iter().copied())
            .collect();
        send_model_with(&conn, &model, outputs, &fds);
        assert_eq!(refusal(reply(&conn)), "INVALID_ARGUMENT", "{outputs:?}");
    }
    let conn = connect(&d.socket);
    send_model_with(&conn, &model, &names, &[model_file.as_fd(), folder.as_fd()]);
    assert_eq!(
        refusal(reply(&conn)),
        "INVALID_ARGUMENT",
        "a descriptor short"
    );
    // The files made for it stay as they were.
    assert_eq!(std::fs::read(out.join("m")).unwrap(), b"");
}
