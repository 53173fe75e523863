//! Quota admission for checkpoint saves, through the node agent's control API.
//!
//! With a team configured, a save is admitted on the team's `ckpt` scope *before* any byte of it is written
//! (`POST /v1/quotas/{team}/ckpt/reserve`); a refusal fails the save at once with `ResourceExhausted` and
//! nothing is written. A save whose shard reached the local tier is charged
//! (`/v1/reservations/{id}/commit`, which records the shard as an object of the team's `ckpt` scope), a failed
//! one released; retention gives the bytes of deleted local checkpoints back
//! (`/v1/quotas/{team}/ckpt/deleted`): exactly what was recorded for them, so usage only ever changes by what
//! was admitted and written.

use serde_json::json;
use strata_types::{Error, Result};

/// The quota scope checkpoint bytes are charged to.
pub const SCOPE: &str = "ckpt";

/// Admits and charges one team's checkpoint saves through an agent.
#[derive(Debug, Clone)]
pub struct QuotaGate {
    team: String,
    client: strata_client::AgentClient,
}

use strata_types::encode_segment as enc;

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

    async fn post(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value> {
        self.client
            .post_json(path, &body)
            .await
            .map_err(|e| e.context("quota"))
    }

    /// Admit a save of `bytes`; returns the reservation id.
    pub async fn reserve(&self, bytes: u64) -> Result<String> {
        let v = self
            .post(
                &format!("/v1/quotas/{}/{SCOPE}/reserve", enc(&self.team)),
                json!({"bytes": bytes, "objects": 1}),
            )
            .await?;
        v["id"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| Error::internal("the agent's reservation has no id"))
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
        self.post(
            &format!("/v1/reservations/{}/commit", enc(id)),
            json!({"bytes": bytes, "objects": 1, "key": object_key(run, step, Some(rank))}),
        )
        .await
        .map(|_| ())
    }

    /// Give an admitted save back (it failed before reaching the local tier).
    pub async fn release(&self, id: &str) -> Result<()> {
        self.post(&format!("/v1/reservations/{}/release", enc(id)), json!({}))
            .await
            .map(|_| ())
    }

    /// Give back what was charged for the shards of `step` of `run` (deleted from the local tier).
    pub async fn deleted(&self, run: &str, step: u64) -> Result<()> {
        self.post(
            &format!("/v1/quotas/{}/{SCOPE}/deleted", enc(&self.team)),
            json!({"prefix": object_key(run, step, None)}),
        )
        .await
        .map(|_| ())
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
