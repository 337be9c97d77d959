//! Which 16-bit type a cast makes: shared by the cast kernel and its ISA
//! paths.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    F16,
    Bf16,
}
