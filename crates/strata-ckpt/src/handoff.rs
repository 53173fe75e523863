//! Handing a save over to the node agent, so its durability work survives the training process.
//!
//! Once a rank's shard is durable in the local tier, the checkpointer POSTs a [`HandoffRequest`] to the agent's
//! `/v1/ckpt/handoff`; the agent rebuilds the checkpointer from it ([`HandoffRequest::config`]) and runs
//! [`crate::Checkpointer::finish_from_local`]: replicas to peers, the upload, each tier's commit, retention. The
//! process then only polls `/v1/ckpt/handoff?run=&step=&rank=` for the verdict, and may exit at any time. If the
//! agent cannot be reached, the process does the work itself.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind, Result};

use crate::tier::{Peer, Tier};
use crate::{CheckpointConfig, Overlap, Retention};

/// What the agent needs to finish one rank's save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffRequest {
    /// The run.
    pub run_id: String,
    /// The step.
    pub step: u64,
    /// The rank.
    pub rank: u32,
    /// Ranks of the checkpoint.
    pub world_size: u32,
    /// Whether this save goes to the object store (the upload schedule is the process's).
    pub upload: bool,
    /// The local tier, where the shard is already durable.
    pub local_dir: PathBuf,
    /// The object store tier.
    pub remote_url: Option<String>,
    /// Every node's agent.
    pub peers: Vec<String>,
    /// This node's agent in `peers`.
    pub self_peer: Option<usize>,
    /// Replicas per shard.
    pub replicas: usize,
    /// Retention of the peer tier (as of the local tier): keep last N.
    pub keep_local: usize,
    /// Retention of the object store: keep last N.
    pub keep_remote: usize,
    /// Retention: also keep multiples of K.
    pub keep_every: Option<u64>,
    /// How long rank 0 waits for the other ranks' records, in milliseconds.
    pub commit_timeout_ms: u64,
}

impl HandoffRequest {
    /// Check what arrives from a client.
    pub fn validate(&self) -> Result<()> {
        crate::manifest::validate_run_id(&self.run_id)?;
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(Error::invalid_input("rank not in world"));
        }
        if !self.local_dir.is_absolute() {
            return Err(Error::invalid_input("local_dir must be absolute"));
        }
        Ok(())
    }

    /// The checkpointer configuration that finishes this save (without a handoff: the agent does the work).
    pub fn config(&self, remote: Option<Tier>) -> Result<CheckpointConfig> {
        self.validate()?;
        Ok(CheckpointConfig {
            run_id: self.run_id.clone(),
            rank: self.rank,
            world_size: self.world_size,
            local_is_shared: false,
            local: Tier::Local(self.local_dir.clone()),
            remote,
            peers: self
                .peers
                .iter()
                .map(|p| Peer::new(p).map(Tier::Peer))
                .collect::<Result<_>>()?,
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
    api: String,
    local_dir: PathBuf,
    remote_url: Option<String>,
    peers: Vec<String>,
    client: reqwest::Client,
}

/// The agent's verdict on one handed-over save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandoffStatus {
    /// The run.
    pub run_id: String,
    /// The step.
    pub step: u64,
    /// The rank.
    pub rank: u32,
    /// `pending`, `done` or `failed`.
    pub state: String,
    /// Why it failed.
    pub error: Option<String>,
}

impl Handoff {
    /// A link to the agent at `api`; the strings describe the tiers the agent opens itself.
    pub fn new(
        api: &str,
        local_dir: PathBuf,
        remote_url: Option<String>,
        peers: Vec<String>,
    ) -> Result<Self> {
        let api = if api.contains("://") {
            api.to_string()
        } else {
            format!("http://{api}")
        };
        let local_dir = std::path::absolute(&local_dir)
            .map_err(|e| Error::from_io(e, format!("resolving {}", local_dir.display())))?;
        Ok(Self {
            api: api.trim_end_matches('/').to_string(),
            local_dir,
            remote_url,
            peers,
            client: reqwest::Client::builder()
                .default_headers(crate::agent_headers())
                .connect_timeout(Duration::from_secs(3))
                .build()
                .map_err(|e| Error::internal(format!("HTTP client: {e}")))?,
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
        let resp = self
            .client
            .post(format!("{}/v1/ckpt/handoff", self.api))
            .json(&req)
            .send()
            .await
            .map_err(|e| Error::new(ErrorKind::Unavailable, format!("agent {}: {e}", self.api)))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("agent {} refused the handoff: {status}: {body}", self.api),
            ));
        }
        Ok(())
    }

    /// Wait for the agent's verdict; `local_failures` (from this process's part) are reported with it.
    pub async fn wait(
        &self,
        cfg: &CheckpointConfig,
        step: u64,
        local_failures: Vec<Error>,
    ) -> Result<()> {
        let url = url::Url::parse_with_params(
            &format!("{}/v1/ckpt/handoff", self.api),
            [
                ("run", cfg.run_id.clone()),
                ("step", step.to_string()),
                ("rank", cfg.rank.to_string()),
            ],
        )
        .map_err(|e| Error::invalid_input(format!("agent address {}: {e}", self.api)))?;
        let verdict = loop {
            let r = self.client.get(url.clone()).send().await;
            match r {
                Ok(resp) if resp.status().is_success() => {
                    let st: HandoffStatus = resp.json().await.map_err(|e| {
                        Error::new(ErrorKind::Unavailable, format!("agent {}: {e}", self.api))
                    })?;
                    match st.state.as_str() {
                        "pending" => {}
                        "done" => break Ok(()),
                        _ => {
                            break Err(Error::new(
                                ErrorKind::Unavailable,
                                st.error.unwrap_or_else(|| "failed at the agent".into()),
                            ));
                        }
                    }
                }
                Ok(resp) => {
                    break Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "agent {}: status of step {step}: {}",
                            self.api,
                            resp.status()
                        ),
                    ));
                }
                Err(e) => {
                    break Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "agent {} unreachable while finishing step {step} (it may still complete there): {e}",
                            self.api
                        ),
                    ));
                }
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
