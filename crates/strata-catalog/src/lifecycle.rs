//! Lifecycle records: retention policies, protections (pins and claims), clean-up plans and the trash, scratch
//! allocations, and usage samples for forecasts. The planning and execution logic lives in `strata-quota`;
//! this module stores its inputs and every step of its outputs, so a crashed run can be resumed.

use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, FromRow, Row};
use strata_types::{Error, ErrorKind, Result};

use crate::{Catalog, db_err, new_id, normalize_prefix};

pub use strata_api::lifecycle::{ItemState, PlanStatus, PolicyKind};

/// A retention policy of one team on one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Id (`pol_...`), assigned on creation.
    #[serde(default)]
    pub id: String,
    /// Owning team: the policy only ever selects this team's objects.
    pub team: String,
    /// Backend name.
    pub backend: String,
    /// What it does.
    pub kind: PolicyKind,
    /// Key prefix it applies to (literal, segment-aware).
    pub prefix: Option<String>,
    /// Or a label: `dataset:NAME` or `job:ID`, matched against the inventory.
    pub label: Option<String>,
    /// Age for `ttl` and `stale`, seconds (> 0).
    pub age_secs: Option<i64>,
    /// Checkpoints to keep for `keep_last` (> 0).
    pub keep_last: Option<i64>,
    /// Creation time.
    #[serde(default)]
    pub created_at: i64,
}

impl Policy {
    /// Reject policies that could select too much: no selector, empty or wildcard patterns, non-positive
    /// ages or counts.
    pub fn validate(&mut self) -> Result<()> {
        match (&self.prefix, &self.label) {
            (None, None) => {
                return Err(Error::invalid_input(
                    "a policy needs a prefix or a label; there is no policy for a whole backend",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(Error::invalid_input(
                    "give a policy a prefix or a label, not both",
                ));
            }
            (Some(p), None) => self.prefix = Some(normalize_prefix(p)?),
            (None, Some(l)) => {
                let ok = l.split_once(':').is_some_and(|(k, v)| {
                    matches!(k, "dataset" | "job") && !v.trim().is_empty() && !v.contains('*')
                });
                if !ok {
                    return Err(Error::invalid_input(format!(
                        "label {l:?}: expected dataset:NAME or job:ID (no wildcards)"
                    )));
                }
            }
        }
        match self.kind {
            PolicyKind::Ttl | PolicyKind::Stale => {
                if self.age_secs.is_none_or(|a| a <= 0) {
                    return Err(Error::invalid_input(
                        "ttl and stale policies need a positive age_secs",
                    ));
                }
                if self.keep_last.is_some() {
                    return Err(Error::invalid_input(
                        "keep_last only applies to keep_last policies",
                    ));
                }
            }
            PolicyKind::KeepLast => {
                if self.keep_last.is_none_or(|k| k <= 0) {
                    return Err(Error::invalid_input(
                        "keep_last policies need keep_last >= 1 (the latest checkpoint is always kept)",
                    ));
                }
                if self.prefix.is_none() {
                    return Err(Error::invalid_input(
                        "keep_last policies need the prefix that holds the checkpoint runs",
                    ));
                }
            }
        }
        if self.backend.trim().is_empty() {
            return Err(Error::invalid_input("a policy needs a backend"));
        }
        Ok(())
    }
}

/// A protection: data the clean-up never touches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(deny_unknown_fields)]
pub struct Protection {
    /// Id (`pin_...` or `clm_...`).
    #[serde(default)]
    pub id: String,
    /// `pin` (until removed) or `claim` (a job's declared data, until `expires_at`).
    pub kind: String,
    /// Owning team.
    pub team: String,
    /// Backend name.
    pub backend: String,
    /// Protected prefix (ends with `/`), or an exact key (no trailing `/`).
    pub prefix: String,
    /// Claiming job.
    pub job: Option<String>,
    /// Expiry (claims).
    pub expires_at: Option<i64>,
    /// Creation time.
    #[serde(default)]
    pub created_at: i64,
}

impl Protection {
    /// Whether the protection covers `key` of `backend` at time `now`.
    pub fn covers(&self, backend: &str, key: &str, now: i64) -> bool {
        self.backend == backend
            && self.expires_at.is_none_or(|e| e > now)
            && (key == self.prefix || (self.prefix.ends_with('/') && key.starts_with(&self.prefix)))
    }
}

/// A clean-up plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Plan {
    /// Id (`plan_...`).
    pub id: String,
    /// Team it is restricted to (None = every team).
    pub team: Option<String>,
    /// When it was made.
    pub created_at: i64,
    /// Who made it.
    pub created_by: String,
    /// Where it is.
    #[sqlx(try_from = "String")]
    pub status: PlanStatus,
    /// JSON details (policies, counts).
    pub detail: String,
}

/// One candidate of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct PlanItem {
    /// Plan.
    pub plan_id: String,
    /// Backend name.
    pub backend: String,
    /// Key.
    pub key: String,
    /// Size when planned.
    pub size: i64,
    /// ETag when planned.
    pub etag: String,
    /// Modification time when planned.
    pub modified_at: i64,
    /// Owning team.
    pub team: Option<String>,
    /// Policy that selected it.
    pub policy_id: String,
    /// Where it is.
    #[sqlx(try_from = "String")]
    pub state: ItemState,
    /// Why it was selected or skipped.
    pub reason: String,
    /// Where it is in the trash.
    pub trash_key: Option<String>,
    /// When it was moved to the trash.
    pub trashed_at: Option<i64>,
}

