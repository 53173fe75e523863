//! Claims: a job's declared data, the object versions it pinned, its state and accounting. The documents
//! (spec, progress, usage, datasets) are JSON text here; their types are `strata-claim`'s, read by the agent.
//! State changes are conditional updates, so two agents (or a release racing the staging task) never move a
//! claim backwards: nothing leaves `released`.

use sqlx::{AssertSqlSafe, Row};
use strata_api::claims::ClaimState;
use strata_types::{Error, ErrorKind, Result};

use crate::{Catalog, db_err};

/// A claim's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRecord {
    /// `clm_...`.
    pub id: String,
    /// The team charged.
    pub team: String,
    /// The job.
    pub job: String,
    /// Who submitted it.
    pub principal: String,
    /// The agent that stages it (its API address).
    pub agent: String,
    /// The spec as submitted (JSON).
    pub spec: String,
    /// Where it is in its life.
    pub state: ClaimState,
    /// Why it failed or was released.
    pub reason: String,
    /// Staging progress (JSON).
    pub progress: String,
    /// Accounting (JSON).
    pub usage: String,
    /// The datasets as admitted (JSON).
    pub datasets: String,
    /// Its scratch allocation.
    pub scratch_id: Option<String>,
    /// Submitted at.
    pub created_at: i64,
    /// Staging deadline.
    pub deadline_at: i64,
    /// Ready at.
    pub ready_at: Option<i64>,
    /// Last heartbeat.
    pub heartbeat_at: i64,
    /// Released at.
    pub released_at: Option<i64>,
}

/// One object version a claim pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimObject {
    /// The dataset's name in the claim.
    pub dataset: String,
    /// Canonical backend id.
    pub backend: String,
    /// Key.
    pub key: String,
    /// Size.
    pub size: i64,
    /// ETag when admitted.
    pub etag: Option<String>,
    /// Version id when admitted.
    pub version: Option<String>,
    /// Last modification (Unix seconds).
    pub modified_at: i64,
}

const COLS: &str = "id, team, job, principal, agent, spec, state, reason, progress, usage, datasets, scratch_id, \
                    created_at, deadline_at, ready_at, heartbeat_at, released_at";

fn record(r: &sqlx::any::AnyRow) -> Result<ClaimRecord> {
    Ok(ClaimRecord {
        id: r.try_get("id").map_err(db_err)?,
        team: r.try_get("team").map_err(db_err)?,
        job: r.try_get("job").map_err(db_err)?,
        principal: r.try_get("principal").map_err(db_err)?,
        agent: r.try_get("agent").map_err(db_err)?,
        spec: r.try_get("spec").map_err(db_err)?,
        state: {
            let s: String = r.try_get("state").map_err(db_err)?;
            ClaimState::parse(&s)
                .ok_or_else(|| Error::internal(format!("a claim's stored state {s:?}")))?
        },
        reason: r.try_get("reason").map_err(db_err)?,
        progress: r.try_get("progress").map_err(db_err)?,
        usage: r.try_get("usage").map_err(db_err)?,
        datasets: r.try_get("datasets").map_err(db_err)?,
        scratch_id: r.try_get("scratch_id").map_err(db_err)?,
        created_at: r.try_get("created_at").map_err(db_err)?,
        deadline_at: r.try_get("deadline_at").map_err(db_err)?,
        ready_at: r.try_get("ready_at").map_err(db_err)?,
        heartbeat_at: r.try_get("heartbeat_at").map_err(db_err)?,
        released_at: r.try_get("released_at").map_err(db_err)?,
    })
}

