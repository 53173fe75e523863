//! The tiers a block is looked up in, fastest first (RAM, then disk), admission into them, and the lookup
//! events that name the tier that served each block.
//!
//! [`Tiers`] owns them: the RAM tier ([`ram::Ram`]), the disk tier with its write queue
//! ([`writes::DiskStore`]) and the pins ([`pins::Pins`]). Each tier type has its own `put` (RAM's is
//! admission under the policy; the disk's a queued write, lossy or waited for) and answers lookups through
//! [`CacheTier`]: whether it holds a block (no side effects), a request recorded in its replacement policy,
//! and a read (verified by the tier: a damaged block is a miss). A lookup asks the RAM tier first (the hot
//! path, [`BlockCache::ram_hit`]), then the blocks queued for the disk writers, then every slower tier in
//! order, and promotes what a slower tier served into RAM.

pub(crate) mod pins;
pub(crate) mod ram;
pub(crate) mod writes;

use crate::budget::Budget;
use crate::config::CacheConfig;
use crate::disk::DiskTier;
use crate::fill::FillMode;
use crate::pool::BlockPool;
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use ram::Ram;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime};
use tokio::sync::oneshot;
use tokio_util::task::TaskTracker;

use strata_types::{BlockKey, IoContext, IoEvent, ObjectId, Op, Outcome, Result, Tier};

use crate::policy::{Digest, Policy};
use crate::state::{BlockCache, percent};
use pins::{PinSpec, Pins};
use writes::{DiskStore, WriteMode, Written};

/// The tiers and the pins.
pub(crate) struct Tiers {
    ram: Ram,
    disk: Option<DiskStore>,
    pins: Pins,
}

impl Tiers {
    /// Open the tiers `cfg` describes: the disk tier (re-indexed) with its writers tracked by `tasks`, and
    /// the pins saved in its directory, applied to the blocks it holds.
    pub(crate) fn open(cfg: &CacheConfig, budget: &Budget, tasks: &TaskTracker) -> Result<Self> {
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
        let ram = Ram::new(Policy::new(
            cfg.policy,
            cfg.ram_capacity.bytes(),
            ram_pin_cap,
            (cfg.ram_capacity.bytes() / bs).max(16) as usize,
        ));
        let pins = Pins::load(cfg.disk.as_ref().map(|d| d.dir.join("pins.json")));
        let disk = disk.map(|tier| {
            for p in pins.all() {
                tier.pin_matching(|k| p.matches(k));
            }
            DiskStore::start(tier, cfg.disk_write_queue, budget.clone(), tasks)
        });
        Ok(Self { ram, disk, pins })
    }

    pub(crate) fn ram(&self) -> &Ram {
        &self.ram
    }

    /// The disk tier, if there is one.
    pub(crate) fn disk(&self) -> Option<&Arc<DiskTier>> {
        self.disk.as_ref().map(DiskStore::tier)
    }

    pub(crate) fn has_disk(&self) -> bool {
        self.disk.is_some()
    }

    pub(crate) fn pins(&self) -> &Pins {
        &self.pins
    }

    /// A block in RAM or queued for the disk writers (in memory either way), with no policy side effects.
    pub(crate) fn in_memory(&self, d: &Digest) -> Option<Bytes> {
        self.ram
            .get(d)
            .or_else(|| self.disk.as_ref().and_then(|s| s.queued(d)))
    }

    /// Stop taking disk writes: the writers finish what is queued, then end.
    pub(crate) fn stop_writes(&self) {
        if let Some(s) = &self.disk {
            s.stop();
        }
    }

    /// Pin the blocks held that `spec` covers: (pinned, refused by the pinned-bytes cap).
    pub(crate) fn pin_blocks(&self, spec: &PinSpec) -> (u64, u64) {
        match self.disk() {
            Some(disk) => disk.pin_matching(|k| spec.matches(k)),
            None => self.ram.pin_matching(|k| spec.matches(k)),
        }
    }

    /// Unpin the blocks `gone` covered that no remaining pin covers.
    pub(crate) fn unpin_blocks(&self, gone: &[PinSpec]) {
        if gone.is_empty() {
            return;
        }
        let rest = self.pins.all();
        let release =
            |k: &BlockKey| gone.iter().any(|s| s.matches(k)) && !rest.iter().any(|p| p.matches(k));
        match self.disk() {
            Some(disk) => disk.unpin_matching(release),
            None => self.ram.unpin_matching(release),
        }
    }
}

