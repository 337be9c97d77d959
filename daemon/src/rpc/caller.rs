//! The caller of a request, from what the transport vouches for: the Unix
//! socket's peer credentials; TCP peers have none.

use tonic::transport::server::UdsConnectInfo;
use tonic::Request;

use crate::caller::{Caller, Transport};

/// Who sent `req`.
pub(crate) fn of<T>(req: &Request<T>, trusted_uids: &[u32]) -> Caller {
    match req.extensions().get::<UdsConnectInfo>() {
        Some(info) => {
            let cred = info.peer_cred;
            Caller::new(
                cred.map(|c| c.uid()),
                cred.map(|c| c.gid()),
                cred.and_then(|c| c.pid()),
                Transport::Unix,
                trusted_uids,
            )
        }
        None => Caller::new(None, None, None, Transport::Tcp, trusted_uids),
    }
}
