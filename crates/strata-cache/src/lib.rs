//! Strata's tiered block cache.
//!
//! Objects are cached as fixed-size blocks (default 8 MiB) keyed by [`strata_types::BlockKey`]: backend, key,
//! *version* and block index, so a changed object is never served from stale blocks.
//!
//! ```text
//!  open ─▶ metadata cache (TTL, refresh-ahead, listings) ─▶ CachedObject (one version)
//!  read(range) ─▶ readahead buffer ─▶ RAM tier ─▶ disk tier ─▶ single-flight fill ─▶ backend (ranged GET, If-Match)
//!                                        ▲            ▲                 │
//!                                        └────────────┴── admit ◀───────┘  (disk writes via a bounded, lossy queue)
//! ```
//!
//! - **The front door** ([`BlockCache::get`], `get.rs`): front ends say what they want ([`GetOptions`]: a
//!   range, conditions, a pinned version, HEAD) and get a [`GetResult`] whose body streams block by block;
//!   how to open, when to prefetch and who holds budget are decided there. The lower-level calls below
//!   (`open_object*`, `CachedObject`) are private to the crate. [`BlockCache::prefetch`] is its hint: the
//!   blocks it fetches are staged (`stage.rs`), held with their budget until read.
//! - **Tiers** ([`BlockCache`]): RAM (a map of `Bytes`) and disk ([`disk`] module: one checksummed file per
//!   block). Both use the scan-resistant [`policy`] (CLOCK order + TinyLFU admission; warm-ups force admission
//!   into the disk tier). The disk tier is advisory: any error there is a miss plus a counter. Every lookup
//!   emits a `cache_lookup` event naming the tier that served it (or `miss`).
//! - **Single-flight**: concurrent misses of one block share one backend read (a spawned task whose result is
//!   shared, so a reader that gives up does not cancel it for the others): 32 readers of a cold object cost
//!   one origin GET per block.
//! - **Budget** (`budget.rs`): bytes being fetched are bounded by one budget (`inflight_budget`), held only
//!   as shares of it.
//!   Prefetch runs, readahead and warm-ups are bounded strictly; a reader's own miss takes budget when it is
//!   free but never waits for it (it may hold budget for blocks it prefetched, and readers waiting on each
//!   other's budget would deadlock), so demand reads exceed the budget by at most one block per reader.
//! - **Readahead** (`CachedObject`): a reader that moves forward block by block gets a window that doubles up
//!   to `readahead_blocks`, using only budget that is free; prefetched blocks are held by the reader (and their
//!   budget with them) until used or dropped.
//! - **Pinning**: a pinned prefix's blocks are never evicted from the pinning tier (disk when present); pinned
//!   bytes are capped (`pinned_max_percent`), and pins survive restarts (`pins.json` in the disk directory).
//!
//! # Opening an object: the metadata cache
//!
//! `BlockCache::open_object` learns the object's version from a HEAD, or, within `metadata_ttl_ms`, from
//! the metadata cache (local-directory backends trust it at most [`LOCAL_METADATA_TTL_MAX_MS`]; writers call
//! [`BlockCache::invalidate`]). Entries are keyed by backend id, then key (looked up by `&str`, so a hit
//! allocates nothing), keep the version's object state (id, first block's digest, last read mark), and are
//! bounded (100,000: the map starts over when full).
//!
//! - **Refresh-ahead**: past a random point between half and three quarters of the TTL (so objects learned
//!   together are not revalidated together), an open that uses an entry starts one background refresh
//!   (at most 16 at once). A refresh renews the entry only if it is still the one it started from,
//!   so a HEAD sent before a write can never bring the old version back after the write's invalidation.
//! - **Listing refresh**: when the entry's directory (the key up to its last `/`) holds 16 or
//!   more entries and the backend lists in key order, the refresh is one recursive listing of the directory
//!   ([`strata_object::Backend::list_span`], at most 8 objects per entry, at least a
//!   page). It renews every unversioned entry it confirms (same ETag, size and mtime) as of its start, drops
//!   every entry it contradicts, drops the key if it passed it without it (deleted), leaves entries learned
//!   after it started alone, and runs at most once per directory at a time; a directory whose listing stopped
//!   at its limit before the key (a few entries over a large subtree) goes back to HEADs.
//! - **Expired entries** of such a directory are revalidated the same way in the foreground: the open lists
//!   1,000 objects from its key, or waits for the listing in flight (a `watch` whose sender
//!   the listing's task drops), then uses the entry if the listing confirmed it, else sends a HEAD.
//!
//! `BlockCache::open_object_reading` instead learns the version of an object it has never seen from a GET
//! of its first `upto` bytes ([`strata_object::Backend::get_head_stream`]: whole blocks, at most half the
//! in-flight budget), returning once the response headers are in; the body feeds a fill run like any other.
//! When `upto` is more than one block (a client downloading in parts), the same request also reads the
//! readahead window past it. A one-block open reads one block, so it never holds budget for bytes it may not
//! need.
//!
//! # Fills
//!
//! - `CachedObject::prefetch` starts the uncached blocks of a range as **runs**: one backend request per run
//!   of consecutive blocks, up to half the in-flight budget (warm-ups: from `max_request_size` up to four
//!   times that, enough to spread the blocks over their concurrency: `warm.rs` `warm_run_blocks`).
//! - Each block of a run is registered for single-flight separately and **resolves as soon as it has
//!   arrived** (a oneshot per block), not when the whole run has. Warm-ups resolve a block once it is on disk.
//! - Every ranged GET carries `If-Match` of the opened version and the response's ETag is checked: an object
//!   changed since the open fails with `PreconditionFailed` instead of mixing versions. Short bodies are
//!   errors. A run that fails midway is retried under the backend's retry policy from the block the failure
//!   fell in; blocks completed before it are already cached, handed out and correct.
//! - Completed blocks go to the RAM tier (admission) and to the disk writers. Ordinary fills queue each whole
//!   block (its buffer is page-aligned, so it reaches its file with `O_DIRECT` without a copy); the queue is
//!   lossy: 8 blocks queue freely, past them a block holds its size of the in-flight budget
//!   until written (at most half the budget in all: a queued block the RAM tier did not keep is memory
//!   outside the tier), and with no budget or the queue full (`disk_write_queue`) it is dropped and counted.
//!   Warm-ups never lose one and report a block only once its file is in place: each block is written to
//!   its file piece by piece as it arrives, from the fill's task, while the bytes are in the CPU's cache
//!   (`HotWrite` in `fill.rs`; a block it cannot write that way is queued, waiting for room in the queue).
//!   Through the page cache
//!   because a staging's blocks are mostly not kept in memory anyway and the device then catches up after
//!   the claim is Ready, as any copy tool's writes do; with `O_DIRECT` a claim's staging waited on the device
//!   (0.61-0.70x `s5cmd cp` against 0.84-0.87x buffered, `bench/RESULTS.md`).
//! - Block buffers come from a pool of reused block-sized buffers (`pool.rs`), bounded by the unused budget.
//!
//! # Senders
//!
//! `CachedObject::read_block` hands out each block with its `BudgetShare` when it was fetched ahead or
//! read from the disk tier (fresh memory, like a fill; waited for only when the reader holds no budget, else
//! taken if free): a sender drops it once the connection has taken the block, so bytes on their way to slow
//! clients stay inside the budget whether or not the RAM tier admitted them. `CachedObject::read_cached`
//! serves a range inside one RAM-held block without readahead bookkeeping (the hot path of small GETs).
//! `CachedObject::mark_read` rate-limits access-time records per object version.
//!
//! Every background task (fills, disk writers, refreshes, readahead) is tracked and stops on
//! [`BlockCache::shutdown`].
mod budget;
pub mod clock;
mod config;
pub mod disk;
mod fill;
mod get;
mod meta;
mod peer;
pub mod policy;
mod pool;
mod reader;
mod stage;
mod state;
mod stats;
#[cfg(test)]
mod tests;
mod tier;
mod warm;

