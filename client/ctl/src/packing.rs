//! Offline packing commands: `devices --local`, `formats`, `pack` and
//! `embed` (the "compile this model for this host" step). No daemon needed.

use std::path::Path;

use ctcache::onnx::rewrite::{self, Mode, RewriteOptions};
use ctcache::onnx::{graph, Model, TensorRef};
use ctcache_kernels::compile::{self, compile};
use ctcache_kernels::{Packer, Params};
use prost::Message;
use serde_json::json;

use crate::json::device as device_json;
use crate::output::{print_json, print_table, say, Failure};

fn packer(id: &str) -> Result<&'static dyn Packer, Failure> {
    ctcache_kernels::find(id).ok_or_else(|| {
        let known: Vec<&str> = ctcache_kernels::catalogue()
            .iter()
            .map(|p| p.id())
            .collect();
        Failure::Failed(format!(
            "unknown format {id:?} (known: {})",
            known.join(", ")
        ))
    })
}

fn params(raw: &[String]) -> Result<Params, Failure> {
    Params::parse(raw.iter()).map_err(|e| Failure::Failed(e.to_string()))
}

/// `devices --local`: this host as detected by this build.
pub fn devices(json: bool) -> Result<(), Failure> {
    print_devices(&compile::host_devices(), json)
}

