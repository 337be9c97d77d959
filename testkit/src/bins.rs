//! Where cargo left the workspace's binaries.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Result};

/// The built binary `name` (e.g. `ctcached`) of cargo profile dir `profile`
/// (`debug`, `release`), for a test or bench of another package (binaries of
/// other packages have no `CARGO_BIN_EXE_` variable). The first file of:
/// `$CTCACHE_BIN_DIR/NAME`; beside the running test or bench (which lives in
/// `<target>/<profile>/deps/`); `$CARGO_TARGET_DIR/PROFILE/NAME`;
/// `target/PROFILE/NAME` of the workspace; `/var/tmp/ctcache-target/PROFILE/NAME`.
pub fn locate_bin(name: &str, profile: &str) -> Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(d) = std::env::var_os("CTCACHE_BIN_DIR") {
        candidates.push(PathBuf::from(d).join(name));
    }
    if let Some(dir) = std::env::current_exe()?.parent().and_then(Path::parent) {
        candidates.push(dir.join(name));
    }
    let in_profile = |target: PathBuf| target.join(profile).join(name);
    if let Some(d) = std::env::var_os("CARGO_TARGET_DIR") {
        candidates.push(in_profile(PathBuf::from(d)));
    }
    candidates.push(in_profile(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    ));
    candidates.push(in_profile(PathBuf::from("/var/tmp/ctcache-target")));
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let release = if profile == "release" {
                " --release"
            } else {
                ""
            };
            anyhow!(
                "{name} is missing ({candidates:?}): run `cargo build{release} --bin {name}` first"
            )
        })
}
