//! The cache dir on disk and who owns it:
//!
//! ```text
//! <cache>/LAYOUT          "ctcache-store-layout <N>": the layout version
//! <cache>/LOCK            flock'ed by the owning process, holds its pid
//! <cache>/CLEAN           present while no owner holds the dir and the last
//!                         one closed it cleanly (its index flushed)
//! <cache>/NAMEKEY         the secret payload file names are tagged with
//!                         (0600: the owner's alone)
//! <cache>/index/          the index (sled): a view of records/, rebuilt from
//!                         it when damaged (D13)
//! <cache>/records/<key hex>  one entry record per file, beside its payload
//! <cache>/blobs/<2 hex>/<blake3 hex>.<tag>   payload files, immutable,
//!                         mode 0444; the tag is 128 bits of blake3's keyed
//!                         hash of the digest under NAMEKEY, so knowing a
//!                         payload's digest does not name its file
//! <cache>/tmp/            payloads being written; emptied at start-up
//! <cache>/quarantine/     payload files that failed verification
//! ```
//!
//! Layout 2 added records/ (filled from the index at the first open);
//! layout 3 tagged the payload file names (NAMEKEY).
//! A dir of a newer layout is refused; an older one is migrated step by step
//! (each step idempotent, LAYOUT rewritten last, so an interrupted migration
//! simply runs again).

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use super::error::{StoreError, StoreResult};

/// The layout this build writes.
pub const LAYOUT_VERSION: u32 = 3;
const LAYOUT_MAGIC: &str = "ctcache-store-layout";
/// Names a store dir may hold; a dir without LAYOUT holding anything else is
/// not taken over (someone pointed the cache at a folder in use).
const OWN_NAMES: [&str; 9] = [
    "LAYOUT",
    "LOCK",
    "CLEAN",
    "NAMEKEY",
    "index",
    "blobs",
    "records",
    "tmp",
    "quarantine",
];

/// The secret payload file names are tagged with: a name is
/// `<blake3 hex>.<tag hex>`, the tag the first 128 bits of blake3's keyed
/// hash of the digest. The payload folders cannot be listed, so a file is
/// reached only by the name the daemon hands out after its checks; a
/// digest alone (known from a model, or guessed) does not open it.
#[derive(Clone)]
pub(crate) struct NameKey([u8; 32]);

impl std::fmt::Debug for NameKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NameKey(..)")
    }
}

impl NameKey {
    fn tag(&self, blob: &[u8; 32]) -> String {
        hex::encode(&blake3::keyed_hash(&self.0, blob).as_bytes()[..16])
    }

    /// The file name of the payload `blob`.
    fn name(&self, blob: &[u8; 32]) -> String {
        format!("{}.{}", hex::encode(blob), self.tag(blob))
    }

    /// The payload a file name is the name of, when its tag is right.
    pub(crate) fn parse(&self, name: &str) -> Option<[u8; 32]> {
        let (digest, tag) = name.split_once('.')?;
        let blob = parse_plain_name(digest)?;
        (tag == self.tag(&blob)).then_some(blob)
    }
}

/// Paths inside a cache dir.
#[derive(Debug, Clone)]
pub(crate) struct Paths {
    pub root: PathBuf,
    pub index: PathBuf,
    pub blobs: PathBuf,
    pub records: PathBuf,
    pub tmp: PathBuf,
    pub quarantine: PathBuf,
    /// How payload files are named.
    pub names: NameKey,
}

impl Paths {
    fn new(root: &Path, names: NameKey) -> Paths {
        Paths {
            root: root.to_path_buf(),
            index: root.join("index"),
            blobs: root.join("blobs"),
            records: root.join("records"),
            tmp: root.join("tmp"),
            quarantine: root.join("quarantine"),
            names,
        }
    }

    pub fn shard(&self, blob: &[u8; 32]) -> PathBuf {
        self.blobs.join(hex::encode(&blob[..1]))
    }

