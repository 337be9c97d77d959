//! One compile: the runtime's worker writes its form to an unnamed file of
//! the store's tmp/. Of onnxruntime's optimized model, the large
//! initializers become entries of their own (identity payloads, shared
//! with every equal tensor), and the rest, naming them, is the form's
//! entry; OpenVINO's compiled model is the form's entry whole.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctcache::access::NoFiles;
use ctcache::forms::{self, FormKey};
use ctcache::onnx::{Model, Storage, TensorRef};
use ctcache::store::{Entry, EntryKey, NewEntry, Producer};
use ctcache_kernels::compile::BackendChoice;
use ctcache_kernels::Params;

use super::super::{blocking, model, pack, Error, Result};
use super::fetched;
use super::source::Source;
use crate::fleet::{Ask, FormShape};
use crate::runtimes::{CompileFailure, Configured, Identified};
use crate::state::Daemon;

/// A made form and how long its compile took (`None`: fetched from the
/// fleet), as every request that shared the compile gets it.
pub(super) type Made = (Entry, Option<Duration>);

/// How long one compile may run.
const COMPILE_LIMIT: Duration = Duration::from_secs(600);

/// Initializers of at least this many bytes are moved out of the form's
/// model into entries of their own, which a session maps in place.
const MOVE_AT_BYTES: u64 = 64 << 10;

/// A compile to run: the model, the key it is filed under, who asked.
pub(super) struct Job {
    pub d: Arc<Daemon>,
    pub rt: Arc<Configured>,
    pub key: FormKey,
    /// The store's key of the form `key` names.
    pub entry_key: EntryKey,
    pub model: Source,
    pub requested_by: Option<u32>,
}

impl Job {
    /// Fetches the form from the fleet, else runs the compile, its model
    /// made whole first where it is pending (a fetch needs only the key).
    pub(super) async fn run(self) -> Result<Made> {
        if let Some(form) = self.fetched().await? {
            return Ok((form, None));
        }
        let model = self.model.opened().await?;
        let compile = Compile {
            d: self.d,
            rt: self.rt,
            key: self.key,
            model,
            requested_by: self.requested_by,
        };
        compile.run().await
    }

    /// The form, fetched from the fleet tier where one is configured and
    /// its `fetch` asks, or taken from a fetch under way (the fetch stops
    /// when nobody waits any more).
    async fn fetched(&self) -> Result<Option<Entry>> {
        let asks = self
            .d
            .fleet
            .as_ref()
            .is_some_and(|f| f.asks_for_forms(Ask::CostRule));
        let path = self.model.path().display().to_string();
        if !asks {
            // A fetch under way (a pull's) is joined; none of its own starts.
            return fetched::under_way(&self.d, &self.entry_key, &path)
                .await
                .unwrap_or(Ok(None));
        }
        let asked = (self.entry_key, form_shape(&self.d, &self.key));
        fetched::fetched(&self.d, asked, path).await
    }
}

/// How the fleet tier takes a form of `key`: OpenVINO's whole, onnxruntime's
/// as a model (at most what an answer carries) and its weights.
pub(super) fn form_shape(d: &Daemon, key: &FormKey) -> FormShape {
    if key.runtime.name == "openvino" {
        FormShape::Whole
    } else {
        FormShape::WithWeights {
            max_model: super::served::max_model(d) as u64,
        }
    }
}

/// A job whose model is whole.
struct Compile {
    d: Arc<Daemon>,
    rt: Arc<Configured>,
    key: FormKey,
    model: model::OpenedModel,
    requested_by: Option<u32>,
}

