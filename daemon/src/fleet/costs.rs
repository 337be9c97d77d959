//! The cost rule of `fetch = "auto"`: fetch only when it pays. Throughputs
//! are moving averages of what this host measured: packing per format and
//! backend (a GPU packs a format at another rate than the CPU), fetching from the remote (manifest and payload, so latency counts).

use std::collections::HashMap;
use std::time::Duration;

use ctcache_remote::config::FetchMode;

/// Weight of the newest sample.
const ALPHA: f64 = 0.3;

/// A moving average of bytes per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rate(pub f64);

impl Rate {
    fn sample(bytes: u64, took: Duration) -> Option<f64> {
        let s = took.as_secs_f64();
        (s > 0.0 && bytes > 0).then(|| bytes as f64 / s)
    }

    fn update(old: Option<Rate>, new: f64) -> Rate {
        Rate(match old {
            None => new,
            Some(Rate(o)) => o + ALPHA * (new - o),
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct Costs {
    /// By (format, backend).
    pack: HashMap<(String, String), Rate>,
    remote: Option<Rate>,
}

impl Costs {
    pub fn packed(&mut self, format: &str, backend: &str, bytes: u64, took: Duration) {
        if let Some(s) = Rate::sample(bytes, took) {
            let key = (format.to_string(), backend.to_string());
            let r = Rate::update(self.pack.get(&key).copied(), s);
            self.pack.insert(key, r);
        }
    }

    pub fn fetched(&mut self, bytes: u64, took: Duration) {
        if let Some(s) = Rate::sample(bytes, took) {
            self.remote = Some(Rate::update(self.remote, s));
        }
    }

    /// Whether a local miss of `format`, which `backend` would pack, asks
    /// the remote. Until both rates are measured, `auto` asks (that is how
    /// the remote rate is learnt).
    pub fn should_fetch(&self, mode: FetchMode, format: &str, backend: &str) -> bool {
        match mode {
            FetchMode::Always => true,
            FetchMode::Never => false,
            FetchMode::Auto => match (self.pack_rate(format, backend), self.remote) {
                (Some(Rate(pack)), Some(Rate(remote))) => remote >= *pack,
                _ => true,
            },
        }
    }

    fn pack_rate(&self, format: &str, backend: &str) -> Option<&Rate> {
        self.pack.get(&(format.to_string(), backend.to_string()))
    }

    /// (format, backend, pack bytes/s) sorted, and the remote's bytes/s.
    pub fn rates(&self) -> (Vec<(String, String, f64)>, Option<f64>) {
        let mut p: Vec<_> = (self.pack.iter())
            .map(|((f, b), r)| (f.clone(), b.clone(), r.0))
            .collect();
        p.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        (p, self.remote.map(|r| r.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn auto_fetches_until_packing_is_measured_faster() {
        let mut c = Costs::default();
        assert!(c.should_fetch(FetchMode::Auto, "f", "cpu"));
        c.fetched(100_000, 100 * MS); // 1 MB/s
        assert!(
            c.should_fetch(FetchMode::Auto, "f", "cpu"),
            "packing not measured yet"
        );
        c.packed("f", "cpu", 10_000_000, 10 * MS); // 1 GB/s
        assert!(!c.should_fetch(FetchMode::Auto, "f", "cpu"));
        assert!(
            c.should_fetch(FetchMode::Auto, "slow", "cpu"),
            "another format"
        );
        c.packed("slow", "cpu", 1_000, 100 * MS); // 10 kB/s
        assert!(c.should_fetch(FetchMode::Auto, "slow", "cpu"));
        assert!(c.should_fetch(FetchMode::Always, "f", "cpu"));
        assert!(!c.should_fetch(FetchMode::Never, "slow", "cpu"));
    }

    #[test]
    fn each_backend_of_a_format_has_its_own_rate() {
        let mut c = Costs::default();
        c.fetched(1_000_000, 10 * MS); // 100 MB/s
        c.packed("f", "cpu", 1_000_000, 100 * MS); // 10 MB/s: fetching pays
        c.packed("f", "wgpu", 1_000_000_000, 100 * MS); // 10 GB/s: packing pays
        assert!(c.should_fetch(FetchMode::Auto, "f", "cpu"));
        assert!(!c.should_fetch(FetchMode::Auto, "f", "wgpu"));
        let (rates, _) = c.rates();
        let named: Vec<_> = rates
            .iter()
            .map(|(f, b, _)| (f.as_str(), b.as_str()))
            .collect();
        assert_eq!(named, [("f", "cpu"), ("f", "wgpu")]);
    }

    #[test]
    fn averages_move_towards_new_samples_and_ignore_empty_ones() {
        let mut c = Costs::default();
        c.fetched(1000, 1000 * MS);
        c.fetched(0, MS);
        c.fetched(1000, Duration::ZERO);
        assert_eq!(c.rates().1, Some(1000.0));
        c.fetched(2000, 1000 * MS);
        let r = c.rates().1.unwrap();
        assert!(r > 1000.0 && r < 2000.0, "{r}");
    }
}
