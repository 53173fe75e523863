//! I/O events and the metrics derived from them.
//!
//! Every backend operation and every cache lookup produces an [`IoEvent`]. [`Telemetry::emit`] does two things
//! with it, both without blocking:
//!
//! 1. It updates the Prometheus metrics in place (atomic counters and histograms), so metrics are exact even
//!    when consumers fall behind.
//! 2. It offers the event to every subscriber's bounded channel with `try_send`. A full channel drops the event
//!    and counts it in `strata_events_dropped_total`: telemetry is lossy under pressure, I/O never waits for it.
//!
//! Later analytics (heat maps, stall attribution, placement) subscribe with [`Telemetry::subscribe`].
//! [`Telemetry::subscribe_ops`] takes the events of some ops only, which are then the only ones cloned for it
//! (the agent's access-time drain takes backend GETs: a cache hit is not cloned into a channel it would be
//! dropped from).
//!
//! The metric children of each (op, tier, outcome) are resolved once, on first use, not looked up by label per
//! event (`with_label_values` hashes its labels and takes a lock: too much for every cache hit). Retries
//! ([`Telemetry::record_retry`]) and loader progress ([`Metrics::record_loader`]) are counted here too. The
//! cache's own state (usage, evictions, disk faults, fills) is not an event: the agent renders it from
//! `CacheStats` at scrape time, after these families.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::RwLock;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};
use strata_types::{ErrorKind, IoEvent, Op, Outcome, Tier};
use tokio::sync::mpsc;

pub use strata_types::IoContext;

/// Latency buckets (seconds): 50 µs to 30 s, covering RAM hits to slow object-store reads.
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];

/// The metric families derived from I/O events.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    bytes: IntCounterVec,
    latency: HistogramVec,
    cache_hits: IntCounterVec,
    cache_misses: IntCounter,
    backend_errors: IntCounterVec,
    backend_retries: IntCounterVec,
    events_dropped: IntCounter,
    loader_samples: IntCounterVec,
    loader_stall: prometheus::CounterVec,
    loader_skipped: IntCounterVec,
    /// The children of `requests`, `bytes`, `latency` and `cache_hits` for each (op, tier, outcome), resolved
    /// on first use: `with_label_values` hashes its labels and takes a lock, too much for every cache hit.
    handles: Arc<[OnceLock<Handles>; HANDLES]>,
}

/// The metric children one kind of successful or failed event updates.
#[derive(Debug)]
struct Handles {
    requests: IntCounter,
    bytes: IntCounter,
    latency: prometheus::Histogram,
    /// `cache_hits{tier}` for a cache lookup served by a tier, else `None`.
    hit: Option<IntCounter>,
}

const OPS: usize = 7;
const TIERS: usize = 5;
const HANDLES: usize = OPS * TIERS * 2;

/// The number of `op` (exhaustive matches: a new variant must be numbered here).
fn op_number(op: Op) -> usize {
    match op {
        Op::Get => 0,
        Op::Head => 1,
        Op::Put => 2,
        Op::List => 3,
        Op::Delete => 4,
        Op::Copy => 5,
        Op::CacheLookup => 6,
    }
}