impl Compile {
    async fn run(self) -> Result<Made> {
        tracing::info!(
            model = %self.model.path.display(),
            runtime = self.rt.name,
            options = ?self.key.options,
            "compile queued"
        );
        let _slot = self
            .d
            .compile_slots
            .acquire()
            .await
            .map_err(|_| Error::cancelled("the daemon is stopping"))?;
        let d = self.d.clone();
        let out = blocking(move || {
            d.store
                .unnamed_temp_file()
                .map_err(|e| Error::from_io(e, "a file for the form"))
        })
        .await?;
        let started = Instant::now();
        let bytes = self.private_copy().await?;
        let len = bytes.len() as u64;
        let (outcome, cpu) = self.rt.compile(&self.key, bytes, &out, COMPILE_LIMIT).await;
        // The worker's CPU is the asking uid's, as its requests' own is.
        if let Some(uid) = self.requested_by {
            self.d.cpu_budget.payer(uid).charge(cpu);
        }
        let made_by = outcome.map_err(|f| self.failure(f, len))?;
        // Filed under the identity the daemon found at start: the library
        // at that path must still be that one.
        if made_by != self.key.runtime {
            return Err(Error::precondition(format!(
                "the {} library changed since the daemon identified it ({} {}; now {} {}): \
                 restart ctcached to make forms with it",
                self.rt.name,
                self.key.runtime.version,
                self.key.runtime.build,
                made_by.version,
                made_by.build
            )));
        }
        let took = started.elapsed();
        let identified = self
            .rt
            .identified()
            .await
            .map_err(|e| Error::internal(e.to_string()))?;
        let path = self.model.path.clone();
        let publish = Publish {
            d: self.d.clone(),
            key: self.key.clone(),
            producer: producer(&self.rt, &identified, self.requested_by),
            model_path: path.display().to_string(),
            took,
        };
        let d = self.d.clone();
        let entry = blocking(move || {
            let (form, weights) = publish.run(out)?;
            if let Some(fleet) = &d.fleet {
                fleet.compiled(&d.store, &form, &weights);
            }
            Ok(form)
        })
        .await?;
        tracing::info!(
            model = %path.display(),
            key = %entry.key,
            seconds = took.as_secs_f64(),
            "compiled"
        );
        Ok((entry, Some(took)))
    }

    /// The model's bytes as the worker gets them: copied out of the
    /// caller's files (whose owner may write them meanwhile), its external
    /// data put inline (the worker opens no file), and hashed again, so
    /// that the form filed under the key is made of the bytes the key
    /// names (a file cut short reads as zeros: another digest).
    async fn private_copy(&self) -> Result<bytes::Bytes> {
        let (model, expected) = (self.model.model.clone(), self.key.model);
        blocking(move || {
            let changed = || {
                // Abandoned, not a fault of the daemon's (UNAVAILABLE would
                // read as a daemon gone): ABORTED, asking again may succeed.
                Error::new(
                    crate::error::ErrorKind::Cancelled,
                    "the model changed while it was read; ask again",
                )
            };
            let copy = whole_copy(&model).map_err(|_| changed())?;
            let m = Model::from_bytes(copy.clone(), ".").map_err(|_| changed())?;
            // Hashed only while it holds its weights: nothing is opened.
            if forms::external_initializer(&m)
                .map_err(|e| Error::invalid(e.to_string()))?
                .is_some()
            {
                return Err(changed());
            }
            let again = forms::model_digest(&m).map_err(|e| Error::invalid(e.to_string()))?;
            if again != expected {
                return Err(changed());
            }
            Ok(copy)
        })
        .await
    }

    /// A worker's failure as the caller's error: the runtime's refusal is
    /// the caller's model (INVALID_ARGUMENT), a full store folder is
    /// RESOURCE_EXHAUSTED.
    fn failure(&self, f: CompileFailure, model_len: u64) -> Error {
        let path = self.model.path.display();
        // A full disk first: a runtime reports a failed save as its own
        // failure ("Protobuf serialization failed").
        if self.store_full(model_len) {
            return Error::exhausted(format!(
                "compiling {path}: the store's folder has no room for the form ({f})"
            ));
        }
        match f {
            CompileFailure::Refused(words) => Error::invalid(format!("{path}: {words}")),
            CompileFailure::Timeout { .. } | CompileFailure::OutOfMemory { .. } => {
                Error::exhausted(format!("compiling {path}: {f}"))
            }
            f => Error::internal(format!("compiling {path}: {f}")),
        }
    }

    /// The store's filesystem has less room than the model takes.
    fn store_full(&self, model_len: u64) -> bool {
        rustix::fs::statvfs(self.d.store.dir())
            .is_ok_and(|s| s.f_bavail.saturating_mul(s.f_frsize) < model_len.max(1 << 20))
    }
}

/// Who made a form: the runtime's worker, and the library file it loaded
/// (provenance).
fn producer(rt: &Configured, id: &Identified, requested_by: Option<u32>) -> Producer {
    Producer {
        packer_id: format!("{}-worker", rt.name),
        packer_version: format!("library blake3 {}", id.library_blake3),
        client_uid: None,
        requested_by,
    }
}

/// Publishing what a worker wrote.
struct Publish {
    d: Arc<Daemon>,
    key: FormKey,
    producer: Producer,
    model_path: String,
    took: Duration,
}

impl Publish {
    /// Stores what the worker wrote to `out` under the form's key: the
    /// form's entry and those of the weights it names.
    fn run(self, out: std::fs::File) -> Result<(Entry, Vec<Entry>)> {
        if self.key.runtime.name == "openvino" {
            Ok((self.whole(out)?, Vec::new()))
        } else {
            self.split(out)
        }
    }

