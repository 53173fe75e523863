//! Members of a cache cluster whose membership comes from the catalog (`[cluster] cache = "catalog"`): each
//! agent heartbeats a row (its address and cache capacity); the live members are the rows seen within a TTL.
//! Times are the agents' clocks (seconds), so the TTL must be well above their skew; a stopping agent deletes
//! its row instead of waiting to expire.

use sqlx::Row;
use strata_types::Result;

use crate::{Catalog, db_err};

/// A registered agent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberRecord {
    /// Its address as the other agents reach it (`http://host:port`).
    pub id: String,
    /// Its cache capacity in bytes (the placement weight).
    pub capacity: i64,
    /// When it registered, and when it last heartbeat, seconds since the Unix epoch.
    pub started_at: i64,
    /// Last heartbeat.
    pub seen_at: i64,
}

impl Catalog {
    /// Record a heartbeat of the agent `id` with its capacity (registering it on the first).
    pub async fn heartbeat_member(&self, id: &str, capacity: i64) -> Result<()> {
        let now = self.now();
        sqlx::query(
            "INSERT INTO cluster_members (id, capacity, started_at, seen_at) VALUES ($1, $2, $3, $3) \
             ON CONFLICT (id) DO UPDATE SET capacity = excluded.capacity, seen_at = excluded.seen_at",
        )
        .bind(id)
        .bind(capacity)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        Ok(())
    }

    /// The agents seen within the last `ttl_secs` seconds, by id.
    pub async fn live_members(&self, ttl_secs: i64) -> Result<Vec<MemberRecord>> {
        let since = self.now() - ttl_secs;
        let rows = sqlx::query(
            "SELECT id, capacity, started_at, seen_at FROM cluster_members WHERE seen_at >= $1 ORDER BY id",
        )
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(db_err)?;
        rows.iter()
            .map(|r| {
                Ok(MemberRecord {
                    id: r.try_get("id").map_err(db_err)?,
                    capacity: r.try_get("capacity").map_err(db_err)?,
                    started_at: r.try_get("started_at").map_err(db_err)?,
                    seen_at: r.try_get("seen_at").map_err(db_err)?,
                })
            })
            .collect()
    }

    /// Remove the agent `id` (it is stopping); rows of agents gone for more than a day go too.
    pub async fn leave_member(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM cluster_members WHERE id = $1 OR seen_at < $2")
            .bind(id)
            .bind(self.now() - 86_400)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        Ok(())
    }
}

impl Catalog {
    /// This catalog's identity, made on first use: agents that share a catalog get the same one.
    pub async fn identity(&self) -> Result<String> {
        sqlx::query(
            "INSERT INTO catalog_meta (name, value) VALUES ('id', $1) ON CONFLICT (name) DO NOTHING",
        )
        .bind(crate::new_id("c_"))
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        let row = sqlx::query("SELECT value FROM catalog_meta WHERE name = 'id'")
            .fetch_one(self.pool())
            .await
            .map_err(db_err)?;
        row.try_get("value").map_err(db_err)
    }
}
