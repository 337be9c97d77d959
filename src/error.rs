//! The core crate's error type: every failure names what was wrong and where.

use std::path::PathBuf;

/// The core crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a core operation failed; the message names the file, tensor or field.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure; `action` is what was being done ("read", "write").
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was being done: `read` or `write`.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Bytes that do not parse as protobuf.
    #[error("malformed protobuf in {context} at byte {offset}: {problem}")]
    Wire {
        /// Which message was being read, e.g. `ModelProto`.
        context: String,
        /// Byte offset of the bad field.
        offset: usize,
        /// What was wrong with the bytes.
        problem: crate::wire::WireProblem,
    },
    /// A model that parses but breaks an ONNX rule ctcache relies on.
    #[error("invalid model: {0}")]
    Model(String),
    /// Bytes that are not (or not wholly) an ONNX model; says which.
    #[error("{0}")]
    NotAModel(String),
    /// An initializer that cannot be read as a tensor.
    #[error("tensor {name:?}: {problem}")]
    Tensor {
        /// The initializer's name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The request is over a bound this reader keeps (external-data files
    /// per model, bytes an answer may carry): asking the same way fails the
    /// same way, a smaller request may not.
    #[error("{0}")]
    Limit(String),
    /// An initializer's external data cannot be resolved or read.
    #[error("tensor {name:?}: external data: {problem}")]
    External {
        /// The initializer's name.
        name: String,
        /// What is wrong with the reference or the file.
        problem: String,
    },
    /// A `TensorProto.DataType` code this build does not know.
    #[error("unknown tensor data type {0}")]
    UnknownDataType(i32),
    /// A digest algorithm name other than `blake3` or `sha256`.
    #[error("unknown digest algorithm {0:?} (known: blake3, sha256)")]
    UnknownAlgorithm(String),
    /// A structured type or value breaks a struct rule.
    #[error("struct type: {0}")]
    Struct(#[from] crate::structs::StructError),
    /// A protobuf message of the extension does not decode.
    #[error("cannot decode {what}: {message}")]
    Decode {
        /// Which message, e.g. `CompiledTensorProto`.
        what: String,
        /// The decoder's error.
        message: String,
    },
    /// The byte-preserving rewrite cannot produce the model asked for.
    #[error("rewrite: {0}")]
    Rewrite(String),
    /// The filesystem or platform cannot do what was asked.
    #[error("{0}")]
    Unsupported(String),
    /// A cached payload whose bytes are no longer the ones hashed (D12):
    /// found while placing it, so nothing of it was placed.
    #[error("payload {}: {problem}", path.display())]
    PayloadChanged {
        /// The payload file.
        path: PathBuf,
        /// What differs: the bytes of a group, or the file itself.
        problem: String,
    },
    /// The call was asked to stop ([`crate::cancel::Cancel`]); what it had
    /// made is removed.
    #[error("cancelled")]
    Cancelled,
    /// A file that is not (or not wholly) what it should be, by name.
    #[error("{}: {problem}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: Box<Error>,
    },
}

impl Error {
    /// Reading `path` failed.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            action: "read",
            path: path.into(),
            source,
        }
    }

    /// Writing `path` failed.
    pub fn write(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            action: "write",
            path: path.into(),
            source,
        }
    }

    /// What went wrong under the files this error names.
    pub fn cause(&self) -> &Error {
        match self {
            Error::InFile { problem, .. } => problem.cause(),
            other => other,
        }
    }

    /// This error, as a problem of the file at `path`.
    pub(crate) fn in_file(self, path: &std::path::Path) -> Error {
        Error::InFile {
            path: path.to_path_buf(),
            problem: Box::new(self),
        }
    }

    /// A malformed field of the message `context` names.
    pub(crate) fn wire(context: &str, e: crate::wire::WireError) -> Error {
        Error::Wire {
            context: context.into(),
            offset: e.offset,
            problem: e.problem,
        }
    }

    /// A prost decode failure, with prost's field stack shortened (a nesting
    /// bomb would otherwise print thousands of frames).
    pub(crate) fn decode(what: &str, e: prost::DecodeError) -> Error {
        let mut message = e.to_string();
        if message.len() > 240 {
            let cut = (0..=240)
                .rev()
                .find(|&i| message.is_char_boundary(i))
                .unwrap_or(0);
            message.truncate(cut);
            message.push_str("...");
        }
        if message.contains("recursion limit") || e.to_string().contains("recursion limit") {
            message = format!("nesting depth exceeds the decoder's recursion limit ({message})");
        }
        Error::Decode {
            what: what.to_string(),
            message,
        }
    }

    pub(crate) fn tensor(name: &str, problem: impl Into<String>) -> Error {
        Error::Tensor {
            name: name.to_string(),
            problem: problem.into(),
        }
    }

    pub(crate) fn external(name: &str, problem: impl Into<String>) -> Error {
        Error::External {
            name: name.to_string(),
            problem: problem.into(),
        }
    }
}

impl From<ctcache_files::Error> for Error {
    fn from(e: ctcache_files::Error) -> Error {
        use ctcache_files::Error as F;
        match e {
            F::Io {
                action,
                path,
                source,
            } => Error::Io {
                action,
                path,
                source,
            },
            F::Unsupported(why) => Error::Unsupported(why),
            F::PayloadChanged { path, problem } => Error::PayloadChanged { path, problem },
            F::BadAnswer(why) => Error::Rewrite(why),
            F::Cancelled => Error::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use prost::Message;

    use crate::onnx::Model;
    use crate::pb;

    fn model_bytes() -> Vec<u8> {
        pb::ModelProto {
            ir_version: 9,
            graph: Some(pb::GraphProto {
                name: "g".into(),
                node: vec![pb::NodeProto {
                    op_type: "Relu".into(),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn open_err(name: &str, bytes: &[u8]) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        let e = Model::open(&path).unwrap_err().to_string();
        let prefix = format!("{}: ", path.display());
        assert!(e.starts_with(&prefix), "{e:?} does not name the file");
        e[prefix.len()..].to_string()
    }

    #[test]
    fn a_truncated_model_names_its_file_and_where_it_ends() {
        let whole = model_bytes();
        assert!(whole.len() > 19);
        let e = open_err("trunc.onnx", &whole[..19]);
        assert!(
            e.starts_with("not a complete ONNX model (truncated at byte 19: "),
            "{e}"
        );
        // Cut inside a field's length varint: the end of input, said so.
        let e = open_err("cut.onnx", &whole[..3]);
        assert!(
            e.starts_with("not a complete ONNX model (truncated at byte 3"),
            "{e}"
        );
    }

    #[test]
    fn other_files_say_they_are_not_models() {
        assert_eq!(open_err("e.onnx", b""), "empty file: not an ONNX model");
        let e = open_err("text.onnx", b"This is not an ONNX model.\n");
        assert!(
            e.starts_with("not an ONNX model (malformed protobuf at byte "),
            "{e}"
        );
        // Well-formed protobuf without a graph.
        let e = open_err(
            "nograph.onnx",
            &pb::ModelProto {
                ir_version: 9,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        assert!(e.starts_with("not an ONNX model (no graph"), "{e}");
    }

    #[test]
    fn a_write_into_a_missing_folder_says_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("nonexistent").join("x.bin");
        let e = crate::fsutil::atomic_write(&out, |w| std::io::Write::write_all(w, b"x"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("cannot write {}: ", out.display())),
            "{e}"
        );
    }
}
