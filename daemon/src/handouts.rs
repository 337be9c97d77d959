//! Handouts: the models callers hand over on the descriptor channel (the
//! model and its data files as the caller opened them, with its rights
//! alone), named by 128 random bits and bound to the uid that sent them. A
//! request naming a handout reads those files and no path. Each uid holds a
//! bounded number of handouts and of handed files; a handout ends when its
//! connection closes.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::locks::lock;

use ctcache::access::Opener;
use ctcache::onnx::Model;
use ctcache::store::LeaseId;
use rustix::fs::OFlags;

use crate::caller::Caller;
use crate::error::{Error, Result};

/// Handouts one uid holds at once (connections of the channel included,
/// from their first byte): a session holds one for its life, so a service
/// may hold a thousand sessions.
pub(crate) const MAX_HANDOUTS_PER_UID: usize = 1024;

/// The data files of one handed model: what its data locations lead to,
/// by location relative to the model's folder. Opening anything else is
/// NotFound: the daemon reads no path of the caller's.
#[derive(Debug)]
pub(crate) struct HandedFiles {
    dir: PathBuf,
    files: Mutex<HashMap<PathBuf, File>>,
}

impl HandedFiles {
    pub fn new(dir: &Path) -> HandedFiles {
        HandedFiles {
            dir: dir.to_path_buf(),
            files: Mutex::default(),
        }
    }

    /// Takes the file handed for `name`.
    pub fn insert(&self, name: PathBuf, file: File) {
        lock(&self.files).insert(name, file);
    }
}

impl Opener for HandedFiles {
    fn open(&self, path: &Path) -> io::Result<File> {
        let not_handed = || {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: not handed over by the caller", path.display()),
            )
        };
        let name = path.strip_prefix(&self.dir).map_err(|_| not_handed())?;
        lock(&self.files)
            .get(name)
            .ok_or_else(not_handed)?
            .try_clone()
    }

    fn confines(&self) -> bool {
        false
    }
}

/// A received descriptor as a file the daemon may read: a regular file
/// open for reading, not an O_PATH handle (a FIFO would hang a read, a
/// device would never end).
pub(crate) fn readable_file(fd: OwnedFd, name: &str) -> Result<File> {
    let refuse = |why: &str| Error::invalid(format!("{name}: {why}"));
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| refuse(&e.to_string()))?;
    if flags.contains(OFlags::PATH) {
        return Err(refuse(
            "an O_PATH descriptor cannot be read; open the file itself",
        ));
    }
    if flags & OFlags::RWMODE == OFlags::WRONLY {
        return Err(refuse("the descriptor is not open for reading"));
    }
    let st = rustix::fs::fstat(&fd).map_err(|e| refuse(&e.to_string()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(refuse("not a regular file"));
    }
    Ok(File::from(fd))
}

/// Files a caller made for a request's output and handed over with its
/// model: the daemon writes into them and opens no output path.
#[derive(Debug)]
pub(crate) struct Outputs {
    /// The output's folder, open for reading (what beside it the request
    /// needs is looked for through it).
    pub folder: File,
    /// The output model and its sidecar: empty files open for writing.
    pub model: File,
    pub sidecar: File,
}

/// The outputs an Embed hands over, one descriptor each in `names`' order;
/// `None` when none are.
pub(crate) fn outputs(names: &[String], fds: Vec<OwnedFd>) -> Result<Option<Outputs>> {
    if names.is_empty() {
        return Ok(None);
    }
    let expected = ["folder", "model", "sidecar"];
    if names.len() != expected.len() || expected.iter().any(|e| !names.iter().any(|n| n == e)) {
        return Err(Error::invalid(format!(
            "outputs are {expected:?}, each once, not {names:?}"
        )));
    }
    let mut by_name: HashMap<&str, OwnedFd> = names.iter().map(String::as_str).zip(fds).collect();
    let mut take = |n: &str| {
        by_name
            .remove(n)
            .ok_or_else(|| Error::invalid("an output without its descriptor"))
    };
    Ok(Some(Outputs {
        folder: output_folder(take("folder")?)?,
        model: writable_file(take("model")?, "the output model")?,
        sidecar: writable_file(take("sidecar")?, "the output sidecar")?,
    }))
}

