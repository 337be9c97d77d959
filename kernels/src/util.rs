//! Small shared helpers: element counts and little-endian reads.

/// Product of `dims` (1 for a scalar), `None` on overflow.
pub(crate) fn numel(dims: &[u64]) -> Option<u64> {
    dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

/// `usize` from a `u64` that has already been checked to fit in memory.
#[inline(always)]
pub(crate) fn us(v: u64) -> usize {
    usize::try_from(v).expect("size fits in memory")
}
