//! Quotas: limits and counters per team and scope, and admission by reservation.
//!
//! A write is admitted *before* its bytes are accepted: [`Catalog::reserve`] adds the request to the team's
//! `reserved` counters with one conditional `UPDATE` per row (the scope's and the team's total `*`), inside one
//! transaction. The condition is the limit itself (`used + reserved + request <= hard`), so concurrent writers
//! serialize on the row and can never overshoot: the database decides, not a read-then-write in the caller.
//! [`Catalog::commit_reservation`] moves the reservation into `used` (with the real size, which may differ);
//! [`Catalog::release_reservation`] gives it back. A reservation whose writer died expires and is reaped.
//!
//! Lock order: every transaction on a team's counters first locks the team's `*` row (a no-op update takes
//! the row lock on both databases), so two writers never wait on each other in a cycle on PostgreSQL.
//! Scopes are a backend name, a created bucket's name, `cache`, `scratch`, `peer`, `ckpt`, `bucket_root` (every
//! bucket the team created, together: [`BUCKET_ROOT`]) or `*` for the team's total. A created bucket's scope has
//! a parent, `bucket_root`: its writes are admitted on the bucket, the parent and the total, and every change
//! of its usage is one of the parent's. The parent a reservation was admitted on is kept with it.
//!
//! Soft limits: once usage goes over the soft limit, `soft_since` is stamped; writes that stay over it are
//! admitted until `soft_since + grace_secs`, then refused like the hard limit until usage drops under the soft
//! limit again (which clears the stamp).

use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, Row};
use strata_types::{Error, ErrorKind, Result};

use crate::{Catalog, db_err, new_id};

/// The scope that holds a team's total over all scopes.
pub const TOTAL: &str = "*";

/// The scope of every bucket a team created through the gateway (under `[gateway] bucket_root`), together:
/// the parent of each such bucket's scope, so one limit binds them all as a backend's binds the backend.
/// (A bucket name has no `_`, so no bucket is named so.)
pub const BUCKET_ROOT: &str = "bucket_root";

/// Largest byte or object count accepted anywhere (1 EiB): sums of a few of them never overflow an `i64`.
pub const MAX_AMOUNT: i64 = 1 << 60;

/// Limits of one team on one scope. `None` = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Soft limit on bytes (admitted during the grace period).
    pub soft_bytes: Option<i64>,
    /// Hard limit on bytes (never exceeded).
    pub hard_bytes: Option<i64>,
    /// Soft limit on objects.
    pub soft_objects: Option<i64>,
    /// Hard limit on objects.
    pub hard_objects: Option<i64>,
    /// How long usage may stay over a soft limit, in seconds.
    #[serde(default)]
    pub grace_secs: i64,
}

impl QuotaLimits {
    /// Reject negative limits and soft limits above hard ones.
    pub fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("soft_bytes", self.soft_bytes),
            ("hard_bytes", self.hard_bytes),
            ("soft_objects", self.soft_objects),
            ("hard_objects", self.hard_objects),
        ] {
            if v.is_some_and(|v| !(0..=MAX_AMOUNT).contains(&v)) {
                return Err(Error::invalid_input(format!(
                    "{name} must be between 0 and {MAX_AMOUNT}"
                )));
            }
        }
        if !(0..=100 * 365 * 86_400).contains(&self.grace_secs) {
            return Err(Error::invalid_input(
                "grace_secs must be between 0 and 100 years",
            ));
        }
        if let (Some(s), Some(h)) = (self.soft_bytes, self.hard_bytes)
            && s > h
        {
            return Err(Error::invalid_input("soft_bytes is above hard_bytes"));
        }
        if let (Some(s), Some(h)) = (self.soft_objects, self.hard_objects)
            && s > h
        {
            return Err(Error::invalid_input("soft_objects is above hard_objects"));
        }
        Ok(())
    }
}

pub use strata_api::quotas::QuotaStatus;

