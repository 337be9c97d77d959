//! The caller of a request, from what the transport vouches for: the Unix
//! socket's peer credentials; for TCP, whether the peer presented a client
//! certificate the configured CA verified (TCP peers have no uid).

use tonic::codegen::http::Extensions;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tonic::Request;

use crate::caller::{Caller, Transport};

/// Who sent `req`.
pub(crate) fn of<T>(req: &Request<T>, trusted_uids: &[u32]) -> Caller {
    from_extensions(req.extensions(), trusted_uids)
}

/// Who sent the request whose connection info is in `ext`.
pub(crate) fn from_extensions(ext: &Extensions, trusted_uids: &[u32]) -> Caller {
    if let Some(info) = ext.get::<UdsConnectInfo>() {
        let cred = info.peer_cred;
        return Caller::new(
            cred.map(|c| c.uid()),
            cred.map(|c| c.gid()),
            cred.and_then(|c| c.pid()),
            Transport::Unix,
            trusted_uids,
        );
    }
    // rustls verified any certificate it reports against `tls_client_ca`.
    let verified_client = ext
        .get::<TlsConnectInfo<TcpConnectInfo>>()
        .and_then(|t| t.peer_certs())
        .is_some_and(|certs| !certs.is_empty());
    Caller::new(
        None,
        None,
        None,
        Transport::Tcp { verified_client },
        trusted_uids,
    )
}
