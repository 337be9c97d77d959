//! The checker: every structural rule of the proposal's "Validation"
//! section and of docs/FORMAT.md's Structured types. Errors name the rule, the compiled entry
//! and the field; none depends on the host's hardware.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::error::Result;

use crate::onnx::{Extension, Model, TensorRef};
use crate::pb;
use crate::structs::{self, Limits, PhysicalTypeKey, StructError, ValueLayout};

mod model_rules;
mod value_bytes;
pub use value_bytes::{data_files, payload_bytes, payload_ref, PayloadError};

/// Which compiled entry an error is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryRef {
    /// Position in `ModelProto.compiled_tensors`.
    pub index: usize,
    /// The entry's `source_name` (the initializer it compiles).
    pub source_name: String,
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckError {
    /// The rule's short name, e.g. `value.present`.
    pub rule: &'static str,
    /// The compiled entry at fault; `None` for model-level errors.
    pub entry: Option<EntryRef>,
    /// The field at fault, e.g. `value.external_data`.
    pub field: String,
    /// What is wrong, for humans.
    pub message: String,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] ", self.rule)?;
        if let Some(e) = &self.entry {
            write!(f, "compiled_tensors[{}] ({:?}) ", e.index, e.source_name)?;
        }
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Checker settings.
#[derive(Debug, Clone, Default)]
pub struct CheckOptions {
    /// Size and depth limits for the structured types and payloads.
    pub limits: Limits,
}

/// Why an entry's source initializer cannot be had ([`Checked::source`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The initializer of that name does not parse.
    #[error("the source initializer cannot be read: {0}")]
    Unreadable(String),
    /// The graph's initializers cannot be walked at all.
    #[error("the graph's initializers cannot be read: {0}")]
    GraphUnreadable(String),
    /// No top-level initializer has that name.
    #[error("no top-level initializer has this name")]
    Missing,
}

/// A value's layout, or why its type does not walk.
type Walked = std::result::Result<ValueLayout, StructError>;

/// A model with its extension decoded, ready for per-entry checks (shared by
/// the checker and the loading rules). Building it never fails: what cannot
/// be read becomes an error of the model, of an entry or of a source.
pub struct Checked<'m> {
    /// The model being checked.
    pub model: &'m Model,
    /// The compiled-tensor extension of the model, decoded.
    pub ext: Extension,
    /// The limits the checks apply.
    pub limits: Limits,
    /// How many top-level initializers carry each name (readable names of
    /// unparsable initializers included).
    pub initializer_names: HashMap<String, usize>,
    /// The parsed top-level initializers, by name.
    pub initializers: HashMap<String, TensorRef>,
    /// Why each unparsable (named) initializer cannot be read.
    pub bad_initializers: HashMap<String, String>,
    /// Why the graph's initializers cannot be read at all, if so.
    pub graph_error: Option<String>,
    /// Model-level errors (struct type table, devices).
    pub model_errors: Vec<CheckError>,
    /// Compiled tensors that do not decode (their slot holds a default entry).
    pub undecodable: HashMap<usize, CheckError>,
    /// Type-walk nodes left to this model's values (`max_model_nodes`).
    walk_budget: Cell<u64>,
    /// Values' layouts already walked, by (root type's address, dims): the
    /// rules ask for them more than once, and entries share types.
    layouts: RefCell<HashMap<(usize, Vec<u64>), Walked>>,
}

fn err(
    rule: &'static str,
    entry: Option<&EntryRef>,
    field: impl Into<String>,
    message: impl Into<String>,
) -> CheckError {
    CheckError {
        rule,
        entry: entry.cloned(),
        field: field.into(),
        message: message.into(),
    }
}

fn from_struct(e: StructError, entry: Option<&EntryRef>, prefix: &str) -> CheckError {
    CheckError {
        rule: e.rule,
        entry: entry.cloned(),
        field: format!("{prefix}{}", e.path),
        message: e.message,
    }
}

fn duplicate_key(props: &[pb::StringStringEntryProto]) -> Option<&str> {
    let mut seen = HashSet::new();
    props
        .iter()
        .find(|p| !seen.insert(p.key.as_str()))
        .map(|p| p.key.as_str())
}

