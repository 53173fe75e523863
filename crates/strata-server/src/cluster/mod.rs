//! The shared cache: the agents of a cluster cache one copy of each block between them.
//!
//! - **Members** come from `[cluster] cache` ([`Sharing`]): the static `peers` list, the agents heartbeating
//!   in the shared catalog ([`members`]), or the nodes of the Slurm job. The view is re-read every second;
//!   a changed view applies at once, without a restart, and the one before it is kept for [`MOVE_GRACE`].
//! - **Placement**: a block's owners are the members in weighted-rendezvous order of its digest
//!   ([`strata_cluster::placement`]; the digest names the object version). Every member computes the same
//!   order from the same view.
//! - **Reads** ([`Cluster`] is the cache's [`PeerSource`]): a block this agent owns is read from the origin
//!   here; another's is asked of its owner ([`client`]), then of the next owner, then read from the origin.
//!   An owner still reading a block from a slow origin answers "busy" before the request's timeout and is
//!   asked again (joining its fill), never taken for a dead one.
//!   A peer that refuses the connection, times out, answers 5xx or sends bytes that fail their check is
//!   **suspect** for a backoff (1 s doubling to 30 s, cleared by its next good answer) and skipped while it
//!   is. Reads never fail because a peer did.
//! - **Metadata**: an open that finds no fresh entry asks the agent that owns the key's metadata (placed as
//!   blocks are, by [`meta_digest`]) instead of the origin; that agent answers from its metadata cache or one
//!   HEAD that every asker joins. An owner that fails is suspect as for blocks and the open sends its own HEAD.
//! - **Lazy moves**: for [`MOVE_GRACE`] after the view changed, a block this agent now owns and misses is
//!   first asked of its owner in the previous view (only if held there: no fill), so a join or leave moves
//!   no block in bulk and reads no block from the origin that a member still holds. An agent that starts
//!   takes the view without itself as its previous one: the cluster it joins ran without it.
//! - **Trust**: the peer block route ([`routes`]) takes only the cluster credential, serves exactly the
//!   version asked for, and decides access for the principal the read is for as it would for that principal
//!   itself.

pub mod client;
pub mod coherence;
pub mod members;
pub mod pins;
pub mod routes;
pub mod stage;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use strata_api::cluster::{ClusterMembers, MemberState, MemberStatus, PreviousView};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::{Mutex, RwLock};
use strata_cache::{PeerBlock, PeerSource};
use strata_cluster::{Member, Membership, View, placement};
use strata_object::Backend;
use strata_types::{BlockKey, Error, ErrorKind, IoContext, ObjectMeta, Result};

pub use crate::config::Sharing;

/// How long the view before a membership change is asked for blocks that changed owner.
pub const MOVE_GRACE: Duration = Duration::from_secs(120);
/// How often the membership is re-read.
const VIEW_EVERY: Duration = Duration::from_secs(1);
/// Longest a suspect peer is skipped.
const SUSPECT_MAX: Duration = Duration::from_secs(30);
/// Owners asked for a block (past the first failures) before the origin.
const MAX_ASKS: usize = 2;
/// Longest an owner that keeps answering "still reading" is waited for.
const MAX_BUSY_WAIT: Duration = Duration::from_secs(120);

