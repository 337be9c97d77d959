//! The fleet tier of ctcache: hosts share compiled tensors through
//! S3-compatible object storage. This crate holds the parts that do not
//! belong to one daemon: the object layout ([`layout`]), signed manifests
//! ([`manifest`], [`keys`]), the payload check ([`payload`]), the audit of
//! fetched entries ([`audit`]), the breaker
//! and negative cache ([`guard`]), the `[remote]` config ([`config`]) and,
//! with the `client` feature, the async object store client ([`client`]).
//! The core crate stays free of async and network code.

#![deny(missing_docs)]

pub mod audit;
pub mod breaker;
pub mod config;
pub mod fetch_check;
pub mod layout;
pub mod manifest;
pub mod signing_keys;

#[cfg(feature = "client")]
pub mod client;
