//! The fleet tier: `remote keygen` (an Ed25519 key pair for signing
//! manifests, offline) and `remote status` (the daemon's view of its remote,
//! probed).

use std::path::PathBuf;

use clap::Subcommand;
use ctcache_client::api;
use ctcache_remote::signing_keys::SecretKey;
use serde_json::json;

use crate::ctx::Ctx;
use crate::human::{self, Table};
use crate::output::{print_json, say, Failure};

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum RemoteCmd {
    /// Write a new Ed25519 key pair: NAME.secret (mode 0600; the daemon's
    /// signing_key_file) and NAME.pub (a line for other hosts' trusted_keys).
    Keygen {
        /// The key's name (letters, digits, '-', '_', '.'), e.g. the host's.
        name: String,
        /// Folder for the two files.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// The daemon's remote: where it is, whether it answers now (one HEAD
    /// within its timeout), breaker, upload queue, counters, audits,
    /// measured throughputs and cost-rule decisions.
    Status,
    /// Fetch every entry the daemon's policy wants for MODEL that its store
    /// lacks from the remote (packs nothing).
    Pull {
        /// The model (its path as the daemon sees it).
        model: PathBuf,
    },
    /// Upload the daemon's entries (of --model, or all) the remote lacks.
    Push {
        /// Only the entries packed from this model (default: every entry).
        #[arg(long)]
        model: Option<PathBuf>,
    },
}

pub fn remote(ctx: &Ctx, cmd: RemoteCmd) -> Result<(), Failure> {
    match cmd {
        RemoteCmd::Keygen { name, dir } => keygen(ctx, &name, &dir),
        RemoteCmd::Status => ctx.block_on(status(ctx)),
        RemoteCmd::Pull { model } => ctx.block_on(async {
            let c = ctx.connect().await?;
            transferred(ctx, "fetched", &c.remote_pull(&model).await?)
        }),
        RemoteCmd::Push { model } => ctx.block_on(async {
            let c = ctx.connect().await?;
            transferred(ctx, "uploaded", &c.remote_push(model.as_deref()).await?)
        }),
    }
}

fn transferred(ctx: &Ctx, verb: &str, t: &api::RemoteTransferResponse) -> Result<(), Failure> {
    if ctx.json {
        print_json(&json!({
            "done": t.done,
            "present": t.present,
            "missing": t.missing,
            "failed": t.failed,
            "bytes": t.bytes,
            "first_error": t.first_error,
        }))?;
    } else {
        say(&format!(
            "{verb} {} ({}), {} present already, {} missing, {} failed",
            t.done,
            human::size(t.bytes),
            t.present,
            t.missing,
            t.failed
        ))?;
        if t.failed == 0 && !t.first_error.is_empty() {
            say(&format!("first missing: {}", t.first_error))?;
        }
    }
    if t.failed > 0 {
        return Err(Failure::Failed(t.first_error.clone()));
    }
    Ok(())
}

fn keygen(ctx: &Ctx, name: &str, dir: &std::path::Path) -> Result<(), Failure> {
    let key = SecretKey::generate(name).map_err(|e| Failure::Failed(e.to_string()))?;
    let secret = dir.join(format!("{name}.secret"));
    let public = dir.join(format!("{name}.pub"));
    key.write_pair(&secret, &public)
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let public_key = key.public().to_text();
    if ctx.json {
        return print_json(&json!({
            "secret_file": secret,
            "public_file": public,
            "public_key": public_key,
        }));
    }
    say(&format!(
        "secret key: {} (keep it private)",
        secret.display()
    ))?;
    say(&format!("public key: {} ({public_key})", public.display()))
}

/// The daemon's remote as JSON (`remote status --json`, and `status --json`
/// under `remote`).
pub fn status_json(r: &api::RemoteStatus) -> serde_json::Value {
    json!({
        "remote": r.remote,
        "read": r.read,
        "write": r.write,
        "fetch": r.fetch,
        "breaker": r.breaker,
        "last_error": r.last_error,
        "queue_depth": r.queue_depth,
        "queue_capacity": r.queue_capacity,
        "hits": r.hits,
        "misses": r.misses,
        "errors": r.errors,
        "rejected": r.rejected,
        "bytes_in": r.bytes_in,
        "bytes_out": r.bytes_out,
        "uploads": r.uploads,
        "upload_drops": r.upload_drops,
        "skipped": r.skipped,
        "chose_fetch": r.chose_fetch,
        "chose_pack": r.chose_pack,
        "pack_bytes_per_s": r.pack_bytes_per_s,
        "remote_bytes_per_s": r.remote_bytes_per_s,
        "audits": r.audits,
        "audit_mismatches": r.audit_mismatches,
        "reachable": r.probed.then_some(r.reachable),
        "probe_error": r.probe_error,
        "trusted_keys": r.trusted_keys,
        "trusted_form_keys": r.trusted_form_keys,
    })
}

/// The one-line summary `status` shows.
pub fn summary(r: &api::RemoteStatus) -> String {
    format!(
        "{}, breaker {}, {} hits, {} misses, {} rejected, {} errors, {} uploads ({} dropped)",
        r.remote, r.breaker, r.hits, r.misses, r.rejected, r.errors, r.uploads, r.upload_drops
    )
}

/// Key labels for people.
fn names(labels: &[String]) -> String {
    match labels.is_empty() {
        true => "none".to_string(),
        false => labels.join(", "),
    }
}

async fn status(ctx: &Ctx) -> Result<(), Failure> {
    let c = ctx.connect().await?;
    let Some(r) = c.remote_status().await? else {
        if ctx.json {
            return print_json(&json!({ "remote": null }));
        }
        return say("no remote configured ([remote] in the daemon's config)");
    };
    if ctx.json {
        return print_json(&status_json(&r));
    }
    let mut t = Table::new(&["", ""]);
    let mut kv = |k: &str, v: String| t.plain(vec![k.to_string(), v]);
    kv("remote", r.remote.clone());
    let reachable = match (r.probed, r.reachable) {
        (false, _) => "not probed".to_string(),
        (true, true) => "yes".to_string(),
        (true, false) => format!("no: {}", r.probe_error),
    };
    kv("reachable", reachable);
    kv(
        "mode",
        format!("read {}, write {}, fetch {}", r.read, r.write, r.fetch),
    );
    let last = if r.last_error.is_empty() {
        String::new()
    } else {
        format!("; last error: {}", r.last_error)
    };
    kv("breaker", format!("{}{last}", r.breaker));
    kv("trusted for packs", names(&r.trusted_keys));
    let forms = match r.trusted_form_keys.is_empty() {
        true => "none: runtime forms are compiled here, never fetched".to_string(),
        false => names(&r.trusted_form_keys),
    };
    kv("trusted for forms", forms);
    kv(
        "queue",
        format!(
            "{} of {} ({} dropped)",
            r.queue_depth, r.queue_capacity, r.upload_drops
        ),
    );
    kv(
        "fetches",
        format!(
            "{} hits, {} misses, {} rejected, {} errors, {} skipped (breaker)",
            r.hits, r.misses, r.rejected, r.errors, r.skipped
        ),
    );
    kv(
        "bytes",
        format!(
            "{} in, {} out ({} uploads)",
            human::size(r.bytes_in),
            human::size(r.bytes_out),
            r.uploads
        ),
    );
    kv(
        "cost rule",
        format!("{} fetched, {} packed", r.chose_fetch, r.chose_pack),
    );
    kv(
        "audits",
        format!("{} ({} mismatched)", r.audits, r.audit_mismatches),
    );
    let rate = |b: f64| format!("{}/s", human::size(b as u64));
    if r.remote_bytes_per_s > 0.0 {
        kv("remote rate", rate(r.remote_bytes_per_s));
    }
    let mut packs: Vec<_> = r.pack_bytes_per_s.iter().collect();
    packs.sort_by(|a, b| a.0.cmp(b.0));
    for (f, b) in packs {
        kv(&format!("pack rate {f}"), rate(*b));
    }
    t.print_body(false)
}
