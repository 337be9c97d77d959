//! The caller of a request, from what the transport vouches for: the Unix
//! socket's peer (`peer.rs`); for TCP, whether the peer presented a client
//! certificate the configured CA verified (TCP peers have no credentials).

use tonic::codegen::http::Extensions;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Request;

use super::peer::PeerInfo;
use crate::caller::{Caller, Transport};

/// Who sent `req`.
pub(crate) fn of<T>(req: &Request<T>, trusted_uids: &[u32]) -> Caller {
    from_extensions(req.extensions(), trusted_uids)
}

/// Who sent the request whose connection info is in `ext`.
pub(crate) fn from_extensions(ext: &Extensions, trusted_uids: &[u32]) -> Caller {
    if let Some(p) = ext.get::<PeerInfo>() {
        return of_peer(p, trusted_uids);
    }
    // rustls verified any certificate it reports against `tls_client_ca`.
    let verified_client = ext
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|t| t.peer_certs())
        .is_some_and(|certs| !certs.is_empty());
    Caller::new(None, None, Transport::Tcp { verified_client }, trusted_uids)
}

/// The Unix socket's peer `p` (its credentials read at accept), as the
/// caller of a gRPC request or of a descriptor-channel step.
pub(crate) fn of_peer(p: &PeerInfo, trusted_uids: &[u32]) -> Caller {
    Caller::new(
        Some(p.identity.clone()),
        p.pid,
        Transport::Unix,
        trusted_uids,
    )
}
