//! Embed, its output written into files this process makes: the output's
//! folders are made when missing, the model and its sidecar are made there
//! as temp files with this process's rights and handed over with the
//! model; the daemon writes into them and opens no output path, and this
//! process renames them into place in the order the answer says.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use ctcache_files::outdir::{OutDir, OutFile, Temp};

use crate::error::{Error, Result};
use crate::{absolute, api, Client, Repeat};

/// The temp files an Embed is written into, and where they go.
struct Made {
    out: OutFile,
    sidecar_name: OsString,
    model: (std::fs::File, Temp),
    sidecar: (std::fs::File, Temp),
    /// Folders made for the output, outermost first.
    folders: Vec<PathBuf>,
}

impl Client {
    /// Writes a copy of a model with compiled tensors embedded (packing
    /// what is missing) to the request's output, its folders made when
    /// missing; the paths are made absolute here. The output's files are
    /// this process's, made with its rights.
    pub async fn embed(&self, mut req: api::EmbedRequest) -> Result<api::EmbedResponse> {
        req.model_path = absolute(Path::new(&req.model_path))?.display().to_string();
        let output = absolute(Path::new(&req.output_path))?;
        req.output_path = output.display().to_string();
        let made = make(&output)?;
        let outputs = [
            ("folder", made.out.dir.as_fd()),
            ("model", made.model.0.as_fd()),
            ("sidecar", made.sidecar.0.as_fd()),
        ];
        let answer = self
            .call_naming_model(
                "Embed",
                Repeat::Never,
                (req, &outputs),
                |mut grpc, req| async move { grpc.embed(req).await },
            )
            .await;
        finish(made, answer)
    }
}

/// The output's folder (made when missing) and the two temp files in it.
fn make(output: &Path) -> Result<Made> {
    let io = |source| Error::Io {
        path: output.to_path_buf(),
        source,
    };
    let (out, folders) = OutFile::create(output).map_err(io)?;
    let mut sidecar_name = out.name.clone();
    sidecar_name.push(".ctdata");
    let model = out.dir.create_temp(&out.name, false).map_err(io)?;
    let sidecar = match out.dir.create_temp(&sidecar_name, false) {
        Ok(s) => s,
        Err(e) => {
            out.dir.discard(model.1);
            return Err(io(e));
        }
    };
    Ok(Made {
        out,
        sidecar_name,
        model,
        sidecar,
        folders,
    })
}

/// Puts the written files in place (the sidecar first when the answer says
/// so; an unused sidecar goes), or removes what was made.
fn finish(made: Made, answer: Result<api::EmbedResponse>) -> Result<api::EmbedResponse> {
    let dir: &OutDir = &made.out.dir;
    let Ok(r) = answer else {
        dir.discard(made.model.1);
        dir.discard(made.sidecar.1);
        for f in made.folders.iter().rev() {
            let _ = std::fs::remove_dir(f);
        }
        return answer;
    };
    let io = |source| Error::Io {
        path: made.out.path(),
        source,
    };
    let model = (made.model.1, made.out.name.as_os_str());
    let sidecar = (made.sidecar.1, made.sidecar_name.as_os_str());
    if r.sidecar_path.is_empty() {
        dir.discard(sidecar.0);
        dir.commit(model.0, model.1).map_err(io)?;
    } else if r.sidecar_first {
        dir.commit(sidecar.0, sidecar.1).map_err(io)?;
        dir.commit(model.0, model.1).map_err(io)?;
    } else {
        dir.commit(model.0, model.1).map_err(io)?;
        dir.commit(sidecar.0, sidecar.1).map_err(io)?;
    }
    dir.sync().map_err(io)?;
    Ok(r)
}
