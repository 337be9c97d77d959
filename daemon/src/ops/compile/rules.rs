//! The forms a policy rule asks for: made by the watcher before first use
//! (fetched or compiled), fetched by `remote pull` (never compiled).

use std::collections::BTreeMap;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use ctcache::forms::{self, FormKey};
use ctcache::store::EntryKey;
use futures_util::future::{select, Either, FutureExt};

use super::super::{blocking, model, Error, Result};
use super::fetched;
use super::job::{self, Job};
use super::source::Source;
use super::{compile_place, digest_of, entry_key_of, runtime_key, MadeWith};
use crate::fleet::Ask;
use crate::flights::Gone;
use crate::runtimes::Configured;
use crate::state::Daemon;

/// The runtime and what its form is made with, as a policy rule of a
/// form's format names them (checked when the config was read).
fn rule_form(format: &str, params: &BTreeMap<String, String>) -> (String, MadeWith) {
    if forms::form_type_name("openvino") == Some(format) {
        let options = params
            .iter()
            .filter(|(k, _)| *k != "device")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        return ("openvino".into(), MadeWith::openvino(options));
    }
    let level = params
        .get("level")
        .map_or(forms::DEFAULT_LEVEL, String::as_str);
    ("onnxruntime".into(), MadeWith::onnxruntime(level))
}

/// Makes the form a policy rule asks for (`format`, `params`) of a
/// watched model unless it is stored; logs what it did.
pub(crate) async fn for_watched(
    d: Arc<Daemon>,
    m: model::OpenedModel,
    format: String,
    params: BTreeMap<String, String>,
    queue_owner: Option<u32>,
) {
    let path = m.path.clone();
    let (runtime, made_with) = rule_form(&format, &params);
    let options: Vec<String> = made_with
        .options
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let what = format!("{runtime} form ({})", options.join(", "));
    match watched(&d, m, &runtime, made_with, queue_owner).await {
        Ok(Some(Some(took))) => tracing::info!(
            "watcher: {}: {what} compiled in {:.2} s",
            path.display(),
            took.as_secs_f64()
        ),
        Ok(Some(None)) => tracing::info!("watcher: {}: {what} fetched", path.display()),
        Ok(None) => tracing::debug!("watcher: {}: {what} stored already", path.display()),
        Err(why) => tracing::warn!("watcher: {}: no {what}: {why}", path.display()),
    }
}

/// [`for_watched`]'s work: how long the compile took (`Some(None)`: the
/// form was fetched), `None` when the form was stored. It takes one of
/// the folder owner's compile places, as a request of that uid does.
async fn watched(
    d: &Arc<Daemon>,
    m: model::OpenedModel,
    runtime: &str,
    made_with: MadeWith,
    queue_owner: Option<u32>,
) -> Result<Option<Option<Duration>>> {
    let (d2, m2, runtime) = (d.clone(), m.clone(), runtime.to_string());
    let form = match blocking(move || rule_key(&d2, queue_owner, &m2, &runtime, made_with)).await? {
        RuleKey::Form(form) => form,
        RuleKey::NoForm(why) => return Err(Error::precondition(why)),
    };
    if form.stored {
        return Ok(None);
    }
    let _place = compile_place(d, queue_owner)?;
    let job = Job {
        d: d.clone(),
        rt: form.rt,
        key: form.key,
        entry_key: form.entry_key,
        model: Source::Opened(m),
        requested_by: queue_owner,
    };
    let (_, took) = d
        .compiles
        .join(form.entry_key, move || job.run().boxed())
        .await?;
    Ok(Some(took))
}

/// The form a rule asks for of one model, or why it has none.
enum RuleKey {
    Form(Box<RuleForm>),
    /// The model has no form (too large to give a worker whole), or the
    /// runtime cannot be used.
    NoForm(String),
}

/// The form a rule asks for of one model: the runtime that makes it, its
/// key, and whether it is stored.
struct RuleForm {
    rt: Arc<Configured>,
    key: FormKey,
    entry_key: EntryKey,
    stored: bool,
}