/// Counters of the peer path (also in `GET /v1/cluster` and the metrics).
#[derive(Debug, Default)]
pub struct PeerCounters {
    /// Block requests sent to peers (to their owners, who read them from the origin if need be).
    pub asked: AtomicU64,
    /// Requests to a block's owner before a membership change (served only if held).
    pub move_asks: AtomicU64,
    /// Failed ones: refused or reset connections, timeouts, 5xx answers.
    pub errors: AtomicU64,
    /// Answers whose bytes failed their check (length or BLAKE3).
    pub corrupt: AtomicU64,
    /// Answers that refused the read (the owner would not serve it: 4xx).
    pub refused: AtomicU64,
    /// Times a peer was marked suspect.
    pub suspected: AtomicU64,
    /// Blocks a previous owner still held after a membership change.
    pub moved: AtomicU64,
    /// "Still reading" answers of owners waiting on a slow origin (each was asked again).
    pub busy: AtomicU64,
    /// Metadata requests sent to the agents that own the keys' metadata.
    pub meta_asked: AtomicU64,
    /// Of them, failed or refused (the open sent its own HEAD).
    pub meta_failed: AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Suspect {
    until: Instant,
    strikes: u32,
}

#[derive(Debug)]
struct Views {
    current: Arc<View>,
    previous: Option<(Arc<View>, Instant)>,
    changed: u64,
}

/// This agent's place in the shared cache; the cache's [`PeerSource`].
#[derive(Debug)]
pub struct Cluster {
    sharing: Sharing,
    membership: Arc<dyn Membership>,
    views: RwLock<Views>,
    suspects: Mutex<HashMap<String, Suspect>>,
    client: client::PeerClient,
    catalog: String,
    /// Counters of the peer path.
    pub counters: PeerCounters,
    /// Read-after-write across the members.
    pub coherence: Arc<coherence::Coherence>,
    /// Pins kept by every member ([`pins`]).
    pub pins: Arc<pins::PinSync>,
}

impl Cluster {
    /// Join the cluster `sharing` describes, with `membership` as the source of its members; `catalog` is
    /// the identity of this agent's catalog.
    pub fn new(
        sharing: Sharing,
        membership: Arc<dyn Membership>,
        secret: String,
        catalog: String,
    ) -> Result<Self> {
        let client = client::PeerClient::new(secret, catalog.clone(), sharing.peer_timeout)?;
        let sharing_lease = sharing.metadata_lease;
        let current = membership.view();
        // An agent that starts joins a cluster that ran without it: the others hold what it now owns (a
        // joining agent's first view already has everyone in it, a restarted one's blocks were taken over).
        let before = View::new(
            current
                .members()
                .iter()
                .filter(|m| m.id != sharing.me)
                .cloned()
                .collect(),
        );
        let previous = (!before.members().is_empty()).then(|| (Arc::new(before), Instant::now()));
        Ok(Self {
            sharing,
            membership,
            views: RwLock::new(Views {
                current,
                previous,
                changed: 0,
            }),
            suspects: Mutex::new(HashMap::new()),
            client,
            catalog,
            counters: PeerCounters::default(),
            coherence: Arc::new(coherence::Coherence::new(sharing_lease)),
            pins: Arc::default(),
        })
    }

    /// The identity of this agent's catalog.
    pub fn catalog(&self) -> &str {
        &self.catalog
    }

    /// This agent's member id.
    pub fn me(&self) -> &str {
        &self.sharing.me
    }

    /// The resolved settings.
    pub fn sharing(&self) -> &Sharing {
        &self.sharing
    }

    /// The members of the current view other than this agent, suspects included: a claim's staging asks
    /// each to stage its share ([`stage`]).
    pub fn others(&self) -> Vec<String> {
        self.view()
            .members()
            .iter()
            .filter(|m| m.id != self.sharing.me)
            .map(|m| m.id.clone())
            .collect()
    }

    /// The client of the peer routes.
    pub fn client(&self) -> &client::PeerClient {
        &self.client
    }

    /// The current view of the members.
    pub fn view(&self) -> Arc<View> {
        self.views.read().current.clone()
    }

    /// Re-read the membership; a changed view becomes current, the one before it is kept for lazy moves.
    pub fn refresh(&self) {
        let next = self.membership.view();
        let mut v = self.views.write();
        if *next != *v.current {
            tracing::info!(
                members = next.members().len(),
                before = v.current.members().len(),
                "cluster membership changed"
            );
            let old = std::mem::replace(&mut v.current, next);
            v.previous = Some((old, Instant::now()));
            v.changed += 1;
        }
    }

    /// Re-read the membership every second until `stop`.
    pub async fn watch(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(VIEW_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.refresh(),
            }
        }
    }

    fn previous_view(&self) -> Option<Arc<View>> {
        let v = self.views.read();
        v.previous
            .as_ref()
            .filter(|(_, at)| at.elapsed() < MOVE_GRACE)
            .map(|(p, _)| p.clone())
    }

    /// The member that owned a block in the view before the last change (within [`MOVE_GRACE`]), if that is
    /// another member of the current view and not suspect: it may still hold the block.
    fn moved_from(&self, view: &View, digest: &[u8]) -> Option<String> {
        let prev = self.previous_view()?;
        let p = placement::owner(&prev, digest)?;
        (p.id != self.sharing.me && view.member(&p.id).is_some() && !self.is_suspect(&p.id))
            .then(|| p.id.clone())
    }

