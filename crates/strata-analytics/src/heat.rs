//! Heat: an exponentially decayed access score per dataset and per prefix (each read adds one; the score
//! halves every `half_life`), with the last access and the bytes read. Bounded: when full, the coldest tenth
//! of the entries go.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// What a heat entry is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HeatKind {
    Dataset,
    Prefix,
}

impl HeatKind {
    pub fn as_str(self) -> &'static str {
        match self {
            HeatKind::Dataset => "dataset",
            HeatKind::Prefix => "prefix",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HeatKey {
    pub team: Arc<str>,
    pub kind: HeatKind,
    pub name: Arc<str>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// The score as of `at`.
    score: f64,
    at: SystemTime,
    last_access: SystemTime,
    reads: u64,
    bytes: u64,
}

/// One entry as seen at a moment.
#[derive(Debug, Clone, PartialEq)]
pub struct HeatView {
    pub key: HeatKey,
    /// The score now.
    pub score: f64,
    pub last_access: SystemTime,
    pub reads: u64,
    pub bytes: u64,
}

/// The heat map.
#[derive(Debug)]
pub struct Heat {
    half_life: Duration,
    max: usize,
    entries: HashMap<HeatKey, Entry>,
    /// Entries dropped by the bound.
    pub evicted: u64,
}

fn decay(score: f64, from: SystemTime, to: SystemTime, half_life: Duration) -> f64 {
    let dt = to.duration_since(from).unwrap_or_default().as_secs_f64();
    score * 0.5f64.powf(dt / half_life.as_secs_f64().max(1e-9))
}

impl Heat {
    pub fn new(half_life: Duration, max: usize) -> Self {
        Self {
            half_life,
            max: max.max(10),
            entries: HashMap::new(),
            evicted: 0,
        }
    }

    /// `reads` reads of `bytes` in all under `key` at `at`.
    pub fn touch(&mut self, key: HeatKey, at: SystemTime, reads: u64, bytes: u64) {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.max {
            self.evict_coldest(at);
        }
        let hl = self.half_life;
        let e = self.entries.entry(key).or_insert(Entry {
            score: 0.0,
            at,
            last_access: at,
            reads: 0,
            bytes: 0,
        });
        // Events may arrive slightly out of order: decay only forward.
        if at > e.at {
            e.score = decay(e.score, e.at, at, hl);
            e.at = at;
        }
        e.score += reads as f64;
        e.last_access = e.last_access.max(at);
        e.reads += reads;
        e.bytes += bytes;
    }

    fn evict_coldest(&mut self, now: SystemTime) {
        let hl = self.half_life;
        let mut scores: Vec<(f64, HeatKey)> = self
            .entries
            .iter()
            .map(|(k, e)| (decay(e.score, e.at, now, hl), k.clone()))
            .collect();
        scores.sort_by(|a, b| a.0.total_cmp(&b.0));
        let n = (self.max / 10).max(1);
        for (_, k) in scores.into_iter().take(n) {
            self.entries.remove(&k);
            self.evicted += 1;
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Every entry `keep` admits, hottest first, scored as of `now`.
    pub fn ranked(&self, now: SystemTime, keep: impl Fn(&HeatKey) -> bool) -> Vec<HeatView> {
        let mut v: Vec<HeatView> = self
            .entries
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(k, e)| HeatView {
                key: k.clone(),
                score: decay(e.score, e.at, now, self.half_life),
                last_access: e.last_access,
                reads: e.reads,
                bytes: e.bytes,
            })
            .collect();
        v.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.key.cmp(&b.key)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> HeatKey {
        HeatKey {
            team: Arc::from("vision"),
            kind: HeatKind::Dataset,
            name: Arc::from(name),
        }
    }

    #[test]
    fn a_dataset_read_every_minute_ranks_above_one_read_often_an_hour_ago() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut h = Heat::new(Duration::from_secs(600), 100);
        // An hour ago: 20 reads of "old" at once.
        for _ in 0..20 {
            h.touch(key("old"), t0, 1, 1);
        }
        // Then "steady" once a minute for the hour.
        for m in 1..=60 {
            h.touch(key("steady"), t0 + Duration::from_secs(60 * m), 1, 1);
        }
        let now = t0 + Duration::from_secs(3600);
        let r = h.ranked(now, |_| true);
        assert_eq!(&*r[0].key.name, "steady", "{r:?}");
        // Half-life honoured: 20 reads six half-lives ago are worth 20/64 now.
        let old = r.iter().find(|v| &*v.key.name == "old").expect("kept");
        assert!((old.score - 20.0 / 64.0).abs() < 1e-9, "{}", old.score);
        assert_eq!((old.reads, old.last_access), (20, t0));
    }

    #[test]
    fn the_map_stays_bounded_and_drops_the_coldest() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut h = Heat::new(Duration::from_secs(60), 100);
        for _ in 0..50 {
            h.touch(key("hot"), t0, 1, 1);
        }
        for i in 0..10_000 {
            h.touch(key(&format!("k{i}")), t0 + Duration::from_millis(i), 1, 1);
        }
        assert!(h.len() <= 100, "{}", h.len());
        assert!(h.evicted >= 9_900);
        assert!(
            h.ranked(t0, |k| &*k.name == "hot").len() == 1,
            "the hottest stays"
        );
    }
}
