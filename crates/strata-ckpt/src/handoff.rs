//! Handing a save over to the node agent, so its durability work survives the training process.
//!
//! Once a rank's shard is durable in the local tier, the checkpointer POSTs a [`HandoffRequest`] to the agent's
//! `/v1/ckpt/handoff`; the agent rebuilds the checkpointer from it ([`HandoffRequest::config`]) and runs
//! [`crate::Checkpointer::finish_from_local`]: replicas to peers, the upload, each tier's commit, retention. The
//! process then only polls `/v1/ckpt/handoff?run=&step=&rank=` for the verdict, and may exit at any time. If the
//! agent cannot be reached, the process does the work itself.

use std::path::PathBuf;
use std::time::Duration;

use strata_api::Endpoint;
use strata_types::{Error, ErrorKind, Result};

use crate::tier::{Peer, Tier};
use crate::{CheckpointConfig, Overlap, Retention};

pub use strata_api::ckpt::{HandoffRequest, HandoffState, HandoffStatus};

/// What the agent needs of a [`HandoffRequest`]: its rules, and the checkpointer that finishes it.
pub trait HandoffRequestExt {
    /// Check what arrives from a client.
    fn validate(&self) -> Result<()>;

    /// The checkpointer configuration that finishes this save (without a handoff: the agent does the work),
    /// with the tiers the agent opened for it: `local` (the checked `local_dir`), `remote`, and `peers` (one
    /// per entry of `peers`, in order).
    fn config(
        &self,
        local: PathBuf,
        remote: Option<Tier>,
        peers: Vec<Peer>,
    ) -> Result<CheckpointConfig>;
}

impl HandoffRequestExt for HandoffRequest {
    fn validate(&self) -> Result<()> {
        crate::manifest::validate_run_id(&self.run_id)?;
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::invalid_input("rank not in world"));
        }
        if !self.local_dir.is_absolute() {
            return Err(Error::invalid_input("local_dir must be absolute"));
        }
        Ok(())
    }

    fn config(
        &self,
        local: PathBuf,
        remote: Option<Tier>,
        peers: Vec<Peer>,
    ) -> Result<CheckpointConfig> {
        self.validate()?;
        if peers.len() != self.peers.len() {
            return Err(Error::internal("one tier per peer"));
        }
        Ok(CheckpointConfig {
            run_id: self.run_id.clone(),
            rank: self.rank,
            world_size: self.world_size,
            local_is_shared: false,
            local: Tier::Local(local),
            remote,
            peers: peers.into_iter().map(Tier::Peer).collect(),
            self_peer: self.self_peer,
            replicas: self.replicas,
            upload_every: 1,
            keep_local: Retention {
                keep_last: self.keep_local,
                keep_every: self.keep_every,
            },
            keep_remote: Retention {
                keep_last: self.keep_remote,
                keep_every: self.keep_every,
            },
            overlap: Overlap::Wait,
            commit_timeout: Duration::from_millis(self.commit_timeout_ms),
            handoff: None,
            quota: None,
        })
    }
}

/// A checkpointer's link to its node agent.
#[derive(Debug, Clone)]
pub struct Handoff {
    local_dir: PathBuf,
    remote_url: Option<String>,
    peers: Vec<String>,
    client: strata_client::AgentClient,
}

impl Handoff {
    /// A link to the agent at `api`; the strings describe the tiers the agent opens itself.
    pub fn new(
        api: &str,
        local_dir: PathBuf,
        remote_url: Option<String>,
        peers: Vec<String>,
    ) -> Result<Self> {
        let local_dir = std::path::absolute(&local_dir)
            .map_err(|e| Error::from_io(e, format!("resolving {}", local_dir.display())))?;
        let opts = strata_client::ClientOptions {
            connect_timeout: Duration::from_secs(3),
            ..strata_client::ClientOptions::from_env()
        };
        Ok(Self {
            local_dir,
            remote_url,
            peers,
            client: strata_client::AgentClient::new(api, &opts)?,
        })
    }

    /// Ask the agent to take over `step` of `cfg`'s rank.
    pub async fn submit(&self, cfg: &CheckpointConfig, step: u64, upload: bool) -> Result<()> {
        let req = HandoffRequest {
            run_id: cfg.run_id.clone(),
            step,
            rank: cfg.rank,
            world_size: cfg.world_size,
            upload,
            local_dir: self.local_dir.clone(),
            remote_url: self.remote_url.clone(),
            peers: self.peers.clone(),
            self_peer: cfg.self_peer,
            replicas: cfg.replicas,
            keep_local: cfg.keep_local.keep_last,
            keep_remote: cfg.keep_remote.keep_last,
            keep_every: cfg.keep_local.keep_every,
            commit_timeout_ms: cfg.commit_timeout.as_millis() as u64,
        };
        let req = self
            .client
            .request(
                strata_client::Method::POST,
                self.client.url(strata_api::ckpt::Handoff::PATH),
            )
            .json(&req);
        self.client
            .send(req, "handing the save over")
            .await
            .map(|_| ())
    }

    /// Wait for the agent's verdict; `local_failures` (from this process's part) are reported with it.
    pub async fn wait(
        &self,
        cfg: &CheckpointConfig,
        step: u64,
        local_failures: Vec<Error>,
    ) -> Result<()> {
        let (step_s, rank_s) = (step.to_string(), cfg.rank.to_string());
        let url = self.client.url_with(
            strata_api::ckpt::HandoffStatusOf::PATH,
            &[
                ("run", cfg.run_id.as_str()),
                ("step", step_s.as_str()),
                ("rank", rank_s.as_str()),
            ],
        )?;
        let what = format!("status of step {step}");
        let verdict = loop {
            let st = match self
                .client
                .send(
                    self.client.request(strata_client::Method::GET, url.clone()),
                    &what,
                )
                .await
            {
                Ok(resp) => strata_client::read_json::<HandoffStatus>(resp, &what).await,
                Err(e) => Err(e),
            };
            match st {
                Ok(st) => match st.state {
                    HandoffState::Pending => {}
                    HandoffState::Done => break Ok(()),
                    HandoffState::Failed => break Err(st.failure()),
                },
                Err(e) if e.kind() == ErrorKind::Unavailable || e.kind() == ErrorKind::Timeout => {
                    break Err(e.context(format!(
                        "agent unreachable while finishing step {step} (it may still complete there)"
                    )));
                }
                Err(e) => break Err(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut all = local_failures;
        if let Err(e) = verdict {
            all.push(e);
        }
        crate::all_ok(all)
    }
}
