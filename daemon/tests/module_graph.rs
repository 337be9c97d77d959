//! ARCHITECTURE.md's rule for the daemon's modules: `use` edges only point
//! down, so no top-level module of `daemon/src` names a module that names
//! it back, directly or through others. Read from the sources: every
//! `crate::<module>` outside comments is an edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`ops` for
/// `ops/pack.rs`); `None` for the crate roots.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.trim_end_matches(".rs");
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// Top-level module -> the modules it names, with a file that does.
fn edges(src: &Path) -> BTreeMap<String, BTreeMap<String, PathBuf>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut out: BTreeMap<String, BTreeMap<String, PathBuf>> = BTreeMap::new();
    for f in files {
        let Some(from) = module_of(src, &f) else {
            continue;
        };
        let text = std::fs::read_to_string(&f).unwrap();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (i, _) in line.match_indices("crate::") {
                let to: String = line[i + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                    .collect();
                let preceded = line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_');
                if !to.is_empty() && to != from && !preceded {
                    out.entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_insert_with(|| f.clone());
                }
            }
        }
    }
    out
}

/// The modules reachable from `from`.
fn reach(g: &BTreeMap<String, BTreeMap<String, PathBuf>>, from: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![from.to_string()];
    while let Some(m) = todo.pop() {
        for next in g.get(&m).into_iter().flat_map(|e| e.keys()) {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}

#[test]
fn the_daemons_modules_name_each_other_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = edges(&src);
    assert!(g.contains_key("ops") && g.contains_key("rpc"), "{g:?}");
    let mut cycles = Vec::new();
    for (from, tos) in &g {
        for (to, file) in tos {
            if reach(&g, to).contains(from) {
                cycles.push(format!(
                    "{from} -> {to} ({}), and {to} leads back to {from}",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "modules that import each other:\n{}",
        cycles.join("\n")
    );
}