    fn is_suspect(&self, id: &str) -> bool {
        self.suspects
            .lock()
            .get(id)
            .is_some_and(|s| s.until > Instant::now())
    }

    fn suspect(&self, id: &str, e: &Error) {
        let mut s = self.suspects.lock();
        let entry = s.entry(id.to_string()).or_insert(Suspect {
            until: Instant::now(),
            strikes: 0,
        });
        // Requests that were in flight together fail together: only a failure once the backoff has run out
        // (the probe that found the peer still unwell) doubles it.
        if entry.until > Instant::now() && entry.strikes > 0 {
            return;
        }
        entry.strikes = entry.strikes.saturating_add(1);
        let backoff = Duration::from_secs(1)
            .saturating_mul(1 << (entry.strikes - 1).min(5))
            .min(SUSPECT_MAX);
        entry.until = Instant::now() + backoff;
        drop(s);
        self.counters.suspected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = id, error = %e, backoff_ms = backoff.as_millis() as u64, "peer suspect");
    }

    fn trusted(&self, id: &str) {
        let mut s = self.suspects.lock();
        if s.contains_key(id) {
            s.remove(id);
        }
    }

    /// Ask `peer` for a block; errors are counted, and the kinds that say the peer is unwell make it suspect.
    /// An owner still reading the block from a slow origin says so and is asked again (its fill goes on, and
    /// each new request joins it), for up to [`MAX_BUSY_WAIT`].
    async fn ask(&self, peer: &str, block: &PeerBlock<'_>, fill: bool) -> Option<Bytes> {
        let sent = if fill {
            &self.counters.asked
        } else {
            &self.counters.move_asks
        };
        sent.fetch_add(1, Ordering::Relaxed);
        let start = Instant::now();
        let mut answer = self.client.block(peer, block, fill).await;
        while matches!(answer, Ok(client::Answer::Busy)) && start.elapsed() < MAX_BUSY_WAIT {
            self.counters.busy.fetch_add(1, Ordering::Relaxed);
            answer = self.client.block(peer, block, fill).await;
        }
        match answer {
            Ok(client::Answer::Block(b)) => {
                self.trusted(peer);
                Some(b)
            }
            Ok(client::Answer::NotHeld) => {
                self.trusted(peer);
                None
            }
            Ok(client::Answer::Busy) => {
                tracing::warn!(
                    peer,
                    "peer still reading a block after the longest wait; reading it here"
                );
                None
            }
            Err(e) => {
                let c = &self.counters;
                match e.kind() {
                    ErrorKind::Corrupt => c.corrupt.fetch_add(1, Ordering::Relaxed),
                    k if client::is_refusal(k) => c.refused.fetch_add(1, Ordering::Relaxed),
                    _ => c.errors.fetch_add(1, Ordering::Relaxed),
                };
                if !client::is_refusal(e.kind()) {
                    self.suspect(peer, &e);
                } else {
                    tracing::debug!(peer, error = %e, "peer refused a block");
                }
                None
            }
        }
    }

    /// The status of the cluster as this agent sees it (`GET /v1/cluster`), each member's share of blocks
    /// sampled over about `samples` block keys (0: no shares).
    pub fn status(&self, samples: u32) -> ClusterMembers {
        let view = self.view();
        // Each sample scores every member: at most ~400,000 scores however large the cluster.
        let n = samples.min(400_000 / (view.members().len().max(1) as u32));
        let shares = shares(&view, n);
        let suspects = self.suspects.lock().clone();
        let now = Instant::now();
        let c = &self.counters;
        let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (changed, previous) = {
            let v = self.views.read();
            (
                v.changed,
                v.previous
                    .as_ref()
                    .map(|(p, at)| (p.members().len(), at.elapsed().as_secs())),
            )
        };
        ClusterMembers {
            me: self.sharing.me.clone(),
            membership: self.membership.kind().to_string(),
            view_changes: changed,
            previous_view: previous.map(|(members, age_secs)| PreviousView { members, age_secs }),
            members: view
                .members()
                .iter()
                .zip(shares)
                .map(|(m, share)| MemberStatus {
                    id: m.id.clone(),
                    weight: m.weight,
                    share,
                    state: match suspects.get(&m.id) {
                        Some(s) if s.until > now => MemberState::Suspect,
                        _ => MemberState::Up,
                    },
                    me: m.id == self.sharing.me,
                })
                .collect(),
            asked: ld(&c.asked),
            move_asks: ld(&c.move_asks),
            catalog: self.catalog.clone(),
            errors: ld(&c.errors),
            corrupt: ld(&c.corrupt),
            refused: ld(&c.refused),
            suspected: ld(&c.suspected),
            moved: ld(&c.moved),
            busy: ld(&c.busy),
            meta_asked: ld(&c.meta_asked),
            meta_failed: ld(&c.meta_failed),
            coherence: self.coherence.status(),
            pins: self.pins.status(),
        }
    }
}

