//! The caller of a request, from what the transport vouches for: the Unix
//! socket's peer (`peer.rs`); TCP peers have no credentials.

use tonic::Request;

use super::peer::PeerInfo;
use crate::caller::{Caller, Transport};

/// Who sent `req`.
pub(crate) fn of<T>(req: &Request<T>, trusted_uids: &[u32]) -> Caller {
    match req.extensions().get::<PeerInfo>() {
        Some(p) => Caller::new(
            Some(p.identity.clone()),
            p.pid,
            Transport::Unix,
            trusted_uids,
        ),
        None => Caller::new(None, None, Transport::Tcp, trusted_uids),
    }
}
