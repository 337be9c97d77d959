//! ctcache client library and the `ctcachectl` command line.
//!
//! [`Client`] talks to `ctcached` over its Unix socket; see [`client`].

pub mod cli;
pub mod client;

pub use client::{
    api, default_socket, Client, Error, MappedPayload, MessageStream, OpenOptions, ResolveOptions,
    Result,
};
