//! ctcachectl against a real ctcached (spawned on temp dirs): every daemon
//! command in human and `--json` form, the error paths and their exit codes,
//! offline gc/verify, and the client library's leases surviving gc.

mod harness;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use ctcache_client::{api, Client, OpenOptions, ResolveOptions};
use harness::{ctl_bin, ctl_raw, eventually, write_model, Daemon};
use prost::Message;
use serde_json::Value;

fn keys(v: &Value) -> Vec<String> {
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn no_daemon_exits_3_and_says_how_to_start_it() {
    let t = tempfile::tempdir().unwrap();
    let sock = t.path().join("none.sock");
    let sock = sock.to_str().unwrap();
    let model = write_model(&t.path().join("m.onnx"), 1);
    let commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["devices"],
        vec!["ls"],
        vec!["stat", "00ab"],
        vec!["prepack", &model],
        vec!["resolve", &model],
        vec!["why-miss", &model, "W"],
        vec!["import", &model],
        vec!["gc", "--all", "--yes"],
        vec!["verify"],
        vec!["watch", "list"],
        vec!["events"],
    ];
    for c in commands {
        let mut args = vec!["--socket", sock];
        args.extend(c.iter());
        let o = ctl_raw(&args);
        assert_eq!(o.code, 3, "{c:?}: {o:#?}");
        assert!(
            o.stderr
                .contains("start it with `ctcached` (or `systemctl start ctcached`)"),
            "{o:#?}"
        );
        assert!(o.stderr.contains(sock), "{o:#?}");
    }
    // A path that is no socket at all.
    let file = t.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let o = ctl_raw(&["--socket", file.to_str().unwrap(), "status"]);
    assert_eq!(o.code, 3, "{o:#?}");
    assert!(
        o.stderr.contains("is not a socket (it is a regular file)"),
        "{o:#?}"
    );

    // A named socket is never a reason to work without the daemon: embed
    // and materialize fail the same way (the fallback without a named
    // socket: cli_exits.rs).
    let out = t.path().join("e.onnx");
    for cmd in ["embed", "materialize"] {
        let o = ctl_raw(&["--socket", sock, cmd, &model, "-o", out.to_str().unwrap()]);
        assert_eq!(o.code, 3, "{cmd}: {o:#?}");
        assert!(!out.exists(), "{o:#?}");
    }
}

#[test]
fn bad_arguments_exit_2() {
    let cases: &[&[&str]] = &[
        &["gc", "--max-size", "12Q"],
        &["gc", "--max-age", "7x"],
        &["resolve", "m.onnx", "--on-miss", "sometimes"],
        &["prepack"],
        &["prepack", "m.onnx", "--param", "bits=4"],
        &[
            "prepack",
            "m.onnx",
            "--format",
            "ort.matmul_nbits",
            "--param",
            "bits",
        ],
        &["--color", "sometimes", "status"],
        &["watch", "add"],
        &["no-such-command"],
    ];
    for args in cases {
        let o = ctl_raw(args);
        assert_eq!(o.code, 2, "{args:?}: {o:#?}");
        assert!(!o.stderr.is_empty());
    }
    // Completions and the man page are generated from the same definition.
    assert!(ctl_raw(&["completions", "bash"])
        .ok()
        .stdout
        .contains("ctcachectl"));
    assert!(ctl_raw(&["man"]).ok().stdout.contains(".TH ctcachectl"));
    // One page per command that is not hidden, nested ones included.
    let t = tempfile::tempdir().unwrap();
    ctl_raw(&["man", "--dir", t.path().to_str().unwrap()]).ok();
    let mut pages: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    for page in [
        "ctcachectl.1",
        "ctcachectl-gc.1",
        "ctcachectl-watch-add.1",
        "ctcachectl-why-miss.1",
    ] {
        assert!(pages.iter().any(|p| p == page), "{page} not in {pages:?}");
    }
    assert!(
        !pages
            .iter()
            .any(|p| p.contains("-man.") || p.contains("-completions.") || p.contains("-help.")),
        "{pages:?}"
    );
    let gc = std::fs::read_to_string(t.path().join("ctcachectl-gc.1")).unwrap();
    assert!(
        gc.contains("max\\-size") && gc.contains("\\-\\-socket"),
        "{gc}"
    );
}