/// Limits, counters and status of one team on one scope.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaState {
    /// Team.
    pub team: String,
    /// Scope (`*` = the team's total).
    pub scope: String,
    /// Limits.
    pub limits: QuotaLimits,
    /// Committed bytes.
    pub used_bytes: i64,
    /// Committed objects.
    pub used_objects: i64,
    /// Admitted, not yet committed bytes.
    pub reserved_bytes: i64,
    /// Admitted, not yet committed objects.
    pub reserved_objects: i64,
    /// Since when usage is over the soft limit.
    pub soft_since: Option<i64>,
    /// Status now.
    pub status: QuotaStatus,
    /// When the grace period ends, if over a soft limit.
    pub grace_ends_at: Option<i64>,
}

/// An admitted write. Commit it with the real size, or release it; dropping it leaves it to expire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reservation {
    /// Id.
    pub id: String,
    /// Team charged.
    pub team: String,
    /// Scope charged (and the team's total).
    pub scope: String,
    /// The parent scope also charged (a created bucket's: [`BUCKET_ROOT`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Bytes reserved.
    pub bytes: i64,
    /// Objects reserved.
    pub objects: i64,
}

const QUOTA_COLS: &str = "team, scope, soft_bytes, hard_bytes, soft_objects, hard_objects, grace_secs, \
     used_bytes, used_objects, reserved_bytes, reserved_objects, soft_since";

fn state_of(r: &sqlx::any::AnyRow, now: i64) -> Result<QuotaState> {
    let limits = QuotaLimits {
        soft_bytes: r.try_get("soft_bytes").map_err(db_err)?,
        hard_bytes: r.try_get("hard_bytes").map_err(db_err)?,
        soft_objects: r.try_get("soft_objects").map_err(db_err)?,
        hard_objects: r.try_get("hard_objects").map_err(db_err)?,
        grace_secs: r.try_get("grace_secs").map_err(db_err)?,
    };
    let used_bytes: i64 = r.try_get("used_bytes").map_err(db_err)?;
    let used_objects: i64 = r.try_get("used_objects").map_err(db_err)?;
    let soft_since: Option<i64> = r.try_get("soft_since").map_err(db_err)?;
    let over = |v: i64, l: Option<i64>| l.is_some_and(|l| v > l);
    let at = |v: i64, l: Option<i64>| l.is_some_and(|l| v >= l);
    let over_soft = over(used_bytes, limits.soft_bytes) || over(used_objects, limits.soft_objects);
    let grace_ends_at = if over_soft {
        Some(soft_since.unwrap_or(now) + limits.grace_secs)
    } else {
        None
    };
    let status = if at(used_bytes, limits.hard_bytes) || at(used_objects, limits.hard_objects) {
        QuotaStatus::Hard
    } else if over_soft {
        if grace_ends_at.is_some_and(|g| now > g) {
            QuotaStatus::GraceExpired
        } else {
            QuotaStatus::SoftGrace
        }
    } else {
        QuotaStatus::Ok
    };
    Ok(QuotaState {
        team: r.try_get("team").map_err(db_err)?,
        scope: r.try_get("scope").map_err(db_err)?,
        limits,
        used_bytes,
        used_objects,
        reserved_bytes: r.try_get("reserved_bytes").map_err(db_err)?,
        reserved_objects: r.try_get("reserved_objects").map_err(db_err)?,
        soft_since,
        status,
        grace_ends_at,
    })
}

/// The admission condition, shared by every reserving statement. Parameters: $1 bytes, $2 objects, $3 now.
const ADMIT: &str = "(hard_bytes IS NULL OR used_bytes + reserved_bytes + $1 <= hard_bytes) \
     AND (hard_objects IS NULL OR used_objects + reserved_objects + $2 <= hard_objects) \
     AND (soft_since IS NULL OR $3 <= soft_since + grace_secs \
          OR ((soft_bytes IS NULL OR used_bytes + reserved_bytes + $1 <= soft_bytes) \
              AND (soft_objects IS NULL OR used_objects + reserved_objects + $2 <= soft_objects)))";

