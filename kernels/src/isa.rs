//! Kernel instruction sets. Every packer has a portable scalar kernel; the
//! x86-64 AVX2 kernels (which also use F16C, never FMA) and AVX-512
//! kernels (F + BW + VL, with AVX2 and F16C, never FMA) and the aarch64
//! NEON kernels (Advanced SIMD only, never `vfma`) are chosen at run time
//! and must produce the same bytes. Tests force each path.

use std::fmt;

/// An instruction set a kernel can be written for; every one gives the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust, written so the compiler can vectorize it.
    Scalar,
    /// x86-64 AVX2 + F16C intrinsics.
    Avx2,
    /// x86-64 AVX-512 F + BW + VL (plus AVX2 and F16C) intrinsics. A
    /// kernel without a 512-bit version runs its AVX2 code here.
    Avx512,
    /// aarch64 Advanced SIMD (NEON) intrinsics, integer/bit code for every
    /// half-precision conversion (no FP16 extension needed).
    Neon,
}

impl Isa {
    /// Every instruction set, available on this CPU or not (tests iterate it).
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// The best instruction set of this CPU.
    pub fn detect() -> Isa {
        if Isa::Neon.available() {
            Isa::Neon
        } else if Isa::Avx512.available() {
            Isa::Avx512
        } else if Isa::Avx2.available() {
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
            Isa::Avx512 => avx512_available(),
            Isa::Neon => neon_available(),
        }
    }

    /// Every instruction set this CPU can run.
    pub fn available_all() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The name used in flags, benchmarks and logs, e.g. `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Parses an [`Isa::name`]; `None` for any other string.
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

/// The AVX-512 kernels enable exactly these features (plus those of AVX2,
/// which they may call).
#[cfg(target_arch = "x86_64")]
fn avx512_available() -> bool {
    avx2_available()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_available() -> bool {
    false
}

#[cfg(not(target_arch = "x86_64"))]
fn avx512_available() -> bool {
    false
}

#[cfg(target_arch = "aarch64")]
fn neon_available() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
}

#[cfg(not(target_arch = "aarch64"))]
fn neon_available() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_detect_prefers_the_widest() {
        for isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        let all = Isa::available_all();
        assert_eq!(all[0], Isa::Scalar);
        assert_eq!(Isa::detect(), *all.last().unwrap());
        if Isa::Avx512.available() {
            assert!(Isa::Avx2.available());
        }
        assert_eq!(Isa::Neon.available(), cfg!(target_arch = "aarch64"));
    }
}
