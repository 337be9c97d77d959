//! The command line: argument parsing and dispatch. Each command group lives in
//! its own module over library calls; this file only wires them. Daemon
//! commands run on a current-thread runtime made per invocation
//! ([`ctx::Ctx::block_on`]); offline ones never start one.

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

use crate::ctx::{self, Global};
use crate::output::Failure;
use crate::{
    admin, compile, daemon_cmds, extras, human, jobs, materialize, offline, packing, remote, watch,
    why_miss,
};

/// The ctcache admin tool.
#[derive(Debug, Parser)]
#[command(
    name = "ctcachectl",
    version,
    about = "Inspect, check and manage compiled ONNX tensors and the ctcached cache",
    after_help = "Exit codes: 0 ok, 1 failure, 2 usage error, 3 daemon not reachable, 4 a bound reached or disk full, 5 permission denied, 6 damaged bytes found, 7 try again later, 130 interrupted (what it wrote removed). JSON shapes: docs/CLI.md."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// `defer`: a subcommand's arguments are built only when it runs (or help
/// shows them); building all of them cost every invocation ~0.3 ms.
#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Validate a model's compiled tensors (structural rules; no hardware needed).
    Check {
        /// The ONNX model file.
        model: PathBuf,
    },
    /// Print the canonical source digest of every top-level initializer.
    Digest {
        /// The ONNX model file.
        model: PathBuf,
        /// blake3 (default) or sha256.
        #[arg(long, default_value = "blake3", value_parser = ["blake3", "sha256"])]
        algorithm: String,
    },
    /// List the compiled tensors and whether each is usable on this host.
    Inspect {
        /// The ONNX model file.
        model: PathBuf,
    },
    /// Write a copy of the model without compiled tensors (all else byte-for-byte).
    Strip {
        /// The ONNX model file.
        model: PathBuf,
        /// The model to write (not the input, unless --force).
        #[arg(short, long, value_name = "OUT")]
        output: PathBuf,
        /// OUT may be MODEL: rewrite it in place.
        #[arg(long)]
        force: bool,
    },
    /// The daemon's status: version, uptime, store size, hit rate, jobs, watches.
    Status,
    /// The devices of the daemon's host, as compiled tensors describe them.
    Devices {
        /// Detect this host locally instead of asking the daemon.
        #[arg(long)]
        local: bool,
    },
    /// The packers (formats) of this build and their parameters.
    Formats,
    /// List stored entries.
    Ls(daemon_cmds::LsArgs),
    /// One stored entry in full.
    Stat {
        /// The entry's key: whole, a unique prefix, or abbreviated as `ls` shows it.
        key: String,
    },
    /// Pack a model's initializers into the store.
    Prepack(jobs::PrepackArgs),
    /// Per initializer of a model: its digest, stored entries and misses.
    Resolve(jobs::ResolveArgs),
    /// Why an initializer of a model has no usable entry, and a command that packs it;
    /// with --form, why the model has no runtime form, and the command that makes it.
    WhyMiss {
        /// The ONNX model file.
        model: PathBuf,
        /// The initializer's name.
        #[arg(required_unless_present = "form")]
        initializer: Option<String>,
        /// The runtime form to explain instead of an initializer.
        #[arg(long, conflicts_with = "initializer", value_parser = ["onnxruntime", "openvino"])]
        form: Option<String>,
        /// With --form onnxruntime: the level (default: extended).
        #[arg(long, requires = "form", value_parser = ["basic", "extended", "layout", "all"])]
        level: Option<String>,
        /// With --form openvino: a compile config property, NAME=VALUE (repeatable).
        #[arg(long = "config", requires = "form", value_parser = crate::human::parse_param)]
        config: Vec<String>,
    },
    /// Write a copy of a model with compiled tensors embedded (through the daemon when it runs).
    Embed(jobs::EmbedArgs),
    /// Write an onnxruntime-ready int4, int8 or fp16 copy of a model from cached packs.
    Materialize(materialize::MaterializeArgs),
    /// Have the daemon make a runtime's own compiled form of a model (onnxruntime's optimized model), once per host.
    Compile(compile::CompileArgs),
    /// Store the compiled tensors a model carries.
    Import {
        /// The ONNX model file with compiled tensors.
        model: PathBuf,
    },
    /// Remove entries over a size budget or unused for too long, and leftovers.
    Gc(admin::GcArgs),
    /// Rehash every payload; quarantine and drop damaged ones.
    Verify(admin::VerifyArgs),
    /// Model folders the daemon watches.
    #[command(subcommand)]
    Watch(watch::WatchCmd),
    /// The fleet tier: signing keys, the daemon's remote.
    #[command(subcommand)]
    Remote(remote::RemoteCmd),
    /// Follow the daemon's events, one line (or JSON object) per event.
    Events {
        /// Stop after this many events.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
    },
    /// Pack one initializer locally and write the raw payload (what a cache entry stores).
    Pack {
        /// The ONNX model file.
        model: PathBuf,
        /// The initializer to pack.
        #[arg(long, value_name = "NAME")]
        initializer: String,
        /// Packer id (`ctcachectl formats` lists them).
        #[arg(long, value_name = "FORMAT")]
        format: String,
        /// Packer parameter, k=v (repeatable).
        #[arg(long = "param", value_parser = human::parse_param, value_name = "K=V")]
        params: Vec<String>,
        /// Where to pack: the CPU kernels, or a wgpu adapter (software ones included).
        #[arg(long, default_value = "cpu", value_parser = ["cpu", "wgpu"])]
        backend: String,
        /// The payload file to write (never the model).
        #[arg(short, long, value_name = "OUT")]
        output: PathBuf,
        /// Also write the payload's StructTypeProto (binary protobuf).
        #[arg(long, value_name = "FILE")]
        type_out: Option<PathBuf>,
    },
    /// Shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The man pages (roff): the top page on stdout, or one file per command in a folder.
    #[command(hide = true)]
    Man {
        /// Write ctcachectl.1 and ctcachectl-COMMAND.1 for every command here.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), Failure> {
    let ctx = ctx::Ctx::new(cli.global);
    let json = ctx.json;
    match cli.command {
        Command::Check { model } => offline::check(&model, json),
        Command::Digest { model, algorithm } => offline::digest(&model, &algorithm, json),
        Command::Inspect { model } => offline::inspect(&model, json),
        Command::Strip {
            model,
            output,
            force,
        } => offline::strip(&model, &output, force, json),
        Command::Devices { local: true } => packing::devices(json),
        Command::Devices { local: false } => ctx.block_on(daemon_cmds::devices(&ctx)),
        Command::Formats => packing::formats(json),
        Command::Status => ctx.block_on(daemon_cmds::status(&ctx)),
        Command::Ls(a) => ctx.block_on(daemon_cmds::ls(&ctx, a)),
        Command::Stat { key } => ctx.block_on(daemon_cmds::stat(&ctx, &key)),
        Command::Prepack(a) => ctx.block_on(jobs::prepack(&ctx, a)),
        Command::Resolve(a) => ctx.block_on(jobs::resolve(&ctx, a)),
        Command::WhyMiss {
            model,
            initializer,
            form,
            level,
            config,
        } => match (initializer, form) {
            (Some(name), _) => ctx.block_on(why_miss::why_miss(&ctx, model, name)),
            (None, runtime) => {
                let runtime = runtime.unwrap_or_else(|| "onnxruntime".into());
                let a = compile::CompileArgs::why_miss(model, runtime, level, config);
                ctx.block_on(compile::compile(&ctx, a))
            }
        },
        Command::Embed(a) => jobs::embed(&ctx, a),
        Command::Materialize(a) => materialize::materialize(&ctx, a),
        Command::Compile(a) => ctx.block_on(compile::compile(&ctx, a)),
        Command::Import { model } => ctx.block_on(jobs::import(&ctx, model)),
        Command::Gc(a) => admin::gc(&ctx, a),
        Command::Verify(a) => admin::verify(&ctx, a),
        Command::Watch(cmd) => ctx.block_on(watch::watch(&ctx, cmd)),
        Command::Remote(cmd) => remote::remote(&ctx, cmd),
        Command::Events { count } => ctx.block_on(watch::events(&ctx, count)),
        Command::Pack {
            model,
            initializer,
            format,
            params,
            backend,
            output,
            type_out,
        } => packing::pack(
            packing::PackArgs {
                model: &model,
                initializer: &initializer,
                format: &format,
                params: &params,
                backend: &backend,
                output: &output,
                type_out: type_out.as_deref(),
            },
            json,
        ),
        Command::Completions { .. } | Command::Man { .. } if json => Err(Failure::Usage(
            "--json: this command writes a shell script or man pages, which have no JSON form; \
             leave --json out"
                .into(),
        )),
        Command::Completions { shell } => extras::completions(Cli::command(), shell),
        Command::Man { dir } => extras::man(Cli::command(), dir.as_deref()),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;
    use crate::ctx::GLOBAL;

    /// Every command has an about line and every argument a help text;
    /// global options are listed under their own heading.
    #[test]
    fn every_command_and_argument_has_help() {
        let mut cmd = Cli::command();
        cmd.build();
        cmd.clone().debug_assert();
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            if c.get_about()
                .is_none_or(|a| a.to_string().trim().is_empty())
            {
                missing.push(format!("{path}: no about"));
            }
            for a in c.get_arguments() {
                let id = a.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if a.get_help().is_none_or(|h| h.to_string().trim().is_empty()) {
                    missing.push(format!("{path} {id}: no help"));
                }
                if a.is_global_set() != (a.get_help_heading() == Some(GLOBAL)) {
                    missing.push(format!("{path} {id}: global iff under {GLOBAL:?}"));
                }
            }
            for s in c.get_subcommands().filter(|s| s.get_name() != "help") {
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&cmd, "ctcachectl", &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
        // Globals reach every command's help, under their heading.
        let gc = cmd.find_subcommand_mut("gc").unwrap();
        let help = gc.render_help().to_string();
        let (own, global) = help.split_once(&format!("{GLOBAL}:")).expect("a heading");
        let global = global.split("\n\n").next().unwrap_or_default();
        assert!(
            own.contains("--max-size") && !own.contains("--socket"),
            "{help}"
        );
        assert!(
            global.contains("--socket") && !global.contains("--max-size"),
            "{help}"
        );
    }

    /// Commands are built deferred (only the one that runs): building one
    /// must keep the about line the command list declares for it, which a
    /// doc comment on a flattened argument struct would replace.
    #[test]
    fn deferred_commands_keep_their_about() {
        fn abouts(c: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
            let about = format!("{:?} / {:?}", c.get_about(), c.get_long_about());
            out.push((path.to_string(), about));
            for s in c.get_subcommands() {
                abouts(s, &format!("{path} {}", s.get_name()), out);
            }
        }
        let (mut declared, mut built) = (Vec::new(), Vec::new());
        let mut cmd = Cli::command();
        abouts(&cmd, "ctcachectl", &mut declared);
        cmd.build();
        abouts(&cmd, "ctcachectl", &mut built);
        built.retain(|(path, _)| declared.iter().any(|(p, _)| p == path));
        assert_eq!(declared, built);
    }
}
