//! The control plane's in-memory state kept on the agent: gateway access times waiting to be flushed, the
//! token cache, the latest forecasts.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use parking_lot::Mutex;
use strata_catalog::{Catalog, Principal};
use strata_types::Result;

/// Shared state of the control plane inside the agent.
#[derive(Debug, Default)]
pub struct AccessLog {
    reads: Mutex<PendingReads>,
    pub(crate) dropped: std::sync::atomic::AtomicU64,
    pub(super) forecasts: Mutex<Vec<ForecastLine>>,
    pub(super) tokens: Mutex<HashMap<String, (std::time::Instant, Principal)>>,
}

/// Last read time of each object read since the last flush, by backend then key (looked up by `&str`: a read
/// of an object already pending allocates nothing).
#[derive(Debug, Default)]
struct PendingReads {
    by_backend: HashMap<String, HashMap<String, i64>>,
    len: usize,
}

/// Reads of one object version within this many seconds of the last recorded one are not recorded again.
/// One second is the catalog's own resolution (a clean-up skips an object read *after* its plan, compared in
/// whole seconds), so nothing it decides on is lost, and a hot object costs one record a second, not one per
/// read.
pub const ACCESS_RESOLUTION_SECS: i64 = 1;

/// Most distinct objects whose read times wait for the next flush; more are dropped (and counted).
const MAX_PENDING_READS: usize = 100_000;
/// How long an authenticated token is remembered (revocation takes effect within this).
pub(super) const TOKEN_CACHE: Duration = Duration::from_secs(5);

impl AccessLog {
    /// Note a read of `key` on the backend named `backend`.
    pub fn record(&self, backend: &str, key: &str, at: i64) {
        let mut r = self.reads.lock();
        if let Some(e) = r.by_backend.get_mut(backend).and_then(|m| m.get_mut(key)) {
            *e = (*e).max(at);
            return;
        }
        if r.len >= MAX_PENDING_READS {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        r.len += 1;
        match r.by_backend.get_mut(backend) {
            Some(m) => {
                m.insert(key.to_string(), at);
            }
            None => {
                r.by_backend
                    .insert(backend.to_string(), HashMap::from([(key.to_string(), at)]));
            }
        }
    }

    /// Write pending reads to the catalog.
    pub async fn flush(&self, catalog: &Catalog) -> Result<()> {
        let pending = std::mem::take(&mut *self.reads.lock());
        let by_backend: BTreeMap<String, Vec<(String, i64)>> = pending
            .by_backend
            .into_iter()
            .map(|(b, m)| (b, m.into_iter().collect()))
            .collect();
        for (b, list) in by_backend {
            catalog.touch(&b, &list).await?;
        }
        Ok(())
    }

    /// The latest forecasts.
    pub fn forecasts(&self) -> Vec<ForecastLine> {
        self.forecasts.lock().clone()
    }
}

/// One forecast as served by `/v1/forecast` and exported as metrics.
pub use strata_api::admin::ForecastLine;
