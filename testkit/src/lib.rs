//! Test support shared by the workspace's integration tests and benches (one
//! implementation instead of a copy per crate):
//!
//! - [`locate_bin`]: a binary built by cargo (`ctcached`, `ctcachectl`);
//! - [`Daemon`]: a real `ctcached` on temp dirs, waited for until it listens,
//!   stopped with SIGTERM and a bounded wait, killed on drop;
//! - `InProcessDaemon` (feature `in-process`): `ctcached::run` in this
//!   process on temp dirs;
//! - [`eventually`] / [`eventually_async`]: polling with a deadline;
//! - synthetic models built through the prost types ([`MatMul`],
//!   [`f32_tensor`], [`tensor_info`], [`kv`]), written atomically
//!   ([`write_model`]), and the D3 digests of their initializers;
//! - [`rot_payload`] / [`payload_intact`]: disk rot in a store's payload
//!   files, and the check that a file is whole; [`paths_under`]: what a
//!   folder holds;
//! - [`resident`]: the bytes of a mapping this process holds in memory;
//! - [`Figure`]: a bench's figure as a `RESULT` line for `bench/all.sh`;
//! - [`Tmpfs`]: a small file system of a test's own to fill (as root).

mod bins;
mod daemon;
mod figure;
#[cfg(feature = "in-process")]
mod in_process;
mod model;
mod policy;
mod poll;
#[cfg(target_os = "linux")]
mod resident;
mod store_files;
mod tmpfs;

pub use bins::locate_bin;
#[cfg(feature = "in-process")]
pub use ctcached::config::Config as DaemonConfig;
pub use daemon::{Daemon, DaemonBuilder, KillOnDrop};
pub use figure::{Figure, On};
#[cfg(feature = "in-process")]
pub use in_process::InProcessDaemon;
pub use model::{
    digest_of_file, f32_tensor, f32_tensor_from, initializer_digest, kv, node, open_proto,
    tensor_info, unit_f32, write_atomic, write_model, xorshift, MatMul,
};
pub use policy::TEST_POLICY_TOML;
pub use poll::{clock_past, eventually, eventually_async, poll};
#[cfg(target_os = "linux")]
pub use resident::resident;
pub use store_files::{paths_under, payload_intact, rot_payload};
pub use tmpfs::{fill, Tmpfs};
