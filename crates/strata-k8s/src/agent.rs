//! What the operator asks of the agents: the claims API (`/v1/claims`), behind a trait so that reconcile
//! tests can answer for the agent while tower-test answers for the API server. The operator's own
//! implementation is [`AgentClient`] (HTTP to an agent, typically through the agents' Service).

use std::future::Future;

use strata_claim::{ClaimSpec, ClaimStatus, Coverage};
use strata_client::AgentClient;
use strata_types::Result;

/// The agent's claims API.
pub trait Claims: Send + Sync + 'static {
    /// Admit `spec` (`POST /v1/claims`).
    fn submit(&self, spec: &ClaimSpec) -> impl Future<Output = Result<ClaimStatus>> + Send;
    /// Claim `id` as the agent has it now.
    fn get(&self, id: &str) -> impl Future<Output = Result<ClaimStatus>> + Send;
    /// The live claim of `job` charged to `team`, if any: what an operator that died between submitting and
    /// writing the status finds again instead of submitting twice.
    fn find_live(
        &self,
        team: &str,
        job: &str,
    ) -> impl Future<Output = Result<Option<ClaimStatus>>> + Send;
    /// Keep claim `id` alive (its TTL starts again).
    fn heartbeat(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Release claim `id` (idempotent).
    fn release(&self, id: &str, reason: &str) -> impl Future<Output = Result<()>> + Send;
    /// How much of `location`'s current version the cache cluster holds, read as a reader of `team`
    /// (`GET /v1/coverage`).
    fn coverage(&self, location: &str, team: &str)
    -> impl Future<Output = Result<Coverage>> + Send;
    /// Have the agent at `agent` (a node's, from the agents' EndpointSlices) mount claim `id`'s datasets on
    /// its node (`POST /v1/claims/{id}/attach`; idempotent: a mount already there is kept).
    fn attach(&self, agent: &str, id: &str) -> impl Future<Output = Result<()>> + Send;
}

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl Claims for AgentClient {
    async fn submit(&self, spec: &ClaimSpec) -> Result<ClaimStatus> {
        self.post_json("/v1/claims", spec).await
    }

    async fn get(&self, id: &str) -> Result<ClaimStatus> {
        self.get_json(&format!("/v1/claims/{}", enc(id))).await
    }

    async fn find_live(&self, team: &str, job: &str) -> Result<Option<ClaimStatus>> {
        let all: Vec<ClaimStatus> = self
            .get_json(&format!("/v1/claims?team={}&job={}", enc(team), enc(job)))
            .await?;
        Ok(all.into_iter().find(|c| c.team == team && c.job == job))
    }

    async fn heartbeat(&self, id: &str) -> Result<()> {
        let _: serde_json::Value = self
            .post_json(
                &format!("/v1/claims/{}/heartbeat", enc(id)),
                &serde_json::json!({}),
            )
            .await?;
        Ok(())
    }

    async fn coverage(&self, location: &str, team: &str) -> Result<Coverage> {
        self.get_json(&format!(
            "/v1/coverage?location={}&team={}",
            enc(location),
            enc(team)
        ))
        .await
    }

    async fn attach(&self, agent: &str, id: &str) -> Result<()> {
        let _: serde_json::Value = self
            .at(agent)?
            .post_json(
                &format!("/v1/claims/{}/attach", enc(id)),
                &serde_json::json!({}),
            )
            .await?;
        Ok(())
    }

    async fn release(&self, id: &str, reason: &str) -> Result<()> {
        let _: serde_json::Value = self
            .post_json(
                &format!("/v1/claims/{}/release", enc(id)),
                &serde_json::json!({ "reason": reason }),
            )
            .await?;
        Ok(())
    }
}
