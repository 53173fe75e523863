//! Releasing a claim: its staging stops, its pins and their quota charge go (a pin another live claim or an
//! operator also holds stays), its mounts are unmounted, its scratch goes to the scratch trash, its datasets' protections are removed,
//! and its accounting is made final. Idempotent: a second release changes nothing and says so. Never deletes a
//! dataset: nothing here writes to a backend.

use strata_catalog::claims::ClaimRecord;
use strata_claim::{ClaimSpec, Mode};
use strata_types::Result;

use crate::Agent;
use crate::api::{CACHE_SCOPE, pin_key};

/// The longest a release waits for the fills its cancelled staging had in flight, before it takes the final
/// accounting.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(60);

/// Release claim `id` with `reason`. Returns false if it was already released.
pub(crate) async fn release(a: &Agent, id: &str, reason: &str, actor: &str) -> Result<bool> {
    let cat = a.catalog();
    let rec = cat.claim(id).await?;
    if rec.released_at.is_some() {
        return Ok(false);
    }
    let staging = a.claim_tasks.lock().get(id).map(|t| t.cancel()).is_some();
    let spec = super::stored_spec(&rec)?;
    super::mounts::unmount_all(id, &spec);
    // Fills the staging had in flight go on (a fill is never cancelled for the readers that joined it):
    // their bytes are the job's, so the final accounting waits for them (bounded).
    if staging {
        let deadline = std::time::Instant::now() + SETTLE;
        while a.cache().job_fills(&rec.team, &rec.job) > 0 && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    // The accounting is taken while the scratch is still there to measure.
    let usage = super::usage(a, &rec, &spec).await;
    for d in spec.datasets.iter().filter(|d| d.mode == Mode::Pin) {
        // The charge is removed once; only the release that removed it unpins.
        if cat
            .commit_delete(CACHE_SCOPE, &super::admit::pin_charge_key(id, &d.name))
            .await?
            .is_none()
        {
            continue;
        }
        let (backend, prefix) = a.resolve(&d.location)?;
        if !pinned_elsewhere(a, &rec, &backend, &prefix).await? {
            a.cache().unpin(backend.id(), &prefix)?;
            a.pins_changed();
        }
    }
    if let Some(sid) = &rec.scratch_id
        && let Some(s) = cat
            .list_scratch(None)
            .await?
            .into_iter()
            .find(|s| &s.id == sid)
    {
        crate::control::release_scratch(a, &s, actor, true).await?;
    }
    cat.delete_claim_protections(id).await?;
    let released = cat
        .release_claim(id, reason, &super::admit::json(&usage)?)
        .await?;
    if released {
        cat.audit(
            actor,
            Some(&rec.team),
            "claim.release",
            id,
            serde_json::json!({"job": rec.job, "reason": reason, "usage": usage}),
        )
        .await?;
        tracing::info!(claim = %id, job = %rec.job, %reason, "claim released");
    }
    Ok(released)
}

/// Whether another live claim pins the same prefix, or an operator pinned it (`/v1/cache/pin`).
async fn pinned_elsewhere(
    a: &Agent,
    me: &ClaimRecord,
    backend: &strata_object::Backend,
    prefix: &str,
) -> Result<bool> {
    if a.catalog()
        .object(CACHE_SCOPE, &pin_key(backend, prefix))
        .await?
        .is_some()
    {
        return Ok(true);
    }
    for c in a.catalog().list_claims(None, false).await? {
        if c.id == me.id {
            continue;
        }
        let Ok(spec) = serde_json::from_str::<ClaimSpec>(&c.spec) else {
            continue;
        };
        for d in spec.datasets.iter().filter(|d| d.mode == Mode::Pin) {
            if let Ok((b, p)) = a.resolve(&d.location)
                && b.id() == backend.id()
                && p == prefix
            {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Release the claims of this agent whose heartbeat is older than their TTL (and sample the accounting of the
/// rest). Returns how many were released.
pub(crate) async fn expire(a: &Agent) -> Result<u64> {
    let now = a.catalog().now();
    let mut n = 0;
    for c in a.catalog().list_claims(None, false).await? {
        if c.agent != a.id() {
            continue;
        }
        let Ok(spec) = serde_json::from_str::<ClaimSpec>(&c.spec) else {
            continue;
        };
        if c.heartbeat_at + spec.ttl() as i64 <= now {
            let reason = format!("no heartbeat for {} s (the claim's TTL)", spec.ttl());
            if release(a, &c.id, &reason, strata_catalog::access::SYSTEM).await? {
                n += 1;
            }
        } else {
            // Sampled here so the scratch peak is seen between status calls.
            super::usage(a, &c, &spec).await;
        }
    }
    super::mounts::detach_released(a).await?;
    Ok(n)
}
