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
//!   (`open_object*`, [`CachedObject`]) remain for warm-up, pins and the cache's own tests.
//! - **Tiers** ([`BlockCache`]): RAM (a map of `Bytes`) and disk ([`disk`] module: one checksummed file per
//!   block). Both use the scan-resistant [`policy`] (CLOCK order + TinyLFU admission; warm-ups force admission
//!   into the disk tier). The disk tier is advisory: any error there is a miss plus a counter. Every lookup
//!   emits a `cache_lookup` event naming the tier that served it (or `miss`).
//! - **Single-flight**: concurrent misses of one block share one backend read (a spawned task whose result is
//!   shared, so a reader that gives up does not cancel it for the others): 32 readers of a cold object cost
//!   one origin GET per block.
//! - **Budget**: bytes being fetched are bounded by a global semaphore counted in KiB (`inflight_budget`).
//!   Prefetch runs, readahead and warm-ups are bounded strictly; a reader's own miss takes budget when it is
//!   free but never waits for it (it may hold budget for blocks it prefetched, and readers waiting on each
//!   other's budget would deadlock), so demand reads exceed the budget by at most one block per reader.
//! - **Readahead** ([`CachedObject`]): a reader that moves forward block by block gets a window that doubles up
//!   to `readahead_blocks`, using only budget that is free; prefetched blocks are held by the reader (and their
//!   budget with them) until used or dropped.
//! - **Pinning**: a pinned prefix's blocks are never evicted from the pinning tier (disk when present); pinned
//!   bytes are capped (`pinned_max_percent`), and pins survive restarts (`pins.json` in the disk directory).
//!
//! # Opening an object: the metadata cache
//!
//! [`BlockCache::open_object`] learns the object's version from a HEAD, or, within `metadata_ttl_ms`, from
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
//! [`BlockCache::open_object_reading`] instead learns the version of an object it has never seen from a GET
//! of its first `upto` bytes ([`strata_object::Backend::get_head_stream`]: whole blocks, at most half the
//! in-flight budget), returning once the response headers are in; the body feeds a fill run like any other.
//! When `upto` is more than one block (a client downloading in parts), the same request also reads the
//! readahead window past it. A one-block open reads one block, so it never holds budget for bytes it may not
//! need.
//!
//! # Fills
//!
//! - [`CachedObject::prefetch`] starts the uncached blocks of a range as **runs**: one backend request per run
//!   of consecutive blocks, up to half the in-flight budget (warm-ups: up to `max_request_size`).
//! - Each block of a run is registered for single-flight separately and **resolves as soon as it has
//!   arrived** (a oneshot per block), not when the whole run has. Warm-ups resolve a block once it is on disk.
//! - Every ranged GET carries `If-Match` of the opened version and the response's ETag is checked: an object
//!   changed since the open fails with `PreconditionFailed` instead of mixing versions. Short bodies are
//!   errors. A run that fails midway is retried whole under the backend's retry policy; blocks completed
//!   before the failure are already cached and correct.
//! - Completed blocks go to the RAM tier (admission) and to the disk writers. Ordinary fills queue each whole
//!   block (its buffer is page-aligned, so it reaches its file with `O_DIRECT` without a copy); the queue is
//!   lossy: 8 blocks queue freely, past them a block holds its size of the in-flight budget
//!   until written (at most half the budget in all: a queued block the RAM tier did not keep is memory
//!   outside the tier), and with no budget or the queue full (`disk_write_queue`) it is dropped and counted.
//!   Warm-ups instead stream each chunk to its block file as it arrives, waiting for the disk (backpressure).
//! - Block buffers come from a pool of reused block-sized buffers (`pool.rs`), bounded by the unused budget.
//!
//! # Senders
//!
//! [`CachedObject::read_block`] hands out each block with its [`BudgetShare`] when it was fetched ahead or
//! read from the disk tier (fresh memory, like a fill; waited for only when the reader holds no budget, else
//! taken if free): a sender drops it once the connection has taken the block, so bytes on their way to slow
//! clients stay inside the budget whether or not the RAM tier admitted them. [`CachedObject::read_cached`]
//! serves a range inside one RAM-held block without readahead bookkeeping (the hot path of small GETs).
//! [`CachedObject::mark_read`] rate-limits access-time records per object version.
//!
//! Every background task (fills, disk writers, disk streamers, refreshes, readahead) is tracked and stops on
//! [`BlockCache::shutdown`].

mod config;
pub mod disk;
mod get;
pub mod policy;
mod pool;

use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt, TryStreamExt};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use strata_object::Backend;
use strata_telemetry::Telemetry;
use strata_types::{
    BlockKey, Error, ErrorKind, IoContext, IoEvent, ObjectId, ObjectMeta, Op, Outcome, Result, Tier,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{CacheConfig, DEFAULT_METADATA_TTL_MS, DiskConfig, LOCAL_METADATA_TTL_MAX_MS};
pub use get::{ByteRange, ETagMatch, GetBody, GetOptions, GetResult, plain_etag};
pub use policy::PolicyKind;

use disk::DiskTier;
use policy::{Digest, DigestMap, Policy};
use pool::BlockPool;

/// Budget accounting unit (the semaphore counts KiB so that a terabyte budget fits in `u32` permits).
const UNIT: u64 = 1024;

/// Blocks an ordinary (lossy) fill may leave queued for the disk writers without holding budget. Past them a
/// queued block holds in-flight budget until it is written (at most half the budget, [`Inner::spill`]); when
/// there is none, or the queue is full, it is dropped (counted in `writes_dropped`). Warm-ups wait for room in
/// the whole queue instead.
const LOSSY_QUEUE_MAX: usize = 8;

type SharedFetch = Shared<BoxFuture<'static, Result<Bytes>>>;

/// A response body from a backend.
type ByteStream = futures::stream::BoxStream<'static, Result<Bytes>>;

/// A pinned prefix of one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinSpec {
    /// Canonical backend id.
    pub backend: String,
    /// Key prefix.
    pub prefix: String,
}

impl PinSpec {
    fn matches(&self, k: &BlockKey) -> bool {
        *k.object.backend == *self.backend && k.object.key.starts_with(&self.prefix)
    }
}

/// Statistics of one tier.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TierStats {
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Bytes held.
    pub used_bytes: u64,
    /// Bytes held by pinned blocks.
    pub pinned_bytes: u64,
    /// Blocks held.
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
    /// Lookups no tier could serve.
    pub misses: u64,
    /// Hits / (hits + misses) since start.
    pub hit_ratio: f64,
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
    /// Reads refused because the object changed at the backend while it was being read.
    pub stale_version_errors: u64,
    /// Fills that failed at the backend.
    pub fill_errors: u64,
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
}

/// Result of pinning a prefix.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PinReport {
    /// Blocks already cached that are now pinned.
    pub pinned_blocks: u64,
    /// Blocks that could not be pinned because the pinned-bytes cap was reached.
    pub refused_blocks: u64,
}

/// Progress of a warm-up, reported after each block.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
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
    /// Blocks that failed.
    pub failed_blocks: u64,
    /// The first errors (at most 10), as `key: message`.
    pub errors: Vec<String>,
}

#[derive(Debug, Default)]
struct Counters {
    ram_hits: AtomicU64,
    disk_hits: AtomicU64,
    misses: AtomicU64,
    ram_evictions: AtomicU64,
    ram_rejected: AtomicU64,
    fills: AtomicU64,
    fill_requests: AtomicU64,
    fill_bytes: AtomicU64,
    joins: AtomicU64,
    readahead: AtomicU64,
    readahead_skipped: AtomicU64,
    stale: AtomicU64,
    fill_errors: AtomicU64,
    writes_dropped: AtomicU64,
    meta_refreshes: AtomicU64,
    meta_refresh_lists: AtomicU64,
}

#[derive(Debug)]
struct RamTier {
    policy: Policy,
    map: DigestMap<(BlockKey, Bytes)>,
}

#[derive(Debug)]
struct DiskJob {
    key: BlockKey,
    digest: Digest,
    data: Bytes,
    done: Option<oneshot::Sender<()>>,
    /// Budget held until the block is written (a lossy write queued past [`LOSSY_QUEUE_MAX`]).
    _held: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

/// How a fill treats admission and the disk queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FillMode {
    /// A reader's fill (demand, prefetch, readahead, an open's first bytes): the caller holds the budget, if
    /// any; normal admission; lossy disk write.
    Readahead,
    /// Explicit warm-up: wait for budget; forced disk admission; wait for the disk write.
    Warm,
}

struct Inner {
    cfg: CacheConfig,
    telemetry: Arc<Telemetry>,
    ram: Mutex<RamTier>,
    disk: Option<Arc<DiskTier>>,
    inflight: Mutex<DigestMap<SharedFetch>>,
    budget: Arc<Semaphore>,
    budget_units: u64,
    /// Half the budget: the most that blocks queued for the disk writers may hold of it.
    spill: Arc<Semaphore>,
    /// Freed block buffers, reused by fills and disk reads (bounded by the unused budget).
    pool: Arc<BlockPool>,
    pins: RwLock<Vec<PinSpec>>,
    pins_path: Option<PathBuf>,
    counters: Counters,
    disk_tx: Mutex<Option<mpsc::Sender<DiskJob>>>,
    tasks: TaskTracker,
    cancel: CancellationToken,
    meta: Mutex<MetaMap>,
    refreshes: Arc<Semaphore>,
}

/// Object metadata by backend id, then key: looked up by `&str`, so a hit allocates nothing.
#[derive(Default)]
struct MetaMap {
    by_backend: FastMap<Arc<str>, BackendMeta>,
    len: usize,
}

