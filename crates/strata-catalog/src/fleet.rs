//! Access-analytics rollups shared by the agents of a fleet: each agent upserts its per-minute rows under
//! its name and process start ([`Catalog::put_minutes`]); any agent answers the fleet view by grouping them
//! ([`Catalog::fleet_groups`]); each prunes what is past the retention ([`Catalog::prune_minutes`]).
//!
//! Why the catalog and not a query engine over the agents' Parquet: the agents of a cluster already share
//! this PostgreSQL, a group-by over a few thousand rows a minute is what it does well, and it costs the test
//! command no engine to build (DataFusion) nor the agents the memory of one. The Parquet files stay the
//! record for analysis (duckdb, pandas); these rows are the live fleet view over the retention.

use sqlx::Row;
use strata_types::Result;

use crate::{Catalog, db_err};

/// One rollup row of one agent's minute.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetRow {
    pub team: String,
    pub job: String,
    pub dataset: String,
    pub prefix: String,
    /// `data_read`, `data_write`, `meta_read`, `meta_write`.
    pub class: String,
    pub ops: i64,
    pub errors: i64,
    pub bytes: i64,
    pub latency_us: i64,
    /// Read bytes served by RAM, disk, a peer, the origin.
    pub tiers: [i64; 4],
}

/// What the fleet view groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FleetBy {
    Team,
    Job,
    Dataset,
    Prefix,
}

impl FleetBy {
    fn column(self) -> &'static str {
        match self {
            FleetBy::Team => "team",
            FleetBy::Job => "job",
            FleetBy::Dataset => "dataset",
            FleetBy::Prefix => "prefix",
        }
    }
}

/// The rows of one (team, name, agent, class) since a minute, summed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetGroup {
    pub team: String,
    /// The job, dataset or prefix (the team again when grouped by team).
    pub name: String,
    pub agent: String,
    pub class: String,
    pub ops: i64,
    pub errors: i64,
    pub bytes: i64,
    pub latency_us: i64,
    pub tiers: [i64; 4],
    /// The first and last minute with a row (unix seconds).
    pub first_minute: i64,
    pub last_minute: i64,
}

impl Catalog {
    /// Put `rows` of `agent`'s `minute`, replacing what that agent put for the same minute and key before.
    pub async fn put_minutes(&self, agent: &str, minute: i64, rows: &[FleetRow]) -> Result<()> {
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        for r in rows {
            sqlx::query(
                "INSERT INTO analytics_minutes (agent, minute, team, job, dataset, prefix, class, ops, errors, \
                   bytes, latency_us, ram, disk, peer, origin) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
                 ON CONFLICT (agent, minute, team, job, dataset, prefix, class) DO UPDATE SET \
                   ops = excluded.ops, errors = excluded.errors, bytes = excluded.bytes, \
                   latency_us = excluded.latency_us, ram = excluded.ram, disk = excluded.disk, \
                   peer = excluded.peer, origin = excluded.origin",
            )
            .bind(agent)
            .bind(minute)
            .bind(&r.team)
            .bind(&r.job)
            .bind(&r.dataset)
            .bind(&r.prefix)
            .bind(&r.class)
            .bind(r.ops)
            .bind(r.errors)
            .bind(r.bytes)
            .bind(r.latency_us)
            .bind(r.tiers[0])
            .bind(r.tiers[1])
            .bind(r.tiers[2])
            .bind(r.tiers[3])
            .execute(&mut *tx)
            .await
            .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)
    }

    /// Forget the minutes before `before` (unix seconds); how many rows went.
    pub async fn prune_minutes(&self, before: i64) -> Result<u64> {
        let r = sqlx::query("DELETE FROM analytics_minutes WHERE minute < $1")
            .bind(before)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        Ok(r.rows_affected())
    }