/// Stamp or clear `soft_since` after counters changed. Parameters: $1 now, $2 team, $3 scope.
const SOFT_STAMP: &str = "UPDATE quotas SET soft_since = CASE \
       WHEN (soft_bytes IS NOT NULL AND used_bytes > soft_bytes) \
         OR (soft_objects IS NOT NULL AND used_objects > soft_objects) \
       THEN COALESCE(soft_since, $1) ELSE NULL END \
     WHERE team = $2 AND (scope = $3 OR scope = '*' OR scope = $4)";

impl Catalog {
    /// Stamp or clear `soft_since` of a scope, its parent and the team's total after their counters changed.
    async fn stamp_soft(
        &self,
        conn: &mut sqlx::AnyConnection,
        team: &str,
        scope: &str,
        parent: Option<&str>,
    ) -> Result<()> {
        sqlx::query(SOFT_STAMP)
            .bind(self.now())
            .bind(team)
            .bind(scope)
            .bind(parent.unwrap_or(TOTAL))
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        Ok(())
    }

    /// The parent of `scope`: [`BUCKET_ROOT`] for a bucket created through the gateway, else none.
    async fn parent_of(
        &self,
        conn: &mut sqlx::AnyConnection,
        scope: &str,
    ) -> Result<Option<String>> {
        if scope == TOTAL || scope == BUCKET_ROOT {
            return Ok(None);
        }
        let created = sqlx::query("SELECT name FROM buckets WHERE name = $1")
            .bind(scope)
            .fetch_optional(&mut *conn)
            .await
            .map_err(db_err)?
            .is_some();
        Ok(created.then(|| BUCKET_ROOT.to_string()))
    }

    /// Make sure `team` has rows for `scope`, its parent (`parent`; `None`: look it up) and its total, and lock
    /// the total's row. Returns the parent. A new [`BUCKET_ROOT`] row starts with what the team's created
    /// buckets already use and hold reserved.
    async fn ensure_quota_rows(
        &self,
        conn: &mut sqlx::AnyConnection,
        team: &str,
        scope: &str,
        parent: Option<Option<&str>>,
    ) -> Result<Option<String>> {
        // The total's row first: a write, so that on SQLite the transaction holds the write lock (waiting
        // for it) before it reads anything; a read first would make the lock's upgrade fail at once.
        sqlx::query(
            "INSERT INTO quotas (team, scope) VALUES ($1, $2) ON CONFLICT (team, scope) DO NOTHING",
        )
        .bind(team)
        .bind(TOTAL)
        .execute(&mut *conn)
        .await
        .map_err(db_err)?;
        let parent = match parent {
            Some(p) => p.map(str::to_string),
            None => self.parent_of(conn, scope).await?,
        };
        for s in [Some(scope), parent.as_deref()].into_iter().flatten() {
            let q = match s {
                BUCKET_ROOT => {
                    "INSERT INTO quotas (team, scope, used_bytes, used_objects, reserved_bytes, reserved_objects) \
                     SELECT $1, $2, COALESCE(CAST(SUM(used_bytes) AS BIGINT), 0), \
                       COALESCE(CAST(SUM(used_objects) AS BIGINT), 0), \
                       COALESCE(CAST(SUM(reserved_bytes) AS BIGINT), 0), \
                       COALESCE(CAST(SUM(reserved_objects) AS BIGINT), 0) \
                     FROM quotas WHERE team = $1 AND scope IN (SELECT name FROM buckets) \
                     ON CONFLICT (team, scope) DO NOTHING"
                }
                _ => {
                    "INSERT INTO quotas (team, scope) VALUES ($1, $2) ON CONFLICT (team, scope) DO NOTHING"
                }
            };
            sqlx::query(q)
                .bind(team)
                .bind(s)
                .execute(&mut *conn)
                .await
                .map_err(db_err)?;
        }
        // Lock order: every transaction on a team's counters first locks the team's total row (a no-op
        // update takes the row lock on both databases), so two writers can never wait on each other in a cycle.
        sqlx::query("UPDATE quotas SET used_bytes = used_bytes WHERE team = $1 AND scope = '*'")
            .bind(team)
            .execute(&mut *conn)
            .await
            .map_err(db_err)?;
        Ok(parent)
    }

