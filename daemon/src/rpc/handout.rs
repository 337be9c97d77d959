//! The descriptor channel's server (protocol: `HandoutRequest` in the proto
//! file): takes a caller's model and data files as descriptors it opened,
//! checks each one (a regular file open for reading), charges them to its
//! uid, and makes a handout of them that lives while the connection does.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ctcache::onnx::{Model, MAX_EXTERNAL_FILES};
use ctcache_api::handout::{self as wire, MAX_FDS, MAX_PACKET};
use ctcache_api::v1::{self as api, handout_reply, handout_request};
use prost::Message;
use rustix::net::SocketFlags;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::error::{Error, ErrorKind, Result};
use crate::handouts::{outputs, readable_file, Charge, HandedFiles, Outputs};
use crate::state::Daemon;

/// How long the daemon waits for each message until a handout is made.
const STEP: Duration = Duration::from_secs(60);

type Conn = AsyncFd<Arc<OwnedFd>>;

/// Accepts connections on `listener` until `shutdown`.
pub(crate) async fn serve(d: Arc<Daemon>, listener: OwnedFd, mut shutdown: watch::Receiver<bool>) {
    // SAFETY: the AsyncFd owns the OwnedFd: the descriptor stays open, and
    // the same, for the AsyncFd's whole life.
    let listener = match unsafe { AsyncFd::register(listener) } {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "the descriptor channel cannot be served");
            return;
        }
    };
    loop {
        let ready = tokio::select! {
            _ = shutdown.changed() => return,
            r = listener.readable() => r,
        };
        let Ok(mut ready) = ready else {
            return;
        };
        let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
        match rustix::net::accept_with(listener.get_ref(), flags) {
            Ok(conn) => {
                tokio::spawn(connection(d.clone(), Arc::new(conn)));
            }
            Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
            Err(e) => {
                // Out of descriptors, say: the pending connection stays
                // readable, so wait before trying again.
                tracing::warn!(error = %e, "descriptor channel: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One connection: a handout made, then held until the peer closes.
async fn connection(d: Arc<Daemon>, conn: Arc<OwnedFd>) {
    let Ok(peer) = super::peer::peer_of(&conn) else {
        return;
    };
    // SAFETY: the AsyncFd holds its own Arc of the OwnedFd: the descriptor
    // stays open, and the same, for the AsyncFd's whole life.
    let Ok(afd) = (unsafe { AsyncFd::register(conn.clone()) }) else {
        return;
    };
    let uid = peer.identity.uid;
    let bounded = crate::caller::bounded_uid(uid, &d.config.trusted_uids);
    let mut charge = match d.handouts.connect(bounded) {
        Ok(c) => c,
        Err(e) => return refuse(&afd, &e).await,
    };
    let handed = match handshake(&afd, &mut charge).await {
        Ok(h) => h,
        Err(e) => return refuse(&afd, &e).await,
    };
    let (named, path, model, outs) = handed;
    tracing::debug!(uid, model = %path.display(), "handout made");
    let name = match d.handouts.add(uid, named, (path, model), outs, conn) {
        Ok(name) => name,
        Err(e) => return refuse(&afd, &e).await,
    };
    let ready = api::HandoutReply {
        step: Some(handout_reply::Step::Ready(api::HandoutReady {
            handout: name.clone(),
        })),
    };
    if send(&afd, &ready, &[]).await.is_ok() {
        // A form or a Materialize answer may be asked for; anything else,
        // or the close, ends the handout.
        while let Ok(Some((req, fds))) = wire::recv_when_ready::<api::HandoutRequest, _>(&afd).await
        {
            let Some(step) = req.step.filter(|_| fds.is_empty()) else {
                break;
            };
            let work = super::handout_asks::answer(&d, &peer, &name, step);
            let answered = tokio::select! {
                a = work => a,
                // The client went away (or spoke out of turn): the work is
                // dropped (a compile's worker killed unless another waits).
                () = peer_speaks(&afd) => break,
            };
            match answered {
                Ok((reply, fd)) => {
                    if send(&afd, &reply, &[fd.as_fd()]).await.is_err() {
                        break;
                    }
                }
                Err(e) => {
                    refuse(&afd, &e).await;
                    break;
                }
            }
        }
    }
    if let Some(ended) = d.handouts.remove(&name) {
        crate::ops::payload_access::let_go(&d, ended);
    }
    drop(charge);
}

/// Returns once the peer sends anything or closes the connection (a
/// readiness left from the last message read is checked, not trusted).
async fn peer_speaks(afd: &Conn) {
    loop {
        let Ok(mut ready) = afd.readable().await else {
            return;
        };
        let peek = |s: &AsyncFd<Arc<OwnedFd>>| {
            let flags = rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT;
            rustix::net::recv(s.get_ref(), &mut [0u8; 1], flags).map_err(std::io::Error::from)
        };
        if ready.try_io(peek).is_ok() {
            return;
        }
    }
}

/// What a handshake hands over: the client's name of the model, its real
/// path, the model, the output files.
type Handed = (String, PathBuf, Arc<Model>, Option<Outputs>);

/// The model's message and descriptor (and the outputs'), then its data
/// files, chunk by chunk.
async fn handshake(afd: &Conn, charge: &mut Charge<'_>) -> Result<Handed> {
    let (first, mut fds) = step::<api::HandoutRequest>(afd).await?;
    let Some(handout_request::Step::Model(asked)) = first.step else {
        return Err(Error::invalid("the first message must be HandoutModel"));
    };
    if fds.len() != 1 + asked.outputs.len() {
        return Err(Error::invalid(format!(
            "HandoutModel carries one descriptor for the model and one per output ({}), not {}",
            1 + asked.outputs.len(),
            fds.len()
        )));
    }
    charge.files(fds.len())?;
    let outs = outputs(&asked.outputs, fds.split_off(1))?;
    let file = readable_file(fds.remove(0), &asked.model_path)?;
    let shown = asked.model_path.clone();
    let (model, files, needs, real) = crate::ops::blocking(move || {
        let real = ctcache::access::real_path(&file).map_err(|e| Error::from_io(e, &shown))?;
        let dir = real.parent().unwrap_or(Path::new("/")).to_path_buf();
        let files = Arc::new(HandedFiles::new(&dir));
        let model = Model::from_file(file, &real, files.clone())?;
        let needs = data_files(&model)?;
        Ok((model, files, needs, real))
    })
    .await?;
    for chunk in chunks(&needs) {
        charge.files(chunk.len())?;
        let ask = api::HandoutReply {
            step: Some(handout_reply::Step::Needs(api::HandoutNeeds {
                names: chunk.to_vec(),
            })),
        };
        send(afd, &ask, &[]).await?;
        let (answer, fds) = step::<api::HandoutRequest>(afd).await?;
        let Some(handout_request::Step::Files(got)) = answer.step else {
            return Err(Error::invalid(
                "HandoutNeeds must be answered by HandoutFiles",
            ));
        };
        let mut given: Vec<&String> = got.names.iter().chain(&got.missing).collect();
        let mut asked: Vec<&String> = chunk.iter().collect();
        given.sort();
        asked.sort();
        if given != asked || got.names.len() != fds.len() {
            return Err(Error::invalid(
                "HandoutFiles must name each file asked for once, with one descriptor per name \
                 in `names`",
            ));
        }
        for (name, fd) in got.names.iter().zip(fds) {
            files.insert(PathBuf::from(name), readable_file(fd, name)?);
        }
    }
    Ok((asked.model_path, real, Arc::new(model), outs))
}

/// The data files a model reads, relative to its folder (see
/// `ctcache::check::data_files`); RESOURCE_EXHAUSTED past
/// [`MAX_EXTERNAL_FILES`].
fn data_files(model: &Model) -> Result<Vec<String>> {
    let names = ctcache::check::data_files(model, MAX_EXTERNAL_FILES)?;
    if names.len() > MAX_EXTERNAL_FILES {
        return Err(Error::exhausted(format!(
            "the model reads data from more than {MAX_EXTERNAL_FILES} files, the most one model \
             may"
        )));
    }
    Ok(names.into_iter().collect())
}

/// `names` in chunks of at most [`MAX_FDS`] names and half a packet.
fn chunks(names: &[String]) -> Vec<&[String]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, n) in names.iter().enumerate() {
        if i > start && (i - start == MAX_FDS || bytes + n.len() > MAX_PACKET / 2) {
            out.push(&names[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += n.len() + 8;
    }
    if start < names.len() {
        out.push(&names[start..]);
    }
    out
}

/// Answers the error and ends the connection.
async fn refuse(afd: &Conn, e: &Error) {
    let reply = api::HandoutReply {
        step: Some(handout_reply::Step::Error(api::HandoutError {
            code: super::error_codes::code_name(e.kind).to_string(),
            message: e.message.clone(),
            kind: super::error_codes::kind_name(e.kind).to_string(),
        })),
    };
    let _ = send(afd, &reply, &[]).await;
}

/// The next message within [`STEP`]; a close or a bad message is an error.
async fn step<M: Message + Default>(afd: &Conn) -> Result<(M, Vec<OwnedFd>)> {
    match tokio::time::timeout(STEP, wire::recv_when_ready::<M, _>(afd)).await {
        Err(_) => Err(Error::new(
            ErrorKind::Cancelled,
            format!("no message from the client for {} s", STEP.as_secs()),
        )),
        Ok(Ok(Some(m))) => Ok(m),
        Ok(Ok(None)) => Err(Error::new(ErrorKind::Cancelled, "the client went away")),
        Ok(Err(e)) => Err(Error::invalid(format!("descriptor channel: {e}"))),
    }
}

async fn send(afd: &Conn, msg: &impl Message, fds: &[std::os::fd::BorrowedFd<'_>]) -> Result<()> {
    wire::send_when_ready(afd, msg, fds)
        .await
        .map_err(|e| Error::new(ErrorKind::Cancelled, e.to_string()))
}
