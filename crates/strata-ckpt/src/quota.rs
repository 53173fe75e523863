//! Quota admission for checkpoint saves, through the node agent's control API.
//!
//! With a team configured, a save is admitted on the team's `ckpt` scope *before* any byte of it is written
//! (`POST /v1/quotas/{team}/ckpt/reserve`); a refusal fails the save at once with `ResourceExhausted` and
//! nothing is written. A save whose shard reached the local tier is charged
//! (`/v1/reservations/{id}/commit`), a failed one released; retention gives the bytes of deleted local
//! checkpoints back (`/v1/quotas/{team}/ckpt/free`).

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

    /// Charge an admitted save.
    pub async fn commit(&self, id: &str, bytes: u64) -> Result<()> {
        self.post(
            &format!("/v1/reservations/{}/commit", enc(id)),
            json!({"bytes": bytes, "objects": 1}),
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

    /// Give back the bytes of deleted checkpoints.
    pub async fn free(&self, bytes: u64, objects: u64) -> Result<()> {
        self.post(
            &format!("/v1/quotas/{}/{SCOPE}/free", enc(&self.team)),
            json!({"bytes": bytes, "objects": objects}),
        )
        .await
        .map(|_| ())
    }
}
