//! Quota admission for checkpoint saves, through the node agent's control API.
//!
//! With a team configured, a save is admitted on the team's `ckpt` scope *before* any byte of it is written
//! (`POST /v1/quotas/{team}/ckpt/reserve`); a refusal fails the save at once with `ResourceExhausted` and
//! nothing is written. A save whose shard reached the local tier is charged
//! (`/v1/reservations/{id}/commit`, which records the shard as an object of the team's `ckpt` scope), a failed
//! one released; retention gives the bytes of deleted local checkpoints back
//! (`/v1/quotas/{team}/ckpt/deleted`): exactly what was recorded for them, so usage only ever changes by what
//! was admitted and written.

use strata_api::NoQuery;
use strata_api::quotas as q;
use strata_types::{Error, Result};

/// The quota scope checkpoint bytes are charged to.
pub const SCOPE: &str = "ckpt";

/// Admits and charges one team's checkpoint saves through an agent.
#[derive(Debug, Clone)]
pub struct QuotaGate {
    team: String,
    client: strata_client::AgentClient,
}

impl QuotaGate {
    /// A gate charging `team` through the agent at `api` (`host:port` or a URL), with the token from the
    /// environment.
    pub fn new(api: &str, team: &str) -> Result<Self> {
        if team.is_empty() {
            return Err(Error::invalid_input("a checkpoint quota needs a team"));
        }
        let opts = strata_client::ClientOptions {
            timeout: Some(std::time::Duration::from_secs(60)),
            ..strata_client::ClientOptions::from_env()
        };
        Ok(Self {
            team: team.to_string(),
            client: strata_client::AgentClient::new(api, &opts)?,
        })
    }

    /// The team charged.
    pub fn team(&self) -> &str {
        &self.team
    }

    /// Admit a save of `bytes`; returns the reservation id.
    pub async fn reserve(&self, bytes: u64) -> Result<String> {
        let body = q::Reserve {
            bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            objects: 1,
            ttl_secs: None,
        };
        let r = self
            .client
            .call::<q::ReserveQuota>(&[&self.team, SCOPE], &NoQuery {}, &body)
            .await
            .map_err(|e| e.context("quota"))?;
        Ok(r.id)
    }

    /// Charge an admitted save: `rank`'s shard of `step` of `run`, `bytes` long.
    pub async fn commit(
        &self,
        id: &str,
        run: &str,
        step: u64,
        rank: u32,
        bytes: u64,
    ) -> Result<()> {
        let body = q::Charge {
            bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            objects: 1,
            key: Some(object_key(run, step, Some(rank))),
        };
        self.client
            .call::<q::CommitReservation>(&[id], &NoQuery {}, &body)
            .await
            .map_err(|e| e.context("quota"))?;
        Ok(())
    }

    /// Give an admitted save back (it failed before reaching the local tier).
    pub async fn release(&self, id: &str) -> Result<()> {
        self.client
            .call::<q::ReleaseReservation>(&[id], &NoQuery {}, &q::Nothing {})
            .await
            .map_err(|e| e.context("quota"))?;
        Ok(())
    }

    /// Give back what was charged for the shards of `step` of `run` (deleted from the local tier).
    pub async fn deleted(&self, run: &str, step: u64) -> Result<()> {
        let body = q::DeletedShards {
            prefix: object_key(run, step, None),
        };
        self.client
            .call::<q::ShardsDeleted>(&[&self.team, SCOPE], &NoQuery {}, &body)
            .await
            .map_err(|e| e.context("quota"))?;
        Ok(())
    }
}

/// The name a charged shard is recorded under in the team's `ckpt` scope (`run/step-…/rank-NNNNN`), or with
/// no rank the prefix of a step's shards.
fn object_key(run: &str, step: u64, rank: Option<u32>) -> String {
    let dir = crate::manifest::step_dir(step);
    match rank {
        Some(r) => format!("{run}/{dir}/{}", crate::manifest::shard_file(r)),
        None => format!("{run}/{dir}/"),
    }
}