impl<'m> Checked<'m> {
    /// Decodes the extension field by field (after counting its fields
    /// against the limits), reads the initializers one by one and runs the
    /// model-level rules.
    pub fn new(model: &'m Model, opts: &CheckOptions) -> Checked<'m> {
        let limits = opts.limits.clone();
        let mut model_errors = Vec::new();
        let mut undecodable = HashMap::new();
        let ext = if let Err(over) = model.extension_counts().within(&limits) {
            model_errors.push(err("model.limits", None, "ModelProto", over.to_string()));
            Extension::default()
        } else {
            let l = model.extension_lenient();
            if let Some(e) = l.table_error {
                model_errors.push(err(
                    "model.decode",
                    None,
                    "ModelProto.struct_types/devices",
                    e,
                ));
            }
            for (i, e) in l.entry_errors {
                let r = EntryRef {
                    index: i,
                    source_name: String::new(),
                };
                undecodable.insert(i, err("entry.decode", Some(&r), "CompiledTensorProto", e));
            }
            l.ext
        };
        let mut initializer_names = HashMap::new();
        let mut initializers = HashMap::new();
        let mut bad_initializers = HashMap::new();
        let mut graph_error = None;
        match model.initializer_results() {
            Ok(all) => {
                for t in all {
                    match t {
                        Ok(t) => {
                            *initializer_names.entry(t.name.clone()).or_insert(0) += 1;
                            initializers.insert(t.name.clone(), t);
                        }
                        Err(bad) => {
                            if let Some(name) = bad.name {
                                *initializer_names.entry(name.clone()).or_insert(0) += 1;
                                bad_initializers.insert(name, bad.error.to_string());
                            }
                        }
                    }
                }
            }
            Err(e) => graph_error = Some(e.to_string()),
        }
        let mut c = Checked {
            model,
            ext,
            limits,
            initializer_names,
            initializers,
            bad_initializers,
            graph_error,
            model_errors,
            undecodable,
            walk_budget: Cell::new(opts.limits.max_model_nodes),
            layouts: RefCell::default(),
        };
        c.model_errors
            .extend(model_rules::broken(&c.ext, &c.limits));
        c
    }

    /// The parsed source initializer of entry `i` (after `source_rule`
    /// passed), or why it cannot be read.
    pub fn source(&self, i: usize) -> std::result::Result<&TensorRef, SourceError> {
        let name = &self.ext.compiled_tensors[i].source_name;
        if let Some(t) = self.initializers.get(name) {
            return Ok(t);
        }
        if let Some(e) = self.bad_initializers.get(name) {
            return Err(SourceError::Unreadable(e.clone()));
        }
        Err(match &self.graph_error {
            Some(e) => SourceError::GraphUnreadable(e.clone()),
            None => SourceError::Missing,
        })
    }

    /// Names compiled entry `i` for an error.
    pub(crate) fn entry_ref(&self, i: usize) -> EntryRef {
        EntryRef {
            index: i,
            source_name: self.ext.compiled_tensors[i].source_name.clone(),
        }
    }

    /// `source_name` resolves to exactly one top-level initializer.
    pub(crate) fn source_rule(&self, i: usize) -> Option<CheckError> {
        let e = &self.ext.compiled_tensors[i];
        let r = self.entry_ref(i);
        match self
            .initializer_names
            .get(&e.source_name)
            .copied()
            .unwrap_or(0)
        {
            1 => None,
            0 => Some(err(
                "source.exists",
                Some(&r),
                "source_name",
                "no top-level initializer has this name",
            )),
            n => Some(err(
                "source.unique",
                Some(&r),
                "source_name",
                format!("{n} initializers have this name"),
            )),
        }
    }

    /// Non-empty digest and algorithm fields; a known algorithm's digest
    /// has that algorithm's length.
    pub(crate) fn digest_rule(&self, i: usize) -> Option<CheckError> {
        let e = &self.ext.compiled_tensors[i];
        let r = self.entry_ref(i);
        let known_len = e
            .digest_algorithm
            .parse::<crate::digest::Algorithm>()
            .ok()
            .map(|a| a.digest_len());
        if e.source_digest.is_empty() {
            Some(err(
                "digest.present",
                Some(&r),
                "source_digest",
                "empty source digest",
            ))
        } else if e.digest_algorithm.is_empty() {
            Some(err(
                "digest.present",
                Some(&r),
                "digest_algorithm",
                "empty digest algorithm",
            ))
        } else {
            known_len.filter(|&n| n != e.source_digest.len()).map(|n| {
                err(
                    "digest.length",
                    Some(&r),
                    "source_digest",
                    format!(
                        "{} bytes; a {} digest has {n}",
                        e.source_digest.len(),
                        e.digest_algorithm
                    ),
                )
            })
        }
    }

    /// `device` is an in-range model-level index.
    pub(crate) fn device_rule(&self, i: usize) -> Option<CheckError> {
        let e = &self.ext.compiled_tensors[i];
        let n = self.ext.devices.len();
        (usize::try_from(e.device).map_or(true, |d| d >= n)).then(|| {
            err(
                "device.index",
                Some(&self.entry_ref(i)),
                "device",
                format!("index {} is out of range ({n} devices)", e.device),
            )
        })
    }

    /// The value's concrete type resolves, is valid, and its size equals the
    /// payload length. Returns the concrete type on success.
    pub(crate) fn value_rule(
        &self,
        i: usize,
    ) -> std::result::Result<&pb::StructTypeProto, CheckError> {
        let e = &self.ext.compiled_tensors[i];
        let r = self.entry_ref(i);
        let value = e
            .value
            .as_ref()
            .ok_or_else(|| err("value.present", Some(&r), "value", "no StructProto value"))?;
        let root = structs::resolve_root(value, &self.ext.struct_types)
            .map_err(|e| from_struct(e, Some(&r), "value."))?;
        if root.kind.is_none() {
            return Err(err(
                "struct.unconstrained",
                Some(&r),
                "value",
                "an unconstrained static type is not a valid value type",
            ));
        }
        if value.r#type == -1 {
            if let Some(k) = duplicate_key(&root.metadata_props) {
                return Err(err(
                    "metadata.unique",
                    Some(&r),
                    "value.struct_type.metadata_props",
                    format!("duplicated key {k:?}"),
                ));
            }
        }
        let layout = self
            .layout(root, &value.dims)
            .map_err(|e| from_struct(e, Some(&r), "value."))?;
        let len = self.payload_len(value).map_err(|m| {
            err(
                "payload.external",
                Some(&r),
                "value.external_data",
                m.to_string(),
            )
        })?;
        if len != layout.byte_len {
            return Err(err(
                "payload.size",
                Some(&r),
                "value",
                format!(
                    "payload has {len} bytes, the type needs {}",
                    layout.byte_len
                ),
            ));
        }
        Ok(root)
    }

