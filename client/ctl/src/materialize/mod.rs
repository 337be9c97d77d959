//! `materialize`: an onnxruntime-ready model assembled by the daemon from
//! cached entries (reflinked or copied, hard-linked with `--link hard`):
//! `--target onnxruntime-int4` (MatMulNBits over `ort.matmul_nbits`) or
//! `onnxruntime-int8` (quantize_dynamic's graph over `ort.quantize_dynamic`);
//! without a daemon (or with `--local`), packed in this process into the
//! model's weights folder.

use crate::ctx::Ctx;
use crate::output::Failure;

mod args;
mod bar;
mod daemon;
mod local;
mod report;

pub use args::MaterializeArgs;
use daemon::materialize_daemon;
use local::materialize_local;

/// Through the daemon; here with `--local`, or when no socket was named
/// and none answers.
pub fn materialize(ctx: &Ctx, a: MaterializeArgs) -> Result<(), Failure> {
    // Flags of another target are refused before anything is asked or written.
    a.recipe()?;
    if !a.local && ctx.block_on(materialize_daemon(ctx, &a))? {
        return Ok(());
    }
    materialize_local(ctx, &a)
}
