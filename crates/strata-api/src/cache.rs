//! The cache's reports: statistics (`GET /v1/cache`), warm-up progress, pins, and what a member holds of a
//! share. The cache produces these types itself (`strata_cache` re-exports them): they exist to be
//! reported.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A pinned prefix, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PinInfo {
    /// Canonical backend id.
    pub backend: String,
    /// Key prefix.
    pub prefix: String,
    /// The member of the cluster whose pin this is, kept here for the blocks this agent owns; none: this
    /// agent's own pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

/// Statistics of one tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
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
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, JsonSchema)]
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
    pub pins: Vec<PinInfo>,
    /// Bytes from the origin, from peers and to peers by team, job and dataset (the caller's team; the
    /// request's `x-strata-job` and `x-strata-dataset`, or the access key's job), busiest first. A job is
    /// counted apart for each team that named it: naming another team's job charges nothing of it.
    #[serde(default)]
    pub by_job: Vec<JobIo>,
}

/// The I/O of one job and dataset through the cache.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
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

/// Result of pinning a prefix.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct PinReport {
    /// Blocks already cached that are now pinned.
    pub pinned_blocks: u64,
    /// Blocks that could not be pinned because the pinned-bytes cap was reached.
    pub refused_blocks: u64,
}

/// Progress of a warm-up, reported after each block.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct WarmProgress {
    /// Objects found under the prefix.
    pub objects: u64,
    /// Total bytes of those objects.
    pub total_bytes: u64,
    /// Bytes now cached (fetched or already there).
    pub done_bytes: u64,
    /// Blocks fetched from the backend.
    pub fetched_blocks: u64,
    /// Blocks that were already cached.
    pub cached_blocks: u64,
    /// Bytes of the blocks that were already cached.
    #[serde(default)]
    pub cached_bytes: u64,
    /// Blocks that failed.
    pub failed_blocks: u64,
    /// The first errors (at most 10), as `key: message`.
    pub errors: Vec<String>,
}

/// What a member holds of its share of some object versions (counted, nothing fetched).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct Held {
    /// Objects counted.
    pub objects_total: u64,
    /// Objects every block of which is held (an empty object always is).
    pub objects_held: u64,
    /// Blocks counted.
    pub blocks_total: u64,
    /// Blocks held.
    pub blocks_held: u64,
    /// Bytes counted.
    pub bytes_total: u64,
    /// Bytes of the blocks held.
    pub bytes_held: u64,
}

/// What an invalidation covers, in one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Invalidation {
    /// One key.
    Key(String),
    /// Every key that starts with this prefix.
    Prefix(String),
}

impl Invalidation {
    /// Whether it covers `key`.
    pub fn covers(&self, key: &str) -> bool {
        match self {
            Self::Key(k) => k == key,
            Self::Prefix(p) => key.starts_with(p.as_str()),
        }
    }
}