#[test]
fn status_devices_formats_and_watches() {
    let d = Daemon::start();
    let s = d.json(&["status"]);
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["socket"], d.socket_arg());
    assert_eq!(s["entries"], 0);
    assert!(s["hit_rate"].is_null());
    let models = d.path("models").display().to_string();
    assert_eq!(s["watches"], serde_json::json!([models]));
    let human = d.ctl(&["status"]).ok().stdout;
    assert!(
        human.contains("ctcached") && human.contains("hit rate") && human.contains(&models),
        "{human}"
    );
    assert!(!human.contains('\x1b'), "colour off the terminal: {human}");
    assert!(d
        .ctl(&["--color", "always", "status"])
        .ok()
        .stdout
        .contains("\x1b[1m"));

    let devs = d.json(&["devices"]);
    assert_eq!(devs["devices"][0]["type"], "cpu", "{devs}");
    assert_eq!(devs, d.json(&["devices", "--local"]));
    assert!(d.ctl(&["devices"]).ok().stdout.contains("ARCHITECTURE"));
    let f = d.json(&["formats"]);
    assert!(f["formats"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["id"] == "gemm.pack_b.f32"));

    assert_eq!(
        d.json(&["watch", "list"])["dirs"],
        serde_json::json!([models])
    );
    let other = d.path("work");
    let other_s = other.display().to_string();
    let added = d.json(&["watch", "add", &other_s]);
    assert!(
        added["dirs"]
            .as_array()
            .unwrap()
            .contains(&other_s.clone().into()),
        "{added}"
    );
    assert!(d.ctl(&["watch", "list"]).ok().stdout.contains(&other_s));
    assert!(d
        .ctl(&["watch", "remove", &other_s])
        .ok()
        .stdout
        .contains("no longer watching"));
    assert_eq!(
        d.json(&["watch", "list"])["dirs"],
        serde_json::json!([models])
    );
    // A folder that does not exist is refused (exit 1, the daemon's reason).
    let o = d.ctl(&["watch", "add", "/no/such/dir"]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(o.stderr.contains("/no/such/dir"), "{o:#?}");
    d.stop();
}

