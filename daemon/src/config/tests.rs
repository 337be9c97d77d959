//! Tests of the config.

use super::*;
use std::collections::BTreeMap;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

#[test]
fn d8_defaults() {
    let (c, s) = default_paths(&env_of(&[
        ("HOME", "/home/u"),
        ("XDG_RUNTIME_DIR", "/run/user/1"),
    ]));
    assert_eq!(c, Path::new("/home/u/.cache/ctcache"));
    assert_eq!(s, Path::new("/run/user/1/ctcache/ctcached.sock"));
    let (c, s) = default_paths(&env_of(&[("XDG_CACHE_HOME", "/x")]));
    assert_eq!(c, Path::new("/x/ctcache"));
    assert_eq!(s, Path::new("/x/ctcache/ctcached.sock"));
}

#[test]
fn unknown_key_is_named() {
    let e = Config::from_toml("cache_dirr = \"/x\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("cache_dirr"), "{e}");
}

#[test]
fn precedence_file_env_flags() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "cache_dir = \"/from-file\"\nsocket = \"/file.sock\"\nworkers = 3\n",
    )
    .unwrap();
    let env = env_of(&[("CTCACHE_SOCKET", "/env.sock"), ("CTCACHE_WORKERS", "5")]);
    let flags = Overrides::parse_from(["ctcached", "--workers", "7"]).unwrap();
    let c = Config::load(Some(&f), &env, &flags).unwrap();
    assert_eq!(c.cache_dir, Path::new("/from-file"));
    assert_eq!(c.socket, Path::new("/env.sock"));
    assert_eq!(c.workers, 7);
    let bad = Config::load(
        Some(&f),
        &env_of(&[("CTCACHE_WORKERS", "many")]),
        &Overrides::default(),
    );
    assert!(bad.unwrap_err().to_string().contains("CTCACHE_WORKERS"));
}

#[test]
fn default_config_round_trips() {
    let c = Config::default();
    assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
}

#[test]
fn remote_section_parses_is_checked_and_round_trips() {
    let c = Config::from_toml(
        "[remote]\nurl = \"s3://fleet-bucket/a\"\nendpoint = \"http://127.0.0.1:9000\"\nallow_http = true\nfetch = \"always\"\n",
    )
    .unwrap();
    let r = c.remote.clone().unwrap();
    assert_eq!(r.timeout_ms, 3000);
    assert_eq!(r.upload_queue, 256);
    assert_eq!(r.min_upload_bytes_per_s, 1 << 20);
    assert_eq!(r.fetch, ctcache_remote::config::FetchMode::Always);
    assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
    let e = Config::from_toml("[remote]\nurll = \"s3://b/x\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("urll"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(&f, "[remote]\nurl = \"http://not-s3\"\n").unwrap();
    let e = Config::load(Some(&f), &env_of(&[]), &Overrides::default()).unwrap_err();
    assert!(e.to_string().contains("remote.url"), "{e}");
    let env = env_of(&[("CTCACHE_REMOTE_URL", "s3://from-env/p")]);
    let c = Config::load(None, &env, &Overrides::default()).unwrap();
    assert_eq!(c.remote.unwrap().url, "s3://from-env/p");
}

#[test]
fn tcp_beyond_loopback_needs_tls() {
    let tcp = |addr: &str, tls: &str| {
        Config::from_toml(&format!("listen_tcp = \"{addr}\"\n{tls}"))
            .unwrap()
            .validate()
    };
    tcp("127.0.0.1:7000", "").unwrap();
    tcp("[::1]:7000", "").unwrap();
    let e = tcp("0.0.0.0:7000", "").unwrap_err().to_string();
    assert!(
        e.contains("listen_tcp") && e.contains("not a loopback") && e.contains("tls_cert"),
        "{e}"
    );
    tcp(
        "0.0.0.0:7000",
        "tls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n",
    )
    .unwrap();
    let e = tcp("0.0.0.0:7000", "tls_cert = \"/c.pem\"\n").unwrap_err();
    assert!(e.to_string().contains("tls_key"), "{e}");
    let e = tcp("127.0.0.1:7000", "tls_client_ca = \"/ca.pem\"\n").unwrap_err();
    assert!(e.to_string().contains("tls_client_ca"), "{e}");
}

