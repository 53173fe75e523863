//! Opening an object: the metadata cache (TTL, refresh-ahead by HEAD or by one listing of a busy directory,
//! revalidation of expired entries by a listing window), opens that learn the version from a GET of the
//! object's start, and invalidation by writers.

mod map;

use crate::config::LOCAL_METADATA_TTL_MAX_MS;
use crate::fill::FillMode;
use crate::meta::map::FastMap;
use crate::meta::map::HEADS_MAX;
use crate::meta::map::HeadFlight;
use crate::meta::map::META_LIST_MIN;
use crate::meta::map::META_LIST_PER_ENTRY;
use crate::meta::map::META_LIST_WINDOW;
use crate::meta::map::META_REFRESH_MAX;
use crate::meta::map::MetaEntry;
use crate::meta::map::MetaMap;
use crate::meta::map::dir_of;
use crate::meta::map::dir_span;
use crate::meta::map::listing_confirms;
use crate::meta::map::same_version;
use crate::reader::CachedObject;
use crate::reader::Readahead;
use crate::state::BlockCache;
use crate::state::ObjState;
use futures::FutureExt;
pub use map::Invalidation;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use strata_object::Backend;
use strata_types::Error;
use strata_types::ErrorKind;
use strata_types::IoContext;
use strata_types::ObjectMeta;
use strata_types::Result;

/// The metadata cache: the map, the HEADs in flight (joined by opens of the same key), the bound on
/// background refreshes, and the clock every instant of it is read from. Its fields are this module's alone.
pub(crate) struct MetaCache {
    map: Mutex<MetaMap>,
    /// HEADs in flight, by backend id and key.
    heads: Mutex<FastMap<(Arc<str>, String), HeadFlight>>,
    /// Background refreshes running ([`RefreshSlot`]).
    refreshes: Arc<std::sync::atomic::AtomicUsize>,
    clock: Arc<dyn crate::Clock>,
}

/// A background refresh running, counted against [`META_REFRESH_MAX`] until dropped.
pub(crate) struct RefreshSlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for RefreshSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl MetaCache {
    /// A slot for one more background refresh, if fewer than [`META_REFRESH_MAX`] run.
    fn refresh_slot(&self) -> Option<RefreshSlot> {
        self.refreshes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < META_REFRESH_MAX).then_some(n + 1)
            })
            .ok()?;
        Some(RefreshSlot(self.refreshes.clone()))
    }

    pub(crate) fn new(clock: Arc<dyn crate::Clock>) -> Self {
        Self {
            map: Mutex::new(MetaMap::new(clock.clone())),
            heads: Mutex::new(FastMap::default()),
            refreshes: Arc::default(),
            clock,
        }
    }
}

impl BlockCache {
    /// Now, on the metadata cache's clock ([`crate::clock`]).
    pub(crate) fn now(&self) -> Instant {
        self.inner.meta.clock.now()
    }

    /// How long ago `at` was, on that clock.
    pub(crate) fn since(&self, at: Instant) -> std::time::Duration {
        self.now().saturating_duration_since(at)
    }

    /// Look up the object's current version at the backend (or in the metadata cache, within
    /// `metadata_ttl_ms`) and return a reader for it.
    pub(crate) async fn open_object(
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
        let since = self.meta_generation();
        let (meta, confirmed) = self.lookup_meta(ctx, backend, key).await?;
        let obj = Arc::new(ObjState::new(backend, meta));
        self.remember(&obj, since, confirmed);
        Ok(self.object_from_state(ctx, obj))
    }

