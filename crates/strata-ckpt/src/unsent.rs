//! Steps committed locally whose upload to the object store failed: "committed means eventually durable".
//!
//! A save whose upload fails (the store is down, or hangs past its timeouts) leaves its step committed in
//! the local tier only. Such a step is recorded here, in memory and as a marker file in its local step
//! directory (`.unsent-rank-N`, so the next process of the run knows it too), and:
//!
//! - local retention keeps it until it is durable in the store itself, or the store's own retention would
//!   drop it anyway: newer steps reaching the store do not make it expendable ([`crate::Checkpointer`]'s
//!   `retain`);
//! - a background task retries its upload, oldest first, with a backoff from 0.5 s to 30 s, until it lands
//!   (or its local copy is gone), then ends. [`Unsent::stop`] ends it at once (the checkpointer is closed);
//!   the markers keep the steps for the next process, whose `finish_pending` uploads them.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use crate::Tier;

/// Shortest and longest wait between two tries of an upload.
const FIRST_WAIT: Duration = Duration::from_millis(500);
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// This rank's unsent steps, and whether a task is retrying them.
#[derive(Debug, Default)]
pub(crate) struct Unsent {
    state: Mutex<State>,
    stop: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    steps: BTreeSet<u64>,
    retrying: bool,
}

impl Unsent {
    /// The unsent steps a previous process of the run left (their markers in the local tier).
    pub(crate) fn found(local: &Tier, run: &str, rank: u32, steps: &[u64]) -> Self {
        let me = Self::default();
        if let Tier::Local(root) = local {
            for &s in steps {
                if marker(root, run, s, rank).exists() {
                    me.state.lock().steps.insert(s);
                }
            }
        }
        me
    }

    /// Whether `step` is unsent.
    pub(crate) fn contains(&self, step: u64) -> bool {
        self.state.lock().steps.contains(&step)
    }

    /// Every unsent step, oldest first.
    pub(crate) fn steps(&self) -> Vec<u64> {
        self.state.lock().steps.iter().copied().collect()
    }

    /// Record `step` as unsent (and its marker); returns whether a retrying task must be started.
    pub(crate) fn add(&self, local: &Tier, run: &str, rank: u32, step: u64) -> bool {
        if let Tier::Local(root) = local {
            let m = marker(root, run, step, rank);
            if let Err(e) = std::fs::write(&m, b"") {
                tracing::warn!(step, error = %e, marker = %m.display(), "recording an unsent step (kept in memory only)");
            }
        }
        let mut s = self.state.lock();
        s.steps.insert(step);
        !std::mem::replace(&mut s.retrying, true) && !self.stop.is_cancelled()
    }

    /// `step` reached the store (or its local copy is gone): forget it.
    pub(crate) fn remove(&self, local: &Tier, run: &str, rank: u32, step: u64) {
        if !self.state.lock().steps.remove(&step) {
            return;
        }
        if let Tier::Local(root) = local {
            let _ = std::fs::remove_file(marker(root, run, step, rank));
        }
    }

    /// The oldest unsent step, or `None` (and the retrying task ends: the next `add` starts another).
    pub(crate) fn next(&self) -> Option<u64> {
        let mut s = self.state.lock();
        let first = s.steps.first().copied();
        if first.is_none() {
            s.retrying = false;
        }
        first
    }

    /// Wait before the next try: `Err` once stopped.
    pub(crate) async fn pause(&self, wait: Duration) -> Result<(), ()> {
        tokio::select! {
            _ = self.stop.cancelled() => Err(()),
            _ = tokio::time::sleep(wait) => Ok(()),
        }
    }

    /// End the retrying task (its steps stay marked for the next process).
    pub(crate) fn stop(&self) {
        self.stop.cancel();
    }

    /// The wait after `wait` failed once more.
    pub(crate) fn backoff(wait: Duration) -> Duration {
        (wait * 2).min(LONGEST_WAIT)
    }

    /// The first wait.
    pub(crate) fn first_wait() -> Duration {
        FIRST_WAIT
    }
}

/// Whether any rank marked `step` unsent in the local tier `local`.
pub(crate) fn marked(local: &Tier, run: &str, step: u64) -> bool {
    let Tier::Local(root) = local else {
        return false;
    };
    std::fs::read_dir(Tier::local_step(root, run, step)).is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".unsent-rank-"))
    })
}

/// The marker of an unsent step of `rank` in a local tier rooted at `root`.
fn marker(root: &std::path::Path, run: &str, step: u64, rank: u32) -> PathBuf {
    Tier::local_step(root, run, step).join(format!(".unsent-rank-{rank}"))
}
