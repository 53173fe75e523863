//! Statistics: the snapshot served as `GET /v1/cache` ([`CacheStats`]) and how it is taken.

use crate::state::BlockCache;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
pub use strata_api::cache::{CacheStats, DiskFaults, JobIo, PinInfo, TierStats};
use strata_types::IoContext;

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) ram_hits: AtomicU64,
    pub(crate) disk_hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    /// Bytes of reads served from a tier, and of reads whose block had to be filled.
    pub(crate) hit_bytes: AtomicU64,
    pub(crate) miss_bytes: AtomicU64,
    pub(crate) ram_evictions: AtomicU64,
    pub(crate) ram_rejected: AtomicU64,
    pub(crate) fills: AtomicU64,
    pub(crate) fill_requests: AtomicU64,
    pub(crate) fill_bytes: AtomicU64,
    pub(crate) joins: AtomicU64,
    pub(crate) readahead: AtomicU64,
    pub(crate) readahead_skipped: AtomicU64,
    pub(crate) hints_reclaimed: AtomicU64,
    pub(crate) hints_read: AtomicU64,
    pub(crate) stale: AtomicU64,
    /// Reads that found the object changed before sending anything and were served the new version.
    pub(crate) stale_retried: AtomicU64,
    pub(crate) fill_errors: AtomicU64,
    pub(crate) writes_dropped: AtomicU64,
    pub(crate) meta_refreshes: AtomicU64,
    /// HEADs sent to backends; opens answered by a peer; metadata served to peers.
    pub(crate) meta_heads: AtomicU64,
    pub(crate) meta_from_peers: AtomicU64,
    pub(crate) meta_served: AtomicU64,
    pub(crate) meta_refresh_lists: AtomicU64,
    /// Blocks (and their bytes) that peers served to this agent's fills, and that this agent served to peers.
    pub(crate) peer_blocks: AtomicU64,
    pub(crate) peer_bytes: AtomicU64,
    pub(crate) peer_served: AtomicU64,
    pub(crate) peer_served_bytes: AtomicU64,
}

/// Jobs and datasets tracked (past it, the least busy half is dropped).
const MAX_JOBS: usize = 1024;

/// A team, a job and a dataset, any unnamed.
type JobKey = (Option<Arc<str>>, Option<Arc<str>>, Option<Arc<str>>);

/// [`JobIo`] by (job, dataset), bounded: origin, peer and served bytes.
#[derive(Debug, Default)]
pub(crate) struct ByJob {
    map: HashMap<JobKey, [u64; 3]>,
}

/// Which [`JobIo`] counter an I/O adds to.
#[derive(Debug, Clone, Copy)]
pub(crate) enum JobBytes {
    Origin = 0,
    Peer = 1,
    Served = 2,
}

impl ByJob {
    pub(crate) fn add(&mut self, ctx: &IoContext, what: JobBytes, bytes: u64) {
        let key = (ctx.team.clone(), ctx.job.clone(), ctx.dataset.clone());
        if self.map.len() >= MAX_JOBS && !self.map.contains_key(&key) {
            let mut totals: Vec<u64> = self.map.values().map(|v| v.iter().sum()).collect();
            totals.sort_unstable();
            let median = totals[totals.len() / 2];
            self.map.retain(|_, v| v.iter().sum::<u64>() > median);
        }
        self.map.entry(key).or_default()[what as usize] += bytes;
    }

    fn snapshot(&self) -> Vec<JobIo> {
        let mut v: Vec<JobIo> = self
            .map
            .iter()
            .map(|((team, job, dataset), [o, p, s])| JobIo {
                team: team.as_deref().map(str::to_string),
                job: job.as_deref().map(str::to_string),
                dataset: dataset.as_deref().map(str::to_string),
                origin_bytes: *o,
                peer_bytes: *p,
                served_to_peers_bytes: *s,
                peer_hit_ratio: if o + p == 0 {
                    0.0
                } else {
                    *p as f64 / (o + p) as f64
                },
            })
            .collect();
        v.sort_by(|a, b| {
            let t = |j: &JobIo| j.origin_bytes + j.peer_bytes + j.served_to_peers_bytes;
            t(b).cmp(&t(a))
                .then_with(|| (&a.team, &a.job, &a.dataset).cmp(&(&b.team, &b.job, &b.dataset)))
        });
        v
    }
}

