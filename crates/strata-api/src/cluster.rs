//! The shared cache's member routes (agents of one cluster asking each other) and its state.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Binary, Empty, Json, Ndjson, NoQuery, endpoint, endpoint_list};

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

/// One object version to stage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct StageObject {
    /// The key.
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its ETag (fills carry `If-Match` of it).
    pub etag: Option<String>,
    /// Its version id, when the store has versions.
    pub version: Option<String>,
    /// Its modification time (Unix seconds).
    pub mtime: i64,
}

/// What a member is asked to stage.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct StageRequest {
    /// The backend's canonical id.
    pub backend: String,
    /// The asking agent's cache block size (every member's must be the same).
    pub block_size: u64,
    /// The versions, of which the member stages the blocks it owns.
    pub objects: Vec<StageObject>,
    /// Copies of each block the cluster keeps: a member stages (and counts) the blocks of which it is
    /// among the first `replicas` owners. Absent: 1 (an agent before replicas sends none).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub replicas: u32,
}

fn one() -> u32 {
    1
}

fn is_one(r: &u32) -> bool {
    *r == 1
}

/// A member's progress on its share.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct StageProgress {
    /// Bytes of its share.
    pub total_bytes: u64,
    /// Of them, held now (fetched, or held before).
    pub done_bytes: u64,
    /// Of them, held before the staging began.
    pub cached_bytes: u64,
}

/// A member's verdict on its share.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct StageDone {
    /// The last progress.
    pub progress: StageProgress,
    /// What it holds of its share, counted after the warm-up.
    pub held: crate::cache::Held,
    /// The first errors of single objects (at most 10).
    pub errors: Vec<String>,
}

/// A line of a staging answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, JsonSchema)]
#[serde(tag = "line", content = "of", rename_all = "snake_case")]
pub enum StageLine {
    /// Progress so far.
    Progress(StageProgress),
    /// The verdict (the last line).
    Done(StageDone),
    /// The warm-up failed as a whole (the last line).
    Failed(crate::ErrorBody),
}

/// What a member holds of its share of a list of object versions (`POST /v1/peer/held`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, JsonSchema)]
pub struct HeldShare {
    /// The counts of its share.
    pub held: crate::cache::Held,
    /// The objects (by their index in the request) of which it lacks a block of its share, as a bitmap in
    /// hex: byte `i / 8`, bit `i % 8` (least significant first). An object is held by the cluster when no
    /// member lacks a block of it.
    pub lacking: String,
}

impl HeldShare {
    /// Whether object `i` of the request lacks a block of this share.
    pub fn lacks(&self, i: usize) -> bool {
        let at = (i / 8) * 2;
        self.lacking
            .get(at..at + 2)
            .and_then(|b| u8::from_str_radix(b, 16).ok())
            .is_some_and(|b| b & (1 << (i % 8)) != 0)
    }
}

/// One change: a key (or every key under a prefix) of a backend, by its canonical id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Change {
    /// The backend's canonical id .
    pub backend: String,
    /// What changed.
    #[serde(flatten)]
    pub what: crate::cache::Invalidation,
}

impl Change {
    /// `key` of the backend `backend` (its canonical id) changed.
    pub fn key(backend: &str, key: &str) -> Self {
        Self {
            backend: backend.to_string(),
            what: crate::cache::Invalidation::Key(key.to_string()),
        }
    }

    /// Keys under `prefix` of the backend `backend` (its canonical id) changed.
    pub fn prefix(backend: &str, prefix: &str) -> Self {
        Self {
            backend: backend.to_string(),
            what: crate::cache::Invalidation::Prefix(prefix.to_string()),
        }
    }
}

/// The body of `POST /v1/peer/invalidate`: who sends it and what changed (empty: a probe of contact).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Announcement {
    /// The sender's member id.
    pub from: String,
    /// What changed.
    #[serde(default)]
    pub changes: Vec<Change>,
}

/// One pinned prefix on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WirePin {
    /// The backend's canonical id (as the cache keys blocks).
    pub backend: String,
    /// The pinned key prefix.
    pub prefix: String,
}

