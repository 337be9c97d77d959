//! Tests of the config.

use super::*;

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
    let e = Config::from_toml("cache_dirr = \"/x\"").unwrap_err();
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
    let flags = Overrides {
        workers: Some(7),
        ..Default::default()
    };
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
