use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use strata_telemetry::Telemetry;
use strata_types::{Op, Result};

/// When and how often a failed backend operation is tried again.
///
/// Only errors whose [`strata_types::Error::is_retryable`] is true are retried; a `NotFound` or a
/// `PreconditionFailed` fails at once. Delays grow exponentially from `initial_backoff` up to `max_backoff`, with
/// full jitter, so a fleet of agents does not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryPolicy {
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// Upper bound of the first delay.
    #[serde(with = "millis")]
    pub initial_backoff: Duration,
    /// Upper bound of any delay.
    #[serde(with = "millis")]
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1-based): uniform in `[0, min(max, initial * 2^(attempt-1))]`.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let cap = exp.min(self.max_backoff);
        let nanos = cap.as_nanos().min(u64::MAX as u128) as u64;
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(rand::rng().random_range(0..=nanos))
    }

    /// Run `f` until it succeeds, fails with a non-retryable error, or the retries run out; each retry is
    /// counted in `telemetry` under `op`.
    pub async fn run<T, F, Fut>(&self, telemetry: &Telemetry, op: Op, f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.run_observed(
            |e, attempt| {
                telemetry.record_retry(op, e.kind());
                tracing::debug!(op = op.as_str(), attempt, error = %e, "retrying backend operation");
            },
            f,
        )
        .await
    }

    /// [`RetryPolicy::run`] for callers that are not backends (the agent's clients): `on_retry` sees each
    /// retried error and the retry's number before the delay.
    pub async fn run_observed<T, F, Fut>(
        &self,
        mut on_retry: impl FnMut(&strata_types::Error, u32),
        mut f: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut attempt = 0u32;
        loop {
            match f().await {
                Ok(v) => return Ok(v),
                Err(e) if e.is_retryable() && attempt < self.max_retries => {
                    attempt += 1;
                    on_retry(&e, attempt);
                    tokio::time::sleep(self.backoff(attempt)).await;
                }
                Err(e) => {
                    return Err(if attempt > 0 {
                        e.context(format!("after {attempt} retries"))
                    } else {
                        e
                    });
                }
            }
        }
    }
}

/// Adapter so `object_store` retries multipart parts with the same policy and counts them.
#[derive(Debug)]
pub(crate) struct PartRetry {
    pub(crate) policy: RetryPolicy,
    pub(crate) telemetry: Arc<Telemetry>,
}

#[async_trait::async_trait]
impl object_store::retry::RetryPolicy for PartRetry {
    async fn retry(&self, context: object_store::retry::RetryContext) -> bool {
        let attempt = context.attempt as u32;
        if attempt > self.policy.max_retries {
            return false;
        }
        let kind = match context.failure {
            object_store::retry::RetryFailure::Status(s) => {
                crate::classify::status_kind(s.as_u16())
            }
            _ => strata_types::ErrorKind::Unavailable,
        };
        if !kind.default_retryable() {
            return false;
        }
        self.telemetry.record_retry(Op::Put, kind);
        tokio::time::sleep(self.policy.backoff(attempt)).await;
        true
    }
}

mod millis {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use strata_types::{Error, ErrorKind};

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn retries_only_retryable_errors_and_is_bounded() {
        let t = Telemetry::new();
        let calls = AtomicU32::new(0);
        let r: Result<()> = fast()
            .run(&t, Op::Get, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(Error::new(ErrorKind::Unavailable, "503"))
            })
            .await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Unavailable);
        assert_eq!(calls.load(Ordering::SeqCst), 4, "1 attempt + 3 retries");
        assert_eq!(t.metrics().retries_total(), 3);

        calls.store(0, Ordering::SeqCst);
        let r: Result<()> = fast()
            .run(&t, Op::Get, || async {
                calls.fetch_add(1, Ordering::SeqCst);
                Err(Error::new(ErrorKind::NotFound, "404"))
            })
            .await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "permanent errors are not retried"
        );
    }

    #[tokio::test]
    async fn succeeds_after_transient_failures() {
        let t = Telemetry::new();
        let calls = AtomicU32::new(0);
        let r = fast()
            .run(&t, Op::Get, || async {
                if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(Error::new(ErrorKind::Timeout, "slow"))
                } else {
                    Ok(7)
                }
            })
            .await;
        assert_eq!(r.unwrap(), 7);
    }

    #[test]
    fn backoff_is_capped() {
        let p = RetryPolicy {
            max_retries: 30,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
        };
        for a in 1..30 {
            assert!(p.backoff(a) <= Duration::from_millis(300));
        }
    }
}