/// What is known of one backend's objects.
#[derive(Default)]
struct BackendMeta {
    entries: FastMap<String, MetaEntry>,
    /// Entries per directory (see [`dir_of`]): how a due refresh chooses between a HEAD and a listing.
    dirs: FastMap<String, u32>,
    /// Directories with a refresh listing in flight; the receiver sees its sender dropped when the listing's
    /// task ends (done, failed or cancelled), which is what an open waiting for it waits on.
    listing: FastMap<String, tokio::sync::watch::Receiver<()>>,
    /// Directories whose refresh listing stopped at its limit before covering them (a small directory
    /// with a large subtree): their entries are refreshed one HEAD each.
    sparse: FastSet<String>,
}

/// A map keyed by strings on a hot path: foldhash (seeded per process) instead of SipHash.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// The directory of a key: everything up to and including its last `/` (`""` at the root).
fn dir_of(key: &str) -> &str {
    &key[..key.rfind('/').map_or(0, |i| i + 1)]
}

impl MetaMap {
    fn get_mut(&mut self, backend: &str, key: &str) -> Option<&mut MetaEntry> {
        self.by_backend.get_mut(backend)?.entries.get_mut(key)
    }

    fn contains(&self, backend: &str, key: &str) -> bool {
        self.by_backend
            .get(backend)
            .is_some_and(|m| m.entries.contains_key(key))
    }

    fn remove(&mut self, backend: &str, key: &str) {
        if let Some(m) = self.by_backend.get_mut(backend)
            && m.remove(key)
        {
            self.len -= 1;
        }
    }

    fn insert(&mut self, backend: &Arc<str>, key: &str, e: MetaEntry) {
        if self.len >= META_MAX {
            // A bound, not a policy.
            *self = Self::default();
        }
        let m = match self.by_backend.get_mut(&**backend) {
            Some(m) => m,
            None => self.by_backend.entry(backend.clone()).or_default(),
        };
        if m.entries.insert(key.to_string(), e).is_none() {
            self.len += 1;
            let dir = dir_of(key);
            match m.dirs.get_mut(dir) {
                Some(n) => *n += 1,
                None => {
                    m.dirs.insert(dir.to_string(), 1);
                }
            }
        }
    }
}

impl BackendMeta {
    /// Forget `key`; whether it was known.
    fn remove(&mut self, key: &str) -> bool {
        if self.entries.remove(key).is_none() {
            return false;
        }
        let dir = dir_of(key);
        if let Some(n) = self.dirs.get_mut(dir) {
            *n -= 1;
            if *n == 0 {
                self.dirs.remove(dir);
            }
        }
        true
    }
}

/// What is known of an object's version, and when it was learned. The version's [`ObjState`] is kept with
/// it, so that opening an object whose metadata is fresh builds nothing (and its first block's digest is
/// computed once per version, not per read).
struct MetaEntry {
    obj: Arc<ObjState>,
    at: Instant,
    /// Where in the TTL an open starts a background refresh: a random point of [1/2, 3/4), so that objects
    /// learned together (a listing, a burst of first reads) are not all revalidated at the same moment.
    refresh_at: f32,
    /// A background refresh of this entry is running.
    refreshing: bool,
}

impl MetaEntry {
    fn new(obj: Arc<ObjState>) -> Self {
        Self {
            obj,
            at: Instant::now(),
            refresh_at: 0.5 + rand::random::<f32>() / 4.0,
            refreshing: false,
        }
    }

    /// The version was confirmed current at `at`.
    fn renew(&mut self, at: Instant) {
        self.at = at;
        self.refresh_at = 0.5 + rand::random::<f32>() / 4.0;
        self.refreshing = false;
    }
}

/// Whether a listing can confirm this version: listings carry no version ids, and an entry without an ETag
/// has nothing to compare beyond size and time.
fn listing_confirms(meta: &ObjectMeta) -> bool {
    meta.version.is_none() && meta.etag.is_some()
}

/// Whether a listed object is the version an entry holds.
fn same_version(held: &ObjectMeta, listed: &ObjectMeta) -> bool {
    held.etag.is_some()
        && held.etag == listed.etag
        && held.size == listed.size
        && held.last_modified_unix == listed.last_modified_unix
}

/// The key range of a directory for [`Backend::list_span`]: after the directory's name without its last
/// `/` (less than every key under it), before the name with that `/` replaced by the next byte, `0`
/// (the end of the key space for the root).
fn dir_span(dir: &str) -> (&str, Option<String>) {
    match dir.strip_suffix('/') {
        Some(name) => (name, Some(format!("{name}0"))),
        None => ("", None),
    }
}

/// Background metadata refreshes running at once, at most (past this, entries simply expire).
const META_REFRESH_MAX: usize = 16;

/// Entries of one directory from which a due refresh lists the directory (renewing every entry the listing
/// confirms) instead of sending a HEAD for the one key: 2,000 hot keys of a directory cost two LIST pages per
/// refresh cycle instead of 2,000 HEADs.
const META_LIST_MIN: u32 = 16;

/// A refresh listing reads at most this many objects per entry of its directory (at least one S3 page):
/// a directory with a few cached keys over a large subtree is not listed whole.
const META_LIST_PER_ENTRY: usize = 8;

/// Objects an open that revalidates an expired entry by a listing lists from its key (one S3 page).
const META_LIST_WINDOW: usize = 1_000;

/// Most metadata entries kept (the map is cleared when it fills).
const META_MAX: usize = 100_000;

/// The tiered block cache. Cheap to clone; all clones share one cache.
#[derive(Clone)]
pub struct BlockCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

fn percent(v: u64, pct: u64) -> u64 {
    (v as u128 * pct as u128 / 100) as u64
}

fn units(bytes: u64) -> u32 {
    bytes.div_ceil(UNIT).max(1).min(u32::MAX as u64) as u32
}

impl BlockCache {
    /// Open the cache: validates the configuration, opens (and re-indexes) the disk tier, reloads pins and
    /// starts the disk writers. Must be called inside a Tokio runtime.
    pub fn open(cfg: CacheConfig, telemetry: Arc<Telemetry>) -> Result<Self> {
        cfg.validate()?;
        let bs = cfg.block_size.bytes();
        let pin_share = cfg.pinned_max_percent as u64;
        let disk = match &cfg.disk {
            Some(d) => Some(Arc::new(DiskTier::open(
                &d.dir,
                d.capacity.bytes(),
                percent(d.capacity.bytes(), pin_share),
                cfg.policy,
                bs,
            )?)),
            None => None,
        };
        let ram_pin_cap = if disk.is_some() {
            0
        } else {
            percent(cfg.ram_capacity.bytes(), pin_share)
        };
        let ram = RamTier {
            policy: Policy::new(
                cfg.policy,
                cfg.ram_capacity.bytes(),
                ram_pin_cap,
                (cfg.ram_capacity.bytes() / bs).max(16) as usize,
            ),
            map: DigestMap::default(),
        };
        let budget_units = cfg.inflight_budget.bytes() / UNIT;
        let pins_path = cfg.disk.as_ref().map(|d| d.dir.join("pins.json"));
        let pins: Vec<PinSpec> = match &pins_path {
            Some(p) if p.exists() => std::fs::read(p)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_else(|| {
                    tracing::warn!(path = %p.display(), "unreadable pins file ignored");
                    Vec::new()
                }),
            _ => Vec::new(),
        };
        let (tx, rx) = mpsc::channel::<DiskJob>(cfg.disk_write_queue);
        let budget = Arc::new(Semaphore::new(budget_units as usize));
        let inner = Arc::new(Inner {
            pool: BlockPool::new(bs as usize, budget.clone(), UNIT, budget_units),
            budget,
            budget_units,
            spill: Arc::new(Semaphore::new((budget_units / 2) as usize)),
            cfg,
            telemetry,
            ram: Mutex::new(ram),
            disk,
            inflight: Mutex::new(DigestMap::default()),
            pins: RwLock::new(pins.clone()),
            pins_path,
            counters: Counters::default(),
            disk_tx: Mutex::new(None),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
            meta: Mutex::new(MetaMap::default()),
            refreshes: Arc::new(Semaphore::new(META_REFRESH_MAX)),
        });
        if let Some(disk) = &inner.disk {
            for p in &pins {
                disk.pin_matching(|k| p.matches(k));
            }
            *inner.disk_tx.lock() = Some(tx);
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            for _ in 0..2 {
                let (rx, disk) = (rx.clone(), disk.clone());
                inner.tasks.spawn(async move {
                    loop {
                        let job = rx.lock().await.recv().await;
                        let Some(job) = job else { break };
                        let disk = disk.clone();
                        let _ = tokio::task::spawn_blocking(move || {
                            let _ = disk.write(&job.key, &job.digest, &job.data);
                            if let Some(done) = job.done {
                                let _ = done.send(());
                            }
                        })
                        .await;
                    }
                });
            }
        }
        Ok(Self { inner })
    }

