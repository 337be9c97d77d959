//! The daemon's use cases as names: what the transport rule admits for a
//! caller, what the request guard maps each RPC to, and which of them only
//! read. It imports nothing of the daemon, so the caller and the use cases
//! can both name it without importing each other.

/// The daemon's use cases as the transport rule sees them (see
/// `Caller::admits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UseCase {
    GetHostDevices,
    ListFormats,
    Lookup,
    BatchLookup,
    ResolveModel,
    Prepack,
    Put,
    ReadPayload,
    AcquireLease,
    RenewLease,
    ReleaseLease,
    Embed,
    Materialize,
    Compile,
    Import,
    Stats,
    List,
    Status,
    Gc,
    Verify,
    AddWatch,
    RemoveWatch,
    ListWatches,
    Events,
    RemotePull,
    RemotePush,
    RemoteStatus,
    /// grpc.health.v1.
    Health,
    /// grpc.reflection.
    Reflection,
}

impl UseCase {
    /// Every use case, for the edge's method table.
    pub const ALL: [UseCase; 29] = [
        UseCase::GetHostDevices,
        UseCase::ListFormats,
        UseCase::Lookup,
        UseCase::BatchLookup,
        UseCase::ResolveModel,
        UseCase::Prepack,
        UseCase::Put,
        UseCase::ReadPayload,
        UseCase::AcquireLease,
        UseCase::RenewLease,
        UseCase::ReleaseLease,
        UseCase::Embed,
        UseCase::Materialize,
        UseCase::Compile,
        UseCase::Import,
        UseCase::Stats,
        UseCase::List,
        UseCase::Status,
        UseCase::Gc,
        UseCase::Verify,
        UseCase::AddWatch,
        UseCase::RemoveWatch,
        UseCase::ListWatches,
        UseCase::Events,
        UseCase::RemotePull,
        UseCase::RemotePush,
        UseCase::RemoteStatus,
        UseCase::Health,
        UseCase::Reflection,
    ];

    /// The RPC's name.
    pub fn name(self) -> &'static str {
        match self {
            UseCase::GetHostDevices => "GetHostDevices",
            UseCase::ListFormats => "ListFormats",
            UseCase::Lookup => "Lookup",
            UseCase::BatchLookup => "BatchLookup",
            UseCase::ResolveModel => "ResolveModel",
            UseCase::Prepack => "Prepack",
            UseCase::Put => "Put",
            UseCase::ReadPayload => "ReadPayload",
            UseCase::AcquireLease => "AcquireLease",
            UseCase::RenewLease => "RenewLease",
            UseCase::ReleaseLease => "ReleaseLease",
            UseCase::Embed => "Embed",
            UseCase::Materialize => "Materialize",
            UseCase::Compile => "Compile",
            UseCase::Import => "Import",
            UseCase::Stats => "Stats",
            UseCase::List => "List",
            UseCase::Status => "Status",
            UseCase::Gc => "Gc",
            UseCase::Verify => "Verify",
            UseCase::AddWatch => "AddWatch",
            UseCase::RemoveWatch => "RemoveWatch",
            UseCase::ListWatches => "ListWatches",
            UseCase::Events => "Events",
            UseCase::RemotePull => "RemotePull",
            UseCase::RemotePush => "RemotePush",
            UseCase::RemoteStatus => "RemoteStatus",
            UseCase::Health => "Health",
            UseCase::Reflection => "Reflection",
        }
    }

    /// The names of the use cases that only read, in [`UseCase::ALL`]'s
    /// order: the one list error texts and docs state.
    pub fn read_only_names() -> Vec<&'static str> {
        UseCase::ALL
            .into_iter()
            .filter(|u| u.reads_only())
            .map(UseCase::name)
            .collect()
    }

    /// Reads the cache or the daemon's state and changes nothing a caller
    /// could notice (ResolveModel packs only what its caller may already
    /// have packed through a watched folder; see docs/operations/secure.md).
    /// RemoteStatus is not: it makes the daemon send a request.
    pub fn reads_only(self) -> bool {
        matches!(
            self,
            UseCase::Lookup
                | UseCase::BatchLookup
                | UseCase::ResolveModel
                | UseCase::ReadPayload
                | UseCase::Status
                | UseCase::Health
                | UseCase::ListFormats
                | UseCase::GetHostDevices
                | UseCase::List
                | UseCase::Stats
                | UseCase::ListWatches
        )
    }
}

#[cfg(test)]
mod tests {
    use super::UseCase;

    /// docs/operations/secure.md's row for plain TCP callers names exactly
    /// the use cases that only read (health is `Health`).
    #[test]
    fn the_read_only_set_is_the_one_operations_states() {
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations/secure.md"),
        )
        .unwrap();
        let row = doc
            .lines()
            .find(|l| l.starts_with("| TCP without one"))
            .expect("docs/operations/secure.md has the plain TCP row");
        let reads = row
            .split_once("Reads only:")
            .and_then(|(_, r)| r.split_once("Every other method"))
            .expect("the row lists the reads before 'Every other method'")
            .0;
        let mut stated: Vec<String> = reads
            .split(", ")
            .map(|n| {
                let n = n.split_whitespace().next().unwrap_or("");
                let n = n.trim_matches(|c: char| c == '`' || c == '.' || c == ',');
                if n == "health" {
                    "Health".to_string()
                } else {
                    n.to_string()
                }
            })
            .collect();
        let mut want: Vec<String> = UseCase::read_only_names()
            .into_iter()
            .map(str::to_string)
            .collect();
        stated.sort();
        want.sort();
        assert_eq!(stated, want, "{row}");
    }
}
