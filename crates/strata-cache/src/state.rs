//! The cache's shared state, as plain data: the [`BlockCache`] handle and its `Inner` (configuration, tiers,
//! in-flight map, budget, pins, counters, the metadata map), object versions ([`ObjState`]) and the metadata
//! map's entries. Behaviour lives in the rooms that use it (`meta`, `tier`, `fill`, `reader`, `warm`,
//! `stats`); this file imports none of them.

use crate::prelude::*;

/// Budget accounting unit (the semaphore counts KiB so that a terabyte budget fits in `u32` permits).
pub(crate) const UNIT: u64 = 1024;

/// Blocks an ordinary (lossy) fill may leave queued for the disk writers without holding budget. Past them a
/// queued block holds in-flight budget until it is written (at most half the budget, [`Inner::spill`]); when
/// there is none, or the queue is full, it is dropped (counted in `writes_dropped`). Warm-ups wait for room in
/// the whole queue instead.
pub(crate) const LOSSY_QUEUE_MAX: usize = 8;

pub(crate) type SharedFetch = Shared<BoxFuture<'static, Result<Bytes>>>;

/// A response body from a backend.
pub(crate) type ByteStream = futures::stream::BoxStream<'static, Result<Bytes>>;

/// A pinned prefix of one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinSpec {
    /// Canonical backend id.
    pub backend: String,
    /// Key prefix.
    pub prefix: String,
    /// The member of the cluster whose pin this is, kept here for the blocks this agent owns; none: this
    /// agent's own pin ([`BlockCache::set_member_pins`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

impl PinSpec {
    pub(crate) fn matches(&self, k: &BlockKey) -> bool {
        *k.object.backend == *self.backend && k.object.key.starts_with(&self.prefix)
    }
}

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

#[derive(Debug)]
pub(crate) struct RamTier {
    pub(crate) policy: Policy,
    pub(crate) map: DigestMap<(BlockKey, Bytes)>,
}

#[derive(Debug)]
pub(crate) struct DiskJob {
    pub(crate) key: BlockKey,
    pub(crate) digest: Digest,
    pub(crate) data: Bytes,
    pub(crate) done: Option<oneshot::Sender<()>>,
    /// Written with `O_DIRECT` ([`crate::disk::DiskTier::write`]): every fill's but a warm-up's.
    pub(crate) direct: bool,
    /// Budget held until the block is written (a lossy write queued past [`LOSSY_QUEUE_MAX`]).
    pub(crate) _held: Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)>,
}

/// How a fill treats admission and the disk queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FillMode {
    /// A reader's fill (demand, prefetch, readahead, an open's first bytes): the caller holds the budget, if
    /// any; normal admission; lossy disk write.
    Readahead,
    /// Explicit warm-up: wait for budget; forced disk admission; wait for the disk write.
    Warm,
    /// A block another agent asked for ([`crate::peer`]): as `Readahead`, but read from the origin only,
    /// never asked of a peer in turn.
    Peer,
}

/// A team and a job (`""`: no team).
pub(crate) type TeamJob = (Arc<str>, Arc<str>);

pub(crate) struct Inner {
    pub(crate) cfg: CacheConfig,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) ram: Mutex<RamTier>,
    pub(crate) disk: Option<Arc<DiskTier>>,
    pub(crate) inflight: Mutex<DigestMap<SharedFetch>>,
    pub(crate) budget: Arc<Semaphore>,
    pub(crate) budget_units: u64,
    /// Half the budget: the most that blocks queued for the disk writers may hold of it.
    pub(crate) spill: Arc<Semaphore>,
    /// Freed block buffers, reused by fills and disk reads (bounded by the unused budget).
    pub(crate) pool: Arc<BlockPool>,
    pub(crate) pins: RwLock<Vec<PinSpec>>,
    pub(crate) pins_path: Option<PathBuf>,
    pub(crate) counters: Counters,
    pub(crate) disk_tx: Mutex<Option<mpsc::Sender<DiskJob>>>,
    /// Blocks queued for the disk writers and not written yet (the bytes the queued job holds anyway): a
    /// lookup finds them here, so a block the RAM tier did not keep is not read from the backend again while
    /// its disk write waits.
    pub(crate) queued: Mutex<HashMap<Digest, Bytes>>,
    /// Fills in flight per (team, job) ([`crate::BlockCache::job_fills`]).
    pub(crate) job_fills: Mutex<HashMap<TeamJob, usize>>,
    pub(crate) tasks: TaskTracker,
    pub(crate) cancel: CancellationToken,
    pub(crate) meta: Mutex<MetaMap>,
    /// HEADs in flight, by backend id and key, joined by opens of the same key (`meta.rs`).
    pub(crate) heads: Mutex<FastMap<(Arc<str>, String), HeadFlight>>,
    pub(crate) refreshes: Arc<Semaphore>,
    /// Blocks fetched for prefetch hints, held until read (`stage.rs`).
    pub(crate) staged: Mutex<crate::stage::Staged>,
    /// Origin and peer bytes by job and dataset ([`crate::stats::JobIo`]).
    pub(crate) by_job: Mutex<crate::stats::ByJob>,
    /// The other agents of the cluster, once the cache has joined one ([`crate::peer`]).
    pub(crate) peers: std::sync::OnceLock<Arc<dyn crate::peer::PeerSource>>,
    /// The metadata cache's clock ([`crate::clock`]).
    pub(crate) clock: Arc<dyn crate::Clock>,
}