    /// Set the limits of `team` on `scope` (`*` = the team's total).
    pub async fn set_quota(
        &self,
        actor: &str,
        team: &str,
        scope: &str,
        limits: &QuotaLimits,
    ) -> Result<QuotaState> {
        limits.validate()?;
        validate_scope(scope)?;
        self.team(team).await?;
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let parent = self.ensure_quota_rows(&mut tx, team, scope, None).await?;
        sqlx::query(
            "INSERT INTO quotas (team, scope, soft_bytes, hard_bytes, soft_objects, hard_objects, grace_secs) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (team, scope) DO UPDATE SET soft_bytes = excluded.soft_bytes, \
               hard_bytes = excluded.hard_bytes, soft_objects = excluded.soft_objects, \
               hard_objects = excluded.hard_objects, grace_secs = excluded.grace_secs",
        )
        .bind(team)
        .bind(scope)
        .bind(limits.soft_bytes)
        .bind(limits.hard_bytes)
        .bind(limits.soft_objects)
        .bind(limits.hard_objects)
        .bind(limits.grace_secs)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        self.stamp_soft(&mut tx, team, scope, parent.as_deref())
            .await?;
        tx.commit().await.map_err(db_err)?;
        self.audit(
            actor,
            Some(team),
            "quota.set",
            scope,
            serde_json::to_value(limits).unwrap_or_default(),
        )
        .await?;
        self.quota(team, scope).await
    }

    /// The state of `team` on `scope` (a row of zeros and no limits if never used).
    pub async fn quota(&self, team: &str, scope: &str) -> Result<QuotaState> {
        let now = self.now();
        let row = sqlx::query(AssertSqlSafe(format!(
            "SELECT {QUOTA_COLS} FROM quotas WHERE team = $1 AND scope = $2"
        )))
        .bind(team)
        .bind(scope)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?;
        match row {
            Some(r) => state_of(&r, now),
            None => Ok(QuotaState {
                team: team.to_string(),
                scope: scope.to_string(),
                limits: QuotaLimits::default(),
                used_bytes: 0,
                used_objects: 0,
                reserved_bytes: 0,
                reserved_objects: 0,
                soft_since: None,
                status: QuotaStatus::Ok,
                grace_ends_at: None,
            }),
        }
    }

