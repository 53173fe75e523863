//! The agent's background work ([`spawn_background`]): access times from the gateway flushed to the catalog
//! every 5 s, expired reservations reaped every minute, usage sampled every `catalog.sample_interval_secs`
//! (teams and volumes) and forecasts recomputed, expired scratch moved to the trash, incomplete multipart
//! uploads older than `catalog.abort_uploads_after_secs` aborted. Every loop stops with the agent's
//! cancellation token.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use strata_catalog::access::SYSTEM;
use strata_catalog::lifecycle::UsageSample;
use strata_catalog::quota::TOTAL;
use strata_types::Result;

use crate::Agent;
use crate::control::{compute_forecasts, release_scratch};

/// The sweep of incomplete multipart uploads under the configured backends. An upload is aborted once it is
/// `after` old by two witnesses: the server's `Initiated` (when it reports one) and the first time this agent
/// saw it. The second keeps a server whose clock or dates are wrong (moto dates every upload 2010) and a
/// skewed agent clock from aborting a live upload; restarting the agent only ever delays an abort.
#[derive(Debug)]
pub struct UploadSweep {
    after: Duration,
    /// When this agent first saw each upload (backend name, upload id); bounded by [`Self::MAX_TRACKED`].
    seen: HashMap<(String, String), std::time::Instant>,
}

impl UploadSweep {
    /// Uploads tracked at most; ones beyond it wait for a later sweep.
    pub const MAX_TRACKED: usize = 100_000;

    /// A sweep aborting uploads older than `after`.
    pub fn new(after: Duration) -> Self {
        Self {
            after,
            seen: HashMap::new(),
        }
    }

    /// One pass over every configured backend; how many uploads were aborted. Every backend is tried; the
    /// first failure is returned after.
    pub async fn run(&mut self, a: &Agent) -> Result<usize> {
        let now_unix = a.catalog().now();
        let now = std::time::Instant::now();
        let ctx = strata_types::IoContext::default();
        let mut alive = std::collections::HashSet::new();
        let mut aborted = 0;
        let mut first_err = None;
        for b in a.backends() {
            let uploads = match b.backend.incomplete_uploads(&ctx, "").await {
                Ok(u) => u,
                Err(e) => {
                    first_err.get_or_insert(e.context(format!("backend {}", b.name)));
                    continue;
                }
            };
            for u in uploads {
                let id = (b.name.clone(), u.upload_id.clone());
                alive.insert(id.clone());
                let first = match self.seen.get(&id) {
                    Some(t) => *t,
                    None if self.seen.len() < Self::MAX_TRACKED => {
                        *self.seen.entry(id).or_insert(now)
                    }
                    None => continue,
                };
                let server_says_old = u.initiated_unix <= 0
                    || now_unix.saturating_sub(u.initiated_unix) >= self.after.as_secs() as i64;
                if now.duration_since(first) < self.after || !server_says_old {
                    continue;
                }
                match b.backend.abort_upload(&ctx, &u).await {
                    Ok(()) => {
                        tracing::info!(backend = %b.name, key = %u.key, "aborted a stale incomplete multipart upload");
                        aborted += 1;
                    }
                    Err(e) => {
                        first_err.get_or_insert(e.context(format!("backend {}", b.name)));
                    }
                }
            }
        }
        self.seen.retain(|k, _| alive.contains(k));
        match first_err {
            Some(e) => Err(e),
            None => Ok(aborted),
        }
    }
}

/// Take one usage sample of every team's total and every local volume.
pub async fn sample_usage(a: &Agent) -> Result<()> {
    let cat = a.catalog();
    let now = cat.now();
    for q in cat.list_quotas(None).await? {
        let sample = UsageSample {
            at: now,
            used: q.used_bytes,
            capacity: q.limits.hard_bytes,
        };
        if q.scope == TOTAL {
            cat.add_sample("team", &q.team, sample).await?;
        } else if q.limits.hard_bytes.is_some() {
            // A team's quota on one tier or backend: `team/scope`.
            cat.add_sample("quota", &format!("{}/{}", q.team, q.scope), sample)
                .await?;
        }
    }
    let mut volumes = vec![a.config().data_dir.clone()];
    for b in a.backends() {
        if let Some(p) = b.url.strip_prefix("file://") {
            volumes.push(std::path::PathBuf::from(p));
        }
    }
    volumes.sort();
    volumes.dedup();
    // History is kept for twice the forecast window, so the table stays bounded.
    let keep = 2 * a.config().catalog.forecast_window_days as i64 * 86_400;
    cat.prune_samples(now - keep).await?;
    for v in volumes {
        // As `df` counts it: capacity is used + available, and blocks reserved for root are neither (counted
        // as used, they made a disk that df calls 12% full look 68% full).
        if let Some(space) = crate::sys::statvfs(&v) {
            let (total, avail) = (space.usable, space.available);
            cat.add_sample(
                "volume",
                &v.display().to_string(),
                UsageSample {
                    at: now,
                    used: total.saturating_sub(avail) as i64,
                    capacity: Some(total as i64),
                },
            )
            .await?;
        }
    }
    Ok(())
}