/// Index of an event kind in [`Metrics::handles`].
fn handle_index(op: Op, tier: Tier, ok: bool) -> usize {
    let t = match tier {
        Tier::Ram => 0,
        Tier::Disk => 1,
        Tier::Peer => 2,
        Tier::Backend => 3,
        Tier::Miss => 4,
    };
    (op_number(op) * TIERS + t) * 2 + usize::from(ok)
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "strata_io_requests_total",
                "I/O operations by op, serving tier and outcome",
            ),
            &["op", "tier", "outcome"],
        )
        .expect("static metric definition");
        let bytes = IntCounterVec::new(
            Opts::new(
                "strata_io_bytes_total",
                "Bytes moved by op and serving tier",
            ),
            &["op", "tier"],
        )
        .expect("static metric definition");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "strata_io_latency_seconds",
                "Latency of I/O operations by op and tier",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["op", "tier"],
        )
        .expect("static metric definition");
        let cache_hits = IntCounterVec::new(
            Opts::new(
                "strata_cache_hits_total",
                "Cache block lookups served, by tier",
            ),
            &["tier"],
        )
        .expect("static metric definition");
        let cache_misses = IntCounter::new(
            "strata_cache_misses_total",
            "Cache block lookups no tier could serve (filled from the backend)",
        )
        .expect("static metric definition");
        let backend_errors = IntCounterVec::new(
            Opts::new(
                "strata_backend_errors_total",
                "Failed backend operations (after retries), by op and error kind",
            ),
            &["op", "kind"],
        )
        .expect("static metric definition");
        let backend_retries = IntCounterVec::new(
            Opts::new(
                "strata_backend_retries_total",
                "Backend operation retries, by op and the error kind retried",
            ),
            &["op", "kind"],
        )
        .expect("static metric definition");
        let events_dropped = IntCounter::new(
            "strata_events_dropped_total",
            "I/O events dropped because a telemetry subscriber was full",
        )
        .expect("static metric definition");
        let loader_samples = IntCounterVec::new(
            Opts::new(
                "strata_loader_samples_total",
                "Samples the dataset loader handed to the training loop, by rank",
            ),
            &["rank"],
        )
        .expect("static metric definition");
        let loader_stall = prometheus::CounterVec::new(
            Opts::new(
                "strata_loader_stall_seconds_total",
                "Time the training loop waited for a sample that was not ready (I/O stall), by rank",
            ),
            &["rank"],
        )
        .expect("static metric definition");
        let loader_skipped = IntCounterVec::new(
            Opts::new(
                "strata_loader_skipped_total",
                "Corrupt samples skipped by the loader (only when skipping is enabled), by rank",
            ),
            &["rank"],
        )
        .expect("static metric definition");
        for c in [
            Box::new(loader_samples.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(loader_stall.clone()),
            Box::new(loader_skipped.clone()),
            Box::new(requests.clone()),
            Box::new(bytes.clone()),
            Box::new(latency.clone()),
            Box::new(cache_hits.clone()),
            Box::new(cache_misses.clone()),
            Box::new(backend_errors.clone()),
            Box::new(backend_retries.clone()),
            Box::new(events_dropped.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        // Families with labels only appear once a label set is used: start the common ones at zero so
        // dashboards and alerts see every family from the first scrape.
        for tier in [Tier::Ram, Tier::Disk] {
            cache_hits.with_label_values(&[tier.as_str()]);
        }
        for op in [Op::Get, Op::Put, Op::Head, Op::List] {
            for kind in [ErrorKind::Unavailable, ErrorKind::Timeout] {
                backend_errors.with_label_values(&[op.as_str(), kind.as_str()]);
                backend_retries.with_label_values(&[op.as_str(), kind.as_str()]);
            }
        }
        Self {
            registry,
            requests,
            bytes,
            latency,
            cache_hits,
            cache_misses,
            backend_errors,
            backend_retries,
            events_dropped,
            loader_samples,
            loader_stall,
            loader_skipped,
            handles: Arc::new(std::array::from_fn(|_| OnceLock::new())),
        }
    }

    /// Count loader progress of `rank`: samples delivered, seconds stalled, corrupt samples skipped.
    pub fn record_loader(&self, rank: &str, samples: u64, stall_secs: f64, skipped: u64) {
        if samples > 0 {
            self.loader_samples
                .with_label_values(&[rank])
                .inc_by(samples);
        }
        if stall_secs > 0.0 {
            self.loader_stall
                .with_label_values(&[rank])
                .inc_by(stall_secs);
        }
        if skipped > 0 {
            self.loader_skipped
                .with_label_values(&[rank])
                .inc_by(skipped);
        }
    }

    fn record(&self, ev: &IoEvent) {
        let ok = ev.outcome == Outcome::Ok;
        let h = self.handles[handle_index(ev.op, ev.tier, ok)].get_or_init(|| {
            let (op, tier) = (ev.op.as_str(), ev.tier.as_str());
            let outcome = if ok { "ok" } else { "error" };
            Handles {
                requests: self.requests.with_label_values(&[op, tier, outcome]),
                bytes: self.bytes.with_label_values(&[op, tier]),
                latency: self.latency.with_label_values(&[op, tier]),
                hit: (ev.op == Op::CacheLookup && ev.tier != Tier::Miss)
                    .then(|| self.cache_hits.with_label_values(&[tier])),
            }
        });
        h.requests.inc();
        if ev.bytes > 0 {
            h.bytes.inc_by(ev.bytes);
        }
        h.latency.observe(ev.latency.as_secs_f64());
        if ev.op == Op::CacheLookup {
            match &h.hit {
                Some(hit) => hit.inc(),
                None => self.cache_misses.inc(),
            }
        } else if let Outcome::Err(kind) = ev.outcome {
            self.backend_errors
                .with_label_values(&[ev.op.as_str(), kind.as_str()])
                .inc();
        }
    }

    /// The Prometheus text exposition of every family.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let families = self.registry.gather();
        // Encoding into a Vec cannot fail for well-formed families.
        let _ = TextEncoder::new().encode(&families, &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Current value of `strata_backend_retries_total` summed over labels (for tests and stats).
    pub fn retries_total(&self) -> u64 {
        sum_counter_vec(&self.backend_retries)
    }

    /// Current value of `strata_backend_errors_total` summed over labels.
    pub fn backend_errors_total(&self) -> u64 {
        sum_counter_vec(&self.backend_errors)
    }

    /// Current value of `strata_cache_hits_total{tier}`.
    pub fn cache_hits(&self, tier: Tier) -> u64 {
        self.cache_hits.with_label_values(&[tier.as_str()]).get()
    }

    /// Current value of `strata_cache_misses_total`.
    pub fn cache_misses(&self) -> u64 {
        self.cache_misses.get()
    }
}

fn sum_counter_vec(v: &IntCounterVec) -> u64 {
    use prometheus::core::Collector;
    v.collect()
        .iter()
        .flat_map(|mf| {
            mf.get_metric()
                .iter()
                .map(|m| m.get_counter().get_value() as u64)
        })
        .sum()
}

/// The event hub: metrics plus bounded, lossy fan-out to subscribers. Share it as `Arc<Telemetry>`.
#[derive(Debug)]
pub struct Telemetry {
    metrics: Metrics,
    /// Each subscriber's channel and the ops it asked for ([`op_bit`]).
    subscribers: RwLock<Vec<(mpsc::Sender<IoEvent>, u8)>>,
    emitted: AtomicU64,
}

/// Bit of `op` in a subscriber's op mask.
fn op_bit(op: Op) -> u8 {
    1 << op_number(op)
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            metrics: Metrics::new(),
            subscribers: RwLock::new(Vec::new()),
            emitted: AtomicU64::new(0),
        }
    }
}

