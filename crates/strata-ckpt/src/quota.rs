//! Quota admission for checkpoint saves, through the node agent's control API.
//!
//! With a team configured, a save is admitted on the team's `ckpt` scope *before* any byte of it is written
//! (`POST /v1/quotas/{team}/ckpt/reserve`); a refusal fails the save at once with `ResourceExhausted` and
//! nothing is written. A save whose shard reached the local tier is charged
//! (`/v1/reservations/{id}/commit`), a failed one released; retention gives the bytes of deleted local
//! checkpoints back (`/v1/quotas/{team}/ckpt/free`).

use serde_json::json;
use strata_types::{Error, ErrorKind, Result};

/// The quota scope checkpoint bytes are charged to.
pub const SCOPE: &str = "ckpt";

/// Admits and charges one team's checkpoint saves through an agent.
#[derive(Debug, Clone)]
pub struct QuotaGate {
    api: String,
    team: String,
    client: reqwest::Client,
}

use strata_types::encode_segment as enc;

impl QuotaGate {
    /// A gate charging `team` through the agent at `api` (`host:port` or a URL).
    pub fn new(api: &str, team: &str) -> Result<Self> {
        if team.is_empty() {
            return Err(Error::invalid_input("a checkpoint quota needs a team"));
        }
        let api = if api.contains("://") {
            api.to_string()
        } else {
            format!("http://{api}")
        };
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(60))
            .default_headers(crate::agent_headers())
            .build()
            .map_err(|e| Error::internal(format!("HTTP client: {e}")))?;
        Ok(Self {
            api: api.trim_end_matches('/').to_string(),
            team: team.to_string(),
            client,
        })
    }

    /// The team charged.
    pub fn team(&self) -> &str {
        &self.team
    }

    async fn post(&self, path: &str, body: serde_json::Value) -> Result<serde_json::Value> {
        let url = format!("{}{path}", self.api);
        let resp = self
            .client
            .post(&url)
            .json(&body)
            .send()
            .await
            .map_err(|e| {
                Error::new(ErrorKind::Unavailable, format!("quota: {url}: {e}")).with_source(e)
            })?;
        let status = resp.status();
        let v: serde_json::Value = resp.json().await.unwrap_or_default();
        if status.is_success() {
            return Ok(v);
        }
        let msg = v["message"].as_str().unwrap_or("").to_string();
        let kind = match status.as_u16() {
            429 => ErrorKind::ResourceExhausted,
            401 => ErrorKind::Unauthenticated,
            403 => ErrorKind::PermissionDenied,
            404 => ErrorKind::NotFound,
            400 => ErrorKind::InvalidInput,
            _ => ErrorKind::Unavailable,
        };
        Err(Error::new(kind, format!("quota ({status}): {msg}")))
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
