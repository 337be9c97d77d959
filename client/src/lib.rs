//! ctcache client library and the `ctcachectl` command line.

pub mod cli;
