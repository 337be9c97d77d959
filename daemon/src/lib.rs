//! ctcached: the compiled-tensor cache daemon. `server::serve` runs the gRPC
//! service on listeners the caller binds; `main.rs` only wires config,
//! logging, the store and sockets.

pub mod config;
pub mod convert;
pub mod daemon;
pub mod import;
pub mod logging;
pub mod materialize;
pub mod memo;
pub mod metrics;
pub mod peer;
pub mod policy;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod systemd;
pub mod transport;
pub mod watcher;
