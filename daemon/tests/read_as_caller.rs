//! The daemon reads for a peer only what the peer may read (issue 27,
//! points 1, 2 and 4; D14), tested as the attacks that worked before: uid
//! 65534 names another process's memfd through /proc, a root-only model of
//! a folder the admin watches, and probes a root-only folder for what
//! exists in it. The daemon opens no path a peer names; the peer's client
//! hands over what the peer itself can open. The attacker and victim halves run by re-executing this test
//! binary under `setpriv`.

mod support;

use std::io::{BufRead, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use ctcache_api::v1 as api;
use support::*;
use tonic::Code;

/// The victim's uid: neither the daemon's nor the attacker's.
const VICTIM: u32 = 1234;

fn env_path(key: &str) -> Option<PathBuf> {
    std::env::var_os(key).map(PathBuf::from)
}

/// The victim half: holds a model in a memfd, says where, and waits for
/// its stdin to close.
#[test]
fn memfd_victim_helper() {
    if std::env::var_os("CT_TEST_VICTIM").is_none() {
        return;
    }
    let name = std::ffi::CString::new("victim-model").unwrap();
    // SAFETY: a valid name; the returned fd is owned below.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just created and is owned by nothing else.
    let mut file = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    file.write_all(&matmul_model(128, 64, 77)).unwrap();
    println!("VICTIM {} {fd}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
    drop(file);
}

/// What a request's failure says, with `path` written as `<p>`: answers
/// that differ only in the path named are one answer.
fn answer(e: &tonic::Status, path: &str) -> String {
    format!("{:?}: {}", e.code(), e.message().replace(path, "<p>"))
}

/// The daemon's answer to an Embed of `model` to `output` asked by path.
async fn embed_by_path(c: &mut Conn, model: &str, output: String) -> tonic::Status {
    c.embed(api::EmbedRequest {
        model_path: model.into(),
        output_path: output,
        ..Default::default()
    })
    .await
    .expect_err(model)
}

/// The daemon's answer to a ResolveModel of `model` asked by path.
async fn resolve_by_path(c: &mut Conn, model: &str) -> tonic::Status {
    c.resolve_model(api::ResolveModelRequest {
        model_path: model.into(),
        ..Default::default()
    })
    .await
    .expect_err(model)
}

/// What the client library says when it asks for `model`: it opens the
/// model and its data itself, and hands over what it could open.
async fn handed_refused(c: &ctcache_client::Client, model: &str) -> String {
    c.resolve_model(model, &Default::default())
        .await
        .expect_err(model)
        .to_string()
}

/// The attacker half of `a_peer_reads_only_what_it_may_read`.
#[tokio::test]
async fn reader_attack_helper() {
    let Some(socket) = env_path("CT_TEST_SOCKET") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let lines = |k: &str| var(k).lines().map(str::to_owned).collect::<Vec<_>>();
    let mut c = Conn::at(&socket).await;
    let lib = c.library().await;
    let out = PathBuf::from(var("CT_TEST_OUT"));

    // The control: a model anyone may read in the admin's public folder.
    lib.resolve_model(var("CT_TEST_PUBLIC"), &Default::default())
        .await
        .expect("a model the peer may read");

    // Named by path, the daemon opens nothing (D14): every path, whatever
    // is behind it, gets the one answer that says how to ask.
    let stolen = || out.join("stolen.onnx").display().to_string();
    let mut answers = std::collections::BTreeSet::new();
    for target in lines("CT_TEST_PROC")
        .into_iter()
        .chain(lines("CT_TEST_HIDDEN"))
    {
        let e = embed_by_path(&mut c, &target, stolen()).await;
        answers.insert(answer(&e, &stolen()));
        let e = resolve_by_path(&mut c, &target).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{target}: {e:?}");
        answers.insert(answer(&e, &target));
    }
    for dir in lines("CT_TEST_OUTPUT_DIRS") {
        let e = embed_by_path(&mut c, &var("CT_TEST_PUBLIC"), format!("{dir}/x.onnx")).await;
        answers.insert(answer(&e, &format!("{dir}/x.onnx")));
    }
    assert_eq!(
        answers.len(),
        2,
        "one answer each for reading and writing: {answers:#?}"
    );

    // Other processes' files and memory through /proc, and the root-only
    // models: the peer's own open is refused, nothing is handed over, and
    // nothing about their content (such as its length) is told.
    for target in lines("CT_TEST_PROC")
        .into_iter()
        .chain(lines("CT_TEST_HIDDEN"))
    {
        let said = handed_refused(&lib, &target).await;
        assert!(!said.contains("byte"), "{target}: {said}");
        println!("refused {target}: {said}");
    }

    // External data linked into a root-only folder: to a file there or to
    // nothing, the peer cannot open it, and the daemon says the same of
    // both: neither "outside the folder" nor "missing".
    let mut answers = std::collections::BTreeSet::new();
    for (model, link) in [("to_file", "to_file.bin"), ("to_nothing", "to_nothing.bin")] {
        let path = out.join(format!("{model}.onnx")).display().to_string();
        let said = handed_refused(&lib, &path)
            .await
            .replace(&path, "<p>")
            .replace(link, "<link>");
        assert!(
            !said.contains("outside") && !said.contains("No such file"),
            "{said}"
        );
        answers.insert(said);
    }
    assert_eq!(answers.len(), 1, "one answer: {answers:#?}");
    println!("READER-ATTACKS-REFUSED");
}

/// uid 65534's model in `dir` whose W is external data at `location`.
fn external_model(dir: &Path, name: &str, location: &str) {
    use ctcache::pb::tensor_proto::DataLocation;
    let mut m = ctcache_testkit::MatMul::new(8, 8, [0.5f32; 64]).proto();
    let w = &mut m.graph.as_mut().unwrap().initializer[0];
    w.float_data.clear();
    w.raw_data = Default::default();
    w.data_location = DataLocation::External as i32;
    w.external_data = vec![
        ctcache_testkit::kv("location", location),
        ctcache_testkit::kv("offset", "0"),
        ctcache_testkit::kv("length", "256"),
    ];
    let path = dir.join(format!("{name}.onnx"));
    std::fs::write(&path, prost::Message::encode_to_vec(&m)).unwrap();
    std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
}

#[test]
fn a_peer_reads_only_what_it_may_read() {
    if !uid_switch_or_skip() {
        return;
    }
    // The admin's folders: one root-only (0700) with a root-only model, a
    // folder and a file in it; one anyone may read.
    let secret = tempfile::tempdir().unwrap();
    std::fs::set_permissions(secret.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let model = secret.path().join("secret.onnx");
    write_model(&model, &matmul_model(128, 64, 3));
    std::fs::set_permissions(&model, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir(secret.path().join("sub")).unwrap();
    let public = tempfile::tempdir().unwrap();
    open_to_all(public.path());
    let open_model = public.path().join("open.onnx");
    write_model(&open_model, &matmul_model(128, 64, 4));
    std::fs::set_permissions(&open_model, std::fs::Permissions::from_mode(0o644)).unwrap();

    let config = format!(
        "watch = [{:?}, {:?}]\n",
        secret.path().display().to_string(),
        public.path().display().to_string()
    );
    let mut d = daemon_for_nobody(&config);

    // The attacker's own folder, with models whose external data links
    // into the root-only folder.
    let top = tempfile::tempdir().unwrap();
    open_to_all(top.path());
    let out = top.path().join("nobody");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::chown(&out, Some(NOBODY), Some(NOBODY)).unwrap();
    external_model(&out, "to_file", "to_file.bin");
    external_model(&out, "to_nothing", "to_nothing.bin");
    std::os::unix::fs::symlink(&model, out.join("to_file.bin")).unwrap();
    std::os::unix::fs::symlink(secret.path().join("none.bin"), out.join("to_nothing.bin")).unwrap();

    // The victim: another uid's process with its model in a memfd.
    let mut victim = helper_as(VICTIM, "memfd_victim_helper")
        .env("CT_TEST_VICTIM", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut stdout = std::io::BufReader::new(victim.stdout.take().unwrap());
    // libtest may start the line ("test memfd_victim_helper ... ").
    while !said.contains("VICTIM ") {
        said.clear();
        assert!(
            stdout.read_line(&mut said).unwrap() > 0,
            "the victim said nothing"
        );
    }
    let mut words = said.split("VICTIM ").nth(1).unwrap().split_whitespace();
    let (pid, fd) = (words.next().unwrap(), words.next().unwrap());
    let proc_targets = [
        format!("/proc/{pid}/fd/{fd}"),
        format!("/proc/{pid}/environ"),
        format!("/proc/{pid}/root{}", open_model.display()),
    ];

    let s = secret.path().display();
    let hidden = [
        model.display().to_string(),
        format!("{s}/missing.onnx"),
        format!("{s}/sub"),
        format!("{s}/secret.onnx/x.onnx"),
        format!(
            "{s}/sub/../../{}",
            open_model.strip_prefix("/").unwrap().display()
        ),
        format!(
            "{s}/nodir/../../{}",
            open_model.strip_prefix("/").unwrap().display()
        ),
    ];
    let output_dirs = [
        format!("{s}/sub"),
        format!("{s}/nodir"),
        format!("{s}/secret.onnx"),
    ];
    run_as_nobody(
        &d,
        "reader_attack_helper",
        &[
            ("CT_TEST_SOCKET", d.socket.display().to_string()),
            ("CT_TEST_OUT", out.display().to_string()),
            ("CT_TEST_PUBLIC", open_model.display().to_string()),
            ("CT_TEST_PROC", proc_targets.join("\n")),
            ("CT_TEST_HIDDEN", hidden.join("\n")),
            ("CT_TEST_OUTPUT_DIRS", output_dirs.join("\n")),
        ],
        "READER-ATTACKS-REFUSED",
    );
    drop(victim.stdin.take());
    let _ = std::io::Read::read_to_end(&mut stdout, &mut Vec::new());
    let _ = victim.wait();
    assert!(!out.join("stolen.onnx").exists(), "an output was written");
    assert!(!secret.path().join("nodir").exists());
    assert_eq!(d.stop(), Some(0));
}

/// The follower half of `enumeration_shows_a_peer_only_what_it_may_read`.
#[tokio::test]
async fn enumeration_helper() {
    let Some(socket) = env_path("CT_TEST_ENUM_SOCKET") else {
        return;
    };
    let var = |k: &str| std::env::var(k).unwrap();
    let (secret, digest) = (var("CT_TEST_SECRET"), var("CT_TEST_SECRET_DIGEST"));
    let mut c = Conn::at(&socket).await;
    let hidden = |what: &str, text: &str| {
        assert!(
            !text.contains(&secret) && !text.contains(&digest),
            "{what} shows the root-only model: {text}"
        );
    };

    let listed = c
        .list(api::ListRequest::default())
        .await
        .unwrap()
        .into_inner();
    hidden("List", &format!("{listed:?}"));
    let public = var("CT_TEST_PUBLIC");
    assert!(
        listed
            .entries
            .iter()
            .any(|e| e.model_paths.contains(&public)),
        "List shows the model the peer may read: {listed:?}"
    );
    let dry = c
        .gc(api::GcRequest {
            max_bytes: 1,
            has_max_bytes: true,
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    hidden("gc --dry-run", &format!("{dry:?}"));
    assert!(!dry.removed.is_empty(), "the dry run lists the peer's own");
    let status = c.status(api::StatusRequest {}).await.unwrap().into_inner();
    let watches = c
        .list_watches(api::ListWatchesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.watches, watches.dirs, "Status and ListWatches agree");

    // Root packs the root-only model, then the public one, while the peer
    // follows: the first one's job events never reach it.
    let mut events = c.events(api::EventsRequest {}).await.unwrap().into_inner();
    std::fs::write(var("CT_TEST_FLAG"), b"").unwrap();
    loop {
        let e = next_event(&mut events, 120, "the public model's job").await;
        hidden("an event", &format!("{e:?}"));
        if e.kind == "job_progress" && e.model_path == public {
            break;
        }
    }
    println!("ENUMERATION-HIDDEN");
}

#[test]
fn enumeration_shows_a_peer_only_what_it_may_read() {
    if !uid_switch_or_skip() {
        return;
    }
    let secret_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(secret_dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = secret_dir.path().join("secret.onnx");
    write_model(&secret, &matmul_model(512, 256, 31));
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let public_dir = tempfile::tempdir().unwrap();
    open_to_all(public_dir.path());
    let public = public_dir.path().join("open.onnx");
    write_model(&public, &matmul_model(512, 256, 32));
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut d = daemon_for_nobody("");
    let digest = digest_of(&secret, "W");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = d.client().await;
        for m in [&secret, &public] {
            let done = prepack_all(&mut c, m).await;
            assert!(done.iter().all(|p| p.error.is_empty()), "{done:?}");
        }
    });
    let flags = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(flags.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let flag = flags.path().join("following");
    let (socket, flag2, secret2, public2) = (
        d.socket.clone(),
        flag.clone(),
        secret.clone(),
        public.clone(),
    );
    let root = std::thread::spawn(move || {
        wait_for_flag(&flag2, "the helper's flag");
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let mut c = Conn::at(&socket).await;
            for m in [&secret2, &public2] {
                prepack_all(&mut c, m).await;
            }
        });
    });
    run_as_nobody(
        &d,
        "enumeration_helper",
        &[
            ("CT_TEST_ENUM_SOCKET", d.socket.display().to_string()),
            ("CT_TEST_SECRET", secret.display().to_string()),
            ("CT_TEST_SECRET_DIGEST", hex::encode(&digest)),
            ("CT_TEST_PUBLIC", public.display().to_string()),
            ("CT_TEST_FLAG", flag.display().to_string()),
        ],
        "ENUMERATION-HIDDEN",
    );
    root.join().unwrap();
    assert_eq!(d.stop(), Some(0));
}