impl Catalog {
    /// Record an admitted claim and its pinned objects, in one transaction. A team's second live claim for
    /// the same job is refused (`AlreadyExists`).
    pub async fn insert_claim(&self, c: &ClaimRecord, objects: &[ClaimObject]) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO claims ({COLS}, live_job) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
             $13, $14, $15, $16, $17, $18)"
        )))
        .bind(&c.id)
        .bind(&c.team)
        .bind(&c.job)
        .bind(&c.principal)
        .bind(&c.agent)
        .bind(&c.spec)
        .bind(c.state.as_str())
        .bind(&c.reason)
        .bind(&c.progress)
        .bind(&c.usage)
        .bind(&c.datasets)
        .bind(&c.scratch_id)
        .bind(c.created_at)
        .bind(c.deadline_at)
        .bind(c.ready_at)
        .bind(c.heartbeat_at)
        .bind(c.released_at)
        .bind(format!("{}/{}", c.team, c.job))
        .execute(&mut *tx)
        .await
        .map_err(|e| {
            let e = db_err(e);
            if e.kind() == ErrorKind::AlreadyExists {
                Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "team {} already has a live claim for job {}: release it first",
                        c.team, c.job
                    ),
                )
            } else {
                e
            }
        })?;
        for o in objects {
            sqlx::query(
                "INSERT INTO claim_objects (claim_id, dataset, backend, key, size, etag, version, modified_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(&c.id)
            .bind(&o.dataset)
            .bind(&o.backend)
            .bind(&o.key)
            .bind(o.size)
            .bind(&o.etag)
            .bind(&o.version)
            .bind(o.modified_at)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    /// One claim by id.
    pub async fn claim(&self, id: &str) -> Result<ClaimRecord> {
        let r = sqlx::query(AssertSqlSafe(format!(
            "SELECT {COLS} FROM claims WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no claim {id:?}")))?;
        record(&r)
    }

    /// Claims of the given teams (None = all), newest first; released ones only when `released`.
    pub async fn list_claims(
        &self,
        teams: Option<&[String]>,
        released: bool,
    ) -> Result<Vec<ClaimRecord>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {COLS} FROM claims WHERE ($1 OR released_at IS NULL) ORDER BY created_at DESC, id"
        )))
        .bind(released)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut out = Vec::new();
        for r in &rows {
            let c = record(r)?;
            if teams.is_none_or(|t| t.contains(&c.team)) {
                out.push(c);
            }
        }
        Ok(out)
    }

    /// The objects a claim pinned, by dataset and key.
    pub async fn claim_objects(&self, id: &str) -> Result<Vec<ClaimObject>> {
        let rows = sqlx::query(
            "SELECT dataset, backend, key, size, etag, version, modified_at FROM claim_objects \
             WHERE claim_id = $1 ORDER BY dataset, key",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                Ok(ClaimObject {
                    dataset: r.try_get("dataset").map_err(db_err)?,
                    backend: r.try_get("backend").map_err(db_err)?,
                    key: r.try_get("key").map_err(db_err)?,
                    size: r.try_get("size").map_err(db_err)?,
                    etag: r.try_get("etag").map_err(db_err)?,
                    version: r.try_get("version").map_err(db_err)?,
                    modified_at: r.try_get("modified_at").map_err(db_err)?,
                })
            })
            .collect()
    }

    /// Move a claim to `state` with `reason` and its `progress`, unless it is released (or, for a state other
    /// than `failed`, already failed). Stamps `ready_at` when it becomes ready. Returns whether it moved.
    pub async fn set_claim_state(
        &self,
        id: &str,
        state: ClaimState,
        reason: &str,
        progress: &str,
    ) -> Result<bool> {
        let now = self.now();
        let n = sqlx::query(
            "UPDATE claims SET state = $1, reason = $2, progress = $3, \
             ready_at = CASE WHEN $1 = 'ready' THEN $4 ELSE ready_at END \
             WHERE id = $5 AND released_at IS NULL AND (state <> 'failed' OR $1 = 'failed')",
        )
        .bind(state.as_str())
        .bind(reason)
        .bind(progress)
        .bind(now)
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(n == 1)
    }

    /// Store a live claim's accounting.
    pub async fn set_claim_usage(&self, id: &str, usage: &str) -> Result<()> {
        sqlx::query("UPDATE claims SET usage = $1 WHERE id = $2 AND released_at IS NULL")
            .bind(usage)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// Record a heartbeat. Returns false for a released claim.
    pub async fn heartbeat_claim(&self, id: &str) -> Result<bool> {
        let n = sqlx::query(
            "UPDATE claims SET heartbeat_at = $1 WHERE id = $2 AND released_at IS NULL",
        )
        .bind(self.now())
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(n == 1)
    }

    /// Record `reporter`'s running total of I/O stall for claim `id` (milliseconds; a smaller total than
    /// one already recorded changes nothing, so repeats and retries count once). Returns false if the claim is
    /// released or unknown.
    pub async fn report_claim_stall(
        &self,
        id: &str,
        reporter: &str,
        stall_ms: i64,
    ) -> Result<bool> {
        let live = sqlx::query("SELECT 1 FROM claims WHERE id = $1 AND released_at IS NULL")
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(db_err)?
            .is_some();
        if !live {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO claim_reports (claim_id, reporter, stall_ms, reported_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (claim_id, reporter) DO UPDATE SET \
             stall_ms = CASE WHEN excluded.stall_ms > claim_reports.stall_ms \
                        THEN excluded.stall_ms ELSE claim_reports.stall_ms END, \
             reported_at = excluded.reported_at",
        )
        .bind(id)
        .bind(reporter)
        .bind(stall_ms)
        .bind(self.now())
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(true)
    }

    /// The I/O stall reported for claim `id`, summed over its reporters (milliseconds).
    pub async fn claim_stall_ms(&self, id: &str) -> Result<i64> {
        let rows = sqlx::query("SELECT stall_ms FROM claim_reports WHERE claim_id = $1")
            .bind(id)
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?;
        let mut total = 0i64;
        for r in rows {
            let v: i64 = r.try_get("stall_ms").map_err(db_err)?;
            total = total.saturating_add(v);
        }
        Ok(total)
    }

    /// What each reader of `team`'s job `job` reported as its I/O stall to the job's claims: (claim, reporter,
    /// stall in milliseconds, when last reported), most stalled first, at most 1,000.
    pub async fn job_stalls(
        &self,
        team: &str,
        job: &str,
    ) -> Result<Vec<(String, String, i64, i64)>> {
        sqlx::query(
            "SELECT r.claim_id AS claim_id, r.reporter AS reporter, r.stall_ms AS stall_ms,                r.reported_at AS reported_at              FROM claim_reports r JOIN claims c ON c.id = r.claim_id              WHERE c.team = $1 AND c.job = $2 ORDER BY r.stall_ms DESC, r.reporter LIMIT 1000",
        )
        .bind(team)
        .bind(job)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?
        .iter()
        .map(|r| {
            Ok((
                r.try_get("claim_id").map_err(db_err)?,
                r.try_get("reporter").map_err(db_err)?,
                r.try_get("stall_ms").map_err(db_err)?,
                r.try_get("reported_at").map_err(db_err)?,
            ))
        })
        .collect()
    }

    /// Mark a claim released with its final accounting and why. Returns false if it already was (a release
    /// is idempotent: the first one wins, the rest change nothing).
    pub async fn release_claim(&self, id: &str, reason: &str, usage: &str) -> Result<bool> {
        let n = sqlx::query(
            "UPDATE claims SET state = 'released', reason = $1, usage = $2, released_at = $3, live_job = NULL \
             WHERE id = $4 AND released_at IS NULL",
        )
        .bind(reason)
        .bind(usage)
        .bind(self.now())
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(n == 1)
    }

    /// Record the scratch allocation a claim holds.
    pub async fn set_claim_scratch(&self, id: &str, scratch_id: &str) -> Result<()> {
        sqlx::query("UPDATE claims SET scratch_id = $1 WHERE id = $2")
            .bind(scratch_id)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// Move the expiry of a claim's protections (kind `claim`, `job` = the claim's id) to `until`.
    pub async fn extend_claim_protections(&self, claim_id: &str, until: i64) -> Result<()> {
        sqlx::query(
            "UPDATE protections SET expires_at = $1 WHERE kind = 'claim' AND job = $2 AND expires_at < $1",
        )
        .bind(until)
        .bind(claim_id)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(())
    }

    /// Remove a claim's protections; returns how many there were.
    pub async fn delete_claim_protections(&self, claim_id: &str) -> Result<u64> {
        Ok(
            sqlx::query("DELETE FROM protections WHERE kind = 'claim' AND job = $1")
                .bind(claim_id)
                .execute(self.pool())
                .await
                .map_err(db_err)?
                .rows_affected(),
        )
    }
}
