//! The cache's knobs, [`CacheConfig`], validated in one place ([`CacheConfig::validate`]: each error names the
//! field and its allowed range). The agent's `[cache]` section (`strata-server/src/config.rs`) resolves its
//! machine-sized defaults into one; library users (the loader's in-process cache) start from
//! [`CacheConfig::new`], whose metadata TTL is 0 (the agent's default is 60 s). The user-facing reference is
//! `docs/configuration.md`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use strata_types::{ByteSize, Error, Result};

use crate::policy::PolicyKind;

/// Configuration of a [`crate::BlockCache`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheConfig {
    /// Block size: the unit of caching, checksumming and backend reads. Default 8 MiB.
    pub block_size: ByteSize,
    /// Capacity of the RAM tier.
    pub ram_capacity: ByteSize,
    /// The disk tier, if any.
    pub disk: Option<DiskConfig>,
    /// Replacement policy of both tiers.
    pub policy: PolicyKind,
    /// Most bytes that may be pinned, as a share of the pinning tier (disk if present, else RAM). Default 50%.
    pub pinned_max_percent: u8,
    /// Largest readahead window in blocks for a sequential reader (0 disables readahead). Default 4.
    pub readahead_blocks: u32,
    /// Global budget for bytes being fetched from backends (demand reads, readahead and warm-up together),
    /// which also bounds blocks waiting for the disk writers (at most half of it). Default 512 MiB; at least
    /// two blocks.
    pub inflight_budget: ByteSize,
    /// Largest single backend request when filling consecutive blocks (warm-up): fewer, larger requests.
    /// Default 32 MiB; at least one block, at most the in-flight budget.
    pub max_request_size: ByteSize,
    /// Accepted (1 to 256) for older configuration files, and without effect: every read streams its
    /// blocks in order ([`crate::BlockCache::get`]), and cold blocks are fetched as runs of consecutive
    /// blocks, one backend request each, up to `max_request_size`. Default 8.
    pub read_parallelism: usize,
    /// How long object metadata (size, ETag) looked up at the backend is trusted, in milliseconds. Default
    /// [`DEFAULT_METADATA_TTL_MS`] (60 s; the agent's `[cache] metadata_ttl_ms` uses the same); 0 looks the
    /// version up on every open, so changes made at the backend by others are seen at once. Writes through
    /// Strata invalidate it either way.
    /// Local-directory backends (`file://`) trust it at most [`LOCAL_METADATA_TTL_MAX_MS`]: asking them again
    /// is a `stat`, and their files are the ones most often changed behind Strata's back. Past a point between
    /// half and three quarters of the TTL (random per entry, so that objects learned together are not all
    /// revalidated at once), an open that uses an entry refreshes it in the background (refresh-ahead).
    #[serde(default = "default_metadata_ttl_ms")]
    pub metadata_ttl_ms: u64,
    /// Blocks waiting to be written to the disk tier; past this, new blocks are not written (lossy, counted).
    /// Default 32.
    pub disk_write_queue: usize,
    /// How long a block fetched for a prefetch hint ([`crate::BlockCache::prefetch`]) is held, with its share
    /// of the in-flight budget, for the read that takes it, in milliseconds. Default [`DEFAULT_PREFETCH_HOLD_MS`]
    /// (30 s); at most 10 minutes. A read waiting for budget takes it back from staged blocks that have landed.
    #[serde(default = "default_prefetch_hold_ms")]
    pub prefetch_hold_ms: u64,
}

/// How long a hinted block waits for its read by default: 30 s, a shuffle window of a slow reader.
pub const DEFAULT_PREFETCH_HOLD_MS: u64 = 30_000;

fn default_prefetch_hold_ms() -> u64 {
    DEFAULT_PREFETCH_HOLD_MS
}

/// How long object metadata is trusted by default: 60 s, as mountpoint-s3 with a cache. A hot small object
/// then costs no HEAD at the origin per GET; writes through Strata invalidate it at once; changes made at the
/// origin by others are seen within this time.
pub const DEFAULT_METADATA_TTL_MS: u64 = 60_000;

