//! Who is asking: the identity the transport vouches for (the Unix socket's
//! peer credentials and groups, or a TCP peer's verified client
//! certificate), whether the daemon trusts it with the admin and mutating
//! use cases, and which use cases its transport admits. File access on a
//! caller's behalf is judged by the core (`ctcache::access`) on what is
//! actually opened.

use ctcache::access::Identity;

use crate::use_case_names::UseCase;

/// How the caller reached the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The Unix socket: credentials from SO_PEERCRED / SO_PEERGROUPS.
    Unix,
    /// TCP: no uid. `verified_client` when the peer presented a client
    /// certificate the configured `tls_client_ca` signed.
    Tcp { verified_client: bool },
}

/// The identity a use case acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// uid, gid and groups; `None` over TCP.
    pub identity: Option<Identity>,
    pub pid: Option<i32>,
    pub transport: Transport,
    /// Root, the daemon's own user, a `trusted_uids` member or a TCP peer
    /// with a verified client certificate: may run the admin and mutating
    /// use cases.
    pub trusted: bool,
}

/// The one rule of who is trusted and exempt from the per-uid bounds
/// (queued jobs, watches, leases and their lifetime, connection and
/// event-follower shares): root, the daemon's own user and the
/// `trusted_uids`. The bounds keep one user from starving the others; the
/// admin's own tools and the services it trusts are not held back.
pub(crate) fn is_trusted_uid(uid: u32, trusted_uids: &[u32]) -> bool {
    uid == 0 || uid == own_uid() || trusted_uids.contains(&uid)
}

/// The uid whose per-uid bounds apply: none for a trusted one
/// ([`is_trusted_uid`]).
pub(crate) fn bounded_uid(uid: u32, trusted_uids: &[u32]) -> Option<u32> {
    (!is_trusted_uid(uid, trusted_uids)).then_some(uid)
}

/// The daemon's effective uid.
pub(crate) fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

impl Caller {
    /// A caller with these credentials; trusted when root, the daemon's user
    /// or one of `trusted_uids`.
    pub fn new(
        identity: Option<Identity>,
        pid: Option<i32>,
        transport: Transport,
        trusted_uids: &[u32],
    ) -> Caller {
        let trusted = identity
            .as_ref()
            .is_some_and(|i| is_trusted_uid(i.uid, trusted_uids))
            || transport
                == (Transport::Tcp {
                    verified_client: true,
                });
        Caller {
            identity,
            pid,
            transport,
            trusted,
        }
    }

    pub fn uid(&self) -> Option<u32> {
        self.identity.as_ref().map(|i| i.uid)
    }

    /// Root or the daemon's own user: access checks would change nothing.
    pub fn is_self_or_root(&self) -> bool {
        matches!(self.uid(), Some(0)) || self.uid() == Some(own_uid())
    }

    /// The uid whose per-uid bounds apply to this caller: none for a
    /// trusted one ([`is_trusted_uid`]; a TCP caller has no uid).
    pub fn bounded_uid(&self) -> Option<u32> {
        self.uid().filter(|_| !self.trusted)
    }

    /// Fails unless the caller is trusted with `what` (logged either way).
    pub fn require_trusted(&self, what: &str) -> crate::error::Result<()> {
        tracing::info!(caller = %self.describe(), trusted = self.trusted, "{what}");
        if self.trusted {
            Ok(())
        } else {
            Err(crate::error::Error::denied(format!(
                "{} may not {what}: only the daemon's user, root and trusted_uids may",
                self.describe()
            )))
        }
    }

    /// Fails unless the caller's transport admits `use_case` (`None`: a
    /// method the daemon does not know). The one place the transport rule
    /// is applied, for every request before its handler runs: TCP callers
    /// without a verified client certificate may only read.
    pub fn admits(&self, use_case: Option<UseCase>) -> crate::error::Result<()> {
        let read_only = self.transport
            == Transport::Tcp {
                verified_client: false,
            };
        match use_case {
            Some(u) if !read_only || u.reads_only() => Ok(()),
            None => Err(crate::error::Error::invalid(format!(
                "{} called a method this daemon does not serve",
                self.describe()
            ))),
            Some(u) => {
                let what = u.name();
                tracing::info!(caller = %self.describe(), "refused {what} over TCP");
                Err(crate::error::Error::denied(format!(
                    "{} may not call {what}: TCP callers without a verified client certificate may only read ({})",
                    self.describe(),
                    UseCase::read_only_names().join(", ")
                )))
            }
        }
    }

    /// The identity file access is judged for; a caller without one (TCP)
    /// may reach nothing on the file system.
    pub fn identity(&self) -> crate::error::Result<&Identity> {
        self.identity.as_ref().ok_or_else(|| {
            crate::error::Error::denied(format!(
                "{} has no credentials to check file access with",
                self.describe()
            ))
        })
    }

    /// "uid 1000 (pid 42)", for logs and messages.
    pub fn describe(&self) -> String {
        match (self.uid(), self.pid) {
            (Some(u), Some(p)) => format!("uid {u} (pid {p})"),
            (Some(u), None) => format!("uid {u}"),
            _ if self.trusted => "a TCP peer with a verified client certificate".into(),
            _ => "a TCP peer".into(),
        }
    }
}