#[test]
fn bounds_have_safe_defaults_and_refuse_zero() {
    let c = Config::default();
    assert_eq!(c.max_leases_per_uid, 1024);
    assert_eq!(c.max_lease_ttl_secs, 3600);
    assert!(c.payload_limit() <= c.memory_budget);
    c.validate().unwrap();
    // Every bound and budget in the file: 0 is refused, naming the key.
    let defaults = toml::to_string(&c).unwrap();
    let bounds: Vec<&str> = defaults
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
        .filter(|k| k.starts_with("max_") || k.ends_with("_budget") || *k == "request_timeout_secs")
        .collect();
    assert!(bounds.len() >= 17, "{bounds:?}");
    for key in bounds {
        let e = Config::from_toml(&format!("{key} = 0"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    for key in [
        "timeout_ms",
        "min_upload_bytes_per_s",
        "upload_queue",
        "max_object_bytes",
    ] {
        let e = Config::from_toml(&format!("[remote]\nurl = \"s3://models\"\n{key} = 0"))
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(
            e.to_string().contains(&format!("remote.{key}")),
            "{key}: {e}"
        );
    }
}

#[test]
fn remote_flags_override_the_file() {
    use ctcache_remote::config::FetchMode;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(
        &f,
        "[remote]\nurl = \"s3://file-bucket/a\"\ntimeout_ms = 2000\nfetch = \"always\"\ntrusted_keys = [\"a:x\"]\nregion = \"eu-west-1\"\n",
    )
    .unwrap();
    let remote_flags =
        |args: &[&str]| Overrides::parse_from(std::iter::once(&"ctcached").chain(args)).unwrap();
    let given = [
        "--remote-url",
        "s3://flag-bucket/b",
        "--remote-timeout-ms",
        "500",
        "--remote-fetch",
        "never",
        "--remote-read",
        "false",
        "--remote-trusted-key",
        "b:y",
    ];
    let flags = remote_flags(&[&given[..], &["--remote-audit-rate", "0.25"]].concat());
    let env = env_of(&[("CTCACHE_REMOTE_URL", "s3://env-bucket/c")]);
    let r = Config::load(Some(&f), &env, &flags)
        .unwrap()
        .remote
        .unwrap();
    assert_eq!(r.url, "s3://flag-bucket/b");
    assert_eq!(
        (r.timeout_ms, r.fetch, r.read),
        (500, FetchMode::Never, false)
    );
    assert_eq!(r.trusted_keys, ["b:y"]);
    assert_eq!(r.audit_rate, 0.25);
    assert_eq!(
        r.region, "eu-west-1",
        "keys without a flag keep the file's value"
    );
    // Flags alone turn the section on; no flags leave it off.
    let only = Config::load(None, &env_of(&[]), &flags).unwrap();
    assert_eq!(only.remote.unwrap().url, "s3://flag-bucket/b");
    let none = Config::load(None, &env_of(&[]), &Overrides::default()).unwrap();
    assert!(none.remote.is_none());
    // A flag is checked like the file's key.
    let bad = remote_flags(&[&given[..], &["--remote-audit-rate", "1.5"]].concat());
    let e = Config::load(Some(&f), &env, &bad).unwrap_err().to_string();
    assert!(e.contains("remote.audit_rate"), "{e}");
}

/// `gc_max_bytes = 0` once meant "no budget" while `ctcachectl gc
/// --max-size 0` meant "everything": 0 is refused, naming the key, and no
/// budget is the key left out (which `to_toml` leaves out too).
#[test]
fn a_zero_gc_limit_is_refused_naming_the_key() {
    for key in ["gc_max_bytes", "gc_max_age_secs"] {
        let e = Config::from_toml(&format!("{key} = 0\n"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(key) && e.contains("leave the key out"),
            "{key}: {e}"
        );
        let c = Config::from_toml(&format!("{key} = 5\n")).unwrap();
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);
    }
    let none = Config::default().to_toml();
    assert!(!none.contains("gc_max"), "{none}");
}

/// Every key the daemon reads is shown in the example config with its
/// default, and has a row in the key table of docs/operations/configure.md.
#[test]
fn every_key_is_in_the_example_config_and_the_key_table() {
    let example = include_str!("../../../systemd/ctcached.toml");
    let operations = include_str!("../../../docs/operations/configure.md");
    let defaults = Config::default().to_toml();
    let top = defaults.split("\n[").next().unwrap();
    let mut keys: Vec<&str> = top
        .lines()
        .filter_map(|l| l.split_once(" = ").map(|(k, _)| k))
        .collect();
    // The keys that are off or unset by default, which defaults leave out.
    keys.extend([
        "listen_tcp",
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "metrics_addr",
        "ort_library",
        "openvino_library",
        "gc_max_bytes",
        "gc_max_age_secs",
    ]);
    for key in keys {
        assert!(
            example
                .lines()
                .any(|l| l.starts_with(&format!("#{key} = "))),
            "systemd/ctcached.toml does not show {key}"
        );
        assert!(
            operations
                .lines()
                .any(|l| l.starts_with("| `") && l.contains(&format!("`{key}`"))),
            "docs/operations/configure.md has no row for {key}"
        );
    }
    // The [remote] table's keys, after its commented header.
    let remote = Config {
        remote: Some(Box::default()),
        ..Config::default()
    }
    .to_toml();
    let table = remote.split("\n[remote]\n").nth(1).unwrap();
    let table = table.split("\n[").next().unwrap();
    let shown = &example[example.find("#[remote]\n").expect("a [remote] table")..];
    for line in table.lines().filter(|l| l.contains(" = ")) {
        assert!(
            shown.contains(&format!("#{line}\n")),
            "systemd/ctcached.toml does not show [remote] {line:?}"
        );
    }
    assert!(shown.contains("#signing_key_file = "));
    // Paths default by the environment; every other default is shown as is.
    for line in top.lines() {
        if !line.starts_with("cache_dir ") && !line.starts_with("socket ") {
            assert!(
                example.contains(&format!("#{line}\n")),
                "systemd/ctcached.toml shows another default than {line:?}"
            );
        }
    }
}

/// Each `CTCACHE_*` variable is read by its key's type: a list split at
/// `:`, a flag word for a bool, empty unsetting an optional key, a choice
/// checked against the enum's names.
#[test]
fn environment_values_are_read_by_their_keys_types() {
    let file = "listen_tcp = \"127.0.0.1:7000\"\ngpu = true\n";
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("c.toml");
    std::fs::write(&f, file).unwrap();
    let env = env_of(&[
        ("CTCACHE_WATCH", "/m/a:/m/b"),
        ("CTCACHE_GPU", "no"),
        ("CTCACHE_LISTEN_TCP", ""),
        ("CTCACHE_LOG_FORMAT", "json"),
        ("CTCACHE_SOCKET_GROUP", "models"),
    ]);
    let c = Config::load(Some(&f), &env, &Overrides::default()).unwrap();
    assert_eq!(c.watch, [Path::new("/m/a"), Path::new("/m/b")]);
    assert!(!c.gpu);
    assert_eq!(c.listen_tcp, None);
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.socket_group, "models");
    let e = Config::load(
        None,
        &env_of(&[("CTCACHE_LOG_FORMAT", "xml")]),
        &Overrides::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("CTCACHE_LOG_FORMAT") && e.contains("expected auto, human, json or journald"),
        "{e}"
    );
    // Flags win over the environment, a list flag replacing the list.
    let flags =
        Overrides::parse_from(["ctcached", "--watch", "/f", "--log-format", "human"]).unwrap();
    let c = Config::load(Some(&f), &env, &flags).unwrap();
    assert_eq!(c.watch, [Path::new("/f")]);
    assert_eq!(c.log_format, LogFormat::Human);
}

/// The default policy packs what the default materialize target reads (its
/// 4-bit weights, the embedding tables it places) and no format no runtime
/// reads by itself: the SGEMM panels take a rule of the admin's.
#[test]
fn the_default_policy_is_what_the_default_target_reads() {
    let formats: Vec<String> = Config::default()
        .policy
        .iter()
        .map(|r| r.format.clone())
        .collect();
    assert_eq!(formats, ["ort.matmul_nbits", "identity"]);
}

/// A runtime library is an absolute path: the daemon's working directory
/// is nobody's to rely on.
#[test]
fn runtime_libraries_must_be_absolute_paths() {
    for key in ["ort_library", "openvino_library"] {
        let e = Config::from_toml(&format!("{key} = \"libruntime.so\"\n"))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains("not an absolute path"), "{e}");
        Config::from_toml(&format!("{key} = \"/opt/runtime/libruntime.so\"\n"))
            .unwrap()
            .validate()
            .unwrap();
    }
}
