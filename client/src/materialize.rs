//! Materialize to a file, written by this process with its own rights: the
//! daemon writes no file where a caller points. It answers the model in
//! memory for the output's data folder and leases the payloads; this
//! places the payload files (each checked against its entry's blake3) and
//! writes the model (`ctcache_files::answer`), then releases the leases.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ctcache_files::answer::{self, Answer, AnswerFile, Written};
use ctcache_files::outdir::OutFile;
use ctcache_files::place::LinkMode;
use ctcache_files::FileStamp;

use crate::error::{Error, Result};
use crate::{absolute, api, Client};

/// How long the answer's leases last: the copies must be made within it
/// (they are released as soon as the model is written).
const WRITE_LEASE: Duration = Duration::from_secs(600);

/// A model the daemon built for a file, not written yet: its leases last
/// [`WRITE_LEASE`] unless [`Client::write_materialized`] releases them.
#[derive(Debug)]
pub struct ForFile {
    answer: api::MaterializeResponse,
    output: PathBuf,
    data_folder: String,
    input: Option<FileStamp>,
}

impl Client {
    /// Materializes the request's model into `output`:
    /// [`Client::materialize_for_file`], then [`Client::write_materialized`].
    pub async fn materialize_to(
        &self,
        req: api::MaterializeRequest,
        output: &Path,
        mode: LinkMode,
        stop: &Arc<AtomicBool>,
    ) -> Result<api::MaterializeResponse> {
        let built = self.materialize_for_file(req, output).await?;
        self.write_materialized(built, mode, stop).await
    }

    /// Asks the daemon to build the request's model for the file `output`
    /// (packing what is missing): nothing is written yet. Dropping the
    /// call stops the daemon's work.
    pub async fn materialize_for_file(
        &self,
        mut req: api::MaterializeRequest,
        output: &Path,
    ) -> Result<ForFile> {
        let output = absolute(output)?;
        let Some(name) = output.file_name() else {
            return Err(Error::InvalidArgument(format!(
                "{} has no file name",
                output.display()
            )));
        };
        let data_folder = answer::data_folder_name(name);
        let input = FileStamp::of_path(Path::new(&req.model_path)).ok();
        req.in_memory = true;
        req.lease_ttl_ms = WRITE_LEASE.as_millis() as u64;
        req.data_folder = data_folder.clone();
        Ok(ForFile {
            answer: self.materialize(req).await?,
            output,
            data_folder,
            input,
        })
    }

    /// Writes a built model with this process's rights, its folders made
    /// when missing: the payload files placed in `<output>.weights/` by
    /// `mode` (a hard link only where the kernel lets this process make
    /// one, else a copy), each checked against its entry, then the model.
    /// Once `stop` is set the write stops between files and removes what it
    /// made. The answer says what was placed and how.
    pub async fn write_materialized(
        &self,
        built: ForFile,
        mode: LinkMode,
        stop: &Arc<AtomicBool>,
    ) -> Result<api::MaterializeResponse> {
        let leases: Vec<u64> = built.answer.leases.iter().map(|l| l.lease_id).collect();
        let stop = stop.clone();
        let written = blocking(move || {
            let output = &built.output;
            let (out, made) = OutFile::create(output).map_err(|e| io_error(output, e))?;
            let written = write(&built, &out, mode, &|| stop.load(Ordering::Relaxed));
            if written.is_err() {
                // Folders made for this output, deepest first.
                for dir in made.iter().rev() {
                    let _ = std::fs::remove_dir(dir);
                }
            }
            written.map(|report| finished(built.answer, output, mode, &report))
        })
        .await;
        for id in leases {
            let _ = self.release_lease(id).await;
        }
        written
    }
}

/// Writes `built` to `out`.
fn write(
    built: &ForFile,
    out: &OutFile,
    mode: LinkMode,
    stop: &dyn Fn() -> bool,
) -> Result<Written> {
    let files = answer_files(&built.answer)?;
    let answer = Answer {
        model: &built.answer.model,
        data_folder: &built.data_folder,
        files: &files,
    };
    Ok(answer::write_answer(&answer, out, built.input, mode, stop)?)
}

/// Runs blocking file work off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(Error::InvalidArgument(format!("the write failed: {e}"))))
}

/// Each file the answer names, with the leased entry it copies.
fn answer_files(r: &api::MaterializeResponse) -> Result<Vec<AnswerFile>> {
    r.payload_files
        .iter()
        .map(|f| {
            let entry = r
                .leases
                .iter()
                .filter_map(|l| l.entry.as_ref())
                .find(|e| e.key == f.key)
                .ok_or_else(|| bad_answer(format!("no lease for the entry of {}", f.name)))?;
            let mut blake3 = [0u8; 32];
            hex::decode_to_slice(&entry.payload_blake3, &mut blake3)
                .map_err(|e| bad_answer(format!("entry {}: payload_blake3: {e}", f.key)))?;
            Ok(AnswerFile {
                name: f.name.clone(),
                source: PathBuf::from(&entry.payload_path),
                blake3,
            })
        })
        .collect()
}

/// The answer as the caller sees it: what was written, the model's bytes
/// and the released leases left out.
fn finished(
    r: api::MaterializeResponse,
    output: &Path,
    mode: LinkMode,
    written: &Written,
) -> api::MaterializeResponse {
    let r = api::MaterializeResponse {
        model: Default::default(),
        leases: Vec::new(),
        external_data_dir: String::new(),
        ..r
    };
    ctcache_api::placed::with_files_written(r, output, mode, written)
}

fn bad_answer(detail: String) -> Error {
    Error::InvalidArgument(format!(
        "the daemon's Materialize answer is not usable: {detail}"
    ))
}

fn io_error(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
