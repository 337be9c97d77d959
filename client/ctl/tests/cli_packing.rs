//! What gets packed, and what ctcachectl says about it: a model with
//! nothing to pack is refused in the same words by `prepack` and `embed`
//! (exit 1); an explicit `--format` keeps the policy's size and use filters
//! unless `--initializer` names a tensor (through the daemon and locally);
//! `why-miss` hints are commands that work when run as printed.

mod harness;

use std::path::Path;
use std::process::Command;

use ctcache_testkit::{xorshift, MatMul};
use harness::{ctl_bin, write_model, Daemon, Out};

/// Y = X @ W with a 64 x 64 W: below the policy's 65,536 elements.
fn small_model(path: &Path) -> String {
    let w = xorshift(77).map(|x| (x % 2000) as f32 / 1000.0 - 1.0);
    let bytes = MatMul::new(64, 64, w).with_io().encode();
    ctcache_testkit::write_model(path, &bytes);
    path.display().to_string()
}

#[test]
fn nothing_to_pack_is_said_the_same_way_by_prepack_and_embed() {
    let d = Daemon::in_process();
    let model = small_model(&d.path("work/small.onnx"));
    let out = d.path("work/out.onnx").display().to_string();
    let runs: Vec<Out> = [
        vec!["prepack", model.as_str()],
        vec!["prepack", model.as_str(), "--wait"],
        vec!["embed", model.as_str(), "-o", out.as_str()],
    ]
    .iter()
    .map(|args| d.ctl(args))
    .collect();
    let expected = format!("ctcachectl: {model}: nothing to pack: no initializer passes the filters (at least 65536 elements, used as MatMul.B or Gemm.B; or at least 262144 elements, used as Gather.data)");
    for o in &runs {
        assert_eq!(o.code, 1, "{o:#?}");
        assert!(o.stderr.starts_with(&expected), "{o:#?}");
        assert_eq!(o.stderr, runs[0].stderr, "the same words");
    }
    assert!(!Path::new(&out).exists());
    // Packing locally: the same start, the same exit.
    let o = d.ctl(&[
        "embed",
        &model,
        "-o",
        &out,
        "--local",
        "--format",
        "gemm.pack_b.f32",
    ]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(
        o.stderr
            .starts_with(&format!("ctcachectl: {model}: nothing to pack: ")),
        "{o:#?}"
    );
    assert!(!Path::new(&out).exists());
    // A model whose weights are all stored is not "nothing to pack".
    let big = write_model(&d.path("work/big.onnx"), 5);
    d.json(&["prepack", &big, "--wait"]);
    let o = d.ctl(&["prepack", &big]).ok();
    assert!(
        o.stdout.contains("every wanted format is stored already"),
        "{o:#?}"
    );
    d.stop();
}

#[test]
fn an_explicit_format_keeps_the_filters_unless_an_initializer_is_named() {
    let d = Daemon::in_process();
    let small = small_model(&d.path("work/small.onnx"));
    let fmt = ["--format", "gemm.pack_b.f32"];
    let with = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.extend(fmt.iter().map(|s| s.to_string()));
        v
    };
    let run = |args: Vec<String>| d.ctl(&args.iter().map(String::as_str).collect::<Vec<_>>());
    // Through the daemon: filtered, then named.
    let o = run(with(&["prepack", &small, "--wait"]));
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(o.stderr.contains("nothing to pack"), "{o:#?}");
    let r = d.json(&["resolve", &small, "--format", "gemm.pack_b.f32"]);
    assert_eq!(
        r["tensors"][0]["wanted_formats"],
        serde_json::json!([]),
        "{r}"
    );
    let o = run(with(&["--json", "prepack", &small, "--initializer", "W"])).ok();
    assert_eq!(o.json()["jobs"][0]["state"], "done", "{o:#?}");
    // A weight the filters admit is packed with the named format alone.
    let big = write_model(&d.path("work/big.onnx"), 6);
    let p = d.json(&["prepack", &big, "--wait", "--format", "cast.f16"]);
    assert_eq!(p["jobs"].as_array().unwrap().len(), 1, "{p}");
    // Locally: the same rule.
    let out = d.path("work/local.onnx").display().to_string();
    let o = run(with(&["embed", &small, "-o", &out, "--local"]));
    assert_eq!(o.code, 1, "{o:#?}");
    let o = run(with(&[
        "--json",
        "embed",
        &small,
        "-o",
        &out,
        "--local",
        "--initializer",
        "W",
    ]))
    .ok();
    assert_eq!(
        (o.json()["via"].as_str(), o.json()["entries"].as_u64()),
        (Some("local"), Some(1))
    );
    d.stop();
}

/// Runs a hint as a shell would, with this build's ctcachectl on the PATH.
fn run_hint(hint: &str) -> Out {
    let dir = Path::new(ctl_bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Out::of(
        Command::new("sh")
            .args(["-c", hint])
            .env("PATH", path)
            .env("NO_COLOR", "1")
            .env_remove("CTCACHE_SOCKET")
            .output()
            .unwrap(),
    )
}

#[test]
fn why_miss_hints_are_commands_that_work_when_run() {
    let d = Daemon::in_process();
    std::fs::create_dir_all(d.path("work/my models")).unwrap();
    let model = write_model(&d.path("work/my models/m.onnx"), 31);
    let small = small_model(&d.path("work/my models/it's small.onnx"));
    let cure = |model: &str, reason: &str| {
        let why = d.json(&["why-miss", model, "W"]);
        assert_eq!(why["reason"], reason, "{why}");
        let hint = why["hint"].as_str().unwrap_or_else(|| panic!("{why}"));
        assert!(hint.starts_with("ctcachectl --socket "), "{hint}");
        let human = d.ctl(&["why-miss", model, "W"]).ok().stdout;
        assert!(human.contains(&format!("hint: {hint}")), "{human}");
        run_hint(hint).ok();
        let after = d.json(&["why-miss", model, "W"]);
        assert_eq!(
            (after["hit"].as_bool(), &after["hint"]),
            (Some(true), &serde_json::Value::Null),
            "after `{hint}`: {after}"
        );
    };
    // Never packed; then packed from other contents; then a weight the
    // policy wants no format for.
    cure(&model, "no_entry");
    write_model(&d.path("work/my models/m.onnx"), 32);
    cure(&model, "stale_digest");
    cure(&small, "no_entry");

    // A table nothing would read packed (a Gather's): no format is
    // suggested for it, and the verdict says the policy selects none.
    let mut m = MatMul::new(64, 64, xorshift(5).map(|x| (x % 7) as f32)).proto();
    let g = m.graph.as_mut().unwrap();
    g.node = vec![ctcache_testkit::node("Gather", "g", &["W", "I"], "Y")];
    let table = d.path("work/my models/table.onnx");
    ctcache_testkit::write_model(&table, &prost::Message::encode_to_vec(&m));
    let why = d.json(&["why-miss", table.to_str().unwrap(), "W"]);
    assert_eq!(why["reason"], "no_entry", "{why}");
    assert_eq!(why["hint"], serde_json::Value::Null, "{why}");
    let human = d
        .ctl(&["why-miss", table.to_str().unwrap(), "W"])
        .ok()
        .stdout;
    assert!(!human.contains("hint:"), "{human}");
    assert!(
        human.contains("the policy selects none of its formats"),
        "{human}"
    );
    d.stop();
}
