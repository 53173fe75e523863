//! The inventory: the objects Strata knows of, who owns them, when they were last read.
//!
//! Rows come from writes through Strata (attributed to the writing principal's team, its job and dataset) and
//! from reconciliation scans of a backend (attributed by prefix ownership). Usage by team, prefix, job or
//! dataset is a `GROUP BY` over this table; quotas' `used` counters are set from it by reconciliation.
//!
//! Prefix ownership: a prefix of a backend given to a team (normalized: literal, no empty, `.` or `..`
//! segment, stored with a trailing `/`, so `team-a/` never covers `team-ab/`). The owner of a key is the team
//! of the longest owned prefix it lies under ([`owner_in`]). Access times are batched by the agent and
//! written with [`Catalog::touch`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sqlx::{AssertSqlSafe, FromRow, Row};
use strata_types::Result;

use crate::{Catalog, db_err, normalize_prefix};

/// One object as the inventory knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
pub struct ObjectRecord {
    /// Backend name.
    pub backend: String,
    /// Key.
    pub key: String,
    /// Size in bytes.
    pub size: i64,
    /// ETag / version.
    pub etag: String,
    /// Last modification (unix seconds).
    pub modified_at: i64,
    /// Owning team.
    pub team: Option<String>,
    /// Writing principal.
    pub principal: Option<String>,
    /// Job that wrote it.
    pub job: Option<String>,
    /// Dataset it belongs to.
    pub dataset: Option<String>,
    /// Last read seen by Strata.
    pub accessed_at: Option<i64>,
}

/// One object as [`Catalog::scan_objects`] passes it.
#[derive(Debug, Clone, Copy)]
pub struct ScannedObject<'a> {
    pub backend: &'a str,
    pub key: &'a str,
    pub size: u64,
    pub team: Option<&'a str>,
    /// Its last read seen by Strata, else its last modification (unix seconds).
    pub last_used: i64,
}

/// One object found by a listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Listed {
    /// Key.
    pub key: String,
    /// Size.
    pub size: i64,
    /// ETag / version.
    pub etag: String,
    /// Last modification (unix seconds).
    pub modified_at: i64,
}

/// What [`Catalog::reconcile`] changed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReconcileReport {
    /// Backend reconciled.
    pub backend: String,
    /// Objects listed.
    pub listed: u64,
    /// Bytes listed.
    pub listed_bytes: u64,
    /// Rows added (unknown to the inventory).
    pub added: u64,
    /// Rows whose size or ETag changed.
    pub updated: u64,
    /// Rows removed (gone from the backend).
    pub removed: u64,
    /// Usage per team after reconciliation (bytes, objects); `""` = unowned.
    pub teams: BTreeMap<String, (i64, i64)>,
    /// Stale reservations on the backend's scope released (see `strata_quota::reconcile`).
    #[serde(default)]
    pub released_reservations: u64,
}

pub use strata_api::usage::UsageBy;

/// One line of a usage report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageLine {
    /// The group (team name, `backend:prefix`, job id or dataset; `""` = none).
    pub group: String,
    /// Owning team of the group (for prefixes; the team itself for teams).
    pub team: Option<String>,
    /// Bytes.
    pub bytes: i64,
    /// Objects.
    pub objects: i64,
}

/// An owned prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnedPrefix {
    /// Backend name.
    pub backend: String,
    /// Prefix (ends with `/`).
    pub prefix: String,
    /// Owning team.
    pub team: String,
}

const OBJ_COLS: &str =
    "backend, key, size, etag, modified_at, team, principal, job, dataset, accessed_at";

fn object_of(r: &sqlx::any::AnyRow) -> Result<ObjectRecord> {
    ObjectRecord::from_row(r).map_err(db_err)
}