/// One tier of the cache, as a lookup sees it.
pub(crate) trait CacheTier: Send + Sync {
    /// The tier named in lookup events and counters.
    fn kind(&self) -> Tier;
    /// Whether the tier holds the block now (no policy side effects).
    fn holds(&self, d: &Digest) -> bool;
    /// Record a request for the block in the tier's replacement policy (hit or miss).
    fn record_request(&self, d: &Digest);
    /// The block, verified, if the tier still holds it.
    fn read<'a>(
        &'a self,
        key: &'a BlockKey,
        d: &'a Digest,
        pool: &'a Arc<BlockPool>,
    ) -> BoxFuture<'a, Option<Bytes>>;
}

impl CacheTier for Ram {
    fn kind(&self) -> Tier {
        Tier::Ram
    }
    fn holds(&self, d: &Digest) -> bool {
        self.contains(d)
    }
    fn record_request(&self, d: &Digest) {
        Ram::record_request(self, d);
    }
    fn read<'a>(
        &'a self,
        _key: &'a BlockKey,
        d: &'a Digest,
        _pool: &'a Arc<BlockPool>,
    ) -> BoxFuture<'a, Option<Bytes>> {
        futures::future::ready(self.get(d)).boxed()
    }
}

impl CacheTier for Arc<DiskTier> {
    fn kind(&self) -> Tier {
        Tier::Disk
    }
    fn holds(&self, d: &Digest) -> bool {
        self.contains(d)
    }
    fn record_request(&self, d: &Digest) {
        DiskTier::record_request(self, d);
    }
    /// A file read and its crc32c check, on a blocking thread.
    fn read<'a>(
        &'a self,
        key: &'a BlockKey,
        d: &'a Digest,
        pool: &'a Arc<BlockPool>,
    ) -> BoxFuture<'a, Option<Bytes>> {
        let (disk, key, d, pool) = (self.clone(), key.clone(), *d, pool.clone());
        async move {
            tokio::task::spawn_blocking(move || disk.get(&key, &d, &pool))
                .await
                .ok()
                .flatten()
        }
        .boxed()
    }
}

