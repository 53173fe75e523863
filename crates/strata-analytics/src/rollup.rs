//! Per-minute rollups: counts, bytes, latency and tier mix per (team, job, dataset, prefix, class), with a
//! bound on the keys of one minute (past it a key folds into its team's `(other)` row, counted).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::access::{Access, OpClass, Served};
use crate::sketch::Sketch;
use strata_types::IoContext;

/// The name of rows that stand for what a bound folded away.
pub const OTHER: &str = "(other)";

/// What a rollup row is about. Empty strings: not known (no job, no dataset).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RollupKey {
    pub team: Arc<str>,
    pub job: Arc<str>,
    pub dataset: Arc<str>,
    /// `backend/first/segments/` of the key, to the configured depth.
    pub prefix: Arc<str>,
    pub class: OpClass,
}

/// One row: what happened under one key in one minute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RollupRow {
    pub count: u64,
    pub errors: u64,
    pub bytes: u64,
    /// Sum of latencies, microseconds.
    pub latency_sum_us: u64,
    pub latency: Sketch,
    /// Bytes by the tier that served them: RAM, disk, peer, origin.
    pub tier_bytes: [u64; 4],
}

/// One minute's rows.
#[derive(Debug, Clone, Default)]
pub struct Minute {
    /// Unix seconds of the minute's start.
    pub start: u64,
    pub rows: HashMap<RollupKey, RollupRow>,
    /// Operations folded into an `(other)` row by the key bound.
    pub folded: u64,
}

/// Unix seconds of the minute `at` falls in.
pub fn minute_of(at: SystemTime) -> u64 {
    let s = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    s - s % 60
}

/// The prefix an access is rolled up under: the backend and the key's first `depth` segments (a key with
/// fewer: its directory; a key at the root: the backend alone).
pub fn prefix_of(backend: &str, key: &str, depth: usize) -> String {
    let mut end = 0;
    for (n, (i, _)) in key.match_indices('/').enumerate() {
        if n >= depth {
            break;
        }
        end = i + 1;
    }
    format!("{backend}/{}", &key[..end])
}

impl Minute {
    /// The row of an operation of `class` under `prefix` for `ctx`, or its team's `(other)` row past
    /// `max_keys` (then `folded` counts `n` more).
    fn row(
        &mut self,
        ctx: &IoContext,
        prefix: String,
        class: OpClass,
        max_keys: usize,
        n: u64,
    ) -> &mut RollupRow {
        let none: Arc<str> = Arc::from("");
        let team = ctx.team.clone().unwrap_or_else(|| none.clone());
        let mut key = RollupKey {
            team,
            job: ctx.job.clone().unwrap_or_else(|| none.clone()),
            dataset: ctx.dataset.clone().unwrap_or(none),
            prefix: Arc::from(prefix),
            class,
        };
        if !self.rows.contains_key(&key) && self.rows.len() >= max_keys {
            let other: Arc<str> = Arc::from(OTHER);
            key = RollupKey {
                team: key.team,
                job: other.clone(),
                dataset: other.clone(),
                prefix: other,
                class: key.class,
            };
            self.folded += n;
        }
        self.rows.entry(key).or_default()
    }

    /// `bytes` of a data read under `prefix` ([`prefix_of`]) served by `served` (the cache's and the
    /// origin's events): the tier mix of its row, no operation of its own.
    pub fn add_tier(
        &mut self,
        ctx: &IoContext,
        prefix: String,
        served: Served,
        bytes: u64,
        max_keys: usize,
    ) {
        let Some(i) = served.index() else { return };
        self.row(ctx, prefix, OpClass::DataRead, max_keys, 0)
            .tier_bytes[i] += bytes;
    }

    /// Add one access (to the row of its key, or its team's `(other)` row past `max_keys`).
    pub fn add(&mut self, a: &Access, depth: usize, max_keys: usize) {
        let n = a.ops();
        let prefix = prefix_of(&a.backend, &a.key, depth);
        let row = self.row(&a.ctx, prefix, a.class, max_keys, n);
        row.count += n;
        if !a.ok {
            row.errors += n;
        }
        row.bytes += a.bytes;
        row.latency_sum_us += a.latency_total_us();
        row.latency.add_n(a.latency, n);
        if let Some(i) = a.served.index() {
            row.tier_bytes[i] += a.bytes;
        }
    }
}

impl RollupRow {
    pub fn merge(&mut self, o: &RollupRow) {
        self.count += o.count;
        self.errors += o.errors;
        self.bytes += o.bytes;
        self.latency_sum_us += o.latency_sum_us;
        self.latency.merge(&o.latency);
        for (a, b) in self.tier_bytes.iter_mut().zip(o.tier_bytes) {
            *a += b;
        }
    }

    /// Bytes served by a tier of the cache (RAM, disk or a peer) over bytes with a known tier.
    pub fn hit_ratio(&self) -> Option<f64> {
        let known: u64 = self.tier_bytes.iter().sum();
        (known > 0).then(|| (known - self.tier_bytes[3]) as f64 / known as f64)
    }
}

/// Served tiers in the order of [`RollupRow::tier_bytes`].
pub const TIERS: [Served; 4] = Served::ALL;