    /// The layout of a value of type `root` with `dims`, walked once.
    fn layout(
        &self,
        root: &pb::StructTypeProto,
        dims: &[u64],
    ) -> std::result::Result<ValueLayout, StructError> {
        let key = (root as *const pb::StructTypeProto as usize, dims.to_vec());
        if let Some(known) = self.layouts.borrow().get(&key) {
            return known.clone();
        }
        let table = &self.ext.struct_types;
        let walked =
            structs::check_value_within(root, dims, table, &self.limits, &self.walk_budget);
        self.layouts.borrow_mut().insert(key, walked.clone());
        walked
    }

    /// Payload length: inline bytes, or the external range (checked in the file).
    fn payload_len(&self, value: &pb::StructProto) -> std::result::Result<u64, PayloadError> {
        payload_bytes(self.model, value).map(|b| b.len() as u64)
    }

    /// Physical type key of a valid entry's concrete type.
    pub fn type_key(
        &self,
        root: &pb::StructTypeProto,
    ) -> std::result::Result<PhysicalTypeKey, StructError> {
        structs::physical_type_key(root, &self.ext.struct_types, &self.limits)
    }

    /// Every structural error of one entry, in rule order.
    pub(crate) fn entry_errors(&self, i: usize) -> Vec<CheckError> {
        if let Some(e) = self.undecodable.get(&i) {
            return vec![e.clone()];
        }
        let r = self.entry_ref(i);
        let mut out: Vec<CheckError> = [
            self.source_rule(i),
            self.digest_rule(i),
            self.device_rule(i),
        ]
        .into_iter()
        .flatten()
        .collect();
        if let Err(e) = self.value_rule(i) {
            out.push(e);
        }
        if let Some(k) = duplicate_key(&self.ext.compiled_tensors[i].metadata_props) {
            out.push(err(
                "metadata.unique",
                Some(&r),
                "metadata_props",
                format!("duplicated key {k:?}"),
            ));
        }
        out
    }
}

/// Checks a model: every structural rule, all errors collected.
pub fn check_model(model: &Model, opts: &CheckOptions) -> Result<Vec<CheckError>> {
    let c = Checked::new(model, opts);
    let mut errors = c.model_errors.clone();
    let mut keys: HashMap<(String, i32, PhysicalTypeKey), usize> = HashMap::new();
    for i in 0..c.ext.compiled_tensors.len() {
        let entry_errors = c.entry_errors(i);
        if let (true, Ok(root)) = (entry_errors.is_empty(), c.value_rule(i)) {
            let e = &c.ext.compiled_tensors[i];
            match c.type_key(root) {
                Ok(key) => {
                    if let Some(j) = keys.insert((e.source_name.clone(), e.device, key), i) {
                        errors.push(err(
                            "key.unique",
                            Some(&c.entry_ref(i)),
                            "(source_name, device, physical type)",
                            format!("same cache key as compiled_tensors[{j}]"),
                        ));
                    }
                }
                Err(e) => errors.push(from_struct(e, Some(&c.entry_ref(i)), "value.")),
            }
        }
        if entry_errors.is_empty() {
            if let Err(m) = c.source(i) {
                errors.push(err(
                    "source.readable",
                    Some(&c.entry_ref(i)),
                    "source_name",
                    m.to_string(),
                ));
            }
        }
        errors.extend(entry_errors);
    }
    Ok(errors)
}
