//! `materialize --local`: every weight the plan reads packed in this
//! process, into the output's data folder, then the model written over
//! those files. Ctrl-C stops it between weights and removes what it packed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ctcache::cancel::Cancel;
use ctcache::materialize::{self as mat, PackedWeight, Recipe, WeightKey};
use ctcache::onnx::Model;
use ctcache_client::api;
use ctcache_files::answer::data_file_name;
use ctcache_kernels::{compile, Params};

use super::args::MaterializeArgs;
use super::report::report;
use crate::ctx::Ctx;
use crate::output::Failure;

/// Packs every weight the plan needs in this process, straight into the
/// output's weights folder, then writes the model over those files.
pub(super) fn materialize_local(ctx: &Ctx, a: &MaterializeArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let recipe = a.recipe()?;
    let model = Model::open(&a.model)?;
    // Refused before anything is packed or written.
    let (output, made) = crate::packing::out_file(&a.output, Some(&model), None)?;
    let plan = mat::plan_for(&model, &recipe)?;
    if let Some(why) = plan.why_nothing() {
        return Err(Failure::Failed(format!("nothing to materialize: {why}")));
    }
    let cancel = crate::interrupt::on_ctrl_c()?;
    let data_dir = data_dir_of(&a.output)?;
    let (_, made_data) = crate::output::create(&data_dir.join("x"))?;
    let mut run = LocalRun {
        model: &model,
        recipe: &recipe,
        data_dir: &data_dir,
        cancel: &cancel,
        created: Vec::new(),
    };
    let written = run.pack(&plan).and_then(|weights| {
        // The payloads are packed in place: whatever the mode, nothing to link.
        let r = mat::write(
            &model,
            &plan,
            recipe.clone(),
            &weights,
            &output,
            a.link_mode(),
            &cancel,
        )?;
        Ok((r, weights.len()))
    });
    let (r, packed) = written.inspect_err(|_| run.remove_created())?;
    made_data.keep();
    made.keep();
    let response = api::MaterializeResponse {
        packed: packed as u32,
        // Every payload byte was written here.
        bytes_copied: r.bytes_copied + r.payload_bytes,
        ..ctcache_convert::materialize::materialize_response(&a.output, &plan, &r, &recipe)
    };
    report(ctx, a, "local", &response, started.elapsed())
}

/// `<out>.weights`, beside the output model.
fn data_dir_of(output: &Path) -> Result<PathBuf, Failure> {
    let out_dir = match output.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok(out_dir.join(mat::data_dir_name(output)?))
}

/// A materialize packed in this process, into the data folder.
struct LocalRun<'a> {
    model: &'a Model,
    recipe: &'a Recipe,
    data_dir: &'a Path,
    cancel: &'a Cancel,
    /// Payload files this run made (a failure or Ctrl-C removes them).
    created: Vec<PathBuf>,
}

impl LocalRun<'_> {
    /// Packs every weight the plan reads, each payload written in the data
    /// folder under its content's name; stops between weights on Ctrl-C.
    fn pack(&mut self, plan: &mat::Plan) -> Result<HashMap<WeightKey, PackedWeight>, Failure> {
        let initializers = self.model.initializers()?;
        let mut weights = HashMap::new();
        for pack in plan.packs(self.recipe) {
            self.cancel.check()?;
            let (name, transposed) = pack.key;
            let packer =
                ctcache_kernels::find(pack.packer).expect("materialize's packers are built in");
            let params = Params::parse(pack.params).map_err(|e| Failure::Failed(e.to_string()))?;
            let t = initializers
                .iter()
                .find(|t| t.name == name)
                .ok_or_else(|| Failure::Failed(format!("no initializer {name:?}")))?;
            let c = compile::compile(self.model, t, None, packer, &params)
                .map_err(|e| Failure::Failed(e.to_string()))?;
            // Named by content, like the daemon's links, and written in
            // place: placing a file onto itself is a no-op.
            let file_name = data_file_name(blake3::hash(&c.payload).as_bytes());
            let path = self.data_dir.join(&file_name);
            if !path.exists() {
                self.created.push(path.clone());
            }
            ctcache::fsutil::atomic_write(&path, |w| std::io::Write::write_all(w, &c.payload))?;
            let w = PackedWeight {
                payload_path: path,
                checked: None,
                file_name,
                struct_type: c.layout.struct_type,
                dims: c.layout.dims,
            };
            weights.insert((name, transposed), w);
        }
        Ok(weights)
    }

    fn remove_created(&self) {
        for p in &self.created {
            let _ = std::fs::remove_file(p);
        }
    }
}
