//! ARCHITECTURE.md's rule for every crate's modules: one file is one
//! module, and no module imports a module that imports it back, directly
//! or through others. Read from the sources as text: every path a `use`
//! declaration names (grouped ones, `use crate::{a, b::{c, d}}`, expanded)
//! and every `crate::`, `super::` or `self::` path in code is an edge to
//! the module that defines it; comments are skipped. A re-export (`pub use`)
//! is a module's face, not its use: a name taken through it counts as taken
//! from the module that defines it. The crate root (`lib.rs`, `main.rs`)
//! declares and re-exports, so edges into it and out of it are not counted.
//!
//! Standard library only; `tests/architecture.rs` holds every crate of the
//! workspace to it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside a crate (`ops::pack`); the root is empty.
type Module = String;

/// The crate's modules: module path -> its file.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("a source folder") {
            let p = e.expect("a folder entry").path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src");
        let mut parts: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        if matches!(parts.last().map(String::as_str), Some("mod")) {
            parts.pop();
        }
        if parts.len() == 1 && matches!(parts[0].as_str(), "lib" | "main") {
            parts.clear();
        }
        out.insert(parts.join("::"), f);
    }
    out
}

/// `text` without comments (line comments and `/* */` blocks) and without
/// the contents of string literals.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    let (mut in_str, mut block) = (false, 0usize);
    while let Some(c) = chars.next() {
        match (c, chars.peek().copied()) {
            _ if block > 0 => {
                if c == '*' && chars.peek() == Some(&'/') {
                    chars.next();
                    block -= 1;
                } else if c == '/' && chars.peek() == Some(&'*') {
                    chars.next();
                    block += 1;
                }
            }
            ('\\', _) if in_str => {
                chars.next();
            }
            ('"', _) => {
                in_str = !in_str;
                out.push('"');
            }
            _ if in_str => {}
            ('/', Some('/')) => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            ('/', Some('*')) => {
                chars.next();
                block += 1;
            }
            // A char literal of a quote would open a string above.
            ('\'', Some('"')) => {
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}

/// The paths a `use` tree names, braces expanded (`a::{b, c::d}` ->
/// `a::b`, `a::c::d`); renames and globs keep their path.
fn expand(tree: &str) -> Vec<String> {
    let tree = without_renames(tree);
    let Some(open) = tree.find('{') else {
        return vec![tree.trim_end_matches("::*").to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    // Split the group at its top-level commas.
    let (mut items, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|i| !i.is_empty())
        .flat_map(|i| match i {
            "self" => vec![prefix.trim_end_matches("::").to_string()],
            _ => expand(i)
                .into_iter()
                .map(|p| format!("{prefix}{p}"))
                .collect(),
        })
        .collect()
}

/// A `use` tree without whitespace and without its renames (`a as b`).
fn without_renames(tree: &str) -> String {
    let mut out = String::new();
    let mut words = tree.split_whitespace();
    while let Some(w) = words.next() {
        if w == "as" {
            // The new name goes; what follows it (`,` `}`) stays.
            let next = words.next().unwrap_or_default();
            out.extend(
                next.chars()
                    .skip_while(|c| c.is_alphanumeric() || *c == '_'),
            );
        } else {
            out.push_str(w);
        }
    }
    out
}

/// The module of this crate that `path` (as written in module `from`)
/// names, its longest prefix that is a module, and the segments after it;
/// `None` for another crate's.
fn resolve<'p>(
    path: &'p str,
    from: &str,
    mods: &BTreeMap<Module, PathBuf>,
) -> Option<(Module, Vec<&'p str>)> {
    let mut segs: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
    let mut base: Vec<&str> = from.split("::").filter(|s| !s.is_empty()).collect();
    match segs.first().copied() {
        Some("crate") => {
            base.clear();
            segs.remove(0);
        }
        Some("super") => {
            while segs.first() == Some(&"super") {
                segs.remove(0);
                base.pop();
            }
        }
        Some("self") => {
            segs.remove(0);
        }
        // A child module named without `self::` (2018 paths); anything else
        // is another crate.
        Some(first) if mods.contains_key(&join(from, first)) => {}
        _ => return None,
    }
    let mut best = (base.join("::"), 0);
    let mut cur = base;
    for (n, s) in segs.iter().enumerate() {
        cur.push(s);
        let m = cur.join("::");
        if mods.contains_key(&m) {
            best = (m, n + 1);
        }
    }
    Some((best.0, segs[best.1..].to_vec()))
}

fn join(module: &str, name: &str) -> String {
    match module.is_empty() {
        true => name.to_string(),
        false => format!("{module}::{name}"),
    }
}

/// One module's source, read: the paths it names (with their lines) and
/// the names it re-exports (`pub use a::B;`: `B` -> `a::B`).
struct Read {
    paths: Vec<(String, usize)>,
    reexports: BTreeMap<String, String>,
}

fn read(file: &Path) -> Read {
    let text = code_of(&std::fs::read_to_string(file).expect("a source file"));
    let code = without_inline_tests(&text);
    let mut r = Read {
        paths: Vec::new(),
        reexports: BTreeMap::new(),
    };
    // `use` declarations, which may span lines.
    let mut rest = code;
    while let Some(i) = find_use(rest) {
        let at = code.len() - rest.len() + i;
        let line = code[..at].lines().count().max(1);
        let public = is_pub(&code[..at]);
        let stmt = &rest[i + 4..];
        let end = stmt.find(';').unwrap_or(stmt.len());
        for p in expand(&stmt[..end]) {
            // A re-export is the module's face, not its use: whoever names
            // the name through it is led to where it is defined.
            if public {
                let name = p.rsplit("::").next().unwrap_or_default().to_string();
                r.reexports.insert(name, p);
            } else {
                r.paths.push((p, line));
            }
        }
        rest = &stmt[end..];
    }
    // Paths in code.
    for (n, line) in code.lines().enumerate() {
        for prefix in ["crate::", "super::", "self::"] {
            for (i, _) in line.match_indices(prefix) {
                if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                let p: String = line[i..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                // `super::{a, b}` is a `use` tree, read above.
                if !p.ends_with("::") {
                    r.paths.push((p, n + 1));
                }
            }
        }
    }
    r
}

/// Whether the `use` that `before` ends at is public (`pub`, `pub(crate)`).
fn is_pub(before: &str) -> bool {
    let b = before.trim_end();
    b.ends_with("pub") || (b.ends_with(')') && b.rfind("pub(").is_some_and(|i| b.len() - i < 24))
}

/// The module that defines what `path` names: a name a module re-exports
/// is followed to where it comes from.
fn defining(
    path: &str,
    from: &str,
    mods: &BTreeMap<Module, PathBuf>,
    reads: &BTreeMap<Module, Read>,
    depth: usize,
) -> Option<Module> {
    let (m, rest) = resolve(path, from, mods)?;
    let via = rest
        .first()
        .and_then(|name| reads.get(&m)?.reexports.get(*name))
        .filter(|_| depth < 8);
    match via.and_then(|p| defining(p, &m, mods, reads, depth + 1)) {
        Some(d) if d != m => Some(d),
        _ => Some(m),
    }
}

/// Module -> the modules it names, each with the first line that does.
fn edges(src: &Path) -> BTreeMap<Module, BTreeMap<Module, usize>> {
    let mods = modules(src);
    let reads: BTreeMap<Module, Read> = mods.iter().map(|(m, f)| (m.clone(), read(f))).collect();
    let mut out: BTreeMap<Module, BTreeMap<Module, usize>> = BTreeMap::new();
    for (from, r) in &reads {
        if from.is_empty() {
            continue;
        }
        for (p, line) in &r.paths {
            match defining(p, from, &mods, &reads, 0) {
                Some(to) if !to.is_empty() && &to != from => {
                    out.entry(from.clone())
                        .or_default()
                        .entry(to)
                        .or_insert(*line);
                }
                _ => {}
            }
        }
    }
    out
}

/// `code` up to its inline test module (`#[cfg(test)] mod tests { .. }`),
/// whose `super` is the file itself and which is no part of the design.
fn without_inline_tests(code: &str) -> &str {
    let mut from = 0;
    while let Some(i) = code[from..].find("#[cfg(test)]") {
        let at = from + i;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        if let Some(decl) = rest.strip_prefix("mod ") {
            let brace = decl.find('{');
            if brace.is_some_and(|b| decl.find(';').is_none_or(|semi| b < semi)) {
                return &code[..at];
            }
        }
        from = at + 1;
    }
    code
}

/// The start of the next `use` declaration in `code` (after `use `).
fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = code[from..].find("use ") {
        let at = from + i;
        let before = code[..at].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == '}' || c == ')')
        {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// Every edge of a circle in the crate under `src`, worded for a failure:
/// `a -> b (file:line), and b leads back to a`. With `top_level`, modules
/// are taken whole (`ops::pack` counts as `ops`): the daemon's layers.
pub fn circles(src: &Path, top_level: bool) -> Vec<String> {
    let mods = modules(src);
    let top = |m: &str| match top_level {
        true => m.split("::").next().unwrap_or_default().to_string(),
        false => m.to_string(),
    };
    // Module -> module -> where the edge is written.
    let mut g: BTreeMap<Module, BTreeMap<Module, String>> = BTreeMap::new();
    for (from, tos) in edges(src) {
        for (to, line) in tos {
            if top(&from) != top(&to) {
                let file = mods[&from]
                    .strip_prefix(src)
                    .unwrap_or(&mods[&from])
                    .display()
                    .to_string();
                g.entry(top(&from))
                    .or_default()
                    .entry(top(&to))
                    .or_insert(format!("{file}:{line}"));
            }
        }
    }
    let reach = |from: &str| {
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
    };
    let mut out = Vec::new();
    for (from, tos) in &g {
        for (to, at) in tos {
            if reach(to).contains(from) {
                out.push(format!(
                    "{from} -> {to} ({at}), and {to} leads back to {from}"
                ));
            }
        }
    }
    out
}

/// Fails, listing them, when the crate under `src` has circles (of files;
/// of top-level modules too with `top_level`). `expect` names edges that
/// must be seen: a reader that found nothing would prove nothing.
pub fn assert_one_way(src: &Path, top_level: bool, expect: &[(&str, &str)]) {
    let g = edges(src);
    for (from, to) in expect {
        assert!(
            g.get(*from).is_some_and(|t| t.contains_key(*to)),
            "the reader missed {from} -> {to} in {}",
            src.display()
        );
    }
    let mut found = circles(src, false);
    if top_level {
        found.extend(circles(src, true));
    }
    assert!(
        found.is_empty(),
        "modules of {} that import each other:\n{}",
        src.display(),
        found.join("\n")
    );
}
