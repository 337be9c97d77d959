//! `ctcachectl materialize` through the daemon: it builds the model from
//! cached entries (packing what is missing, a bar on a terminal), and this
//! process writes it with the user's own rights.

use std::time::Instant;

use super::args::MaterializeArgs;
use super::{bar, report::report};
use crate::ctx::Ctx;
use crate::output::Failure;
use ctcache_client::api;

/// False when no daemon answers and the model is to be materialized here.
pub(super) async fn materialize_daemon(ctx: &Ctx, a: &MaterializeArgs) -> Result<bool, Failure> {
    let Some(c) = ctx.connect_or_local("materializing").await? else {
        return Ok(false);
    };
    let started = Instant::now();
    let req = api::MaterializeRequest {
        model_path: a.model.display().to_string(),
        target: a.target.clone(),
        bits: MaterializeArgs::number(&a.bits),
        block_size: MaterializeArgs::number(&a.block_size),
        symmetric: a.symmetric(),
        accuracy_level: a.accuracy_level,
        weight_type: a.weight_type.clone().unwrap_or_default(),
        per_channel: a.per_channel,
        reduce_range: a.reduce_range,
        op_types: a.op_types.clone(),
        op_block_list: a.op_block_list.clone(),
        ..Default::default()
    };
    let call = c.materialize_for_file(req, &a.output);
    let mut call = Box::pin(call);
    let mut bar = None;
    let built = tokio::select! {
        r = &mut call => r,
        () = bar::follow(ctx, &c, &a.model, &mut bar) => unreachable!("follow never returns"),
        // The dropped call tells the daemon, which stops packing.
        _ = tokio::signal::ctrl_c() => {
            bar.inspect(|b: &indicatif::ProgressBar| b.finish_and_clear());
            return Err(Failure::interrupted("nothing was written"));
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let built = built?;
    // This process writes the model, with the user's own rights; Ctrl-C
    // stops the write, which removes what it made.
    let stop = crate::interrupt::on_ctrl_c_flag()?;
    let r = c.write_materialized(built, a.link_mode(), &stop).await?;
    report(ctx, a, "daemon", &r, started.elapsed())?;
    Ok(true)
}
