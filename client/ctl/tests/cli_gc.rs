//! `gc` as the admins' command: the budget `status` shows and a `gc`
//! without limits applies (or says is missing), what goes listed by model
//! and initializer with the store's size before and after, `0` meaning
//! everything for both limits, and hit/miss counters that outlive a restart.

mod harness;

use ctcache::fsutil::fs_size;
use ctcache_testkit::{write_model as write_model_bytes, xorshift, MatMul, Tmpfs};
use harness::{ctl_raw, write_model, Daemon};
use serde_json::Value;

fn removed_keys(g: &Value) -> Vec<String> {
    let mut v: Vec<String> = g["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["key"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn status_shows_the_budget_and_gc_applies_it_listing_models_and_initializers() {
    // 1 KiB: less than one packed weight, so everything is over it.
    let d = Daemon::in_process_with_gc_budget(1024, 30 * 86_400);
    let model = write_model(&d.path("work/m.onnx"), 21);
    d.json(&["prepack", &model, "--wait"]);
    let s = d.json(&["status"]);
    assert_eq!(
        (s["gc_max_bytes"].as_u64(), s["gc_max_age_s"].as_u64()),
        (Some(1024), Some(30 * 86_400)),
        "{s}"
    );
    let bytes = s["bytes"].as_u64().unwrap();
    let human = d.ctl(&["status"]).ok().stdout;
    let line = human.lines().find(|l| l.starts_with("gc budget")).unwrap();
    assert!(
        line.contains("of 1.0 KiB") && line.contains("unused for 30d 0h"),
        "{human}"
    );

    // No limit given: the configured budget applies.
    let dry = d.json(&["gc", "--dry-run"]);
    assert_eq!(dry["max_bytes"], 1024, "{dry}");
    let items = dry["removed"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{dry}");
    assert!(
        items.iter().all(|i| i["model_paths"][0] == model.as_str()
            && i["source_names"][0] == "W"
            && i["physical_type"].as_str().is_some_and(|t| !t.is_empty())),
        "{dry}"
    );
    assert_eq!(
        (dry["bytes_before"].as_u64(), dry["bytes_after"].as_u64()),
        (Some(bytes), Some(0)),
        "{dry}"
    );
    let out = d.ctl(&["gc", "--dry-run"]).ok().stdout;
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("MODEL") && lines[0].contains("INITIALIZER"),
        "{out}"
    );
    assert!(
        lines[1..3]
            .iter()
            .all(|l| l.starts_with(model.as_str()) && l.contains(" W ")),
        "{out}"
    );
    let last = lines.last().unwrap();
    assert!(
        last.starts_with("would remove 2 entries, ")
            && last.contains(" freed, store ")
            && last.ends_with("-> 0 B (dry run: nothing changed)"),
        "{out}"
    );
    // The budget empties the store: confirmed (stdin is no terminal here).
    let real = d.ctl(&["gc", "--yes"]).ok().stdout;
    let last = real.lines().last().unwrap();
    assert!(
        last.starts_with("2 entries, ") && last.ends_with(" -> 0 B"),
        "{real}"
    );
    assert_eq!(d.json(&["ls"])["entries"], serde_json::json!([]));
    d.stop();
}

/// Without `gc_max_bytes` the daemon's size budget is half the cache's file
/// system: a gc that names no size (the daily timer's) takes a store that
/// grew past it back under it (no peer's packs can fill the disk the cache
/// shares), and `status` says the budget is the default.
#[test]
fn without_gc_max_bytes_gc_holds_the_store_to_half_its_file_system() {
    let mut fs = None;
    let d = Daemon::in_process_with(|c| {
        fs = Tmpfs::mount_at(&c.cache_dir, "48m").ok();
    });
    let Some(fs) = fs else {
        eprintln!("skipped: needs root to mount a tmpfs");
        return;
    };
    let half = fs_size(fs.path()).unwrap() / 2;
    // Seven models of 4.6 MiB of packs each: 32 MiB, over the 24 MiB.
    for seed in 0..7u32 {
        let w = xorshift(seed + 1).map(|x| (x % 2000) as f32 / 1000.0 - 1.0);
        let path = d.path(&format!("work/big{seed}.onnx"));
        write_model_bytes(&path, &MatMul::new(1024, 1024, w).encode());
        d.json(&["prepack", path.to_str().unwrap(), "--wait"]);
    }
    let s = d.json(&["status"]);
    assert_eq!(s["gc_max_bytes"].as_u64(), Some(half), "{s}");
    assert_eq!(s["gc_max_bytes_default"], true, "{s}");
    assert!(s["bytes"].as_u64().unwrap() > half, "{s}");
    let human = d.ctl(&["status"]).ok().stdout;
    assert!(
        human.contains("by default half the cache's file system"),
        "{human}"
    );

    // The daily timer's default arguments name an age only: the size
    // budget still applies.
    let g = d.json(&["gc", "--max-age", "30d"]);
    assert_eq!(g["max_bytes"].as_u64(), Some(half), "{g}");
    assert!(!g["removed"].as_array().unwrap().is_empty(), "{g}");
    assert!(g["bytes_after"].as_u64().unwrap() <= half, "{g}");
    let s = d.json(&["status"]);
    assert!(s["bytes"].as_u64().unwrap() <= half, "{s}");
    drop(d);
    drop(fs);
}

/// A budget configured is no longer the default.
#[test]
fn a_configured_gc_max_bytes_is_not_the_default() {
    let d = Daemon::in_process_with_gc_budget(1 << 30, 0);
    let s = d.json(&["status"]);
    assert_eq!(s["gc_max_bytes"].as_u64(), Some(1 << 30), "{s}");
    assert_eq!(s["gc_max_bytes_default"], false, "{s}");
    d.stop();
}

/// Offline (`--cache-dir`), only the limits given apply: with none, gc
/// collects only leftovers and says no budget is set.
#[test]
fn offline_gc_without_limits_says_none_is_set() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 22);
    d.json(&["prepack", &model, "--wait"]);
    let dir = d.stop();
    let cache = dir.path().join("cache");
    let cache = cache.to_str().unwrap();
    let o = ctl_raw(&["gc", "--cache-dir", cache]).ok().stdout;
    assert!(o.starts_with("no gc budget is set: "), "{o}");
    let last = o.lines().last().unwrap();
    let (before, after) = last
        .strip_prefix("0 entries, 0 B freed, store ")
        .and_then(|r| r.split_once(" -> "))
        .unwrap_or_else(|| panic!("{o}"));
    assert_eq!(before, after, "{o}");
    let g = ctl_raw(&["--json", "gc", "--cache-dir", cache]).ok().json();
    assert!(
        g["max_bytes"].is_null() && g["removed"] == serde_json::json!([]),
        "{g}"
    );
}

