//! The cache's composition: the [`BlockCache`] handle and its `Inner`, one field per owner of a part of the
//! state (each keeps its own fields private: the budget in `budget`, the tiers and pins in `tier`, fills in
//! flight in `fill`, the metadata cache in `meta`, staged hints in `stage`, counters in `stats`), and object
//! versions ([`ObjState`]).

use crate::budget::Budget;
use crate::config::CacheConfig;
use crate::fill::Flights;
use crate::meta::MetaCache;
use crate::peer::PeerSource;
use crate::policy::Digest;
use crate::pool::BlockPool;
use crate::stage::Staged;
use crate::tier::Tiers;
use parking_lot::Mutex;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use strata_object::Backend;
use strata_telemetry::Telemetry;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use strata_types::{BlockKey, ObjectId, ObjectMeta};

use crate::stats::{ByJob, Counters};

pub(crate) struct Inner {
    pub(crate) cfg: CacheConfig,
    pub(crate) telemetry: Arc<Telemetry>,
    /// Every reservation of memory for bytes on their way in ([`crate::budget`]).
    pub(crate) budget: Budget,
    /// Freed block buffers, reused by fills and disk reads (bounded by the unused budget).
    pub(crate) pool: Arc<BlockPool>,
    /// RAM, disk (with its write queue) and pins ([`crate::tier`]).
    pub(crate) tiers: Tiers,
    /// Fills in flight: single-flight by block, counted by job ([`crate::fill`]).
    pub(crate) flights: Flights,
    /// Object versions by backend and key, HEADs in flight, refreshes ([`crate::meta`]).
    pub(crate) meta: MetaCache,
    /// Blocks fetched for prefetch hints, held until read ([`crate::stage`]).
    pub(crate) staged: Mutex<Staged>,
    pub(crate) counters: Counters,
    /// Origin and peer bytes by job and dataset ([`crate::stats::JobIo`]).
    pub(crate) by_job: Mutex<ByJob>,
    /// The other agents of the cluster, once the cache has joined one ([`crate::peer`]).
    pub(crate) peers: OnceLock<Arc<dyn PeerSource>>,
    pub(crate) tasks: TaskTracker,
    pub(crate) cancel: CancellationToken,
}

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
