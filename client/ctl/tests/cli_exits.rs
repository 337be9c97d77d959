//! How ctcachectl ends when things around it go away: a daemon killed
//! during a call (exit 3, the same words for every RPC), a named socket
//! that does not answer (exit 3, no local fallback), no socket named and no
//! daemon (embed and materialize work here, with one note), a reader
//! that closes stdout early (a quiet exit), refusals a script may act on
//! (a bound reached: exit 4), and one runtime's compile options given for
//! the other (exit 2, before any call).

mod harness;

use std::process::Stdio;

use harness::{ctl_command, ctl_env, ctl_raw, write_model, Daemon, Out};

#[test]
fn a_daemon_killed_during_any_call_is_exit_3_and_says_it_stopped_answering() {
    let mut d = Daemon::start();
    let model = write_model(&d.path("work/m.onnx"), 3);
    let out = d.path("work/m.q.onnx").display().to_string();
    let calls: &[(&[&str], &str)] = &[
        (&["verify"], "Verify"),
        (&["resolve", &model, "--on-miss", "wait"], "ResolveModel"),
        (&["materialize", &model, "-o", &out], "Materialize"),
        (&["embed", &model, "-o", &out], "Embed"),
        (&["prepack", &model, "--wait"], "Prepack"),
        (&["events"], "Events"),
        (&["gc", "--dry-run"], "Gc"),
        (&["ls", "--json"], "List"),
        (&["status"], "Status"),
    ];
    for (args, rpc) in calls {
        let o = d.kill_during(args);
        assert_eq!(o.code, 3, "{args:?}: {o:#?}");
        assert!(
            o.stderr
                .contains(&format!("stopped answering during {rpc}")),
            "{args:?}: {o:#?}"
        );
        assert!(!o.stderr.contains("transport error;"), "{o:#?}");
        assert_eq!(o.stderr.lines().count(), 1, "one line: {o:#?}");
    }
    d.stop();
}

/// An environment in which no socket is named and none exists at the
/// default place.
fn no_daemon_env(t: &std::path::Path) -> Vec<(&'static str, String)> {
    vec![
        ("XDG_RUNTIME_DIR", t.join("run").display().to_string()),
        ("HOME", t.display().to_string()),
        ("XDG_CACHE_HOME", t.join("cache").display().to_string()),
    ]
}

