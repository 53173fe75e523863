//! Read-after-write across the agents of a cluster: a write or delete acknowledged by any member is what
//! every member serves next.
//!
//! **Announcements.** Before an agent acknowledges a write or delete (gateway PUT, copy, multipart
//! completion, DELETE and DeleteObjects, a handed-over checkpoint save, a clean-up run or restore), it
//! invalidates the keys in its own metadata cache and sends them to every other member of its view
//! (`POST /v1/peer/invalidate`, the cluster credential, in parallel); each member drops those entries (and
//! refuses answers to lookups it had in flight, see `strata-cache`'s `MetaMap`) before it answers. The
//! acknowledgement waits for every answer, so a client told "done" by one agent reads the new version (or
//! 404) through any other that was told.
//!
//! **Why the peer API and not PostgreSQL's LISTEN/NOTIFY.** A notification is delivered after the writer's
//! transaction commits, with no word back: the writer cannot know that a member applied it before it
//! answers its client, so read-after-write would hold only most of the time. A request per member is
//! answered after the entries are gone. It needs nothing but the membership the shared cache already has
//! (static, Slurm, catalog or Kubernetes), so it also holds where the catalog is SQLite per agent.
//!
//! **A member that cannot be told.** Each agent trusts its metadata cache only under a **lease** of contact
//! with every member ([`Coherence::run`]): every exchange between two members (an announcement, or a
//! probe sent when they have not exchanged for a third of the lease) renews it on both sides, and an agent
//! that has not exchanged with some member for `metadata_lease` stops trusting its metadata (every open
//! asks the origin, nothing is kept) and drops all of it; contact renewed, it starts empty. A writer whose
//! announcement a member does not answer keeps trying until that member's lease must have run out (the
//! last exchange it had with it, plus the lease and a margin for clock rates), then acknowledges: a
//! partitioned member never serves a version older than the writes acknowledged while it was cut off, and
//! no acknowledgement waits on a dead member longer than the lease. Members that exchanged with this agent
//! within two leases count as members here even when this agent's view lacks them, so views that disagree
//! for a moment (a joining agent) do not open a hole.
//!
//! Changes made at the origin by others (not through any agent) are seen within the metadata TTL, as before.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use strata_api::cluster::CoherenceStatus;
pub use strata_api::cluster::{Announcement, Change};

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use parking_lot::Mutex;
use strata_cache::BlockCache;
use strata_types::{Error, ErrorKind};

use super::Cluster;
use crate::Agent;
use crate::access::ClusterCall;
use crate::http::ApiError;

/// Most changes one announcement carries (a DeleteObjects request's keys).
pub const MAX_CHANGES: usize = 1000;
/// Largest announcement body accepted.
pub const MAX_BODY: usize = 4 << 20;

/// Counters of the coherence protocol (in `GET /v1/cluster`).
#[derive(Debug, Default)]
pub struct CoherenceCounters {
    /// Announcements sent to members (one per member and write).
    pub sent: AtomicU64,
    /// Of them, not answered at first (retried until the member's lease ran out).
    pub unanswered: AtomicU64,
    /// Announcements not sent: the member's lease of contact had run out already (it trusts no metadata).
    pub skipped: AtomicU64,
    /// Milliseconds acknowledgements waited for members that did not answer.
    pub waited_ms: AtomicU64,
    /// Announcements received from other members, and the changes they carried.
    pub received: AtomicU64,
    /// Changes applied from other members' announcements.
    pub applied: AtomicU64,
    /// Times this agent's lease ran out (a member out of contact): its metadata cache was dropped.
    pub lapses: AtomicU64,
}

/// Contact with the other members, as leases (see the module doc).
#[derive(Debug)]
pub struct Coherence {
    lease: Duration,
    /// Per member: the start of the last exchange it took part in (this agent's request it answered, or its
    /// request this agent received). This agent trusts its metadata while every member's is younger than
    /// the lease.
    heard: Mutex<HashMap<String, Instant>>,
    /// Per member: the end of the last exchange (an answer received, or a request received), the latest
    /// moment that member can count as contact with this agent; it trusts its metadata at most a lease
    /// past it.
    granted: Mutex<HashMap<String, Instant>>,
    trusted: std::sync::atomic::AtomicBool,
    /// Counters.
    pub counters: CoherenceCounters,
}