    /// The configuration in use.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.cfg
    }

    /// The telemetry hub.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.inner.telemetry
    }

    /// Look up the object's current version at the backend (or in the metadata cache, within
    /// `metadata_ttl_ms`) and return a reader for it.
    pub async fn open_object(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
    ) -> Result<CachedObject> {
        if let Some(obj) = self.cached_state(ctx, backend, key) {
            return Ok(self.object_from_state(ctx, obj));
        }
        if let Some(obj) = self.revalidate_by_listing(ctx, backend, key).await {
            return Ok(self.object_from_state(ctx, obj));
        }
        let meta = backend.head(ctx, key).await?;
        let obj = Arc::new(ObjState::new(backend, meta));
        self.remember(&obj);
        Ok(self.object_from_state(ctx, obj))
    }

    /// An expired entry of a directory with many known entries is revalidated by a listing, not a HEAD: the
    /// open lists a window of the directory from its key ([`META_LIST_WINDOW`] objects, one S3 page), or
    /// waits for the listing of the directory already in flight, and every entry the listing confirms is
    /// renewed. A client reading many keys in order after the TTL ran out (a second pass over a data set)
    /// costs one listing per thousand keys instead of a HEAD each. `None` (the caller sends a HEAD) when the
    /// directory does not qualify, no refresh slot is free, or the listing did not confirm the entry.
    async fn revalidate_by_listing(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
    ) -> Option<Arc<ObjState>> {
        if !backend.lists_in_order() || self.metadata_ttl(backend).is_zero() {
            return None;
        }
        // Twice at most: the listing joined may have been a window that ends before this key.
        for _ in 0..2 {
            let mut wait = {
                let mut m = self.inner.meta.lock();
                let bm = m.by_backend.get_mut(&**backend.id())?;
                let e = bm.entries.get(key)?;
                let dir = dir_of(key);
                if !listing_confirms(&e.obj.meta)
                    || bm.dirs.get(dir).is_none_or(|&n| n < META_LIST_MIN)
                    || bm.sparse.contains(dir)
                {
                    return None;
                }
                match bm.listing.get(dir) {
                    Some(rx) => rx.clone(),
                    None => {
                        let permit = self.inner.refreshes.clone().try_acquire_owned().ok()?;
                        let (done, rx) = tokio::sync::watch::channel(());
                        bm.listing.insert(dir.to_string(), rx.clone());
                        drop(m);
                        // From just below the key (the key less its last character), so the key itself
                        // is listed.
                        let mut from = key.to_string();
                        from.pop();
                        self.refresh_dir(
                            ctx.clone(),
                            backend.clone(),
                            key.to_string(),
                            Some(from),
                            META_LIST_WINDOW,
                            (permit, done),
                        );
                        rx
                    }
                }
            };
            // Resolves when the listing's task ends and drops its sender.
            let _ = wait.changed().await;
            if let Some(obj) = self.cached_state(ctx, backend, key) {
                return Some(obj);
            }
        }
        None
    }

    /// Like [`Self::open_object`], but a cold open reads the start of the object with the same request that
    /// learns its version: the first `upto` bytes (rounded up to whole blocks, at least one block, at most half
    /// the in-flight budget). One backend request instead of two for a small object, or for the first part of
    /// a large object read in parts. The blocks read are cached and held for the returned reader.
    pub async fn open_object_reading(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        upto: u64,
    ) -> Result<CachedObject> {
        if let Some(obj) = self.cached_state(ctx, backend, key) {
            return Ok(self.object_from_state(ctx, obj));
        }
        // Known before but expired: the blocks are probably cached, so revalidate with a HEAD instead of
        // reading the data again.
        if self.known_meta(backend, key) {
            return self.open_object(ctx, backend, key).await;
        }
        let cfg = &self.inner.cfg;
        let bs = cfg.block_size.bytes();
        let cap = (cfg.inflight_budget.bytes() / 2 / bs).max(1) * bs;
        // A read of more than one block from the start is a sequential reader (a client downloading in
        // parts): the same request also reads the readahead window past it, which often is the rest of the
        // object, one request where the next part would have needed another.
        let ahead = if upto > bs {
            u64::from(cfg.readahead_blocks) * bs
        } else {
            0
        };
        let len = upto
            .div_ceil(bs)
            .max(1)
            .saturating_mul(bs)
            .saturating_add(ahead)
            .min(cap);
        let permit = self
            .inner
            .budget
            .clone()
            .acquire_many_owned(units(len))
            .await
            .map_err(|_| Error::new(ErrorKind::Cancelled, "cache is shutting down"))?;
        let (meta, stream) = match backend.get_head_stream(ctx, key, len).await {
            Ok(v) => v,
            // An empty object has no satisfiable range: fall back to HEAD.
            Err(e) if e.kind() == ErrorKind::InvalidInput => {
                return self.open_object(ctx, backend, key).await;
            }
            Err(e) => return Err(e),
        };
        let state = Arc::new(ObjState::new(backend, meta));
        self.remember(&state);
        let obj = self.object_from_state(ctx, state);
        let size = obj.meta().size;
        // The response is the object's first `len` bytes, or all of it: whole blocks (`len` is a multiple of
        // the block size). They fill as one run fed by this response, each block handed to the reader as soon
        // as it has arrived; the budget taken for bytes the object does not have goes back now.
        let end = len.min(size);
        let nblocks = end.div_ceil(bs);
        let mut permit = Some(permit);
        if end < len
            && let Some(p) = permit.as_mut()
        {
            drop(p.split(units(len - end) as usize));
        }
        if nblocks == 0 {
            return Ok(obj);
        }
        let futs = self.fetch_run(
            ctx,
            &obj.obj,
            0,
            nblocks,
            FillMode::Readahead,
            None,
            Some(stream),
        );
        let mut ra = obj.ra.lock();
        for (k, f) in futs.into_iter().enumerate() {
            let i = k as u64;
            let share = if i + 1 == nblocks {
                permit.take()
            } else {
                let blen = ((i + 1) * bs).min(size) - i * bs;
                permit.as_mut().and_then(|p| p.split(units(blen) as usize))
            };
            ra.prefetched.insert(i, (f, share));
        }
        drop(ra);
        Ok(obj)
    }

    /// How long `backend`'s metadata is trusted (see [`CacheConfig::metadata_ttl_ms`]).
    fn metadata_ttl(&self, backend: &Backend) -> std::time::Duration {
        let ms = match backend.scheme() {
            "file" => self
                .inner
                .cfg
                .metadata_ttl_ms
                .min(config::LOCAL_METADATA_TTL_MAX_MS),
            _ => self.inner.cfg.metadata_ttl_ms,
        };
        std::time::Duration::from_millis(ms)
    }

    /// The object's version if its metadata is still trusted. Refresh-ahead: once an entry is past its refresh
    /// point (between half and three quarters of the TTL), the first open that uses it starts a refresh in
    /// the background, so an object read over and over keeps fresh metadata without any open waiting for the
    /// backend (and changes made at the backend are still seen within the TTL). The refresh is a HEAD of the
    /// key, or, when its directory holds many entries and the backend lists in key order, one listing of the
    /// directory that renews every entry it confirms ([`META_LIST_MIN`]).
    fn cached_state(&self, ctx: &IoContext, backend: &Backend, key: &str) -> Option<Arc<ObjState>> {
        let ttl = self.metadata_ttl(backend);
        if ttl.is_zero() {
            return None;
        }
        let mut m = self.inner.meta.lock();
        let bm = m.by_backend.get_mut(&**backend.id())?;
        let e = bm.entries.get_mut(key)?;
        let age = e.at.elapsed();
        if age >= ttl {
            return None;
        }
        // Learned through another `Backend` with the same id (other credentials, say): read through the
        // caller's own.
        let obj = if e.obj.backend.same(backend) {
            e.obj.clone()
        } else {
            Arc::new(ObjState::new(backend, e.obj.meta.clone()))
        };
        if age < ttl.mul_f32(e.refresh_at) || e.refreshing {
            return Some(obj);
        }
        let dir = dir_of(key);
        let by_listing = backend.lists_in_order()
            && listing_confirms(&e.obj.meta)
            && bm.dirs.get(dir).is_some_and(|&n| n >= META_LIST_MIN)
            && !bm.sparse.contains(dir);
        if by_listing && bm.listing.contains_key(dir) {
            // The listing in flight renews this entry too.
            return Some(obj);
        }
        let Ok(permit) = self.inner.refreshes.clone().try_acquire_owned() else {
            return Some(obj);
        };
        if by_listing {
            let limit = (bm.dirs[dir] as usize)
                .saturating_mul(META_LIST_PER_ENTRY)
                .max(1_000);
            let (done, rx) = tokio::sync::watch::channel(());
            bm.listing.insert(dir.to_string(), rx);
            drop(m);
            self.refresh_dir(
                ctx.clone(),
                backend.clone(),
                key.to_string(),
                None,
                limit,
                (permit, done),
            );
        } else {
            e.refreshing = true;
            let from = e.at;
            drop(m);
            self.refresh_meta(ctx.clone(), backend.clone(), key.to_string(), from, permit);
        }
        Some(obj)
    }

    /// HEAD `key` in the background and renew its entry, unless the entry changed meanwhile (invalidated by a
    /// write, or replaced by a newer lookup): a HEAD sent before a write must not bring the old version back.
    fn refresh_meta(
        &self,
        ctx: IoContext,
        backend: Backend,
        key: String,
        from: Instant,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let inner = self.inner.clone();
        self.inner.tasks.spawn(async move {
            let _permit = permit;
            let got = tokio::select! {
                _ = inner.cancel.cancelled() => return,
                r = backend.head(&ctx, &key) => r,
            };
            inner
                .counters
                .meta_refreshes
                .fetch_add(1, Ordering::Relaxed);
            let mut m = inner.meta.lock();
            let Some(e) = m.get_mut(backend.id(), &key).filter(|e| e.at == from) else {
                return;
            };
            match got {
                Ok(meta) => *e = MetaEntry::new(Arc::new(ObjState::new(&backend, meta))),
                // Deleted at the backend: forget it now rather than at the end of the TTL.
                Err(err) if err.kind() == ErrorKind::NotFound => m.remove(backend.id(), &key),
                // Any other failure: the entry expires as usual and the next open asks again.
                Err(_) => e.refreshing = false,
            }
        });
    }

    /// List the directory of `key` (recursively, at most `limit` objects) in the background and renew every
    /// entry the listing confirms: same size, ETag and modification time as the entry's version. An entry
    /// the listing contradicts (changed at the backend, or `key` itself missing from a complete listing:
    /// deleted) is forgotten, so the next open asks the backend. Entries learned or renewed after the
    /// listing started are left alone: a listing sent before a write must not bring the old version back.
    /// `from`: list from there instead of the directory's start (a window around `key`).
    fn refresh_dir(
        &self,
        ctx: IoContext,
        backend: Backend,
        key: String,
        from: Option<String>,
        limit: usize,
        held: (
            tokio::sync::OwnedSemaphorePermit,
            tokio::sync::watch::Sender<()>,
        ),
    ) {
        let inner = self.inner.clone();
        self.inner.tasks.spawn(async move {
            let _held = held;
            let dir = dir_of(&key);
            let (after, end) = dir_span(dir);
            let after = match from.as_deref() {
                Some(f) if f > after => f,
                _ => after,
            };
            let started = Instant::now();
            let got = tokio::select! {
                _ = inner.cancel.cancelled() => return,
                r = backend.list_span(&ctx, after, end.as_deref(), limit) => r,
            };
            let mut m = inner.meta.lock();
            let Some(bm) = m.by_backend.get_mut(&**backend.id()) else {
                return;
            };
            bm.listing.remove(dir);
            // Any failure: entries expire as usual and the next due open asks again.
            let Ok(span) = got else { return };
            let (mut renewed, mut dropped) = (0u64, 0usize);
            let mut saw_key = false;
            for o in &span.objects {
                saw_key |= o.key == key;
                let Some(e) = bm.entries.get_mut(&o.key) else {
                    continue;
                };
                if e.at >= started || !listing_confirms(&e.obj.meta) {
                    continue;
                }
                if same_version(&e.obj.meta, o) {
                    e.renew(started);
                    renewed += 1;
                } else if bm.remove(&o.key) {
                    dropped += 1;
                }
            }
            if !saw_key {
                let past = span
                    .objects
                    .last()
                    .is_some_and(|o| o.key.as_str() > key.as_str());
                if span.complete || past {
                    // Deleted at the backend: forget it now rather than at the end of the TTL.
                    if bm.entries.get(&key).is_some_and(|e| e.at < started) && bm.remove(&key) {
                        dropped += 1;
                    }
                } else {
                    // The listing stopped before reaching the key: this directory is refreshed by HEADs.
                    bm.sparse.insert(dir.to_string());
                }
            }
            m.len -= dropped;
            inner
                .counters
                .meta_refreshes
                .fetch_add(renewed, Ordering::Relaxed);
            inner
                .counters
                .meta_refresh_lists
                .fetch_add(1, Ordering::Relaxed);
        });
    }

    /// Whether metadata of `key` was learned before, fresh or not.
    fn known_meta(&self, backend: &Backend, key: &str) -> bool {
        self.inner.cfg.metadata_ttl_ms > 0 && self.inner.meta.lock().contains(backend.id(), key)
    }

    fn remember(&self, obj: &Arc<ObjState>) {
        if self.inner.cfg.metadata_ttl_ms == 0 {
            return;
        }
        self.inner
            .meta
            .lock()
            .insert(obj.backend.id(), &obj.meta.key, MetaEntry::new(obj.clone()));
    }

    /// Forget what is known of `key`'s version: call after writing or deleting it, so the next open sees the
    /// change even with a metadata TTL.
    pub fn invalidate(&self, backend: &Backend, key: &str) {
        self.inner.meta.lock().remove(backend.id(), key);
    }

    /// A reader for an object whose metadata the caller already has (from a listing, say).
    pub fn object_from_meta(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        meta: ObjectMeta,
    ) -> CachedObject {
        self.object_from_state(ctx, Arc::new(ObjState::new(backend, meta)))
    }

    fn object_from_state(&self, ctx: &IoContext, obj: Arc<ObjState>) -> CachedObject {
        CachedObject {
            cache: self.clone(),
            obj,
            ctx: ctx.clone(),
            ra: Mutex::new(Readahead::default()),
        }
    }

    /// Bytes `range` of `key`, through the cache (opens the object, then reads).
    pub async fn read(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        range: Range<u64>,
    ) -> Result<Bytes> {
        self.open_object(ctx, backend, key).await?.read(range).await
    }

    fn emit_lookup(&self, ctx: &IoContext, id: &ObjectId, tier: Tier, bytes: u64, start: Instant) {
        self.inner.telemetry.emit(IoEvent {
            at: SystemTime::now(),
            op: Op::CacheLookup,
            backend: id.backend.clone(),
            key: id.key.clone(),
            bytes,
            latency: start.elapsed(),
            tier,
            outcome: Outcome::Ok,
            ctx: ctx.clone(),
        });
    }

    /// The block if the RAM tier holds it, recorded as a request in both tiers' policies; on a miss nothing
    /// is recorded.
    fn ram_hit(&self, ctx: &IoContext, id: &ObjectId, d: &Digest, start: Instant) -> Option<Bytes> {
        let b = {
            let mut ram = self.inner.ram.lock();
            let b = ram.map.get(d)?.1.clone();
            ram.policy.record_request(d);
            b
        };
        self.inner.counters.ram_hits.fetch_add(1, Ordering::Relaxed);
        if let Some(disk) = &self.inner.disk {
            disk.record_request(d);
        }
        self.emit_lookup(ctx, id, Tier::Ram, b.len() as u64, start);
        Some(b)
    }

    /// Look a block up in RAM, then disk. Records the request in both tiers' policies.
    async fn lookup(&self, ctx: &IoContext, key: &BlockKey, d: &Digest) -> Option<Bytes> {
        let start = Instant::now();
        if let Some(b) = self.ram_hit(ctx, &key.object, d, start) {
            return Some(b);
        }
        self.inner.ram.lock().policy.record_request(d);
        let c = &self.inner.counters;
        if let Some(disk) = &self.inner.disk {
            disk.record_request(d);
            if disk.contains(d) {
                let (disk2, key2, d2) = (disk.clone(), key.clone(), *d);
                let pool = self.inner.pool.clone();
                let got = tokio::task::spawn_blocking(move || disk2.get(&key2, &d2, &pool))
                    .await
                    .ok()
                    .flatten();
                if let Some(b) = got {
                    c.disk_hits.fetch_add(1, Ordering::Relaxed);
                    self.insert_ram(key, *d, &b, false);
                    self.emit_lookup(ctx, &key.object, Tier::Disk, b.len() as u64, start);
                    return Some(b);
                }
            }
        }
        c.misses.fetch_add(1, Ordering::Relaxed);
        self.emit_lookup(ctx, &key.object, Tier::Miss, 0, start);
        None
    }

    fn insert_ram(&self, key: &BlockKey, d: Digest, b: &Bytes, force: bool) {
        // RAM pins only when there is no disk tier (otherwise the disk tier holds pinned data).
        let pin = self.inner.disk.is_none() && self.is_pinned(key);
        let mut ram = self.inner.ram.lock();
        let a = ram.policy.admit(d, b.len() as u64, pin, force);
        for v in &a.evicted {
            ram.map.remove(v);
        }
        if a.admitted {
            ram.map.insert(d, (key.clone(), b.clone()));
        }
        drop(ram);
        let c = &self.inner.counters;
        c.ram_evictions
            .fetch_add(a.evicted.len() as u64, Ordering::Relaxed);
        if !a.admitted {
            c.ram_rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn is_pinned(&self, key: &BlockKey) -> bool {
        self.inner.pins.read().iter().any(|p| p.matches(key))
    }

    /// Queue a block for the disk tier. For warm-ups this waits for room in the queue and returns a receiver
    /// that fires once the block is on disk; otherwise a full queue drops the block (counted).
    async fn store_disk(
        &self,
        key: &BlockKey,
        d: Digest,
        data: &Bytes,
        mode: FillMode,
    ) -> Option<oneshot::Receiver<()>> {
        let Some(disk) = &self.inner.disk else {
            return None;
        };
        let force = mode == FillMode::Warm;
        let a = disk.reserve(key, d, data.len() as u64, self.is_pinned(key), force);
        if !a.admitted {
            return None;
        }
        let tx = self.inner.disk_tx.lock().clone();
        let Some(tx) = tx else {
            disk.drop_entry(&d);
            return None;
        };
        let (done_tx, done_rx) = oneshot::channel();
        let mut job = DiskJob {
            key: key.clone(),
            digest: d,
            data: data.clone(),
            done: force.then_some(done_tx),
            _held: None,
        };
        if force {
            if tx.send(job).await.is_err() {
                disk.drop_entry(&d);
                return None;
            }
            return Some(done_rx);
        }
        // A queued block the RAM tier did not admit, or has evicted since, is memory outside the RAM tier: a
        // few may queue freely, more only with budget to hold (a fill faster than the disk writes is still
        // cached whole, within the memory bound, until the budget is needed for reading).
        let queued = tx.max_capacity() - tx.capacity();
        if queued >= LOSSY_QUEUE_MAX {
            let n = units(data.len() as u64);
            job._held = self
                .inner
                .spill
                .clone()
                .try_acquire_many_owned(n)
                .and_then(|s| Ok((s, self.inner.budget.clone().try_acquire_many_owned(n)?)))
                .ok();
        }
        let queued_ok = queued < LOSSY_QUEUE_MAX || job._held.is_some();
        if !queued_ok || tx.try_send(job).is_err() {
            disk.drop_entry(&d);
            self.inner
                .counters
                .writes_dropped
                .fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    /// Fetch a block from the backend, or join the fetch already in flight. The fetch runs as its own task, so
    /// a caller that gives up does not cancel it for the others.
    fn fetch(
        &self,
        ctx: &IoContext,
        obj: &Arc<ObjState>,
        index: u64,
        mode: FillMode,
        permit: Option<OwnedSemaphorePermit>,
    ) -> SharedFetch {
        let mut v = self.fetch_run(ctx, obj, index, 1, mode, permit, None);
        v.pop().unwrap_or_else(|| {
            futures::future::ready(Err(Error::internal("empty fetch run")))
                .boxed()
                .shared()
        })
    }

    /// Fetch `count` consecutive blocks from `first` with one backend request (fewer, larger requests for
    /// sequential fills), registering each block for single-flight. If any of them is already in flight or in
    /// RAM, falls back to block-by-block fetches that join what is in flight. `given`: the body of a request
    /// already made for exactly these blocks (an open that read the object's start), used for the first
    /// attempt instead of a new request.
    #[allow(clippy::too_many_arguments)]
    fn fetch_run(
        &self,
        ctx: &IoContext,
        obj: &Arc<ObjState>,
        first: u64,
        count: u64,
        mode: FillMode,
        permit: Option<OwnedSemaphorePermit>,
        given: Option<ByteStream>,
    ) -> Vec<SharedFetch> {
        let keys: Vec<(BlockKey, Digest)> = (first..first + count)
            .map(|i| {
                let k = BlockKey::new(obj.id.clone(), i);
                let d = k.digest();
                (k, d)
            })
            .collect();
        let mut inflight = self.inner.inflight.lock();
        if count > 1 {
            let ram = self.inner.ram.lock();
            let busy = keys
                .iter()
                .any(|(_, d)| inflight.contains_key(d) || ram.map.contains_key(d));
            drop(ram);
            if busy {
                drop(inflight);
                drop(permit);
                return (first..first + count)
                    .map(|i| self.fetch(ctx, obj, i, mode, None))
                    .collect();
            }
        } else if let Some((_, d)) = keys.first() {
            if let Some(f) = inflight.get(d) {
                self.inner.counters.joins.fetch_add(1, Ordering::Relaxed);
                return vec![f.clone()];
            }
            // The fill may have finished between our lookup and taking this lock.
            if let Some((_, b)) = self.inner.ram.lock().map.get(d) {
                return vec![futures::future::ready(Ok(b.clone())).boxed().shared()];
            }
        }
        let this = self.clone();
        let (ctx, obj) = (ctx.clone(), obj.clone());
        let digests: Vec<Digest> = keys.iter().map(|(_, d)| *d).collect();
        let guard_digests = digests.clone();
        // Each block resolves as soon as it is complete, not when the whole run is: a reader of a 50 MiB range
        // sends its first block while the rest is still arriving.
        let (mut done, waits): (Vec<_>, Vec<_>) = (0..keys.len())
            .map(|_| {
                let (tx, rx) = oneshot::channel::<Result<Bytes>>();
                (Some(tx), rx)
            })
            .unzip();
        self.inner.tasks.spawn(async move {
            let guard = InflightGuard {
                cache: this.clone(),
                digests: guard_digests,
            };
            let cancel = this.inner.cancel.clone();
            let mut given = given;
            let r = tokio::select! {
                r = this.fill_run(&ctx, &obj, &keys, mode, permit, &mut done, &mut given) => r,
                _ = cancel.cancelled() => Err(Error::new(ErrorKind::Cancelled, "cache is shutting down")),
            };
            let r = r.and_then(|_| {
                if done.iter().any(Option::is_some) {
                    Err(Error::internal("fill returned too few blocks"))
                } else {
                    Ok(())
                }
            });
            if let Err(e) = r {
                for tx in done.iter_mut().filter_map(Option::take) {
                    let _ = tx.send(Err(e.clone()));
                }
            }
            drop(guard);
        });
        let mut out = Vec::with_capacity(count as usize);
        for (d, rx) in digests.into_iter().zip(waits) {
            let f = rx
                .map(|r| r.unwrap_or_else(|_| Err(Error::internal("block fill task failed"))))
                .boxed()
                .shared();
            inflight.insert(d, f.clone());
            out.push(f);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    async fn fill_run(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        mode: FillMode,
        permit: Option<OwnedSemaphorePermit>,
        done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
        given: &mut Option<ByteStream>,
    ) -> Result<()> {
        let bs = self.inner.cfg.block_size.bytes();
        let (Some((first, _)), Some((last, _))) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        let start = first.index * bs;
        let end = ((last.index + 1) * bs).min(obj.meta.size);
        // Readahead's budget is held by the reader's prefetch buffer until the block is consumed.
        let _permit = match (permit, mode) {
            (Some(p), _) => Some(p),
            (None, FillMode::Readahead) => None,
            (None, _) => Some(
                self.inner
                    .budget
                    .clone()
                    .acquire_many_owned(units(end - start))
                    .await
                    .map_err(|_| Error::new(ErrorKind::Cancelled, "cache is shutting down"))?,
            ),
        };
        // Mid-stream failures (a reset connection) retry the whole run under the backend's retry policy;
        // blocks completed before the failure are already cached and correct (the ETag is pinned).
        let policy = obj.backend.retry_policy();
        let c = &self.inner.counters;
        let mut attempt = 0u32;
        let r = loop {
            match self
                .receive_run(ctx, obj, keys, start..end, mode, done, given.take())
                .await
            {
                Ok(()) => break Ok(()),
                Err(e) if e.is_retryable() && attempt < policy.max_retries => {
                    attempt += 1;
                    self.inner.telemetry.record_retry(Op::Get, e.kind());
                    tokio::time::sleep(policy.backoff(attempt)).await;
                }
                Err(e) => break Err(e),
            }
        };
        match r {
            // Counted by `receive_run` before the last block goes to its readers.
            Ok(()) => Ok(()),
            Err(e) => {
                c.fill_errors.fetch_add(1, Ordering::Relaxed);
                if e.kind() == ErrorKind::PreconditionFailed {
                    c.stale.fetch_add(1, Ordering::Relaxed);
                    return Err(e.context(format!(
                        "{} changed at the backend while being read; reopen it to read the new version",
                        obj.meta.key
                    )));
                }
                Err(e)
            }
        }
    }

    /// One attempt at a run: stream `start..end` and cut it into blocks as the bytes arrive; each completed
    /// block goes to the RAM tier and the disk queue at once, while it is still hot in the CPU cache, and to
    /// its waiters (`done[i]`, taken when sent: a retried run does not send a block twice).
    #[allow(clippy::too_many_arguments)]
    async fn receive_run(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        span: Range<u64>,
        mode: FillMode,
        done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
        given: Option<ByteStream>,
    ) -> Result<()> {
        let bs = self.inner.cfg.block_size.bytes();
        let (start, end) = (span.start, span.end);
        let mut stream = match given {
            Some(s) => s,
            None => {
                obj.backend
                    .get_range_stream(ctx, &obj.meta.key, start..end, obj.meta.etag.as_deref())
                    .await?
            }
        };
        let mut out = 0usize;
        let mut got = 0u64;
        let mut written = Vec::new();
        let block_len =
            |i: usize| (((keys[i].0.index + 1) * bs).min(end) - keys[i].0.index * bs) as usize;
        let pool = &self.inner.pool;
        let mut warm_blocks = Vec::new();
        let mut cur = pool.take(block_len(0));
        // Warm-ups stream each received chunk straight to its block file while it is hot in the CPU cache.
        // Other fills queue each whole block once complete (lossy): its buffer is page-aligned, so it goes to
        // the file with `O_DIRECT` straight from that memory, with no copy through the staging buffer.
        let streamer = match (&self.inner.disk, mode) {
            (Some(disk), FillMode::Warm) => {
                Some(DiskStreamer::start(disk.clone(), &self.inner.tasks))
            }
            _ => None,
        };
        let mut streaming = false;
        while let Some(chunk) = stream.next().await {
            let mut chunk = chunk?;
            while !chunk.is_empty() {
                let i = out;
                if i >= keys.len() {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "{}: the backend sent more bytes than requested",
                            obj.meta.key
                        ),
                    ));
                }
                let (key, d) = &keys[i];
                if cur.is_empty()
                    && let Some(st) = &streamer
                {
                    streaming = st
                        .begin(key, *d, block_len(i) as u64, self.is_pinned(key))
                        .await;
                }
                let take = (block_len(i) - cur.len()).min(chunk.len());
                let piece = chunk.split_to(take);
                cur.extend_from_slice(&piece);
                if streaming && let Some(st) = &streamer {
                    streaming = st.chunk(piece).await;
                }
                if cur.len() == block_len(i) {
                    let block = std::mem::take(&mut cur).freeze();
                    self.insert_ram(
                        key,
                        *d,
                        &block,
                        mode == FillMode::Warm && self.inner.disk.is_none(),
                    );
                    if mode != FillMode::Warm {
                        self.store_disk(key, *d, &block, mode).await;
                    }
                    if streaming
                        && let Some(st) = &streamer
                        && let Some(done) = st.end().await
                    {
                        written.push(done);
                    }
                    streaming = false;
                    got += block.len() as u64;
                    out += 1;
                    if out == keys.len() {
                        // Counted before the last block is handed out: a reader that has every byte sees
                        // the fill in the stats.
                        let c = &self.inner.counters;
                        c.fill_requests.fetch_add(1, Ordering::Relaxed);
                        c.fills.fetch_add(keys.len() as u64, Ordering::Relaxed);
                        c.fill_bytes.fetch_add(end - start, Ordering::Relaxed);
                    }
                    // Warm-ups report a block only once it is on disk (below).
                    if mode != FillMode::Warm
                        && let Some(tx) = done[i].take()
                    {
                        let _ = tx.send(Ok(block));
                    } else if mode == FillMode::Warm {
                        warm_blocks.push((i, block));
                    }
                    if i + 1 < keys.len() {
                        cur = pool.take(block_len(i + 1));
                    }
                }
            }
        }
        if out != keys.len() {
            let got = got + cur.len() as u64;
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{}: short read, got {got} of {} bytes",
                    obj.meta.key,
                    end - start
                ),
            ));
        }
        for w in written {
            let _ = w.await;
        }
        for (i, block) in warm_blocks {
            if let Some(tx) = done[i].take() {
                let _ = tx.send(Ok(block));
            }
        }
        Ok(())
    }

    /// Read one block: tiers first, then the backend.
    ///
    /// A reader's own miss takes in-flight budget when it is free but does not wait for it: the reader may
    /// hold budget for blocks it prefetched, and readers waiting on each other's budget would deadlock. So the
    /// budget bounds prefetch, readahead and warm-ups strictly, and demand reads to one block per reader
    /// beyond it.
    async fn block(&self, ctx: &IoContext, obj: &Arc<ObjState>, index: u64) -> Result<Bytes> {
        let key = BlockKey::new(obj.id.clone(), index);
        let d = obj.digest(index);
        if let Some(b) = self.lookup(ctx, &key, &d).await {
            return Ok(b);
        }
        let bs = self.inner.cfg.block_size.bytes();
        let len = ((index + 1) * bs).min(obj.meta.size) - index * bs;
        let permit = self
            .inner
            .budget
            .clone()
            .try_acquire_many_owned(units(len))
            .ok();
        self.fetch(ctx, obj, index, FillMode::Readahead, permit)
            .await
    }

    /// Blocks per backend request for sequential fills.
    fn run_blocks(&self) -> u64 {
        let cfg = &self.inner.cfg;
        (cfg.max_request_size.bytes() / cfg.block_size.bytes()).max(1)
    }

    /// Whether a warm-up can skip a block: it is on disk (when there is a disk tier, since warm-ups are meant to
    /// survive restarts) or in RAM (when there is not).
    fn warm_holds(&self, d: &Digest) -> bool {
        match &self.inner.disk {
            Some(disk) => disk.contains(d),
            None => self.inner.ram.lock().map.contains_key(d),
        }
    }

    /// Whether the disk tier holds the block and the RAM tier does not (no policy side effects).
    fn disk_only(&self, d: &Digest) -> bool {
        self.inner.disk.as_ref().is_some_and(|t| t.contains(d))
            && !self.inner.ram.lock().map.contains_key(d)
    }

    /// Whether a block is held by any tier (no policy side effects).
    fn holds(&self, d: &Digest) -> bool {
        self.inner.ram.lock().map.contains_key(d)
            || self.inner.disk.as_ref().is_some_and(|t| t.contains(d))
    }

    /// Prefetch every object under `prefix` into the cache, `concurrency` blocks at a time (at least 1).
    /// Blocks already cached are skipped. Errors of single objects are counted and reported, not fatal.
    pub async fn warm(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        prefix: &str,
        concurrency: usize,
        progress: impl Fn(&WarmProgress),
    ) -> Result<WarmProgress> {
        let mut objects = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = backend
                .list_page(ctx, prefix, after.as_deref(), 1000)
                .await?;
            objects.extend(page.objects);
            match page.next_start_after {
                Some(s) => after = Some(s),
                None => break,
            }
        }
        let bs = self.inner.cfg.block_size.bytes();
        let mut p = WarmProgress {
            objects: objects.len() as u64,
            total_bytes: objects.iter().map(|o| o.size).sum(),
            ..Default::default()
        };
        progress(&p);
        // Work items are runs of consecutive uncached blocks, each fetched with one request of at most
        // `max_request_size`.
        let run_max = self.run_blocks();
        let mut work = Vec::new();
        for meta in objects {
            let obj = Arc::new(ObjState::new(backend, meta));
            let nblocks = obj.meta.size.div_ceil(bs);
            let mut run_start: Option<u64> = None;
            for i in 0..=nblocks {
                let held = i < nblocks && self.warm_holds(&obj.digest(i));
                if held {
                    p.cached_blocks += 1;
                    p.done_bytes += (obj.meta.size - i * bs).min(bs);
                }
                let end_run = i == nblocks || held || run_start.is_some_and(|s| i - s == run_max);
                if end_run && let Some(s) = run_start.take() {
                    work.push((obj.clone(), s, i - s));
                }
                if i < nblocks && !held && run_start.is_none() {
                    run_start = Some(i);
                }
            }
        }
        progress(&p);
        let cancel = self.inner.cancel.clone();
        let mut stream = futures::stream::iter(work)
            .map(|(obj, first, count)| async move {
                let len = ((first + count) * bs).min(obj.meta.size) - first * bs;
                let runs = self.fetch_run(ctx, &obj, first, count, FillMode::Warm, None, None);
                let r = futures::future::try_join_all(runs).await;
                // Blocks that were only in RAM (or joined another reader's fill) still go to disk.
                if let Ok(blocks) = &r {
                    for (i, b) in (first..).zip(blocks) {
                        let key = BlockKey::new(obj.id.clone(), i);
                        let d = key.digest();
                        if !self.warm_holds(&d)
                            && let Some(done) = self.store_disk(&key, d, b, FillMode::Warm).await
                        {
                            let _ = done.await;
                        }
                    }
                }
                (obj, count, len, r.map(|_| ()))
            })
            .buffer_unordered(concurrency.max(1));
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = cancel.cancelled() => return Err(Error::new(ErrorKind::Cancelled, "cache is shutting down")),
            };
            let Some((obj, count, len, r)) = next else {
                break;
            };
            match r {
                Ok(()) => {
                    p.fetched_blocks += count;
                    p.done_bytes += len;
                }
                Err(e) => {
                    p.failed_blocks += count;
                    if p.errors.len() < 10 {
                        p.errors.push(format!("{}: {e}", obj.meta.key));
                    }
                }
            }
            progress(&p);
        }
        Ok(p)
    }

    /// Pin `prefix` of `backend` (a canonical backend id): its cached blocks are not evicted, and blocks cached
    /// later are pinned as they arrive, up to the pinned-bytes cap. Persisted across restarts.
    pub fn pin(&self, backend: &str, prefix: &str) -> Result<PinReport> {
        let spec = PinSpec {
            backend: backend.to_string(),
            prefix: prefix.to_string(),
        };
        {
            let mut pins = self.inner.pins.write();
            if !pins.contains(&spec) {
                pins.push(spec.clone());
            }
        }
        self.save_pins()?;
        let (pinned, refused) = match &self.inner.disk {
            Some(disk) => disk.pin_matching(|k| spec.matches(k)),
            None => {
                let mut ram = self.inner.ram.lock();
                let ram = &mut *ram;
                let (mut ok, mut refused) = (0, 0);
                for (d, (k, _)) in ram.map.iter() {
                    if spec.matches(k) {
                        if ram.policy.pin(d) {
                            ok += 1;
                        } else {
                            refused += 1;
                        }
                    }
                }
                (ok, refused)
            }
        };
        Ok(PinReport {
            pinned_blocks: pinned,
            refused_blocks: refused,
        })
    }

    /// Remove a pin. Returns whether it existed. Blocks still covered by another pin stay pinned.
    pub fn unpin(&self, backend: &str, prefix: &str) -> Result<bool> {
        let spec = PinSpec {
            backend: backend.to_string(),
            prefix: prefix.to_string(),
        };
        let existed = {
            let mut pins = self.inner.pins.write();
            let before = pins.len();
            pins.retain(|p| *p != spec);
            before != pins.len()
        };
        self.save_pins()?;
        let rest = self.inner.pins.read().clone();
        let release = |k: &BlockKey| spec.matches(k) && !rest.iter().any(|p| p.matches(k));
        match &self.inner.disk {
            Some(disk) => disk.unpin_matching(release),
            None => {
                let mut ram = self.inner.ram.lock();
                let ram = &mut *ram;
                for (d, (k, _)) in ram.map.iter() {
                    if release(k) {
                        ram.policy.unpin(d);
                    }
                }
            }
        }
        Ok(existed)
    }

    fn save_pins(&self) -> Result<()> {
        let Some(path) = &self.inner.pins_path else {
            return Ok(());
        };
        let body = serde_json::to_vec_pretty(&*self.inner.pins.read())
            .map_err(|e| Error::internal(format!("encoding pins: {e}")))?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, body)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| Error::from_io(e, format!("saving {}", path.display())))
    }

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
            fills: ld(&c.fills),
            fill_requests: ld(&c.fill_requests),
            fill_bytes: ld(&c.fill_bytes),
            single_flight_joins: ld(&c.joins),
            readahead_blocks: ld(&c.readahead),
            readahead_skipped: ld(&c.readahead_skipped),
            stale_version_errors: ld(&c.stale),
            fill_errors: ld(&c.fill_errors),
            metadata_refreshes: ld(&c.meta_refreshes),
            metadata_refresh_lists: ld(&c.meta_refresh_lists),
            inflight_budget_bytes: self.inner.budget_units * UNIT,
            inflight_bytes: self.inner.budget_units.saturating_sub(avail) * UNIT,
            pool_reused_blocks: ld(&self.inner.pool.reused),
            pool_allocated_blocks: ld(&self.inner.pool.allocated),
            pool_released_blocks: ld(&self.inner.pool.released),
            pool_kept_bytes: self.inner.pool.kept() as u64 * self.inner.cfg.block_size.bytes(),
            pins: self.inner.pins.read().clone(),
        }
    }

    /// Stop background work: readahead and fills are cancelled, queued disk writes are finished, and the call
    /// returns when every task has ended. The disk tier is consistent afterwards (every block file complete).
    pub async fn shutdown(&self) {
        self.inner.cancel.cancel();
        self.inner.disk_tx.lock().take();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Path of a block's file on the disk tier (for tools and fault-injection tests).
    pub fn disk_path_of(&self, key: &BlockKey) -> Option<PathBuf> {
        self.inner.disk.as_ref().map(|d| d.path_of(&key.digest()))
    }
}