/// A handed folder: a directory open for reading (not an O_PATH handle).
fn output_folder(fd: OwnedFd) -> Result<File> {
    let refuse = |why: &str| Error::invalid(format!("the output folder: {why}"));
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| refuse(&e.to_string()))?;
    if flags.contains(OFlags::PATH) || flags & OFlags::RWMODE == OFlags::WRONLY {
        return Err(refuse("not open for reading"));
    }
    let st = rustix::fs::fstat(&fd).map_err(|e| refuse(&e.to_string()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return Err(refuse("not a folder"));
    }
    Ok(File::from(fd))
}

/// A handed output file: a regular, empty file open for writing at its
/// start (not for appending).
fn writable_file(fd: OwnedFd, what: &str) -> Result<File> {
    let refuse = |why: &str| Error::invalid(format!("{what}: {why}"));
    let flags = rustix::fs::fcntl_getfl(&fd).map_err(|e| refuse(&e.to_string()))?;
    if flags.contains(OFlags::PATH) || flags & OFlags::RWMODE == OFlags::RDONLY {
        return Err(refuse("not open for writing"));
    }
    if flags.contains(OFlags::APPEND) {
        return Err(refuse("open for appending; open it for writing"));
    }
    let st = rustix::fs::fstat(&fd).map_err(|e| refuse(&e.to_string()))?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(refuse("not a regular file"));
    }
    if st.st_size != 0 {
        return Err(refuse("not empty; hand over a new file"));
    }
    Ok(File::from(fd))
}

/// One live handout.
struct Handout {
    uid: u32,
    /// The model's path as the client named it.
    named: String,
    /// The model's real path (its descriptor's) and the model.
    path: PathBuf,
    model: Arc<Model>,
    /// Files made for the request's output, when handed over.
    outputs: Option<Arc<Outputs>>,
    /// The channel connection: the handout ends when its peer closes it.
    conn: Arc<OwnedFd>,
    /// Holds kept while the connection is open (a session's lease).
    holds: Mutex<Vec<LeaseId>>,
}

/// What a handout whose connection closed leaves to end: its holds.
pub(crate) struct EndedHandout {
    pub uid: u32,
    /// The model's real path, for the events that say so.
    pub path: PathBuf,
    pub holds: Vec<LeaseId>,
}

/// Whether the peer of `conn` has closed it (a handout then ends, even
/// before its connection's task has seen the close).
fn closed(conn: &OwnedFd) -> bool {
    use rustix::net::RecvFlags;
    let mut byte = [0u8; 1];
    matches!(
        rustix::net::recv(
            conn.as_fd(),
            &mut byte,
            RecvFlags::PEEK | RecvFlags::DONTWAIT
        ),
        Ok((0, _))
    )
}

/// The live handouts and what each uid holds.
#[derive(Default)]
pub(crate) struct Handouts {
    live: Mutex<HashMap<String, Handout>>,
    /// uid -> (connections, handed files) held.
    held: Mutex<HashMap<u32, (usize, usize)>>,
    /// The most files one uid may have handed at once.
    max_files_per_uid: usize,
}

/// What a bounded uid holds on the channel; given back when dropped.
pub(crate) struct Charge<'a> {
    handouts: &'a Handouts,
    uid: Option<u32>,
    files: usize,
}

impl Charge<'_> {
    /// Charges `n` more handed files, RESOURCE_EXHAUSTED past the bound.
    pub fn files(&mut self, n: usize) -> Result<()> {
        let Some(uid) = self.uid else {
            return Ok(());
        };
        let mut held = lock(&self.handouts.held);
        let entry = held.entry(uid).or_default();
        if entry.1 + n > self.handouts.max_files_per_uid {
            return Err(Error::exhausted(format!(
                "uid {uid} has {} files handed over, and {n} more would pass the {} allowed; \
                 close some sessions first",
                entry.1, self.handouts.max_files_per_uid
            )));
        }
        entry.1 += n;
        self.files += n;
        Ok(())
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        let Some(uid) = self.uid else {
            return;
        };
        let mut held = lock(&self.handouts.held);
        if let Some(entry) = held.get_mut(&uid) {
            entry.0 = entry.0.saturating_sub(1);
            entry.1 = entry.1.saturating_sub(self.files);
            if *entry == (0, 0) {
                held.remove(&uid);
            }
        }
    }
}

impl Handouts {
    /// A table whose uids hand over at most `max_files_per_uid` files each.
    pub fn new(max_files_per_uid: usize) -> Handouts {
        Handouts {
            max_files_per_uid,
            ..Handouts::default()
        }
    }

