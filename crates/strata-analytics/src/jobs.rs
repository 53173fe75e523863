//! Jobs as they run: per 10-second slot, operations and bytes by class, read time and bytes by tier, over the
//! last five minutes; latency sketches by class since the job was first seen; the metadata-rate "runaway"
//! flag. Bounded: past `max` jobs, the least recently seen goes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::access::{Access, OpClass};
use crate::sketch::Sketch;

/// Seconds per slot.
pub const SLOT_SECS: u64 = 10;
/// Slots kept (five minutes).
pub const SLOTS: usize = 30;

/// Samples, min, max, sum and sum of squares of one measure: Lustre's `job_stats` counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Moments {
    pub samples: u64,
    pub min: u64,
    pub max: u64,
    pub sum: u64,
    pub sumsq: u128,
}

impl Moments {
    /// `n` samples of `v`.
    fn add_n(&mut self, v: u64, n: u64) {
        if n == 0 {
            return;
        }
        if self.samples == 0 || v < self.min {
            self.min = v;
        }
        self.max = self.max.max(v);
        self.samples += n;
        self.sum = self.sum.saturating_add(v.saturating_mul(n));
        self.sumsq += u128::from(v) * u128::from(v) * u128::from(n);
    }
}

/// A job's identity: its team and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobKey {
    pub team: Arc<str>,
    pub job: Arc<str>,
}

/// What a job did in one slot.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slot {
    /// Unix seconds of the slot's start.
    pub start: u64,
    pub ops: [u64; 4],
    pub bytes: [u64; 4],
    /// Time spent in data reads (the caller waited for Strata), microseconds.
    pub read_us: u64,
    /// Read bytes by the tier that served them: RAM, disk, peer, origin.
    pub tier_bytes: [u64; 4],
}

#[derive(Debug, Clone)]
struct Job {
    first_seen: SystemTime,
    last_seen: SystemTime,
    slots: [Slot; SLOTS],
    latency: [Sketch; 4],
    totals_ops: [u64; 4],
    totals_bytes: [u64; 4],
    /// Per class: bytes per operation (data classes), latency in microseconds (metadata classes).
    moments: [Moments; 4],
    /// Since when the metadata rate has been over the threshold without a break.
    over_since: Option<u64>,
}

/// The runaway rule: a metadata rate over `ops_per_sec` in every slot for at least `window`.
#[derive(Debug, Clone, Copy)]
pub struct Runaway {
    pub ops_per_sec: f64,
    pub window: Duration,
}

/// A job as seen now.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    pub key: JobKey,
    pub first_seen: SystemTime,
    pub last_seen: SystemTime,
    /// Over the last minute (six slots), per second.
    pub data_bytes_per_sec: f64,
    pub meta_ops_per_sec: f64,
    pub ops_per_sec: f64,
    /// The share of the last minute the job spent waiting in data reads (summed over its readers: 2.0 is two
    /// readers waiting all the time).
    pub stall_share: f64,
    /// Of read bytes over the last minute, the share served by a cache tier (RAM, disk, a peer).
    pub hit_ratio: Option<f64>,
    pub runaway: bool,
    /// Since when the metadata rate has been over the threshold (unix seconds), if it is.
    pub over_since: Option<u64>,
    pub totals_ops: [u64; 4],
    pub totals_bytes: [u64; 4],
    /// Per class since first seen: bytes per operation (data), latency in microseconds (metadata).
    pub moments: [Moments; 4],
    /// p50 and p99 latency by class since first seen.
    pub p50: [Duration; 4],
    pub p99: [Duration; 4],
    /// The last five minutes, oldest first (slots with nothing are left out).
    pub timeline: Vec<Slot>,
}

/// The jobs.
#[derive(Debug)]
pub struct Jobs {
    max: usize,
    rule: Runaway,
    jobs: HashMap<JobKey, Job>,
    /// Jobs dropped by the bound.
    pub evicted: u64,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Job {
    fn new(at: SystemTime) -> Self {
        Job {
            first_seen: at,
            last_seen: at,
            slots: [Slot::default(); SLOTS],
            latency: Default::default(),
            totals_ops: [0; 4],
            totals_bytes: [0; 4],
            moments: Default::default(),
            over_since: None,
        }
    }

    fn slot(&mut self, start: u64) -> &mut Slot {
        let i = ((start / SLOT_SECS) as usize) % SLOTS;
        if self.slots[i].start != start {
            self.slots[i] = Slot {
                start,
                ..Slot::default()
            };
        }
        &mut self.slots[i]
    }

    /// Slots within `secs` before `now` (the current one included).
    fn recent(&self, now: u64, secs: u64) -> impl Iterator<Item = &Slot> {
        let from = now.saturating_sub(secs);
        self.slots
            .iter()
            .filter(move |s| s.start + SLOT_SECS > from && s.start <= now)
    }

    /// Update the runaway state from the slots that are complete by `now`.
    fn judge(&mut self, now: u64, rule: Runaway) {
        let current = now - now % SLOT_SECS;
        let limit = rule.ops_per_sec * SLOT_SECS as f64;
        // Walk back over complete slots: the run of slots over the limit that ends with the last one.
        let mut start = None;
        let mut t = current;
        while t >= SLOT_SECS {
            t -= SLOT_SECS;
            let i = ((t / SLOT_SECS) as usize) % SLOTS;
            let s = &self.slots[i];
            let meta = (s.start == t)
                .then(|| s.ops[OpClass::MetaRead.index()] + s.ops[OpClass::MetaWrite.index()]);
            match meta {
                Some(m) if m as f64 > limit => start = Some(t),
                _ => break,
            }
            if current - t >= (SLOTS as u64) * SLOT_SECS {
                break;
            }
        }
        self.over_since = start;
    }
}

impl Jobs {
    pub fn new(max: usize, rule: Runaway) -> Self {
        Self {
            max: max.max(10),
            rule,
            jobs: HashMap::new(),
            evicted: 0,
        }
    }

