//! ARCHITECTURE.md's rule, for every crate of the workspace: no module
//! imports a module that imports it back, directly or through others
//! (`architecture/module_graph.rs` reads the sources); the daemon's
//! top-level modules, its layers, point one way too. Each test also names
//! edges the reader must find, grouped imports among them.

#[path = "architecture/module_graph.rs"]
mod module_graph;

use std::path::{Path, PathBuf};

use module_graph::assert_one_way;

fn src(crate_dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(crate_dir)
        .join("src")
}

#[test]
fn the_cores_modules_import_one_way() {
    assert_one_way(&src("."), false, &[("store::open", "store::sled_index")]);
}

#[test]
fn the_daemons_modules_and_layers_import_one_way() {
    // `use super::{blocking, serve, Result}`: a grouped import.
    assert_one_way(
        &src("daemon"),
        true,
        &[("ops::embed", "ops::serve"), ("ops::embed", "ops")],
    );
}

#[test]
fn ctcachectls_modules_import_one_way() {
    assert_one_way(&src("client/ctl"), false, &[("materialize::bar", "jobs")]);
}

#[test]
fn the_kernels_modules_import_one_way() {
    // `use crate::{OutputBuffer, ..}` names the crate root, which does not
    // count; `use crate::{catalogue, find}` neither.
    assert_one_way(
        &src("kernels"),
        false,
        &[("formats::cast", "formats::elementwise")],
    );
}

#[test]
fn the_other_crates_modules_import_one_way() {
    for krate in [
        "client", "files", "remote", "proto", "convert", "format", "testkit",
    ] {
        assert_one_way(&src(krate), false, &[]);
    }
}
