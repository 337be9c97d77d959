//! What a materialize wrote.

use std::path::PathBuf;

use ctcache_files::place::{LinkMode, Method, Placed};

/// What a materialize wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// MatMul / Gemm nodes replaced by MatMulNBits.
    pub nodes_rewritten: usize,
    /// Float weights no node uses any more, dropped from the model.
    pub initializers_removed: usize,
    /// The folder beside the model that holds the payload files.
    pub data_dir: PathBuf,
    /// How files were asked to be placed.
    pub link: LinkMode,
    /// Every file placed in the data folder, and how.
    pub files: Vec<Placed>,
    /// Bytes copied into files (0 when every file is a reflink or a link).
    pub bytes_copied: u64,
    /// Size of the written model file.
    pub model_bytes: u64,
    /// Bytes of payload the new model references.
    pub payload_bytes: u64,
}

impl Report {
    /// How many files were placed by `method`.
    pub fn count(&self, method: Method) -> usize {
        self.files.iter().filter(|f| f.method == method).count()
    }
}
