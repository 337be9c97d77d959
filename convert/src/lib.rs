//! Conversions between the core's types and the API messages, in one place:
//! the daemon encodes its answers with these and `ctcachectl` builds the
//! same answers from the core when it works on a cache dir directly. They
//! live apart from `ctcache-api`, so that clients of the API never compile
//! the store.

#![deny(missing_docs)]

pub mod materialize;
mod store;

pub use store::{
    entry, entry_brief, gc, gc_reason, key_from_str, key_to_string, miss, stats, verify,
};
