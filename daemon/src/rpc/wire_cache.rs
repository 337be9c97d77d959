//! Lookup answers' wire bytes, kept per decoded store entry: a hit answered
//! again is a copy of bytes, not a new encoding (a full entry is a few
//! kilobytes, mostly its struct type, and a batch answers thousands).
//!
//! The bytes are keyed by the decoded entry's allocation and hold a `Weak`
//! to it. While that weak reference exists the allocation is not reused, so
//! a live entry at the key is the one the bytes were made from; when a
//! commit changes the record, the store drops its decoded entry, the weak
//! reference dies, and the next hit encodes the new entry. The bytes are
//! never older than the entry they encode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use ctcache::store::SharedEntry;

/// Dead slots are dropped when the map has grown past twice the live ones
/// (and this many).
const PRUNE_FLOOR: usize = 1024;

/// The encodings of entries the store still shares.
#[derive(Default)]
pub(crate) struct WireCache {
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    by_entry: HashMap<usize, Slot>,
    /// Slots live at the last prune.
    live: usize,
}

struct Slot {
    entry: Weak<SharedEntry>,
    /// Full and brief forms.
    forms: [Option<Bytes>; 2],
}

impl WireCache {
    /// `e`'s form (`brief` or full), made by `encode` the first time.
    pub fn get_or_encode(
        &self,
        e: &Arc<SharedEntry>,
        brief: bool,
        encode: impl FnOnce(&SharedEntry) -> Bytes,
    ) -> Bytes {
        let key = Arc::as_ptr(e) as usize;
        let form = usize::from(brief);
        // A slot at this address holds a weak reference to the allocation,
        // so a live entry here is the one its bytes were made from.
        if let Some(b) = self
            .lock()
            .by_entry
            .get(&key)
            .and_then(|s| s.forms[form].clone())
        {
            return b;
        }
        // Encoded outside the lock: lookups of other entries go on.
        let bytes = encode(e);
        let mut slots = self.lock();
        slots.prune();
        let slot = slots.by_entry.entry(key).or_insert_with(|| Slot {
            entry: Arc::downgrade(e),
            forms: [None, None],
        });
        slot.forms[form] = Some(bytes.clone());
        bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Slots {
    fn prune(&mut self) {
        if self.by_entry.len() < (2 * self.live).max(PRUNE_FLOOR) {
            return;
        }
        self.by_entry.retain(|_, s| s.entry.strong_count() > 0);
        self.live = self.by_entry.len();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ctcache::digest::{Algorithm, SourceDigest};
    use ctcache::hit::{Accept, SourceShape};
    use ctcache::pb;
    use ctcache::store::{HostFilter, NewEntry, Producer, Store, StoreOptions};

    use super::*;

    fn new_entry(names: &[&str]) -> NewEntry {
        NewEntry {
            source: SourceDigest {
                algorithm: Algorithm::Blake3,
                bytes: [7; 32],
            },
            device: pb::DeviceProto {
                r#type: "cpu".into(),
                architecture: "x86_64".into(),
                ..Default::default()
            },
            physical_type: pb::StructTypeProto {
                name: "t.fmt".into(),
                metadata_props: vec![pb::StringStringEntryProto {
                    key: ctcache::structs::FORMAT_VERSION_KEY.into(),
                    value: "1".into(),
                }],
                ..Default::default()
            },
            dims: vec![],
            source_shape: SourceShape {
                data_type: ctcache::dtype::DataType::FLOAT,
                dims: vec![],
            },
            producer: Producer::default(),
            source_names: names.iter().map(|n| n.to_string()).collect(),
            model_paths: vec![],
            pack_duration: Duration::from_millis(1),
        }
    }

    /// A hit is encoded once per decoded entry, and a commit that changes
    /// the record is answered with the new entry's bytes, never the old.
    #[test]
    fn bytes_never_outlive_the_entry_they_encode() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path(), StoreOptions::default()).unwrap();
        let first = new_entry(&["w1"]);
        let host = HostFilter::new(vec![first.device.clone()], None, Accept::Any);
        let source = s.put(&first, &b"a"[..]).unwrap().entry.key.source;
        let cache = WireCache::default();
        let names = |e: &SharedEntry| Bytes::from(e.source_names.join(","));
        let hit = |s: &Store| s.lookup(&source, &host).unwrap().remove(0).entry;

        assert_eq!(cache.get_or_encode(&hit(&s), false, names), "w1");
        let again = cache.get_or_encode(&hit(&s), false, |_| panic!("encoded twice"));
        assert_eq!(again, "w1");
        assert_eq!(
            cache.get_or_encode(&hit(&s), true, |_| "brief".into()),
            "brief"
        );

        s.put(&new_entry(&["w2"]), &b"a"[..]).unwrap();
        assert_eq!(cache.get_or_encode(&hit(&s), false, names), "w1,w2");
    }
}