/// Object metadata by backend id, then key: looked up by `&str`, so a hit allocates nothing.
///
/// **Answers older than an invalidation are not remembered.** Every invalidation bumps `generation` and is
/// kept in `recent` (the last [`RECENT_MAX`]) with when it came; an open notes the generation before it asks
/// and remembers the answer only if nothing it covers was invalidated since ([`MetaMap::admits`]): a HEAD sent
/// before a write (here or, told by the cluster, at another agent) never brings the old version back after it.
/// An answer from another agent (the key's metadata owner, see `peer.rs`) may be older than the question:
/// it is admitted only if nothing it covers was invalidated here since the version was *confirmed* (the
/// HEAD that read it was sent), which its age says. The owner may not have heard of a write this agent has
/// (announcements reach members in no particular order), and its answer must not outlive that write here.
///
/// **The lease.** In a cluster, metadata is trusted only until `lease` (the cluster renews it while every
/// member is in contact, see `strata-server`'s `cluster::coherence`): past it nothing is served from or added
/// to the map, and the first look after the lapse drops every entry.
pub(crate) struct MetaMap {
    /// The time every instant here is read from ([`crate::clock`]).
    pub(crate) clock: Arc<dyn crate::Clock>,
    pub(crate) by_backend: FastMap<Arc<str>, BackendMeta>,
    pub(crate) len: usize,
    pub(crate) generation: u64,
    pub(crate) recent: std::collections::VecDeque<(u64, Arc<str>, Invalidation, Instant)>,
    /// Lookups that started at or before this generation are not remembered (what they could have missed is
    /// no longer in `recent`, or every entry was dropped).
    pub(crate) floor: u64,
    /// The same in time: versions confirmed at or before it are not remembered.
    pub(crate) floor_at: Option<Instant>,
    pub(crate) lease: Option<Instant>,
}

impl MetaMap {
    pub(crate) fn new(clock: Arc<dyn crate::Clock>) -> Self {
        Self {
            clock,
            by_backend: FastMap::default(),
            len: 0,
            generation: 0,
            recent: std::collections::VecDeque::new(),
            floor: 0,
            floor_at: None,
            lease: None,
        }
    }
}

/// Invalidations kept to refuse answers that started before them.
pub(crate) const RECENT_MAX: usize = 1024;

pub use strata_api::cache::Invalidation;

/// What is known of one backend's objects.
#[derive(Default)]
pub(crate) struct BackendMeta {
    pub(crate) entries: FastMap<String, MetaEntry>,
    /// Entries per directory (see [`dir_of`]): how a due refresh chooses between a HEAD and a listing.
    pub(crate) dirs: FastMap<String, u32>,
    /// Directories with a refresh listing in flight; the receiver sees its sender dropped when the listing's
    /// task ends (done, failed or cancelled), which is what an open waiting for it waits on.
    pub(crate) listing: FastMap<String, tokio::sync::watch::Receiver<()>>,
    /// Directories whose refresh listing stopped at its limit before covering them (a small directory
    /// with a large subtree): their entries are refreshed one HEAD each.
    pub(crate) sparse: FastSet<String>,
}

/// A map keyed by strings on a hot path: foldhash (seeded per process) instead of SipHash.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub(crate) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// The directory of a key: everything up to and including its last `/` (`""` at the root).
pub(crate) fn dir_of(key: &str) -> &str {
    &key[..key.rfind('/').map_or(0, |i| i + 1)]
}

