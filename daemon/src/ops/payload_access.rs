//! Serving payloads: ranges of a payload for callers that stream it, and
//! leases for callers that map the payload file (an entry under a lease is
//! never collected). A lease belongs to the uid that took it: only that uid
//! or a trusted caller renews or releases it (lease ids are sequential; the
//! owner check is what protects them), and a uid holds at most
//! `max_leases_per_uid` live leases of at most `max_lease_ttl_secs`.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ctcache::store::{Entry, EntryKey, Lease, LeaseAuthority, LeaseId, Payload};

use super::{serve, Error, Result};
use crate::caller::Caller;
use crate::events::{now_ms, EventKind};
use crate::handouts::EndedHandout;
use crate::state::Daemon;

/// A payload and the byte range of it to send.
pub(crate) struct PayloadRange {
    pub payload: Payload,
    pub range: Range<u64>,
    /// The entry served (a rotted group found while sending is its).
    pub entry: Entry,
}

/// The bytes `[offset, offset + length)` of an entry's payload (`length`
/// 0: to the end; a range past the end is cut at the end). A payload file
/// whose bytes do not hash to its name is quarantined and the answer is
/// DATA_LOSS, never its bytes (and the entry is packed again, see
/// [`serve`](super::serve)).
pub(crate) fn read(
    d: &Arc<Daemon>,
    caller: &Caller,
    key: &EntryKey,
    offset: u64,
    length: u64,
) -> Result<PayloadRange> {
    let entry = d
        .store
        .stat(key)?
        .ok_or_else(|| Error::not_found("no such entry"))?;
    let payload = serve::open(d, caller, &entry)?;
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
        entry,
    })
}

/// A granted lease.
#[derive(Debug, Clone)]
pub(crate) struct Granted {
    pub id: LeaseId,
    pub expires_unix_ms: i64,
    pub entry: Option<Entry>,
}

/// The lease time a request gets: 1 ms .. `max_lease_ttl_secs`.
fn ttl(d: &Daemon, ms: u64) -> Duration {
    let max = Duration::from_secs(d.config.max_lease_ttl_secs);
    Duration::from_millis(ms).clamp(Duration::from_millis(1), max)
}

/// Whose leases the caller may renew or release.
fn authority(caller: &Caller) -> LeaseAuthority {
    if caller.trusted {
        LeaseAuthority::Any
    } else {
        LeaseAuthority::Owner(caller.uid())
    }
}

/// Leases an entry for the caller for `ttl_ms` (clamped to 1 ms ..
/// `max_lease_ttl_secs`); RESOURCE_EXHAUSTED past `max_leases_per_uid`
/// (for a bounded caller, see `caller::is_trusted_uid`).
/// The caller maps the payload file itself, so it is served here: its bytes
/// are hashed the first time (see
/// [`Store::open_payload`](ctcache::store::Store::open_payload)); a damaged
/// file is quarantined, its entries dropped (and packed again, see
/// [`serve`](super::serve)), and the answer is DATA_LOSS, never a lease on
/// it.
pub(crate) fn acquire(
    d: &Arc<Daemon>,
    caller: &Caller,
    key: &EntryKey,
    ttl_ms: u64,
) -> Result<Granted> {
    let entry = d
        .store
        .stat(key)?
        .ok_or_else(|| Error::not_found("no such entry"))?;
    serve::open(d, caller, &entry)?;
    let ttl = ttl(d, ttl_ms);
    let max_live = match caller.bounded_uid() {
        Some(_) => d.config.max_leases_per_uid,
        None => usize::MAX,
    };
    let id = d
        .store
        .acquire_lease_for(key, ttl, caller.uid(), max_live)?;
    Ok(Granted {
        id,
        expires_unix_ms: now_ms() + ttl.as_millis() as i64,
        entry: Some(entry),
    })
}

