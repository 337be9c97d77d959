//! What a user trusts on day two (issue 29): no command writes over a file
//! it reads, `--json` is JSON, missing output folders are made, and the
//! messages of normal states and mistakes say what happened.

mod harness;

use std::path::Path;

use harness::{ctl_command, ctl_raw, eventually, wait_call_open, write_model, Daemon, Out};

fn sha(path: &Path) -> blake3::Hash {
    blake3::hash(&std::fs::read(path).unwrap())
}

fn refused_as_input(o: &Out, what: &str) {
    assert_eq!(o.code, 1, "{what}: {o:#?}");
    assert!(
        o.stderr.contains("the output path is the input model"),
        "{what}: {o:#?}"
    );
}

/// `pack`, `strip`, `embed --local` and `materialize --local` refuse an
/// output that is the model, however it is spelled (the same path, `./`,
/// a symbolic link, a hard link): the same file by device and inode.
/// `embed` and `strip` rewrite in place with `--force`.
#[test]
fn no_offline_command_writes_over_the_model_it_reads() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let model = write_model(&dir.join("m.onnx"), 3);
    let before = sha(Path::new(&model));
    std::os::unix::fs::symlink("m.onnx", dir.join("link.onnx")).unwrap();
    std::fs::hard_link(&model, dir.join("hard.onnx")).unwrap();
    let spellings = [
        model.clone(),
        dir.join("./m.onnx").display().to_string(),
        dir.join("link.onnx").display().to_string(),
        dir.join("hard.onnx").display().to_string(),
    ];
    let fmt = ["--format", "gemm.pack_b.f32"];
    for out in &spellings {
        let runs: Vec<(&str, Vec<&str>)> = vec![
            (
                "pack",
                [&["pack", &model, "--initializer", "W", "-o", out][..], &fmt].concat(),
            ),
            ("strip", vec!["strip", &model, "-o", out]),
            (
                "embed",
                [&["embed", &model, "--local", "-o", out][..], &fmt].concat(),
            ),
            (
                "materialize",
                vec!["materialize", &model, "--local", "-o", out],
            ),
        ];
        for (what, args) in runs {
            let o = ctl_raw(&args);
            refused_as_input(&o, &format!("{what} -o {out}"));
            if what != "pack" && what != "materialize" {
                assert!(o.stderr.contains("--force"), "{what}: {o:#?}");
            }
            assert_eq!(sha(Path::new(&model)), before, "{what} -o {out}");
        }
    }
    // --type-out is an output too.
    let payload = dir.join("w.bin").display().to_string();
    let o = ctl_raw(
        &[
            &[
                "pack",
                &model,
                "--initializer",
                "W",
                "-o",
                &payload,
                "--type-out",
            ][..],
            &[model.as_str()],
            &fmt,
        ]
        .concat(),
    );
    refused_as_input(&o, "pack --type-out");
    assert!(!Path::new(&payload).exists());
    // In place when asked.
    let o = ctl_raw(
        &[
            &[
                "--json", "embed", &model, "--local", "-o", &model, "--force",
            ][..],
            &fmt,
        ]
        .concat(),
    )
    .ok();
    assert_eq!(o.json()["entries"], 1, "{o:#?}");
    let o = ctl_raw(&["--json", "strip", &model, "-o", &model, "--force"]).ok();
    assert_eq!(o.json()["removed"], 1, "{o:#?}");
    assert_eq!(sha(Path::new(&model)), before, "strip undid embed");
}

