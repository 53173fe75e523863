//! Quotas and reservations: limits per team and scope, admission before bytes, commits and releases.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Json, NoQuery, Role, endpoint, endpoint_list};

/// Limits of one team on one scope. `null` = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Soft limit on bytes (admitted during the grace period).
    pub soft_bytes: Option<i64>,
    /// Hard limit on bytes (never exceeded).
    pub hard_bytes: Option<i64>,
    /// Soft limit on objects.
    pub soft_objects: Option<i64>,
    /// Hard limit on objects.
    pub hard_objects: Option<i64>,
    /// How long usage may stay over a soft limit, in seconds.
    #[serde(default)]
    pub grace_secs: i64,
}

/// Where a team stands against one scope's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum QuotaStatus {
    /// Under every limit.
    Ok,
    /// Over a soft limit, within the grace period.
    SoftGrace,
    /// Over a soft limit past the grace period: writes refused.
    GraceExpired,
    /// At or over a hard limit: writes refused.
    Hard,
}

/// Limits, counters and status of one team on one scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QuotaState {
    /// Team.
    pub team: String,
    /// Scope (`*` = the team's total).
    pub scope: String,
    /// Limits.
    pub limits: QuotaLimits,
    /// Committed bytes.
    pub used_bytes: i64,
    /// Committed objects.
    pub used_objects: i64,
    /// Admitted, not yet committed bytes.
    pub reserved_bytes: i64,
    /// Admitted, not yet committed objects.
    pub reserved_objects: i64,
    /// Since when usage is over the soft limit (unix seconds).
    pub soft_since: Option<i64>,
    /// Status now.
    pub status: QuotaStatus,
    /// When the grace period ends, if over a soft limit (unix seconds).
    pub grace_ends_at: Option<i64>,
}

/// An admitted write. Commit it with the real size, or release it; left alone it expires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Reservation {
    /// Id.
    pub id: String,
    /// Team charged.
    pub team: String,
    /// Scope charged (and the team's total).
    pub scope: String,
    /// The parent scope also charged (a created bucket's: `bucket_root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Bytes reserved.
    pub bytes: i64,
    /// Objects reserved.
    pub objects: i64,
}

/// Body of `POST /v1/quotas/{team}/{scope}/reserve`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reserve {
    /// Bytes to admit.
    pub bytes: i64,
    /// Objects to admit.
    #[serde(default)]
    pub objects: i64,
    /// How long the reservation holds uncommitted (default: the catalog's `reservation_ttl_secs`; 1 s to 7
    /// days).
    pub ttl_secs: Option<i64>,
}

/// Body of a commit or a correction: what was really written, or what is given back.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Charge {
    /// Bytes.
    pub bytes: i64,
    /// Objects.
    #[serde(default)]
    pub objects: i64,
    /// `ckpt` scope only, on a commit: the name the charged checkpoint shard is recorded under
    /// (`run/step-…/rank-…`).
    pub key: Option<String>,
}

/// Body of `POST /v1/quotas/{team}/{scope}/deleted`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeletedShards {
    /// The recorded checkpoint shards under this name were deleted (`run/step-…`).
    pub prefix: String,
}

/// What deleting recorded shards gave back.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Freed {
    /// Bytes given back.
    pub freed_bytes: i64,
    /// Objects given back.
    pub freed_objects: i64,
}

/// A reservation committed.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Committed {
    /// Its id.
    pub committed: String,
}

/// A reservation or an allocation given back.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Released {
    /// Its id.
    pub released: String,
}

/// An empty JSON object, for routes whose body says nothing.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Nothing {}

endpoint! {
    /// Quotas and usage counters of the visible teams
    ListQuotas = GET "/v1/quotas", Control, Access::Any, "any principal";
    query: NoQuery, request: crate::Empty, response: Json<Vec<QuotaState>>
}
endpoint! {
    /// Quotas and usage counters of a team
    TeamQuotas = GET "/v1/quotas/{team}", Control, Access::Team(Role::Reader), "reader of the team";
    query: NoQuery, request: crate::Empty, response: Json<Vec<QuotaState>>
}
endpoint! {
    /// Set a team's limits on a scope (a backend, a created bucket, bucket_root for every bucket the team created together, cache, scratch, peer, ckpt, or * for its total)
    SetQuota = PUT "/v1/quotas/{team}/{scope}", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<QuotaLimits>, response: Json<QuotaState>
}
endpoint! {
    /// Admit a write before its bytes are accepted; 429 resource_exhausted over the limit
    ReserveQuota = POST "/v1/quotas/{team}/{scope}/reserve", Control, Access::Team(Role::Member),
        "member of the team";
    query: NoQuery, request: Json<Reserve>, response: Json<Reservation>
}
endpoint! {
    /// Correct usage counters by hand: bytes and objects given back (never below zero)
    FreeUsage = POST "/v1/quotas/{team}/{scope}/free", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<Charge>, response: Json<QuotaState>
}
endpoint! {
    /// Checkpoint shards deleted from a local tier (scope ckpt); gives back exactly what was charged for them
    ShardsDeleted = POST "/v1/quotas/{team}/{scope}/deleted", Control, Access::Team(Role::Member),
        "member of the team";
    query: NoQuery, request: Json<DeletedShards>, response: Json<Freed>
}
endpoint! {
    /// Charge an admitted write with what was actually written; on scope ckpt a key records the shard
    CommitReservation = POST "/v1/reservations/{id}/commit", Control, Access::Owner(Role::Member),
        "member of its team";
    query: NoQuery, request: Json<Charge>, response: Json<Committed>
}
endpoint! {
    /// Give an admitted write back
    ReleaseReservation = POST "/v1/reservations/{id}/release", Control, Access::Owner(Role::Member),
        "member of its team";
    query: NoQuery, request: Json<Nothing>, response: Json<Released>
}

endpoint_list!(
    ListQuotas,
    TeamQuotas,
    SetQuota,
    ReserveQuota,
    FreeUsage,
    ShardsDeleted,
    CommitReservation,
    ReleaseReservation,
);