/// A blocking writer that receives a warm-up run's chunks and writes them to block files as they arrive, while
/// they are still hot in the CPU cache; the warm-up waits for it (backpressure, bounded channel). A block whose
/// `End` never arrives is abandoned when the next one begins or the run ends. (Other fills queue whole blocks
/// instead, see `receive_run`.)
struct DiskStreamer {
    tx: mpsc::Sender<StreamMsg>,
    disk: Arc<DiskTier>,
}

enum StreamMsg {
    Begin {
        key: BlockKey,
        digest: Digest,
        len: u64,
    },
    Chunk(Bytes),
    End(oneshot::Sender<()>),
}

impl DiskStreamer {
    /// Start the writer on a blocking thread tracked by `tasks`, so shutdown waits for it.
    fn start(disk: Arc<DiskTier>, tasks: &TaskTracker) -> Self {
        // Chunks are a few KiB to a few hundred KiB; 512 of them let the writer lag a block or so behind.
        let (tx, mut rx) = mpsc::channel::<StreamMsg>(512);
        let d2 = disk.clone();
        tasks.spawn_blocking(move || {
            let disk = d2;
            let abandon = |cur: &mut Option<(disk::BlockFile, Digest)>| {
                if let Some((f, d)) = cur.take() {
                    drop(f);
                    disk.drop_entry(&d);
                    disk.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
            };
            let mut cur: Option<(disk::BlockFile, Digest)> = None;
            while let Some(msg) = rx.blocking_recv() {
                match msg {
                    StreamMsg::Begin { key, digest, len } => {
                        abandon(&mut cur);
                        cur = match disk.begin(&key, &digest, len) {
                            Ok(f) => Some((f, digest)),
                            Err(e) => {
                                disk.fail(&digest, &e);
                                None
                            }
                        };
                    }
                    StreamMsg::Chunk(b) => {
                        if let Some((f, d)) = cur.as_mut()
                            && let Err(e) = f.append(&b)
                        {
                            disk.fail(d, &e);
                            cur = None;
                        }
                    }
                    StreamMsg::End(done) => {
                        if let Some((f, _)) = cur.take() {
                            let _ = disk.finish(f);
                        }
                        let _ = done.send(());
                    }
                }
            }
            // The run ended mid-block (an error, shutdown, or a lost `End`).
            abandon(&mut cur);
        });
        Self { tx, disk }
    }

    async fn send(&self, msg: StreamMsg) -> bool {
        self.tx.send(msg).await.is_ok()
    }

    /// Reserve space for a block (forced admission, as for every warm-up) and open its file. False if the
    /// tier did not admit it or the writer is gone.
    async fn begin(&self, key: &BlockKey, digest: Digest, len: u64, pin: bool) -> bool {
        if !self.disk.reserve(key, digest, len, pin, true).admitted {
            return false;
        }
        let msg = StreamMsg::Begin {
            key: key.clone(),
            digest,
            len,
        };
        if !self.send(msg).await {
            self.disk.drop_entry(&digest);
            self.disk.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Append to the current block; false when the writer is gone: send nothing more for it.
    async fn chunk(&self, b: Bytes) -> bool {
        self.send(StreamMsg::Chunk(b)).await
    }

    /// Finish the current block: a receiver that fires once it is on disk (or has failed, counted).
    async fn end(&self) -> Option<oneshot::Receiver<()>> {
        let (tx, rx) = oneshot::channel();
        self.send(StreamMsg::End(tx)).await.then_some(rx)
    }
}

struct InflightGuard {
    cache: BlockCache,
    digests: Vec<Digest>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut inflight = self.cache.inner.inflight.lock();
        for d in &self.digests {
            inflight.remove(d);
        }
    }
}

#[derive(Debug)]
struct ObjState {
    backend: Backend,
    meta: ObjectMeta,
    id: ObjectId,
    /// The digest of block 0, once computed (most objects read small are one block).
    first_digest: std::sync::OnceLock<Digest>,
    /// When a read of this version was last noted ([`CachedObject::mark_read`]), `i64::MIN` if never.
    read_at: std::sync::atomic::AtomicI64,
}

impl ObjState {
    fn new(backend: &Backend, meta: ObjectMeta) -> Self {
        Self {
            id: ObjectId::new(backend.id().clone(), meta.key.as_str(), meta.version_tag()),
            backend: backend.clone(),
            meta,
            first_digest: std::sync::OnceLock::new(),
            read_at: std::sync::atomic::AtomicI64::new(i64::MIN),
        }
    }

    /// The cache index key of block `index` of this version.
    /// See [`CachedObject::mark_read`].
    fn mark_read(&self, at: i64, resolution: i64) -> bool {
        let last = self.read_at.load(Ordering::Relaxed);
        if last != i64::MIN && at >= last && at - last < resolution {
            return false;
        }
        self.read_at
            .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    fn digest(&self, index: u64) -> Digest {
        let compute = || BlockKey::new(self.id.clone(), index).digest();
        match index {
            0 => *self.first_digest.get_or_init(compute),
            _ => compute(),
        }
    }
}

#[derive(Default)]
struct Readahead {
    /// The block a sequential reader would read next.
    next: Option<u64>,
    window: u32,
    /// Blocks fetched ahead for this reader. Readahead holds budget with them; runs started by
    /// [`CachedObject::prefetch`] took theirs while fetching.
    prefetched: HashMap<u64, (SharedFetch, Option<OwnedSemaphorePermit>)>,
}

/// A reader of one version of one object through the cache. Reads are verified against that version: if the
/// object changes at the backend, uncached blocks fail with [`ErrorKind::PreconditionFailed`] instead of mixing
/// versions.
pub struct CachedObject {
    cache: BlockCache,
    obj: Arc<ObjState>,
    ctx: IoContext,
    ra: Mutex<Readahead>,
}

/// A block's share of the in-flight budget, handed out with bytes that were fetched ahead for their reader or
/// read from the disk tier ([`CachedObject::read_block`]): hold it until the bytes have left (a response body
/// drops it when the connection asks for the next chunk), so that bytes on their way out stay inside the
/// budget.
#[derive(Debug)]
pub struct BudgetShare(#[allow(dead_code)] OwnedSemaphorePermit);

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject")
            .field("id", &self.obj.id)
            .finish()
    }
}

impl CachedObject {
    /// The object's metadata as of opening.
    pub fn meta(&self) -> &ObjectMeta {
        &self.obj.meta
    }

    /// The whole object.
    pub async fn read_all(&self) -> Result<Bytes> {
        self.read(0..self.obj.meta.size).await
    }

    /// Bytes `range`, which must lie inside one block, with the block's share of the in-flight budget when it
    /// was fetched ahead for this reader or read from the disk tier (see [`BudgetShare`]). For senders that
    /// stream block by block.
    pub async fn read_block(&self, range: Range<u64>) -> Result<(Bytes, Option<BudgetShare>)> {
        let size = self.obj.meta.size;
        let bs = self.cache.inner.cfg.block_size.bytes();
        let end = range.end.min(size);
        if range.start > size || range.start > range.end {
            return Err(Error::invalid_input(format!(
                "range {}..{} is outside {} ({} bytes)",
                range.start, range.end, self.obj.meta.key, size
            )));
        }
        if range.start == end {
            return Ok((Bytes::new(), None));
        }
        let i = range.start / bs;
        if (end - 1) / bs != i {
            return Err(Error::invalid_input(format!(
                "range {}..{} spans more than one block",
                range.start, range.end
            )));
        }
        // Taken before readahead bookkeeping, which forgets prefetched entries at or before the read.
        let pre = self.ra.lock().prefetched.remove(&i);
        self.schedule_readahead(i, i, end);
        let (b, share) = match pre {
            Some((fut, permit)) => match fut.await {
                Ok(b) => (b, permit.map(BudgetShare)),
                Err(_) => (self.cache.block(&self.ctx, &self.obj, i).await?, None),
            },
            None => {
                let share = self.disk_read_share(i).await;
                (self.cache.block(&self.ctx, &self.obj, i).await?, share)
            }
        };
        let (lo, hi) = (range.start - i * bs, end - i * bs);
        if hi > b.len() as u64 {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "block {i} of {} is shorter than expected",
                    self.obj.meta.key
                ),
            ));
        }
        Ok((b.slice(lo as usize..hi as usize), share))
    }

    /// A share of the in-flight budget for block `i` when reading it makes fresh memory because only the disk
    /// tier holds it: a sender's blocks read from disk are then inside the budget until sent, as fetched ones
    /// are, however many large hot reads run at once. Waited for when this reader holds no budget of its own
    /// (as in [`Self::prefetch`]: a reader never waits while holding some), else taken only if free.
    async fn disk_read_share(&self, i: u64) -> Option<BudgetShare> {
        if !self.cache.disk_only(&self.obj.digest(i)) {
            return None;
        }
        let bs = self.cache.inner.cfg.block_size.bytes();
        let len = ((i + 1) * bs).min(self.obj.meta.size) - i * bs;
        let budget = self.cache.inner.budget.clone();
        let holds_budget = self.ra.lock().prefetched.values().any(|(_, p)| p.is_some());
        let permit = if holds_budget {
            budget.try_acquire_many_owned(units(len)).ok()
        } else {
            budget.acquire_many_owned(units(len)).await.ok()
        };
        permit.map(BudgetShare)
    }

    /// Note a read of this version at `at` (seconds): true if none was noted in the `resolution` seconds
    /// before, so the caller should record it. The mark is shared by every reader of the version while its
    /// metadata is cached; for a hot object, at most one reader per `resolution` sees true.
    pub fn mark_read(&self, at: i64, resolution: i64) -> bool {
        self.obj.mark_read(at, resolution)
    }

    /// Bytes `range` if they lie in one block the RAM tier holds now and that was not fetched for this reader,
    /// else `None` (read them with [`Self::read_block`] then). The hot path of a small read: one lookup, none of the readahead
    /// bookkeeping; the request is recorded and the lookup emitted as for any read. An invalid range is
    /// `None` too, and [`Self::read_block`] then says what is wrong with it.
    pub fn read_cached(&self, range: Range<u64>) -> Option<Bytes> {
        let bs = self.cache.inner.cfg.block_size.bytes();
        let end = range.end.min(self.obj.meta.size);
        if range.start >= end {
            return None;
        }
        let i = range.start / bs;
        if (end - 1) / bs != i {
            return None;
        }
        // Fetched for this reader (a cold open that read the start of the object): `read_block` takes it with
        // its budget share, and the fill is not counted as a hit.
        if self.ra.lock().prefetched.contains_key(&i) {
            return None;
        }
        let b = self
            .cache
            .ram_hit(&self.ctx, &self.obj.id, &self.obj.digest(i), Instant::now())?;
        let (lo, hi) = ((range.start - i * bs) as usize, (end - i * bs) as usize);
        (hi <= b.len()).then(|| b.slice(lo..hi))
    }

    /// Bytes `range`; the end is clamped to the object's size. A start past the end is an error.
    pub async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let size = self.obj.meta.size;
        if range.start > size || range.start > range.end {
            return Err(Error::invalid_input(format!(
                "range {}..{} is outside {} ({} bytes)",
                range.start, range.end, self.obj.meta.key, size
            )));
        }
        let end = range.end.min(size);
        if range.start == end {
            return Ok(Bytes::new());
        }
        let bs = self.cache.inner.cfg.block_size.bytes();
        let (first, last) = (range.start / bs, (end - 1) / bs);
        if last > first {
            self.prefetch(range.start..end, false).await;
        }
        self.schedule_readahead(first, last, end);
        let par = self.cache.inner.cfg.read_parallelism;
        let blocks: Vec<Bytes> = futures::stream::iter(first..=last)
            .map(|i| self.block(i))
            .buffered(par)
            .try_collect()
            .await?;
        let slice_of = |i: u64, b: &Bytes| -> Result<Bytes> {
            let bstart = i * bs;
            let lo = range.start.max(bstart) - bstart;
            let hi = end.min(bstart + b.len() as u64) - bstart;
            if hi < lo || hi > b.len() as u64 {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "block {i} of {} is shorter than expected",
                        self.obj.meta.key
                    ),
                ));
            }
            Ok(b.slice(lo as usize..hi as usize))
        };
        if blocks.len() == 1 {
            return slice_of(first, &blocks[0]);
        }
        let mut out = BytesMut::with_capacity((end - range.start) as usize);
        for (n, b) in blocks.iter().enumerate() {
            out.extend_from_slice(&slice_of(first + n as u64, b)?);
        }
        Ok(out.freeze())
    }

    /// Start fetching the uncached blocks of `range` now, consecutive ones together: one backend request per
    /// run of up to half the in-flight budget. A reader that knows it will read a whole range (a ranged GET of
    /// the gateway) calls this first, so a cold 50 MiB range costs one backend request, not one per block.
    ///
    /// The fetched blocks are held for this reader, and their share of the in-flight budget with them, until
    /// read. With `wait`, the first run waits for budget; later runs (and every run without `wait`) start only
    /// if budget is free now, so a reader never waits for budget while holding some (no deadlock); blocks not
    /// started here are fetched when read.
    pub async fn prefetch(&self, range: Range<u64>, wait: bool) {
        let size = self.obj.meta.size;
        let end = range.end.min(size);
        if range.start >= end {
            return;
        }
        let cfg = &self.cache.inner.cfg;
        let bs = cfg.block_size.bytes();
        let cap = (cfg.inflight_budget.bytes() / 2 / bs).max(1);
        let (first, last) = (range.start / bs, (end - 1) / bs);
        let runs = {
            let ra = self.ra.lock();
            let mut run: Option<(u64, u64)> = None;
            let mut runs = Vec::new();
            for i in first..=last + 1 {
                let missing = i <= last
                    && !ra.prefetched.contains_key(&i)
                    && !self.cache.holds(&self.obj.digest(i));
                match (&mut run, missing) {
                    (Some((_, n)), true) if *n < cap => *n += 1,
                    (Some(r), _) => {
                        runs.push(*r);
                        run = missing.then_some((i, 1));
                    }
                    (None, true) => run = Some((i, 1)),
                    (None, false) => {}
                }
            }
            runs
        };
        let block_len = |i: u64| ((i + 1) * bs).min(size) - i * bs;
        for (n, (start, count)) in runs.into_iter().enumerate() {
            let len: u64 = (start..start + count).map(block_len).sum();
            let budget = self.cache.inner.budget.clone();
            // Wait only while holding no budget: a reader that holds some never waits for more.
            let holds_budget = self.ra.lock().prefetched.values().any(|(_, p)| p.is_some());
            let permit = if wait && n == 0 && !holds_budget {
                budget.acquire_many_owned(units(len)).await.ok()
            } else {
                budget.try_acquire_many_owned(units(len)).ok()
            };
            let Some(permit) = permit else {
                self.cache
                    .inner
                    .counters
                    .readahead_skipped
                    .fetch_add(1, Ordering::Relaxed);
                return;
            };
            let futs = self.cache.fetch_run(
                &self.ctx,
                &self.obj,
                start,
                count,
                FillMode::Readahead,
                None,
                None,
            );
            // Each block carries its share of the budget until it is read.
            let mut permit = Some(permit);
            let mut ra = self.ra.lock();
            for (k, f) in futs.into_iter().enumerate() {
                let i = start + k as u64;
                let share = if k as u64 + 1 == count {
                    permit.take()
                } else {
                    permit
                        .as_mut()
                        .and_then(|p| p.split(units(block_len(i)) as usize))
                };
                ra.prefetched.insert(i, (f, share));
            }
        }
    }

    /// [`prefetch`](Self::prefetch) for someone else: the runs start now, into the cache, and keep their share
    /// of the in-flight budget until they land, on a task of the cache's own (shut down with it). Returns once
    /// they are started. For hints from another process, such as a loader asking its node agent for a shuffle
    /// window's bytes before reading them sample by sample.
    pub async fn prefetch_detached(self, range: Range<u64>) {
        self.prefetch(range, false).await;
        let pending: Vec<_> = self.ra.lock().prefetched.drain().map(|(_, v)| v).collect();
        if pending.is_empty() {
            return;
        }
        self.cache.inner.tasks.spawn(async move {
            for (fill, permit) in pending {
                let _ = fill.await;
                drop(permit);
            }
        });
    }

    async fn block(&self, i: u64) -> Result<Bytes> {
        let pre = self.ra.lock().prefetched.remove(&i);
        if let Some((fut, permit)) = pre {
            let r = fut.await;
            drop(permit);
            if r.is_ok() {
                return r;
            }
        }
        self.cache.block(&self.ctx, &self.obj, i).await
    }

    fn schedule_readahead(&self, first: u64, last: u64, end: u64) {
        let cfg = &self.cache.inner.cfg;
        if cfg.readahead_blocks == 0 {
            return;
        }
        let bs = cfg.block_size.bytes();
        let nblocks = self.obj.meta.size.div_ceil(bs);
        let mut ra = self.ra.lock();
        let sequential = match ra.next {
            None => first == 0,
            Some(n) => first == n || first + 1 == n,
        };
        ra.next = Some(end / bs);
        if !sequential {
            // A jump: readahead of the old position is useless (runs for the current read stay).
            ra.window = 0;
            ra.prefetched.retain(|&i, _| i >= first && i <= last);
            return;
        }
        ra.window = (ra.window * 2).clamp(1, cfg.readahead_blocks);
        ra.prefetched.retain(|&i, _| i > last);
        let upto = (last + ra.window as u64).min(nblocks.saturating_sub(1));
        for i in last + 1..=upto {
            if ra.prefetched.contains_key(&i) {
                continue;
            }
            let d = self.obj.digest(i);
            if self.cache.holds(&d) {
                continue;
            }
            let len = (self.obj.meta.size - i * bs).min(bs);
            let Ok(permit) = self
                .cache
                .inner
                .budget
                .clone()
                .try_acquire_many_owned(units(len))
            else {
                self.cache
                    .inner
                    .counters
                    .readahead_skipped
                    .fetch_add(1, Ordering::Relaxed);
                break;
            };
            let fut = self
                .cache
                .fetch(&self.ctx, &self.obj, i, FillMode::Readahead, None);
            self.cache
                .inner
                .counters
                .readahead
                .fetch_add(1, Ordering::Relaxed);
            ra.prefetched.insert(i, (fut, Some(permit)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_span_holds_exactly_the_keys_under_it() {
        assert_eq!(dir_of("a/b/c"), "a/b/");
        assert_eq!(dir_of("a/b/"), "a/b/");
        assert_eq!(dir_of("top"), "");
        let (after, end) = dir_span("a/b/");
        let end = end.unwrap();
        for inside in ["a/b/", "a/b/c", "a/b/\u{10ffff}", "a/b/z/y"] {
            assert!(after < inside && inside < end.as_str(), "{inside}");
        }
        for outside in ["a/b", "a/b0", "a/c/x", "a/b1/x"] {
            assert!(!(after < outside && outside < end.as_str()), "{outside}");
        }
        assert_eq!(dir_span(""), ("", None));
    }
}