/// A scratch allocation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Scratch {
    /// Id (`scr_...`).
    pub id: String,
    /// Team charged.
    pub team: String,
    /// Bytes reserved against the team's `scratch` quota.
    pub bytes: i64,
    /// Directory.
    pub path: String,
    /// Expiry.
    pub expires_at: i64,
    /// Creation.
    pub created_at: i64,
    /// Release time, once released.
    pub released_at: Option<i64>,
}

/// One usage sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct UsageSample {
    /// Time (unix seconds).
    pub at: i64,
    /// Bytes used.
    pub used: i64,
    /// Capacity (volume size or hard quota), if known.
    pub capacity: Option<i64>,
}

const ITEM_COLS: &str = "plan_id, backend, key, size, etag, modified_at, team, policy_id, state, reason, \
     trash_key, trashed_at";

fn item_of(r: &sqlx::any::AnyRow) -> Result<PlanItem> {
    PlanItem::from_row(r).map_err(db_err)
}

fn policy_of(r: &sqlx::any::AnyRow) -> Result<Policy> {
    let kind: String = r.try_get("kind").map_err(db_err)?;
    Ok(Policy {
        id: r.try_get("id").map_err(db_err)?,
        team: r.try_get("team").map_err(db_err)?,
        backend: r.try_get("backend").map_err(db_err)?,
        kind: PolicyKind::parse(&kind)?,
        prefix: r.try_get("prefix").map_err(db_err)?,
        label: r.try_get("label").map_err(db_err)?,
        age_secs: r.try_get("age_secs").map_err(db_err)?,
        keep_last: r.try_get("keep_last").map_err(db_err)?,
        created_at: r.try_get("created_at").map_err(db_err)?,
    })
}

fn plan_of(r: &sqlx::any::AnyRow) -> Result<Plan> {
    Plan::from_row(r).map_err(db_err)
}

fn protection_of(r: &sqlx::any::AnyRow) -> Result<Protection> {
    Protection::from_row(r).map_err(db_err)
}

