//! Damage to a store's payload files, as disk rot would do it: for tests
//! that check rotted bytes are never served.

use std::path::Path;

/// Flips the first byte of the payload file at `path`, keeping its length
/// (the store keeps payload files read-only; this makes it writable first).
pub fn rot_payload(path: impl AsRef<Path>) {
    let path = path.as_ref();
    let mut bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(!bytes.is_empty(), "{}: an empty payload", path.display());
    bytes[0] ^= 0xff;
    let mut perm = std::fs::metadata(path).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perm.set_readonly(false);
    std::fs::set_permissions(path, perm).unwrap();
    std::fs::write(path, &bytes).unwrap();
}

/// Whether the file at `path` is there and its bytes hash to `blake3_hex`.
pub fn payload_intact(path: impl AsRef<Path>, blake3_hex: &str) -> bool {
    std::fs::read(path)
        .map(|b| blake3::hash(&b).to_hex().as_str() == blake3_hex)
        .unwrap_or(false)
}

/// Every path under `dir` (folders and files, at any depth), sorted: what a
/// test compares to say that nothing was written.
pub fn paths_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("a readable folder") {
            let p = e.expect("a folder entry").path();
            if p.is_dir() {
                todo.push(p.clone());
            }
            all.push(p);
        }
    }
    all.sort();
    all
}
