//! Runtime forms through the fleet tier: uploaded after a compile, weights
//! first and the form last; fetched on a compile miss, weights first and
//! the form only once all of them are stored. A form is not audited (a
//! runtime does not make the same bytes twice: onnxruntime numbers the
//! nodes it adds run to run), so only the signers of `trusted_form_keys`
//! (and this host) are taken for one; a weight proves itself, its bytes
//! being the tensor its key names.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::Bytes;
use ctcache::digest::SourceDigest;
use ctcache::dtype::DataType;
use ctcache::forms::{self, FormKey};
use ctcache::hit::SourceShape;
use ctcache::store::{Entry, EntryKey, Store, StoreError};
use ctcache_remote::config::FetchMode;
use ctcache_remote::fetch_check::SourceMatch;
use ctcache_remote::manifest::{self, Trust};

use super::fetch::{stored_as, Failed};
use super::{Ask, Fleet, PushError};
use crate::flights::Gone;
use crate::locks::lock;

/// A form's weights fetched at once: each is a round trip to the server
/// (its two requests sent together), so a conv net's dozens of small
/// weights cost as many round trips over this (measured against a
/// three-node Garage: 8 at once made the fetch 1.4x slower than 16; 32
/// gained nothing more).
const WEIGHTS_AT_ONCE: usize = 16;

/// What a form's entry holds, as its fetch must take it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum FormShape {
    /// The form is its payload (OpenVINO's compiled model).
    Whole,
    /// A model naming weights that are entries of their own (onnxruntime's
    /// optimized model), of at most `max_model` bytes (what an answer
    /// carries).
    WithWeights { max_model: u64 },
}

impl Fleet {
    /// After a compile: queues the upload of the form `form`, its
    /// `weights` first (dropped and counted when the queue is full).
    pub fn compiled(&self, store: &Store, form: &Entry, weights: &[Entry]) {
        let entries = weights.iter().chain([form]);
        self.queue(store, entries.map(|e| (e, BTreeMap::new())).collect());
    }

    /// Whether a form can be taken from the remote at all: some key is
    /// trusted for forms.
    pub fn takes_forms(&self) -> bool {
        !self.shared.settings.form_trust.is_empty()
    }

    /// Whether a form is asked of the remote under `ask`: some key is
    /// trusted for forms, and [`Ask::CostRule`] with `fetch = never` asks
    /// nothing; otherwise a form is always fetched rather than compiled (a
    /// compile takes seconds).
    pub fn asks_for_forms(&self, ask: Ask) -> bool {
        let never = ask == Ask::CostRule && self.shared.settings.config.fetch == FetchMode::Never;
        self.takes_forms() && !never
    }

    /// Read-through for a miss of the form `key`, from a blocking thread
    /// (its caller asked [`Fleet::asks_for_forms`]): the form's entry, its
    /// weights stored first, or `None` (then a compile makes it). An error
    /// only when the local store is out of space. Once `gone` is set, the
    /// weights streaming in stop, no further one is asked for and nothing
    /// is published.
    pub fn fetch_form(
        &self,
        store: &Store,
        (key, shape): (&EntryKey, FormShape),
        model_path: &str,
        gone: &Gone,
    ) -> Result<Option<Entry>, StoreError> {
        // Without a key trusted for forms, no form can be taken: ask nothing.
        if !self.takes_forms() || !self.asks_remote(key, None) {
            return Ok(None);
        }
        let got = self.try_fetch_form(store, key, shape, model_path, gone);
        // Not a measure of the remote's rate: a form's weights come with it.
        self.settle(key, got, None)
    }

    fn try_fetch_form(
        &self,
        store: &Store,
        key: &EntryKey,
        shape: FormShape,
        model_path: &str,
        gone: &Gone,
    ) -> Result<Entry, Failed> {
        let s = &self.shared;
        let accepted = self
            .manifest(key, &s.settings.form_trust, Some(gone))
            .map_err(|f| match f {
                Failed::Rejected("untrusted_key", why) => Failed::Rejected(
                    "untrusted_form_key",
                    format!("{why} for runtime forms (trusted_form_keys)"),
                ),
                f => f,
            })?;
        let new = manifest::new_entry(
            &accepted,
            FormKey::source_shape(),
            Vec::new(),
            vec![model_path.to_string()],
        );
        let FormShape::WithWeights { max_model } = shape else {
            let put = self.streamed(key, &accepted, Some(gone), |checked| {
                store.put(&new, checked)
            })?;
            still_awaited(gone)?;
            return stored_as(put, key);
        };
        if accepted.payload.len > max_model {
            let why = format!(
                "the form's model has {} bytes, more than an answer carries ({max_model})",
                accepted.payload.len
            );
            return Err(Failed::Rejected("too_large", why));
        }
        let (read, model) = self.streamed(key, &accepted, Some(gone), |checked| {
            let mut bytes = Vec::new();
            (checked.read_to_end(&mut bytes), Bytes::from(bytes))
        })?;
        still_awaited(gone)?;
        read.map_err(|e| Failed::Local(e.to_string()))?;
        let weights = forms::moved(model.clone())
            .map_err(|e| Failed::Rejected("malformed", format!("the form's model: {e}")))?;
        let trust = s.settings.trust.and(&s.settings.form_trust);
        self.weights(store, &weights, model_path, &trust, gone)?;
        still_awaited(gone)?;
        stored_as(store.put(&new, &model[..]), key)
    }