/// The body of `POST /v1/peer/pins`: every pin of the sender.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PinList {
    /// The sender's member id.
    pub from: String,
    /// All of its own pins (an empty list: none any more).
    pub pins: Vec<WirePin>,
}

/// The answer of `GET /v1/peer/meta`: the object's current version (none: the backend has no such object)
/// and how long ago the owner confirmed it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PeerMeta {
    /// The version, if the object exists.
    pub object: Option<PeerObject>,
    /// Milliseconds since the owner confirmed it (since the HEAD that read it was sent), rounded up.
    pub age_ms: u64,
}

/// An object version (`strata_types::ObjectMeta`) on the wire.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PeerObject {
    /// The key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// ETag.
    pub etag: Option<String>,
    /// Version id.
    pub version: Option<String>,
    /// Last modification, seconds since the Unix epoch.
    pub mtime: i64,
    /// Stored headers and user metadata.
    #[schemars(with = "Option<serde_json::Value>")]
    pub attrs: Option<strata_types::ObjectAttrs>,
}

impl PeerObject {
    /// `meta` for the wire.
    pub fn from_meta(meta: &strata_types::ObjectMeta) -> Self {
        Self {
            key: meta.key.clone(),
            size: meta.size,
            etag: meta.etag.clone(),
            version: meta.version.clone(),
            mtime: meta.last_modified_unix,
            attrs: meta.attrs.as_deref().cloned(),
        }
    }

    /// Back to an [`ObjectMeta`].
    pub fn into_meta(self) -> strata_types::ObjectMeta {
        strata_types::ObjectMeta {
            key: self.key,
            size: self.size,
            etag: self.etag,
            version: self.version,
            last_modified_unix: self.mtime,
            attrs: self.attrs.map(std::sync::Arc::new),
        }
    }
}

/// A member's state as this agent sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// Asked for its blocks.
    Up,
    /// Skipped until it answers again (it failed, timed out or stalled).
    Suspect,
}

/// Cache counters `GET /v1/cluster` shows with the members.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ClusterCacheCounters {
    /// Bytes this agent read from origins to fill blocks.
    pub origin_bytes: u64,
    /// Blocks other agents served to this one.
    pub peer_blocks: u64,
    /// Their bytes.
    pub peer_bytes: u64,
    /// Blocks this agent served to others.
    pub served_to_peers: u64,
    /// Their bytes.
    pub served_to_peers_bytes: u64,
}

/// Answer of `GET /v1/cluster`: whether this agent shares its cache, its counters, and (when it does) the
/// members as it sees them.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ClusterView {
    /// Whether this agent is a member of a shared cache.
    pub shared: bool,
    /// This agent's cache counters.
    pub cache: ClusterCacheCounters,
    /// The members and exchange counters (members only).
    #[serde(flatten)]
    pub members: Option<ClusterMembers>,
}

/// The shared cache as one member sees it (`GET /v1/cluster` of a member).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ClusterMembers {
    /// This agent's member id.
    pub me: String,
    /// Where the members come from (`static`, `catalog`, `slurm`).
    pub membership: String,
    /// Times the view changed since the agent started.
    pub view_changes: u64,
    /// The view before the last change, while blocks that changed owner are still asked of it.
    pub previous_view: Option<PreviousView>,
    /// The members, by id.
    pub members: Vec<MemberStatus>,
    /// Block requests this agent sent to peers' owners.
    pub asked: u64,
    /// Requests to a block's owner before a membership change (or this agent's start), served if held.
    pub move_asks: u64,
    /// The identity of this agent's catalog (agents sharing one decide access for each other's principals).
    pub catalog: String,
    /// Of them, failed (connection, timeout, 5xx).
    pub errors: u64,
    /// Of them, answered with bytes that failed their check.
    pub corrupt: u64,
    /// Of them, refused by the peer.
    pub refused: u64,
    /// Times a peer was marked suspect.
    pub suspected: u64,
    /// Blocks served by their owner in the previous view.
    pub moved: u64,
    /// "Still reading" answers of owners waiting on a slow origin.
    pub busy: u64,
    /// Metadata requests sent to the agents that own the keys' metadata.
    pub meta_asked: u64,
    /// Of them, failed or refused (the open sent its own HEAD).
    pub meta_failed: u64,
    /// Read-after-write across the members: the lease, whether it holds, announcements.
    pub coherence: CoherenceStatus,
    /// Pins sent to and kept for the other members.
    pub pins: PinStatus,
}

