//! The descriptor channel's client side: the model and the data files the
//! daemon asks for are opened here, with this process's rights, and handed
//! over as descriptors; the daemon reads those and no path. A handout lasts
//! as long as its [`Handout`].

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use ctcache_api::handout as wire;
use ctcache_api::v1::{self as api, handout_reply, handout_request};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;

use crate::error::{Error, Result};
use crate::Client;

/// A model handed to the daemon; dropping it ends the handout.
#[derive(Debug)]
pub struct Handout {
    _conn: OwnedFd,
    name: String,
}

impl Handout {
    /// The name a request gives in its `handout` field.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Client {
    /// Hands the model at the absolute `model_path` to the daemon over its
    /// descriptor channel, opened with this process's rights (the daemon
    /// then reads those files, never the path); `None` from a daemon
    /// without the channel. The handout lasts until the value is dropped.
    /// Waits on the daemon without a thread of its own: dropping the future
    /// (Ctrl-C) ends the exchange.
    pub async fn hand_over(&self, model_path: &str) -> Result<Option<Handout>> {
        self.hand_over_for("Handout", model_path).await
    }

    /// [`Client::hand_over`] for the call `rpc`: a daemon that goes away
    /// meanwhile is reported as having stopped answering during it.
    pub(crate) async fn hand_over_for(
        &self,
        rpc: &'static str,
        model_path: &str,
    ) -> Result<Option<Handout>> {
        hand_over(self.socket(), Path::new(model_path))
            .await
            .map_err(|e| match e {
                Lost(message) => Error::Unavailable {
                    socket: self.socket().to_path_buf(),
                    rpc,
                    message,
                },
                Failed(e) => e,
            })
    }
}

/// The `handout` field of a request: the handout's name, or empty.
pub(crate) fn handout_name(h: &Option<Handout>) -> String {
    h.as_ref().map(|h| h.name().to_string()).unwrap_or_default()
}

/// Why a hand-over failed: the daemon went away during it, or another
/// error.
enum Failure {
    Lost(String),
    Failed(Error),
}
use Failure::{Failed, Lost};

/// Hands `model` (an absolute path) to the daemon whose gRPC socket is
/// `grpc`; `None` when that daemon has no descriptor channel (an older
/// one), or when this process cannot open the model (the daemon then
/// answers for the path, as to any request naming one).
async fn hand_over(grpc: &Path, model: &Path) -> std::result::Result<Option<Handout>, Failure> {
    let path = wire::socket_path(grpc);
    let io = |source: std::io::Error| {
        Failed(Error::Io {
            path: path.clone(),
            source,
        })
    };
    let lost = |e: std::io::Error| Lost(format!("the descriptor channel: {e}"));
    let conn = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| io(e.into()))?;
    let addr = SocketAddrUnix::new(&path).map_err(|e| io(e.into()))?;
    match rustix::net::connect(&conn, &addr) {
        Ok(()) => {}
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::CONNREFUSED) => return Ok(None),
        Err(e) => return Err(io(e.into())),
    }
    rustix::io::ioctl_fionbio(&conn, true).map_err(|e| io(e.into()))?;
    // SAFETY: the AsyncFd owns the OwnedFd: the descriptor stays open, and
    // the same, for the AsyncFd's whole life.
    let conn =
        unsafe { AsyncFd::register(conn) }.map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let Ok(file) = File::open(model) else {
        return Ok(None);
    };
    // Data locations are relative to the folder the model file really is in.
    let dir = std::fs::canonicalize(model)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| model.parent().unwrap_or(Path::new("/")).to_path_buf());
    let first = api::HandoutRequest {
        step: Some(handout_request::Step::Model(api::HandoutModel {
            model_path: model.display().to_string(),
        })),
    };
    send(&conn, &first, &[file.as_fd()]).await.map_err(lost)?;
    loop {
        let Some((reply, _)) = recv(&conn).await.map_err(lost)? else {
            return Err(Lost("the daemon closed the descriptor channel".into()));
        };
        match reply.step {
            Some(handout_reply::Step::Needs(needs)) => {
                let answer = open_asked(&dir, needs.names);
                let fds: Vec<BorrowedFd<'_>> = answer.1.iter().map(|f| f.as_fd()).collect();
                send(&conn, &answer.0, &fds).await.map_err(lost)?;
            }
            Some(handout_reply::Step::Ready(ready)) => {
                return Ok(Some(Handout {
                    _conn: conn.into_inner(),
                    name: ready.handout,
                }))
            }
            Some(handout_reply::Step::Error(e)) => {
                return Err(Failed(Error::Rpc {
                    rpc: "Handout",
                    code: ctcache_api::code_named(&e.code).unwrap_or(tonic::Code::Unknown),
                    message: e.message,
                }))
            }
            None => return Err(lost(std::io::Error::other("an empty answer"))),
        }
    }
}

async fn send(
    conn: &AsyncFd<OwnedFd>,
    msg: &api::HandoutRequest,
    fds: &[BorrowedFd<'_>],
) -> std::io::Result<()> {
    loop {
        let mut ready = conn.writable().await?;
        if let Ok(sent) = ready.try_io(|c| wire::send(c.get_ref(), msg, fds)) {
            return sent;
        }
    }
}

async fn recv(
    conn: &AsyncFd<OwnedFd>,
) -> std::io::Result<Option<(api::HandoutReply, Vec<OwnedFd>)>> {
    loop {
        let mut ready = conn.readable().await?;
        if let Ok(got) = ready.try_io(|c| wire::recv(c.get_ref())) {
            return got;
        }
    }
}

/// The files the daemon asked for, opened in `dir`: those that open, and
/// the names of those that do not (or that would leave `dir`).
fn open_asked(dir: &Path, names: Vec<String>) -> (api::HandoutRequest, Vec<File>) {
    let mut files = api::HandoutFiles::default();
    let mut opened = Vec::new();
    for name in names {
        let inside = Path::new(&name)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        match inside.then(|| File::open(dir.join(PathBuf::from(&name)))) {
            Some(Ok(f)) => {
                files.names.push(name);
                opened.push(f);
            }
            _ => files.missing.push(name),
        }
    }
    let msg = api::HandoutRequest {
        step: Some(handout_request::Step::Files(files)),
    };
    (msg, opened)
}
