//! `why-miss MODEL INITIALIZER`: which key component keeps an initializer
//! from a usable entry: its digest (stale), the device, the physical type or
//! the format version. From the daemon's own miss reason and the entries it
//! lists for the digest (and for the model under older digests). Its hint
//! is a command that, run as printed, packs what is missing.

use std::path::PathBuf;

use ctcache::hit::{self, Accept, EntryFacts, Host, MissReason, SourceShape};
use ctcache::materialize as mat;
use ctcache::pb::{DeviceProto, StructTypeProto};
use ctcache::structs::PhysicalTypeKey;
use serde_json::{json, Value};

use crate::ctx::Ctx;
use crate::human::{self, shell_word, Style, Table};
use crate::json;
use crate::output::{print_json, say, Failure};
use ctcache_client::{api, Client, ResolveOptions};

/// A stored entry close to what was wanted, and the component that differs.
struct Candidate {
    entry: api::Entry,
    differs: Option<&'static str>,
    detail: String,
}

/// What why-miss found out about one initializer: the daemon's answers
/// and the verdict read from them.
struct Finding {
    model_path: String,
    tensor: api::TensorResolution,
    lookup_miss: Option<api::Miss>,
    candidates: Vec<Candidate>,
    /// The miss reason (`None`: a hit) and the sentence explaining it.
    reason: Option<String>,
    detail: String,
    hint: Option<String>,
}

pub async fn why_miss(ctx: &Ctx, model: PathBuf, name: String) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let res = c.resolve_model(&model, &ResolveOptions::default()).await?;
    let t = initializer(&res, &name)?.clone();
    let lookup = c
        .lookup(api::LookupRequest {
            source_digest: t.source_digest.clone(),
            digest_algorithm: t.digest_algorithm.clone(),
            ..Default::default()
        })
        .await?;
    let candidates = candidates(&c, &res.model_path, &t).await?;
    let (reason, detail) = verdict(&t, lookup.miss.as_ref(), &candidates);
    let hint = match reason {
        None => None,
        Some(_) => prepack_hint(ctx, &res.model_path, &t),
    };
    let f = Finding {
        model_path: res.model_path,
        tensor: t,
        lookup_miss: lookup.miss,
        candidates,
        reason,
        detail,
        hint,
    };
    if ctx.json {
        return print_json(&f.json());
    }
    f.print(ctx)
}

/// The initializer `name` of the resolved model, or why there is none.
fn initializer<'r>(
    res: &'r api::ResolveModelResponse,
    name: &str,
) -> Result<&'r api::TensorResolution, Failure> {
    if let Some(t) = res.tensors.iter().find(|t| t.name == name) {
        return Ok(t);
    }
    if let Some(n) = res.not_sources.iter().find(|n| n.name == name) {
        return Err(Failure::Failed(format!(
            "{name} is not a compiled-tensor source: {}",
            n.reason
        )));
    }
    Err(Failure::Failed(format!(
        "{}: no top-level initializer named {name:?}",
        res.model_path
    )))
}

/// The stored entries close to what `t` wants: those of its digest, each
/// judged on the daemon's host, and those of the model packed from the
/// initializer's former contents.
async fn candidates(
    c: &Client,
    model_path: &str,
    t: &api::TensorResolution,
) -> Result<Vec<Candidate>, Failure> {
    let same = c
        .list(api::ListRequest {
            source_digest: t.source_digest.clone(),
            ..Default::default()
        })
        .await?;
    let by_model = c
        .list(api::ListRequest {
            model_path: model_path.to_string(),
            ..Default::default()
        })
        .await?;
    let host = Host::new(
        c.get_host_devices().await?,
        None,
        Accept::Known(ctcache_kernels::registry::known_types()),
    );
    let source = ctcache::dtype::DataType::from_i32(t.data_type)
        .ok()
        .map(|data_type| SourceShape {
            data_type,
            dims: t.dims.clone(),
        });
    let mut candidates: Vec<Candidate> = same
        .into_iter()
        .map(|e| classify(e, &host, source.as_ref()))
        .collect();
    let name = &t.name;
    let digest_hex = hex::encode(&t.source_digest);
    for e in by_model
        .into_iter()
        .filter(|e| e.source_names.contains(name) && e.source_digest != t.source_digest)
    {
        let detail = format!(
            "packed from other contents ({} digest {}…); {name} now has {}…",
            e.digest_algorithm,
            &hex::encode(&e.source_digest)[..12],
            &digest_hex[..12]
        );
        candidates.push(Candidate {
            entry: e,
            differs: Some("digest"),
            detail,
        });
    }
    Ok(candidates)
}

