//! Runtime forms through the fleet tier: uploaded after a compile, weights
//! first and the form last; fetched on a compile miss, weights first and
//! the form only once all of them are stored. A form is not audited (a
//! runtime does not make the same bytes twice: onnxruntime numbers the
//! nodes it adds run to run), so only the signers of `trusted_form_keys`
//! (and this host) are taken for one; a weight proves itself, its bytes
//! being the tensor its key names.

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Instant;

use bytes::Bytes;
use ctcache::dtype::DataType;
use ctcache::forms::{self, FormKey};
use ctcache::hit::SourceShape;
use ctcache::store::{Entry, EntryKey, Store, StoreError};
use ctcache_remote::config::FetchMode;
use ctcache_remote::fetch_check::{Checked, SourceMatch};
use ctcache_remote::manifest::{self, Accepted};

use super::fetch::{checked_stream, stored_as, Failed};
use super::Fleet;

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
        self.queue(store, entries.map(|e| (e, BTreeMap::new())));
    }

    /// Read-through for a compile miss of the form `key`, from a blocking
    /// thread: the form's entry, its weights stored first, or `None` (then
    /// the daemon compiles). An error only when the local store is out of
    /// space. `fetch = never` asks nothing; otherwise a form is always
    /// fetched rather than compiled (a compile takes seconds).
    pub fn fetch_form(
        &self,
        store: &Store,
        key: &EntryKey,
        shape: FormShape,
        model_path: &str,
    ) -> Result<Option<Entry>, StoreError> {
        if self.shared.settings.config.fetch == FetchMode::Never || !self.asks_remote(key, None) {
            return Ok(None);
        }
        let started = Instant::now();
        let got = self.try_fetch_form(store, key, shape, model_path);
        self.settle(key, got, started.elapsed())
    }

    fn try_fetch_form(
        &self,
        store: &Store,
        key: &EntryKey,
        shape: FormShape,
        model_path: &str,
    ) -> Result<Entry, Failed> {
        let s = &self.shared;
        let accepted = self
            .manifest(key, &s.settings.form_trust)
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
            let mut reader = self.payload(key, &accepted)?;
            let mut checked = Checked::new(&mut reader, accepted.payload);
            let put = store.put(&new, &mut checked);
            checked_stream(checked.mismatch().map(str::to_string), reader.failed.take())?;
            return stored_as(put, key);
        };
        if accepted.payload.len > max_model {
            let why = format!(
                "the form's model has {} bytes, more than an answer carries ({max_model})",
                accepted.payload.len
            );
            return Err(Failed::Rejected("too_large", why));
        }
        let model = self.downloaded(key, &accepted)?;
        let weights = forms::served::<ctcache::Error>(model.clone(), |_| Ok(String::new()))
            .map_err(|e| Failed::Rejected("malformed", format!("the form's model: {e}")))?
            .1;
        for w in &weights {
            self.weight(store, w, model_path)?;
        }
        stored_as(store.put(&new, &model[..]), key)
    }

    /// The payload of `accepted` (of `key`) in memory, checked.
    fn downloaded(&self, key: &EntryKey, accepted: &Accepted) -> Result<Bytes, Failed> {
        let mut reader = self.payload(key, accepted)?;
        let mut checked = Checked::new(&mut reader, accepted.payload);
        let mut bytes = Vec::new();
        let read = checked.read_to_end(&mut bytes);
        checked_stream(checked.mismatch().map(str::to_string), reader.failed.take())?;
        read.map_err(|e| Failed::Local(e.to_string()))?;
        Ok(bytes.into())
    }

    /// Stores the moved weight `w` of a fetched form of `model_path` unless
    /// it is stored: any trusted signer's (its bytes must be the tensor its
    /// key names).
    fn weight(
        &self,
        store: &Store,
        w: &forms::MovedTensor,
        model_path: &str,
    ) -> Result<(), Failed> {
        let malformed = |why: String| Failed::Rejected("malformed", why);
        let key: EntryKey = w
            .key
            .parse()
            .map_err(|e| malformed(format!("the form names weight {:?}: {e}", w.key)))?;
        if store.stat(&key).map_err(Failed::Store)?.is_some() {
            return Ok(());
        }
        let trust = &self.shared.settings;
        let accepted = match self.manifest(&key, &trust.trust) {
            Err(Failed::Rejected("untrusted_key", _)) => self.manifest(&key, &trust.form_trust),
            other => other,
        }
        .map_err(|f| match f {
            Failed::Absent => Failed::Rejected(
                "incomplete_form",
                format!(
                    "weight {:?} of the form ({key}) is not on the remote",
                    w.name
                ),
            ),
            f => f,
        })?;
        let data_type = DataType::from_i32(w.data_type)
            .map_err(|e| malformed(format!("weight {:?}: {e}", w.name)))?;
        if accepted.payload.len != w.length {
            return Err(malformed(format!(
                "weight {:?} has {} bytes; the form reads {}",
                w.name, accepted.payload.len, w.length
            )));
        }
        let shape = SourceShape {
            data_type,
            dims: w.dims.clone(),
        };
        let new = manifest::new_entry(
            &accepted,
            shape,
            vec![w.name.clone()],
            vec![model_path.to_string()],
        );
        let mut reader = self.payload(&key, &accepted)?;
        let mut checked = Checked::new(&mut reader, accepted.payload);
        let mut proven = SourceMatch::new(&mut checked, data_type, &w.dims, key.source);
        let put = store.put(&new, &mut proven);
        let not_its_tensor = proven.mismatch().map(str::to_string);
        checked_stream(checked.mismatch().map(str::to_string), reader.failed.take())?;
        if let Some(why) = not_its_tensor {
            return Err(Failed::Rejected("not_its_tensor", why));
        }
        stored_as(put, &key)?;
        self.shared.counters.fetched(w.length);
        Ok(())
    }
}
