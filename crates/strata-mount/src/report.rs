//! The mount's own operations, counted and reported to the agent's analytics.
//!
//! The kernel asks the mount for metadata (lookup, getattr, open, opendir, readdir, statfs) and the mount
//! answers from its listing without asking the agent, so the agent never sees them. [`Counts`] counts them
//! (operations, failures such as `ENOENT`, time spent) and [`start`] sends what was counted to the agent every
//! [`EVERY`] as one report (`POST /v1/analytics/report`), counted there to the mount's team (its token's), job
//! (`--job`) and location like the agent's own operations. Reads are not counted here: they go to the agent,
//! which counts them itself.
//!
//! What the kernel answers from its own caches (entries and attributes for an hour, directory pages) never
//! reaches the mount, costs the storage nothing and is not counted. A `stat` of a name that is not there
//! reaches the mount every time (a failed lookup is not cached), which is what a metadata storm of
//! `os.path.exists` looks like.
//!
//! Lossy: a report the agent does not take (away, restarting) is dropped and logged, never retried, so a
//! mount never queues counts without bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_api::analytics as an;
use strata_client::AgentClient;

/// How often counts go to the agent.
pub const EVERY: Duration = Duration::from_secs(1);

/// Metadata operations answered since the last report.
#[derive(Debug, Default)]
pub struct Counts {
    ops: AtomicU64,
    errors: AtomicU64,
    nanos: AtomicU64,
    /// Reports the agent did not take.
    pub dropped: AtomicU64,
}

/// One operation being answered; counted when dropped.
#[derive(Debug)]
pub struct Op<'a> {
    counts: &'a Counts,
    start: Instant,
    ok: bool,
}

impl Op<'_> {
    /// The operation failed (its answer is an error).
    pub fn fail(&mut self) {
        self.ok = false;
    }
}

impl Drop for Op<'_> {
    fn drop(&mut self) {
        let c = self.counts;
        c.ops.fetch_add(1, Ordering::Relaxed);
        if !self.ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ns = self.start.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64;
        c.nanos.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Counts {
    /// Start counting one operation.
    pub fn op(&self) -> Op<'_> {
        Op {
            counts: self,
            start: Instant::now(),
            ok: true,
        }
    }

    /// What was counted since the last take, as a report's row (none if nothing was).
    pub fn take(&self) -> Option<an::ReportedOps> {
        let count = self.ops.swap(0, Ordering::Relaxed);
        let errors = self.errors.swap(0, Ordering::Relaxed).min(count);
        let nanos = self.nanos.swap(0, Ordering::Relaxed);
        (count > 0).then(|| an::ReportedOps {
            class: an::OpClass::MetaRead,
            count: count.min(1_000_000_000),
            errors: errors.min(1_000_000_000),
            bytes: 0,
            latency_us: nanos / 1000,
        })
    }
}

/// Report `counts` for `location` through `client` every [`EVERY`], on the current runtime, until the
/// runtime stops.
pub fn start(counts: Arc<Counts>, client: AgentClient, location: String) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(row) = counts.take() else { continue };
            let report = an::OpsReport {
                location: location.clone(),
                ops: vec![row],
            };
            if let Err(e) = client
                .call::<an::ReportOps>(&[], &strata_api::NoQuery {}, &report)
                .await
            {
                let n = counts.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::debug!(error = %e, dropped = n, "the agent did not take the mount's counts");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_taken_once_with_their_failures() {
        let c = Counts::default();
        assert!(c.take().is_none());
        drop(c.op());
        c.op().fail();
        drop(c.op());
        let r = c.take().expect("three");
        assert_eq!((r.count, r.errors, r.class), (3, 1, an::OpClass::MetaRead));
        assert!(c.take().is_none(), "taken once");
    }
}
