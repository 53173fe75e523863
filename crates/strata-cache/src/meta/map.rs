//! The metadata map: what is known of each object's version, by backend and key, with the invalidations an
//! answer must not outlive and the cluster's lease. Its fields are the metadata cache's alone
//! ([`super::MetaCache`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::future::{BoxFuture, Shared};
use strata_object::Backend;
use strata_types::{ObjectMeta, Result};

use crate::state::ObjState;

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
pub(super) struct MetaMap {
    /// The time every instant here is read from ([`crate::clock`]).
    pub(super) clock: Arc<dyn crate::Clock>,
    pub(super) by_backend: FastMap<Arc<str>, BackendMeta>,
    pub(super) len: usize,
    pub(super) generation: u64,
    pub(super) recent: std::collections::VecDeque<(u64, Arc<str>, Invalidation, Instant)>,
    /// Lookups that started at or before this generation are not remembered (what they could have missed is
    /// no longer in `recent`, or every entry was dropped).
    pub(super) floor: u64,
    /// The same in time: versions confirmed at or before it are not remembered.
    pub(super) floor_at: Option<Instant>,
    pub(super) lease: Option<Instant>,
}

impl MetaMap {
    pub(super) fn new(clock: Arc<dyn crate::Clock>) -> Self {
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
pub(super) const RECENT_MAX: usize = 1024;

pub use strata_api::cache::Invalidation;

/// What is known of one backend's objects.
#[derive(Default)]
pub(super) struct BackendMeta {
    pub(super) entries: FastMap<String, MetaEntry>,
    /// Entries per directory (see [`dir_of`]): how a due refresh chooses between a HEAD and a listing.
    pub(super) dirs: FastMap<String, u32>,
    /// Directories with a refresh listing in flight; the receiver sees its sender dropped when the listing's
    /// task ends (done, failed or cancelled), which is what an open waiting for it waits on.
    pub(super) listing: FastMap<String, tokio::sync::watch::Receiver<()>>,
    /// Directories whose refresh listing stopped at its limit before covering them (a small directory
    /// with a large subtree): their entries are refreshed one HEAD each.
    pub(super) sparse: FastSet<String>,
}

/// A map keyed by strings on a hot path: foldhash (seeded per process) instead of SipHash.
pub(super) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub(super) type FastSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// The directory of a key: everything up to and including its last `/` (`""` at the root).
pub(super) fn dir_of(key: &str) -> &str {
    &key[..key.rfind('/').map_or(0, |i| i + 1)]
}

impl MetaMap {
    pub(super) fn get_mut(&mut self, backend: &str, key: &str) -> Option<&mut MetaEntry> {
        self.by_backend.get_mut(backend)?.entries.get_mut(key)
    }

    pub(super) fn contains(&self, backend: &str, key: &str) -> bool {
        self.by_backend
            .get(backend)
            .is_some_and(|m| m.entries.contains_key(key))
    }

    pub(super) fn remove(&mut self, backend: &str, key: &str) {
        if let Some(m) = self.by_backend.get_mut(backend)
            && m.remove(key)
        {
            self.len -= 1;
        }
    }

    /// Forget what `what` covers in `backend`, and refuse answers to lookups started before now.
    pub(super) fn invalidate(&mut self, backend: &str, what: Invalidation) {
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
    pub(super) fn drop_all(&mut self) {
        self.by_backend.clear();
        self.len = 0;
        self.generation += 1;
        self.floor = self.generation;
        self.floor_at = Some(self.clock.now());
        self.recent.clear();
    }

    /// Whether the lease has run out (never without one).
    pub(super) fn lapsed(&self) -> bool {
        self.lease.is_some_and(|u| self.clock.now() >= u)
    }

    /// Whether an answer about `key` of `backend` to a lookup that started at generation `since`, for a
    /// version confirmed at `confirmed` (when the request that read it at the backend was sent, here or at
    /// another agent), may be remembered: nothing covering it was invalidated since either, and the lease
    /// holds.
    pub(super) fn admits(&self, backend: &str, key: &str, since: u64, confirmed: Instant) -> bool {
        if since < self.floor || self.lapsed() || self.floor_at.is_some_and(|f| confirmed <= f) {
            return false;
        }
        self.recent
            .iter()
            .rev()
            .take_while(|(g, _, _, at)| *g > since || *at >= confirmed)
            .all(|(_, b, what, _)| &**b != backend || !what.covers(key))
    }

    pub(super) fn insert(&mut self, backend: &Arc<str>, key: &str, e: MetaEntry) {
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
    pub(super) fn remove(&mut self, key: &str) -> bool {
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
pub(super) struct HeadFlight {
    pub(super) since: u64,
    /// When it was sent: what it answers was confirmed then.
    pub(super) started: Instant,
    pub(super) backend: Backend,
    pub(super) fut: Shared<BoxFuture<'static, Result<ObjectMeta>>>,
}

/// HEADs in flight kept at most (past it, finished flights nobody removed are dropped).
pub(super) const HEADS_MAX: usize = 4_096;

/// What is known of an object's version, and when it was learned. The version's [`ObjState`] is kept with
/// it, so that opening an object whose metadata is fresh builds nothing (and its first block's digest is
/// computed once per version, not per read).
pub(super) struct MetaEntry {
    pub(super) obj: Arc<ObjState>,
    pub(super) at: Instant,
    /// Where in the TTL an open starts a background refresh: a random point of [1/2, 3/4), so that objects
    /// learned together (a listing, a burst of first reads) are not all revalidated at the same moment.
    pub(super) refresh_at: f32,
    /// A background refresh of this entry is running.
    pub(super) refreshing: bool,
}

impl MetaEntry {
    /// An entry for a version confirmed current at `at` (when the request that read it was sent, here or at
    /// the agent that owns its metadata): its TTL counts from then.
    pub(super) fn confirmed(obj: Arc<ObjState>, at: Instant) -> Self {
        Self {
            obj,
            at,
            refresh_at: 0.5 + rand::random::<f32>() / 4.0,
            refreshing: false,
        }
    }

    /// The version was confirmed current at `at`.
    pub(super) fn renew(&mut self, at: Instant) {
        self.at = at;
        self.refresh_at = 0.5 + rand::random::<f32>() / 4.0;
        self.refreshing = false;
    }
}

/// Whether a listing can confirm this version: listings carry no version ids, and an entry without an ETag
/// has nothing to compare beyond size and time.
pub(super) fn listing_confirms(meta: &ObjectMeta) -> bool {
    meta.version.is_none() && meta.etag.is_some()
}

/// Whether a listed object is the version an entry holds.
pub(super) fn same_version(held: &ObjectMeta, listed: &ObjectMeta) -> bool {
    held.etag.is_some()
        && held.etag == listed.etag
        && held.size == listed.size
        && held.last_modified_unix == listed.last_modified_unix
}

/// The key range of a directory for [`Backend::list_span`]: after the directory's name without its last
/// `/` (less than every key under it), before the name with that `/` replaced by the next byte, `0`
/// (the end of the key space for the root).
pub(super) fn dir_span(dir: &str) -> (&str, Option<String>) {
    match dir.strip_suffix('/') {
        Some(name) => (name, Some(format!("{name}0"))),
        None => ("", None),
    }
}

/// Background metadata refreshes running at once, at most (past this, entries simply expire).
pub(super) const META_REFRESH_MAX: usize = 16;

/// Entries of one directory from which a due refresh lists the directory (renewing every entry the listing
/// confirms) instead of sending a HEAD for the one key: 2,000 hot keys of a directory cost two LIST pages per
/// refresh cycle instead of 2,000 HEADs.
pub(super) const META_LIST_MIN: u32 = 16;

/// A refresh listing reads at most this many objects per entry of its directory (at least one S3 page):
/// a directory with a few cached keys over a large subtree is not listed whole.
pub(super) const META_LIST_PER_ENTRY: usize = 8;

/// Objects an open that revalidates an expired entry by a listing lists from its key (one S3 page).
pub(super) const META_LIST_WINDOW: usize = 1_000;

/// Most metadata entries kept (the map is cleared when it fills).
pub(super) const META_MAX: usize = 100_000;