impl Catalog {
    /// Give `prefix` of `backend` to `team`.
    pub async fn set_prefix_owner(
        &self,
        actor: &str,
        backend: &str,
        prefix: &str,
        team: &str,
    ) -> Result<OwnedPrefix> {
        let prefix = normalize_prefix(prefix)?;
        self.team(team).await?;
        sqlx::query(
            "INSERT INTO prefixes (backend, prefix, team) VALUES ($1, $2, $3) \
             ON CONFLICT (backend, prefix) DO UPDATE SET team = excluded.team",
        )
        .bind(backend)
        .bind(&prefix)
        .bind(team)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        self.audit(
            actor,
            Some(team),
            "prefix.own",
            &format!("{backend}:{prefix}"),
            serde_json::json!({}),
        )
        .await?;
        Ok(OwnedPrefix {
            backend: backend.to_string(),
            prefix,
            team: team.to_string(),
        })
    }

    /// Every owned prefix.
    pub async fn list_prefixes(&self) -> Result<Vec<OwnedPrefix>> {
        sqlx::query("SELECT backend, prefix, team FROM prefixes ORDER BY backend, prefix")
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?
            .into_iter()
            .map(|r| {
                Ok(OwnedPrefix {
                    backend: r.try_get("backend").map_err(db_err)?,
                    prefix: r.try_get("prefix").map_err(db_err)?,
                    team: r.try_get("team").map_err(db_err)?,
                })
            })
            .collect()
    }

    /// The team owning `key` of `backend` by the longest owned prefix, if any.
    pub async fn prefix_owner(&self, backend: &str, key: &str) -> Result<Option<String>> {
        Ok(owner_in(&self.list_prefixes().await?, backend, key))
    }

