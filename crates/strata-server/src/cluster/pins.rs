//! Pins across the cluster: a pinned prefix's blocks are spread over their owners, so every member keeps the
//! pins of every other member for the blocks it owns ([`strata_cache::BlockCache::set_member_pins`]).
//!
//! Each agent sends its own pins, the whole list, to every member of its view: at once when they change (a
//! pin or unpin through the API, a claim's `pin` dataset admitted or released) and every [`SYNC`] besides,
//! so a member that was away, restarted or just joined has them within one period. The receiver replaces
//! what it keeps for that sender (`POST /v1/peer/pins`). Pins kept for a member that has sent nothing for
//! [`FORGET_AFTER`] (it left the cluster, or its pins are gone with it) are dropped, so a departed member's
//! pins never hold blocks for good. Kept pins survive restarts of the receiver (the cache's `pins.json`) and
//! are dropped the same way if their member does not come back.
//!
//! Why whole lists and not changes: a list is idempotent, needs no ordering between senders and repairs any
//! missed message with the next one; pins per agent are few (one per pinned prefix), so the list is small.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use strata_api::cluster::PinStatus;
pub use strata_api::cluster::{PinList, WirePin};

use axum::extract::{Extension, State};
use axum::http::StatusCode;
use parking_lot::Mutex;
use strata_types::Error;

use super::Cluster;
use crate::Agent;
use crate::access::ClusterCall;
use crate::http::ApiError;

/// How often an agent sends its pins to every member even when nothing changed.
pub const SYNC: Duration = Duration::from_secs(10);
/// Pins kept for a member that sent nothing for this long are dropped.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Most pins one message may carry.
pub const MAX_PINS: usize = 10_000;
/// Largest body of `POST /v1/peer/pins`.
pub const MAX_BODY: usize = 4 << 20;

/// Counters of the pin exchange (in `GET /v1/cluster`).
#[derive(Debug, Default)]
pub struct PinCounters {
    /// Lists sent to members.
    pub sent: AtomicU64,
    /// Of them, not delivered (the member did not answer or refused).
    pub failed: AtomicU64,
    /// Lists received from members.
    pub received: AtomicU64,
    /// Members whose pins were dropped after they sent nothing for [`FORGET_AFTER`].
    pub forgotten: AtomicU64,
}

/// The pin exchange of one agent.
#[derive(Debug)]
pub struct PinSync {
    started: Instant,
    /// [`FORGET_AFTER`] (shorter in tests).
    forget_after: Duration,
    /// When each member last sent its list.
    heard: Mutex<HashMap<String, Instant>>,
    /// Wakes the loop to send at once (a pin changed).
    changed: tokio::sync::Notify,
    /// See [`PinCounters`].
    pub counters: PinCounters,
}

impl Default for PinSync {
    fn default() -> Self {
        Self {
            started: Instant::now(),
            forget_after: FORGET_AFTER,
            heard: Mutex::default(),
            changed: tokio::sync::Notify::new(),
            counters: PinCounters::default(),
        }
    }
}

impl PinSync {
    /// This agent's pins changed: send them to every member now.
    pub fn changed(&self) {
        self.changed.notify_one();
    }

    /// Send this agent's pins to every member of the view, whenever they change and every [`SYNC`], and drop
    /// the pins of members silent for [`FORGET_AFTER`]; until `stop`.
    pub async fn run(
        self: Arc<Self>,
        cluster: Arc<Cluster>,
        cache: strata_cache::BlockCache,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut tick = tokio::time::interval(SYNC);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
                _ = self.changed.notified() => {}
            }
            let list = PinList {
                from: cluster.me().to_string(),
                pins: cache
                    .own_pins()
                    .into_iter()
                    .map(|p| WirePin {
                        backend: p.backend,
                        prefix: p.prefix,
                    })
                    .collect(),
            };
            let timeout = cluster.sharing().peer_timeout;
            let me = &self;
            let sends = cluster.others().into_iter().map(|m| {
                let list = &list;
                let cluster = &cluster;
                async move {
                    me.counters.sent.fetch_add(1, Ordering::Relaxed);
                    if let Err(e) = cluster.client().pins(&m, list, timeout).await {
                        me.counters.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(member = %m, error = %e, "sending pins (sent again within a period)");
                    }
                }
            });
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = futures::future::join_all(sends) => {}
            }
            self.forget_silent(&cache);
        }
    }

    /// Drop the pins kept for members that sent nothing for [`FORGET_AFTER`] (counting from this agent's
    /// start for pins kept across a restart).
    fn forget_silent(&self, cache: &strata_cache::BlockCache) {
        let now = Instant::now();
        let silent: Vec<String> = {
            let mut h = self.heard.lock();
            h.retain(|_, at| now.duration_since(*at) < self.forget_after * 2);
            cache
                .pinning_members()
                .into_iter()
                .filter(|m| {
                    let last = h.get(m).copied().unwrap_or(self.started);
                    now.duration_since(last) >= self.forget_after
                })
                .collect()
        };
        for m in silent {
            match cache.set_member_pins(&m, &[]) {
                Ok(_) => {
                    self.counters.forgotten.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(member = %m, "dropped the pins of a member silent for a minute");
                }
                Err(e) => {
                    tracing::warn!(member = %m, error = %e, "dropping a silent member's pins")
                }
            }
        }
    }
}