fn default_metadata_ttl_ms() -> u64 {
    DEFAULT_METADATA_TTL_MS
}

/// The longest a local-directory backend's (`file://`) object metadata is trusted, whatever
/// [`CacheConfig::metadata_ttl_ms`] says.
pub const LOCAL_METADATA_TTL_MAX_MS: u64 = 1000;

/// The disk tier's directory and capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskConfig {
    /// Directory for block files (local NVMe). Created if missing.
    pub dir: PathBuf,
    /// Capacity in bytes.
    pub capacity: ByteSize,
}

impl CacheConfig {
    /// Defaults with the given RAM capacity and disk tier.
    pub fn new(ram_capacity: ByteSize, disk: Option<DiskConfig>) -> Self {
        Self {
            block_size: ByteSize::mib(8),
            ram_capacity,
            disk,
            policy: PolicyKind::Tinylfu,
            pinned_max_percent: 50,
            readahead_blocks: 4,
            inflight_budget: ByteSize::mib(512),
            max_request_size: ByteSize::mib(32),
            read_parallelism: 8,
            metadata_ttl_ms: DEFAULT_METADATA_TTL_MS,
            disk_write_queue: 32,
            prefetch_hold_ms: DEFAULT_PREFETCH_HOLD_MS,
        }
    }

    /// Check every field; the error names the field and the allowed range.
    pub fn validate(&self) -> Result<()> {
        let bs = self.block_size.bytes();
        if !(64 * 1024..=256 * 1024 * 1024).contains(&bs) {
            return Err(Error::config(format!(
                "cache.block_size = {}: must be between 64KiB and 256MiB",
                self.block_size
            )));
        }
        if self.ram_capacity.bytes() < bs {
            return Err(Error::config(format!(
                "cache.ram_capacity = {}: must hold at least one block ({})",
                self.ram_capacity, self.block_size
            )));
        }
        if let Some(d) = &self.disk
            && d.capacity.bytes() < bs
        {
            return Err(Error::config(format!(
                "cache.disk_capacity = {}: must hold at least one block ({}); to run without a disk tier set \
                 cache.disk_enabled = false",
                d.capacity, self.block_size
            )));
        }
        if self.pinned_max_percent > 90 {
            return Err(Error::config(format!(
                "cache.pinned_max_percent = {}: at most 90, so unpinned data can still be cached",
                self.pinned_max_percent
            )));
        }
        if self.readahead_blocks > 64 {
            return Err(Error::config(format!(
                "cache.readahead_blocks = {}: at most 64",
                self.readahead_blocks
            )));
        }
        if self.inflight_budget.bytes() < 2 * bs || self.inflight_budget.bytes() > (1u64 << 40) {
            return Err(Error::config(format!(
                "cache.inflight_budget = {}: must be at least two blocks ({}) and at most 1TiB",
                self.inflight_budget,
                ByteSize(2 * bs)
            )));
        }
        if self.max_request_size.bytes() < bs || self.max_request_size > self.inflight_budget {
            return Err(Error::config(format!(
                "cache.max_request_size = {}: must be at least one block ({}) and at most cache.inflight_budget ({})",
                self.max_request_size, self.block_size, self.inflight_budget
            )));
        }
        if !(1..=256).contains(&self.read_parallelism) {
            return Err(Error::config(format!(
                "cache.read_parallelism = {}: must be 1..=256",
                self.read_parallelism
            )));
        }
        if self.metadata_ttl_ms > 3_600_000 {
            return Err(Error::config(format!(
                "cache.metadata_ttl_ms = {}: at most one hour (3600000)",
                self.metadata_ttl_ms
            )));
        }
        if self.prefetch_hold_ms > 600_000 {
            return Err(Error::config(format!(
                "cache.prefetch_hold_ms = {}: at most ten minutes (600000)",
                self.prefetch_hold_ms
            )));
        }
        if !(1..=4096).contains(&self.disk_write_queue) {
            return Err(Error::config(format!(
                "cache.disk_write_queue = {}: must be 1..=4096",
                self.disk_write_queue
            )));
        }
        Ok(())
    }
}