#[test]
fn prepack_resolve_ls_stat_and_why_miss() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 7);

    // Nothing stored yet: a miss for both policy formats.
    let r = d.json(&["resolve", &model]);
    let w = &r["tensors"][0];
    assert_eq!(
        (w["name"].as_str(), w["status"].as_str()),
        (Some("W"), Some("miss")),
        "{r}"
    );
    assert_eq!(
        w["wanted_formats"],
        serde_json::json!(["gemm.pack_b.f32", "ort.matmul_nbits"])
    );
    assert_eq!(w["misses"][0]["reason"], "no_entry");
    assert!(d.ctl(&["resolve", &model]).ok().stdout.contains("miss"));
    let why = d.json(&["why-miss", &model, "W"]);
    assert_eq!(
        (why["hit"].as_bool(), why["reason"].as_str()),
        (Some(false), Some("no_entry")),
        "{why}"
    );
    assert!(why["hint"].as_str().unwrap().contains("prepack"), "{why}");
    let human = d.ctl(&["why-miss", &model, "W"]).ok().stdout;
    assert!(
        human.contains("miss (no_entry)") && human.contains("hint:"),
        "{human}"
    );

    // Pack, waiting: one job per wanted format, each done.
    let p = d.json(&["prepack", &model, "--wait"]);
    let jobs = p["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{p}");
    assert!(
        jobs.iter()
            .all(|j| j["state"] == "done" && j["key"].is_string()),
        "{p}"
    );
    assert_eq!(p["failed"], 0);
    // Again: served from the store.
    let human = d.ctl(&["prepack", &model, "--wait"]).ok().stdout;
    assert!(
        human.contains("cached") && human.contains("INITIALIZER"),
        "{human}"
    );
    assert_eq!(
        d.ctl(&["--quiet", "prepack", &model, "--wait"]).ok().stdout,
        ""
    );

    let r = d.json(&["resolve", &model]);
    assert_eq!(r["tensors"][0]["status"], "hit", "{r}");
    assert_eq!(r["tensors"][0]["entries"].as_array().unwrap().len(), 2);
    assert!(d.ctl(&["resolve", &model]).ok().stdout.contains("hit"));
    let why = d.json(&["why-miss", &model, "W"]);
    assert_eq!(why["hit"], true, "{why}");
    assert!(
        why["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["differs"].is_null()),
        "{why}"
    );

    // ls, with each filter; stat by whole key and by the abbreviation ls prints.
    let all = d.json(&["ls"]);
    assert_eq!(keys(&all).len(), 2, "{all}");
    assert_eq!(keys(&d.json(&["ls", "--format", "gemm.pack_b"])).len(), 1);
    assert_eq!(keys(&d.json(&["ls", "--model", &model])).len(), 2);
    assert_eq!(
        keys(&d.json(&["ls", "--device", "no-such-device"])).len(),
        0
    );
    assert_eq!(keys(&d.json(&["ls", "--limit", "1"])).len(), 1);
    let ls = d.ctl(&["ls"]).ok().stdout;
    assert!(
        ls.contains("PHYSICAL TYPE") && ls.contains("2 entries"),
        "{ls}"
    );
    // The model each entry came from, and the orders ls knows.
    assert!(
        ls.lines()
            .nth(1)
            .unwrap()
            .contains(&format!("  {model}  W  ")),
        "{ls}"
    );
    let key = keys(&all)[0].clone();
    let st = d.json(&["stat", &key]);
    assert_eq!(st["key"], key.as_str());
    assert_eq!(st["source_names"], serde_json::json!(["W"]));
    let short = ls
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    let st2 = d.json(&["stat", &short]);
    assert!(
        keys(&all).contains(&st2["key"].as_str().unwrap().to_string()),
        "{short} -> {st2}"
    );
    assert!(d.ctl(&["stat", &key]).ok().stdout.contains("payload file"));
    let o = d.ctl(&["stat", "ffff"]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(o.stderr.contains("no entry"), "{o:#?}");

    // A changed initializer: the stored entries are for its old contents.
    write_model(&d.path("work/m.onnx"), 8);
    let why = d.json(&["why-miss", &model, "W"]);
    assert_eq!(why["reason"], "stale_digest", "{why}");
    assert!(
        why["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["differs"] == "digest"),
        "{why}"
    );
    assert!(d
        .ctl(&["why-miss", &model, "W"])
        .ok()
        .stdout
        .contains("digest"));
    let o = d.ctl(&["why-miss", &model, "NOPE"]);
    assert_eq!(o.code, 1, "{o:#?}");

    // Without --wait, whole-model jobs go on in the background.
    let bg = d.json(&["prepack", &model]);
    assert_eq!(
        (bg["waited"].as_bool(), bg["jobs_started"].as_u64()),
        (Some(false), Some(2)),
        "{bg}"
    );
    eventually("background packs", || keys(&d.json(&["ls"])).len() == 4);
    // With --initializer and a format and its parameters: waits.
    let p = d.json(&[
        "prepack",
        &model,
        "--initializer",
        "W",
        "--format",
        "ort.matmul_nbits",
        "--param",
        "bits=8",
    ]);
    assert_eq!(p["jobs"][0]["state"], "done", "{p}");
    let st = d.json(&["status"]);
    assert_eq!(st["entries"], 5, "{st}");
    assert!(st["hit_rate"].is_number(), "{st}");

    // A malformed model is a failure of the command (exit 1), with the reason.
    let bad = d.path("work/bad.onnx");
    std::fs::write(&bad, b"\x08\x07garbage that is no model").unwrap();
    for cmd in ["resolve", "prepack", "import", "materialize"] {
        let out = d.path("work/bad.int4.onnx");
        let mut args = vec![cmd, bad.to_str().unwrap()];
        if cmd == "materialize" {
            args.extend(["-o", out.to_str().unwrap()]);
        }
        let o = d.ctl(&args);
        assert_eq!(o.code, 1, "{cmd}: {o:#?}");
        assert!(!o.stderr.is_empty());
    }
    d.stop();
}

#[test]
fn materialize_through_the_daemon_and_locally_give_the_same_model() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 7);
    let via = |dir: &str, extra: &[&str]| {
        let out = d.path(&format!("work/{dir}/m.q.onnx"));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let mut args = vec!["materialize", model.as_str(), "-o", out.to_str().unwrap()];
        args.extend(extra);
        (d.json(&args), out)
    };
    let (daemon, a) = via("a", &["--asymmetric"]);
    let (local, b) = via("b", &["--asymmetric", "--local"]);
    assert_eq!(
        (daemon["via"].as_str(), local["via"].as_str()),
        (Some("daemon"), Some("local"))
    );
    assert_eq!(daemon["nodes_rewritten"], 1, "{daemon}");
    assert_eq!(local["packed"], 1, "{local}");
    // Same bytes: the model (payload files are named by content) and its weights.
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    let files = |p: &std::path::Path| {
        let mut v: Vec<_> = std::fs::read_dir(p.with_file_name("m.q.onnx.weights"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), std::fs::read(e.path()).unwrap())
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(files(&a), files(&b));
    // A socket named on the command line that does not answer is an error
    // (exit 3), not a reason to pack here: nothing is written.
    let sock = d.path("none.sock");
    let out = d.path("work/c/m.q.onnx");
    let o = ctl_raw(&[
        "--socket",
        sock.to_str().unwrap(),
        "materialize",
        &model,
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.code, 3, "{o:#?}");
    assert!(o.stderr.contains("ctcached is not running"), "{o:#?}");
    assert!(!out.exists() && !d.path("work/c").exists());
    // Locally too, a model with nothing to rewrite is refused and nothing
    // is written; a malformed one is a failure with the reason.
    let relu = d.path("work/relu.onnx");
    ctcache_testkit::write_model(
        &relu,
        &ctcache::pb::ModelProto {
            graph: Some(ctcache::pb::GraphProto {
                node: vec![ctcache_testkit::node("Relu", "r", &["x"], "y")],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let bad = d.path("work/garbage.onnx");
    std::fs::write(&bad, b"\x08\x07garbage that is no model").unwrap();
    for (m, why) in [(&relu, "nothing to materialize"), (&bad, "")] {
        let out = d.path("work/d/never.onnx");
        let o = d.ctl(&[
            "materialize",
            m.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--local",
        ]);
        assert_eq!(o.code, 1, "{o:#?}");
        assert!(o.stderr.contains(why) && !o.stderr.is_empty(), "{o:#?}");
        assert!(!out.exists() && !d.path("work/d").exists(), "{o:#?}");
    }
    d.stop();
}

#[test]
fn embed_and_import_through_the_daemon() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 3);
    // A relative output path is sent absolute.
    let e = Command::new(ctl_bin())
        .current_dir(d.path("work"))
        .args([
            "--socket",
            &d.socket_arg(),
            "--json",
            "embed",
            "m.onnx",
            "-o",
            "out.onnx",
        ])
        .output()
        .unwrap();
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    let e: Value = serde_json::from_slice(&e.stdout).unwrap();
    assert_eq!(
        (
            e["via"].as_str(),
            e["entries"].as_u64(),
            e["packed"].as_u64()
        ),
        (Some("daemon"), Some(2), Some(2)),
        "{e}"
    );
    let out = d.path("work/out.onnx");
    assert_eq!(e["output"], out.display().to_string());
    ctl_raw(&["check", out.to_str().unwrap()]).ok();

    // Import: the model's entries are in the store already.
    let i = d.json(&["import", out.to_str().unwrap()]);
    assert_eq!(
        (i["imported"].as_u64(), i["already_present"].as_u64()),
        (Some(0), Some(2)),
        "{i}"
    );
    assert!(d
        .ctl(&["import", out.to_str().unwrap()])
        .ok()
        .stdout
        .contains("already present"));

    // Human form, --replace, an explicit format, --sidecar.
    let out2 = d.path("work/out2.onnx");
    let o = d
        .ctl(&[
            "embed",
            out.to_str().unwrap(),
            "-o",
            out2.to_str().unwrap(),
            "--replace",
            "--format",
            "gemm.pack_b.f32",
            "--sidecar",
        ])
        .ok();
    assert!(o.stdout.contains("1 compiled tensor(s) embedded"), "{o:#?}");
    assert!(d.path("work/out2.onnx.ctdata").is_file());
    // --local packs in this process, daemon or not.
    let out3 = d.path("work/out3.onnx");
    let l = d.json(&[
        "embed",
        &model,
        "-o",
        out3.to_str().unwrap(),
        "--local",
        "--format",
        "gemm.pack_b.f32",
    ]);
    assert_eq!(l["via"], "local", "{l}");
    // Embedding twice without --replace is refused with the reason.
    let o = d.ctl(&["embed", out.to_str().unwrap(), "-o", out2.to_str().unwrap()]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert!(o.stderr.contains("replace"), "{o:#?}");
    d.stop();
}

#[test]
fn gc_and_verify_through_the_daemon_and_offline() {
    let d = Daemon::start();
    let model = write_model(&d.path("work/m.onnx"), 11);
    d.json(&["prepack", &model, "--wait"]);
    let cache = d.path("cache").display().to_string();

    let dry = d.json(&["gc", "--all", "--yes", "--dry-run"]);
    assert_eq!(
        (dry["dry_run"].as_bool(), dry["via"].as_str()),
        (Some(true), Some("daemon")),
        "{dry}"
    );
    assert_eq!(dry["removed"].as_array().unwrap().len(), 2, "{dry}");
    assert!(d
        .ctl(&["gc", "--all", "--yes", "--dry-run"])
        .ok()
        .stdout
        .contains("would remove 2"));
    assert_eq!(keys(&d.json(&["ls"])).len(), 2);
    assert_eq!(
        d.json(&["gc", "--max-age", "7d"])["removed"],
        serde_json::json!([])
    );
    assert_eq!(
        d.json(&["gc", "--max-size", "10G"])["removed"],
        serde_json::json!([])
    );

    // The daemon holds the cache dir: offline commands refuse it.
    for cmd in ["gc", "verify"] {
        let o = d.ctl(&[cmd, "--cache-dir", &cache]);
        assert_eq!(o.code, 1, "{o:#?}");
        assert!(o.stderr.contains("held by a running daemon"), "{o:#?}");
    }

    let v = d.json(&["verify"]);
    assert_eq!(
        (v["clean"].as_bool(), v["checked"].as_u64()),
        (Some(true), Some(2)),
        "{v}"
    );
    assert!(d
        .ctl(&["verify", "--repair"])
        .ok()
        .stdout
        .contains("checked"));
    // Damage one payload file: verify reports it (exit 1) and changes
    // nothing; verify --repair drops the entry.
    let entries = d.json(&["ls"]);
    let victim = &entries["entries"][0];
    ctcache_testkit::rot_payload(victim["payload_path"].as_str().unwrap());
    let o = d.ctl(&["--json", "verify"]);
    assert_eq!(o.code, 1, "{o:#?}");
    let v = o.json();
    assert_eq!(v["clean"], false);
    assert_eq!(v["corrupt"], serde_json::json!([victim["key"]]), "{v}");
    assert!(o.stderr.contains("store damaged"), "{o:#?}");
    assert!(o.stderr.contains("--repair drops them"), "{o:#?}");
    assert_eq!(keys(&d.json(&["ls"])).len(), 2);
    let o = d.ctl(&["--json", "verify", "--repair"]);
    assert_eq!(o.code, 1, "{o:#?}");
    assert_eq!(o.json()["corrupt"], serde_json::json!([victim["key"]]));
    assert!(o.stderr.contains("were dropped"), "{o:#?}");
    assert_eq!(keys(&d.json(&["ls"])).len(), 1);

    let g = d.json(&["gc", "--all", "--yes"]);
    assert!(
        g["removed"]
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["reason"] == "size_budget"),
        "{g}"
    );
    assert!(g["bytes_freed"].as_u64().unwrap() > 0);
    assert_eq!(keys(&d.json(&["ls"])).len(), 0);
    d.json(&["prepack", &model, "--wait"]);

    // The daemon logged one readable line per gc, verify and reconcile
    // (no Debug dumps of its reports).
    let log = d.log();
    for words in [
        "gc (dry run): would remove 2 entries and 0 leftover files, ",
        "gc: removed 0 entries and 0 leftover files, 0 bytes freed, store ",
        "verify: 2 payload files (",
        "verify: 2 payload files",
        "1 damaged (reported only)",
        "1 damaged (quarantined, their entries dropped)",
        "reconcile: 2 entries checked, 0 damaged, ",
    ] {
        assert!(log.contains(words), "{words:?} not in:\n{log}");
    }
    assert!(!log.contains("Report {"), "{log}");

    // With the daemon gone, gc and verify open the cache dir themselves.
    let dir = d.stop();
    let v = ctl_raw(&["--json", "verify", "--cache-dir", &cache])
        .ok()
        .json();
    assert_eq!(
        (
            v["clean"].as_bool(),
            v["checked"].as_u64(),
            v["via"].as_str()
        ),
        (Some(true), Some(2), Some(cache.as_str())),
        "{v}"
    );
    ctl_raw(&["verify", "--repair", "--cache-dir", &cache]).ok();
    let g = ctl_raw(&["--json", "gc", "--all", "--dry-run", "--cache-dir", &cache])
        .ok()
        .json();
    assert_eq!(g["removed"].as_array().unwrap().len(), 2, "{g}");
    let o = ctl_raw(&["gc", "--all", "--yes", "--cache-dir", &cache]).ok();
    assert!(o.stdout.contains("\n2 entries, "), "{o:#?}");
    let o = ctl_raw(&[
        "gc",
        "--cache-dir",
        dir.path().join("nope").to_str().unwrap(),
    ]);
    assert_eq!(o.code, 1, "{o:#?}");
}

#[test]
fn events_follow_packs_and_the_watcher() {
    let d = Daemon::start();
    let spawn_events = |extra: &[&str]| {
        let mut child = Command::new(ctl_bin())
            .args(["--socket", &d.socket_arg(), "events"])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Subscribed once the note is on stderr.
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("following events"), "{line}");
        child
    };

    let child = spawn_events(&["--json", "--count", "2"]);
    let model = write_model(&d.path("work/m.onnx"), 5);
    d.json(&["prepack", &model, "--wait", "--format", "gemm.pack_b.f32"]);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    let kinds: Vec<&str> = lines.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"entry_added"), "{kinds:?}");
    assert!(lines.iter().all(|e| e["unix_ms"].as_i64().unwrap() > 0));

    // A model dropped into the watched folder is packed: human event lines.
    let child = spawn_events(&["--count", "1"]);
    write_model(&d.path("models/w.onnx"), 6);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.contains('Z'), "{text}");
    eventually("watcher packs", || {
        keys(&d.json(&["ls", "--model", d.path("models/w.onnx").to_str().unwrap()])).len() == 2
    });
    // One readable log line for the model, once its jobs ended.
    let line = format!(
        "watcher: {}: 2 packed, 0 stored already, in ",
        d.path("models/w.onnx").canonicalize().unwrap().display()
    );
    eventually("the watcher's log line", || d.log().contains(&line));

    // Ctrl-C stops a follow the user asked for: exit 0 (issue 29).
    let child = spawn_events(&[]);
    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    d.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_payload_lease_survives_gc_until_dropped() {
    let d = Daemon::start();
    let model = write_model(&d.path("work/m.onnx"), 9);
    let c = Client::connect_to(&d.socket).await.unwrap();
    let opts = ResolveOptions {
        on_miss: api::OnMiss::Wait,
        ..Default::default()
    };
    let res = c.resolve_model(&model, &opts).await.unwrap();
    let entries = res.tensors[0].entries.clone();
    assert_eq!(entries.len(), 2, "{res:?}");
    let verify = OpenOptions {
        verify: true,
        ..Default::default()
    };
    let (a, b) = (&entries[0], &entries[1]);
    let pa = c.open_payload_with(a, &verify).await.unwrap();
    let pb = c.open_payload_with(b, &verify).await.unwrap();
    assert!(pa.is_mapped() && pa.lease_id().is_some());
    assert_eq!(pa.len() as u64, a.payload_len);
    // Streamed copy (the path used when the file is not readable): same bytes.
    let streamed = c
        .open_payload_with(
            a,
            &OpenOptions {
                map: false,
                verify: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!streamed.is_mapped() && streamed.lease_id().is_none());
    assert_eq!(&streamed[..], &pa[..]);
    // A length far past the end (u64::MAX aborted the process allocating
    // for it) reads to the end; a part reads just that part.
    let all = c.read_payload(&a.key, 0, u64::MAX).await.unwrap();
    assert_eq!(&all[..], &pa[..]);
    let part = c.read_payload(&a.key, 3, 5).await.unwrap();
    assert_eq!(&part[..], &pa[3..8]);
    let status = c.stats().await.unwrap();
    assert_eq!(status.active_leases, 2);

    let gc = |d: &Daemon| d.json(&["gc", "--all", "--yes"]);
    let g = tokio::task::block_in_place(|| gc(&d));
    assert_eq!(
        (
            g["removed"].as_array().unwrap().len(),
            g["skipped_leased"].as_u64()
        ),
        (0, Some(2)),
        "{g}"
    );
    let ls = tokio::task::block_in_place(|| d.json(&["ls"]));
    assert!(
        ls["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["leased"] == true),
        "{ls}"
    );
    assert_eq!(blake3::hash(&pa).to_hex().as_str(), a.payload_blake3);

    // Released explicitly: collected by the next gc; the other stays.
    pb.release().await.unwrap();
    let g = tokio::task::block_in_place(|| gc(&d));
    assert_eq!(g["removed"][0]["key"], b.key.as_str(), "{g}");
    // Dropped: the lease task releases it in the background.
    drop(pa);
    tokio::task::block_in_place(|| {
        eventually("the dropped payload's entry collected", || {
            gc(&d)["removed"]
                .as_array()
                .unwrap()
                .iter()
                .any(|i| i["key"] == a.key.as_str())
        })
    });
    // A gone entry cannot be opened; the error says which.
    let err = c.open_payload(a).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");
    drop(c);
    tokio::task::block_in_place(|| d.stop());
}

/// A user who may not reach the socket is told to join its group. Needs
/// root (to run the CLI as another uid); skipped otherwise.
#[test]
fn permission_denied_says_to_join_the_group() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !std::path::Path::new("/usr/bin/setpriv").exists() {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let as_nobody = |args: &[&str]| {
        Command::new("/usr/bin/setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                ctl_bin(),
            ])
            .args(args)
            .output()
            .unwrap()
    };
    if !as_nobody(&["--version"]).status.success() {
        eprintln!("skipped: uid 65534 cannot run {}", ctl_bin());
        return;
    }
    let d = Daemon::start();
    // The temp dir is 0700 root: uid 65534 cannot reach the socket in it.
    let o = as_nobody(&["--socket", &d.socket_arg(), "status"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{stderr}");
    assert!(
        stderr.contains("permission denied") && stderr.contains("join the socket's group"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("ls -l {}", d.socket_arg())),
        "{stderr}"
    );
    d.stop();
}

#[test]
fn ls_shows_the_model_and_sorts_by_model_last_use_and_size() {
    let d = Daemon::in_process();
    let b = write_model(&d.path("work/b.onnx"), 41);
    let a = write_model(&d.path("work/a.onnx"), 42);
    d.json(&["prepack", &b, "--wait"]);
    d.json(&["prepack", &a, "--wait"]);
    let order = |args: &[&str]| -> Vec<Value> {
        let mut all = vec!["ls"];
        all.extend_from_slice(args);
        d.json(&all)["entries"].as_array().unwrap().clone()
    };
    let field = |v: &[Value], f: &str| -> Vec<Value> { v.iter().map(|e| e[f].clone()).collect() };
    let by_model = order(&["--sort", "model"]);
    let models: Vec<&str> = by_model
        .iter()
        .map(|e| e["model_paths"][0].as_str().unwrap())
        .collect();
    assert_eq!(models, [&a, &a, &b, &b]);
    let sizes: Vec<u64> = field(&order(&["--sort", "size"]), "payload_len")
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    // Reading one of b's payloads makes it the most recently used entry
    // (a's entries were created after b's).
    let key = by_model[3]["key"].as_str().unwrap().to_string();
    // Stamped later than every entry so far: the clock passes the newest.
    let newest = by_model
        .iter()
        .flat_map(|e| [&e["last_access_unix_ms"], &e["created_unix_ms"]])
        .filter_map(Value::as_i64)
        .max()
        .unwrap_or(0);
    ctcache_testkit::clock_past(newest);
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let c = Client::connect_to(&d.socket).await.unwrap();
        c.read_payload(&key, 0, 0).await.unwrap();
    });
    let recent = order(&["--sort", "last-use"]);
    assert_eq!(recent[0]["key"], key.as_str(), "{recent:?}");
    let ms: Vec<i64> = field(&recent, "last_access_unix_ms")
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert!(ms.windows(2).all(|w| w[0] >= w[1]), "{ms:?}");
    // --limit keeps the first in that order.
    assert_eq!(
        field(&order(&["--sort", "last-use", "--limit", "1"]), "key"),
        [Value::from(key.as_str())]
    );
    let human = d.ctl(&["ls", "--sort", "model"]).ok().stdout;
    let rows: Vec<&str> = human.lines().skip(1).take(4).collect();
    assert!(
        rows[..2].iter().all(|r| r.contains(&format!("  {a}  W  ")))
            && rows[2..].iter().all(|r| r.contains(&format!("  {b}  W  "))),
        "{human}"
    );
    d.stop();
}