    /// The object's current version for an open or a refresh that found nothing fresh here, and when it was
    /// confirmed (when the HEAD that read it was sent): in a cluster, from the agent that owns the key's
    /// metadata ([`crate::peer::PeerSource::head`]: one HEAD per object per cluster and TTL, however many
    /// agents open it), confirmed at the latest its age before it was asked; else, or when that agent does
    /// not answer, by a HEAD from here ([`Self::head_once`]).
    pub(crate) async fn lookup_meta(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
    ) -> Result<(ObjectMeta, Instant)> {
        if !self.metadata_ttl(backend).is_zero()
            && let Some(peers) = self.peers()
        {
            let asked = self.now();
            let answer = peers.head(ctx, backend, key).await;
            let c = &self.inner.counters;
            match answer {
                Some(Ok((meta, age))) => {
                    if let Some(confirmed) = asked.checked_sub(age) {
                        c.meta_from_peers.fetch_add(1, Ordering::Relaxed);
                        return Ok((meta, confirmed));
                    }
                }
                Some(Err(e)) => {
                    c.meta_from_peers.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
                None => {}
            }
        }
        self.head_once(ctx, backend, key).await
    }

    /// A HEAD of `key`, joining one of the same key already in flight when that one started after the key's
    /// last invalidation and reads through the same credentials: a burst of opens of one object (every
    /// reader of an epoch's first shard, every agent asking the key's metadata owner) costs one HEAD. With a
    /// metadata TTL of 0 every open sends its own (it must see a write that finished before it began).
    pub(crate) async fn head_once(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
    ) -> Result<(ObjectMeta, Instant)> {
        let c = &self.inner.counters;
        if self.metadata_ttl(backend).is_zero() {
            c.meta_heads.fetch_add(1, Ordering::Relaxed);
            let sent = self.now();
            return Ok((backend.head(ctx, key).await?, sent));
        }
        let at = (backend.id().clone(), key.to_string());
        let fut = {
            let since = self.meta_generation();
            let mut heads = self.inner.meta.heads.lock();
            let joined = heads
                .get(&at)
                .filter(|f| {
                    f.fut.peek().is_none()
                        && f.backend.same(backend)
                        && self
                            .inner
                            .meta
                            .map
                            .lock()
                            .admits(backend.id(), key, f.since, f.started)
                })
                .map(|f| (f.fut.clone(), f.started));
            match joined {
                Some(f) => {
                    c.joins.fetch_add(1, Ordering::Relaxed);
                    f
                }
                None => {
                    if heads.len() >= HEADS_MAX {
                        heads.retain(|_, f| f.fut.peek().is_none());
                    }
                    c.meta_heads.fetch_add(1, Ordering::Relaxed);
                    let (b, cx, k) = (backend.clone(), ctx.clone(), key.to_string());
                    let fut = async move { b.head(&cx, &k).await }.boxed().shared();
                    let started = self.now();
                    heads.insert(
                        at.clone(),
                        HeadFlight {
                            since,
                            started,
                            backend: backend.clone(),
                            fut: fut.clone(),
                        },
                    );
                    (fut, started)
                }
            }
        };
        let (fut, started) = fut;
        let r = fut.clone().await;
        let mut heads = self.inner.meta.heads.lock();
        if heads.get(&at).is_some_and(|f| f.fut.ptr_eq(&fut)) {
            heads.remove(&at);
        }
        r.map(|meta| (meta, started))
    }

    /// The metadata of `key` for another agent of the cluster, which asked this one because it owns the key's
    /// metadata, and how long ago it was confirmed (the HEAD that read it was sent): the entry here while it is
    /// before its refresh point, else a HEAD (joining one in flight) whose answer is remembered; `None` if the
    /// backend has no such object. Never asked of a peer in turn.
    pub async fn serve_peer_head(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
    ) -> Result<Option<(ObjectMeta, std::time::Duration)>> {
        self.inner
            .counters
            .meta_served
            .fetch_add(1, Ordering::Relaxed);
        let ttl = self.metadata_ttl(backend);
        if !ttl.is_zero() {
            let m = self.inner.meta.map.lock();
            if !m.lapsed()
                && let Some(e) = m
                    .by_backend
                    .get(&**backend.id())
                    .and_then(|bm| bm.entries.get(key))
                && self.since(e.at) < ttl.mul_f32(e.refresh_at)
            {
                return Ok(Some((e.obj.meta.clone(), self.since(e.at))));
            }
        }
        let since = self.meta_generation();
        match self.head_once(ctx, backend, key).await {
            Ok((meta, confirmed)) => {
                self.remember(
                    &Arc::new(ObjState::new(backend, meta.clone())),
                    since,
                    confirmed,
                );
                Ok(Some((meta, self.since(confirmed))))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// An expired entry of a directory with many known entries is revalidated by a listing, not a HEAD: the
    /// open lists a window of the directory from its key ([`META_LIST_WINDOW`] objects, one S3 page), or
    /// waits for the listing of the directory already in flight, and every entry the listing confirms is
    /// renewed. A client reading many keys in order after the TTL ran out (a second pass over a data set)
    /// costs one listing per thousand keys instead of a HEAD each. `None` (the caller sends a HEAD) when the
    /// directory does not qualify, no refresh slot is free, or the listing did not confirm the entry.
    pub(crate) async fn revalidate_by_listing(
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
                let mut m = self.inner.meta.map.lock();
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
                        let permit = self.inner.meta.refresh_slot()?;
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
    pub(crate) async fn open_object_reading(
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
        // In a cluster the first blocks may be another agent's to read from the origin: a HEAD, then blocks.
        if self.known_meta(backend, key) || self.peers().is_some() {
            return self.open_object(ctx, backend, key).await;
        }
        let cfg = &self.inner.cfg;
        let bs = cfg.block_size.bytes();
        let cap = self.max_run_blocks() * bs;
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
        let share = self
            .acquire_budget(len)
            .await
            .ok_or_else(|| Error::new(ErrorKind::Cancelled, "cache is shutting down"))?;
        let since = self.meta_generation();
        let sent = self.now();
        let (meta, stream) = match backend.get_head_stream(ctx, key, len).await {
            Ok(v) => v,
            // An empty object has no satisfiable range: fall back to HEAD.
            Err(e) if e.kind() == ErrorKind::InvalidInput => {
                return self.open_object(ctx, backend, key).await;
            }
            Err(e) => return Err(e),
        };
        let state = Arc::new(ObjState::new(backend, meta));
        self.remember(&state, since, sent);
        let obj = self.object_from_state(ctx, state);
        let size = obj.meta().size;
        // The response is the object's first `len` bytes, or all of it: whole blocks (`len` is a multiple of
        // the block size). They fill as one run fed by this response, each block handed to the reader as soon
        // as it has arrived; the budget taken for bytes the object does not have goes back now.
        let end = len.min(size);
        let nblocks = end.div_ceil(bs);
        let mut share = share;
        if end < len {
            drop(share.split_off(len - end));
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
        let shares = share.into_blocks((0..nblocks).map(|i| ((i + 1) * bs).min(size) - i * bs));
        let mut ra = obj.ra.lock();
        for (i, (f, share)) in (0u64..).zip(futs.into_iter().zip(shares)) {
            ra.prefetched.insert(i, (f, share));
        }
        drop(ra);
        Ok(obj)
    }

    /// How long `backend`'s metadata is trusted (see [`CacheConfig::metadata_ttl_ms`]).
    pub(crate) fn metadata_ttl(&self, backend: &Backend) -> std::time::Duration {
        let ms = match backend.scheme() {
            "file" => self
                .inner
                .cfg
                .metadata_ttl_ms
                .min(LOCAL_METADATA_TTL_MAX_MS),
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
    pub(crate) fn cached_state(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
    ) -> Option<Arc<ObjState>> {
        let ttl = self.metadata_ttl(backend);
        if ttl.is_zero() {
            return None;
        }
        let mut m = self.inner.meta.map.lock();
        if m.lapsed() {
            if m.len > 0 {
                m.drop_all();
            }
            return None;
        }
        let generation = m.generation;
        let bm = m.by_backend.get_mut(&**backend.id())?;
        let e = bm.entries.get_mut(key)?;
        let age = self.since(e.at);
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
        let Some(permit) = self.inner.meta.refresh_slot() else {
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
            let from = (e.at, generation);
            drop(m);
            self.refresh_meta(ctx.clone(), backend.clone(), key.to_string(), from, permit);
        }
        Some(obj)
    }

    /// Look `key` up again in the background ([`Self::lookup_meta`]) and renew its entry, unless the entry
    /// changed meanwhile (invalidated by a write, or replaced by a newer lookup) or the answer is older than
    /// a write seen here: a HEAD sent before a write must not bring the old version back. `from`: the entry's
    /// confirmation time and the map's generation when the refresh started.
    pub(crate) fn refresh_meta(
        &self,
        ctx: IoContext,
        backend: Backend,
        key: String,
        from: (Instant, u64),
        permit: RefreshSlot,
    ) {
        let cache = self.clone();
        self.inner.tasks.spawn(async move {
            let _permit = permit;
            let inner = &cache.inner;
            let got = tokio::select! {
                _ = inner.cancel.cancelled() => return,
                r = cache.lookup_meta(&ctx, &backend, &key) => r,
            };
            inner
                .counters
                .meta_refreshes
                .fetch_add(1, Ordering::Relaxed);
            let (from, since) = from;
            let mut m = inner.meta.map.lock();
            let current = match &got {
                Ok((_, confirmed)) => m.admits(backend.id(), &key, since, *confirmed),
                Err(_) => true,
            };
            let Some(e) = m.get_mut(backend.id(), &key).filter(|e| e.at == from) else {
                return;
            };
            match got {
                Ok((meta, confirmed)) if current => {
                    *e = MetaEntry::confirmed(Arc::new(ObjState::new(&backend, meta)), confirmed)
                }
                // Older than a write this agent has seen (the owner had not yet): the entry stays as it is.
                Ok(_) => e.refreshing = false,
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
    pub(crate) fn refresh_dir(
        &self,
        ctx: IoContext,
        backend: Backend,
        key: String,
        from: Option<String>,
        limit: usize,
        held: (RefreshSlot, tokio::sync::watch::Sender<()>),
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
            let started = inner.meta.clock.now();
            let got = tokio::select! {
                _ = inner.cancel.cancelled() => return,
                r = backend.list_span(&ctx, after, end.as_deref(), limit) => r,
            };
            let mut m = inner.meta.map.lock();
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
    pub(crate) fn known_meta(&self, backend: &Backend, key: &str) -> bool {
        self.inner.cfg.metadata_ttl_ms > 0 && self.inner.meta.map.lock().contains(backend.id(), key)
    }

    /// The metadata map's generation now: pass it to [`Self::remember`] with the answer of a lookup started
    /// after this call.
    pub(crate) fn meta_generation(&self) -> u64 {
        self.inner.meta.map.lock().generation
    }

    /// Remember `obj`'s version, learned by a lookup that started at generation `since` and confirmed at
    /// `confirmed` (when the request that read it was sent, here or at the agent that owns its metadata),
    /// unless something invalidated it since either (or the lease ran out): see [`MetaMap`]. Its TTL counts
    /// from `confirmed`, so metadata learned from another agent is never trusted longer than the TTL.
    pub(crate) fn remember(&self, obj: &Arc<ObjState>, since: u64, confirmed: Instant) {
        if self.inner.cfg.metadata_ttl_ms == 0
            || self.since(confirmed) >= self.metadata_ttl(&obj.backend)
        {
            return;
        }
        let mut m = self.inner.meta.map.lock();
        let ok = m.admits(obj.backend.id(), &obj.meta.key, since, confirmed);
        if ok {
            m.insert(
                obj.backend.id(),
                &obj.meta.key,
                MetaEntry::confirmed(obj.clone(), confirmed),
            );
        }
    }

    /// Forget what is known of `key`'s version: call after writing or deleting it, so the next open sees the
    /// change even with a metadata TTL (and a lookup already in flight does not bring the old one back).
    pub fn invalidate(&self, backend: &Backend, key: &str) {
        self.invalidate_in(backend.id(), Invalidation::Key(key.to_string()));
    }

    /// [`Self::invalidate`] by the backend's canonical id, for a key or every key under a prefix: what
    /// another agent of the cluster wrote or deleted.
    pub fn invalidate_in(&self, backend_id: &str, what: Invalidation) {
        self.inner.meta.map.lock().invalidate(backend_id, what);
    }

    /// Forget every version known, of every backend.
    pub fn invalidate_all(&self) {
        self.inner.meta.map.lock().drop_all();
    }

    /// Trust metadata only until `until` (`None`: for its TTL, as without a cluster). Past it, opens ask the
    /// backend and remember nothing; the first look after it, or the next call here, drops every entry, so
    /// nothing learned before a lapse is used after it. The cluster renews the lease while it is in contact
    /// with every member (`strata-server`'s `cluster::coherence`).
    pub fn set_metadata_lease(&self, until: Option<Instant>) {
        let mut m = self.inner.meta.map.lock();
        if m.lapsed() {
            m.drop_all();
        }
        m.lease = until;
    }

    /// Whether metadata is trusted now (the lease holds, or there is none).
    pub fn metadata_trusted(&self) -> bool {
        !self.inner.meta.map.lock().lapsed()
    }

    /// A reader for an object whose metadata the caller already has (from a listing, say).
    pub(crate) fn object_from_meta(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        meta: ObjectMeta,
    ) -> CachedObject {
        self.object_from_state(ctx, Arc::new(ObjState::new(backend, meta)))
    }

    pub(crate) fn object_from_state(&self, ctx: &IoContext, obj: Arc<ObjState>) -> CachedObject {
        CachedObject {
            cache: self.clone(),
            obj,
            ctx: ctx.clone(),
            ra: Mutex::new(Readahead::default()),
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