/// The form `runtime` makes `made_with` of `m` (its digests charged to
/// `payer`), from a blocking thread of the runtime.
fn rule_key(
    d: &Daemon,
    payer: Option<u32>,
    m: &model::OpenedModel,
    runtime: &str,
    made_with: MadeWith,
) -> Result<RuleKey> {
    let digest = match digest_of(d, payer, m)? {
        Ok(digest) => digest,
        Err(why) => return Ok(RuleKey::NoForm(why)),
    };
    // From a blocking thread of the runtime (never an async one).
    let found =
        tokio::runtime::Handle::current().block_on(runtime_key(d, runtime, digest, made_with));
    let (rt, key) = match found {
        Ok(found) => found,
        Err(miss) => return Ok(RuleKey::NoForm(miss.detail)),
    };
    let entry_key = entry_key_of(&key)?;
    let stored = d.store.stat(&entry_key)?.is_some();
    Ok(RuleKey::Form(Box::new(RuleForm {
        rt,
        key,
        entry_key,
        stored,
    })))
}

/// What `remote pull` did with a form a policy rule asks for.
pub(crate) enum Pulled {
    /// Stored already.
    Present,
    /// Fetched now: the bytes of the form's own entry.
    Fetched(u64),
    /// Not taken, and why (nothing is compiled).
    Missing(String),
}

/// The error of a remote pull whose caller went: its loop's check between
/// entries and a form's fetch it waits for.
pub(crate) fn pull_abandoned() -> Error {
    Error::cancelled("the caller of remote pull went away")
}

/// `remote pull`'s part of a policy rule (`format`, `params`) of a form:
/// the form of the model `m`, fetched from the fleet unless stored (or
/// taken from a compile's fetch of it under way), from a blocking thread;
/// it stops once `gone` is set (the fetch goes on while a compile waits
/// for it), charged to `payer`. Nothing is compiled.
pub(crate) fn pulled(
    d: &Arc<Daemon>,
    payer: Option<u32>,
    m: &model::OpenedModel,
    (format, params): (&str, &BTreeMap<String, String>),
    gone: &Gone,
) -> Result<Pulled> {
    let Some(fleet) = &d.fleet else {
        return Ok(Pulled::Missing("no [remote] in the daemon's config".into()));
    };
    if !fleet.asks_for_forms(Ask::Always) {
        let why = "no key is trusted for runtime forms (trusted_form_keys, or a signing key)";
        return Ok(Pulled::Missing(why.into()));
    }
    let (runtime, made_with) = rule_form(format, params);
    let form = match rule_key(d, payer, m, &runtime, made_with)? {
        RuleKey::Form(form) if form.stored => return Ok(Pulled::Present),
        RuleKey::Form(form) => form,
        RuleKey::NoForm(why) => return Ok(Pulled::Missing(why)),
    };
    let (entry_key, shape) = (form.entry_key, job::form_shape(d, &form.key));
    let fetch = fetched::fetched(d, (entry_key, shape), m.path.display().to_string());
    // The fetch this pull starts is charged to its caller, as the pull is
    // (a blocking thread has no request task to name the payer).
    let fetch = async {
        match payer {
            Some(uid) => d.cpu_budget.payer(uid).serve(fetch).await,
            None => fetch.await,
        }
    };
    // From a blocking thread of the runtime (never an async one).
    let got = tokio::runtime::Handle::current().block_on(async {
        match select(pin!(fetch), pin!(gone.wait())).await {
            Either::Left((got, _)) => Some(got),
            Either::Right(_) => None,
        }
    });
    let got = got.ok_or_else(pull_abandoned)?;
    Ok(match got? {
        Some(e) => Pulled::Fetched(e.payload.len),
        None => Pulled::Missing(format!(
            "no form {entry_key} taken from the remote (why: `remote status`, the daemon's log)"
        )),
    })
}