    /// Every quota row of the given teams (None = all teams).
    pub async fn list_quotas(&self, teams: Option<&[String]>) -> Result<Vec<QuotaState>> {
        let now = self.now();
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {QUOTA_COLS} FROM quotas ORDER BY team, scope"
        )))
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        let mut out = Vec::new();
        for r in rows {
            let s = state_of(&r, now)?;
            if teams.is_none_or(|t| t.contains(&s.team)) {
                out.push(s);
            }
        }
        Ok(out)
    }

    /// Admit a write of `bytes` and `objects` for `team` on `scope`, or refuse it with
    /// `ResourceExhausted` (nothing reserved). The reservation expires after `ttl_secs` if never committed.
    pub async fn reserve(
        &self,
        team: &str,
        scope: &str,
        bytes: i64,
        objects: i64,
        ttl_secs: i64,
    ) -> Result<Reservation> {
        if !(0..=MAX_AMOUNT).contains(&bytes) || !(0..=MAX_AMOUNT).contains(&objects) {
            return Err(Error::invalid_input(format!(
                "a reservation must be between 0 and {MAX_AMOUNT} bytes and objects"
            )));
        }
        validate_scope(scope)?;
        if scope == TOTAL || scope == BUCKET_ROOT {
            return Err(Error::invalid_input(format!(
                "reserve on a concrete scope, not {scope:?} (a sum of others)"
            )));
        }
        let now = self.now();
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let parent = self.ensure_quota_rows(&mut tx, team, scope, None).await?;
        for s in [Some(scope), parent.as_deref(), Some(TOTAL)]
            .into_iter()
            .flatten()
        {
            let n = sqlx::query(AssertSqlSafe(format!(
                "UPDATE quotas SET reserved_bytes = reserved_bytes + $1, \
                   reserved_objects = reserved_objects + $2 \
                 WHERE team = $4 AND scope = $5 AND {ADMIT}"
            )))
            .bind(bytes)
            .bind(objects)
            .bind(now)
            .bind(team)
            .bind(s)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?
            .rows_affected();
            if n != 1 {
                tx.rollback().await.map_err(db_err)?;
                let st = self.quota(team, s).await?;
                return Err(quota_error(&st, bytes, objects, now));
            }
        }
        let id = new_id("r_");
        sqlx::query(
            "INSERT INTO reservations (id, team, scope, bytes, objects, expires_at, holder, created_at, parent) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&id)
        .bind(team)
        .bind(scope)
        .bind(bytes)
        .bind(objects)
        .bind(now.saturating_add(ttl_secs.clamp(1, 365 * 86_400)))
        .bind(self.holder.as_deref())
        .bind(now)
        .bind(parent.as_deref())
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(Reservation {
            id,
            team: team.to_string(),
            scope: scope.to_string(),
            parent,
            bytes,
            objects,
        })
    }

    /// Turn a reservation into usage: `bytes_delta`/`objects_delta` are what the write really changed (an
    /// overwrite adds `new - old` bytes and no object). A reservation already reaped is charged anyway.
    pub async fn commit_reservation(
        &self,
        res: &Reservation,
        bytes_delta: i64,
        objects_delta: i64,
    ) -> Result<()> {
        self.settle(res, Some((bytes_delta, objects_delta))).await
    }

    /// Give a reservation back (the write failed or was abandoned).
    pub async fn release_reservation(&self, res: &Reservation) -> Result<()> {
        self.settle(res, None).await
    }

    async fn settle(&self, res: &Reservation, charge: Option<(i64, i64)>) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        self.settle_in(&mut tx, res, charge).await?;
        tx.commit().await.map_err(db_err)
    }

    /// [`Self::settle`] inside the caller's transaction. `res` with an empty id changes usage only.
    pub(crate) async fn settle_in(
        &self,
        tx: &mut sqlx::AnyConnection,
        res: &Reservation,
        charge: Option<(i64, i64)>,
    ) -> Result<()> {
        // A usage change without a reservation (empty id) has nothing to settle.
        let held = !res.id.is_empty()
            && sqlx::query("DELETE FROM reservations WHERE id = $1")
                .bind(&res.id)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?
                .rows_affected()
                == 1;
        let (rb, ro) = if held {
            (res.bytes, res.objects)
        } else {
            (0, 0)
        };
        let (ub, uo) = charge.unwrap_or((0, 0));
        // A reservation settles on the parent it was admitted on; a change of usage alone, on the scope's.
        let known = (!res.id.is_empty()).then_some(res.parent.as_deref());
        let parent = self
            .ensure_quota_rows(tx, &res.team, &res.scope, known)
            .await?;
        sqlx::query(
            "UPDATE quotas SET reserved_bytes = reserved_bytes - $1, reserved_objects = reserved_objects - $2, \
               used_bytes = used_bytes + $3, used_objects = used_objects + $4 \
             WHERE team = $5 AND (scope = $6 OR scope = '*' OR scope = $7)",
        )
        .bind(rb)
        .bind(ro)
        .bind(ub)
        .bind(uo)
        .bind(&res.team)
        .bind(&res.scope)
        .bind(parent.as_deref().unwrap_or(TOTAL))
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        self.stamp_soft(tx, &res.team, &res.scope, parent.as_deref())
            .await
    }

    /// Change usage without a reservation (deletions, clean-up, corrections). Never refused.
    pub async fn adjust_usage(
        &self,
        team: &str,
        scope: &str,
        bytes_delta: i64,
        objects_delta: i64,
    ) -> Result<()> {
        let res = Reservation {
            id: String::new(),
            team: team.to_string(),
            scope: scope.to_string(),
            parent: None,
            bytes: 0,
            objects: 0,
        };
        self.settle(&res, Some((bytes_delta, objects_delta))).await
    }

    /// Give usage back (data deleted by its writer), never below zero.
    pub async fn free_usage(
        &self,
        team: &str,
        scope: &str,
        bytes: i64,
        objects: i64,
    ) -> Result<()> {
        if !(0..=MAX_AMOUNT).contains(&bytes) || !(0..=MAX_AMOUNT).contains(&objects) {
            return Err(Error::invalid_input(format!(
                "bytes and objects to free must be between 0 and {MAX_AMOUNT}"
            )));
        }
        validate_scope(scope)?;
        if scope == TOTAL || scope == BUCKET_ROOT {
            return Err(Error::invalid_input(format!(
                "free usage on a concrete scope, not {scope:?} (a sum of others)"
            )));
        }
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let parent = self.ensure_quota_rows(&mut tx, team, scope, None).await?;
        let cur: (i64, i64) = {
            let r = sqlx::query(
                "SELECT used_bytes, used_objects FROM quotas WHERE team = $1 AND scope = $2",
            )
            .bind(team)
            .bind(scope)
            .fetch_one(&mut *tx)
            .await
            .map_err(db_err)?;
            (
                r.try_get("used_bytes").map_err(db_err)?,
                r.try_get("used_objects").map_err(db_err)?,
            )
        };
        let (b, o) = (bytes.min(cur.0.max(0)), objects.min(cur.1.max(0)));
        sqlx::query(
            "UPDATE quotas SET used_bytes = used_bytes - $1, used_objects = used_objects - $2 \
             WHERE team = $3 AND (scope = $4 OR scope = '*' OR scope = $5)",
        )
        .bind(b)
        .bind(o)
        .bind(team)
        .bind(scope)
        .bind(parent.as_deref().unwrap_or(TOTAL))
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        self.stamp_soft(&mut tx, team, scope, parent.as_deref())
            .await?;
        tx.commit().await.map_err(db_err)
    }

    /// Set a scope's usage to measured values (reconciliation) and recompute its parent's (the sum of the
    /// team's created buckets) and the team's total (the sum of every scope but the parents).
    pub async fn set_usage(&self, team: &str, scope: &str, bytes: i64, objects: i64) -> Result<()> {
        if scope == TOTAL || scope == BUCKET_ROOT {
            return Err(Error::invalid_input(format!(
                "set usage on a concrete scope, not {scope:?} (a sum of others)"
            )));
        }
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let parent = self.ensure_quota_rows(&mut tx, team, scope, None).await?;
        sqlx::query(
            "UPDATE quotas SET used_bytes = $1, used_objects = $2 WHERE team = $3 AND scope = $4",
        )
        .bind(bytes)
        .bind(objects)
        .bind(team)
        .bind(scope)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        if parent.is_some() {
            sqlx::query(
                "UPDATE quotas SET \
                   used_bytes = (SELECT COALESCE(CAST(SUM(q.used_bytes) AS BIGINT), 0) FROM quotas q \
                                 WHERE q.team = $1 AND q.scope IN (SELECT name FROM buckets)), \
                   used_objects = (SELECT COALESCE(CAST(SUM(q.used_objects) AS BIGINT), 0) FROM quotas q \
                                   WHERE q.team = $1 AND q.scope IN (SELECT name FROM buckets)) \
                 WHERE team = $1 AND scope = $2",
            )
            .bind(team)
            .bind(BUCKET_ROOT)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        }
        sqlx::query(
            "UPDATE quotas SET \
               used_bytes = (SELECT COALESCE(CAST(SUM(q.used_bytes) AS BIGINT), 0) FROM quotas q \
                             WHERE q.team = $1 AND q.scope <> '*' AND q.scope <> $2), \
               used_objects = (SELECT COALESCE(CAST(SUM(q.used_objects) AS BIGINT), 0) FROM quotas q \
                               WHERE q.team = $1 AND q.scope <> '*' AND q.scope <> $2) \
             WHERE team = $1 AND scope = '*'",
        )
        .bind(team)
        .bind(BUCKET_ROOT)
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        self.stamp_soft(&mut tx, team, scope, parent.as_deref())
            .await?;
        tx.commit().await.map_err(db_err)
    }

    /// One outstanding reservation, or NotFound (committed, released or reaped).
    pub async fn reservation(&self, id: &str) -> Result<Reservation> {
        let r = sqlx::query(
            "SELECT id, team, scope, parent, bytes, objects FROM reservations WHERE id = $1",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(db_err)?
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no reservation {id:?}")))?;
        Ok(Reservation {
            id: r.try_get("id").map_err(db_err)?,
            team: r.try_get("team").map_err(db_err)?,
            scope: r.try_get("scope").map_err(db_err)?,
            parent: r.try_get("parent").map_err(db_err)?,
            bytes: r.try_get("bytes").map_err(db_err)?,
            objects: r.try_get("objects").map_err(db_err)?,
        })
    }

    /// Release every expired reservation (its writer died or forgot). Returns how many.
    pub async fn reap_reservations(&self) -> Result<u64> {
        self.release_where("expires_at < $1", |q| q.bind(self.now()))
            .await
    }

    /// Release the reservations this handle's holder admitted before: run when an agent starts, since the
    /// writes they admitted died with the agent's previous run. (A write that still commits one is charged
    /// anyway.) Returns how many.
    pub async fn release_held(&self) -> Result<u64> {
        let Some(h) = self.holder.clone() else {
            return Ok(0);
        };
        self.release_where("holder = $1", |q| q.bind(h.to_string()))
            .await
    }

    /// Release the reservations on `scope` admitted more than `age_secs` ago (reconciliation: whatever their
    /// writes did is in the listing it counted). Returns how many.
    pub async fn release_stale(&self, scope: &str, age_secs: i64) -> Result<u64> {
        let before = self.now().saturating_sub(age_secs);
        let scope = scope.to_string();
        self.release_where("scope = $1 AND created_at < $2", |q| {
            q.bind(scope.clone()).bind(before)
        })
        .await
    }

    async fn release_where<'q>(
        &self,
        cond: &str,
        bind: impl FnOnce(
            sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
        ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> Result<u64> {
        let q = sqlx::query(AssertSqlSafe(format!(
            "SELECT id, team, scope, parent, bytes, objects FROM reservations WHERE {cond}"
        )));
        let rows: Vec<Reservation> = bind(q)
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?
            .into_iter()
            .map(|r| {
                Ok(Reservation {
                    id: r.try_get("id").map_err(db_err)?,
                    team: r.try_get("team").map_err(db_err)?,
                    scope: r.try_get("scope").map_err(db_err)?,
                    parent: r.try_get("parent").map_err(db_err)?,
                    bytes: r.try_get("bytes").map_err(db_err)?,
                    objects: r.try_get("objects").map_err(db_err)?,
                })
            })
            .collect::<Result<_>>()?;
        let n = rows.len() as u64;
        for res in rows {
            self.release_reservation(&res).await?;
        }
        Ok(n)
    }
}

fn validate_scope(scope: &str) -> Result<()> {
    let ok = scope == TOTAL
        || (!scope.is_empty()
            && scope.len() <= 128
            && scope
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "quota scope {scope:?}: use '*', or a backend/tier name of a-z, 0-9, '.', '_', '-', ':'"
        )))
    }
}

fn quota_error(st: &QuotaState, bytes: i64, objects: i64, now: i64) -> Error {
    let l = &st.limits;
    let why = if l
        .hard_bytes
        .is_some_and(|h| st.used_bytes + st.reserved_bytes + bytes > h)
    {
        format!(
            "{} bytes used + {} reserved + {bytes} requested > hard limit {}",
            st.used_bytes,
            st.reserved_bytes,
            l.hard_bytes.unwrap_or_default()
        )
    } else if l
        .hard_objects
        .is_some_and(|h| st.used_objects + st.reserved_objects + objects > h)
    {
        format!(
            "{} objects used + {} reserved + {objects} requested > hard limit {}",
            st.used_objects,
            st.reserved_objects,
            l.hard_objects.unwrap_or_default()
        )
    } else {
        format!(
            "over the soft limit since {} and the grace period of {} s ended {} s ago",
            st.soft_since.unwrap_or_default(),
            l.grace_secs,
            now - st.soft_since.unwrap_or_default() - l.grace_secs
        )
    };
    Error::new(
        ErrorKind::ResourceExhausted,
        format!(
            "quota exceeded for team {:?} on scope {:?}: {why}",
            st.team, st.scope
        ),
    )
}