/// Expire scratch allocations past their TTL.
pub async fn expire_scratch(a: &Agent) -> Result<u64> {
    let now = a.catalog().now();
    let mut n = 0;
    for s in a.catalog().list_scratch(None).await? {
        if s.expires_at <= now {
            release_scratch(a, &s, SYSTEM, true).await?;
            n += 1;
        }
    }
    Ok(n)
}

/// I/O events buffered for access times between two drains (beyond: dropped and counted).
const ACCESS_EVENTS_CAPACITY: usize = 16_384;
/// How often buffered I/O events are turned into access times.
const ACCESS_DRAIN_EVERY: Duration = Duration::from_millis(100);

/// Start the background loops; they stop when `stop` is cancelled (pending access times are flushed first).
pub fn spawn_background(
    agent: Arc<Agent>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    // Access times come from the I/O events (see `drain_access`). Drained on a short tick rather than awaited one by one: waking this task for every event costs a
    // context switch per GET on a busy gateway. The channel holds a tick's worth at about 150k events/s.
    let mut events = agent
        .telemetry()
        .subscribe_ops(ACCESS_EVENTS_CAPACITY, &[strata_types::Op::Get]);
    let names: HashMap<String, String> = agent
        .backends()
        .iter()
        .map(|b| (b.backend.id().to_string(), b.name.clone()))
        .collect();
    tokio::spawn(async move {
        let sample_every = Duration::from_secs(agent.config().catalog.sample_interval_secs);
        let mut drain = tokio::time::interval(ACCESS_DRAIN_EVERY);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush = tokio::time::interval(Duration::from_secs(5));
        let mut minute = tokio::time::interval(Duration::from_secs(60));
        // Claims' TTLs are checked often (a claim's shortest TTL is 10 s), and their accounting sampled.
        let mut claims = tokio::time::interval(Duration::from_secs(5));
        claims.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sample = tokio::time::interval(sample_every);
        let abort_after = Duration::from_secs(agent.config().catalog.abort_uploads_after_secs);
        let mut uploads = tokio::time::interval(
            (abort_after / 4).clamp(Duration::from_secs(1), Duration::from_secs(3600)),
        );
        uploads.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweep = UploadSweep::new(abort_after);
        flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        minute.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = drain.tick() => drain_access(&agent, &names, &mut events),
                _ = flush.tick() => {
                    if let Err(e) = agent.access.flush(agent.catalog()).await {
                        tracing::warn!(error = %e, "recording access times");
                    }
                }
                _ = minute.tick() => {
                    match agent.catalog().reap_reservations().await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(released = n, "released expired quota reservations"),
                        Err(e) => tracing::warn!(error = %e, "reaping reservations"),
                    }
                    if let Err(e) = expire_scratch(&agent).await {
                        tracing::warn!(error = %e, "expiring scratch");
                    }

                }
                _ = claims.tick() => {
                    match crate::claims::expire(&agent).await {
                        Ok(0) => {}
                        Ok(n) => tracing::info!(released = n, "released claims past their TTL"),
                        Err(e) => tracing::warn!(error = %e, "expiring claims"),
                    }
                }
                _ = uploads.tick(), if !abort_after.is_zero() => {
                    if let Err(e) = sweep.run(&agent).await {
                        tracing::warn!(error = %e, "aborting stale multipart uploads");
                    }
                }
                _ = sample.tick() => {
                    if let Err(e) = sample_usage(&agent).await {
                        tracing::warn!(error = %e, "sampling usage");
                    }
                    match compute_forecasts(&agent).await {
                        Ok(lines) => {
                            for l in lines.iter().filter(|l| l.alert) {
                                tracing::warn!(
                                    kind = %l.kind,
                                    scope = %l.scope,
                                    days = ?l.forecast.as_ref().and_then(|f| f.days_low),
                                    "capacity forecast: fills within the alert threshold"
                                );
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "computing forecasts"),
                    }
                }
            }
        }
        drain_access(&agent, &names, &mut events);
        if let Err(e) = agent.access.flush(agent.catalog()).await {
            tracing::warn!(error = %e, "recording access times at shutdown");
        }
    })
}

/// Turn the buffered I/O events into access times: every read served (by any tier) of a configured
/// backend's object (`names`: backend id to name).
fn drain_access(
    agent: &Agent,
    names: &HashMap<String, String>,
    events: &mut tokio::sync::mpsc::Receiver<strata_types::IoEvent>,
) {
    while let Ok(ev) = events.try_recv() {
        if ev.op == strata_types::Op::Get
            && ev.outcome == strata_types::Outcome::Ok
            && let Some(name) = names.get(ev.backend.as_ref())
        {
            let at = ev
                .at
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            agent.access.record(name, &ev.key, at);
        }
    }
}