/// The view before the last change.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PreviousView {
    /// Its members.
    pub members: usize,
    /// Seconds since it was replaced.
    pub age_secs: u64,
}

/// One member in [`ClusterMembers`].
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MemberStatus {
    /// Its address.
    pub id: String,
    /// Its placement weight (cache capacity in bytes with catalog membership; 1 otherwise).
    pub weight: f64,
    /// Its share of the blocks (sampled).
    pub share: f64,
    /// Up, or suspect while this agent skips it.
    pub state: MemberState,
    /// Whether it is this agent.
    pub me: bool,
}

/// The coherence state for `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct CoherenceStatus {
    /// The lease, in milliseconds.
    pub lease_ms: u64,
    /// Whether this agent trusts its metadata cache (in contact with every member within the lease).
    pub trusted: bool,
    /// A counter since the agent started.
    pub sent: u64,
    /// A counter since the agent started.
    pub unanswered: u64,
    /// A counter since the agent started.
    pub skipped: u64,
    /// A counter since the agent started.
    pub waited_ms: u64,
    /// A counter since the agent started.
    pub received: u64,
    /// A counter since the agent started.
    pub applied: u64,
    /// A counter since the agent started.
    pub lapses: u64,
}

/// The pin exchange for `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PinStatus {
    /// A counter since the agent started.
    pub sent: u64,
    /// A counter since the agent started.
    pub failed: u64,
    /// A counter since the agent started.
    pub received: u64,
    /// A counter since the agent started.
    pub forgotten: u64,
    /// Members whose pins are kept here (filled in by `GET /v1/cluster` from the cache).
    pub kept_for: Vec<String>,
}

endpoint! {
    /// A block of an object version, for another agent of the cluster
    PeerBlock = GET "/v1/peer/blocks", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read the key";
    query: BlockQuery, request: Empty, response: Binary
}
endpoint! {
    /// An object's current version (from this agent's metadata cache, else one HEAD joined by every asker), for another agent of the cluster; this agent owns the key's metadata
    PeerMetaOf = GET "/v1/peer/meta", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read the key";
    query: MetaQuery, request: Empty, response: Json<PeerMeta>
}
endpoint! {
    /// Stage this agent's share (the blocks it owns) of a list of object versions, for a claim taken by another agent
    PeerStage = POST "/v1/peer/stage", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read every key";
    query: NoQuery, request: Json<StageRequest>, response: Ndjson<StageLine>
}
endpoint! {
    /// Count what this agent holds of its share (the blocks it owns) of a list of object versions; nothing is fetched
    PeerHeld = POST "/v1/peer/held", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential), for a principal that may read every key";
    query: NoQuery, request: Json<StageRequest>, response: Json<HeldShare>
}
endpoint! {
    /// Another agent's writes and deletes (keys or prefixes of backends), dropped from this agent's metadata cache before the answer; an empty list is a probe of contact
    PeerInvalidate = POST "/v1/peer/invalidate", Peer, Access::Cluster,
        "agents of the cluster only (the cluster credential)";
    query: NoQuery, request: Json<Announcement>, response: Empty, status: 204
}
endpoint! {
    /// Every pin of another agent (backend ids and prefixes), kept here for the blocks this agent owns; replaces what was kept for it
    PeerPins = POST "/v1/peer/pins", Peer, Access::Cluster, "agents of the cluster only (the cluster credential)";
    query: NoQuery, request: Json<PinList>, response: Empty, status: 204
}
endpoint! {
    /// The members of the shared cache, their state and share of blocks, and peer counters
    ClusterStatus = GET "/v1/cluster", Data, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<ClusterView>
}

endpoint_list!(
    PeerBlock,
    PeerMetaOf,
    PeerStage,
    PeerHeld,
    PeerInvalidate,
    PeerPins,
    ClusterStatus
);