impl Telemetry {
    /// A new hub with no subscribers.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Record an event: metrics in place, then offered to each subscriber without waiting.
    pub fn emit(&self, ev: IoEvent) {
        self.metrics.record(&ev);
        self.emitted.fetch_add(1, Ordering::Relaxed);
        let subs = self.subscribers.read();
        let mut closed = false;
        let bit = op_bit(ev.op);
        for (tx, _) in subs.iter().filter(|(_, mask)| mask & bit != 0) {
            match tx.try_send(ev.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => self.metrics.events_dropped.inc(),
                Err(mpsc::error::TrySendError::Closed(_)) => closed = true,
            }
        }
        drop(subs);
        if closed {
            self.subscribers.write().retain(|(tx, _)| !tx.is_closed());
        }
    }

    /// Record one retry of a backend operation after an error of `kind`.
    pub fn record_retry(&self, op: Op, kind: ErrorKind) {
        self.metrics
            .backend_retries
            .with_label_values(&[op.as_str(), kind.as_str()])
            .inc();
    }

    /// Subscribe to the event stream through a channel of `capacity` events (at least 1). Events that find the
    /// channel full are dropped and counted. Dropping the receiver unsubscribes.
    pub fn subscribe(&self, capacity: usize) -> mpsc::Receiver<IoEvent> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.subscribers.write().push((tx, u8::MAX));
        rx
    }

    /// Like [`Self::subscribe`], for the events of `ops` only: the others are neither cloned nor queued for
    /// this subscriber (a cache hit emits an event; a subscriber that wants backend reads should not pay for
    /// every hit).
    pub fn subscribe_ops(&self, capacity: usize, ops: &[Op]) -> mpsc::Receiver<IoEvent> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let mask = ops.iter().fold(0u8, |m, &op| m | op_bit(op));
        self.subscribers.write().push((tx, mask));
        rx
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Events emitted so far.
    pub fn emitted(&self) -> u64 {
        self.emitted.load(Ordering::Relaxed)
    }

    /// Events dropped because a subscriber was full.
    pub fn dropped(&self) -> u64 {
        self.metrics.events_dropped.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn ev(op: Op, tier: Tier, outcome: Outcome) -> IoEvent {
        IoEvent {
            at: SystemTime::now(),
            op,
            backend: "memory://".into(),
            key: "k".into(),
            bytes: 10,
            latency: Duration::from_millis(1),
            tier,
            outcome,
            ctx: IoContext::default(),
        }
    }

    #[test]
    fn metrics_follow_events() {
        let t = Telemetry::new();
        t.emit(ev(Op::CacheLookup, Tier::Ram, Outcome::Ok));
        t.emit(ev(Op::CacheLookup, Tier::Miss, Outcome::Ok));
        t.emit(ev(
            Op::Get,
            Tier::Backend,
            Outcome::Err(ErrorKind::Unavailable),
        ));
        t.record_retry(Op::Get, ErrorKind::Unavailable);
        assert_eq!(t.metrics().cache_hits(Tier::Ram), 1);
        assert_eq!(t.metrics().cache_misses(), 1);
        assert_eq!(t.metrics().backend_errors_total(), 1);
        assert_eq!(t.metrics().retries_total(), 1);
        let text = t.metrics().render();
        assert!(
            text.contains("strata_io_bytes_total{op=\"cache_lookup\",tier=\"ram\"} 10"),
            "{text}"
        );
        assert!(text.contains("strata_io_latency_seconds_bucket"));
    }

    #[tokio::test]
    async fn op_subscribers_get_only_their_ops() {
        let t = Telemetry::new();
        let mut gets = t.subscribe_ops(8, &[Op::Get, Op::Put]);
        let mut all = t.subscribe(8);
        for op in [Op::CacheLookup, Op::Get, Op::Head, Op::Put, Op::CacheLookup] {
            t.emit(ev(op, Tier::Backend, Outcome::Ok));
        }
        let mut got = Vec::new();
        while let Ok(e) = gets.try_recv() {
            got.push(e.op);
        }
        assert_eq!(got, vec![Op::Get, Op::Put]);
        let mut n = 0;
        while all.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 5);
        assert_eq!(t.dropped(), 0);
    }

    #[tokio::test]
    async fn full_subscribers_drop_and_count() {
        let t = Telemetry::new();
        let mut rx = t.subscribe(2);
        for _ in 0..5 {
            t.emit(ev(Op::Get, Tier::Backend, Outcome::Ok));
        }
        assert_eq!(t.dropped(), 3);
        assert_eq!(t.emitted(), 5);
        assert!(rx.recv().await.is_some());
        drop(rx);
        t.emit(ev(Op::Get, Tier::Backend, Outcome::Ok));
        assert!(
            t.subscribers.read().is_empty(),
            "closed subscriber is pruned"
        );
    }
}
