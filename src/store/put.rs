//! Putting a payload: written (or adopted) in tmp/, hashed, published
//! under its blake3, then the entry committed (D13's order).

use std::io::Read;
use std::sync::atomic::Ordering;

use prost::Message;

use super::entry::{self, Access};
use super::key::KeyBytes;
use super::{blob_ref_key, blobs, rebuild, sources};
use super::{Entry, EntryKey, NewEntry, Store, StoreResult, Stored};
use super::{Expect, Op, Precondition, Tree};

impl Store {
    /// An unnamed file in tmp/ (O_TMPFILE), for what a worker writes: it
    /// has no name to leave behind, whatever ends the daemon.
    pub fn unnamed_temp_file(&self) -> std::io::Result<std::fs::File> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC;
        match rustix::fs::open(&self.paths.tmp, flags, Mode::from_raw_mode(0o600)) {
            Ok(fd) => Ok(std::fs::File::from(fd)),
            // A filesystem without O_TMPFILE: a named file, unlinked at once.
            Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::ISDIR) => {
                let path = self.temp_path("form");
                let f = std::fs::File::options()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)?;
                std::fs::remove_file(&path)?;
                Ok(f)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Stores a payload streamed from `payload` under the key `new` derives.
    ///
    /// The payload is hashed while written to tmp/, fsynced, renamed into
    /// blobs/ (or dropped when a referenced file of that blake3 is already
    /// there and its bytes hash to its name: equal payloads under different
    /// keys share one file; a file that does not is replaced by the new
    /// one), then the entry is committed. An existing key is not
    /// overwritten and its payload not read.
    pub fn put(&self, new: &NewEntry, mut payload: impl Read) -> StoreResult<Stored> {
        self.resync_if_reopened()?;
        let now = self.now();
        let prep = entry::prepare(new, now, self.opts.max_seen)?;
        let kb = prep.key.to_bytes();
        if let Some(e) = self.existing(&kb, new)? {
            return Ok(Stored {
                entry: e,
                created: false,
            });
        }
        let w = blobs::write_temp(
            &self.paths,
            self.temp_path("part"),
            &mut payload,
            self.opts.fsync,
            self.opts.write_fault.as_ref(),
        )?;
        let blob = w.blake3;
        let mut record = prep.record;
        record.payload_blake3 = blob.to_vec();
        record.payload_len = w.len;
        let value = record.encode_to_vec();
        let access = Access {
            last_ms: now,
            count: 0,
        };
        if let Some(e) = self.commit_put(&kb, new, w, &value, &access)? {
            // Another put of this key won, and our record file may have
            // replaced its record: write the winner's again.
            self.restore_record(&kb)?;
            return Ok(Stored {
                entry: e,
                created: false,
            });
        }
        if self.opts.durable_puts {
            self.index.flush()?;
        }
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.save_counters_if_due();
        Ok(Stored {
            entry: record.into_entry(prep.key, Some(access)),
            created: true,
        })
    }

    /// Publishes a written payload, its record and the index entry, under
    /// the payload's stripe. Returns the existing entry when another put of
    /// the key committed first (our file is dropped again then).
    fn commit_put(
        &self,
        kb: &KeyBytes,
        new: &NewEntry,
        w: blobs::Written,
        value: &[u8],
        access: &Access,
    ) -> StoreResult<Option<Entry>> {
        let blob = w.blake3;
        let _stripe = self.stripes.lock(&blob);
        let mut pending = Some(w);
        let mut recorded = false;
        loop {
            if let Some(e) = self.existing(kb, new)? {
                // Our file, if we published it and nothing else uses it,
                // goes again.
                match pending.take() {
                    Some(w) => w.discard(),
                    None => {
                        self.delete_unreferenced(&blob)?;
                    }
                }
                return Ok(Some(e));
            }
            if let Some(w) = pending.take() {
                if self.blob_referenced(&blob)? && self.blob_intact(&blob, w.len)? {
                    w.discard();
                } else {
                    let chunks = blobs::publish(&self.paths, w, self.opts.fsync, &self.verity)?;
                    self.published(&blob, chunks);
                }
            }
            if !recorded {
                // Durable before the index knows the entry (D13): the put
                // survives a crash that loses the index's last commits.
                self.write_record(kb, value, rebuild::Durable::Now)?;
                recorded = true;
            }
            let (prefix, suffix) = (sources::prefix(kb), sources::suffix(kb));
            let list = self.index.get(Tree::Sources, prefix)?;
            let applied = self.commit(
                &[
                    Precondition::new(Tree::Entries, kb, Expect::Absent),
                    sources::unchanged(prefix, &list),
                ],
                &[
                    Op::Put(Tree::Entries, kb.to_vec(), value.to_vec()),
                    Op::Put(Tree::BlobRefs, blob_ref_key(&blob, kb), Vec::new()),
                    Op::Put(Tree::Access, kb.to_vec(), access.encode()),
                    sources::store(
                        prefix,
                        sources::with(list.as_deref().unwrap_or(&[]), suffix),
                    ),
                ],
            )?;
            if applied {
                return Ok(None);
            }
            // A concurrent put of the key (with another payload, so under
            // another stripe) committed first, or one of another key of the
            // same source changed its list: loop to return the entry, or to
            // try again.
        }
    }

    /// The entry under `kb`, after remembering the new entry's source names
    /// and model paths (a bounded, best-effort list) and, for a record
    /// stored without it, the source shape (`Record::merge_put`).
    fn existing(&self, kb: &KeyBytes, new: &NewEntry) -> StoreResult<Option<Entry>> {
        for _ in 0..4 {
            let Some(old) = self.index.get(Tree::Entries, kb)? else {
                return Ok(None);
            };
            let mut rec = entry::decode_record(kb, &old)?;
            let changed = rec.merge_put(new, self.opts.max_seen);
            let done = !changed
                || self.commit(
                    &[Precondition::new(Tree::Entries, kb, Expect::Equals(old))],
                    &[Op::Put(Tree::Entries, kb.to_vec(), rec.encode_to_vec())],
                )?;
            if done {
                let key = EntryKey::from_bytes(kb)?;
                return Ok(Some(rec.into_entry(key, Some(self.access_of(kb)?))));
            }
        }
        // Lost four races to concurrent updates: the names are informational
        // (a missing shape is completed by a later put).
        self.stat(&EntryKey::from_bytes(kb)?)
    }
}
