//! The one vocabulary of miss reasons (D6, D9): every path that answers "is
//! there a usable entry?" names its "no" with one of these stable codes.

use std::fmt;

use crate::device::Mismatch;

/// Why an entry cannot be used (or why there is none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MissReason {
    /// Nothing is stored (or embedded) for this source.
    NoEntry,
    /// The entry's source is not a tensor ctcache can key (an initializer
    /// that cannot be read, a segmented tensor, ...).
    NotASource(String),
    /// A structural (checker) error: the entry is ignored.
    Invalid {
        /// The checker rule's short name.
        rule: &'static str,
        /// What the checker found.
        message: String,
    },
    /// The recorded source digest differs from the initializer's current one.
    StaleDigest,
    /// The entry names a digest algorithm this build does not know.
    UnknownDigestAlgorithm(String),
    /// No host device satisfies the entry's device (D5); the first mismatch.
    IncompatibleDevice(Mismatch),
    /// The layout is not one this build's packers produce for this source
    /// (an unknown name, or a known name over another layout).
    UnknownPhysicalType {
        /// The physical type's name.
        name: String,
        /// How it differs from the layouts this build knows.
        detail: String,
    },
    /// The type is known but its `ctcache.format_version` is not one this build reads.
    UnsupportedFormatVersion {
        /// The physical type's name.
        name: String,
        /// The version it declares.
        version: String,
    },
    /// A stored entry recorded before the store kept source shapes: its
    /// layout cannot be judged.
    NoSourceShape,
    /// The payload's bytes do not hash to the checksum recorded for them.
    PayloadChecksum(String),
    /// The caller accepts only entries the daemon packed itself.
    NotDaemonProduced {
        /// The user who put the entry.
        uid: u32,
    },
    /// No runtime of that name can make forms in this daemon (none
    /// configured, or the configured library cannot be used): why.
    RuntimeUnavailable(String),
    /// A form of the model exists under another key (D15): the first part
    /// that differs.
    FormKeyDiffers(crate::forms::KeyPart),
}

impl MissReason {
    /// Every code, in the order of the loading rules.
    pub const CODES: [&'static str; 13] = [
        "no_entry",
        "not_a_source",
        "invalid",
        "unknown_digest_algorithm",
        "stale_digest",
        "incompatible_device",
        "unknown_physical_type",
        "unsupported_format_version",
        "no_source_shape",
        "not_daemon_produced",
        "payload_checksum",
        "runtime_unavailable",
        "form_key_differs",
    ];

    /// Machine-readable reason code (stable; one of [`MissReason::CODES`]).
    pub fn code(&self) -> &'static str {
        match self {
            MissReason::NoEntry => "no_entry",
            MissReason::NotASource(_) => "not_a_source",
            MissReason::Invalid { .. } => "invalid",
            MissReason::StaleDigest => "stale_digest",
            MissReason::UnknownDigestAlgorithm(_) => "unknown_digest_algorithm",
            MissReason::IncompatibleDevice(_) => "incompatible_device",
            MissReason::UnknownPhysicalType { .. } => "unknown_physical_type",
            MissReason::UnsupportedFormatVersion { .. } => "unsupported_format_version",
            MissReason::NoSourceShape => "no_source_shape",
            MissReason::PayloadChecksum(_) => "payload_checksum",
            MissReason::NotDaemonProduced { .. } => "not_daemon_produced",
            MissReason::RuntimeUnavailable(_) => "runtime_unavailable",
            MissReason::FormKeyDiffers(_) => "form_key_differs",
        }
    }

    /// The sentence for humans, without the code.
    pub fn detail(&self) -> String {
        match self {
            MissReason::NoEntry => "nothing is stored for this source".into(),
            MissReason::NotASource(why) => why.clone(),
            MissReason::Invalid { rule, message } => format!("[{rule}] {message}"),
            MissReason::StaleDigest => {
                "the initializer changed since the entry was compiled".into()
            }
            MissReason::UnknownDigestAlgorithm(a) => format!("{a:?} is not blake3 or sha256"),
            MissReason::IncompatibleDevice(m) => m.to_string(),
            MissReason::UnknownPhysicalType { name, detail } => {
                format!("{name:?} is not recognized: {detail}")
            }
            MissReason::UnsupportedFormatVersion { name, version } => {
                format!("{name:?} version {version:?} is not the one this build produces")
            }
            MissReason::NoSourceShape => {
                "the entry was stored without its source shape, so its layout cannot be checked"
                    .into()
            }
            MissReason::PayloadChecksum(d) => d.clone(),
            MissReason::NotDaemonProduced { uid } => {
                format!("put by uid {uid}; only entries the daemon packed are accepted")
            }
            MissReason::RuntimeUnavailable(why) => why.clone(),
            MissReason::FormKeyDiffers(part) => format!("a form exists with {part}"),
        }
    }

    /// An `Invalid` reason from a checker error.
    pub fn invalid(e: crate::check::CheckError) -> MissReason {
        MissReason::Invalid {
            rule: e.rule,
            message: format!("{}: {}", e.field, e.message),
        }
    }
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code(), self.detail())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_listed_and_distinct() {
        let all = [
            MissReason::NoEntry,
            MissReason::NotASource(String::new()),
            MissReason::Invalid {
                rule: "r",
                message: String::new(),
            },
            MissReason::UnknownDigestAlgorithm(String::new()),
            MissReason::StaleDigest,
            MissReason::IncompatibleDevice(Mismatch {
                field: "type".into(),
                detail: String::new(),
            }),
            MissReason::UnknownPhysicalType {
                name: String::new(),
                detail: String::new(),
            },
            MissReason::UnsupportedFormatVersion {
                name: String::new(),
                version: String::new(),
            },
            MissReason::NoSourceShape,
            MissReason::NotDaemonProduced { uid: 1 },
            MissReason::PayloadChecksum(String::new()),
            MissReason::RuntimeUnavailable(String::new()),
            MissReason::FormKeyDiffers(crate::forms::KeyPart::Model),
        ];
        let codes: Vec<&str> = all.iter().map(MissReason::code).collect();
        assert_eq!(codes, MissReason::CODES);
        assert!(all[4].to_string().starts_with("stale_digest: "));
    }
}