/// A lease for the caller on each entry, as [`acquire`] grants it; on a
/// refusal the ones granted are released.
pub(crate) fn acquire_all<'e>(
    d: &Arc<Daemon>,
    caller: &Caller,
    entries: impl Iterator<Item = &'e Entry>,
    ttl_ms: u64,
) -> Result<Vec<Granted>> {
    let mut granted: Vec<Granted> = Vec::new();
    for e in entries {
        match acquire(d, caller, &e.key, ttl_ms) {
            Ok(g) => granted.push(g),
            Err(err) => {
                for g in granted {
                    let _ = release(d, caller, g.id);
                }
                return Err(err);
            }
        }
    }
    Ok(granted)
}

/// How an answer's payloads are leased to its caller.
#[derive(Debug, Clone)]
pub(crate) enum Leasing {
    /// A lease on each, for this many ms (as AcquireLease grants it).
    Ttl(u64),
    /// One hold over them all while the connection of the caller's handout
    /// (named) stays open: a session's.
    Hold(String),
}

/// An answer's payloads as its caller holds them.
#[derive(Debug, Clone)]
pub(crate) struct Leased {
    /// A lease on each entry (with a hold, the one hold), in order.
    pub leases: Vec<Granted>,
    /// The leases are one hold.
    pub held: bool,
    /// The folder the answer's external data locations are relative to:
    /// the store's payload folder.
    pub external_data_dir: PathBuf,
}

/// Leases `entries` to the caller of an answer as `leasing` asks: all of
/// them or none.
pub(crate) fn lease_answer(
    d: &Arc<Daemon>,
    caller: &Caller,
    entries: &[&Entry],
    leasing: &Leasing,
) -> Result<Leased> {
    let leases = match leasing {
        Leasing::Ttl(ms) => acquire_all(d, caller, entries.iter().copied(), *ms)?,
        Leasing::Hold(handout) => {
            let keys: Vec<EntryKey> = entries.iter().map(|e| e.key).collect();
            let id = hold(d, caller, &keys, handout)?;
            let granted = |e: &&Entry| Granted {
                id,
                expires_unix_ms: 0,
                entry: Some((*e).clone()),
            };
            entries.iter().map(granted).collect()
        }
    };
    Ok(Leased {
        leases,
        held: matches!(leasing, Leasing::Hold(_)),
        external_data_dir: d.store.payload_folder().to_path_buf(),
    })
}

/// One lease (a hold) over the entries of `keys` for the caller, kept
/// while the connection of its handout `handout` stays open: it ends when
/// that connection closes ([`let_go`]) or by ReleaseLease. It counts once
/// against `max_leases_per_uid`.
pub(crate) fn hold(
    d: &Daemon,
    caller: &Caller,
    keys: &[EntryKey],
    handout: &str,
) -> Result<LeaseId> {
    let max_live = caller.bounded_uid().map(|_| d.config.max_leases_per_uid);
    let id = d.store.hold_for(keys, caller.uid(), max_live)?;
    if let Err(e) = d.handouts.keep(handout, caller, id) {
        let _ = d.store.release(id);
        return Err(e);
    }
    Ok(id)
}

/// Ends the holds of a handout whose connection closed (its client is
/// done, or gone), each announced as a `lease_ended` event about its model.
pub(crate) fn let_go(d: &Daemon, ended: EndedHandout) {
    for id in ended.holds {
        if let Ok(true) = d.store.release(id) {
            d.events.emit(
                EventKind::LeaseEnded,
                None,
                ended.path.display().to_string(),
                format!(
                    "{id} of uid {} ended: the connection that held it closed",
                    ended.uid
                ),
            );
        }
    }
}

/// Extends the caller's lease to `ttl_ms` from now; an untrusted caller's
/// never past `max_lease_lifetime_secs` from when it was taken
/// (FAILED_PRECONDITION at the end: take a new lease).
pub(crate) fn renew(d: &Daemon, caller: &Caller, id: LeaseId, ttl_ms: u64) -> Result<Lease> {
    let lifetime = (!caller.trusted).then(|| Duration::from_secs(d.config.max_lease_lifetime_secs));
    Ok(d.store
        .renew_within(id, ttl(d, ttl_ms), authority(caller), lifetime)?)
}

/// Ends the caller's lease (an unknown one is not an error).
pub(crate) fn release(d: &Daemon, caller: &Caller, id: LeaseId) -> Result<()> {
    d.store.release_as(id, authority(caller))?;
    Ok(())
}
