//! The descriptor channel's client side: the model and the data files the
//! daemon asks for are opened here, with this process's rights, and handed
//! over as descriptors; the daemon reads those and no path. A handout lasts
//! as long as its [`Handout`].

use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path};

use ctcache_api::handout as wire;
use ctcache_api::v1::{self as api, handout_reply, handout_request};
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;

use std::future::Future;
use std::sync::Mutex;

use crate::conn::{Grpc, Repeat};
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
    /// then reads those files, never the path). The handout lasts until the
    /// value is dropped.
    /// Waits on the daemon without a thread of its own: dropping the future
    /// (Ctrl-C) ends the exchange.
    pub async fn hand_over(&self, model_path: &str) -> Result<Handout> {
        self.hand_over_for("Handout", model_path, &[]).await
    }

    /// [`Client::hand_over`] for the call `rpc`: a daemon that goes away
    /// meanwhile is reported as having stopped answering during it.
    pub(crate) async fn hand_over_for(
        &self,
        rpc: &'static str,
        model_path: &str,
        outputs: Outputs<'_>,
    ) -> Result<Handout> {
        hand_over(self.socket(), Path::new(model_path), outputs)
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

/// A request that names a model, and so may name a handout of it.
pub(crate) trait NamesModel {
    fn model_path(&self) -> &str;
    fn set_handout(&mut self, handout: &Handout);
}

macro_rules! names_model {
    ($($t:ty),*) => {$(
        impl NamesModel for $t {
            fn model_path(&self) -> &str {
                &self.model_path
            }
            fn set_handout(&mut self, handout: &Handout) {
                self.handout = handout.name.clone();
            }
        }
    )*};
}

names_model!(
    api::ResolveModelRequest,
    api::PrepackRequest,
    api::EmbedRequest,
    api::MaterializeRequest,
    api::CompileRequest,
    api::ImportRequest,
    api::RemotePullRequest
);

impl Client {
    /// Sends `req`, which names a model, through `send` (see `Conn::call`),
    /// the model handed over for it: before the first attempt (a refusal of
    /// the hand-over, or a model this process cannot open, is this call's
    /// error), and anew for each attempt after a lost connection (a handout
    /// lives on the daemon that took it; one restarted knows none; a
    /// hand-over that fails then counts as the daemon not answering, and a
    /// daemon not answering the first one is waited for as the call waits).
    /// Each handout lasts until its attempt's answer.
    pub(crate) async fn call_naming_model<Req, Resp, F, Fut>(
        &self,
        rpc: &'static str,
        repeat: Repeat,
        (req, outputs): (Req, Outputs<'_>),
        send: F,
    ) -> Result<Resp>
    where
        Req: NamesModel + Clone,
        F: Fn(Grpc, Req) -> Fut,
        Fut: Future<Output = std::result::Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let first = match self.hand_over_for(rpc, req.model_path(), outputs).await {
            Ok(held) => Some(held),
            Err(Error::Unavailable { .. }) => None,
            Err(e) => return Err(e),
        };
        let first = Mutex::new(first);
        let (first, socket, send) = (&first, self.socket(), &send);
        let attempt = move |grpc: Grpc, mut req: Req| async move {
            let taken = first.lock().unwrap_or_else(|e| e.into_inner()).take();
            let held = match taken {
                Some(held) => held,
                None => hand_over(socket, Path::new(req.model_path()), outputs)
                    .await
                    .map_err(|e| match e {
                        Lost(message) => tonic::Status::unavailable(message),
                        Failed(e) => tonic::Status::unavailable(e.to_string()),
                    })?,
            };
            req.set_handout(&held);
            send(grpc, req).await
        };
        self.conn
            .call(rpc, repeat, self.retry_for, req, attempt)
            .await
    }
}

/// Files made for a request's output, handed over with the model by name
/// (see `HandoutModel.outputs`).
pub(crate) type Outputs<'a> = &'a [(&'static str, BorrowedFd<'a>)];

/// Why a hand-over failed: the daemon went away during it, or another
/// error.
enum Failure {
    Lost(String),
    Failed(Error),
}
use Failure::{Failed, Lost};

/// Hands `model` (an absolute path) to the daemon whose gRPC socket is
/// `grpc`. A channel that is not there (a daemon starting, or gone) is the
/// daemon not answering; a model this process cannot open is its own
/// error.
async fn hand_over(
    grpc: &Path,
    model: &Path,
    outputs: Outputs<'_>,
) -> std::result::Result<Handout, Failure> {
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
        Err(e @ (rustix::io::Errno::NOENT | rustix::io::Errno::CONNREFUSED)) => {
            return Err(lost(e.into()))
        }
        Err(e) => return Err(io(e.into())),
    }
    rustix::io::ioctl_fionbio(&conn, true).map_err(|e| io(e.into()))?;
    // SAFETY: the AsyncFd owns the OwnedFd: the descriptor stays open, and
    // the same, for the AsyncFd's whole life.
    let conn =
        unsafe { AsyncFd::register(conn) }.map_err(|e| io(std::io::Error::other(e.to_string())))?;
    // The caller's own open decides what it may hand over: the daemon opens
    // no path for it.
    let file = open_to_hand(model).map_err(|source| {
        Failed(Error::Io {
            path: model.to_path_buf(),
            source,
        })
    })?;
    // Data locations are relative to the folder the model file really is in.
    let dir = std::fs::canonicalize(model)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| model.parent().unwrap_or(Path::new("/")).to_path_buf());
    let first = api::HandoutRequest {
        step: Some(handout_request::Step::Model(api::HandoutModel {
            model_path: model.display().to_string(),
            outputs: outputs.iter().map(|(n, _)| n.to_string()).collect(),
        })),
    };
    let fds: Vec<BorrowedFd<'_>> = std::iter::once(file.as_fd())
        .chain(outputs.iter().map(|(_, fd)| *fd))
        .collect();
    wire::send_when_ready(&conn, &first, &fds)
        .await
        .map_err(lost)?;
    loop {
        let Some((reply, _)) = wire::recv_when_ready::<api::HandoutReply, _>(&conn)
            .await
            .map_err(lost)?
        else {
            return Err(Lost("the daemon closed the descriptor channel".into()));
        };
        match reply.step {
            Some(handout_reply::Step::Needs(needs)) => {
                let answer = open_asked(&dir, needs.names);
                let fds: Vec<BorrowedFd<'_>> = answer.1.iter().map(|f| f.as_fd()).collect();
                wire::send_when_ready(&conn, &answer.0, &fds)
                    .await
                    .map_err(lost)?;
            }
            Some(handout_reply::Step::Ready(ready)) => {
                return Ok(Handout {
                    _conn: conn.into_inner(),
                    name: ready.handout,
                })
            }
            Some(handout_reply::Step::Error(e)) => {
                return Err(Failed(Error::Rpc {
                    rpc: "Handout",
                    code: ctcache_api::code_named(&e.code).unwrap_or(tonic::Code::Unknown),
                    message: e.message,
                }))
            }
            Some(handout_reply::Step::Compiled(_) | handout_reply::Step::Materialized(_))
            | None => return Err(lost(std::io::Error::other("an answer out of protocol"))),
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
        match inside.then(|| open_to_hand(&dir.join(&name))) {
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

/// `path` opened for reading, to be handed over; not blocking, so that a
/// FIFO opens at once, for the daemon to refuse.
fn open_to_hand(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
}
