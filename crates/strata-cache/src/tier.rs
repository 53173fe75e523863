//! The tiers a block is looked up in, fastest first (RAM, then disk), admission into them, and the lookup
//! events that name the tier that served each block.
//!
//! A tier is a [`CacheTier`]: it says whether it holds a block (no side effects), records a request in its
//! replacement policy, and reads a block (verified by the tier: a damaged block is a miss). A lookup asks the
//! RAM tier first (the hot path, [`BlockCache::ram_hit`]), then every slower tier in order, and promotes what a
//! slower tier served into RAM. A peer tier (the blocks other agents of a job hold) is one more
//! implementation, after the disk.

use crate::prelude::*;
use crate::state::*;

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

impl CacheTier for Mutex<RamTier> {
    fn kind(&self) -> Tier {
        Tier::Ram
    }
    fn holds(&self, d: &Digest) -> bool {
        self.lock().map.contains_key(d)
    }
    fn record_request(&self, d: &Digest) {
        self.lock().policy.record_request(d);
    }
    fn read<'a>(
        &'a self,
        _key: &'a BlockKey,
        d: &'a Digest,
        _pool: &'a Arc<BlockPool>,
    ) -> BoxFuture<'a, Option<Bytes>> {
        let b = self.lock().map.get(d).map(|(_, b)| b.clone());
        futures::future::ready(b).boxed()
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
        let b = {
            let mut ram = self.inner.ram.lock();
            let b = ram.map.get(d)?.1.clone();
            ram.policy.record_request(d);
            b
        };
        self.inner.counters.ram_hits.fetch_add(1, Ordering::Relaxed);
        self.inner
            .counters
            .hit_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        if let Some(disk) = &self.inner.disk {
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
        let queued = self.inner.queued.lock().get(d).cloned();
        if let Some(b) = queued {
            let c = &self.inner.counters;
            c.ram_hits.fetch_add(1, Ordering::Relaxed);
            c.hit_bytes.fetch_add(b.len() as u64, Ordering::Relaxed);
            self.emit_lookup(ctx, &key.object, Tier::Ram, b.len() as u64, start);
            return Some(b);
        }
        self.inner.ram.record_request(d);
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
        self.inner.disk.iter().map(|d| d as &dyn CacheTier)
    }

    pub(crate) fn insert_ram(&self, key: &BlockKey, d: Digest, b: &Bytes, force: bool) {
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

    pub(crate) fn is_pinned(&self, key: &BlockKey) -> bool {
        self.inner.pins.read().iter().any(|p| p.matches(key))
    }

    /// Whether a warm-up is done with a block it has fetched: its file is in place (when there is a disk tier,
    /// since warm-ups are meant to survive restarts; a write of it in flight, by any fill, is waited for) or
    /// it is in RAM (when there is not). `false`: the warm-up writes it.
    pub(crate) async fn warm_settled(&self, d: &Digest) -> bool {
        match &self.inner.disk {
            Some(disk) => disk.settled(d).await,
            None => self.inner.ram.lock().map.contains_key(d),
        }
    }

    /// Whether the last tier (disk, else RAM) holds the block complete, not merely reserved for a write.
    pub(crate) fn holds_ready(&self, d: &Digest) -> bool {
        match &self.inner.disk {
            Some(disk) => disk.is_ready(d),
            None => self.inner.ram.lock().map.contains_key(d),
        }
    }

    /// Whether the disk tier holds the block and the RAM tier does not (no policy side effects).
    pub(crate) fn disk_only(&self, d: &Digest) -> bool {
        self.inner.disk.as_ref().is_some_and(|t| t.contains(d))
            && !self.inner.ram.lock().map.contains_key(d)
    }

    /// Whether a block is held by any tier (no policy side effects).
    pub(crate) fn holds(&self, d: &Digest) -> bool {
        self.inner.ram.lock().map.contains_key(d)
            || self.inner.disk.as_ref().is_some_and(|t| t.contains(d))
    }
}
