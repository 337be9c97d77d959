//! Kernel instruction sets. Every packer has a portable scalar kernel; the
//! x86-64 AVX2 kernels (which also use F16C, never FMA) are chosen at run
//! time and must produce the same bytes. Tests force each path.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, written so the compiler can vectorize it.
    Scalar,
    /// x86-64 AVX2 + F16C intrinsics.
    Avx2,
}

impl Isa {
    pub const ALL: [Isa; 2] = [Isa::Scalar, Isa::Avx2];

    /// The best instruction set of this CPU.
    pub fn detect() -> Isa {
        if Isa::Avx2.available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    /// Whether kernels for `self` can run on this CPU.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2_available(),
        }
    }

    /// Every instruction set this CPU can run.
    pub fn available_all() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
        }
    }

    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == name)
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}