/// Through the daemon: Embed refuses the model as its output unless
/// `--force` (the request's `force`); Materialize refuses it always.
#[test]
fn the_daemon_does_not_write_over_the_model_it_reads() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 4);
    let before = sha(Path::new(&model));
    let link = d.path("work/link.onnx");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    let link = link.display().to_string();
    for out in [&model, &link] {
        let o = d.ctl(&["embed", &model, "-o", out]);
        refused_as_input(&o, &format!("embed -o {out}"));
        assert!(o.stderr.contains("--force"), "{o:#?}");
        let o = d.ctl(&["materialize", &model, "-o", out]);
        refused_as_input(&o, &format!("materialize -o {out}"));
        assert_eq!(sha(Path::new(&model)), before);
    }
    let r = d.json(&["embed", &model, "-o", &model, "--force"]);
    assert_eq!(r["via"], "daemon", "{r}");
    assert!(r["entries"].as_u64().unwrap() > 0, "{r}");
    assert_ne!(sha(Path::new(&model)), before);
    d.stop();
}

/// `--json` is JSON on stdout for every command, or refused (exit 2) by
/// the two whose output has no JSON form.
#[test]
fn json_is_json_or_refused() {
    let t = tempfile::tempdir().unwrap();
    let model = write_model(&t.path().join("m.onnx"), 5);
    let out = t.path().join("s.onnx").display().to_string();
    let o = ctl_raw(&["--json", "strip", &model, "-o", &out]).ok();
    assert_eq!(
        o.json(),
        serde_json::json!({"output": out, "removed": 0}),
        "{o:#?}"
    );
    for args in [&["completions", "bash"][..], &["man"][..]] {
        let o = ctl_raw(&[&["--json"][..], args].concat());
        assert_eq!(o.code, 2, "{args:?}: {o:#?}");
        assert!(o.stdout.is_empty() && o.stderr.contains("--json"), "{o:#?}");
    }
}

/// Messages of mistakes say what is wrong, once (issue 29, point 7).
#[test]
fn messages_say_what_is_wrong() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 6);
    // A folder that does not exist is said so; a relative one is answered
    // with the absolute path stored.
    let missing = d.path("work/nonexistent").display().to_string();
    let o = d.ctl(&["watch", "add", &missing]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(
        o.stderr.contains(&format!("{missing} does not exist")),
        "{o:#?}"
    );
    std::fs::create_dir_all(d.path("work/models")).unwrap();
    let o = harness::ctl_command(
        &["--socket", &d.socket_arg(), "watch", "add", "models"],
        &[],
    )
    .current_dir(d.path("work"))
    .output()
    .unwrap();
    let o = Out::of(o).ok();
    let real = std::fs::canonicalize(d.path("work/models")).unwrap();
    assert_eq!(
        o.stdout.trim(),
        format!("watching {}", real.display()),
        "{o:#?}"
    );
    // A packer without parameters says so, once.
    for args in [
        &["prepack", &model, "--format", "ggml.q8_0", "--param", "x=1"][..],
        &[
            "pack",
            &model,
            "--initializer",
            "W",
            "--format",
            "ggml.q8_0",
            "--param",
            "x=1",
            "-o",
            "/dev/null",
        ][..],
    ] {
        let o = d.ctl(args);
        assert_ne!(o.code, 0, "{o:#?}");
        assert!(
            o.stderr
                .contains("ggml.q8_0: unknown parameter \"x\" (it takes no parameters)")
                && !o.stderr.contains("ggml.q8_0: ggml.q8_0"),
            "{args:?}: {o:#?}"
        );
    }
    // resolve --help names only its own options.
    let help = ctl_raw(&["resolve", "--help"]).ok().stdout;
    assert!(!help.contains("--initializer"), "{help}");
    // Completion offers no hidden command.
    let bash = ctl_raw(&["completions", "bash"]).ok().stdout;
    let top = bash
        .lines()
        .find(|l| l.contains("opts=") && l.contains(" check "))
        .unwrap_or_else(|| panic!("{bash}"));
    assert!(
        !top.contains(" man ") && !top.contains(" completions "),
        "{top}"
    );
    // devices without a daemon points to --local.
    let none = d.path("work/none.sock").display().to_string();
    let o = ctl_raw(&["--socket", &none, "devices"]);
    assert_eq!(o.code, 3, "{o:#?}");
    assert!(o.stderr.contains("devices --local"), "{o:#?}");
    // Every device row tells its device apart: one adapter reached through
    // two APIs (lavapipe through Vulkan and GL) shows each with its API.
    let table = ctl_raw(&["devices", "--local"]).ok().stdout;
    let rows: Vec<&str> = table.lines().skip(1).collect();
    let distinct: std::collections::HashSet<&str> = rows.iter().copied().collect();
    assert_eq!(distinct.len(), rows.len(), "{table}");
    assert!(
        rows.iter()
            .filter(|r| r.starts_with("wgpu"))
            .all(|r| r.contains(": ")),
        "{table}"
    );
    d.stop();
}

