//! Who is asking: the identity the transport vouches for (the Unix socket's
//! peer credentials and groups), and whether the daemon trusts it with the
//! admin and mutating use cases. File access on a caller's behalf is judged
//! by the core (`ctcache::access`) on what is actually opened.

use ctcache::access::Identity;

/// How the caller reached the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// The Unix socket: credentials from SO_PEERCRED / SO_PEERGROUPS.
    Unix,
    /// TCP: no credentials.
    Tcp,
}

/// The identity a use case acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    /// uid, gid and groups; `None` over TCP.
    pub identity: Option<Identity>,
    pub pid: Option<i32>,
    pub transport: Transport,
    /// Root, the daemon's own user or a `trusted_uids` member: may run the
    /// admin and mutating use cases.
    pub trusted: bool,
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
            .is_some_and(|i| i.uid == 0 || i.uid == own_uid() || trusted_uids.contains(&i.uid));
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
            _ => "a TCP peer".into(),
        }
    }
}
