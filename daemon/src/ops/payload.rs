//! Serving payloads: ranges of a payload for callers that stream it, and
//! leases for callers that map the payload file (an entry under a lease is
//! never collected).

use std::ops::Range;
use std::time::Duration;

use ctcache::store::{Entry, EntryKey, Lease, LeaseId, Payload};

use super::{Error, Result};
use crate::caller::Caller;
use crate::events::now_ms;
use crate::state::Daemon;

/// Longest lease a caller may ask for.
const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// A payload and the byte range of it to send.
pub(crate) struct PayloadRange {
    pub payload: Payload,
    pub range: Range<u64>,
}

/// The bytes `[offset, offset + length)` of an entry's payload (`length`
/// 0: to the end; a range past the end is cut at the end). A payload file
/// whose bytes do not hash to its name is quarantined and the answer is
/// DATA_LOSS, never its bytes.
pub(crate) fn read(d: &Daemon, key: &EntryKey, offset: u64, length: u64) -> Result<PayloadRange> {
    let payload = d.store.open_payload(key)?;
    let len = payload.len() as u64;
    if offset > len {
        return Err(Error::out_of_range(format!(
            "offset {offset} is past the payload's {len} bytes"
        )));
    }
    let end = if length == 0 {
        len
    } else {
        offset.saturating_add(length).min(len)
    };
    Ok(PayloadRange {
        payload,
        range: offset..end,
    })
}

/// A granted lease.
#[derive(Debug, Clone)]
pub(crate) struct Granted {
    pub id: LeaseId,
    pub expires_unix_ms: i64,
    pub entry: Option<Entry>,
}

fn ttl(ms: u64) -> Duration {
    Duration::from_millis(ms).clamp(Duration::from_millis(1), MAX_TTL)
}

/// Leases an entry for `ttl_ms` (clamped to 1 ms .. 24 h). The caller maps
/// the payload file itself, so it is served here: its bytes are hashed the
/// first time (see [`Store::open_payload`](ctcache::store::Store::open_payload));
/// a damaged file is quarantined, its entries dropped, and the answer is
/// DATA_LOSS, never a lease on it.
pub(crate) fn acquire(
    d: &Daemon,
    _caller: &Caller,
    key: &EntryKey,
    ttl_ms: u64,
) -> Result<Granted> {
    let entry = d
        .store
        .stat(key)?
        .ok_or_else(|| Error::not_found("no such entry"))?;
    d.store.open_payload(key)?;
    let ttl = ttl(ttl_ms);
    let id = d.store.acquire_lease(key, ttl)?;
    Ok(Granted {
        id,
        expires_unix_ms: now_ms() + ttl.as_millis() as i64,
        entry: Some(entry),
    })
}

/// Extends a lease to `ttl_ms` from now.
pub(crate) fn renew(d: &Daemon, _caller: &Caller, id: LeaseId, ttl_ms: u64) -> Result<Lease> {
    Ok(d.store.renew(id, ttl(ttl_ms))?)
}

/// Ends a lease (an unknown one is not an error).
pub(crate) fn release(d: &Daemon, _caller: &Caller, id: LeaseId) -> Result<()> {
    d.store.release(id)?;
    Ok(())
}