impl Coherence {
    /// Leases of `lease`.
    pub fn new(lease: Duration) -> Self {
        Self {
            lease,
            heard: Mutex::new(HashMap::new()),
            granted: Mutex::new(HashMap::new()),
            trusted: std::sync::atomic::AtomicBool::new(false),
            counters: CoherenceCounters::default(),
        }
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Whether this agent trusts its metadata cache now (as of the last renewal).
    pub fn trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    /// An exchange with `member` started at `start` and ended at `end`.
    fn exchanged(&self, member: &str, start: Instant, end: Instant) {
        let mut h = self.heard.lock();
        let e = h.entry(member.to_string()).or_insert(start);
        *e = (*e).max(start);
        drop(h);
        let mut g = self.granted.lock();
        let e = g.entry(member.to_string()).or_insert(end);
        *e = (*e).max(end);
    }

    /// How long an acknowledgement may have to wait for `member`: until its lease of contact with this agent
    /// has surely run out (`None`: it has, or it never had one).
    fn lease_of(&self, member: &str) -> Option<Instant> {
        let g = *self.granted.lock().get(member)?;
        // Clocks of two machines run at slightly different rates: a margin of 2 % and 50 ms.
        let until = g + self.lease + self.lease / 50 + Duration::from_millis(50);
        (until > Instant::now()).then_some(until)
    }

    /// The members this agent must be in contact with: those of `view` but itself, and any that exchanged
    /// with it within two leases.
    fn required(&self, cluster: &Cluster) -> Vec<String> {
        let mut out = cluster.others();
        let now = Instant::now();
        let mut h = self.heard.lock();
        // Bounded: members (and callers) not exchanged with for four leases are forgotten on both maps.
        h.retain(|_, at| now.duration_since(*at) < self.lease * 4);
        self.granted
            .lock()
            .retain(|_, at| now.duration_since(*at) < self.lease * 4);
        for (m, at) in h.iter() {
            if now.duration_since(*at) < self.lease * 2 && !out.contains(m) {
                out.push(m.clone());
            }
        }
        out
    }

    /// Renew the cache's lease from the contact with `required`: until the oldest member's last exchange plus
    /// the lease (`None`: a cluster of one).
    fn renew(&self, cache: &BlockCache, required: &[String]) {
        let until = {
            let h = self.heard.lock();
            required
                .iter()
                .map(|m| h.get(m).map_or_else(Instant::now, |&at| at + self.lease))
                .min()
        };
        let now_trusted = until.is_none_or(|u| u > Instant::now());
        if self.trusted.swap(now_trusted, Ordering::Relaxed) && !now_trusted {
            self.counters.lapses.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                lease_ms = self.lease.as_millis() as u64,
                "out of contact with a member of the cluster for longer than the metadata lease: every open \
                 asks the origin until contact is back"
            );
        }
        cache.set_metadata_lease(until);
    }

    /// Keep the lease: every quarter of it, probe the members not exchanged with for a third of it, then
    /// renew; until `stop`.
    pub async fn run(
        self: Arc<Self>,
        cluster: Arc<Cluster>,
        cache: BlockCache,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(self.lease / 4);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let required = self.required(&cluster);
            let due: Vec<String> = {
                let h = self.heard.lock();
                let now = Instant::now();
                required
                    .iter()
                    .filter(|m| {
                        h.get(*m)
                            .is_none_or(|at| now.duration_since(*at) >= self.lease / 3)
                    })
                    .cloned()
                    .collect()
            };
            let probe = Announcement {
                from: cluster.me().to_string(),
                changes: Vec::new(),
            };
            let probes = due.iter().map(|m| async {
                let start = Instant::now();
                if cluster
                    .client()
                    .invalidate(m, &probe, self.lease / 4)
                    .await
                    .is_ok()
                {
                    self.exchanged(m, start, Instant::now());
                }
            });
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = futures::future::join_all(probes) => {}
            }
            self.renew(&cache, &required);
        }
    }

    /// Tell every member about `changes` and return once each has applied them, or (one that does not
    /// answer) once its lease has surely run out. `changes` must already be invalidated here.
    pub async fn announce(&self, cluster: &Cluster, changes: Vec<Change>) {
        if changes.is_empty() {
            return;
        }
        let members = self.required(cluster);
        if members.is_empty() {
            return;
        }
        let me = cluster.me().to_string();
        let bodies: Vec<Announcement> = changes
            .chunks(MAX_CHANGES)
            .map(|c| Announcement {
                from: me.clone(),
                changes: c.to_vec(),
            })
            .collect();
        let timeout = cluster.sharing().peer_timeout.min(self.lease);
        let one = |m: String| {
            let bodies = &bodies;
            async move {
                for body in bodies {
                    self.deliver(cluster, &m, body, timeout).await;
                }
            }
        };
        futures::future::join_all(members.into_iter().map(one)).await;
    }

    async fn deliver(
        &self,
        cluster: &Cluster,
        member: &str,
        body: &Announcement,
        timeout: Duration,
    ) {
        // A member whose lease of contact has run out already trusts no metadata (it drops all of it): there
        // is nothing to wait for, and an unanswering member costs a write nothing once its lease is over.
        let Some(until) = self.lease_of(member) else {
            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        self.counters.sent.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let mut first = true;
        // No attempt outlasts the member's lease.
        let timeout = timeout.min(until.saturating_duration_since(Instant::now()));
        loop {
            let start = Instant::now();
            let err = match cluster.client().invalidate(member, body, timeout).await {
                Ok(()) => {
                    self.exchanged(member, start, Instant::now());
                    break;
                }
                Err(e) => e,
            };
            if first {
                first = false;
                self.counters.unanswered.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(member, error = %err, "a member did not take an invalidation; retrying until its lease runs out");
            }
            // Refused (another secret, say): that member takes no announcement, and trusts nothing of ours.
            let refused = super::client::is_refusal(err.kind());
            match self.lease_of(member) {
                Some(until) if !refused => {
                    let left = until.saturating_duration_since(Instant::now());
                    tokio::time::sleep(left.min(Duration::from_millis(200))).await;
                    if Instant::now() >= until {
                        break;
                    }
                }
                _ => break,
            }
        }
        if !first {
            self.counters
                .waited_ms
                .fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        }
    }
}