/// Lines that look wrong on success (issue 29, point 6): no "0 bytes in no
/// sidecar", no error prefix on a note, no "started" for jobs that ran,
/// materialize's skipped nodes after its result.
#[test]
fn success_reads_as_success() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 7);
    let out = d.path("work/e.onnx").display().to_string();
    let o = d
        .ctl(&[
            "embed",
            &model,
            "--local",
            "--format",
            "gemm.pack_b.f32",
            "-o",
            &out,
        ])
        .ok();
    assert!(
        o.stdout.contains("1 compiled tensor(s) embedded") && !o.stdout.contains("no sidecar"),
        "{o:#?}"
    );
    let o = d.ctl(&["prepack", &model, "--initializer", "W"]).ok();
    assert!(
        o.stderr
            .starts_with("ctcachectl: note: with --initializer prepack waits")
            && !o.stderr.contains("--backend"),
        "{o:#?}"
    );
    let other = write_model(&d.path("work/o.onnx"), 8);
    let o = d.ctl(&["resolve", &other, "--on-miss", "wait"]).ok();
    let last = o.stdout.lines().last().unwrap();
    assert!(
        last.contains("packed before this answer") && !o.stdout.contains("started"),
        "{o:#?}"
    );
    let q = d.path("work/q.onnx").display().to_string();
    let o = d.ctl(&["materialize", &model, "-o", &q]).ok();
    assert!(
        o.stdout
            .starts_with(&format!("{q}: 1 node(s) -> MatMulNBits")),
        "{o:#?}"
    );
    d.stop();
}

/// `import` exits 1 when it left compiled tensors out (the table, or the
/// JSON, says which and why).
#[test]
fn import_that_skips_entries_exits_1() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 9);
    let out = d.path("work/e.onnx");
    let outs = out.display().to_string();
    d.ctl(&[
        "embed",
        &model,
        "--local",
        "--format",
        "gemm.pack_b.f32",
        "-o",
        &outs,
    ])
    .ok();
    // One payload byte changed: its checksum no longer matches.
    let mut bytes = std::fs::read(&out).unwrap();
    let at = bytes.len() - 200 * 1024;
    bytes[at] ^= 0x40;
    std::fs::write(&out, &bytes).unwrap();
    let o = d.ctl(&["--json", "import", &outs]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert_eq!(o.json()["skipped"].as_array().unwrap().len(), 1, "{o:#?}");
    assert!(
        o.stderr.contains("1 compiled tensor(s) not imported"),
        "{o:#?}"
    );
    d.stop();
}

