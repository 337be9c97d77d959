//! The core crate's error type: every failure names what was wrong and where.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed protobuf in {context} at byte {offset}: {problem}")]
    Wire {
        context: String,
        offset: usize,
        problem: crate::wire::WireProblem,
    },
    #[error("invalid model: {0}")]
    Model(String),
    #[error("tensor {name:?}: {problem}")]
    Tensor { name: String, problem: String },
    #[error("tensor {name:?}: external data: {problem}")]
    External { name: String, problem: String },
    #[error("unknown tensor data type {0}")]
    UnknownDataType(i32),
    #[error("unknown digest algorithm {0:?} (known: blake3, sha256)")]
    UnknownAlgorithm(String),
    #[error("struct type: {0}")]
    Struct(#[from] crate::structs::StructError),
    #[error("cannot decode {what}: {message}")]
    Decode { what: String, message: String },
    #[error("rewrite: {0}")]
    Rewrite(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: path.into(),
            source,
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