    pub fn blob(&self, blob: &[u8; 32]) -> PathBuf {
        self.shard(blob).join(self.names.name(blob))
    }
}

/// The name key of the dir at `root`, made when it has none yet.
fn name_key(root: &Path) -> StoreResult<NameKey> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = root.join("NAMEKEY");
    let bad = |detail: String| StoreError::BadLayout {
        dir: root.to_path_buf(),
        detail,
    };
    match fs::read_to_string(&path) {
        Ok(text) => {
            let mut key = [0u8; 32];
            hex::decode_to_slice(text.trim(), &mut key)
                .map_err(|e| bad(format!("NAMEKEY is not 64 hex digits: {e}")))?;
            return Ok(NameKey(key));
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(StoreError::io("read", &path, e)),
    }
    let mut key = [0u8; 32];
    crate::fsutil::fill_random(&mut key).map_err(|e| StoreError::io("make", &path, e))?;
    // Written whole before it is used, never replaced (a payload named
    // under a key that changed would be lost).
    let temp = root.join(".NAMEKEY.new");
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        writeln!(f, "{}", hex::encode(key))?;
        f.sync_all()?;
        fs::hard_link(&temp, &path)?;
        fs::remove_file(&temp)?;
        crate::fsutil::sync_dir(root)
    })();
    match written {
        Ok(()) => Ok(NameKey(key)),
        // Made meanwhile (no other owner holds the lock; a crash left it).
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let _ = fs::remove_file(&temp);
            name_key(root)
        }
        Err(e) => Err(StoreError::io("write", &path, e)),
    }
}

/// The exclusive hold on a cache dir: an flock on `LOCK`, released when the
/// file closes (also when the process dies, so a crash never leaves it held).
#[derive(Debug)]
pub(crate) struct DirLock {
    _file: File,
}

/// How long a lock this process's own pid holds is waited for (see [`lock`]).
const OWN_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

pub(crate) fn lock(root: &Path) -> StoreResult<DirLock> {
    let path = root.join("LOCK");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| StoreError::io("open", &path, e))?;
    let started = std::time::Instant::now();
    loop {
        // SAFETY: flock on a descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            break;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::WouldBlock {
            return Err(StoreError::io("lock", &path, e));
        }
        let mut s = String::new();
        file.rewind().ok();
        let _ = file.read_to_string(&mut s);
        let pid = s.trim().parse().ok();
        // A store of this process closed its LOCK while another thread was
        // starting a program: the child holds a copy of the descriptor, and
        // so the lock, until its exec closes it. Wait that out.
        if pid != Some(std::process::id()) || started.elapsed() >= OWN_LOCK_WAIT {
            return Err(StoreError::Locked {
                dir: root.to_path_buf(),
                pid,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Only the holder writes, so a reader that fails to lock sees our pid.
    let w = (|| {
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())
    })();
    w.map_err(|e| StoreError::io("write", &path, e))?;
    Ok(DirLock { _file: file })
}

fn parse_layout(root: &Path, text: &str) -> StoreResult<u32> {
    let bad = || StoreError::BadLayout {
        dir: root.to_path_buf(),
        detail: format!("expected \"{LAYOUT_MAGIC} <version>\", found {text:?}"),
    };
    let mut words = text.split_whitespace();
    if words.next() != Some(LAYOUT_MAGIC) {
        return Err(bad());
    }
    words.next().and_then(|v| v.parse().ok()).ok_or_else(bad)
}

fn write_layout(root: &Path, version: u32) -> StoreResult<()> {
    let path = root.join("LAYOUT");
    crate::fsutil::atomic_write(&path, |w| writeln!(w, "{LAYOUT_MAGIC} {version}")).map_err(|e| {
        match e {
            crate::Error::Io { path, source, .. } => StoreError::io("write", path, source),
            other => StoreError::BadLayout {
                dir: root.to_path_buf(),
                detail: other.to_string(),
            },
        }
    })
}

/// The store's folders as only its owner may see them, whatever the umask
/// it was made under: the index, the records (whose names are entry keys
/// and whose contents name models), temp files and quarantine are the
/// owner's alone; payload folders can be searched but not listed, so a
/// payload file is reached only by its name (its digest and a tag no one
/// computes without NAMEKEY, see [`NameKey`]), which the daemon hands out
/// after its checks. A non-owner opening the
/// store (a read-only tool) leaves the modes as they are.
pub(crate) fn restrict(paths: &Paths) -> StoreResult<()> {
    for d in [&paths.index, &paths.records, &paths.tmp, &paths.quarantine] {
        chmod(d, 0o700)?;
    }
    chmod(&paths.blobs, 0o711)?;
    for b in 0..=255u8 {
        chmod(&paths.blobs.join(hex::encode([b])), 0o711)?;
    }
    Ok(())
}

fn chmod(p: &Path, mode: u32) -> StoreResult<()> {
    use std::os::unix::fs::PermissionsExt;
    match fs::set_permissions(p, fs::Permissions::from_mode(mode)) {
        Err(e) if !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::PermissionDenied) => {
            Err(StoreError::io("chmod", p, e))
        }
        _ => Ok(()),
    }
}