impl Catalog {
    /// Add a retention policy (validated first).
    pub async fn add_policy(&self, actor: &str, mut p: Policy) -> Result<Policy> {
        p.validate()?;
        self.team(&p.team).await?;
        p.id = new_id("pol_");
        p.created_at = self.now();
        sqlx::query(
            "INSERT INTO policies (id, team, backend, kind, prefix, label, age_secs, keep_last, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&p.id)
        .bind(&p.team)
        .bind(&p.backend)
        .bind(p.kind.as_str())
        .bind(p.prefix.as_deref())
        .bind(p.label.as_deref())
        .bind(p.age_secs)
        .bind(p.keep_last)
        .bind(p.created_at)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        self.audit(
            actor,
            Some(&p.team),
            "policy.add",
            &p.id,
            serde_json::to_value(&p).unwrap_or_default(),
        )
        .await?;
        Ok(p)
    }

    /// Policies of the given teams (None = all).
    pub async fn list_policies(&self, teams: Option<&[String]>) -> Result<Vec<Policy>> {
        let rows = sqlx::query(
            "SELECT id, team, backend, kind, prefix, label, age_secs, keep_last, created_at \
             FROM policies ORDER BY team, id",
        )
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut out = Vec::new();
        for r in rows {
            let p = policy_of(&r)?;
            if teams.is_none_or(|t| t.contains(&p.team)) {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// One policy.
    pub async fn policy(&self, id: &str) -> Result<Policy> {
        let r = sqlx::query(
            "SELECT id, team, backend, kind, prefix, label, age_secs, keep_last, created_at \
             FROM policies WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no policy {id:?}")))?;
        policy_of(&r)
    }

    /// Delete a policy.
    pub async fn delete_policy(&self, actor: &str, id: &str) -> Result<()> {
        let p = self.policy(id).await?;
        sqlx::query("DELETE FROM policies WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        self.audit(
            actor,
            Some(&p.team),
            "policy.delete",
            id,
            serde_json::json!({}),
        )
        .await
    }

    /// Add a pin or a claim.
    pub async fn add_protection(&self, actor: &str, mut p: Protection) -> Result<Protection> {
        if !matches!(p.kind.as_str(), "pin" | "claim") {
            return Err(Error::invalid_input("protection kind must be pin or claim"));
        }
        if p.kind == "claim" && p.expires_at.is_none() {
            return Err(Error::invalid_input("a claim needs an expiry"));
        }
        if p.prefix.is_empty() || p.prefix.contains('\0') || p.prefix.contains('*') {
            return Err(Error::invalid_input(
                "protected prefix must be a literal key or prefix",
            ));
        }
        if p.prefix.ends_with('/') {
            p.prefix = normalize_prefix(&p.prefix)?;
        }
        self.team(&p.team).await?;
        p.id = new_id(if p.kind == "pin" { "pin_" } else { "clm_" });
        p.created_at = self.now();
        sqlx::query(
            "INSERT INTO protections (id, kind, team, backend, prefix, job, expires_at, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&p.id)
        .bind(&p.kind)
        .bind(&p.team)
        .bind(&p.backend)
        .bind(&p.prefix)
        .bind(p.job.as_deref())
        .bind(p.expires_at)
        .bind(p.created_at)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        self.audit(
            actor,
            Some(&p.team),
            &format!("{}.add", p.kind),
            &p.id,
            serde_json::to_value(&p).unwrap_or_default(),
        )
        .await?;
        Ok(p)
    }

    /// Protections of the given teams (None = all), including expired claims.
    pub async fn list_protections(&self, teams: Option<&[String]>) -> Result<Vec<Protection>> {
        let rows = sqlx::query(
            "SELECT id, kind, team, backend, prefix, job, expires_at, created_at FROM protections ORDER BY id",
        )
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut out = Vec::new();
        for r in rows {
            let p = protection_of(&r)?;
            if teams.is_none_or(|t| t.contains(&p.team)) {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Remove a pin or claim.
    pub async fn delete_protection(&self, actor: &str, id: &str) -> Result<()> {
        let p = self
            .list_protections(None)
            .await?
            .into_iter()
            .find(|p| p.id == id)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no pin or claim {id:?}")))?;
        sqlx::query("DELETE FROM protections WHERE id = $1")
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        self.audit(
            actor,
            Some(&p.team),
            &format!("{}.delete", p.kind),
            id,
            serde_json::json!({}),
        )
        .await
    }

    /// Store a plan and its items in one transaction.
    pub async fn insert_plan(&self, plan: &Plan, items: &[PlanItem]) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        sqlx::query(
            "INSERT INTO plans (id, team, created_at, created_by, status, detail) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&plan.id)
        .bind(plan.team.as_deref())
        .bind(plan.created_at)
        .bind(&plan.created_by)
        .bind(plan.status.as_str())
        .bind(&plan.detail)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        for i in items {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO plan_items ({ITEM_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
            )))
            .bind(&i.plan_id)
            .bind(&i.backend)
            .bind(&i.key)
            .bind(i.size)
            .bind(&i.etag)
            .bind(i.modified_at)
            .bind(i.team.as_deref())
            .bind(&i.policy_id)
            .bind(i.state.as_str())
            .bind(&i.reason)
            .bind(i.trash_key.as_deref())
            .bind(i.trashed_at)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    /// One plan.
    pub async fn plan(&self, id: &str) -> Result<Plan> {
        let r = sqlx::query(
            "SELECT id, team, created_at, created_by, status, detail FROM plans WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no clean-up plan {id:?}")))?;
        plan_of(&r)
    }

    /// Plans, newest first.
    pub async fn list_plans(&self, teams: Option<&[String]>) -> Result<Vec<Plan>> {
        let rows = sqlx::query(
            "SELECT id, team, created_at, created_by, status, detail FROM plans ORDER BY created_at DESC, id",
        )
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut out = Vec::new();
        for r in rows {
            let p = plan_of(&r)?;
            let visible = match (teams, &p.team) {
                (None, _) => true,
                (Some(ts), Some(t)) => ts.contains(t),
                (Some(_), None) => false,
            };
            if visible {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// A plan's items, by backend and key.
    pub async fn plan_items(&self, plan_id: &str) -> Result<Vec<PlanItem>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {ITEM_COLS} FROM plan_items WHERE plan_id = $1 ORDER BY backend, key"
        )))
        .bind(plan_id)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?
        .iter()
        .map(item_of)
        .collect()
    }

    /// Every trashed item of every plan (for purging).
    pub async fn trashed_items(&self) -> Result<Vec<PlanItem>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {ITEM_COLS} FROM plan_items WHERE state = 'trashed' ORDER BY trashed_at"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?
        .iter()
        .map(item_of)
        .collect()
    }

    /// Record what became of an item.
    pub async fn set_item_state(
        &self,
        item: &PlanItem,
        state: ItemState,
        reason: &str,
        trash_key: Option<&str>,
        trashed_at: Option<i64>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE plan_items SET state = $1, reason = $2, trash_key = COALESCE($3, trash_key), \
               trashed_at = COALESCE($4, trashed_at) \
             WHERE plan_id = $5 AND backend = $6 AND key = $7",
        )
        .bind(state.as_str())
        .bind(reason)
        .bind(trash_key)
        .bind(trashed_at)
        .bind(&item.plan_id)
        .bind(&item.backend)
        .bind(&item.key)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(())
    }

    /// Set a plan's status and details.
    pub async fn set_plan_status(&self, id: &str, status: PlanStatus, detail: &str) -> Result<()> {
        sqlx::query("UPDATE plans SET status = $1, detail = $2 WHERE id = $3")
            .bind(status.as_str())
            .bind(detail)
            .bind(id)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// Record a scratch allocation.
    pub async fn insert_scratch(&self, s: &Scratch) -> Result<()> {
        sqlx::query(
            "INSERT INTO scratch (id, team, bytes, path, expires_at, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&s.id)
        .bind(&s.team)
        .bind(s.bytes)
        .bind(&s.path)
        .bind(s.expires_at)
        .bind(s.created_at)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(())
    }

    /// Scratch allocations not yet released, of the given teams (None = all).
    pub async fn list_scratch(&self, teams: Option<&[String]>) -> Result<Vec<Scratch>> {
        let rows = sqlx::query(
            "SELECT id, team, bytes, path, expires_at, created_at, released_at FROM scratch \
             WHERE released_at IS NULL ORDER BY created_at, id",
        )
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut out = Vec::new();
        for r in rows {
            let s = Scratch::from_row(&r).map_err(db_err)?;
            if teams.is_none_or(|t| t.contains(&s.team)) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Mark a scratch allocation released. Returns false if it already was.
    pub async fn release_scratch(&self, id: &str) -> Result<bool> {
        let n = sqlx::query(
            "UPDATE scratch SET released_at = $1 WHERE id = $2 AND released_at IS NULL",
        )
        .bind(self.now())
        .bind(id)
        .execute(self.pool())
        .await
        .map_err(db_err)?
        .rows_affected();
        Ok(n == 1)
    }

    /// Store one usage sample (`kind` = `team` or `volume`).
    pub async fn add_sample(&self, kind: &str, scope: &str, s: UsageSample) -> Result<()> {
        sqlx::query(
            "INSERT INTO usage_samples (kind, scope, at, used, capacity) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (kind, scope, at) DO UPDATE SET used = excluded.used, capacity = excluded.capacity",
        )
        .bind(kind)
        .bind(scope)
        .bind(s.at)
        .bind(s.used)
        .bind(s.capacity)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(())
    }

    /// Delete samples older than `before` (history beyond any forecast window). Returns how many.
    pub async fn prune_samples(&self, before: i64) -> Result<u64> {
        Ok(sqlx::query("DELETE FROM usage_samples WHERE at < $1")
            .bind(before)
            .execute(self.pool())
            .await
            .map_err(db_err)?
            .rows_affected())
    }

    /// Samples of one series since `since`, oldest first.
    pub async fn samples(&self, kind: &str, scope: &str, since: i64) -> Result<Vec<UsageSample>> {
        sqlx::query(
            "SELECT at, used, capacity FROM usage_samples WHERE kind = $1 AND scope = $2 AND at >= $3 ORDER BY at",
        )
        .bind(kind)
        .bind(scope)
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?
        .iter()
        .map(|r| UsageSample::from_row(r).map_err(db_err))
        .collect()
    }

    /// The series that have samples: (kind, scope).
    pub async fn sample_series(&self) -> Result<Vec<(String, String)>> {
        sqlx::query("SELECT DISTINCT kind, scope FROM usage_samples ORDER BY kind, scope")
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?
            .into_iter()
            .map(|r| {
                Ok((
                    r.try_get("kind").map_err(db_err)?,
                    r.try_get("scope").map_err(db_err)?,
                ))
            })
            .collect()
    }
}
