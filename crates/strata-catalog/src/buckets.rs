//! Buckets created through the gateway (`CreateBucket` under `[gateway] bucket_root`): one row each, with the
//! team that owns every key in it. Configured backends are buckets too but live in the configuration, not here.
//! One catalog serves every agent, so a bucket made through one agent's gateway is a bucket at all of them.

use sqlx::Row;
use strata_types::{Error, ErrorKind, Result};

use crate::{Catalog, db_err};

/// A created bucket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BucketRecord {
    /// Its name (S3's rules, checked by the gateway).
    pub name: String,
    /// The team owning it, `None` for a bucket a root key without a team made.
    pub team: Option<String>,
    /// The principal (or root access key) that made it.
    pub creator: String,
    /// When, seconds since the Unix epoch.
    pub created_at: i64,
}

fn record(r: &sqlx::any::AnyRow) -> Result<BucketRecord> {
    Ok(BucketRecord {
        name: r.try_get("name").map_err(db_err)?,
        team: r.try_get("team").map_err(db_err)?,
        creator: r.try_get("creator").map_err(db_err)?,
        created_at: r.try_get("created_at").map_err(db_err)?,
    })
}

impl Catalog {
    /// Record a new bucket owned by `team` (the caller vouches for the team: a member made it, or a root key
    /// acting for it); `AlreadyExists` when the name is taken.
    pub async fn create_bucket(
        &self,
        name: &str,
        team: Option<&str>,
        creator: &str,
    ) -> Result<BucketRecord> {
        let now = self.now();
        let r = sqlx::query(
            "INSERT INTO buckets (name, team, creator, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(team)
        .bind(creator)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(db_err)?;
        if r.rows_affected() == 0 {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("the bucket {name:?} exists"),
            ));
        }
        self.audit(creator, team, "bucket.create", name, serde_json::json!({}))
            .await?;
        Ok(BucketRecord {
            name: name.to_string(),
            team: team.map(str::to_string),
            creator: creator.to_string(),
            created_at: now,
        })
    }

    /// The bucket named `name`, if one was created.
    pub async fn bucket(&self, name: &str) -> Result<Option<BucketRecord>> {
        sqlx::query("SELECT name, team, creator, created_at FROM buckets WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(db_err)?
            .as_ref()
            .map(record)
            .transpose()
    }

    /// Every created bucket, by name.
    pub async fn list_buckets(&self) -> Result<Vec<BucketRecord>> {
        sqlx::query("SELECT name, team, creator, created_at FROM buckets ORDER BY name")
            .fetch_all(self.pool())
            .await
            .map_err(db_err)?
            .iter()
            .map(record)
            .collect()
    }

    /// Forget a created bucket (its keys are the caller's to have removed first); `NotFound` when there is
    /// none.
    pub async fn delete_bucket(&self, actor: &str, name: &str) -> Result<()> {
        let Some(b) = self.bucket(name).await? else {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("no bucket {name:?}"),
            ));
        };
        sqlx::query("DELETE FROM buckets WHERE name = $1")
            .bind(name)
            .execute(self.pool())
            .await
            .map_err(db_err)?;
        self.audit(
            actor,
            b.team.as_deref(),
            "bucket.delete",
            name,
            serde_json::json!({}),
        )
        .await
    }
}
