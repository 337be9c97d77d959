//! What a client asks on the descriptor channel once its handout is ready:
//! a runtime form (Compile) or an in-memory Materialize answer, for a
//! client that speaks no gRPC (importing a gRPC client costs a fresh
//! process more than opening the session does). Each request is admitted,
//! charged and bounded as its RPC is; what it leases is held while the
//! connection stays open; the answer, which may be larger than a message,
//! is a sealed memfd.

use std::future::Future;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use ctcache_api::v1::{self as api, handout_reply, handout_request};
use prost::Message;
use rustix::fs::{MemfdFlags, SealFlags};

use super::peer::PeerInfo;
use super::{decode, encode};
use crate::caller::Caller;
use crate::error::{Error, ErrorKind, Result};
use crate::ops::payload_access::Leasing;
use crate::state::Daemon;
use crate::use_case_names::UseCase;

/// The answer to `step` for the peer of handout `handout`, as the reply
/// and the memfd it is sent with (a step that asks nothing is refused).
pub(super) async fn answer(
    d: &std::sync::Arc<Daemon>,
    peer: &PeerInfo,
    handout: &str,
    step: handout_request::Step,
) -> Result<(api::HandoutReply, OwnedFd)> {
    let caller = super::caller::of_peer(peer, &d.config.trusted_uids);
    match step {
        handout_request::Step::Compile(mut req) => {
            req.handout = handout.to_string();
            req.hold = true;
            let work = async {
                let mut r = decode::compile(req)?;
                r.leasing = Leasing::Hold(handout.to_string());
                let c = crate::ops::compile::compile(d, &caller, r).await?;
                sealed(encode::compiled(d, c).encode_to_vec()).await
            };
            let (length, fd) = bounded(d, &caller, UseCase::Compile, work).await?;
            Ok((reply(length, handout_reply::Step::Compiled), fd))
        }
        handout_request::Step::Materialize(mut req) => {
            req.handout = handout.to_string();
            req.hold = true;
            req.in_memory = true;
            let work = async {
                let r = decode::materialize(req)?;
                let m = crate::ops::materialize::materialize(d, &caller, r).await?;
                sealed(encode::materialized(d, m).encode_to_vec()).await
            };
            let (length, fd) = bounded(d, &caller, UseCase::Materialize, work).await?;
            Ok((reply(length, handout_reply::Step::Materialized), fd))
        }
        handout_request::Step::Model(_) | handout_request::Step::Files(_) => Err(Error::invalid(
            "the handout is made: a step that asks nothing is out of turn",
        )),
    }
}

/// `work` admitted for `use_case`, its CPU charged to the caller, within
/// the daemon's time per request.
async fn bounded<T>(
    d: &Daemon,
    caller: &Caller,
    use_case: UseCase,
    work: impl Future<Output = Result<T>>,
) -> Result<T> {
    let payer = super::guard::admit(caller, Some(use_case), &d.cpu_budget)?;
    let limit = Duration::from_secs(d.config.request_timeout_secs);
    super::guard::paid_within(payer, limit, work)
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::DeadlineExceeded,
                super::guard::no_answer_within(limit),
            )
        })?
}

/// The reply announcing an answer of `length` bytes.
fn reply(length: u64, step: fn(api::HandoutAnswer) -> handout_reply::Step) -> api::HandoutReply {
    api::HandoutReply {
        step: Some(step(api::HandoutAnswer { length })),
    }
}

/// `answer` in a sealed memfd (written on a blocking thread), and its
/// length.
async fn sealed(answer: Vec<u8>) -> Result<(u64, OwnedFd)> {
    let length = answer.len() as u64;
    let fd = tokio::task::spawn_blocking(move || sealed_memfd(&answer))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(|e| Error::from_io(e, "the answer's memfd"))?;
    Ok((length, fd))
}

/// A memfd holding `bytes`, sealed against any change.
fn sealed_memfd(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "ctcache-answer",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    let seals = SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE;
    rustix::fs::fcntl_add_seals(f.as_fd(), seals)?;
    Ok(OwnedFd::from(f))
}
