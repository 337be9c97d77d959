//! `ctcachectl compile`: the daemon makes a runtime's own compiled form of
//! a model (D15), once per key, or says why it has none.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use crate::ctx::Ctx;
use crate::human::{parse_param, shell_word};
use crate::json;
use crate::output::{print_json, say, Failure};
use ctcache_client::api;

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// The ONNX model file.
    model: PathBuf,
    /// The runtime whose form to make (the daemon's configured library).
    #[arg(long, default_value = "onnxruntime", value_parser = ["onnxruntime", "openvino"])]
    runtime: String,
    /// onnxruntime's graph optimization level the form is made at
    /// (default: extended).
    #[arg(long, value_parser = ["basic", "extended", "layout", "all"])]
    level: Option<String>,
    /// OpenVINO's device the form is compiled for.
    #[arg(long, default_value = "CPU", value_parser = ["CPU"])]
    device: String,
    /// A property of OpenVINO's compile config, NAME=VALUE (repeatable).
    #[arg(long = "config", value_parser = parse_param)]
    config: Vec<String>,
    /// Look only: say whether a form is stored, and which part of the key
    /// differs when not, without compiling.
    #[arg(long)]
    lookup: bool,
    /// Set by why-miss: look only, and on a miss say the command that
    /// makes the form.
    #[arg(skip)]
    hint: bool,
}

impl CompileArgs {
    /// The lookup `why-miss MODEL --form RUNTIME` runs.
    pub fn why_miss(
        model: PathBuf,
        runtime: String,
        level: Option<String>,
        config: Vec<String>,
    ) -> CompileArgs {
        CompileArgs {
            model,
            runtime,
            level,
            device: "CPU".into(),
            config,
            lookup: true,
            hint: true,
        }
    }

    /// The command that makes the missing form, for a miss compiling
    /// cures (none where the daemon has no such runtime, or for a model it
    /// makes no form of).
    fn hint_for(&self, ctx: &Ctx, miss: &api::Miss) -> Option<String> {
        if !self.hint || !["no_entry", "form_key_differs"].contains(&miss.reason.as_str()) {
            return None;
        }
        let mut cmd = vec!["ctcachectl".to_string()];
        if let Some(s) = &ctx.socket {
            cmd.extend(["--socket".into(), shell_word(&s.display().to_string())]);
        }
        cmd.extend([
            "compile".into(),
            shell_word(&self.model.display().to_string()),
            "--runtime".into(),
            self.runtime.clone(),
        ]);
        if let Some(level) = &self.level {
            cmd.extend(["--level".into(), level.clone()]);
        }
        for p in &self.config {
            cmd.extend(["--config".into(), shell_word(p)]);
        }
        Some(cmd.join(" "))
    }

    /// The `--config` properties, by name.
    fn config(&self) -> BTreeMap<String, String> {
        self.config
            .iter()
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The level, device and config as the request names them, and how
    /// the form is described.
    fn made_with(&self) -> Result<(String, String, String), Failure> {
        let openvino = self.runtime == "openvino";
        if openvino && self.level.is_some() {
            return Err(Failure::Usage(
                "--level is onnxruntime's; OpenVINO's form takes --device and --config".into(),
            ));
        }
        if !openvino && !self.config.is_empty() {
            return Err(Failure::Usage(
                "--config is OpenVINO's; onnxruntime's form takes --level".into(),
            ));
        }
        if openvino {
            let with = if self.config.is_empty() {
                String::new()
            } else {
                format!(" with {}", self.config.join(", "))
            };
            let what = format!("for {}{with}", self.device);
            return Ok((String::new(), self.device.clone(), what));
        }
        let level = self.level.clone().unwrap_or_else(|| "extended".into());
        let what = format!("at level {level}");
        Ok((level, String::new(), what))
    }
}

pub async fn compile(ctx: &Ctx, a: CompileArgs) -> Result<(), Failure> {
    let (level, provider, what) = a.made_with()?;
    let c = ctx.connect().await?;
    let r = c
        .compile(api::CompileRequest {
            model_path: a.model.display().to_string(),
            runtime: a.runtime.clone(),
            level: level.clone(),
            provider,
            config: a.config().into_iter().collect(),
            lookup_only: a.lookup,
            // The answer is printed, not mapped: the lease may end at once.
            lease_ttl_ms: 1,
            ..Default::default()
        })
        .await?;
    let entry = r.form.as_ref().and_then(|f| f.entry.as_ref());
    let compile = Duration::from_micros(r.compile_us);
    let hint = r.miss.as_ref().and_then(|m| a.hint_for(ctx, m));
    if ctx.json {
        print_json(&json!({
            "model": a.model.display().to_string(),
            "runtime": a.runtime,
            "level": level,
            "device": (a.runtime == "openvino").then_some(&a.device),
            "config": a.config(),
            "model_digest": hex::encode(&r.model_digest),
            "compiled": r.compiled,
            "compile_seconds": compile.as_secs_f64(),
            "form": entry.map(json::entry),
            "weights": r.tensors.iter().map(|t| json!({
                "name": t.name, "key": t.key, "length": t.length,
            })).collect::<Vec<_>>(),
            "miss": r.miss.as_ref().map(json::miss),
            "hint": hint,
        }))?;
    } else if !ctx.quiet {
        match (entry, &r.miss) {
            (Some(e), _) => {
                let size = if a.runtime == "openvino" {
                    format!("{} bytes", e.payload_len)
                } else {
                    format!(
                        "its model {} bytes, {} weight(s) in {} bytes of entries of their own",
                        e.payload_len,
                        r.tensors.len(),
                        r.tensors.iter().map(|t| t.length).sum::<u64>()
                    )
                };
                let how = if r.compiled {
                    format!("compiled in {:.2} s", compile.as_secs_f64())
                } else {
                    "stored".to_string()
                };
                say(&format!(
                    "{}: {} form {what}: {how} ({size}; {})",
                    a.model.display(),
                    a.runtime,
                    e.key
                ))?
            }
            (None, m) => {
                let m = m.clone().unwrap_or_default();
                say(&format!(
                    "{}: no {} form {what}: {}: {}",
                    a.model.display(),
                    a.runtime,
                    m.reason,
                    m.detail
                ))?;
                if let Some(h) = &hint {
                    say(&format!("hint: {h}"))?;
                }
            }
        }
    }
    match (&r.form, &r.miss) {
        (None, Some(m)) if !a.lookup => Err(Failure::Failed(format!(
            "{}: no form: {}",
            a.model.display(),
            m.detail
        ))),
        _ => Ok(()),
    }
}