#[test]
fn a_named_socket_must_answer_and_only_the_default_one_falls_back() {
    let t = tempfile::tempdir().unwrap();
    let model = write_model(&t.path().join("m.onnx"), 1);
    let none = t.path().join("none.sock").display().to_string();
    let env = no_daemon_env(t.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = |name: &str| t.path().join(name).display().to_string();
    let embed = |o: &str| -> Vec<String> {
        ["embed", &model, "-o", o, "--format", "gemm.pack_b.f32"]
            .map(String::from)
            .to_vec()
    };
    let materialize =
        |o: &str| -> Vec<String> { ["materialize", &model, "-o", o].map(String::from).to_vec() };
    for (cmd, written) in [
        (embed(&out("e.onnx")), out("e.onnx")),
        (materialize(&out("q/m.onnx")), out("q/m.onnx")),
    ] {
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        let written = std::path::Path::new(&written);
        // --socket names it: exit 3, nothing written.
        let mut args = vec!["--socket", none.as_str()];
        args.extend(&cmd);
        let o = ctl_env(&args, &env);
        assert_eq!(o.code, 3, "{o:#?}");
        assert!(o.stderr.contains("ctcached is not running"), "{o:#?}");
        // CTCACHE_SOCKET names it: the same.
        let mut named = env.clone();
        named.push(("CTCACHE_SOCKET", &none));
        let o = ctl_env(&cmd, &named);
        assert_eq!(o.code, 3, "{o:#?}");
        assert!(o.stderr.contains(&none), "{o:#?}");
        assert!(!written.exists(), "{written:?}");
        // Nothing named and nothing at the default socket: done here, one
        // quiet note on stderr.
        let o = ctl_env(&cmd, &env).ok();
        let note: Vec<&str> = o.stderr.lines().collect();
        assert_eq!(note.len(), 1, "{o:#?}");
        assert!(
            note[0].starts_with("ctcachectl: note: no ctcached at ")
                && note[0].contains("here, without the cache"),
            "{o:#?}"
        );
        assert!(!o.stderr.to_lowercase().contains("error"), "{o:#?}");
        let mut quiet = vec!["--quiet"];
        quiet.extend(&cmd);
        assert!(written.is_file(), "{written:?}");
        assert_eq!(ctl_env(&quiet, &env).ok().stderr, "");
    }
    // Offline embed still says what it needs.
    let o = ctl_env(&["embed", &model, "-o", &out("x.onnx")], &env);
    assert_eq!(o.code, 2, "{o:#?}");
    assert!(o.stderr.contains("--format"), "{o:#?}");
}

#[test]
fn the_other_runtimes_compile_options_are_usage_errors_before_any_call() {
    let t = tempfile::tempdir().unwrap();
    let model = write_model(&t.path().join("m.onnx"), 1);
    // A socket nobody answers: the refusal comes before any connection.
    let none = t.path().join("none.sock").display().to_string();
    let cases: &[(&[&str], &str)] = &[
        (
            &["compile", &model, "--runtime", "openvino", "--level", "all"],
            "--level is onnxruntime's",
        ),
        (
            &["compile", &model, "--config", "NUM_STREAMS=1"],
            "--config is OpenVINO's",
        ),
        (
            &["why-miss", &model, "--form", "openvino", "--level", "all"],
            "--level is onnxruntime's",
        ),
        (
            &[
                "why-miss",
                &model,
                "--form",
                "onnxruntime",
                "--config",
                "A=1",
            ],
            "--config is OpenVINO's",
        ),
    ];
    for (args, says) in cases {
        let mut all = vec!["--socket", none.as_str()];
        all.extend(*args);
        let o = ctl_raw(&all);
        assert_eq!(o.code, 2, "{args:?}: {o:#?}");
        assert!(o.stderr.contains(says), "{args:?}: {o:#?}");
        assert!(!o.stderr.contains("not running"), "{args:?}: {o:#?}");
    }
}

/// Runs ctcachectl with its stdout a pipe whose reader is already gone.
fn into_closed_pipe(args: &[&str]) -> Out {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = ctl_command(args, &[])
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    Out::of(o)
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 4);
    d.json(&["prepack", &model, "--wait"]);
    let sock = d.socket_arg();
    let cases: &[&[&str]] = &[
        &["--socket", &sock, "ls", "--json"],
        &["--socket", &sock, "ls"],
        &["--socket", &sock, "status"],
        &["--socket", &sock, "--json", "resolve", &model],
        &["formats"],
        &["--json", "digest", &model],
        &["completions", "bash"],
        &["man"],
    ];
    for args in cases {
        let o = into_closed_pipe(args);
        assert!(o.code == 0 || o.code == 141, "{args:?}: {o:#?}");
        assert_eq!(o.stderr, "", "{args:?}: {o:#?}");
    }
    // The same commands into an open pipe print (the pipe is what differs).
    assert!(!ctl_raw(&["--socket", &sock, "ls", "--json"])
        .ok()
        .stdout
        .is_empty());
    d.stop();
}

#[test]
fn a_bound_reached_is_exit_4() {
    // Payloads of at most 1 KiB: the model's weights are over it.
    let d = Daemon::in_process_with(|c| c.max_payload_bytes = 1024);
    let model = write_model(&d.path("work/m.onnx"), 31);
    for args in [
        &["prepack", model.as_str(), "--wait"][..],
        &["--json", "prepack", model.as_str(), "--wait"],
        &["resolve", model.as_str(), "--on-miss", "wait"],
    ] {
        let o = d.ctl(args);
        assert_eq!(o.code, 4, "{args:?}: {o:#?}");
        assert!(o.stderr.contains("max_payload_bytes"), "{o:#?}");
    }
}
