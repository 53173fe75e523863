//! Leader election on a `coordination.k8s.io/v1` Lease, so that several operator replicas can run and only
//! one reconciles. The API server is the arbiter: every write of the Lease carries the resourceVersion it
//! read, so of two candidates writing at once one gets 409 and stays a candidate (the algorithm of
//! client-go's leaderelection, on kube's `Api`).
//!
//! A candidate takes the Lease when nobody holds it or its holder has not renewed it for
//! `leaseDurationSeconds`; the leader renews it every third of that. A leader that cannot renew for a whole
//! duration has lost it ([`Elector::lead`] returns) and must stop reconciling before another may start:
//! `strata operator run` then exits, and Kubernetes starts it again as a candidate.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};
use strata_types::{ErrorKind, Result};

use crate::reconcile::{get_opt, kube_error};

/// One candidate for one Lease.
#[derive(Debug, Clone)]
pub struct Elector {
    api: Api<Lease>,
    name: String,
    holder: String,
    duration: Duration,
}

impl Elector {
    /// A candidate `holder` (unique per process: the pod's name) for Lease `name` in `api`'s namespace,
    /// held for `duration` past each renewal.
    pub fn new(api: Api<Lease>, name: &str, holder: &str, duration: Duration) -> Self {
        Self {
            api,
            name: name.to_string(),
            holder: holder.to_string(),
            duration: duration.max(Duration::from_secs(1)),
        }
    }

    /// One attempt to take or renew the Lease: whether this candidate holds it now. A conflict (another
    /// candidate wrote first) is `false`, not an error.
    pub async fn try_acquire(&self) -> Result<bool> {
        let now = Timestamp::now();
        let secs = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let current = get_opt(&self.api, &self.name, "reading the Lease").await?;
        let Some(lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.holder.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) => lost_race(kube_error("creating the Lease", e)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let ours = spec.holder_identity.as_deref() == Some(self.holder.as_str());
        let held = spec
            .holder_identity
            .as_deref()
            .is_some_and(|h| !h.is_empty());
        let renewed = spec.renew_time.as_ref().map_or(0, |t| t.0.as_second());
        let lasts = i64::from(spec.lease_duration_seconds.unwrap_or(secs));
        if held && !ours && now.as_second() < renewed + lasts {
            return Ok(false);
        }
        let mut next = lease.clone();
        next.spec = Some(LeaseSpec {
            holder_identity: Some(self.holder.clone()),
            lease_duration_seconds: Some(secs),
            acquire_time: if ours {
                spec.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(!ours)),
            ..spec
        });
        // `replace` sends the resourceVersion read above: a write in between is a 409, and we lost.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) => lost_race(kube_error("renewing the Lease", e)),
        }
    }

    /// Wait until this candidate holds the Lease (trying every third of its duration), or `stop` resolves
    /// (`false`).
    pub async fn acquire(&self, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        loop {
            match self.try_acquire().await {
                Ok(true) => return true,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: the Lease could not be read or written")
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.duration / 3) => {}
                _ = stop.wait_for(|s| *s) => return false,
            }
        }
    }

    /// Renew the held Lease every third of its duration until `stop` resolves (`true`), or until it could not
    /// be renewed for a whole duration, or another holder took it (`false`: leadership is lost).
    pub async fn lead(&self, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.duration / 3) => {}
                _ = stop.wait_for(|s| *s) => return true,
            }
            match self.try_acquire().await {
                Ok(true) => last = tokio::time::Instant::now(),
                Ok(false) => return false,
                Err(e) => {
                    tracing::warn!(error = %e, "leader election: renewing the Lease failed");
                    if last.elapsed() >= self.duration {
                        return false;
                    }
                }
            }
        }
    }
}

/// A 409 (another candidate wrote first) is a lost race, not an error.
fn lost_race(e: strata_types::Error) -> Result<bool> {
    if e.kind() == ErrorKind::AlreadyExists {
        Ok(false)
    } else {
        Err(e)
    }
}
