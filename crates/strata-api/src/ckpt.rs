//! Checkpoints: replicas kept by this agent for other nodes' ranks, and saves handed over by training
//! processes (the agent finishes them: replicas, upload, commits, retention).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind};

use crate::{Access, Binary, Empty, Json, NoQuery, Role, endpoint, endpoint_list};

/// What the agent needs to finish one rank's save. The agent confines it: `local_dir` and `remote_url` must
/// lie where the caller may write, and `peers` must be agents of the agent's own cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
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
    /// The local tier, where the shard is already durable (an absolute path on the agent's node).
    pub local_dir: std::path::PathBuf,
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

/// Where a handed-over save is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum HandoffState {
    /// The agent is finishing it.
    Pending,
    /// Every tier it goes to has it, committed.
    Done,
    /// It could not be finished; `error` says why.
    Failed,
}

/// The agent's verdict on one handed-over save.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HandoffStatus {
    /// The run.
    pub run_id: String,
    /// The step.
    pub step: u64,
    /// The rank.
    pub rank: u32,
    /// Where it is.
    pub state: HandoffState,
    /// Why it failed.
    pub error: Option<String>,
    /// The kind of that error (`unavailable`, `resource_exhausted`, ...), so that it reaches the training
    /// process intact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<String>,
    /// Whether the failed save may succeed if tried again.
    #[serde(default)]
    pub retryable: bool,
}

impl HandoffStatus {
    /// The failure this status reports, with its kind (`Unavailable` when the agent did not say).
    pub fn failure(&self) -> Error {
        let kind = self
            .error_kind
            .as_deref()
            .and_then(ErrorKind::parse)
            .unwrap_or(ErrorKind::Unavailable);
        Error::new(
            kind,
            self.error
                .clone()
                .unwrap_or_else(|| "failed at the agent".into()),
        )
        .with_retryable(self.retryable)
    }
}

/// Query of `GET /v1/ckpt/handoff`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct HandoffQuery {
    /// The run.
    pub run: String,
    /// The step.
    pub step: u64,
    /// The rank.
    pub rank: u32,
}

/// The replica steps this agent keeps of one run.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReplicaSteps {
    /// Steps with files here.
    pub steps: Vec<u64>,
    /// Steps committed here.
    pub committed: Vec<u64>,
}

endpoint! {
    /// Checkpoint replicas of a run
    ListReplicas = GET "/v1/peer/ckpt/{run}", Peer, Access::OwnTeam(Role::Reader),
        "reader of the caller's own team (its replicas and handoffs only), or an agent of the cluster for the team it names";
    query: NoQuery, request: Empty, response: Json<ReplicaSteps>
}
endpoint! {
    /// Delete a replica step
    DeleteReplicaStep = DELETE "/v1/peer/ckpt/{run}/{step}", Peer, Access::OwnTeam(Role::Member),
        "member of the caller's own team (its replicas only), or an agent of the cluster for the team it names";
    query: NoQuery, request: Empty, response: Empty, status: 204
}
endpoint! {
    /// Read a replica file
    ReadReplica = GET "/v1/peer/ckpt/{run}/{step}/{file}", Peer, Access::OwnTeam(Role::Reader),
        "reader of the caller's own team (its replicas and handoffs only), or an agent of the cluster for the team it names";
    query: NoQuery, request: Empty, response: Binary
}
endpoint! {
    /// Store a replica file
    WriteReplica = PUT "/v1/peer/ckpt/{run}/{step}/{file}", Peer, Access::OwnTeam(Role::Member),
        "member of the caller's own team (its replicas only), or an agent of the cluster for the team it names";
    query: NoQuery, request: Binary, response: Empty, status: 204
}
endpoint! {
    /// Hand a checkpoint save over to the agent
    Handoff = POST "/v1/ckpt/handoff", Peer, Access::Location(Role::Member),
        "member where the save's files go (local_dir, remote_url); peers of the cluster only";
    query: NoQuery, request: Json<HandoffRequest>, response: Empty, status: 202
}
endpoint! {
    /// State of a handed-over save
    HandoffStatusOf = GET "/v1/ckpt/handoff", Peer, Access::OwnTeam(Role::Reader),
        "reader of the caller's own team (its replicas and handoffs only), or an agent of the cluster for the team it names";
    query: HandoffQuery, request: Empty, response: Json<HandoffStatus>
}

endpoint_list!(
    ListReplicas,
    DeleteReplicaStep,
    ReadReplica,
    WriteReplica,
    Handoff,
    HandoffStatusOf,
);