// The tests' shared helpers name the crate as its users do.
#[cfg(test)]
extern crate self as strata_cache;

use crate::budget::Budget;
use crate::fill::Flights;
use crate::meta::MetaCache;
use crate::pool::BlockPool;
use crate::state::Inner;
use crate::stats::Counters;
use crate::tier::Tiers;
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{
    CacheConfig, DEFAULT_METADATA_TTL_MS, DEFAULT_PREFETCH_HOLD_MS, DiskConfig,
    LOCAL_METADATA_TTL_MAX_MS,
};
pub use get::{ByteRange, ETagMatch, GetBody, GetOptions, GetResult, plain_etag};
pub use meta::Invalidation;
use parking_lot::Mutex;
pub use peer::{PeerBlock, PeerSource};
pub use policy::PolicyKind;
pub use state::BlockCache;
pub use stats::{CacheStats, DiskFaults, JobIo, TierStats};
use std::path::PathBuf;
use std::sync::Arc;
use strata_telemetry::Telemetry;
use strata_types::BlockKey;
use strata_types::Result;
pub use tier::pins::PinSpec;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
pub use warm::{Held, PinReport, WarmProgress};

impl BlockCache {
    /// Open the cache: validates the configuration, opens (and re-indexes) the disk tier, reloads pins and
    /// starts the disk writers. Must be called inside a Tokio runtime.
    pub fn open(cfg: CacheConfig, telemetry: Arc<Telemetry>) -> Result<Self> {
        Self::open_with_clock(cfg, telemetry, Arc::new(SystemClock))
    }

