//! The operator's Prometheus metrics, served at `/metrics` by `strata operator`.

use std::time::Duration;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry, TextEncoder,
};

/// Counters of what the operator did.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    duration: Histogram,
    forced: IntCounter,
    statuses: IntCounterVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Fresh counters in their own registry.
    pub fn new() -> Self {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "strata_operator_reconciles_total",
                "DataClaim reconciles, by outcome (ok, error)",
            ),
            &["outcome"],
        )
        .expect("a valid metric");
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "strata_operator_reconcile_seconds",
                "Time one DataClaim reconcile took",
            )
            .buckets(vec![0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0]),
        )
        .expect("a valid metric");
        let forced = IntCounter::new(
            "strata_operator_forced_releases_total",
            "Deleted DataClaims whose finalizer was removed without the agent confirming the release",
        )
        .expect("a valid metric");
        let statuses = IntCounterVec::new(
            Opts::new(
                "strata_operator_status_writes_total",
                "Reconciles that ended by writing an object's status (written) or found it as computed \
                 (unchanged), by kind",
            ),
            &["kind", "result"],
        )
        .expect("a valid metric");
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(duration.clone()),
            Box::new(forced.clone()),
            Box::new(statuses.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Self {
            registry,
            reconciles,
            duration,
            forced,
            statuses,
        }
    }

    /// One reconcile ended.
    pub fn reconciled(&self, ok: bool, took: Duration) {
        self.reconciles
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
        self.duration.observe(took.as_secs_f64());
    }

    /// A reconcile of a `kind` object wrote its status (`written`) or found nothing to write.
    pub fn status(&self, kind: &str, written: bool) {
        self.statuses
            .with_label_values(&[kind, if written { "written" } else { "unchanged" }])
            .inc();
    }

    /// Reconciles of `kind` objects so far that wrote a status (`written`) or did not.
    pub fn statuses(&self, kind: &str, written: bool) -> u64 {
        self.statuses
            .with_label_values(&[kind, if written { "written" } else { "unchanged" }])
            .get()
    }

    /// A finalizer went without a confirmed release.
    pub fn forced_release(&self) {
        self.forced.inc();
    }

    /// Reconciles so far with `outcome` (`ok`, `error`).
    pub fn reconciles(&self, outcome: &str) -> u64 {
        self.reconciles.with_label_values(&[outcome]).get()
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}