/// `POST /v1/peer/invalidate`: another member's writes (or a probe of contact).
pub(super) async fn invalidate(
    State(agent): State<Arc<Agent>>,
    cluster: Option<Extension<ClusterCall>>,
    body: axum::body::Bytes,
) -> std::result::Result<StatusCode, ApiError> {
    let received = Instant::now();
    let (a, c): (Announcement, _) = from_member(
        &agent,
        cluster.is_some(),
        &body,
        "announcement",
        "announce changes",
    )?;
    if a.changes.len() > MAX_CHANGES {
        return Err(Error::invalid_input(format!(
            "announcement: {} changes, at most {MAX_CHANGES}",
            a.changes.len()
        ))
        .into());
    }
    let co = &c.coherence;
    let from = member_id(&a.from, c.me())
        .map_err(|e| Error::invalid_input(format!("announcement: {e}")))?;
    for ch in a.changes.iter() {
        agent.cache().invalidate_in(&ch.backend, ch.what.clone());
    }
    co.counters.received.fetch_add(1, Ordering::Relaxed);
    co.counters
        .applied
        .fetch_add(a.changes.len() as u64, Ordering::Relaxed);
    co.exchanged(&from, received, received);
    Ok(StatusCode::NO_CONTENT)
}

/// A message of another member to this agent (`what` names it in errors) and the cluster it is for: refused
/// to callers without the cluster credential (`credential` false: they may not `may`), unreadable bodies,
/// and agents that share no cache.
pub(super) fn from_member<T: serde::de::DeserializeOwned>(
    agent: &Agent,
    credential: bool,
    body: &[u8],
    what: &str,
    may: &str,
) -> Result<(T, Arc<Cluster>), Error> {
    if !credential {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("only the other agents of the cluster (with the cluster credential) may {may}"),
        ));
    }
    let msg: T =
        serde_json::from_slice(body).map_err(|e| Error::invalid_input(format!("{what}: {e}")))?;
    let Some(c) = agent.cluster() else {
        return Err(Error::new(
            ErrorKind::Unsupported,
            "this agent does not share its cache with a cluster",
        ));
    };
    Ok((msg, c.clone()))
}

/// `from` as the member id of another agent (`http://host:port`, normalized, at most 256 bytes), or why not.
pub(super) fn member_id(from: &str, me: &str) -> std::result::Result<String, String> {
    if from == me {
        return Err("sent from this agent's own id".into());
    }
    crate::config::normalize_peer(from)
        .ok()
        .filter(|f| *f == from && f.len() <= 256)
        .ok_or_else(|| {
            format!(
                "from {:?} is no member id (http://host:port, at most 256 bytes)",
                from.chars().take(300).collect::<String>()
            )
        })
}

