//! The ctcached gRPC API, version 1: messages, client and server stubs
//! generated from `proto/ctcache/v1/ctcache.proto`, and their wire helpers.
//! Struct types travel encoded ([`StructType`]). Nothing of the store is
//! here: conversions from the core's types live in `ctcache-convert`.

#![deny(missing_docs)]

#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("ctcache.v1");
}

pub mod handout;
pub mod placed;
pub mod served;
mod struct_type;

pub use struct_type::StructType;

/// Lower-case hex, written straight into a buffer of its final size (the
/// `hex` crate's `encode` collects it a char at a time, a visible cost when
/// a batch answers thousands of entries with three hex fields each).
pub fn hex_string(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    hex::encode_to_slice(bytes, &mut out).expect("the buffer is twice the input");
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// Every gRPC status code, in number order.
const CODES: [tonic::Code; 17] = {
    use tonic::Code::*;
    [
        Ok,
        Cancelled,
        Unknown,
        InvalidArgument,
        DeadlineExceeded,
        NotFound,
        AlreadyExists,
        PermissionDenied,
        ResourceExhausted,
        FailedPrecondition,
        Aborted,
        OutOfRange,
        Unimplemented,
        Internal,
        Unavailable,
        DataLoss,
        Unauthenticated,
    ]
};

/// The canonical name of a gRPC code (`RESOURCE_EXHAUSTED`), as answers
/// that carry a failure inside a message spell it
/// (`PrepackProgress.code`).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The gRPC code whose canonical name is `name` ([`code_name`]).
pub fn code_named(name: &str) -> Option<tonic::Code> {
    CODES.into_iter().find(|c| code_name(*c) == name)
}

/// The encoded file descriptor set, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ctcache_descriptor.bin"));

impl v1::JobState {
    /// The word people and JSON output see: `queued`, `running`, `done`,
    /// `cached`, `failed`, `cancelled`.
    pub fn name(self) -> &'static str {
        match self {
            v1::JobState::Unspecified => "unknown",
            v1::JobState::Queued => "queued",
            v1::JobState::Running => "running",
            v1::JobState::Done => "done",
            v1::JobState::Cached => "cached",
            v1::JobState::Failed => "failed",
            v1::JobState::Cancelled => "cancelled",
        }
    }

    /// Whether the job is over (it will not change again).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            v1::JobState::Done
                | v1::JobState::Cached
                | v1::JobState::Failed
                | v1::JobState::Cancelled
        )
    }

    /// Whether the job ended with an entry.
    pub fn succeeded(self) -> bool {
        matches!(self, v1::JobState::Done | v1::JobState::Cached)
    }
}

impl v1::Backend {
    /// `auto`, `cpu` or `wgpu`.
    pub fn name(self) -> &'static str {
        match self {
            v1::Backend::Auto => "auto",
            v1::Backend::Cpu => "cpu",
            v1::Backend::Wgpu => "wgpu",
        }
    }

    /// The backend named `name` (`auto`, `cpu`, `wgpu`).
    pub fn from_name(name: &str) -> Option<v1::Backend> {
        [v1::Backend::Auto, v1::Backend::Cpu, v1::Backend::Wgpu]
            .into_iter()
            .find(|b| b.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_names_round_trip_and_are_grpcs() {
        for (i, c) in CODES.into_iter().enumerate() {
            assert_eq!(c as usize, i);
            assert_eq!(code_named(code_name(c)), Some(c));
        }
        assert_eq!(
            code_name(tonic::Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
        assert_eq!(code_named("resource_exhausted"), None);
    }

    #[test]
    fn hex_string_is_lower_case_hex_of_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(hex_string(&all), hex::encode(&all));
        assert_eq!(hex_string(&[0x0f, 0xa0]), "0fa0");
        assert_eq!(hex_string(&[]), "");
    }
}
