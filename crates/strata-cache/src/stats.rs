//! Statistics: the snapshot served as `GET /v1/cache` ([`CacheStats`]) and how it is taken.

use crate::prelude::*;
use crate::state::*;

/// Statistics of one tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TierStats {
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Bytes held, with (on disk) the space reserved for blocks being written.
    pub used_bytes: u64,
    /// Bytes held by pinned blocks.
    pub pinned_bytes: u64,
    /// Blocks held (on disk: complete files in place, not writes in flight).
    pub blocks: u64,
    /// Lookups served by this tier.
    pub hits: u64,
    /// Blocks evicted.
    pub evictions: u64,
    /// Blocks the admission filter kept out.
    pub admissions_rejected: u64,
}

/// Fault counters of the disk tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskFaults {
    /// Blocks whose checksum, length or header did not verify on read (dropped, served from elsewhere).
    pub checksum_failures: u64,
    /// Reads that failed with an I/O error (treated as misses).
    pub read_errors: u64,
    /// Writes that failed with an I/O error other than a full disk.
    pub write_errors: u64,
    /// Writes that failed because the device was full (ENOSPC).
    pub no_space: u64,
    /// Blocks not written because the write queue was full.
    pub writes_dropped: u64,
    /// Partial or damaged files removed when the tier was opened.
    pub removed_on_start: u64,
}

/// A snapshot of the cache's state and counters (served as JSON by `GET /v1/cache`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CacheStats {
    /// Block size in bytes.
    pub block_size: u64,
    /// Replacement policy.
    pub policy: String,
    /// RAM tier.
    pub ram: TierStats,
    /// Disk tier, if configured.
    pub disk: Option<TierStats>,
    /// Disk tier faults.
    pub disk_faults: DiskFaults,
    /// Reads of a block no tier held: looked up and not found, or served by a fill made for them (readahead,
    /// a range's prefetch, a staged hint): every read whose bytes came from the backend.
    pub misses: u64,
    /// Hits / (hits + misses) since start, by blocks.
    pub hit_ratio: f64,
    /// Hit bytes / (hit + miss bytes) since start: the share of the bytes read that no backend served.
    #[serde(default)]
    pub byte_hit_ratio: f64,
    /// Bytes of the blocks reads took from a tier.
    #[serde(default)]
    pub hit_bytes: u64,
    /// Bytes of the blocks reads had to fill.
    #[serde(default)]
    pub miss_bytes: u64,
    /// Blocks filled from backends.
    pub fills: u64,
    /// Backend requests made to fill blocks (one request may fill several consecutive blocks).
    pub fill_requests: u64,
    /// Bytes read from backends to fill blocks.
    pub fill_bytes: u64,
    /// Lookups that joined a fill already in flight instead of reading the backend again.
    pub single_flight_joins: u64,
    /// Blocks fetched ahead of a sequential reader.
    pub readahead_blocks: u64,
    /// Readahead skipped because the in-flight budget was used up.
    pub readahead_skipped: u64,
    /// Blocks fetched for prefetch hints and not read yet (held at most `prefetch_hold_ms`).
    #[serde(default)]
    pub staged_blocks: u64,
    /// In-flight budget those staged blocks hold, in bytes.
    #[serde(default)]
    pub staged_bytes: u64,
    /// Block reads served by a staged block (the hint's own fill), not by a tier or a new origin read.
    #[serde(default)]
    pub staged_read: u64,
    /// Staged blocks that gave their budget back, unread, to a reader waiting for it.
    #[serde(default)]
    pub staged_reclaimed: u64,
    /// Reads refused because the object changed at the backend while it was being read.
    pub stale_version_errors: u64,
    /// Fills that failed at the backend.
    pub fill_errors: u64,
    /// Blocks other agents of the cluster served to this agent's fills (none read from the origin here).
    #[serde(default)]
    pub peer_blocks: u64,
    /// Bytes of those blocks.
    #[serde(default)]
    pub peer_bytes: u64,
    /// Blocks this agent served to other agents of the cluster.
    #[serde(default)]
    pub served_to_peers: u64,
    /// Bytes of those blocks.
    #[serde(default)]
    pub served_to_peers_bytes: u64,
    /// HEADs this agent sent to backends for opens and refreshes (one per key at a time: opens of a key while
    /// its HEAD is in flight join it).
    #[serde(default)]
    pub metadata_heads: u64,
    /// Opens and refreshes answered by the agent of the cluster that owns the key's metadata (no HEAD here).
    #[serde(default)]
    pub metadata_from_peers: u64,
    /// Metadata this agent answered for other agents of the cluster.
    #[serde(default)]
    pub metadata_served_to_peers: u64,
    /// Object metadata refreshed in the background before its TTL ran out (refresh-ahead), by a HEAD or
    /// confirmed by a listing of its directory.
    pub metadata_refreshes: u64,
    /// Directory listings sent to refresh the metadata of many entries at once.
    pub metadata_refresh_lists: u64,
    /// Budget for bytes in flight from backends.
    pub inflight_budget_bytes: u64,
    /// Budget in use now: bytes being fetched or held for readers, and blocks waiting for the disk writers
    /// past the first few.
    pub inflight_bytes: u64,
    /// Block buffers taken from the pool of freed ones (a fill or disk read that made no fresh memory).
    pub pool_reused_blocks: u64,
    /// Block buffers the pool had to allocate.
    pub pool_allocated_blocks: u64,
    /// Freed block buffers the pool gave back to the allocator (no room in the unused budget).
    pub pool_released_blocks: u64,
    /// Bytes of freed block buffers kept for reuse now.
    pub pool_kept_bytes: u64,
    /// Pinned prefixes.
    pub pins: Vec<PinSpec>,
    /// Bytes from the origin, from peers and to peers by team, job and dataset (the caller's team; the
    /// request's `x-strata-job` and `x-strata-dataset`, or the access key's job), busiest first. A job is
    /// counted apart for each team that named it: naming another team's job charges nothing of it.
    #[serde(default)]
    pub by_job: Vec<JobIo>,
}

