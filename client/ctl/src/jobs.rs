//! Commands that make the daemon pack or store: `prepack`, `resolve`,
//! `embed` (through the daemon, or locally) and `import`.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

mod resolve;

use crate::ctx::Ctx;
use crate::human::{self, parse_param, Style, Table};
use crate::json;
use crate::output::{print_json, say, Failure, Refusal};
use ctcache_client::{absolute, api, ResolveOptions};

pub use resolve::{resolve, ResolveArgs};

// `--format F --param k=v ...`: one packer and its parameters. (A plain
// comment: a doc comment would become the about of every command that
// flattens this, since those commands are built deferred.)
#[derive(Debug, Args)]
pub struct FormatArgs {
    /// Packer id, e.g. ort.matmul_nbits (default: the daemon's policy). It
    /// takes the initializers the policy's size and use filters admit (by
    /// default: at least 65536 elements, used as MatMul.B or Gemm.B).
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Packer parameter k=v (repeatable; needs --format).
    #[arg(long = "param", requires = "format", value_parser = parse_param)]
    pub params: Vec<String>,
}

impl FormatArgs {
    pub fn specs(&self) -> Vec<api::FormatSpec> {
        let Some(id) = &self.format else {
            return Vec::new();
        };
        let params = self
            .params
            .iter()
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        vec![api::FormatSpec {
            id: id.clone(),
            params,
        }]
    }
}

#[derive(Debug, Args)]
pub struct PrepackArgs {
    /// The ONNX model file.
    model: PathBuf,
    #[command(flatten)]
    fmt: FormatArgs,
    /// Only these initializers, past the policy's filters (repeatable;
    /// makes prepack wait).
    #[arg(long = "initializer", value_name = "NAME")]
    initializers: Vec<String>,
    /// Pack on this backend: auto (the daemon's choice: a hardware GPU for
    /// what it can pack, else the CPU), cpu, or wgpu (refused, with the
    /// reason, when the daemon's host has no hardware wgpu adapter); cpu and
    /// wgpu make prepack wait.
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "wgpu"])]
    backend: String,
    /// Wait for the jobs and report each (a progress bar on a terminal);
    /// without it, whole-model jobs go on in the daemon's background.
    #[arg(long)]
    wait: bool,
}

pub async fn prepack(ctx: &Ctx, a: PrepackArgs) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let model = absolute(&a.model)?;
    if !a.wait && a.initializers.is_empty() && a.backend == "auto" {
        let opts = ResolveOptions {
            on_miss: api::OnMiss::Background,
            formats: a.fmt.specs(),
            ..Default::default()
        };
        let res = c.resolve_model(&model, &opts).await?;
        if res.tensors.iter().all(|t| t.wanted_formats.is_empty()) {
            // Nothing selected: the daemon's Prepack refuses that and says
            // why, in the words embed gets.
            c.prepack(prepack_request(&model, &a)).await?;
        }
        if ctx.json {
            return print_json(
                &json!({ "model_path": res.model_path, "waited": false, "jobs_started": res.jobs_started, "jobs": [] }),
            );
        }
        if ctx.quiet {
            return Ok(());
        }
        return say(&match res.jobs_started {
            0 => format!("{}: every wanted format is stored already", res.model_path),
            n => format!(
                "{}: {n} pack job(s) started in the background (`ctcachectl events` follows them)",
                res.model_path
            ),
        });
    }
    if !a.wait {
        // The daemon cancels a client's jobs when it disconnects; only
        // whole-model requests have a background form.
        let backend = format!("--backend {}", a.backend);
        let why = match (a.initializers.is_empty(), a.backend == "auto") {
            (false, true) => "--initializer".to_string(),
            (true, false) => backend,
            _ => format!("--initializer and {backend}"),
        };
        ctx.note(&format!(
            "note: with {why} prepack waits for its jobs (the daemon stops a caller's jobs when it leaves)"
        ));
    }
    let mut stream = c.prepack(prepack_request(&model, &a)).await?;
    let bar = progress_bar(ctx);
    // Latest state per (initializer, format), in first-seen order.
    let mut jobs: Vec<api::PrepackProgress> = Vec::new();
    while let Some(p) = stream.next().await? {
        match jobs
            .iter_mut()
            .find(|j| j.initializer == p.initializer && j.format == p.format)
        {
            Some(j) => *j = p,
            None => jobs.push(p),
        }
        let done = jobs.iter().filter(|j| j.state().is_final()).count() as u64;
        bar.set_length(jobs.len() as u64);
        bar.set_position(done);
        if let Some(last) = jobs.last() {
            bar.set_message(format!("{} {}", last.initializer, last.format));
        }
    }
    bar.finish_and_clear();
    let failed = jobs.iter().filter(|j| !j.state().succeeded()).count();
    if ctx.json {
        print_json(&json!({
            "model_path": model,
            "waited": true,
            "jobs": jobs.iter().map(json::progress).collect::<Vec<_>>(),
            "failed": failed,
        }))?;
    } else if !ctx.quiet || failed > 0 {
        print_jobs(ctx, &jobs)?;
    }
    if failed > 0 {
        // One kind of refusal for every failed job is the command's.
        let mut refusals = jobs
            .iter()
            .filter(|j| !j.state().succeeded())
            .map(|j| Refusal::of_name(&j.code));
        let first = refusals.next().flatten();
        let one = refusals.all(|r| r == first);
        return Err(Failure::with(
            format!("{failed} of {} pack job(s) failed", jobs.len()),
            first.filter(|_| one),
        ));
    }
    Ok(())
}