    /// Count one access of a named job.
    pub fn add(&mut self, key: JobKey, a: &Access) {
        if !self.jobs.contains_key(&key) && self.jobs.len() >= self.max {
            self.evict_idle();
        }
        let job = self.jobs.entry(key).or_insert_with(|| Job::new(a.at));
        job.last_seen = job.last_seen.max(a.at);
        let c = a.class.index();
        let n = a.ops();
        job.totals_ops[c] += n;
        job.totals_bytes[c] += a.bytes;
        job.latency[c].add_n(a.latency, n);
        job.moments[c].add_n(
            if a.class.is_meta() {
                a.latency.as_micros().min(u128::from(u64::MAX)) as u64
            } else {
                a.bytes / n
            },
            n,
        );
        let t = unix(a.at);
        let s = job.slot(t - t % SLOT_SECS);
        s.ops[c] += n;
        s.bytes[c] += a.bytes;
        if a.class == OpClass::DataRead {
            s.read_us += a.latency_total_us();
            if let Some(i) = a.served.index() {
                s.tier_bytes[i] += a.bytes;
            }
        }
    }

    /// `bytes` of a named job's reads served by `served` at `at` (the cache's block lookups and the origin's
    /// reads, as the telemetry reports them).
    pub fn add_tier(
        &mut self,
        key: JobKey,
        at: SystemTime,
        served: crate::access::Served,
        bytes: u64,
    ) {
        let Some(i) = served.index() else { return };
        if !self.jobs.contains_key(&key) && self.jobs.len() >= self.max {
            self.evict_idle();
        }
        let job = self.jobs.entry(key).or_insert_with(|| Job::new(at));
        let t = unix(at);
        job.slot(t - t % SLOT_SECS).tier_bytes[i] += bytes;
    }

    fn evict_idle(&mut self) {
        let mut by_age: Vec<(SystemTime, JobKey)> = self
            .jobs
            .iter()
            .map(|(k, j)| (j.last_seen, k.clone()))
            .collect();
        by_age.sort();
        for (_, k) in by_age.into_iter().take((self.max / 10).max(1)) {
            self.jobs.remove(&k);
            self.evicted += 1;
        }
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Every job `keep` admits, as of `now`.
    pub fn views(&mut self, now: SystemTime, keep: impl Fn(&JobKey) -> bool) -> Vec<JobView> {
        let n = unix(now);
        let rule = self.rule;
        let window = rule.window.as_secs().max(SLOT_SECS);
        let mut out = Vec::new();
        for (k, j) in self.jobs.iter_mut().filter(|(k, _)| keep(k)) {
            j.judge(n, rule);
            let minute: Vec<Slot> = j.recent(n, 60).copied().collect();
            let sum = |f: &dyn Fn(&Slot) -> u64| minute.iter().map(f).sum::<u64>() as f64;
            let data =
                sum(&|s| s.bytes[OpClass::DataRead.index()] + s.bytes[OpClass::DataWrite.index()]);
            let meta =
                sum(&|s| s.ops[OpClass::MetaRead.index()] + s.ops[OpClass::MetaWrite.index()]);
            let ops = sum(&|s| s.ops.iter().sum());
            let read_us = sum(&|s| s.read_us);
            let tiers: [f64; 4] = std::array::from_fn(|i| sum(&|s| s.tier_bytes[i]));
            let known: f64 = tiers.iter().sum();
            let mut timeline: Vec<Slot> = j
                .slots
                .iter()
                .filter(|s| s.start > 0 && s.start <= n)
                .copied()
                .collect();
            timeline.sort_by_key(|s| s.start);
            let over = j.over_since.filter(|&t| n.saturating_sub(t) >= window);
            out.push(JobView {
                key: k.clone(),
                first_seen: j.first_seen,
                last_seen: j.last_seen,
                data_bytes_per_sec: data / 60.0,
                meta_ops_per_sec: meta / 60.0,
                ops_per_sec: ops / 60.0,
                stall_share: read_us / 60e6,
                hit_ratio: (known > 0.0).then(|| (known - tiers[3]) / known),
                runaway: over.is_some(),
                over_since: j.over_since,
                totals_ops: j.totals_ops,
                totals_bytes: j.totals_bytes,
                moments: j.moments,
                p50: std::array::from_fn(|i| j.latency[i].quantile(0.5)),
                p99: std::array::from_fn(|i| j.latency[i].quantile(0.99)),
                timeline,
            });
        }
        out
    }
}