    /// Charges a new connection to `uid` (`None`: a trusted one, not
    /// bounded); RESOURCE_EXHAUSTED when it holds the most already.
    pub fn connect(&self, uid: Option<u32>) -> Result<Charge<'_>> {
        if let Some(uid) = uid {
            let mut held = lock(&self.held);
            let entry = held.entry(uid).or_default();
            if entry.0 >= MAX_HANDOUTS_PER_UID {
                return Err(Error::exhausted(format!(
                    "uid {uid} holds {MAX_HANDOUTS_PER_UID} handouts, the most allowed; close \
                     some sessions first"
                )));
            }
            entry.0 += 1;
        }
        Ok(Charge {
            handouts: self,
            uid,
            files: 0,
        })
    }

    /// Makes a handout of `model` (at real path `path`, named `named` by
    /// the client) for `uid`, live while `conn` is open; returns its name.
    pub fn add(
        &self,
        uid: u32,
        named: String,
        (path, model): (PathBuf, Arc<Model>),
        outputs: Option<Outputs>,
        conn: Arc<OwnedFd>,
    ) -> Result<String> {
        let mut bytes = [0u8; 16];
        ctcache::fsutil::fill_random(&mut bytes)
            .map_err(|e| Error::internal(format!("no random name for a handout: {e}")))?;
        let name = ctcache_api::hex_string(&bytes);
        let handout = Handout {
            uid,
            named,
            path,
            model,
            outputs: outputs.map(Arc::new),
            conn,
            holds: Mutex::default(),
        };
        lock(&self.live).insert(name.clone(), handout);
        Ok(name)
    }

    /// Ends the handout `name`: what it held is the caller's to end.
    pub fn remove(&self, name: &str) -> Option<EndedHandout> {
        let h = lock(&self.live).remove(name)?;
        let holds = std::mem::take(&mut *lock(&h.holds));
        Some(EndedHandout {
            uid: h.uid,
            path: h.path,
            holds,
        })
    }

    /// Keeps the hold `id` with the live handout `name` of `caller`, to end
    /// when its connection closes.
    pub fn keep(&self, name: &str, caller: &Caller, id: LeaseId) -> Result<()> {
        self.live(name, caller, |h| {
            lock(&h.holds).push(id);
            Ok(())
        })
    }

    /// The model (real path, model) of the handout `name` for `caller`, who must be the uid
    /// that handed it over; `model_path`, when set, must be the path it
    /// was handed under. One answer for a handout unknown, ended or another
    /// uid's.
    pub fn model(
        &self,
        name: &str,
        model_path: &str,
        caller: &Caller,
    ) -> Result<(PathBuf, Arc<Model>)> {
        self.live(name, caller, |h| {
            if !model_path.is_empty() && model_path != h.named {
                return Err(Error::invalid(format!(
                    "model_path {model_path:?} is not the model of handout {name} ({:?})",
                    h.named
                )));
            }
            Ok((h.path.clone(), h.model.clone()))
        })
    }

    /// The output files handed over with handout `name` of `caller`.
    pub fn outputs(&self, name: &str, caller: &Caller) -> Result<Option<Arc<Outputs>>> {
        self.live(name, caller, |h| Ok(h.outputs.clone()))
    }

    /// `read` of the live handout `name` of `caller`; NOT_FOUND for
    /// another uid's, an unknown one, or one whose connection closed.
    fn live<T>(
        &self,
        name: &str,
        caller: &Caller,
        read: impl FnOnce(&Handout) -> Result<T>,
    ) -> Result<T> {
        let gone = || {
            Error::not_found(format!(
                "handout {name}: unknown to {}, or ended (its connection closed)",
                caller.describe()
            ))
        };
        let uid = caller.identity.as_ref().map(|i| i.uid).ok_or_else(gone)?;
        let live = lock(&self.live);
        let h = live.get(name).filter(|h| h.uid == uid).ok_or_else(gone)?;
        if closed(&h.conn) {
            // Its connection's task removes it, and ends what it held.
            return Err(gone());
        }
        read(h)
    }
}

/// The most files one uid may have handed over at once: an eighth of the
/// daemon's open-file limit (so that a few uids cannot use it up for
/// everyone), at most 16384.
pub(crate) fn files_per_uid() -> usize {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX);
    usize::try_from(limit / 8).unwrap_or(usize::MAX).min(16384)
}