/// The miss reason of `t` (`None`: a hit) and the sentence explaining it:
/// the daemon's own lookup miss when nothing is usable, a stale digest
/// when only former contents have entries, else the resolution's misses.
fn verdict(
    t: &api::TensorResolution,
    lookup_miss: Option<&api::Miss>,
    candidates: &[Candidate],
) -> (Option<String>, String) {
    if t.misses.is_empty() && !t.entries.is_empty() {
        (
            None,
            human::count(t.entries.len() as u64, "usable entry", "usable entries"),
        )
    } else if let (true, Some(m)) = (
        t.entries.is_empty(),
        lookup_miss.filter(|m| m.reason != MissReason::NoEntry.code()),
    ) {
        (Some(m.reason.clone()), m.detail.clone())
    } else if t.entries.is_empty() && candidates.iter().any(|c| c.differs == Some("digest")) {
        (
            Some(MissReason::StaleDigest.code().to_string()),
            "entries exist for this initializer's former contents only".to_string(),
        )
    } else if let Some(m) = t.misses.first() {
        (
            Some(m.reason.clone()),
            t.misses
                .iter()
                .map(|m| m.detail.clone())
                .collect::<Vec<_>>()
                .join("; "),
        )
    } else {
        (Some(MissReason::NoEntry.code().to_string()), "nothing is wanted or stored for this initializer (the policy selects none of its formats)".to_string())
    }
}

impl Finding {
    /// The `--json` document.
    fn json(&self) -> Value {
        let t = &self.tensor;
        json!({
            "model_path": self.model_path,
            "initializer": t.name,
            "source_digest": hex::encode(&t.source_digest),
            "digest_algorithm": t.digest_algorithm,
            "hit": self.reason.is_none(),
            "reason": self.reason,
            "detail": self.detail,
            "wanted_formats": t.wanted_formats,
            "usable": t.entries.iter().map(|e| e.key.clone()).collect::<Vec<_>>(),
            "misses": t.misses.iter().map(json::miss).collect::<Vec<_>>(),
            "lookup_miss": self.lookup_miss.as_ref().map(json::miss),
            "candidates": self.candidates.iter().map(candidate_json).collect::<Vec<_>>(),
            "hint": self.hint,
        })
    }

    /// The verdict, the digest and wanted formats, the candidates' table
    /// and the hint, for people.
    fn print(&self, ctx: &Ctx) -> Result<(), Failure> {
        let t = &self.tensor;
        let verdict = match &self.reason {
            None => ctx.paint("hit", Style::Green),
            Some(r) => ctx.paint(&format!("miss ({r})"), Style::Red),
        };
        say(&format!("{} in {}: {verdict}", t.name, self.model_path))?;
        say(&format!("  {}", self.detail))?;
        say(&format!(
            "  digest {}:{}; wanted: {}",
            t.digest_algorithm,
            hex::encode(&t.source_digest),
            if t.wanted_formats.is_empty() {
                "-".into()
            } else {
                t.wanted_formats.join(", ")
            }
        ))?;
        if !self.candidates.is_empty() {
            candidates_table(&self.candidates).print(ctx.color)?;
        }
        if let (Some(h), false) = (&self.hint, ctx.quiet) {
            say(&format!("hint: {h}"))?;
        }
        Ok(())
    }
}

