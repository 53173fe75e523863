//! Reads through a catalog outage.
//!
//! Every request looks up its caller (a token, an S3 key), who owns what it touches and, for created buckets,
//! whether the bucket exists. Those answers are cached for seconds; when the catalog fails or hangs, a
//! lookup that has an answer from the last [`GRACE`] uses it instead, so a principal keeps reading what it
//! could read a minute ago, and data in the cache stays readable. The rules:
//!
//! - a lookup with nothing cached waits for the catalog as before (its error is the request's);
//! - a lookup with a cached answer younger than [`GRACE`] waits at most [`WAIT`] for a fresh one, then uses
//!   the cached one; after a failure the catalog counts as down for [`DOWN_FOR`], during which such lookups
//!   do not ask it at all (a hung catalog costs one wait, not one per request);
//! - only retryable failures (unreachable, timed out) fall back: an answer the catalog gives is used.
//!
//! Writes are not helped: quota admission and the inventory need the catalog, and are refused with a
//! retryable error while it is away.

use std::future::Future;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_types::{Error, ErrorKind, Result};

/// The oldest cached answer a lookup uses while the catalog is away.
pub const GRACE: Duration = Duration::from_secs(600);
/// How long a lookup that has a cached answer waits for the catalog.
pub const WAIT: Duration = Duration::from_secs(2);
/// How long after a failure lookups with a cached answer do not ask the catalog.
pub const DOWN_FOR: Duration = Duration::from_secs(5);
/// At most one warning per this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Whether the catalog was seen failing lately.
#[derive(Debug)]
pub struct Outage {
    down_since: Mutex<Option<Instant>>,
    warned: Mutex<Option<Instant>>,
    grace: Duration,
    wait: Duration,
    down_for: Duration,
}

impl Default for Outage {
    fn default() -> Self {
        Self::with_timing(GRACE, WAIT, DOWN_FOR)
    }
}

impl Outage {
    /// An outage rule with other bounds than [`GRACE`], [`WAIT`], [`DOWN_FOR`] (tests).
    pub fn with_timing(grace: Duration, wait: Duration, down_for: Duration) -> Self {
        Self {
            down_since: Mutex::new(None),
            warned: Mutex::new(None),
            grace,
            wait,
            down_for,
        }
    }

    /// A fresh answer from `fetch`, or, when it fails or takes longer than [`WAIT`] and `cached` (its value
    /// and when it was fetched) is younger than [`GRACE`], the cached one.
    pub async fn fetch<T: Clone>(
        &self,
        what: &str,
        cached: Option<(Instant, T)>,
        fetch: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let Some((at, value)) = cached.filter(|(at, _)| at.elapsed() < self.grace) else {
            // Nothing to stand in: the catalog's answer, or at once its absence when it is known away.
            self.refuse_if_down()?;
            let r = fetch.await;
            self.note(&r);
            return r;
        };
        if self.is_down() {
            return Ok(value);
        }
        let r = match tokio::time::timeout(self.wait, fetch).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Unavailable,
                format!("the catalog did not answer within {:?}", self.wait),
            )),
        };
        self.note(&r);
        match r {
            Err(e) if e.is_retryable() => {
                self.warn(what, at, &e);
                Ok(value)
            }
            other => other,
        }
    }

    /// `Err` (unavailable, retryable) while the catalog counts as down: for what cannot do without it (a
    /// write's quota admission, a lookup with nothing cached), refused at once rather than after the
    /// connection pool's wait.
    pub fn refuse_if_down(&self) -> Result<()> {
        match *self.down_since.lock() {
            Some(t) if t.elapsed() < self.down_for => Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the catalog is unreachable (it failed {} ms ago); retry shortly",
                    t.elapsed().as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }

    fn is_down(&self) -> bool {
        self.down_since
            .lock()
            .is_some_and(|t| t.elapsed() < self.down_for)
    }

    /// Record how a catalog call went (a retryable failure marks the catalog down).
    pub fn note<T>(&self, r: &Result<T>) {
        let mut d = self.down_since.lock();
        match r {
            Ok(_) => *d = None,
            Err(e) if e.is_retryable() => *d = Some(Instant::now()),
            Err(_) => {}
        }
    }

    fn warn(&self, what: &str, at: Instant, e: &Error) {
        let mut w = self.warned.lock();
        if w.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            *w = Some(Instant::now());
            tracing::warn!(error = %e, what, cached_secs = at.elapsed().as_secs(), "the catalog is away: using cached answers (for up to {} s)", self.grace.as_secs());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn away() -> Result<u32> {
        Err(Error::new(ErrorKind::Unavailable, "catalog down"))
    }

    const MS: Duration = Duration::from_millis(1);

    #[tokio::test]
    async fn a_cached_answer_stands_in_while_the_catalog_is_away_and_only_then() {
        let o = Outage::with_timing(MS * 2000, MS * 50, MS * 200);
        // nothing cached: the failure is the caller's, and while down the next is refused without asking
        assert!(o.fetch("x", None, async { away() }).await.is_err());
        let e = o
            .fetch::<u32>("x", None, async { panic!("asked while down") })
            .await
            .unwrap_err();
        assert!(e.is_retryable() && o.refuse_if_down().is_err());
        // cached: used without asking while down
        let cached = Some((Instant::now(), 7));
        assert_eq!(
            o.fetch("x", cached, async { panic!("asked while down") })
                .await
                .unwrap(),
            7
        );
        // a hung catalog: the wait is bounded, the cached answer used
        tokio::time::sleep(MS * 250).await;
        let hung = o
            .fetch("x", Some((Instant::now(), 8)), std::future::pending())
            .await;
        assert_eq!(hung.unwrap(), 8);
        // back: the catalog's answer wins, and a non-retryable error is not hidden
        tokio::time::sleep(MS * 250).await;
        assert_eq!(
            o.fetch("x", Some((Instant::now(), 1)), async { Ok(2) })
                .await
                .unwrap(),
            2
        );
        assert!(o.refuse_if_down().is_ok());
        let refused = o
            .fetch("x", Some((Instant::now(), 1)), async {
                Err::<u32, _>(Error::new(ErrorKind::PermissionDenied, "no"))
            })
            .await;
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::PermissionDenied);
        // too old a cached answer is not used
        let old = Some((Instant::now() - MS * 3000, 3));
        assert!(o.fetch("x", old, async { away() }).await.is_err());
    }
}
