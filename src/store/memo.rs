//! The memo tree: small records a store user keeps in the same index as the
//! entries (the daemon's digest memo), so they share its durability and
//! need no file of their own. Values are opaque to the store.

use super::error::StoreResult;
use super::index::{Op, Tree};
use super::Store;

impl Store {
    /// The memo record of `key`, if any.
    pub fn memo_get(&self, key: &[u8]) -> StoreResult<Option<Vec<u8>>> {
        self.index.get(Tree::Memo, key)
    }

    /// Sets the memo record of `key` (durable at the next index flush).
    pub fn memo_put(&self, key: &[u8], value: &[u8]) -> StoreResult<()> {
        self.index
            .commit(&[], &[Op::Put(Tree::Memo, key.to_vec(), value.to_vec())])
            .map(|_| ())
    }

    /// Visits every memo record in key order until `visit` returns false.
    pub fn memo_scan(&self, visit: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> StoreResult<()> {
        self.index.scan(Tree::Memo, &[], None, visit)
    }

    /// Drops the memo record of `key`.
    pub fn memo_remove(&self, key: &[u8]) -> StoreResult<()> {
        self.index
            .commit(&[], &[Op::Delete(Tree::Memo, key.to_vec())])
            .map(|_| ())
    }
}
