//! The cost rule of `fetch = "auto"`: fetch only when it pays. Throughputs
//! are moving averages of what this host measured: packing per format,
//! fetching from the remote (manifest and payload, so latency counts).

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
    pack: HashMap<String, Rate>,
    remote: Option<Rate>,
}

impl Costs {
    pub fn packed(&mut self, format: &str, bytes: u64, took: Duration) {
        if let Some(s) = Rate::sample(bytes, took) {
            let r = Rate::update(self.pack.get(format).copied(), s);
            self.pack.insert(format.to_string(), r);
        }
    }

    pub fn fetched(&mut self, bytes: u64, took: Duration) {
        if let Some(s) = Rate::sample(bytes, took) {
            self.remote = Some(Rate::update(self.remote, s));
        }
    }

    /// Whether a local miss of `format` asks the remote. Until both rates
    /// are measured, `auto` asks (that is how the remote rate is learnt).
    pub fn should_fetch(&self, mode: FetchMode, format: &str) -> bool {
        match mode {
            FetchMode::Always => true,
            FetchMode::Never => false,
            FetchMode::Auto => match (self.pack.get(format), self.remote) {
                (Some(Rate(pack)), Some(Rate(remote))) => remote >= *pack,
                _ => true,
            },
        }
    }

    /// (format, pack bytes/s) sorted, and the remote's bytes/s.
    pub fn rates(&self) -> (Vec<(String, f64)>, Option<f64>) {
        let mut p: Vec<_> = self.pack.iter().map(|(f, r)| (f.clone(), r.0)).collect();
        p.sort_by(|a, b| a.0.cmp(&b.0));
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
        assert!(c.should_fetch(FetchMode::Auto, "f"));
        c.fetched(100_000, 100 * MS); // 1 MB/s
        assert!(
            c.should_fetch(FetchMode::Auto, "f"),
            "packing not measured yet"
        );
        c.packed("f", 10_000_000, 10 * MS); // 1 GB/s
        assert!(!c.should_fetch(FetchMode::Auto, "f"));
        assert!(c.should_fetch(FetchMode::Auto, "slow"), "another format");
        c.packed("slow", 1_000, 100 * MS); // 10 kB/s
        assert!(c.should_fetch(FetchMode::Auto, "slow"));
        assert!(c.should_fetch(FetchMode::Always, "f"));
        assert!(!c.should_fetch(FetchMode::Never, "slow"));
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