impl MetaMap {
    pub(crate) fn get_mut(&mut self, backend: &str, key: &str) -> Option<&mut MetaEntry> {
        self.by_backend.get_mut(backend)?.entries.get_mut(key)
    }

    pub(crate) fn contains(&self, backend: &str, key: &str) -> bool {
        self.by_backend
            .get(backend)
            .is_some_and(|m| m.entries.contains_key(key))
    }

    pub(crate) fn remove(&mut self, backend: &str, key: &str) {
        if let Some(m) = self.by_backend.get_mut(backend)
            && m.remove(key)
        {
            self.len -= 1;
        }
    }

    /// Forget what `what` covers in `backend`, and refuse answers to lookups started before now.
    pub(crate) fn invalidate(&mut self, backend: &str, what: Invalidation) {
        match &what {
            Invalidation::Key(k) => self.remove(backend, k),
            Invalidation::Prefix(p) => {
                if let Some(m) = self.by_backend.get_mut(backend) {
                    let gone: Vec<String> = m
                        .entries
                        .keys()
                        .filter(|k| k.starts_with(p.as_str()))
                        .cloned()
                        .collect();
                    for k in gone {
                        if m.remove(&k) {
                            self.len -= 1;
                        }
                    }
                }
            }
        }
        self.generation += 1;
        if self.recent.len() >= RECENT_MAX
            && let Some((g, _, _, at)) = self.recent.pop_front()
        {
            self.floor = self.floor.max(g);
            self.floor_at = Some(self.floor_at.map_or(at, |f| f.max(at)));
        }
        let b = self
            .by_backend
            .get_key_value(backend)
            .map_or_else(|| Arc::from(backend), |(k, _)| k.clone());
        self.recent
            .push_back((self.generation, b, what, self.clock.now()));
    }

    /// Drop every entry, and refuse answers to lookups started before now.
    pub(crate) fn drop_all(&mut self) {
        self.by_backend.clear();
        self.len = 0;
        self.generation += 1;
        self.floor = self.generation;
        self.floor_at = Some(self.clock.now());
        self.recent.clear();
    }

    /// Whether the lease has run out (never without one).
    pub(crate) fn lapsed(&self) -> bool {
        self.lease.is_some_and(|u| self.clock.now() >= u)
    }

    /// Whether an answer about `key` of `backend` to a lookup that started at generation `since`, for a
    /// version confirmed at `confirmed` (when the request that read it at the backend was sent, here or at
    /// another agent), may be remembered: nothing covering it was invalidated since either, and the lease
    /// holds.
    pub(crate) fn admits(&self, backend: &str, key: &str, since: u64, confirmed: Instant) -> bool {
        if since < self.floor || self.lapsed() || self.floor_at.is_some_and(|f| confirmed <= f) {
            return false;
        }
        self.recent
            .iter()
            .rev()
            .take_while(|(g, _, _, at)| *g > since || *at >= confirmed)
            .all(|(_, b, what, _)| &**b != backend || !what.covers(key))
    }