    /// Record a write through Strata. Returns the previous record (an overwrite), if any.
    pub async fn record_write(&self, rec: &ObjectRecord) -> Result<Option<ObjectRecord>> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let prev = self.record_write_in(&mut tx, rec).await?;
        tx.commit().await.map_err(db_err)?;
        Ok(prev)
    }

    async fn record_write_in(
        &self,
        tx: &mut sqlx::AnyConnection,
        rec: &ObjectRecord,
    ) -> Result<Option<ObjectRecord>> {
        let prev = self.take_row(tx, &rec.backend, &rec.key).await?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO objects ({OBJ_COLS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        )))
        .bind(&rec.backend)
        .bind(&rec.key)
        .bind(rec.size)
        .bind(&rec.etag)
        .bind(rec.modified_at)
        .bind(rec.team.as_deref())
        .bind(rec.principal.as_deref())
        .bind(rec.job.as_deref())
        .bind(rec.dataset.as_deref())
        // An overwrite keeps the object's last access unless the write says otherwise.
        .bind(
            rec.accessed_at
                .or(prev.as_ref().and_then(|p| p.accessed_at)),
        )
        .execute(&mut *tx)
        .await
        .map_err(db_err)?;
        Ok(prev)
    }

    /// Remove a row and return it, as the first statement of a write's transaction: a write first, so SQLite
    /// takes its write lock (waiting for it) before the transaction reads anything, and PostgreSQL locks the
    /// row; the write that follows re-inserts it.
    async fn take_row(
        &self,
        tx: &mut sqlx::AnyConnection,
        backend: &str,
        key: &str,
    ) -> Result<Option<ObjectRecord>> {
        sqlx::query(AssertSqlSafe(format!(
            "DELETE FROM objects WHERE backend = $1 AND key = $2 RETURNING {OBJ_COLS}"
        )))
        .bind(backend)
        .bind(key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(db_err)?
        .map(|r| object_of(&r))
        .transpose()
    }

    /// Record a completed write and charge it, in one transaction (a crash leaves both or neither):
    /// `reservations` (admitted before the bytes were accepted) are committed with what the write really
    /// changed (an overwrite by the same team charges the difference; a write over another team's object gives
    /// that team its bytes back). Without reservations the change is charged directly (nothing to admit: the
    /// writer had no team limits to check).
    pub async fn commit_write(
        &self,
        reservations: Vec<crate::quota::Reservation>,
        rec: &ObjectRecord,
    ) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let prev = self.record_write_in(&mut tx, rec).await?;
        let (mut bytes, mut objects) = (rec.size, 1);
        if let Some(p) = &prev {
            if p.team == rec.team {
                bytes -= p.size;
                objects = 0;
            } else if let Some(old) = &p.team {
                self.settle_in(&mut tx, &usage_only(old, &rec.backend), Some((-p.size, -1)))
                    .await?;
            }
        }
        let mut res = reservations.into_iter();
        match (res.next(), &rec.team) {
            (Some(first), _) => {
                self.settle_in(&mut tx, &first, Some((bytes, objects)))
                    .await?
            }
            (None, Some(t)) => {
                self.settle_in(
                    &mut tx,
                    &usage_only(t, &rec.backend),
                    Some((bytes, objects)),
                )
                .await?
            }
            (None, None) => {}
        }
        for r in res {
            self.settle_in(&mut tx, &r, Some((0, 0))).await?;
        }
        tx.commit().await.map_err(db_err)
    }

    /// Record a deletion and give the owner its bytes back, in one transaction. Returns what was known of the
    /// object.
    pub async fn commit_delete(&self, backend: &str, key: &str) -> Result<Option<ObjectRecord>> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let prev = self.record_delete_in(&mut tx, backend, key).await?;
        if let Some(p) = &prev
            && let Some(t) = &p.team
        {
            self.settle_in(&mut tx, &usage_only(t, backend), Some((-p.size, -1)))
                .await?;
        }
        tx.commit().await.map_err(db_err)?;
        Ok(prev)
    }

    /// Forget an object (deleted). Returns what was known of it.
    pub async fn record_delete(&self, backend: &str, key: &str) -> Result<Option<ObjectRecord>> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let prev = self.record_delete_in(&mut tx, backend, key).await?;
        tx.commit().await.map_err(db_err)?;
        Ok(prev)
    }

    async fn record_delete_in(
        &self,
        tx: &mut sqlx::AnyConnection,
        backend: &str,
        key: &str,
    ) -> Result<Option<ObjectRecord>> {
        self.take_row(tx, backend, key).await
    }

    /// One object's record.
    pub async fn object(&self, backend: &str, key: &str) -> Result<Option<ObjectRecord>> {
        let mut conn = self.pool().acquire().await.map_err(db_err)?;
        self.object_in(&mut conn, backend, key).await
    }

    async fn object_in(
        &self,
        conn: &mut sqlx::AnyConnection,
        backend: &str,
        key: &str,
    ) -> Result<Option<ObjectRecord>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {OBJ_COLS} FROM objects WHERE backend = $1 AND key = $2"
        )))
        .bind(backend)
        .bind(key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db_err)?
        .map(|r| object_of(&r))
        .transpose()
    }

    /// Every object of `backend` under `prefix` ("" = all), by key.
    pub async fn objects_under(&self, backend: &str, prefix: &str) -> Result<Vec<ObjectRecord>> {
        sqlx::query(AssertSqlSafe(format!(
            "SELECT {OBJ_COLS} FROM objects WHERE backend = $1 AND substr(key, 1, length($2)) = $2 \
             ORDER BY key"
        )))
        .bind(backend)
        .bind(prefix)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?
        .iter()
        .map(object_of)
        .collect()
    }

    /// Every object of the inventory, one at a time and never all in memory, with its last use (its last
    /// read, else its last write); the objects of `teams` only when given. For reports that fold them (cold
    /// data by prefix).
    pub async fn scan_objects(
        &self,
        teams: Option<&[String]>,
        mut f: impl FnMut(ScannedObject<'_>),
    ) -> Result<()> {
        use futures::TryStreamExt;
        let mut rows = sqlx::query(
            "SELECT backend, key, size, team, COALESCE(accessed_at, modified_at) AS used FROM objects",
        )
        .fetch(self.pool());
        while let Some(r) = rows.try_next().await.map_err(db_err)? {
            let team: Option<String> = r.try_get("team").map_err(db_err)?;
            if let Some(ts) = teams
                && !team.as_ref().is_some_and(|t| ts.contains(t))
            {
                continue;
            }
            let backend: String = r.try_get("backend").map_err(db_err)?;
            let key: String = r.try_get("key").map_err(db_err)?;
            f(ScannedObject {
                backend: &backend,
                key: &key,
                size: r.try_get::<i64, _>("size").map_err(db_err)?.max(0) as u64,
                team: team.as_deref(),
                last_used: r.try_get("used").map_err(db_err)?,
            });
        }
        Ok(())
    }

    /// Record reads: the latest access time per key (batched by the caller).
    pub async fn touch(&self, backend: &str, accesses: &[(String, i64)]) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        for (key, at) in accesses {
            sqlx::query(
                "UPDATE objects SET accessed_at = $1 \
                 WHERE backend = $2 AND key = $3 AND (accessed_at IS NULL OR accessed_at < $1)",
            )
            .bind(*at)
            .bind(backend)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    /// Usage grouped `by`, restricted to `teams` (None = all).
    pub async fn usage(&self, by: UsageBy, teams: Option<&[String]>) -> Result<Vec<UsageLine>> {
        let lines: Vec<UsageLine> = match by {
            UsageBy::Prefix => {
                // Segment-aware: a prefix ends with '/', so `team-a/` never covers `team-ab/...`.
                sqlx::query(
                    "SELECT p.backend AS backend, p.prefix AS prefix, p.team AS team, \
                       COALESCE(CAST(SUM(o.size) AS BIGINT), 0) AS bytes, CAST(COUNT(o.key) AS BIGINT) AS objects \
                     FROM prefixes p LEFT JOIN objects o \
                       ON o.backend = p.backend AND substr(o.key, 1, length(p.prefix)) = p.prefix \
                     GROUP BY p.backend, p.prefix, p.team ORDER BY p.backend, p.prefix",
                )
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?
                .into_iter()
                .map(|r| {
                    let backend: String = r.try_get("backend").map_err(db_err)?;
                    let prefix: String = r.try_get("prefix").map_err(db_err)?;
                    Ok(UsageLine {
                        group: format!("{backend}:{prefix}"),
                        team: Some(r.try_get("team").map_err(db_err)?),
                        bytes: r.try_get("bytes").map_err(db_err)?,
                        objects: r.try_get("objects").map_err(db_err)?,
                    })
                })
                .collect::<Result<_>>()?
            }
            _ => {
                let col = match by {
                    UsageBy::Team => "team",
                    UsageBy::Job => "job",
                    _ => "dataset",
                };
                sqlx::query(AssertSqlSafe(format!(
                    "SELECT COALESCE({col}, '') AS grp, COALESCE(team, '') AS team, \
                       COALESCE(CAST(SUM(size) AS BIGINT), 0) AS bytes, CAST(COUNT(*) AS BIGINT) AS objects \
                     FROM objects GROUP BY COALESCE({col}, ''), COALESCE(team, '') ORDER BY 1, 2"
                )))
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?
                .into_iter()
                .map(|r| {
                    let team: String = r.try_get("team").map_err(db_err)?;
                    Ok(UsageLine {
                        group: r.try_get("grp").map_err(db_err)?,
                        team: (!team.is_empty()).then_some(team),
                        bytes: r.try_get("bytes").map_err(db_err)?,
                        objects: r.try_get("objects").map_err(db_err)?,
                    })
                })
                .collect::<Result<_>>()?
            }
        };
        Ok(lines
            .into_iter()
            .filter(|l| teams.is_none_or(|ts| l.team.as_ref().is_some_and(|t| ts.contains(t))))
            .collect())
    }

    /// Make the inventory of `backend` equal to a complete listing of it, attribute new objects by prefix
    /// ownership, and set every team's usage on scope `backend` from the result. The caller must pass a
    /// *complete* listing: one that failed part-way must not be reconciled (it would drop objects).
    pub async fn reconcile(&self, backend: &str, listing: &[Listed]) -> Result<ReconcileReport> {
        let prefixes = self.list_prefixes().await?;
        let known: BTreeMap<String, (i64, String)> =
            sqlx::query("SELECT key, size, etag FROM objects WHERE backend = $1")
                .bind(backend)
                .fetch_all(self.pool())
                .await
                .map_err(db_err)?
                .into_iter()
                .map(|r| {
                    Ok((
                        r.try_get("key").map_err(db_err)?,
                        (
                            r.try_get("size").map_err(db_err)?,
                            r.try_get("etag").map_err(db_err)?,
                        ),
                    ))
                })
                .collect::<Result<_>>()?;
        let mut report = ReconcileReport {
            backend: backend.to_string(),
            ..Default::default()
        };
        let mut seen = std::collections::HashSet::with_capacity(listing.len());
        // Batches keep each transaction short (SQLite holds its write lock for the whole transaction).
        for chunk in listing.chunks(2000) {
            let mut tx = self.pool().begin().await.map_err(db_err)?;
            for o in chunk {
                seen.insert(o.key.as_str());
                report.listed += 1;
                report.listed_bytes += o.size.max(0) as u64;
                match known.get(&o.key) {
                    Some((size, etag)) if *size == o.size && *etag == o.etag => {}
                    Some(_) => {
                        report.updated += 1;
                        sqlx::query(
                            "UPDATE objects SET size = $1, etag = $2, modified_at = $3 \
                             WHERE backend = $4 AND key = $5",
                        )
                        .bind(o.size)
                        .bind(&o.etag)
                        .bind(o.modified_at)
                        .bind(backend)
                        .bind(&o.key)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                    }
                    None => {
                        report.added += 1;
                        sqlx::query(
                            "INSERT INTO objects (backend, key, size, etag, modified_at, team) \
                             VALUES ($1, $2, $3, $4, $5, $6)",
                        )
                        .bind(backend)
                        .bind(&o.key)
                        .bind(o.size)
                        .bind(&o.etag)
                        .bind(o.modified_at)
                        .bind(owner_in(&prefixes, backend, &o.key))
                        .execute(&mut *tx)
                        .await
                        .map_err(db_err)?;
                    }
                }
            }
            tx.commit().await.map_err(db_err)?;
        }
        let gone: Vec<&String> = known
            .keys()
            .filter(|k| !seen.contains(k.as_str()))
            .collect();
        for chunk in gone.chunks(2000) {
            let mut tx = self.pool().begin().await.map_err(db_err)?;
            for key in chunk {
                report.removed += 1;
                sqlx::query("DELETE FROM objects WHERE backend = $1 AND key = $2")
                    .bind(backend)
                    .bind(key.as_str())
                    .execute(&mut *tx)
                    .await
                    .map_err(db_err)?;
            }
            tx.commit().await.map_err(db_err)?;
        }
        // Usage on this backend's scope, per owning team, from the inventory.
        let rows = sqlx::query(
            "SELECT COALESCE(team, '') AS team, COALESCE(CAST(SUM(size) AS BIGINT), 0) AS bytes, \
               CAST(COUNT(*) AS BIGINT) AS objects FROM objects WHERE backend = $1 GROUP BY COALESCE(team, '')",
        )
        .bind(backend)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        for r in rows {
            let team: String = r.try_get("team").map_err(db_err)?;
            let bytes: i64 = r.try_get("bytes").map_err(db_err)?;
            let objects: i64 = r.try_get("objects").map_err(db_err)?;
            report.teams.insert(team, (bytes, objects));
        }
        let scoped: Vec<String> = sqlx::query_scalar("SELECT team FROM quotas WHERE scope = $1")
            .bind(backend)
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?;
        for team in scoped {
            if !report.teams.contains_key(&team) {
                self.set_usage(&team, backend, 0, 0).await?;
            }
        }
        for (team, (bytes, objects)) in &report.teams {
            if !team.is_empty() {
                self.set_usage(team, backend, *bytes, *objects).await?;
            }
        }
        Ok(report)
    }
}

/// A usage change of `team` on `scope` that settles no reservation.
fn usage_only(team: &str, scope: &str) -> crate::quota::Reservation {
    crate::quota::Reservation {
        id: String::new(),
        team: team.to_string(),
        scope: scope.to_string(),
        parent: None,
        bytes: 0,
        objects: 0,
    }
}

/// The team owning `key` of `backend` among `prefixes`: the longest matching prefix wins.
pub fn owner_in(prefixes: &[OwnedPrefix], backend: &str, key: &str) -> Option<String> {
    prefixes
        .iter()
        .filter(|p| p.backend == backend && key.starts_with(&p.prefix))
        .max_by_key(|p| p.prefix.len())
        .map(|p| p.team.clone())
}
