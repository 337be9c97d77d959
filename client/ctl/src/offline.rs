//! Offline commands: they read model files and need no daemon.

use std::path::Path;

use ctcache::check::{check_model, CheckOptions};
use ctcache::digest::{digest_all, Algorithm};
use ctcache::hit::Accept;
use ctcache::onnx::{rewrite, Model};
use ctcache::resolve::{classify, Host, MissReason, Status};
use serde_json::json;

use crate::output::{print_json, print_table, say, Failure};

fn open(model: &Path) -> Result<Model, Failure> {
    Ok(Model::open(model)?)
}

/// The host as the loading rules see it: its devices, no runtime named, the
/// layouts this build's packers produce.
fn host() -> Host {
    Host::new(
        ctcache_kernels::compile::host_devices(),
        None,
        Accept::Known(ctcache_kernels::registry::known_types()),
    )
}

pub fn check(path: &Path, json: bool) -> Result<(), Failure> {
    let model = open(path)?;
    let tensors = model.initializers()?;
    // Every initializer's data must be readable and of the declared size.
    for t in &tensors {
        model.mapped_data(t)?;
    }
    let errors = check_model(&model, &CheckOptions::default())?;
    let compiled = model.extension()?.compiled_tensors.len();
    if json {
        print_json(&json!({
            "valid": errors.is_empty(),
            "initializers": tensors.len(),
            "compiled_tensors": compiled,
            "errors": errors.iter().map(|e| json!({
                "rule": e.rule,
                "entry": e.entry.as_ref().map(|r| r.index),
                "source_name": e.entry.as_ref().map(|r| r.source_name.clone()),
                "field": e.field,
                "message": e.message,
            })).collect::<Vec<_>>(),
        }))?;
    }
    if errors.is_empty() {
        if !json {
            say(&format!(
                "{}: valid ({} initializers, {} compiled tensors)",
                path.display(),
                tensors.len(),
                compiled
            ))?;
        }
        return Ok(());
    }
    let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    Err(Failure::Failed(format!(
        "{}: {} error(s)\n{}",
        path.display(),
        errors.len(),
        lines.join("\n")
    )))
}

pub fn digest(path: &Path, algorithm: &str, json: bool) -> Result<(), Failure> {
    let alg: Algorithm = algorithm.parse()?;
    let model = open(path)?;
    let tensors = model.initializers()?;
    let digests = digest_all(&model, &tensors, alg);
    let mut rows = Vec::with_capacity(tensors.len());
    for (t, d) in tensors.iter().zip(digests) {
        rows.push((t, d?));
    }
    if json {
        return print_json(&json!({
            "initializers": rows.iter().map(|(t, d)| json!({
                "name": t.name,
                "data_type": t.data_type.code(),
                "data_type_name": t.data_type.name(),
                "dims": t.dims,
                "storage": t.storage.kind(),
                "algorithm": d.algorithm.name(),
                "digest": d.hex(),
            })).collect::<Vec<_>>(),
        }));
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|(t, d)| {
            vec![
                t.name.clone(),
                t.data_type.name().to_string(),
                format!("{:?}", t.dims),
                t.storage.kind().to_string(),
                d.to_string(),
            ]
        })
        .collect();
    print_table(&["NAME", "TYPE", "DIMS", "STORAGE", "DIGEST"], &table)
}

pub fn inspect(path: &Path, json: bool) -> Result<(), Failure> {
    let model = open(path)?;
    let host = host();
    let statuses = classify(&model, &host, &CheckOptions::default());
    if json {
        return print_json(&json!({
            "host_devices": host.devices().iter().map(ctcache::device::describe).collect::<Vec<_>>(),
            "compiled_tensors": statuses.iter().map(|e| {
                let (status, reason) = status_of(&e.status);
                json!({
                    "index": e.index,
                    "source_name": e.source_name,
                    "device": e.device,
                    "physical_type": e.physical_type,
                    "status": status,
                    "reason": reason.map(|r| r.code()),
                    "detail": reason.map(|r| r.to_string()),
                    "packer": e.layout.as_ref().map(|l| l.packer.clone()),
                    "params": e.layout.as_ref().map(|l| l.params.clone()),
                })
            }).collect::<Vec<_>>(),
        }));
    }
    if statuses.is_empty() {
        return say(&format!("{}: no compiled tensors", path.display()));
    }
    let rows: Vec<Vec<String>> = statuses
        .iter()
        .map(|e| {
            let (status, reason) = status_of(&e.status);
            vec![
                e.index.to_string(),
                e.source_name.clone(),
                e.device.clone(),
                e.physical_type.clone(),
                status.to_string(),
                reason.map(|r| r.to_string()).unwrap_or_default(),
            ]
        })
        .collect();
    print_table(
        &["#", "SOURCE", "DEVICE", "PHYSICAL TYPE", "STATUS", "REASON"],
        &rows,
    )
}

fn status_of(s: &Status) -> (&'static str, Option<&MissReason>) {
    match s {
        Status::Hit { .. } => ("hit", None),
        Status::Miss(r) => ("miss", Some(r)),
    }
}

pub fn strip(path: &Path, output: &Path, force: bool, json: bool) -> Result<(), Failure> {
    let model = open(path)?;
    let had = model.extension()?.compiled_tensors.len();
    let input = (!force).then_some(&model);
    let (out, made) = crate::packing::out_file(output, input, Some(crate::packing::IN_PLACE_HINT))?;
    rewrite::strip_into(&model, &out)?;
    made.keep();
    if json {
        return print_json(&json!({ "output": output, "removed": had }));
    }
    say(&format!(
        "{}: removed {had} compiled tensor(s)",
        output.display()
    ))
}
