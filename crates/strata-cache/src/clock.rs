//! Where the metadata cache reads the time: its TTL, refresh points, the cluster's lease, and when answers and
//! invalidations were confirmed. The agent uses the system's monotonic clock ([`SystemClock`]); tests move a
//! [`ManualClock`] forward instead of sleeping through a TTL. Block reads, fills and the staging hold keep the
//! system clock: they wait on real I/O.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A monotonic clock.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Now.
    fn now(&self) -> Instant;
}

/// The system's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// The system's clock plus an offset a test moves forward ([`ManualClock::advance`]): time passes as it
/// does, and jumps when told.
#[derive(Debug, Default)]
pub struct ManualClock {
    offset: Mutex<Duration>,
}

impl ManualClock {
    /// A clock at the system's time.
    pub fn new() -> Self {
        Self::default()
    }

    /// Move it forward by `d`.
    pub fn advance(&self, d: Duration) {
        *self.offset.lock() += d;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        Instant::now() + *self.offset.lock()
    }
}