impl Coherence {
    /// Its state now.
    pub fn status(&self) -> CoherenceStatus {
        let c = &self.counters;
        let l = |v: &AtomicU64| v.load(Ordering::Relaxed);
        CoherenceStatus {
            lease_ms: self.lease.as_millis() as u64,
            trusted: self.trusted(),
            sent: l(&c.sent),
            unanswered: l(&c.unanswered),
            skipped: l(&c.skipped),
            waited_ms: l(&c.waited_ms),
            received: l(&c.received),
            applied: l(&c.applied),
            lapses: l(&c.lapses),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache() -> BlockCache {
        let cfg = strata_cache::CacheConfig::new(strata_types::ByteSize(64 << 20), None);
        BlockCache::open(cfg, strata_telemetry::Telemetry::new()).unwrap()
    }

    #[tokio::test]
    async fn the_lease_holds_only_while_every_member_was_heard_from_within_it() {
        let c =
            super::super::tests::cluster("http://a:1", &["http://a:1", "http://b:1", "http://c:1"]);
        let co = &c.coherence;
        let cache = cache();
        let required = co.required(&c);
        assert_eq!(
            required,
            vec!["http://b:1".to_string(), "http://c:1".to_string()]
        );
        // Never heard from: not trusted.
        co.renew(&cache, &required);
        assert!(!co.trusted() && !cache.metadata_trusted());
        let now = Instant::now();
        co.exchanged("http://b:1", now, now);
        co.renew(&cache, &required);
        assert!(!co.trusted(), "c is still out of contact");
        co.exchanged("http://c:1", now, now);
        co.renew(&cache, &required);
        assert!(co.trusted() && cache.metadata_trusted());
        // b was last heard from longer ago than the lease: no longer trusted, and counted once.
        let old = now - co.lease() - Duration::from_millis(1);
        let co2 = Coherence::new(co.lease());
        co2.exchanged("http://b:1", old, old);
        co2.exchanged("http://c:1", now, now);
        co2.trusted.store(true, Ordering::Relaxed);
        co2.renew(&cache, &required);
        assert!(!co2.trusted() && !cache.metadata_trusted());
        assert_eq!(co2.counters.lapses.load(Ordering::Relaxed), 1);
        cache.shutdown().await;
    }

    #[tokio::test]
    async fn a_writer_waits_for_a_silent_member_at_most_until_its_lease_ran_out() {
        let c = super::super::tests::cluster("http://a:1", &["http://a:1", "http://b:1"]);
        let co = &c.coherence;
        assert_eq!(
            co.lease_of("http://b:1"),
            None,
            "never in contact: nothing to wait for"
        );
        let now = Instant::now();
        co.exchanged("http://b:1", now, now);
        let until = co.lease_of("http://b:1").unwrap();
        assert!(
            until >= now + co.lease(),
            "at least a lease past the last exchange"
        );
        assert!(until <= now + co.lease() + co.lease() / 10 + Duration::from_millis(100));
        let long_ago = now - 2 * co.lease();
        let co2 = Coherence::new(co.lease());
        co2.exchanged("http://b:1", long_ago, long_ago);
        assert_eq!(
            co2.lease_of("http://b:1"),
            None,
            "its lease already ran out"
        );
    }

    #[tokio::test]
    async fn a_member_that_called_counts_though_this_view_lacks_it() {
        let c = super::super::tests::cluster("http://a:1", &["http://a:1"]);
        let co = &c.coherence;
        assert!(co.required(&c).is_empty(), "a cluster of one");
        let now = Instant::now();
        co.exchanged("http://z:1", now, now);
        assert_eq!(co.required(&c), vec!["http://z:1".to_string()]);
        let co2 = Coherence::new(co.lease());
        let old = now - 3 * co.lease();
        co2.exchanged("http://z:1", old, old);
        assert!(
            co2.required(&c).is_empty(),
            "not for longer than two leases"
        );
    }

    #[test]
    fn an_announcement_reads_as_it_is_written() {
        let a = Announcement {
            from: "http://a:1".into(),
            changes: vec![
                Change {
                    backend: "s3://b".into(),
                    what: strata_cache::Invalidation::Key("x y+%/z".into()),
                },
                Change {
                    backend: "s3://b".into(),
                    what: strata_cache::Invalidation::Prefix("run/".into()),
                },
            ],
        };
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(
            text,
            r#"{"from":"http://a:1","changes":[{"backend":"s3://b","key":"x y+%/z"},{"backend":"s3://b","prefix":"run/"}]}"#
        );
        let back: Announcement = serde_json::from_str(&text).unwrap();
        assert_eq!(back.changes, a.changes);
        assert!(serde_json::from_str::<Announcement>(r#"{"from":"x","extra":1}"#).is_err());
    }
}