/// The I/O of one job and dataset through the cache.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobIo {
    /// The team the I/O was made for (the caller's, as the agent authenticated it; `None`: no team).
    #[serde(default)]
    pub team: Option<String>,
    /// The job (`None`: I/O that named none).
    pub job: Option<String>,
    /// The dataset (`None`: I/O that named none).
    pub dataset: Option<String>,
    /// Bytes read from the origin to fill blocks (egress).
    pub origin_bytes: u64,
    /// Bytes of blocks other agents of the cluster served.
    pub peer_bytes: u64,
    /// Bytes of blocks this agent served to other agents for this job.
    pub served_to_peers_bytes: u64,
    /// Of the bytes this agent had to fill, the share peers served: `peer / (peer + origin)`.
    pub peer_hit_ratio: f64,
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
        let (ram_cap, ram_used, ram_pinned, ram_blocks) = {
            let r = self.inner.ram.lock();
            (
                r.policy.capacity(),
                r.policy.used(),
                r.policy.pinned_bytes(),
                r.policy.len() as u64,
            )
        };
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
        let disk = self.inner.disk.as_ref().map(|t| {
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
        let avail = self.inner.budget.available_permits() as u64;
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
            inflight_budget_bytes: self.inner.budget_units * UNIT,
            inflight_bytes: self.inner.budget_units.saturating_sub(avail) * UNIT,
            pool_reused_blocks: ld(&self.inner.pool.reused),
            pool_allocated_blocks: ld(&self.inner.pool.allocated),
            pool_released_blocks: ld(&self.inner.pool.released),
            pool_kept_bytes: self.inner.pool.kept() as u64 * self.inner.cfg.block_size.bytes(),
            pins: self.inner.pins.read().clone(),
            by_job: self.inner.by_job.lock().snapshot(),
        }
    }
}