/// `POST /v1/peer/pins`: every pin of another member, kept here for the blocks this agent owns.
pub(super) async fn receive(
    State(agent): State<Arc<Agent>>,
    cluster: Option<Extension<ClusterCall>>,
    body: axum::body::Bytes,
) -> std::result::Result<StatusCode, ApiError> {
    let (list, c): (PinList, _) =
        super::coherence::from_member(&agent, cluster.is_some(), &body, "pins", "send pins")?;
    if list.pins.len() > MAX_PINS {
        return Err(Error::invalid_input(format!(
            "pins: {} pins, at most {MAX_PINS}",
            list.pins.len()
        ))
        .into());
    }
    let from = super::coherence::member_id(&list.from, c.me())
        .map_err(|e| Error::invalid_input(format!("pins: {e}")))?;
    if let Some(p) = list
        .pins
        .iter()
        .find(|p| p.backend.is_empty() || p.backend.len() > 1024 || p.prefix.len() > 4096)
    {
        return Err(Error::invalid_input(format!(
            "pins: a pin needs a backend id of at most 1,024 bytes and a prefix of at most 4,096 (got {:?} {:?})",
            p.backend.chars().take(80).collect::<String>(),
            p.prefix.chars().take(80).collect::<String>()
        ))
        .into());
    }
    let pins: Vec<(String, String)> = list
        .pins
        .into_iter()
        .map(|p| (p.backend, p.prefix))
        .collect();
    agent.cache().set_member_pins(&from, &pins)?;
    c.pins.heard.lock().insert(from, Instant::now());
    c.pins.counters.received.fetch_add(1, Ordering::Relaxed);
    Ok(StatusCode::NO_CONTENT)
}

impl PinSync {
    /// Its counters now.
    pub fn status(&self) -> PinStatus {
        let c = &self.counters;
        PinStatus {
            sent: c.sent.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            received: c.received.load(Ordering::Relaxed),
            forgotten: c.forgotten.load(Ordering::Relaxed),
            kept_for: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report

    use super::*;

    #[tokio::test]
    async fn the_pins_of_a_member_silent_too_long_are_dropped_and_a_heard_ones_kept() {
        let cfg = strata_cache::CacheConfig::new(strata_types::ByteSize(64 << 20), None);
        let cache =
            strata_cache::BlockCache::open(cfg, strata_telemetry::Telemetry::new()).unwrap();
        let pin = [("memory://t".to_string(), "ds/".to_string())];
        cache.set_member_pins("http://10.0.0.1:7070", &pin).unwrap();
        cache.set_member_pins("http://10.0.0.2:7070", &pin).unwrap();
        let sync = PinSync {
            forget_after: Duration::from_millis(100),
            ..PinSync::default()
        };
        sync.forget_silent(&cache);
        assert_eq!(
            cache.pinning_members().len(),
            2,
            "kept for a while after this agent's start"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        sync.heard
            .lock()
            .insert("http://10.0.0.2:7070".into(), Instant::now());
        tokio::time::sleep(Duration::from_millis(60)).await;
        sync.forget_silent(&cache);
        assert_eq!(
            cache.pinning_members(),
            vec!["http://10.0.0.2:7070".to_string()]
        );
        assert_eq!(sync.counters.forgotten.load(Ordering::Relaxed), 1);
        cache.shutdown().await;
    }

    #[test]
    fn a_pin_list_reads_as_it_is_written() {
        let l: PinList = serde_json::from_str(
            r#"{"from": "http://h:1", "pins": [{"backend": "s3://b", "prefix": "p/"}]}"#,
        )
        .unwrap();
        assert_eq!(l.pins[0].prefix, "p/");
        assert!(
            serde_json::from_str::<PinList>(r#"{"from": "http://h:1", "pins": [], "x": 1}"#)
                .is_err()
        );
    }
}