fn mkdir(p: &Path) -> StoreResult<()> {
    match fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::io("create", p, e)),
    }
}

/// Checks, migrates or creates the layout; returns the dir's paths and the
/// version found (`None` for a new dir). Runs under the dir lock.
pub(crate) fn prepare(root: &Path) -> StoreResult<(Paths, Option<u32>)> {
    remove_layout_temps(root)?;
    let layout = root.join("LAYOUT");
    let found = match fs::read_to_string(&layout) {
        Ok(t) => Some(parse_layout(root, &t)?),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => return Err(StoreError::io("read", &layout, e)),
    };
    match found {
        Some(v) if v > LAYOUT_VERSION => {
            return Err(StoreError::NewerLayout {
                dir: root.to_path_buf(),
                found: v,
                supported: LAYOUT_VERSION,
            })
        }
        Some(_) => {}
        None => refuse_foreign(root)?,
    }
    let paths = Paths::new(root, name_key(root)?);
    for from in found.unwrap_or(LAYOUT_VERSION)..LAYOUT_VERSION {
        migrate_step(&paths, from)?;
    }
    for d in [&paths.blobs, &paths.records, &paths.tmp, &paths.quarantine] {
        mkdir(d)?;
    }
    // All 256 shards up front: publishing never creates (and fsyncs) a folder.
    for b in 0..=255u8 {
        mkdir(&paths.blobs.join(hex::encode([b])))?;
    }
    if found != Some(LAYOUT_VERSION) {
        crate::fsutil::sync_dir(&paths.blobs)
            .map_err(|e| StoreError::io("sync", &paths.blobs, e))?;
        write_layout(root, LAYOUT_VERSION)?;
    }
    Ok((paths, found))
}

/// Removes the temp files of LAYOUT and NAMEKEY writes a crash interrupted
/// (a first start killed before its rename left the new dir holding only
/// that, which then read as a folder in use).
fn remove_layout_temps(root: &Path) -> StoreResult<()> {
    let rd = fs::read_dir(root).map_err(|e| StoreError::io("list", root, e))?;
    for e in rd {
        let e = e.map_err(|e| StoreError::io("list", root, e))?;
        let name = e.file_name();
        if is_layout_temp(&name.to_string_lossy()) || name == ".NAMEKEY.new" {
            let p = e.path();
            fs::remove_file(&p).map_err(|e| StoreError::io("remove", &p, e))?;
        }
    }
    Ok(())
}