    /// Stores the moved weights of a fetched form, [`WEIGHTS_AT_ONCE`] at a
    /// time; the first failure stops the rest, as `gone` does.
    fn weights(
        &self,
        store: &Store,
        weights: &[forms::MovedTensor],
        model_path: &str,
        trust: &Trust,
        gone: &Gone,
    ) -> Result<(), Failed> {
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<Failed>> = Mutex::new(None);
        std::thread::scope(|threads| {
            for _ in 0..WEIGHTS_AT_ONCE.min(weights.len()) {
                threads.spawn(|| {
                    while lock(&failed).is_none() {
                        if let Err(f) = still_awaited(gone) {
                            lock(&failed).get_or_insert(f);
                            return;
                        }
                        let Some(w) = weights.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return;
                        };
                        if let Err(f) = self.weight(store, w, (model_path, trust), gone) {
                            lock(&failed).get_or_insert(f);
                        }
                    }
                });
            }
        });
        match failed.into_inner() {
            Ok(None) => Ok(()),
            Ok(Some(f)) => Err(f),
            Err(poisoned) => poisoned.into_inner().map_or(Ok(()), Err),
        }
    }

    /// Stores the moved weight `w` of a fetched form of `model_path` unless
    /// it is stored. It must be the identity entry of its tensor (as a
    /// compile stores it), signed by a key of `trust`, and its bytes the
    /// tensor its key names. Its stream stops once `gone` is set.
    fn weight(
        &self,
        store: &Store,
        w: &forms::MovedTensor,
        (model_path, trust): (&str, &Trust),
        gone: &Gone,
    ) -> Result<(), Failed> {
        let malformed = |why: String| Failed::Rejected("malformed", why);
        let key: EntryKey = w
            .key
            .parse()
            .map_err(|e| malformed(format!("the form names weight {:?}: {e}", w.key)))?;
        let named = |f: Failed| match f {
            Failed::Absent => Failed::Rejected(
                "incomplete_form",
                format!(
                    "weight {:?} of the form ({key}) is not on the remote",
                    w.name
                ),
            ),
            Failed::Rejected(reason, why) => Failed::Rejected(
                reason,
                format!("weight {:?} of the form ({key}): {why}", w.name),
            ),
            f => f,
        };
        let shape = SourceShape {
            data_type: DataType::from_i32(w.data_type)
                .map_err(|e| named(malformed(e.to_string())))?,
            dims: w.dims.clone(),
        };
        let (expected, dims) = identity_entry(key.source, &shape).map_err(named)?;
        if expected != key {
            let why = format!("not the identity entry of its tensor ({expected})");
            return Err(named(malformed(why)));
        }
        if let Some(e) = store.stat(&key).map_err(Failed::Store)? {
            return match e.payload.len == w.length {
                true => Ok(()),
                false => Err(named(malformed(format!(
                    "stored with {} bytes",
                    e.payload.len
                )))),
            };
        }
        // Both requests at once: the form names the weight's length.
        let (accepted, payload) = self
            .manifest_and_payload(&key, w.length, trust, gone)
            .map_err(named)?;
        if accepted.payload.len != w.length || accepted.entry.dims != dims {
            let why = format!(
                "{} bytes and dims {:?}; the form reads {} bytes of dims {dims:?}",
                accepted.payload.len, accepted.entry.dims, w.length
            );
            return Err(named(malformed(why)));
        }
        let new = manifest::new_entry(
            &accepted,
            shape.clone(),
            vec![w.name.clone()],
            vec![model_path.to_string()],
        );
        let (put, not_its_tensor) = self
            .streamed_from(payload, &accepted, Some(gone), |checked| {
                let mut proven = SourceMatch::new(checked, shape.data_type, &w.dims, key.source);
                let put = store.put(&new, &mut proven);
                (put, proven.mismatch().map(str::to_string))
            })
            .map_err(named)?;
        still_awaited(gone)?;
        if let Some(why) = not_its_tensor {
            return Err(named(Failed::Rejected("not_its_tensor", why)));
        }
        // Another fetch may have stored it meanwhile: then nothing was read.
        let created = matches!(&put, Ok(s) if s.created);
        stored_as(put, &key)?;
        if created {
            self.shared.counters.fetched(w.length);
        }
        Ok(())
    }
}

/// `Failed::Abandoned` once nobody waits for the form any more.
fn still_awaited(gone: &Gone) -> Result<(), Failed> {
    match gone.is_set() {
        true => Err(Failed::nobody_waits()),
        false => Ok(()),
    }
}

/// The entries `remote push` uploads for `entry`, in order: an onnxruntime
/// form's weights, then the form; any other entry alone.
pub(super) fn with_weights(store: &Store, entry: &Entry) -> Result<Vec<Entry>, PushError> {
    if Some(entry.type_name.as_str()) != forms::form_type_name("onnxruntime") {
        return Ok(vec![entry.clone()]);
    }
    let model = super::checked_payload(store, entry)?;
    let mut entries = Vec::new();
    for w in forms::moved(Bytes::copy_from_slice(&model))? {
        let key: EntryKey = w.key.parse().map_err(StoreError::from)?;
        entries.push(store.stat(&key)?.ok_or(PushError::WeightGone(key))?);
    }
    entries.push(entry.clone());
    Ok(entries)
}

/// The key and dims of the identity entry of the tensor of digest `source`
/// and shape `shape`: what a form's moved weight is.
fn identity_entry(
    source: SourceDigest,
    shape: &SourceShape,
) -> Result<(EntryKey, Vec<u64>), Failed> {
    let identity = ctcache_kernels::find(ctcache_kernels::formats::identity::ID)
        .ok_or_else(|| Failed::Local("no identity packer in this build".into()))?;
    ctcache_kernels::registry::entry_key(identity, &ctcache_kernels::Params::new(), source, shape)
        .map_err(|e| Failed::Rejected("malformed", e.to_string()))
}
