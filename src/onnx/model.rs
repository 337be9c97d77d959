//! `Model`: a memory-mapped ONNX model with an index of its top-level fields.
//! Nothing of the model is copied; tensors and compiled payloads are borrowed
//! from the mapping (or from mapped external-data files).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use prost::Message;

use crate::access::{Opener, OwnRights};
use crate::error::{Error, Result};
use crate::fsutil::FileStamp;
use crate::onnx::fields::*;
use crate::onnx::tensor::TensorRef;
use crate::pb;
use crate::wire::{Fields, Value, WireError};

mod extension;
mod external_data;
pub use extension::{Extension, ExtensionCounts, LenientExtension, OverLimits};
pub use external_data::ExternalFileError;

/// One top-level `ModelProto` field occurrence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopField {
    /// The field number.
    pub number: u32,
    /// Tag to end of value, in model bytes.
    pub span: Range<usize>,
    /// The value bytes of a length-delimited field (empty range otherwise).
    pub value: Range<usize>,
}

/// A top-level initializer that does not parse: its name when readable.
#[derive(Debug)]
pub struct BadInitializer {
    /// The initializer's name, when that much could be read.
    pub name: Option<String>,
    /// Why it does not parse.
    pub error: Error,
}

/// Graph fields of one kind (nodes, initializers) read at most: each is
/// decoded into a message many times the 2 bytes an empty field takes, so a
/// small file could otherwise ask for gigabytes. Large real graphs have some
/// hundred thousand nodes.
const MAX_GRAPH_FIELDS: usize = 1 << 20;

/// Top-level fields indexed at most: the extension's limits (1M devices, 1M
/// compiled tensors, 4096 struct types) and the few fields of ONNX's own.
const MAX_TOP_FIELDS: usize = (2 << 20) + 8192;

/// A mapped model and its folder (for external data).
pub struct Model {
    path: Option<PathBuf>,
    dir: PathBuf,
    bytes: Bytes,
    top: Vec<TopField>,
    /// The model file's stamp when it was opened.
    stamp: Option<FileStamp>,
    /// Opens external-data files (with whose rights the model was opened).
    opener: Arc<dyn Opener>,
    externals: Mutex<HashMap<PathBuf, (Bytes, FileStamp)>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.path)
            .field("bytes", &self.bytes.len())
            .field("top_fields", &self.top.len())
            .finish()
    }
}

/// Maps a whole open file read-only (an empty file gives empty bytes);
/// `path` names it in errors.
fn map_file(file: &File, path: &Path) -> Result<Bytes> {
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Ok(Bytes::new());
    }
    // SAFETY: the mapping is read-only. Bytes written to the file later
    // show through it (readers copy what they hash and use); a truncation
    // under it reads as zeros instead of ending the process (guarded), and
    // readers check `intact` after reading.
    let map = unsafe { memmap2::Mmap::map(file) }.map_err(|e| Error::io(path, e))?;
    let guarded = super::guarded::Guarded::new(map).ok_or_else(|| {
        Error::Limit(format!(
            "{}: every slot of the truncation guard is taken by other mappings; try again when \
             fewer models are being read",
            path.display()
        ))
    })?;
    Ok(Bytes::from_owner(guarded))
}

/// What a top-level wire error means: the file ends inside a field (cut
/// short, or a length nothing can satisfy), or the bytes are not protobuf.
fn not_a_model(len: usize, e: WireError) -> Error {
    use crate::wire::WireProblem::{LengthTooLarge, Truncated};
    Error::NotAModel(match e.problem {
        LengthTooLarge(n) => format!(
            "not a complete ONNX model (truncated at byte {len}: a field declares {n} bytes at \
             byte {}, which exceeds the end of the file)",
            e.offset
        ),
        Truncated => format!(
            "not a complete ONNX model (truncated at byte {len}: the value at byte {} is cut off)",
            e.offset
        ),
        _ => format!(
            "not an ONNX model (malformed protobuf at byte {}: {})",
            e.offset, e.problem
        ),
    })
}

impl Model {
    /// Opens and maps a model file with the process's own rights.
    pub fn open(path: impl AsRef<Path>) -> Result<Model> {
        let path = path.as_ref();
        let file = crate::access::open_regular(path).map_err(|e| Error::io(path, e))?;
        Model::from_file(file, path, Arc::new(OwnRights))
    }