impl BlockCache {
    /// Count `bytes` of `what` for the context's job and dataset.
    pub(crate) fn note_job(&self, ctx: &IoContext, what: JobBytes, bytes: u64) {
        self.inner.by_job.lock().add(ctx, what, bytes);
    }
}

impl BlockCache {
    /// A snapshot of the counters and usage.
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (ram_cap, ram_used, ram_pinned, ram_blocks) = self.inner.tiers.ram().usage();
        let ram = TierStats {
            capacity_bytes: ram_cap,
            used_bytes: ram_used,
            pinned_bytes: ram_pinned,
            blocks: ram_blocks,
            hits: ld(&c.ram_hits),
            evictions: ld(&c.ram_evictions),
            admissions_rejected: ld(&c.ram_rejected),
        };
        let mut faults = DiskFaults {
            writes_dropped: ld(&c.writes_dropped),
            ..Default::default()
        };
        let disk = self.inner.tiers.disk().map(|t| {
            let (cap, used, pinned, blocks) = t.usage();
            let dc = &t.counters;
            faults.checksum_failures = ld(&dc.checksum_failures);
            faults.read_errors = ld(&dc.read_errors);
            faults.write_errors = ld(&dc.write_errors);
            faults.no_space = ld(&dc.no_space);
            faults.removed_on_start = ld(&dc.removed_on_start);
            faults.writes_dropped += ld(&dc.dropped);
            TierStats {
                capacity_bytes: cap,
                used_bytes: used,
                pinned_bytes: pinned,
                blocks: blocks as u64,
                hits: ld(&c.disk_hits),
                evictions: ld(&dc.evictions),
                admissions_rejected: ld(&dc.rejected),
            }
        });
        let hits = ram.hits + disk.as_ref().map_or(0, |d| d.hits);
        let misses = ld(&c.misses);
        let budget = &self.inner.budget;
        let (staged_blocks, staged_bytes) = self.staged_stats();
        CacheStats {
            block_size: self.inner.cfg.block_size.bytes(),
            policy: format!("{:?}", self.inner.cfg.policy).to_lowercase(),
            ram,
            disk,
            disk_faults: faults,
            misses,
            hit_ratio: if hits + misses == 0 {
                0.0
            } else {
                hits as f64 / (hits + misses) as f64
            },
            byte_hit_ratio: {
                let (h, m) = (ld(&c.hit_bytes), ld(&c.miss_bytes));
                if h + m == 0 {
                    0.0
                } else {
                    h as f64 / (h + m) as f64
                }
            },
            hit_bytes: ld(&c.hit_bytes),
            miss_bytes: ld(&c.miss_bytes),
            fills: ld(&c.fills),
            fill_requests: ld(&c.fill_requests),
            fill_bytes: ld(&c.fill_bytes),
            single_flight_joins: ld(&c.joins),
            readahead_blocks: ld(&c.readahead),
            readahead_skipped: ld(&c.readahead_skipped),
            staged_blocks,
            staged_bytes,
            staged_read: ld(&c.hints_read),
            staged_reclaimed: ld(&c.hints_reclaimed),
            stale_version_errors: ld(&c.stale),
            fill_errors: ld(&c.fill_errors),
            peer_blocks: ld(&c.peer_blocks),
            peer_bytes: ld(&c.peer_bytes),
            served_to_peers: ld(&c.peer_served),
            served_to_peers_bytes: ld(&c.peer_served_bytes),
            metadata_heads: ld(&c.meta_heads),
            metadata_from_peers: ld(&c.meta_from_peers),
            metadata_served_to_peers: ld(&c.meta_served),
            metadata_refreshes: ld(&c.meta_refreshes),
            metadata_refresh_lists: ld(&c.meta_refresh_lists),
            inflight_budget_bytes: budget.total_bytes(),
            inflight_bytes: budget.total_bytes().saturating_sub(budget.free_bytes()),
            pool_reused_blocks: ld(&self.inner.pool.reused),
            pool_allocated_blocks: ld(&self.inner.pool.allocated),
            pool_released_blocks: ld(&self.inner.pool.released),
            pool_kept_bytes: self.inner.pool.kept() as u64 * self.inner.cfg.block_size.bytes(),
            pins: self
                .inner
                .tiers
                .pins()
                .all()
                .into_iter()
                .map(|p| PinInfo {
                    backend: p.backend,
                    prefix: p.prefix,
                    from: p.from,
                })
                .collect(),
            by_job: self.inner.by_job.lock().snapshot(),
        }
    }
}
