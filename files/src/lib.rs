//! Files a ctcache process writes with its own rights, shared by the core
//! (the daemon's store-side writes, `materialize --local`) and the clients
//! (a materialized model written from the daemon's answer), and nothing of
//! the store: an output folder held open ([`outdir`]), a payload file
//! placed by reflink, copy or hard link ([`place`]), a materialized model
//! written from its answer ([`answer`]).

#![deny(missing_docs)]

pub mod answer;
mod error;
pub mod outdir;
pub mod place;
mod stamp;

pub use error::{Error, Result};
pub use stamp::{fill_random, FileStamp};