    pub(crate) fn insert(&mut self, backend: &Arc<str>, key: &str, e: MetaEntry) {
        if self.len >= META_MAX {
            // A bound, not a policy: the entries go, what they were refused for stays.
            self.by_backend.clear();
            self.len = 0;
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
    pub(crate) fn remove(&mut self, key: &str) -> bool {
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

/// A HEAD in flight: opens of its key that start while it runs join it, unless the key was invalidated after
/// it started ([`MetaMap::admits`] of `since`) or they read through other credentials.
pub(crate) struct HeadFlight {
    pub(crate) since: u64,
    /// When it was sent: what it answers was confirmed then.
    pub(crate) started: Instant,
    pub(crate) backend: Backend,
    pub(crate) fut: Shared<BoxFuture<'static, Result<ObjectMeta>>>,
}

/// HEADs in flight kept at most (past it, finished flights nobody removed are dropped).
pub(crate) const HEADS_MAX: usize = 4_096;

/// What is known of an object's version, and when it was learned. The version's [`ObjState`] is kept with
/// it, so that opening an object whose metadata is fresh builds nothing (and its first block's digest is
/// computed once per version, not per read).
pub(crate) struct MetaEntry {
    pub(crate) obj: Arc<ObjState>,
    pub(crate) at: Instant,
    /// Where in the TTL an open starts a background refresh: a random point of [1/2, 3/4), so that objects
    /// learned together (a listing, a burst of first reads) are not all revalidated at the same moment.
    pub(crate) refresh_at: f32,
    /// A background refresh of this entry is running.
    pub(crate) refreshing: bool,
}

impl MetaEntry {
    /// An entry for a version confirmed current at `at` (when the request that read it was sent, here or at
    /// the agent that owns its metadata): its TTL counts from then.
    pub(crate) fn confirmed(obj: Arc<ObjState>, at: Instant) -> Self {
        Self {
            obj,
            at,
            refresh_at: 0.5 + rand::random::<f32>() / 4.0,
            refreshing: false,
        }
    }

    /// The version was confirmed current at `at`.
    pub(crate) fn renew(&mut self, at: Instant) {
        self.at = at;
        self.refresh_at = 0.5 + rand::random::<f32>() / 4.0;
        self.refreshing = false;
    }
}

/// Whether a listing can confirm this version: listings carry no version ids, and an entry without an ETag
/// has nothing to compare beyond size and time.
pub(crate) fn listing_confirms(meta: &ObjectMeta) -> bool {
    meta.version.is_none() && meta.etag.is_some()
}

/// Whether a listed object is the version an entry holds.
pub(crate) fn same_version(held: &ObjectMeta, listed: &ObjectMeta) -> bool {
    held.etag.is_some()
        && held.etag == listed.etag
        && held.size == listed.size
        && held.last_modified_unix == listed.last_modified_unix
}

/// The key range of a directory for [`Backend::list_span`]: after the directory's name without its last
/// `/` (less than every key under it), before the name with that `/` replaced by the next byte, `0`
/// (the end of the key space for the root).
pub(crate) fn dir_span(dir: &str) -> (&str, Option<String>) {
    match dir.strip_suffix('/') {
        Some(name) => (name, Some(format!("{name}0"))),
        None => ("", None),
    }
}

/// Background metadata refreshes running at once, at most (past this, entries simply expire).
pub(crate) const META_REFRESH_MAX: usize = 16;

/// Entries of one directory from which a due refresh lists the directory (renewing every entry the listing
/// confirms) instead of sending a HEAD for the one key: 2,000 hot keys of a directory cost two LIST pages per
/// refresh cycle instead of 2,000 HEADs.
pub(crate) const META_LIST_MIN: u32 = 16;

/// A refresh listing reads at most this many objects per entry of its directory (at least one S3 page):
/// a directory with a few cached keys over a large subtree is not listed whole.
pub(crate) const META_LIST_PER_ENTRY: usize = 8;

/// Objects an open that revalidates an expired entry by a listing lists from its key (one S3 page).
pub(crate) const META_LIST_WINDOW: usize = 1_000;

/// Most metadata entries kept (the map is cleared when it fills).
pub(crate) const META_MAX: usize = 100_000;

/// The tiered block cache. Cheap to clone; all clones share one cache.
#[derive(Clone)]
pub struct BlockCache {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockCache")
            .field("cfg", &self.inner.cfg)
            .finish()
    }
}

pub(crate) fn percent(v: u64, pct: u64) -> u64 {
    (v as u128 * pct as u128 / 100) as u64
}

pub(crate) fn units(bytes: u64) -> u32 {
    bytes.div_ceil(UNIT).max(1).min(u32::MAX as u64) as u32
}

#[derive(Debug)]
pub(crate) struct ObjState {
    pub(crate) backend: Backend,
    pub(crate) meta: ObjectMeta,
    pub(crate) id: ObjectId,
    /// The digest of block 0, once computed (most objects read small are one block).
    pub(crate) first_digest: std::sync::OnceLock<Digest>,
    /// When a read of this version was last noted ([`CachedObject::mark_read`]), `i64::MIN` if never.
    pub(crate) read_at: std::sync::atomic::AtomicI64,
}

impl ObjState {
    pub(crate) fn new(backend: &Backend, meta: ObjectMeta) -> Self {
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
    pub(crate) fn mark_read(&self, at: i64, resolution: i64) -> bool {
        let last = self.read_at.load(Ordering::Relaxed);
        if last != i64::MIN && at >= last && at - last < resolution {
            return false;
        }
        self.read_at
            .compare_exchange(last, at, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    pub(crate) fn digest(&self, index: u64) -> Digest {
        let compute = || BlockKey::new(self.id.clone(), index).digest();
        match index {
            0 => *self.first_digest.get_or_init(compute),
            _ => compute(),
        }
    }
}