/// 0 means one thing nowhere: `--max-size 0` and `--max-age 0` are refused
/// naming the option (as `gc_max_bytes = 0` is in the config); `--all`
/// removes every entry not leased, and a gc that would empty the store
/// needs `--yes` when it cannot ask (stdin not a terminal).
#[test]
fn zero_is_refused_and_emptying_the_store_needs_yes() {
    let d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 23);
    d.json(&["prepack", &model, "--wait"]);
    for opt in ["--max-age", "--max-size"] {
        let o = d.ctl(&["gc", opt, "0"]);
        assert_eq!(o.code, 2, "{o:#?}");
        assert!(
            o.stderr.contains(opt) && o.stderr.contains("0 is not a limit"),
            "{o:#?}"
        );
    }
    let dry = d.json(&["gc", "--all", "--dry-run"]);
    assert_eq!(removed_keys(&dry).len(), 2, "{dry}");
    // Every entry would go: refused without --yes, nothing removed.
    for args in [&["gc", "--all"][..], &["gc", "--max-size", "1"][..]] {
        let o = d.ctl(args);
        assert_eq!(o.code, 1, "{args:?}: {o:#?}");
        assert!(
            o.stderr.contains("would remove every entry (2 entries")
                && o.stderr.contains("add --yes")
                && o.stderr.contains("stdin is not a terminal"),
            "{o:#?}"
        );
        assert_eq!(d.json(&["ls"])["entries"].as_array().unwrap().len(), 2);
    }
    // A gc that leaves entries asks nothing.
    assert_eq!(removed_keys(&d.json(&["gc", "--max-size", "10G"])).len(), 0);
    let cache = d.path("cache").display().to_string();
    let gone = removed_keys(&d.json(&["gc", "--all", "--yes"]));
    assert_eq!(gone, removed_keys(&dry));
    let _dir = d.stop();
    // Offline: the same rules.
    let o = ctl_raw(&["gc", "--max-size", "0", "--cache-dir", &cache]);
    assert_eq!(o.code, 2, "{o:#?}");
    let help = ctl_raw(&["gc", "--help"]).ok().stdout;
    assert!(
        help.contains("0 is refused") && help.contains("--yes"),
        "{help}"
    );
}

#[test]
fn hit_and_miss_counters_survive_a_restart() {
    let mut d = Daemon::in_process();
    let model = write_model(&d.path("work/m.onnx"), 24);
    d.json(&["resolve", &model]);
    d.json(&["prepack", &model, "--wait"]);
    d.json(&["resolve", &model]);
    let before = d.json(&["status"]);
    let counts = |s: &Value| (s["hits"].as_u64().unwrap(), s["misses"].as_u64().unwrap());
    let (hits, misses) = counts(&before);
    assert!(hits > 0 && misses > 0, "{before}");
    d.restart();
    let after = d.json(&["status"]);
    assert_eq!(counts(&after), (hits, misses), "{after}");
    d.stop();
}
