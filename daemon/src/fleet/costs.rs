//! The cost rule of `fetch = "auto"`: each local miss takes the path this
//! host measured cheaper, fetching or packing, and now and then the other
//! one so that its figure stays current. Throughputs are moving averages of
//! what this host measured: packing per format and backend (a GPU packs a
//! format at another rate than the CPU), fetching from the remote (manifest
//! and payload, so latency counts).
//!
//! Both are per-job rates (payload bytes over the wall time of one job,
//! under whatever else ran beside it): either path holds one pack worker
//! for its time, so the faster rate frees the worker sooner.

use std::collections::HashMap;
use std::time::Duration;

use ctcache_remote::config::FetchMode;

/// Weight of the newest sample.
const ALPHA: f64 = 0.3;

/// Once both rates of a format and backend are known, one miss in this
/// many takes the slower path, so that its rate follows the host (a loaded
/// network, a busy CPU) instead of keeping its first figure.
const EXPLORE_EVERY: u32 = 16;

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

/// What this host knows of packing one format on one backend.
#[derive(Debug, Default)]
struct Lane {
    pack: Option<Rate>,
    /// This lane's misses decided so far, modulo `EXPLORE_EVERY`: the
    /// other path's turn comes once a round (the first, to learn packing;
    /// the last, once both rates are known).
    turn: u32,
}

#[derive(Debug, Default)]
pub(crate) struct Costs {
    /// By (format, backend).
    lanes: HashMap<(String, String), Lane>,
    remote: Option<Rate>,
}

impl Costs {
    pub fn packed(&mut self, format: &str, backend: &str, bytes: u64, took: Duration) {
        if let Some(s) = Rate::sample(bytes, took) {
            let lane = self.lane(format, backend);
            lane.pack = Some(Rate::update(lane.pack, s));
        }
    }

    pub fn fetched(&mut self, bytes: u64, took: Duration) {
        if let Some(s) = Rate::sample(bytes, took) {
            self.remote = Some(Rate::update(self.remote, s));
        }
    }

    /// Whether a local miss of `format`, which `backend` would pack, asks
    /// the remote; under `auto` each call is one decision of that lane.
    ///
    /// * Remote not measured (a fresh host's first miss, or the remote has
    ///   had none of the entries asked for): ask. One fetch measures the
    ///   rate every format compares with, and a host that joins a fleet is
    ///   the case the remote is for; when the remote lacks the entry the
    ///   job packs and the pack rate is learnt instead.
    /// * Packing not measured: pack once to learn it (while that pack runs,
    ///   other misses fetch); if no rate comes of it, again a round later.
    /// * Both measured: the faster path (fetch on a tie), except every
    ///   `EXPLORE_EVERY`-th miss, which takes the other.
    pub fn should_fetch(&mut self, mode: FetchMode, format: &str, backend: &str) -> bool {
        match mode {
            FetchMode::Always => return true,
            FetchMode::Never => return false,
            FetchMode::Auto => {}
        }
        let Some(Rate(remote)) = self.remote else {
            return true;
        };
        let lane = self.lane(format, backend);
        let explore = lane.turn
            == if lane.pack.is_none() {
                0
            } else {
                EXPLORE_EVERY - 1
            };
        lane.turn = (lane.turn + 1) % EXPLORE_EVERY;
        match lane.pack {
            None => !explore,
            Some(Rate(pack)) => (remote >= pack) != explore,
        }
    }

    fn lane(&mut self, format: &str, backend: &str) -> &mut Lane {
        (self.lanes)
            .entry((format.to_string(), backend.to_string()))
            .or_default()
    }

    /// (format, backend, pack bytes/s) sorted, and the remote's bytes/s.
    pub fn rates(&self) -> (Vec<(String, String, f64)>, Option<f64>) {
        let mut p: Vec<_> = (self.lanes.iter())
            .filter_map(|((f, b), l)| Some((f.clone(), b.clone(), l.pack?.0)))
            .collect();
        p.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        (p, self.remote.map(|r| r.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// The next `n` decisions of `auto` for `format` on the CPU: `F` fetch, `P` pack.
    fn decide(c: &mut Costs, format: &str, n: u32) -> String {
        (0..n)
            .map(|_| match c.should_fetch(FetchMode::Auto, format, "cpu") {
                true => 'F',
                false => 'P',
            })
            .collect()
    }

    #[test]
    fn a_fresh_host_fetches_first_then_packs_once_to_learn_packing() {
        let mut c = Costs::default();
        assert_eq!(
            decide(&mut c, "f", 3),
            "FFF",
            "nothing measured: ask the remote"
        );
        c.fetched(100_000, 100 * MS); // 1 MB/s
        assert_eq!(
            decide(&mut c, "f", 3),
            "PFF",
            "the remote is measured: one pack learns packing, the rest fetch meanwhile"
        );
        c.packed("f", "cpu", 10_000_000, 10 * MS); // 1 GB/s
        assert_eq!(decide(&mut c, "f", 3), "PPP", "packing is measured faster");
        assert_eq!(
            decide(&mut c, "g", 2),
            "PF",
            "another format learns its own"
        );
    }

    #[test]
    fn a_host_the_remote_had_nothing_for_asks_it_again() {
        let mut c = Costs::default();
        c.packed("f", "cpu", 10_000_000, 10 * MS); // packed after remote misses
        assert_eq!(decide(&mut c, "f", 3), "FFF", "the remote is not measured");
    }

    #[test]
    fn a_learning_pack_that_measured_nothing_is_tried_again_a_round_later() {
        let mut c = Costs::default();
        c.fetched(1_000_000, 10 * MS);
        let round = decide(&mut c, "f", EXPLORE_EVERY);
        assert_eq!(
            round,
            format!("P{}", "F".repeat(EXPLORE_EVERY as usize - 1))
        );
        assert_eq!(decide(&mut c, "f", 2), "PF");
    }

    #[test]
    fn one_miss_a_round_takes_the_slower_path_and_keeps_its_rate_current() {
        let mut c = Costs::default();
        c.fetched(1_000_000, 100 * MS); // 10 MB/s
        assert_eq!(decide(&mut c, "f", 1), "P");
        c.packed("f", "cpu", 1_000_000_000, 100 * MS); // 10 GB/s
        let n = EXPLORE_EVERY as usize;
        // The learning pack took the round's first turn; its last is the fetch's.
        let rounds = decide(&mut c, "f", 2 * EXPLORE_EVERY - 1);
        assert_eq!(
            rounds,
            format!("{}F{}F", "P".repeat(n - 2), "P".repeat(n - 1))
        );
        // The network got faster: the explored fetches show it, and auto
        // follows, now packing once a round.
        for _ in 0..20 {
            c.fetched(1_000_000_000, 10 * MS); // 100 GB/s
        }
        let round = decide(&mut c, "f", EXPLORE_EVERY);
        assert_eq!(round, format!("{}P", "F".repeat(n - 1)));
    }

    #[test]
    fn always_and_never_ignore_the_rates() {
        let mut c = Costs::default();
        c.fetched(1_000, 100 * MS);
        c.packed("f", "cpu", 1_000_000_000, MS);
        assert!(c.should_fetch(FetchMode::Always, "f", "cpu"));
        c.packed("g", "cpu", 1_000, 100 * MS);
        assert!(!c.should_fetch(FetchMode::Never, "g", "cpu"));
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