/// Where a key's metadata is placed: the members in rendezvous order of this digest own it (one per
/// cluster asks the backend; the others ask it). Apart from every block digest (a prefix no block key has).
pub fn meta_digest(backend_id: &str, key: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"strata-meta\0");
    h.update(backend_id.as_bytes());
    h.update(b"\0");
    h.update(key.as_bytes());
    *h.finalize().as_bytes()
}

/// Each member's share of `n` sample block keys under the view.
fn shares(view: &View, n: u32) -> Vec<f64> {
    let mut counts = vec![0u64; view.members().len()];
    for i in 0..n {
        let key = blake3::hash(&i.to_le_bytes());
        if let Some(m) = placement::owner(view, key.as_bytes())
            && let Ok(at) = view
                .members()
                .binary_search_by(|x| x.id.as_str().cmp(m.id.as_str()))
        {
            counts[at] += 1;
        }
    }
    counts
        .iter()
        .map(|&c| c as f64 / f64::from(n.max(1)))
        .collect()
}

impl PeerSource for Cluster {
    fn is_local(&self, key: &BlockKey) -> bool {
        let view = self.view();
        let digest = key.digest();
        match placement::owner(&view, &digest) {
            // A block that changed owner to this agent goes through `fetch`, which asks the owner before.
            Some(m) if m.id == self.sharing.me => self.moved_from(&view, &digest).is_none(),
            Some(_) => false,
            None => true,
        }
    }

    fn owns(&self, key: &BlockKey) -> bool {
        placement::owner(&self.view(), &key.digest()).is_none_or(|m| m.id == self.sharing.me)
    }

    fn owns_within(&self, key: &BlockKey, replicas: usize) -> bool {
        let view = self.view();
        let owners = placement::owners(&view, &key.digest());
        owners.is_empty()
            || owners
                .iter()
                .take(replicas)
                .any(|m| m.id == self.sharing.me)
    }

