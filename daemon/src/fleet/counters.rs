//! Counters of the fleet tier: kept here for `status`, mirrored to the
//! Prometheus endpoint as `ctcache_remote_*`.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub errors: AtomicU64,
    pub rejected: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub uploads: AtomicU64,
    pub upload_drops: AtomicU64,
    /// Local misses the remote was not asked about: breaker open.
    pub skipped: AtomicU64,
    /// Cost-rule decisions.
    pub chose_fetch: AtomicU64,
    pub chose_pack: AtomicU64,
    /// Fetches packed again and compared.
    pub audits: AtomicU64,
    pub audit_mismatches: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub rejected: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub uploads: u64,
    pub upload_drops: u64,
    pub skipped: u64,
    pub chose_fetch: u64,
    pub chose_pack: u64,
    pub audits: u64,
    pub audit_mismatches: u64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    pub fn hit(&self, bytes: u64) {
        add(&self.hits, 1);
        metrics::counter!("ctcache_remote_hits_total").increment(1);
        self.fetched(bytes);
    }

    /// Payload bytes fetched (a hit's, or a form's weight's).
    pub fn fetched(&self, bytes: u64) {
        add(&self.bytes_in, bytes);
        metrics::counter!("ctcache_remote_bytes_in_total").increment(bytes);
    }

    pub fn miss(&self) {
        add(&self.misses, 1);
        metrics::counter!("ctcache_remote_misses_total").increment(1);
    }

    pub fn error(&self, during: &'static str) {
        add(&self.errors, 1);
        metrics::counter!("ctcache_remote_errors_total", "during" => during).increment(1);
    }

    pub fn rejected(&self, reason: &'static str) {
        add(&self.rejected, 1);
        metrics::counter!("ctcache_remote_rejected_total", "reason" => reason).increment(1);
    }

    pub fn uploaded(&self, bytes: u64) {
        add(&self.uploads, 1);
        add(&self.bytes_out, bytes);
        metrics::counter!("ctcache_remote_uploads_total").increment(1);
        metrics::counter!("ctcache_remote_bytes_out_total").increment(bytes);
    }

    pub fn dropped(&self) {
        add(&self.upload_drops, 1);
        metrics::counter!("ctcache_remote_upload_drops_total").increment(1);
    }

    pub fn skipped(&self) {
        add(&self.skipped, 1);
        metrics::counter!("ctcache_remote_skipped_total").increment(1);
    }

    pub fn chose(&self, fetch: bool) {
        let (c, path) = if fetch {
            (&self.chose_fetch, "fetch")
        } else {
            (&self.chose_pack, "pack")
        };
        add(c, 1);
        metrics::counter!("ctcache_remote_decisions_total", "path" => path).increment(1);
    }

    /// An audit's local pack ran (`packed`) or failed.
    pub fn audited(&self, packed: bool) {
        add(&self.audits, 1);
        let result = if packed { "packed" } else { "pack_failed" };
        metrics::counter!("ctcache_remote_audits_total", "result" => result).increment(1);
    }

    /// A trusted key signed bytes this host's packer does not produce.
    pub fn audit_mismatch(&self, signer: &str) {
        add(&self.audit_mismatches, 1);
        metrics::counter!("ctcache_remote_audit_mismatches_total", "signer" => signer.to_string())
            .increment(1);
    }

    pub fn snapshot(&self) -> Snapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Snapshot {
            hits: g(&self.hits),
            misses: g(&self.misses),
            errors: g(&self.errors),
            rejected: g(&self.rejected),
            bytes_in: g(&self.bytes_in),
            bytes_out: g(&self.bytes_out),
            uploads: g(&self.uploads),
            upload_drops: g(&self.upload_drops),
            skipped: g(&self.skipped),
            chose_fetch: g(&self.chose_fetch),
            chose_pack: g(&self.chose_pack),
            audits: g(&self.audits),
            audit_mismatches: g(&self.audit_mismatches),
        }
    }
}

/// Describes the metrics on the Prometheus endpoint.
pub(crate) fn describe() {
    let c = |name: &'static str, help: &'static str| metrics::describe_counter!(name, help);
    c(
        "ctcache_remote_hits_total",
        "local misses served from the remote",
    );
    c(
        "ctcache_remote_misses_total",
        "local misses the remote did not have",
    );
    c(
        "ctcache_remote_errors_total",
        "remote requests that failed or timed out, by phase",
    );
    c(
        "ctcache_remote_rejected_total",
        "remote entries refused, by reason (bad checksum, bad or missing signature, ...)",
    );
    c("ctcache_remote_bytes_in_total", "payload bytes fetched");
    c("ctcache_remote_bytes_out_total", "payload bytes uploaded");
    c("ctcache_remote_uploads_total", "entries uploaded");
    c(
        "ctcache_remote_upload_drops_total",
        "uploads dropped: queue full",
    );
    c(
        "ctcache_remote_skipped_total",
        "local misses not asked: breaker open",
    );
    c(
        "ctcache_remote_decisions_total",
        "cost-rule choices, by path",
    );
    c(
        "ctcache_remote_audits_total",
        "fetched entries packed again to compare (audit_rate), by whether the pack ran",
    );
    c(
        "ctcache_remote_audit_mismatches_total",
        "fetched entries whose bytes differ from the local pack, by signing key",
    );
    metrics::describe_gauge!("ctcache_remote_upload_queue", "uploads waiting");
}
