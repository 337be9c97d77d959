//! A lease as the store keeps it: its id, what it covers, and its record
//! in the index.

use std::fmt;

use prost::Message;

use crate::store::key::EntryKey;

/// Identifies a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub u64);

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease-{}", self.0)
    }
}

/// An active lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The lease's id, for renew and release.
    pub id: LeaseId,
    /// The entry it keeps from gc.
    pub key: EntryKey,
    /// When it ends unless renewed, unix ms.
    pub expires_ms: u64,
    /// The uid that took it (`None`: the store's own user, or no uid).
    pub owner: Option<u32>,
    /// When it was taken, unix ms (0: a lease recorded before this was
    /// kept); renewals never carry it past a lifetime cap.
    pub acquired_ms: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct LeaseRecord {
    #[prost(bytes = "vec", tag = "1")]
    pub(super) key: Vec<u8>,
    #[prost(uint64, tag = "2")]
    pub(super) expires_ms: u64,
    #[prost(uint32, optional, tag = "3")]
    pub(super) owner: Option<u32>,
    #[prost(uint64, tag = "4")]
    pub(super) acquired_ms: u64,
}

impl LeaseRecord {
    pub(super) fn of(lease: &Lease) -> LeaseRecord {
        LeaseRecord {
            key: lease.key.to_bytes().to_vec(),
            expires_ms: lease.expires_ms,
            owner: lease.owner,
            acquired_ms: lease.acquired_ms,
        }
    }
}

pub(crate) fn decode(id: &[u8], v: &[u8]) -> Option<Lease> {
    let r = LeaseRecord::decode(v).ok()?;
    Some(Lease {
        id: LeaseId(u64::from_be_bytes(id.try_into().ok()?)),
        key: EntryKey::from_bytes(&r.key).ok()?,
        expires_ms: r.expires_ms,
        owner: r.owner,
        acquired_ms: r.acquired_ms,
    })
}