    /// Maps the open model `file` (found at `path`); its external data is
    /// opened through `opener` (the rights the model was opened with).
    pub fn from_file(file: File, path: &Path, opener: Arc<dyn Opener>) -> Result<Model> {
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::Model(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let stamp = FileStamp::of_file(&file).map_err(|e| Error::io(path, e))?;
        let bytes = map_file(&file, path)?;
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let mut model = Model::from_bytes(bytes, dir).map_err(|e| e.in_file(path))?;
        if !super::intact(model.bytes()) {
            return Err(Error::Model(format!(
                "{}: {}",
                path.display(),
                super::CUT_SHORT
            )));
        }
        model.path = Some(path.to_path_buf());
        model.stamp = Some(stamp);
        model.opener = opener;
        Ok(model)
    }

    /// Wraps model bytes already in memory; `dir` resolves external data.
    pub fn from_bytes(bytes: Bytes, dir: impl Into<PathBuf>) -> Result<Model> {
        if bytes.is_empty() {
            return Err(Error::NotAModel("empty file: not an ONNX model".into()));
        }
        let mut top = Vec::new();
        let mut has_graph = false;
        for field in Fields::new(&bytes) {
            let field = field.map_err(|e| not_a_model(bytes.len(), e))?;
            if top.len() == MAX_TOP_FIELDS {
                return Err(Error::Model(format!(
                    "more than {MAX_TOP_FIELDS} top-level fields: more than any model this tool \
                     reads (each costs an index entry ~20 times its 2 bytes)"
                )));
            }
            let expects_bytes = field.number == MODEL_GRAPH || is_compiled_field(field.number);
            let value = match field.value {
                Value::Bytes(b) => field.value_start..field.value_start + b.len(),
                other if expects_bytes => {
                    return Err(Error::Wire {
                        context: "ModelProto".into(),
                        offset: field.span.start,
                        problem: crate::wire::WireProblem::UnexpectedWireType {
                            field: field.number,
                            got: other.kind(),
                            expected: "length-delimited",
                        },
                    })
                }
                _ => field.span.end..field.span.end,
            };
            has_graph |= field.number == MODEL_GRAPH;
            top.push(TopField {
                number: field.number,
                span: field.span,
                value,
            });
        }
        if !has_graph {
            return Err(Error::NotAModel(
                "not an ONNX model (no graph: ModelProto field 7 is missing)".into(),
            ));
        }
        Ok(Model {
            path: None,
            dir: dir.into(),
            bytes,
            top,
            stamp: None,
            opener: Arc::new(OwnRights),
            externals: Mutex::new(HashMap::new()),
        })
    }

    /// The model file (`None` for bytes in memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The model file's stamp when it was opened (`None` for bytes in memory).
    pub fn stamp(&self) -> Option<FileStamp> {
        self.stamp
    }

    /// A parse error of this model, naming its file when it has one.
    fn named(&self, e: Error) -> Error {
        match &self.path {
            Some(p) => e.in_file(p),
            None => e,
        }
    }

    /// The folder external data is resolved against.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The whole model, as mapped or given.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Every top-level field occurrence, in file order.
    pub(crate) fn top_fields(&self) -> &[TopField] {
        &self.top
    }

    /// Spans of the graph's fields with the given number, in file order, over
    /// every occurrence of `ModelProto.graph` (protobuf merges repeats).
    pub(crate) fn graph_fields(&self, number: u32) -> Result<Vec<Range<usize>>> {
        let mut out = Vec::new();
        for g in self.top.iter().filter(|f| f.number == MODEL_GRAPH) {
            for field in Fields::with_base(&self.bytes[g.value.clone()], g.value.start) {
                let field = field.map_err(|e| self.named(Error::wire("GraphProto", e)))?;
                if field.number == number {
                    if out.len() == MAX_GRAPH_FIELDS {
                        let what = match number {
                            GRAPH_NODE => "nodes",
                            GRAPH_INITIALIZER => "initializers",
                            _ => "fields of one kind",
                        };
                        return Err(self.named(Error::Model(format!(
                            "the graph has more than {MAX_GRAPH_FIELDS} {what}: more than any \
                             model this tool reads"
                        ))));
                    }
                    let b = field
                        .bytes()
                        .map_err(|e| self.named(Error::wire("GraphProto", e)))?;
                    out.push(field.value_start..field.value_start + b.len());
                }
            }
        }
        Ok(out)
    }

    /// The top-level graph initializers, in file order.
    pub fn initializers(&self) -> Result<Vec<TensorRef>> {
        self.graph_fields(GRAPH_INITIALIZER)?
            .into_iter()
            .map(|r| TensorRef::parse(&self.bytes, r).map_err(|e| self.named(e)))
            .collect()
    }

    /// The top-level graph initializers one by one, in file order: one that
    /// does not parse does not hide the others. Fails only when the graph
    /// itself cannot be walked.
    pub(crate) fn initializer_results(&self) -> Result<Vec<Result<TensorRef, BadInitializer>>> {
        Ok(self
            .graph_fields(GRAPH_INITIALIZER)?
            .into_iter()
            .map(|r| {
                TensorRef::parse(&self.bytes, r.clone()).map_err(|error| BadInitializer {
                    name: TensorRef::name_of(&self.bytes, r),
                    error,
                })
            })
            .collect())
    }

    /// The model's first opset import that `wanted` accepts.
    pub(crate) fn opset_import(
        &self,
        wanted: impl Fn(&pb::OperatorSetIdProto) -> bool,
    ) -> Result<Option<pb::OperatorSetIdProto>> {
        for f in self
            .top
            .iter()
            .filter(|f| f.number == super::fields::MODEL_OPSET_IMPORT)
        {
            let o: pb::OperatorSetIdProto =
                decode(self.bytes.slice(f.value.clone()), "OperatorSetIdProto")?;
            if wanted(&o) {
                return Ok(Some(o));
            }
        }
        Ok(None)
    }

    /// The version of the ai.onnx opset the model imports, if it imports it.
    pub(crate) fn default_opset(&self) -> Result<Option<i64>> {
        Ok(self
            .opset_import(|o| o.domain.is_empty() || o.domain == "ai.onnx")?
            .map(|o| o.version))
    }

    /// The graph's value infos of one field (`GRAPH_INPUT`, `GRAPH_OUTPUT`
    /// or `GRAPH_VALUE_INFO`), decoded, in file order.
    pub(crate) fn value_infos(&self, field: u32) -> Result<Vec<pb::ValueInfoProto>> {
        self.graph_fields(field)?
            .into_iter()
            .map(|r| decode(self.bytes.slice(r), "ValueInfoProto").map_err(|e| self.named(e)))
            .collect()
    }

    /// The graph's nodes, decoded (initializer payloads are not touched).
    pub fn nodes(&self) -> Result<Vec<pb::NodeProto>> {
        self.nodes_one_by_one()?.collect()
    }

    /// The graph's nodes, each decoded only when the iterator reaches it:
    /// a caller that keeps what it needs of each never holds them all.
    pub(crate) fn nodes_one_by_one(
        &self,
    ) -> Result<impl Iterator<Item = Result<pb::NodeProto>> + '_> {
        Ok(self
            .graph_fields(GRAPH_NODE)?
            .into_iter()
            .map(|r| decode(self.bytes.slice(r), "NodeProto").map_err(|e| self.named(e))))
    }
}

#[cfg(test)]
impl Model {
    /// A model of `graph` (IR 8, importing ai.onnx `opset`), for tests.
    pub(crate) fn of_graph(graph: pb::GraphProto, opset: i64) -> Model {
        let m = pb::ModelProto {
            ir_version: 8,
            opset_import: vec![pb::OperatorSetIdProto {
                domain: String::new(),
                version: opset,
            }],
            graph: Some(graph),
            ..Default::default()
        };
        Model::from_bytes(Bytes::from(prost::Message::encode_to_vec(&m)), ".").unwrap()
    }
}

/// Decodes a message from a slice of the mapping (bytes fields stay borrowed).
pub(crate) fn decode<M: Message + Default>(bytes: Bytes, what: &str) -> Result<M> {
    M::decode(bytes).map_err(|e| Error::decode(what, e))
}
