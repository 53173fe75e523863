//! The shared cache's member routes (agents of one cluster asking each other) and its state.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Binary, Empty, Json, NoQuery, Untyped, endpoint, endpoint_list};

/// Query of `GET /v1/peer/blocks`: one block of one object version.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BlockQuery {
    /// The backend's canonical id.
    pub backend: String,
    /// The key.
    pub key: String,
    /// The version's size.
    pub size: u64,
    /// The version's modification time (unix seconds).
    pub mtime: i64,
    /// The block's index.
    pub index: u64,
    /// The cluster's block size.
    #[schemars(range(min = 1))]
    pub block_size: u64,
    /// The version's ETag.
    pub etag: Option<String>,
    /// The version's id.
    pub version: Option<String>,
    /// 1: the asker fills on a miss (the owner reads the origin).
    #[serde(default)]
    pub fill: Option<u8>,
}

/// Query of `GET /v1/peer/meta`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MetaQuery {
    /// The backend's canonical id.
    pub backend: String,
    /// The key.
    pub key: String,
}

/// One object version, as agents name it to each other.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct VersionRef {
    /// The key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag.
    pub etag: Option<String>,
    /// Version id.
    pub version: Option<String>,
    /// Modification time (unix seconds).
    pub mtime: i64,
}

/// Body of `POST /v1/peer/stage` and `POST /v1/peer/held`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Share {
    /// The backend's canonical id.
    pub backend: String,
    /// The cluster's block size.
    #[schemars(range(min = 1))]
    pub block_size: u64,
    /// The versions.
    pub objects: Vec<VersionRef>,
}

/// One change another agent made.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ChangeRef {
    /// The backend's canonical id.
    pub backend: String,
    /// A key written or deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Or every key under a prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
}

/// Body of `POST /v1/peer/invalidate`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Invalidate {
    /// The announcing agent.
    pub from: String,
    /// Its changes (empty: a probe of contact).
    #[serde(default)]
    #[schemars(length(max = 1000))]
    pub changes: Vec<ChangeRef>,
}

/// One pin, as agents name it to each other.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PinRef {
    /// The backend's canonical id.
    pub backend: String,
    /// The pinned prefix.
    pub prefix: String,
}

/// Body of `POST /v1/peer/pins`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Pins {
    /// The agent whose pins these are.
    pub from: String,
    /// All of them.
    #[schemars(length(max = 10000))]
    pub pins: Vec<PinRef>,
}

endpoint! {
    /// A block of an object version, for another agent of the cluster
    PeerBlock = GET "/v1/peer/blocks", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read the key";
    query: BlockQuery, request: Empty, response: Binary
}
endpoint! {
    /// An object's current version (from this agent's metadata cache, else one HEAD joined by every asker), for another agent of the cluster; this agent owns the key's metadata
    PeerMeta = GET "/v1/peer/meta", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read the key";
    query: MetaQuery, request: Empty, response: Json<Untyped>
}
endpoint! {
    /// Stage this agent's share (the blocks it owns) of a list of object versions, for a claim taken by another agent
    PeerStage = POST "/v1/peer/stage", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read every key";
    query: NoQuery, request: Json<Share>, response: Json<Untyped>
}
endpoint! {
    /// Count what this agent holds of its share (the blocks it owns) of a list of object versions; nothing is fetched
    PeerHeld = POST "/v1/peer/held", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read every key";
    query: NoQuery, request: Json<Share>, response: Json<Untyped>
}
endpoint! {
    /// Another agent's writes and deletes (keys or prefixes of backends), dropped from this agent's metadata cache before the answer; an empty list is a probe of contact
    PeerInvalidate = POST "/v1/peer/invalidate", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential)";
    query: NoQuery, request: Json<Invalidate>, response: Json<Untyped>
}
endpoint! {
    /// Every pin of another agent (backend ids and prefixes), kept here for the blocks this agent owns; replaces what was kept for it
    PeerPins = POST "/v1/peer/pins", Peer, Access::Cluster, "agents of the cluster only (the cluster credential)";
    query: NoQuery, request: Json<Pins>, response: Json<Untyped>
}
endpoint! {
    /// The members of the shared cache, their state and share of blocks, and peer counters
    ClusterStatus = GET "/v1/cluster", Data, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Untyped>
}

endpoint_list!(
    PeerBlock,
    PeerMeta,
    PeerStage,
    PeerHeld,
    PeerInvalidate,
    PeerPins,
    ClusterStatus
);
