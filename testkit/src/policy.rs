//! The policy the test daemons run with: the daemon's default (what the
//! default materialize target reads: onnxruntime's 4-bit format, embedding
//! tables whole) and the host's SGEMM panels (`gemm.pack_b.f32`, a format
//! a client reads itself). The tests of packing, serving and the fleet tier
//! were written for two formats of one weight; tests of the default policy
//! start a daemon with no config of their own (the Python e2e harness).

/// `[[policy]]` tables of the three rules (`testkit/test_policy.toml`, which
/// the Python tests read too).
pub const TEST_POLICY_TOML: &str = include_str!("../test_policy.toml");