/// Missing output folders are made, by every command, through and without
/// the daemon; a refusal leaves none behind.
#[test]
fn missing_output_folders_are_made_by_every_command() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 10);
    let fmt = ["--format", "gemm.pack_b.f32"];
    let out = |name: &str| d.path(&format!("work/new/{name}/deeper/x.onnx"));
    let runs: Vec<(&str, Vec<String>)> = vec![
        (
            "pack",
            vec![
                "pack".into(),
                model.clone(),
                "--initializer".into(),
                "W".into(),
            ],
        ),
        ("strip", vec!["strip".into(), model.clone()]),
        (
            "embed-local",
            vec!["embed".into(), model.clone(), "--local".into()],
        ),
        ("embed", vec!["embed".into(), model.clone()]),
        (
            "materialize-local",
            vec!["materialize".into(), model.clone(), "--local".into()],
        ),
        ("materialize", vec!["materialize".into(), model.clone()]),
    ];
    for (name, mut args) in runs {
        if name == "pack" || name == "embed-local" {
            args.extend(fmt.iter().map(|s| s.to_string()));
        }
        let o = out(name);
        args.extend(["-o".to_string(), o.display().to_string()]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        d.ctl(&a).ok();
        assert!(o.is_file(), "{name}: {o:?}");
    }
    // A command refused before it writes leaves no folder behind.
    let bad = d.path("work/gone/x.onnx").display().to_string();
    let o = d.ctl(&[
        "pack",
        &model,
        "--initializer",
        "W",
        "--format",
        "nope",
        "-o",
        &bad,
    ]);
    assert_eq!(o.code, 1, "{o:#?}");
    let o = d.ctl(&[
        "materialize",
        d.path("work/none.onnx").to_str().unwrap(),
        "--local",
        "-o",
        &bad,
    ]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(!d.path("work/gone").exists());
    d.stop();
}

/// A model whose one weight takes a debug build a while to pack.
fn slow_model(path: &Path) -> String {
    let w = ctcache_testkit::xorshift(7).map(|x| (x % 2000) as f32 / 1000.0 - 1.0);
    let m = ctcache_testkit::MatMul::new(8192, 2048, w)
        .with_io()
        .encode();
    ctcache_testkit::write_model(path, &m);
    path.display().to_string()
}

fn interrupt(child: &std::process::Child) {
    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

fn spawn_ctl(args: &[&str]) -> std::process::Child {
    ctl_command(args, &[])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running ctcachectl")
}

/// Ctrl-C of a materialize: exit 130 with a line saying so, and nothing of
/// the output left (the folders it made, the payloads it packed), run
/// here or by the daemon (which learns of it from the dropped call).
#[test]
fn an_interrupted_materialize_exits_130_and_leaves_nothing() {
    let t = tempfile::tempdir().unwrap();
    let model = slow_model(&t.path().join("m.onnx"));
    let out = t.path().join("new/deeper/m4.onnx");
    let child = spawn_ctl(&[
        "materialize",
        &model,
        "--local",
        "-o",
        out.to_str().unwrap(),
    ]);
    // Packing starts once the data folder is made.
    eventually("the data folder", || {
        out.with_extension("onnx.weights").exists()
    });
    interrupt(&child);
    let o = Out::of(child.wait_with_output().unwrap());
    assert_eq!(o.code, 130, "{o:#?}");
    assert!(o.stderr.contains("ctcachectl: interrupted"), "{o:#?}");
    assert!(!t.path().join("new").exists(), "{o:#?}");

    let d = Daemon::start();
    let model = slow_model(&d.path("work/m.onnx"));
    let out = d.path("work/new/deeper/m4.onnx");
    // Held (SIGSTOP) so that the call is surely open and unanswered.
    d.signal(libc::SIGSTOP);
    let socket = d.socket_arg();
    let child = spawn_ctl(&[
        "--socket",
        &socket,
        "materialize",
        &model,
        "-o",
        out.to_str().unwrap(),
    ]);
    wait_call_open(&child);
    interrupt(&child);
    let o = Out::of(child.wait_with_output().unwrap());
    d.signal(libc::SIGCONT);
    assert_eq!(o.code, 130, "{o:#?}");
    assert!(
        o.stderr.contains("interrupted; nothing was written"),
        "{o:#?}"
    );
    // The client writes the model (the daemon writes no file for it), and
    // it was stopped before its answer came: no folder was made.
    assert!(!d.path("work/new").exists(), "{o:#?}");
    d.stop();
}
