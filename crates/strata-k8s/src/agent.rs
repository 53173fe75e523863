//! What the operator asks of the agents: the claims API (`/v1/claims`), behind a trait so that reconcile
//! tests can answer for the agent while tower-test answers for the API server. The operator's own
//! implementation is [`AgentClient`] (HTTP to an agent, typically through the agents' Service).

use std::future::Future;

use strata_api::NoQuery;
use strata_api::claims as c;
use strata_api::quotas::Nothing;
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

impl Claims for AgentClient {
    async fn submit(&self, spec: &ClaimSpec) -> Result<ClaimStatus> {
        self.call::<c::SubmitClaim>(&[], &NoQuery {}, spec).await
    }

    async fn get(&self, id: &str) -> Result<ClaimStatus> {
        self.call::<c::GetClaim>(&[id], &NoQuery {}, &()).await
    }

    async fn find_live(&self, team: &str, job: &str) -> Result<Option<ClaimStatus>> {
        let q = c::ClaimsQuery {
            team: Some(team.to_string()),
            job: Some(job.to_string()),
            released: false,
        };
        let all = self.call::<c::ListClaims>(&[], &q, &()).await?;
        Ok(all.into_iter().find(|c| c.team == team && c.job == job))
    }

    async fn heartbeat(&self, id: &str) -> Result<()> {
        self.call::<c::ClaimHeartbeat>(&[id], &NoQuery {}, &c::Heartbeat::default())
            .await?;
        Ok(())
    }

    async fn coverage(&self, location: &str, team: &str) -> Result<Coverage> {
        let q = c::CoverageQuery {
            location: location.to_string(),
            team: Some(team.to_string()),
        };
        self.call::<c::GetCoverage>(&[], &q, &()).await
    }

    async fn attach(&self, agent: &str, id: &str) -> Result<()> {
        self.at(agent)?
            .call::<c::AttachClaim>(&[id], &NoQuery {}, &Nothing {})
            .await?;
        Ok(())
    }

    async fn release(&self, id: &str, reason: &str) -> Result<()> {
        let body = c::Release {
            reason: Some(reason.to_string()),
        };
        self.call::<c::ReleaseClaim>(&[id], &NoQuery {}, &body)
            .await?;
        Ok(())
    }
}