/// The candidates as a table: each entry and the component that differs.
fn candidates_table(candidates: &[Candidate]) -> Table {
    let mut tab = Table::new(&[
        "ENTRY",
        "PHYSICAL TYPE",
        "VERSION",
        "DEVICE",
        "DIFFERS",
        "DETAIL",
    ]);
    for c in candidates {
        let e = &c.entry;
        tab.row(vec![
            (human::short_key(&e.key), Style::Plain),
            (e.physical_type.clone(), Style::Plain),
            (e.format_version.to_string(), Style::Plain),
            (json::describe_device(e.device.as_ref()), Style::Plain),
            (
                c.differs.unwrap_or("-").to_string(),
                if c.differs.is_some() {
                    Style::Yellow
                } else {
                    Style::Green
                },
            ),
            (c.detail.clone(), Style::Plain),
        ]);
    }
    tab
}

/// A command that packs what the initializer misses, as it can be pasted
/// into a shell: the wanted formats (every miss reason is cured by packing
/// them again for this host), or, when the policy wants none, the format
/// `materialize` packs it into when it rewrites a node that reads it. None
/// when nothing would use a packed form (a Gather table, a LayerNorm bias).
fn prepack_hint(ctx: &Ctx, model: &str, t: &api::TensorResolution) -> Option<String> {
    let mut cmd = vec!["ctcachectl".to_string()];
    if let Some(s) = &ctx.socket {
        cmd.extend(["--socket".into(), shell_word(&s.display().to_string())]);
    }
    cmd.extend([
        "prepack".into(),
        shell_word(model),
        "--initializer".into(),
        shell_word(&t.name),
    ]);
    if !t.wanted_formats.is_empty() {
        cmd.push("--wait".into());
        return Some(cmd.join(" "));
    }
    // A rule matched and its packer refused: another format would pack a
    // layout the graph cannot use.
    if !t.refused.is_empty() {
        return None;
    }
    let recipe = mat::Recipe::from(mat::Settings::default());
    let params = materialized_as(model, &t.name, &recipe)?;
    cmd.extend(["--format".into(), recipe.packer().into()]);
    for p in params {
        cmd.extend(["--param".into(), p]);
    }
    Some(cmd.join(" "))
}

/// The packer parameters of `name` when `materialize` (its default target)
/// rewrites a node reading it; None when it does not.
fn materialized_as(model: &str, name: &str, recipe: &mat::Recipe) -> Option<Vec<String>> {
    let m = ctcache::onnx::Model::open(std::path::Path::new(model)).ok()?;
    let plan = mat::plan_for(&m, recipe).ok()?;
    plan.packs(recipe)
        .into_iter()
        .find(|p| p.key.0 == name && p.packer == recipe.packer())
        .map(|p| p.params)
}

/// A listed entry as the one hit rule reads it: the facts the daemon
/// listed, and the shape of the initializer asked about (an entry of its
/// digest was packed from the same bytes and shape).
struct Listed<'a> {
    entry: &'a api::Entry,
    source: Option<&'a SourceShape>,
}

impl EntryFacts for Listed<'_> {
    fn device(&self) -> Result<&DeviceProto, MissReason> {
        self.entry
            .device
            .as_ref()
            .ok_or_else(|| listed_without("a device"))
    }

    fn type_key(&self) -> Result<PhysicalTypeKey, MissReason> {
        hex::decode(&self.entry.type_key)
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .map(PhysicalTypeKey)
            .ok_or_else(|| listed_without("a physical type key"))
    }

    fn physical_type(&self) -> Result<StructTypeProto, MissReason> {
        self.entry
            .struct_type
            .as_ref()
            .and_then(|t| t.decode().ok())
            .ok_or_else(|| listed_without("a readable physical type"))
    }

    fn dims(&self) -> &[u64] {
        &self.entry.dims
    }

    fn source_shape(&self) -> Option<&SourceShape> {
        self.source
    }
}

