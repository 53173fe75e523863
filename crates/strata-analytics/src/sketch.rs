//! A latency sketch: counts in fixed log-spaced buckets (1 µs to about 70 s, each bucket 25% wider than the
//! last), so any quantile is known within one bucket's width whatever the number of samples, in 82 counters.

use std::time::Duration;

/// Buckets: bucket `i` holds latencies up to `1 µs * 1.25^i`; the last holds everything longer.
pub const BUCKETS: usize = 82;
const GROWTH: f64 = 1.25;

/// Latency counts by bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sketch {
    counts: [u32; BUCKETS],
}

impl Default for Sketch {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
        }
    }
}

fn bucket_of(d: Duration) -> usize {
    let us = d.as_secs_f64() * 1e6;
    if us <= 1.0 {
        return 0;
    }
    ((us.ln() / GROWTH.ln()).ceil() as usize).min(BUCKETS - 1)
}

/// The upper bound of bucket `i`.
fn upper(i: usize) -> Duration {
    Duration::from_secs_f64(GROWTH.powi(i as i32) / 1e6)
}

impl Sketch {
    pub fn add(&mut self, d: Duration) {
        self.add_n(d, 1);
    }

    /// `n` samples of `d`.
    pub fn add_n(&mut self, d: Duration, n: u64) {
        let c = &mut self.counts[bucket_of(d)];
        *c = c.saturating_add(n.try_into().unwrap_or(u32::MAX));
    }

    pub fn merge(&mut self, other: &Sketch) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    /// The `q` quantile (0..=1): the upper bound of the bucket it falls in; zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        let n = self.count();
        if n == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return upper(i);
            }
        }
        upper(BUCKETS - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_one_bucket_of_the_truth() {
        let mut s = Sketch::default();
        for us in 1..=1000u64 {
            s.add(Duration::from_micros(us * 100));
        }
        let p50 = s.quantile(0.5).as_secs_f64();
        let p99 = s.quantile(0.99).as_secs_f64();
        assert!((0.050..=0.050 * GROWTH).contains(&p50), "{p50}");
        assert!((0.099..=0.099 * GROWTH).contains(&p99), "{p99}");
        let mut t = Sketch::default();
        t.add(Duration::from_secs(1000));
        s.merge(&t);
        assert_eq!(s.count(), 1001);
        assert!(
            s.quantile(1.0) >= Duration::from_secs(50),
            "the longest lands in the last bucket"
        );
    }
}