/// `.LAYOUT.tmp-` and 16 hex digits: the temp name of `atomic_write`.
fn is_layout_temp(name: &str) -> bool {
    name.strip_prefix(".LAYOUT.tmp-")
        .is_some_and(|r| r.len() == 16 && r.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn refuse_foreign(root: &Path) -> StoreResult<()> {
    let rd = fs::read_dir(root).map_err(|e| StoreError::io("list", root, e))?;
    for e in rd {
        let e = e.map_err(|e| StoreError::io("list", root, e))?;
        let name = e.file_name();
        // A socket holds no data: the daemon's own socket lives in the
        // cache dir by default (D8) and may be bound before the store opens.
        let socket = e.file_type().is_ok_and(|t| {
            use std::os::unix::fs::FileTypeExt;
            t.is_socket()
        });
        if !socket && !OWN_NAMES.iter().any(|n| name == *n) {
            return Err(StoreError::BadLayout {
                dir: root.to_path_buf(),
                detail: format!(
                    "no LAYOUT file and the dir holds {:?}; refusing to turn a folder in use \
                     into a cache (point the cache at an empty or new dir)",
                    name
                ),
            });
        }
    }
    Ok(())
}

/// One migration step from layout `from` to `from + 1`.
fn migrate_step(paths: &Paths, from: u32) -> StoreResult<()> {
    match from {
        // Layout 0 (pre-release) kept payload files flat in blobs/<hex>;
        // layout 1 shards them by their first byte.
        0 => {
            mkdir(&paths.blobs)?;
            let rd =
                fs::read_dir(&paths.blobs).map_err(|e| StoreError::io("list", &paths.blobs, e))?;
            for e in rd {
                let e = e.map_err(|e| StoreError::io("list", &paths.blobs, e))?;
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(blob) = parse_plain_name(&name) else {
                    continue;
                };
                let shard = paths.shard(&blob);
                mkdir(&shard)?;
                let to = shard.join(&name);
                fs::rename(e.path(), &to).map_err(|err| StoreError::io("move", e.path(), err))?;
            }
            Ok(())
        }
        // Layout 2 keeps entry records beside the payloads: the folder is
        // made here, and the first open's record sync fills it from the index.
        1 => mkdir(&paths.records),
        // Layout 3 tags the payload file names: each file of a plain name
        // is renamed in its shard.
        2 => {
            for b in 0..=255u8 {
                let shard = paths.blobs.join(hex::encode([b]));
                let rd = match fs::read_dir(&shard) {
                    Ok(rd) => rd,
                    Err(e) if e.kind() == ErrorKind::NotFound => continue,
                    Err(e) => return Err(StoreError::io("list", &shard, e)),
                };
                for e in rd {
                    let e = e.map_err(|e| StoreError::io("list", &shard, e))?;
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(blob) = parse_plain_name(&name) {
                        let to = paths.blob(&blob);
                        fs::rename(e.path(), &to)
                            .map_err(|err| StoreError::io("move", e.path(), err))?;
                    }
                }
            }
            Ok(())
        }
        _ => Err(StoreError::BadLayout {
            dir: paths.root.clone(),
            detail: format!("no migration from layout {from}"),
        }),
    }
}

/// Takes the mark the last owner left when it closed the dir cleanly;
/// returns whether it was there. Taken durably before the new owner
/// changes anything, so a crash of this owner is never taken for a clean
/// close.
pub(crate) fn take_clean_mark(paths: &Paths) -> StoreResult<bool> {
    let mark = paths.root.join("CLEAN");
    match fs::remove_file(&mark) {
        Ok(()) => {
            crate::fsutil::sync_dir(&paths.root)
                .map_err(|e| StoreError::io("sync", &paths.root, e))?;
            Ok(true)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(StoreError::io("remove", &mark, e)),
    }
}

/// Leaves the mark of a clean close (best effort: without it the next
/// open only does more work).
pub(crate) fn set_clean_mark(paths: &Paths) {
    if File::create(paths.root.join("CLEAN")).is_ok() {
        let _ = crate::fsutil::sync_dir(&paths.root);
    }
}

/// A payload digest as layouts before 3 named files: 64 lowercase hex
/// digits.
fn parse_plain_name(name: &str) -> Option<[u8; 32]> {
    if name.len() != 64 || name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(name, &mut out).ok()?;
    Some(out)
}

/// Removes everything in tmp/: nothing there survives its writer, and the
/// writer was a previous owner of the dir. Proportional to the number of
/// leftovers, not to the number of entries.
pub(crate) fn clean_tmp(paths: &Paths) -> StoreResult<usize> {
    let mut n = 0;
    let rd = fs::read_dir(&paths.tmp).map_err(|e| StoreError::io("list", &paths.tmp, e))?;
    for e in rd {
        let e = e.map_err(|e| StoreError::io("list", &paths.tmp, e))?;
        let p = e.path();
        let r = if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            fs::remove_dir_all(&p)
        } else {
            fs::remove_file(&p)
        };
        match r {
            Ok(()) => n += 1,
            Err(err) if err.kind() == ErrorKind::NotFound => {}
            Err(err) => return Err(StoreError::io("remove", &p, err)),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_text() {
        let d = Path::new("/x");
        assert_eq!(parse_layout(d, "ctcache-store-layout 1\n").unwrap(), 1);
        assert!(parse_layout(d, "something 1").is_err());
        assert!(parse_layout(d, "ctcache-store-layout x").is_err());
    }

    #[test]
    fn blob_names() {
        let h = [0xabu8; 32];
        assert_eq!(parse_plain_name(&hex::encode(h)), Some(h));
        assert_eq!(parse_plain_name(&hex::encode(h).to_uppercase()), None);
        assert_eq!(parse_plain_name("ab"), None);
        let d = tempfile::tempdir().unwrap();
        let (p, _) = prepare(d.path()).unwrap();
        let name = p.blob(&h).file_name().unwrap().to_str().unwrap().to_owned();
        assert_eq!(name.len(), 64 + 1 + 32);
        assert_eq!(p.names.parse(&name), Some(h));
        // The digest alone, or another key's tag, names no payload.
        assert_eq!(p.names.parse(&hex::encode(h)), None);
        let other = tempfile::tempdir().unwrap();
        let (q, _) = prepare(other.path()).unwrap();
        assert_ne!(q.blob(&h).file_name(), p.blob(&h).file_name());
        assert_eq!(q.names.parse(&name), None);
        // The key is the dir's: opened again, the same names.
        let (again, _) = prepare(d.path()).unwrap();
        assert_eq!(again.blob(&h), p.blob(&h));
        let key = d.path().join("NAMEKEY");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(key).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// A layout 2 dir's payload files are renamed to their tagged names.
    #[test]
    fn layout_2_payload_names_are_tagged() {
        let d = tempfile::tempdir().unwrap();
        let h = [0x5au8; 32];
        let shard = d.path().join("blobs").join("5a");
        fs::create_dir_all(&shard).unwrap();
        fs::write(shard.join(hex::encode(h)), b"payload").unwrap();
        fs::write(d.path().join("LAYOUT"), "ctcache-store-layout 2\n").unwrap();
        let (p, found) = prepare(d.path()).unwrap();
        assert_eq!(found, Some(2));
        assert_eq!(fs::read(p.blob(&h)).unwrap(), b"payload");
        assert!(!shard.join(hex::encode(h)).exists());
    }

    #[test]
    fn foreign_dir_is_refused_and_lock_is_exclusive() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("notes.txt"), "mine").unwrap();
        assert!(matches!(
            prepare(d.path()),
            Err(StoreError::BadLayout { .. })
        ));
        let e = tempfile::tempdir().unwrap();
        let l = lock(e.path()).unwrap();
        match lock(e.path()) {
            Err(StoreError::Locked { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(l);
        lock(e.path()).unwrap();
    }
}