fn prepack_request(model: &std::path::Path, a: &PrepackArgs) -> api::PrepackRequest {
    api::PrepackRequest {
        model_path: model.display().to_string(),
        initializers: a.initializers.clone(),
        formats: a.fmt.specs(),
        backend: api::Backend::from_name(&a.backend)
            .unwrap_or_default()
            .into(),
        handout: String::new(),
    }
}

/// Whether a bar is drawn: on a terminal, for a human reader.
pub(crate) fn shows_progress(ctx: &Ctx) -> bool {
    ctx.human() && std::io::stderr().is_terminal()
}

pub(crate) fn progress_bar(ctx: &Ctx) -> ProgressBar {
    if !shows_progress(ctx) {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {elapsed} {wide_msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn print_jobs(ctx: &Ctx, jobs: &[api::PrepackProgress]) -> Result<(), Failure> {
    let mut t = Table::new(&[
        "INITIALIZER",
        "FORMAT",
        "STATE",
        "SIZE",
        "TIME",
        "KEY / ERROR",
    ]);
    for j in jobs {
        let style = match j.state() {
            api::JobState::Done => Style::Green,
            api::JobState::Cached => Style::Dim,
            api::JobState::Failed | api::JobState::Cancelled => Style::Red,
            _ => Style::Yellow,
        };
        let e = j.entry.as_ref();
        t.row(vec![
            (j.initializer.clone(), Style::Plain),
            (j.format.clone(), Style::Plain),
            (j.state().name().to_string(), style),
            (
                e.map(|e| human::size(e.payload_len)).unwrap_or_default(),
                Style::Plain,
            ),
            (
                if j.state() == api::JobState::Done {
                    human::duration_us(j.pack_duration_us)
                } else {
                    String::new()
                },
                Style::Plain,
            ),
            (
                if j.error.is_empty() {
                    e.map(|e| human::short_key(&e.key)).unwrap_or_default()
                } else {
                    j.error.clone()
                },
                Style::Plain,
            ),
        ]);
    }
    t.print(ctx.color)
}

#[derive(Debug, Args)]
pub struct EmbedArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// The model to write (payloads of 1 MiB and more go to OUT.ctdata beside it).
    #[arg(short, long, value_name = "OUT")]
    output: PathBuf,
    #[command(flatten)]
    fmt: FormatArgs,
    /// Initializers to compile, past the policy's filters (repeatable;
    /// default: those the format accepts and the filters admit). Packs
    /// locally: the daemon embeds whole models only.
    #[arg(long = "initializer", value_name = "NAME")]
    initializers: Vec<String>,
    /// Put every payload in the sidecar file (default: payloads >= 1 MiB).
    #[arg(long)]
    sidecar: bool,
    /// Drop compiled tensors already in the model.
    #[arg(long)]
    replace: bool,
    /// Pack in this process even when a daemon runs.
    #[arg(long)]
    local: bool,
    /// OUT may be MODEL: rewrite it in place (refused without this).
    #[arg(long)]
    force: bool,
}

/// Through the daemon (its store, its packers); packed here with --local or
/// --initializer, or when no socket was named and none answers.
pub fn embed(ctx: &Ctx, a: EmbedArgs) -> Result<(), Failure> {
    if !a.local && a.initializers.is_empty() && ctx.block_on(embed_daemon(ctx, &a))? {
        return Ok(());
    }
    crate::packing::embed(
        crate::packing::EmbedArgs {
            model: &a.model,
            output: &a.output,
            format: a.fmt.format.as_deref(),
            params: &a.fmt.params,
            initializers: &a.initializers,
            sidecar: a.sidecar,
            replace: a.replace,
            force: a.force,
        },
        ctx.json,
    )
}

/// False when no daemon answers and the model is to be embedded here.
async fn embed_daemon(ctx: &Ctx, a: &EmbedArgs) -> Result<bool, Failure> {
    let Some(c) = ctx.connect_or_local("embedding").await? else {
        return Ok(false);
    };
    // The client makes the output's missing folders and files, with this
    // user's rights (removed again on a refusal); the daemon writes into them.
    let r = c
        .embed(api::EmbedRequest {
            model_path: a.model.display().to_string(),
            output_path: a.output.display().to_string(),
            formats: a.fmt.specs(),
            sidecar: a.sidecar,
            replace: a.replace,
            force: a.force,
            handout: String::new(),
        })
        .await?;
    let sidecar = (!r.sidecar_path.is_empty()).then_some(r.sidecar_path.clone());
    if ctx.json {
        print_json(&json!({
            "via": "daemon",
            "output": r.output_path,
            "entries": r.entries,
            "packed": r.packed,
            "inline_bytes": r.inline_bytes,
            "sidecar": sidecar,
            "sidecar_bytes": r.sidecar_bytes,
        }))?;
        return Ok(true);
    }
    if ctx.quiet {
        return Ok(true);
    }
    let placed = match &sidecar {
        Some(p) => format!(
            "{} inline, {} in {p}",
            human::size(r.inline_bytes),
            human::size(r.sidecar_bytes)
        ),
        None => format!("{} inline", human::size(r.inline_bytes)),
    };
    say(&format!(
        "{}: {} compiled tensor(s) embedded, {} packed now ({placed})",
        r.output_path, r.entries, r.packed
    ))?;
    Ok(true)
}

pub async fn import(ctx: &Ctx, model: PathBuf) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let r = c.import(&model).await?;
    let skipped = skipped_failure(&model, r.skipped.len());
    if ctx.json {
        print_json(&json!({
            "imported": r.imported,
            "already_present": r.already_present,
            "skipped": r.skipped.iter().map(|s| json!({
                "index": s.index,
                "source_name": s.source_name,
                "reason": s.reason.as_ref().map(|m| m.reason.clone()),
                "detail": s.reason.as_ref().map(|m| m.detail.clone()),
            })).collect::<Vec<_>>(),
        }))?;
        return skipped;
    }
    if !ctx.quiet {
        say(&format!(
            "{}: {} imported, {} already present, {} skipped",
            model.display(),
            r.imported,
            r.already_present,
            r.skipped.len()
        ))?;
    }
    if !r.skipped.is_empty() {
        let mut t = Table::new(&["#", "SOURCE", "REASON", "DETAIL"]);
        for s in &r.skipped {
            let m = s.reason.clone().unwrap_or_default();
            t.row(vec![
                (s.index.to_string(), Style::Plain),
                (s.source_name.clone(), Style::Plain),
                (m.reason, Style::Yellow),
                (m.detail, Style::Plain),
            ]);
        }
        t.print(ctx.color)?;
    }
    skipped
}

/// Import exits 1 when it left compiled tensors out (the table says why).
fn skipped_failure(model: &std::path::Path, n: usize) -> Result<(), Failure> {
    match n {
        0 => Ok(()),
        n => Err(Failure::Failed(format!(
            "{}: {n} compiled tensor(s) not imported (listed above)",
            model.display()
        ))),
    }
}