fn listed_without(what: &str) -> MissReason {
    MissReason::Invalid {
        rule: "listed entry",
        message: format!("the daemon listed the entry without {what}"),
    }
}

/// The key component a miss reason is about (its code for the others).
fn component(m: &MissReason) -> &'static str {
    match m {
        MissReason::StaleDigest => "digest",
        MissReason::IncompatibleDevice(_) => "device",
        MissReason::UnknownPhysicalType { .. } => "physical_type",
        MissReason::UnsupportedFormatVersion { .. } => "format_version",
        other => other.code(),
    }
}

/// Whether `entry` is usable on `host` for a source of shape `source`, as
/// the one hit rule ([`hit::judge`]) decides it; else the first component
/// that does not fit, in the loading rules' order.
fn classify(entry: api::Entry, host: &Host, source: Option<&SourceShape>) -> Candidate {
    let (differs, detail) = match hit::judge(
        &Listed {
            entry: &entry,
            source,
        },
        host,
    ) {
        Ok(_) => (None, "usable on this host".to_string()),
        Err(m) => (Some(component(&m)), m.to_string()),
    };
    Candidate {
        entry,
        differs,
        detail,
    }
}

fn candidate_json(c: &Candidate) -> Value {
    json!({
        "key": c.entry.key,
        "physical_type": c.entry.physical_type,
        "format_version": c.entry.format_version,
        "device": json::describe_device(c.entry.device.as_ref()),
        "source_digest": hex::encode(&c.entry.source_digest),
        "differs": c.differs,
        "detail": c.detail,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctcache::dtype::DataType;
    use ctcache_kernels::{registry, Params};

    /// An entry as the daemon lists a `gemm.pack_b.f32` pack of a FLOAT
    /// 64x32 weight, and that source's shape.
    fn listed_pack() -> (api::Entry, SourceShape) {
        let source = SourceShape {
            data_type: DataType::FLOAT,
            dims: vec![64, 32],
        };
        let packer = ctcache_kernels::find("gemm.pack_b.f32").unwrap();
        let params = Params::new();
        let out = packer
            .output(source.data_type, &source.dims, &params)
            .unwrap();
        let layout = registry::expected(packer, &params, &source).unwrap();
        let entry = api::Entry {
            physical_type: layout.type_name.clone(),
            format_version: layout.format_version,
            type_key: layout.key.hex(),
            struct_type: Some((&out.struct_type).into()),
            dims: layout.dims.clone(),
            device: Some(packer.device(&params).unwrap()),
            ..Default::default()
        };
        (entry, source)
    }

    fn host() -> Host {
        Host::new(
            ctcache_kernels::compile::host_devices(),
            None,
            Accept::Known(registry::known_types()),
        )
    }

    #[test]
    fn a_real_pack_is_usable() {
        let (entry, source) = listed_pack();
        let c = classify(entry, &host(), Some(&source));
        assert_eq!(c.differs, None, "{}", c.detail);
    }

    /// The name and format version of a real layout over other dims: the
    /// former rule (device, then a type-name prefix and the version) called
    /// it usable; the hit rule does not.
    #[test]
    fn a_lookalike_of_a_known_type_name_is_not_usable() {
        let (mut entry, source) = listed_pack();
        entry.dims = entry.dims.iter().map(|d| d * 2).collect();
        let c = classify(entry, &host(), Some(&source));
        assert_eq!(c.differs, Some("physical_type"), "{}", c.detail);
        assert!(c.detail.contains("dims"), "{}", c.detail);
    }

    #[test]
    fn another_devices_pack_differs_in_the_device() {
        let (mut entry, source) = listed_pack();
        let mut device = entry.device.clone().unwrap();
        device.r#type = "cuda".into();
        entry.device = Some(device);
        let c = classify(entry, &host(), Some(&source));
        assert_eq!(c.differs, Some("device"), "{}", c.detail);
    }
}
