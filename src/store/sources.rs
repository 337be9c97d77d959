//! The `Sources` tree: for each source prefix (algorithm || digest), the
//! sorted key suffixes (device key || type key, 64 bytes each) of its
//! entries. Lookups read it with one point read and then fetch each entry
//! by key; sled's range scans clone a whole index node per scan, which
//! would cost more than the lookup itself. It is updated in the same atomic
//! commit as the entries it lists.

use super::index::{Expect, Op, Precondition, Tree};
use super::key::{KeyBytes, SOURCE_PREFIX_LEN};

pub(crate) const SUFFIX_LEN: usize = 64;

pub(crate) fn prefix(kb: &KeyBytes) -> &[u8] {
    &kb[..SOURCE_PREFIX_LEN]
}

pub(crate) fn suffix(kb: &KeyBytes) -> &[u8] {
    &kb[SOURCE_PREFIX_LEN..]
}

/// The suffixes of a list (a trailing partial suffix, which no writer
/// produces, is ignored).
pub(crate) fn suffixes(list: &[u8]) -> impl Iterator<Item = &[u8]> {
    list.chunks_exact(SUFFIX_LEN)
}

/// `list` with `s` added (kept sorted, no duplicates).
pub(crate) fn with(list: &[u8], s: &[u8]) -> Vec<u8> {
    let mut v: Vec<&[u8]> = suffixes(list).collect();
    if let Err(at) = v.binary_search(&s) {
        v.insert(at, s);
    }
    v.concat()
}

/// `list` without `s`.
pub(crate) fn without(list: &[u8], s: &[u8]) -> Vec<u8> {
    suffixes(list)
        .filter(|x| *x != s)
        .collect::<Vec<_>>()
        .concat()
}

/// The precondition that the list of `prefix` is still `old`.
pub(crate) fn unchanged(prefix: &[u8], old: &Option<Vec<u8>>) -> Precondition {
    let expect = match old {
        Some(v) => Expect::Equals(v.clone()),
        None => Expect::Absent,
    };
    Precondition::new(Tree::Sources, prefix, expect)
}

/// The write that stores `new` as the list of `prefix` (an empty list is
/// deleted).
pub(crate) fn store(prefix: &[u8], new: Vec<u8>) -> Op {
    if new.is_empty() {
        Op::Delete(Tree::Sources, prefix.to_vec())
    } else {
        Op::Put(Tree::Sources, prefix.to_vec(), new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_set_of_suffixes() {
        let a = [1u8; SUFFIX_LEN];
        let b = [2u8; SUFFIX_LEN];
        let l = with(&with(&[], &b), &a);
        assert_eq!(l, [a, b].concat());
        assert_eq!(with(&l, &a), l);
        assert_eq!(without(&l, &a), b.to_vec());
        assert!(without(&without(&l, &a), &b).is_empty());
        assert_eq!(suffixes(&l).count(), 2);
    }
}