    /// The form's entry of `payload`, `len` bytes.
    fn new_entry(&self, len: u64) -> Result<NewEntry> {
        Ok(NewEntry {
            source: self.key.source(),
            source_shape: FormKey::source_shape(),
            device: self.key.device_proto(),
            physical_type: self
                .key
                .physical_type()
                .ok_or_else(|| Error::internal("no form type"))?,
            dims: vec![len],
            producer: self.producer.clone(),
            source_names: Vec::new(),
            model_paths: vec![self.model_path.clone()],
            pack_duration: self.took,
        })
    }

    /// Stores the worker's output as it is (OpenVINO's compiled model,
    /// which `import_model` reads from one mapping).
    fn whole(self, mut out: std::fs::File) -> Result<Entry> {
        use std::io::Seek;
        let len = out
            .seek(std::io::SeekFrom::End(0))
            .and_then(|n| out.rewind().map(|()| n))
            .map_err(|e| Error::from_io(e, "the worker's output"))?;
        let new = self.new_entry(len)?;
        Ok(self.d.store.put(&new, out)?.entry)
    }

    /// Stores the large initializers of the worker's model `out`, then the
    /// model naming them (onnxruntime's optimized model).
    fn split(self, out: std::fs::File) -> Result<(Entry, Vec<Entry>)> {
        // The file is the daemon's alone now (the worker has ended), and
        // the model names no file anyone may have it open.
        let model = Model::from_file(out, Path::new("the optimized model"), Arc::new(NoFiles))
            .map_err(|e| Error::internal(format!("the worker's model: {e}")))?;
        let initializers = model
            .initializers()
            .map_err(|e| Error::internal(format!("the worker's model: {e}")))?;
        let identity = ctcache_kernels::find(ctcache_kernels::formats::identity::ID)
            .ok_or_else(|| Error::internal("no identity packer"))?;
        let params = Params::parse(std::iter::empty::<String>())
            .map_err(|e| Error::internal(e.to_string()))?;
        let (mut moved, mut weights) = (HashMap::new(), Vec::new());
        for (i, t) in initializers.iter().enumerate() {
            if let Some(weight) = self.move_out(&model, t, identity, &params)? {
                moved.insert(i, weight.key.to_string());
                weights.push(weight);
            }
        }
        let skeleton = forms::split(&model, &moved)
            .map_err(|e| Error::internal(format!("the worker's model: {e}")))?;
        let new = self.new_entry(skeleton.len() as u64)?;
        Ok((self.d.store.put(&new, &skeleton[..])?.entry, weights))
    }

    /// Stores initializer `t` as an identity entry when it is large enough
    /// to be worth mapping; that entry, or `None` when it stays.
    fn move_out(
        &self,
        model: &Model,
        t: &TensorRef,
        identity: &dyn ctcache_kernels::Packer,
        params: &Params,
    ) -> Result<Option<Entry>> {
        match &t.storage {
            Storage::Raw(_) => {}
            // What onnxruntime writes inline: anything else stays as it is.
            Storage::Typed(_) => return Ok(None),
            Storage::External(_) => {
                return Err(Error::internal(format!(
                    "the worker's model holds {:?} as external data",
                    t.name
                )))
            }
        }
        let big = t.raw_size().is_some_and(|n| n >= MOVE_AT_BYTES);
        if !big || identity.check_source(t.data_type, &t.dims, params).is_err() {
            return Ok(None);
        }
        let (c, _share) = ctcache_kernels::compile::compile_held(
            model,
            t,
            None,
            identity,
            params,
            BackendChoice::Cpu,
        )?;
        let new = pack::new_entry(
            &c,
            self.producer.requested_by,
            vec![self.model_path.clone()],
        );
        Ok(Some(self.d.store.put(&new, &c.payload[..])?.entry))
    }
}

/// `m`'s bytes with every top-level initializer held as external data put
/// inline, copied (read from the guarded mappings of its files).
fn whole_copy(m: &Model) -> ctcache::Result<bytes::Bytes> {
    let mut data = HashMap::new();
    for t in m.initializers()? {
        if matches!(t.storage, Storage::External(_)) {
            if let Some(bytes) = m.mapped_data(&t)? {
                data.insert(t.name.clone(), bytes::Bytes::copy_from_slice(&bytes));
            }
        }
    }
    if data.is_empty() {
        return Ok(bytes::Bytes::copy_from_slice(m.bytes()));
    }
    Ok(bytes::Bytes::from(forms::inline(m, &data)?))
}