/// Prints devices (local or the daemon's) the same way.
pub fn print_devices(devices: &[ctcache::pb::DeviceProto], json: bool) -> Result<(), Failure> {
    if json {
        return print_json(
            &json!({ "devices": devices.iter().map(device_json).collect::<Vec<_>>() }),
        );
    }
    let rows: Vec<Vec<String>> = devices
        .iter()
        .map(|d| vec![d.r#type.clone(), d.architecture.clone(), device_detail(d)])
        .collect();
    print_table(&["TYPE", "ARCHITECTURE", "DETAIL"], &rows)
}

/// What tells a device apart besides its architecture: a CPU's features,
/// a wgpu adapter's API and name (one adapter reached through Vulkan and
/// GL is two devices of one architecture).
fn device_detail(d: &ctcache::pb::DeviceProto) -> String {
    use ctcache::device::{CPU_FEATURES_KEY, WGPU_BACKEND_KEY, WGPU_NAME_KEY};
    let meta = |k| ctcache::structs::metadata(&d.metadata_props, k).unwrap_or("");
    match (
        meta(CPU_FEATURES_KEY),
        meta(WGPU_BACKEND_KEY),
        meta(WGPU_NAME_KEY),
    ) {
        (features, "", "") => features.to_string(),
        (_, backend, name) => format!("{backend}: {name}"),
    }
}

pub fn formats(json: bool) -> Result<(), Failure> {
    let all = ctcache_kernels::catalogue();
    if json {
        return print_json(&json!({
            "formats": all.iter().map(|p| json!({
                "id": p.id(),
                "version": p.format_version(),
                "description": p.describe(),
                "params": p.param_spec().iter().map(|s| json!({
                    "name": s.name, "default": s.default, "allowed": s.allowed, "doc": s.doc,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }));
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|p| {
            let params: Vec<String> = p
                .param_spec()
                .iter()
                .map(|s| format!("{}={}", s.name, s.default))
                .collect();
            vec![
                p.id().to_string(),
                p.format_version().to_string(),
                params.join(" "),
                p.describe().to_string(),
            ]
        })
        .collect();
    print_table(
        &["FORMAT", "VERSION", "PARAMS (defaults)", "DESCRIPTION"],
        &rows,
    )
}

fn find_initializer(model: &Model, name: &str) -> Result<TensorRef, Failure> {
    model
        .initializers()?
        .into_iter()
        .find(|t| t.name == name)
        .ok_or_else(|| Failure::Failed(format!("no top-level initializer named {name:?}")))
}

pub struct PackArgs<'a> {
    pub model: &'a Path,
    pub initializer: &'a str,
    pub format: &'a str,
    pub params: &'a [String],
    pub backend: &'a str,
    pub output: &'a Path,
    pub type_out: Option<&'a Path>,
}

pub fn pack(a: PackArgs<'_>, json: bool) -> Result<(), Failure> {
    let backend = match a.backend {
        "wgpu" => compile::BackendChoice::Wgpu,
        _ => compile::BackendChoice::Cpu,
    };
    let p = packer(a.format)?;
    let params = params(a.params)?;
    let model = Model::open(a.model)?;
    let t = find_initializer(&model, a.initializer)?;
    // Neither file may be the model: refused before anything is packed.
    let (output, made) = out_file(a.output, Some(&model), None)?;
    let type_out = a
        .type_out
        .map(|p| out_file(p, Some(&model), None))
        .transpose()?;
    let c = compile::compile_on(&model, &t, None, p, &params, backend)
        .map_err(|e| Failure::Failed(e.to_string()))?;
    write_all(&output, &c.payload)?;
    if let Some((out, made)) = type_out {
        write_all(&out, &c.layout.struct_type.encode_to_vec())?;
        made.keep();
    }
    made.keep();
    if json {
        return print_json(&json!({
            "initializer": t.name,
            "format": p.id(),
            "physical_type": c.layout.struct_type.name,
            "dims": c.layout.dims,
            "payload_len": c.payload.len(),
            "source_digest": c.digest.hex(),
            "device": device_json(&c.device),
            "pack_ms": c.duration.as_secs_f64() * 1e3,
            "backend": c.backend.name(),
        }));
    }
    say(&format!(
        "{}: {} -> {} ({} bytes, {:.1} ms)",
        t.name,
        c.layout.struct_type.name,
        a.output.display(),
        c.payload.len(),
        c.duration.as_secs_f64() * 1e3
    ))
}

/// The output `path`, its folder opened (missing folders made, removed
/// again when the guard is dropped before `keep`), refused when it is the
/// file of `input` (`hint`: what to do instead; no input: writing in place
/// was asked for). Every command that writes a file opens it here.
pub fn out_file(
    path: &Path,
    input: Option<&Model>,
    hint: Option<&str>,
) -> Result<(ctcache::outdir::OutFile, crate::output::MadeDir), Failure> {
    let (out, made) = crate::output::create(path)?;
    out.refuse_input(input.and_then(Model::stamp), "model", hint)?;
    Ok((out, made))
}

/// Writes `bytes` to `out`, whole or not at all.
fn write_all(out: &ctcache::outdir::OutFile, bytes: &[u8]) -> Result<(), Failure> {
    out.dir
        .write(&out.name, |w| std::io::Write::write_all(w, bytes))
        .map_err(|e| ctcache::Error::write(out.path(), e))?;
    Ok(())
}

/// The hint of a rewrite whose output is its input: in place on request.
pub const IN_PLACE_HINT: &str = "choose another path, or add --force to rewrite it in place";

pub struct EmbedArgs<'a> {
    pub model: &'a Path,
    pub output: &'a Path,
    pub format: Option<&'a str>,
    pub params: &'a [String],
    pub initializers: &'a [String],
    pub sidecar: bool,
    pub replace: bool,
    /// The output may be the model (rewritten in place).
    pub force: bool,
}

/// Offline embed: packs here, in this process.
pub fn embed(a: EmbedArgs<'_>, json: bool) -> Result<(), Failure> {
    let format = a.format.ok_or_else(|| {
        Failure::Usage(
            "embed without a daemon needs --format (the daemon's policy is not available offline)"
                .into(),
        )
    })?;
    let p = packer(format)?;
    let params = params(a.params)?;
    let model = Model::open(a.model)?;
    // In place only when asked (--force).
    let input = (!a.force).then_some(&model);
    let (output, made) = out_file(a.output, input, Some(IN_PLACE_HINT))?;
    let all = model.initializers()?;
    // Named initializers must exist and be accepted; without names, every
    // initializer the packer accepts and the default policy's size and use
    // filters admit (as the daemon does for a named format).
    let selected: Vec<&TensorRef> = if a.initializers.is_empty() {
        let uses = graph::weight_uses(&model)?;
        all.iter()
            .filter(|t| uses.admits(t, graph::DEFAULT_MIN_ELEMENTS, &graph::DEFAULT_USED_AS))
            .filter(|t| compile::accepts(t, p, &params).is_ok())
            .collect()
    } else {
        let mut v = Vec::new();
        for name in a.initializers {
            let t = all.iter().find(|t| &t.name == name).ok_or_else(|| {
                Failure::Failed(format!("no top-level initializer named {name:?}"))
            })?;
            compile::accepts(t, p, &params).map_err(|e| Failure::Failed(format!("{name}: {e}")))?;
            v.push(t);
        }
        v
    };
    if selected.is_empty() {
        let filters = graph::describe_filter(graph::DEFAULT_MIN_ELEMENTS, &graph::DEFAULT_USED_AS);
        return Err(Failure::Failed(graph::nothing_to_pack(
            a.model,
            &format!(
                "no initializer that {} accepts passes the filters ({filters}); \
                 --initializer NAME packs a named one",
                p.id()
            ),
        )));
    }
    let mut entries = Vec::with_capacity(selected.len());
    for t in selected {
        let c = compile(&model, t, None, p, &params).map_err(|e| Failure::Failed(e.to_string()))?;
        entries.push(c.to_embedded());
    }
    let opts = RewriteOptions {
        all_to_sidecar: a.sidecar,
        ..Default::default()
    };
    let mode = if a.replace { Mode::Replace } else { Mode::Add };
    let report = rewrite::embed_into(&model, &entries, &output, mode, &opts)?;
    made.keep();
    if json {
        return print_json(&json!({
            "via": "local",
            "output": a.output,
            "entries": report.entries,
            "packed": report.entries,
            "inline_bytes": report.inline_bytes,
            "sidecar": report.sidecar,
            "sidecar_bytes": report.sidecar_bytes,
        }));
    }
    let placed = match &report.sidecar {
        Some(p) => format!(
            "{} inline, {} in {}",
            crate::human::size(report.inline_bytes),
            crate::human::size(report.sidecar_bytes),
            p.display()
        ),
        None => format!("{} inline", crate::human::size(report.inline_bytes)),
    };
    say(&format!(
        "{}: {} compiled tensor(s) embedded, {} packed now ({placed})",
        a.output.display(),
        report.entries,
        report.entries,
    ))
}