    /// Every agent's rows since `since` (unix seconds), summed by (team, `by`, agent, class); rows without a
    /// job (or dataset) are left out when grouping by it.
    pub async fn fleet_groups(&self, by: FleetBy, since: i64) -> Result<Vec<FleetGroup>> {
        let col = by.column();
        let named = match by {
            FleetBy::Job | FleetBy::Dataset => format!("AND {col} <> ''"),
            FleetBy::Team | FleetBy::Prefix => String::new(),
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT team, {col} AS name, agent, class, \
               CAST(SUM(ops) AS BIGINT) AS ops, CAST(SUM(errors) AS BIGINT) AS errors, \
               CAST(SUM(bytes) AS BIGINT) AS bytes, CAST(SUM(latency_us) AS BIGINT) AS latency_us, \
               CAST(SUM(ram) AS BIGINT) AS ram, CAST(SUM(disk) AS BIGINT) AS disk, \
               CAST(SUM(peer) AS BIGINT) AS peer, CAST(SUM(origin) AS BIGINT) AS origin, \
               MIN(minute) AS first_minute, MAX(minute) AS last_minute \
             FROM analytics_minutes WHERE minute >= $1 {named} \
             GROUP BY team, {col}, agent, class ORDER BY team, {col}, agent, class"
        )))
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?
        .iter()
        .map(|r| {
            let g = |c: &str| r.try_get::<i64, _>(c).map_err(db_err);
            Ok(FleetGroup {
                team: r.try_get("team").map_err(db_err)?,
                name: r.try_get("name").map_err(db_err)?,
                agent: r.try_get("agent").map_err(db_err)?,
                class: r.try_get("class").map_err(db_err)?,
                ops: g("ops")?,
                errors: g("errors")?,
                bytes: g("bytes")?,
                latency_us: g("latency_us")?,
                tiers: [g("ram")?, g("disk")?, g("peer")?, g("origin")?],
                first_minute: g("first_minute")?,
                last_minute: g("last_minute")?,
            })
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(job: &str, class: &str, ops: i64, origin: i64) -> FleetRow {
        FleetRow {
            team: "vision".into(),
            job: job.into(),
            prefix: "default/train/".into(),
            class: class.into(),
            ops,
            bytes: origin,
            tiers: [0, 0, 0, origin],
            ..FleetRow::default()
        }
    }

    #[tokio::test]
    async fn the_fleet_view_sums_every_agents_minutes_and_a_minute_sent_again_replaces_itself() {
        let dir = tempfile::tempdir().unwrap();
        for c in crate::testing::catalogs(dir.path(), std::sync::Arc::new(crate::SystemClock)).await
        {
            check(&c).await;
        }
    }

    async fn check(c: &Catalog) {
        c.put_minutes("a1-1", 60, &[row("j", "data_read", 2, 20)])
            .await
            .unwrap();
        // The minute in progress, sent again as it grew: replaced, not added.
        c.put_minutes("a1-1", 60, &[row("j", "data_read", 5, 50)])
            .await
            .unwrap();
        c.put_minutes("a2-1", 60, &[row("j", "data_read", 3, 30)])
            .await
            .unwrap();
        c.put_minutes(
            "a2-1",
            120,
            &[row("j", "meta_read", 7, 0), row("", "meta_read", 1, 0)],
        )
        .await
        .unwrap();
        let g = c.fleet_groups(FleetBy::Job, 0).await.unwrap();
        let reads: Vec<_> = g.iter().filter(|g| g.class == "data_read").collect();
        assert_eq!(reads.len(), 2, "{g:?}");
        assert_eq!(reads.iter().map(|g| g.ops).sum::<i64>(), 8);
        assert_eq!(reads.iter().map(|g| g.tiers[3]).sum::<i64>(), 80);
        assert!(
            g.iter().all(|g| g.name == "j"),
            "rows without a job are not a job"
        );
        assert_eq!(c.fleet_groups(FleetBy::Team, 0).await.unwrap().len(), 3);
        assert_eq!(c.fleet_groups(FleetBy::Job, 120).await.unwrap().len(), 1);
        assert_eq!(c.prune_minutes(120).await.unwrap(), 2);
        assert_eq!(c.fleet_groups(FleetBy::Team, 0).await.unwrap().len(), 1);
    }
}
