//! A runtime form asked for on the descriptor channel, once its handout is
//! ready: what a client that speaks no gRPC sends (importing a gRPC client
//! costs a fresh process more than opening the session does). The request
//! is admitted, charged and bounded as the Compile RPC is; the form is held
//! while the connection stays open; the answer, which may be larger than a
//! message, is a sealed memfd.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

use ctcache_api::v1::{self as api, handout_reply};
use prost::Message;
use rustix::fs::{MemfdFlags, SealFlags};

use super::peer::PeerInfo;
use super::{decode, encode};
use crate::caller::{Caller, Transport};
use crate::error::{Error, Result};
use crate::ops::materialize::Leasing;
use crate::state::Daemon;
use crate::use_case_names::UseCase;

/// The answer to `req` for the peer of handout `handout`, as the reply and
/// the memfd it is sent with.
pub(super) async fn compile(
    d: &std::sync::Arc<Daemon>,
    peer: &PeerInfo,
    handout: &str,
    mut req: api::CompileRequest,
) -> Result<(api::HandoutReply, OwnedFd)> {
    let caller = Caller::new(
        Some(peer.identity.clone()),
        peer.pid,
        Transport::Unix,
        &d.config.trusted_uids,
    );
    let payer = super::guard::admit(&caller, Some(UseCase::Compile), &d.cpu_budget)?;
    req.handout = handout.to_string();
    req.hold = true;
    let mut r = decode::compile(req)?;
    r.leasing = Leasing::Hold(handout.to_string());
    let limit = Duration::from_secs(d.config.request_timeout_secs);
    let work = crate::ops::compile::compile(d, &caller, r);
    let answered = super::guard::paid_within(payer, limit, work).await;
    let compiled = answered.map_err(|_| {
        Error::new(
            crate::error::ErrorKind::Cancelled,
            format!(
                "no answer within request_timeout_secs ({} s)",
                limit.as_secs()
            ),
        )
    })??;
    let answer = encode::compiled(d, compiled).encode_to_vec();
    let length = answer.len() as u64;
    let fd = tokio::task::spawn_blocking(move || sealed(&answer))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
        .map_err(|e| Error::from_io(e, "the answer's memfd"))?;
    let reply = api::HandoutReply {
        step: Some(handout_reply::Step::Compiled(api::HandoutCompiled {
            length,
        })),
    };
    Ok((reply, fd))
}

/// A memfd holding `bytes`, sealed against any change.
fn sealed(bytes: &[u8]) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create(
        "ctcache-compile-answer",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    let seals = SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE;
    rustix::fs::fcntl_add_seals(f.as_fd(), seals)?;
    Ok(OwnedFd::from(f))
}