impl BlockCache {
    pub(crate) fn emit_lookup(
        &self,
        ctx: &IoContext,
        id: &ObjectId,
        tier: Tier,
        bytes: u64,
        start: Instant,
    ) {
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
    pub(crate) fn ram_hit(
        &self,
        ctx: &IoContext,
        id: &ObjectId,
        d: &Digest,
        start: Instant,
    ) -> Option<Bytes> {
        let tiers = &self.inner.tiers;
        let b = tiers.ram.hit(d)?;
        self.inner.counters.ram_hits.fetch_add(1, Ordering::Relaxed);
        self.inner
            .counters
            .hit_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        if let Some(disk) = tiers.disk() {
            disk.record_request(d);
        }
        self.emit_lookup(ctx, id, Tier::Ram, b.len() as u64, start);
        Some(b)
    }

    /// Look a block up in RAM, then disk. Records the request in both tiers' policies.
    pub(crate) async fn lookup(
        &self,
        ctx: &IoContext,
        key: &BlockKey,
        d: &Digest,
    ) -> Option<Bytes> {
        let start = Instant::now();
        if let Some(b) = self.ram_hit(ctx, &key.object, d, start) {
            return Some(b);
        }
        // Filled, not kept in RAM, its disk write still queued: the queued bytes (in memory already).
        let queued = self.inner.tiers.disk.as_ref().and_then(|s| s.queued(d));
        if let Some(b) = queued {
            let c = &self.inner.counters;
            c.ram_hits.fetch_add(1, Ordering::Relaxed);
            c.hit_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            self.emit_lookup(ctx, &key.object, Tier::Ram, b.len() as u64, start);
            return Some(b);
        }
        self.inner.tiers.ram.record_request(d);
        let c = &self.inner.counters;
        for tier in self.slower_tiers() {
            tier.record_request(d);
            if !tier.holds(d) {
                continue;
            }
            if let Some(b) = tier.read(key, d, &self.inner.pool).await {
                match tier.kind() {
                    Tier::Disk => c.disk_hits.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
                c.hit_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
                self.insert_ram(key, *d, &b, false);
                self.emit_lookup(ctx, &key.object, tier.kind(), b.len() as u64, start);
                return Some(b);
            }
        }
        c.misses.fetch_add(1, Ordering::Relaxed);
        self.emit_lookup(ctx, &key.object, Tier::Miss, 0, start);
        None
    }

    /// A read served by a fill made for it (its readahead, its range's prefetch, a staged hint): a miss, since
    /// its bytes came from the backend, however early they were asked for.
    pub(crate) fn count_filled_read(&self, ctx: &IoContext, id: &ObjectId, len: u64) {
        let c = &self.inner.counters;
        c.misses.fetch_add(1, Ordering::Relaxed);
        c.miss_bytes.fetch_add(len, Ordering::Relaxed);
        self.emit_lookup(ctx, id, Tier::Miss, 0, Instant::now());
    }

    /// The tiers after RAM, fastest first.
    fn slower_tiers(&self) -> impl Iterator<Item = &dyn CacheTier> {
        self.inner
            .tiers
            .disk()
            .into_iter()
            .map(|d| d as &dyn CacheTier)
    }

    /// Put a block in the RAM tier (`force`: whatever the frequency filter says); counted.
    pub(crate) fn insert_ram(&self, key: &BlockKey, d: Digest, b: &Bytes, force: bool) {
        let tiers = &self.inner.tiers;
        // RAM pins only when there is no disk tier (otherwise the disk tier holds pinned data).
        let pin = !tiers.has_disk() && self.is_pinned(key);
        let a = tiers.ram.put(key, d, b, pin, force);
        let c = &self.inner.counters;
        c.ram_evictions.fetch_add(a.evicted, Ordering::Relaxed);
        if !a.kept {
            c.ram_rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queue a block for the disk tier. For warm-ups this waits for room in the queue and returns a receiver
    /// that fires once the block is on disk; otherwise a full queue drops the block (counted).
    pub(crate) async fn store_disk(
        &self,
        key: &BlockKey,
        d: Digest,
        data: &Bytes,
        mode: FillMode,
    ) -> Option<oneshot::Receiver<()>> {
        let store = self.inner.tiers.disk.as_ref()?;
        // A warm-up waits for its write (and is admitted whatever the policy says); a block this agent owns
        // in a cluster is admitted too (see [`Self::admit_forced`]), written as any fill's.
        let how = match mode {
            FillMode::Warm => WriteMode::Wait,
            _ => WriteMode::Lossy,
        };
        let pin = self.is_pinned(key);
        let force = self.admit_forced(key, mode);
        match store.put(key, d, data, pin, force, how).await {
            Written::Waiting(rx) => Some(rx),
            Written::Dropped => {
                self.inner
                    .counters
                    .writes_dropped
                    .fetch_add(1, Ordering::Relaxed);
                None
            }
            Written::Refused | Written::Queued => None,
        }
    }

    pub(crate) fn is_pinned(&self, key: &BlockKey) -> bool {
        self.inner.tiers.pins.covers(key)
    }

    /// Whether a warm-up is done with a block it has fetched: its file is in place (when there is a disk tier,
    /// since warm-ups are meant to survive restarts; a write of it in flight, by any fill, is waited for) or
    /// it is in RAM (when there is not). `false`: the warm-up writes it.
    pub(crate) async fn warm_settled(&self, d: &Digest) -> bool {
        match self.inner.tiers.disk() {
            Some(disk) => disk.settled(d).await,
            None => self.inner.tiers.ram.contains(d),
        }
    }

    /// Whether the last tier (disk, else RAM) holds the block complete, not merely reserved for a write.
    pub(crate) fn holds_ready(&self, d: &Digest) -> bool {
        match self.inner.tiers.disk() {
            Some(disk) => disk.is_ready(d),
            None => self.inner.tiers.ram.contains(d),
        }
    }

    /// Whether the disk tier holds the block and the RAM tier does not (no policy side effects).
    pub(crate) fn disk_only(&self, d: &Digest) -> bool {
        let tiers = &self.inner.tiers;
        tiers.disk().is_some_and(|t| t.contains(d)) && !tiers.ram.contains(d)
    }

    /// Whether a block is held by any tier (no policy side effects).
    pub(crate) fn holds(&self, d: &Digest) -> bool {
        let tiers = &self.inner.tiers;
        tiers.ram.contains(d) || tiers.disk().is_some_and(|t| t.contains(d))
    }
}