    fn head<'a>(
        &'a self,
        ctx: &'a IoContext,
        backend: &'a Backend,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Result<(ObjectMeta, Duration)>>> {
        async move {
            let view = self.view();
            let owner = placement::owner(&view, &meta_digest(backend.id(), key))?;
            if owner.id == self.sharing.me || self.is_suspect(&owner.id) {
                return None;
            }
            let peer = owner.id.clone();
            drop(view);
            let c = &self.counters;
            c.meta_asked.fetch_add(1, Ordering::Relaxed);
            match self.client.meta(&peer, ctx, backend.id(), key).await {
                Ok(Some(found)) => {
                    self.trusted(&peer);
                    Some(Ok(found))
                }
                Ok(None) => {
                    self.trusted(&peer);
                    Some(Err(Error::new(
                        ErrorKind::NotFound,
                        format!("{key}: no such object"),
                    )))
                }
                Err(e) => {
                    c.meta_failed.fetch_add(1, Ordering::Relaxed);
                    if client::is_refusal(e.kind()) {
                        tracing::debug!(peer, error = %e, "peer refused a metadata request");
                    } else {
                        self.suspect(&peer, &e);
                    }
                    None
                }
            }
        }
        .boxed()
    }

    fn fetch<'a>(&'a self, block: PeerBlock<'a>) -> BoxFuture<'a, Option<Bytes>> {
        async move {
            let view = self.view();
            let digest = block.key.digest();
            let owners: Vec<Member> = placement::owners(&view, &digest)
                .into_iter()
                .cloned()
                .collect();
            let mut asked = 0;
            for m in &owners {
                if m.id == self.sharing.me {
                    // This agent's block: a member of the view before a change may still hold it.
                    if let Some(p) = self.moved_from(&view, &digest)
                        && let Some(b) = self.ask(&p, &block, false).await
                    {
                        self.counters.moved.fetch_add(1, Ordering::Relaxed);
                        return Some(b);
                    }
                    return None;
                }
                if asked >= MAX_ASKS || self.is_suspect(&m.id) {
                    continue;
                }
                asked += 1;
                if let Some(b) = self.ask(&m.id, &block, true).await {
                    return Some(b);
                }
            }
            None
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::config::CacheSharing;
    use strata_cluster::StaticMembers;

    pub(super) fn cluster(me: &str, peers: &[&str]) -> Cluster {
        let peers: Vec<String> = peers.iter().map(|p| p.to_string()).collect();
        let s = Sharing {
            kind: CacheSharing::Static,
            me: me.into(),
            peers: peers.clone(),
            slurm_port: 7070,
            heartbeat: Duration::from_secs(2),
            member_ttl: Duration::from_secs(10),
            peer_timeout: Duration::from_secs(1),
            kube_service: "strata-agents".into(),
            kube_namespace: "strata-system".into(),
            metadata_lease: Duration::from_secs(5),
        };
        Cluster::new(
            s,
            Arc::new(StaticMembers::new(&peers)),
            "x".repeat(16),
            "c_test".into(),
        )
        .unwrap()
    }

    #[test]
    fn suspects_back_off_doubling_to_a_cap_and_a_good_answer_clears_them() {
        let c = cluster("http://a:1", &["http://a:1", "http://b:1"]);
        let e = Error::new(ErrorKind::Unavailable, "refused");
        assert!(!c.is_suspect("http://b:1"));
        let mut last = Duration::ZERO;
        for strike in 1..=8u32 {
            c.suspect("http://b:1", &e);
            // A failure of a request in flight at the same time does not double the backoff.
            c.suspect("http://b:1", &e);
            let left = c.suspects.lock()["http://b:1"].until - Instant::now();
            let want = Duration::from_secs(1 << (strike - 1).min(5)).min(SUSPECT_MAX);
            assert!(
                left <= want && left + Duration::from_millis(200) >= want,
                "{strike}: {left:?}"
            );
            assert!(left + Duration::from_millis(200) >= last);
            last = left;
            // The backoff runs out; the next failure is the probe's.
            c.suspects.lock().get_mut("http://b:1").unwrap().until = Instant::now();
        }
        c.suspect("http://b:1", &e);
        assert!(c.is_suspect("http://b:1"));
        assert_eq!(c.status(0).members[1].state, MemberState::Suspect);
        assert_eq!(c.counters.suspected.load(Ordering::Relaxed), 9);
        c.trusted("http://b:1");
        assert!(!c.is_suspect("http://b:1"));
        assert_eq!(c.status(0).members[1].state, MemberState::Up);
    }

    #[test]
    fn every_member_agrees_on_who_owns_a_block_and_shares_follow_the_view() {
        let ids = ["http://a:1", "http://b:1", "http://c:1", "http://d:1"];
        let members: Vec<Cluster> = ids.iter().map(|m| cluster(m, &ids)).collect();
        // Just started: the cluster ran without each of them, so their own blocks are first asked of the
        // owner in the view without them (a lazy move), never read from the origin straight away.
        let key = |i: u64| {
            BlockKey::new(
                strata_types::ObjectId::new("s3://b", format!("k{i}"), "e:1"),
                i,
            )
        };
        assert!((0..400u64).all(|i| (0..4).all(|m| !members[m].is_local(&key(i)))));
        for m in &members {
            assert!(m.status(0).previous_view.is_some_and(|p| p.members == 3));
            m.views.write().previous = None;
        }
        let mut owned = [0u32; 4];
        for i in 0..4000u64 {
            let key = BlockKey::new(
                strata_types::ObjectId::new("s3://b", format!("k{i}"), "e:1"),
                i,
            );
            let locals: Vec<usize> = (0..4).filter(|&m| members[m].is_local(&key)).collect();
            assert_eq!(
                locals.len(),
                1,
                "block {i}: exactly one member owns it: {locals:?}"
            );
            owned[locals[0]] += 1;
        }
        for (m, n) in owned.iter().enumerate() {
            assert!(
                (850..1150).contains(n),
                "member {m} owns {n} of 4000: {owned:?}"
            );
        }
        let s = members[0].status(20_000);
        assert_eq!(s.members.len(), 4);
        assert!(s.members[0].me && !s.members[1].me);
        let total: f64 = s.members.iter().map(|m| m.share).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(
            s.members.iter().all(|m| (m.share - 0.25).abs() < 0.02),
            "{s:?}"
        );
    }
}