    /// [`BlockCache::open`] with the clock its metadata reads the time from ([`clock`]).
    pub fn open_with_clock(
        cfg: CacheConfig,
        telemetry: Arc<Telemetry>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        cfg.validate()?;
        let bs = cfg.block_size.bytes();
        let tasks = TaskTracker::new();
        let budget = Budget::new(cfg.inflight_budget.bytes());
        let tiers = Tiers::open(&cfg, &budget, &tasks)?;
        let inner = Arc::new(Inner {
            pool: BlockPool::new(bs as usize, budget.clone()),
            budget,
            tiers,
            cfg,
            telemetry,
            flights: Flights::default(),
            counters: Counters::default(),
            tasks,
            cancel: CancellationToken::new(),
            meta: MetaCache::new(clock),
            staged: Mutex::new(Default::default()),
            by_job: Mutex::new(Default::default()),
            peers: std::sync::OnceLock::new(),
        });
        let cache = Self { inner };
        cache.start_stage_sweeper();
        Ok(cache)
    }

    /// The configuration in use.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.cfg
    }

    /// The telemetry hub.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.inner.telemetry
    }

    /// Bytes `range` of `key`, through the cache (opens the object, then reads); the crate's tests' shorthand.
    #[cfg(test)]
    pub(crate) async fn read(
        &self,
        ctx: &strata_types::IoContext,
        backend: &strata_object::Backend,
        key: &str,
        range: std::ops::Range<u64>,
    ) -> Result<bytes::Bytes> {
        self.open_object(ctx, backend, key).await?.read(range).await
    }

    /// Stop background work: readahead and fills are cancelled, queued disk writes are finished, and the call
    /// returns when every task has ended. The disk tier is consistent afterwards (every block file complete).
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.budget.close();
        self.inner.tiers.stop_writes();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Path of a block's file on the disk tier (for tools and fault-injection tests).
    pub fn disk_path_of(&self, key: &BlockKey) -> Option<PathBuf> {
        self.inner.tiers.disk().map(|d| d.path_of(&key.digest()))
    }
}
