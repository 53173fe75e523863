//! Claims: what a job declares about its data (datasets, checkpoint, scratch), admitted, staged, mounted
//! and released; coverage of a location by the cache cluster.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quotas::Nothing;
use crate::{Access, Empty, Json, NoQuery, Role, endpoint, endpoint_list};

pub use strata_claim::{
    ClaimSpec, ClaimState, ClaimStatus, Coverage, DatasetStatus, JobUsage, MemberCoverage, Progress,
};

/// A JSON Schema document.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaDocument(pub serde_json::Value);

impl JsonSchema for SchemaDocument {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SchemaDocument".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "object", "description": "A JSON Schema (draft 2020-12) document."})
    }
}

/// What `POST /v1/claims/validate` found in a valid document (an invalid one is a 400 naming each problem).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Validated {
    /// Always true.
    pub valid: bool,
    /// Datasets it declares.
    pub datasets: usize,
    /// Whether it declares a checkpoint location.
    pub checkpoint: bool,
    /// Whether it declares scratch.
    pub scratch: bool,
}

/// A claim as released: its status, and whether this call released it (false: it was released before).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ReleasedClaim {
    /// The claim now.
    #[serde(flatten)]
    pub status: ClaimStatus,
    /// Whether this call released it.
    pub released_now: bool,
}

/// A page of the objects one dataset of a claim admitted, named relative to the dataset's location (as
/// `GET /v1/list` names them).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ClaimObjectsPage {
    /// The dataset's location.
    pub location: String,
    /// Objects in key order.
    pub objects: Vec<crate::data::ListedObject>,
    /// Pass as `after` for the next page; absent on the last.
    pub next: Option<String>,
}

/// Query of `GET /v1/claims`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimsQuery {
    /// Only this team's claims.
    pub team: Option<String>,
    /// Only this job's claims.
    pub job: Option<String>,
    /// Released claims too.
    #[serde(default)]
    pub released: bool,
}

/// Query of `GET /v1/coverage`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CoverageQuery {
    /// The location (a prefix) whose current version is counted.
    pub location: String,
    /// Count as a reader of this team.
    pub team: Option<String>,
}

/// Query of `GET /v1/claims/{id}/objects`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ObjectsQuery {
    /// The dataset's name in the claim.
    pub dataset: String,
    /// Start after this name (the page before's `next`).
    pub after: Option<String>,
    /// Objects per page, 1 to 1000 (default 1000).
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<usize>,
}

/// Body of a heartbeat: nothing (an empty body or `{}`), or what a loader process reports with it: its
/// running total of I/O stall under a name of its own.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Seconds the reporter has waited on I/O so far (0 to 1e9).
    #[schemars(range(min = 0))]
    pub stall_secs: Option<f64>,
    /// Who reports (`host:pid`); given with `stall_secs`.
    pub reporter: Option<String>,
}

/// Body of `POST /v1/claims/{id}/release`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Release {
    /// Why (at most 1024 bytes; default `released`).
    pub reason: Option<String>,
}

endpoint! {
    /// The claim document's JSON Schema
    ClaimSchema = GET "/v1/claims/schema", Public, Access::Public, "anyone";
    query: NoQuery, request: Empty, response: Json<SchemaDocument>
}
endpoint! {
    /// Check a claim without submitting it: every problem, each naming its field
    ValidateClaim = POST "/v1/claims/validate", Control, Access::Any, "any principal";
    query: NoQuery, request: Json<ClaimSpec>, response: Json<Validated>
}
endpoint! {
    /// Submit a claim: admitted against quota, versions pinned, staging started
    SubmitClaim = POST "/v1/claims", Control, Access::Team(Role::Member),
        "member of the claim's team (and reader of each dataset)";
    query: NoQuery, request: Json<ClaimSpec>, response: Json<ClaimStatus>
}
endpoint! {
    /// Claims of the caller's teams
    ListClaims = GET "/v1/claims", Control, Access::Any, "any principal (sees its teams' claims; admins all)";
    query: ClaimsQuery, request: Empty, response: Json<Vec<ClaimStatus>>
}
endpoint! {
    /// How much of a location's current version the cache cluster holds, per agent, counted (nothing fetched)
    GetCoverage = GET "/v1/coverage", Control, Access::Location(Role::Reader),
        "reader of every key under the location (as a reader of `team`, when given)";
    query: CoverageQuery, request: Empty, response: Json<Coverage>
}
endpoint! {
    /// One claim: state, reason, progress, environment, accounting
    GetClaim = GET "/v1/claims/{id}", Control, Access::Owner(Role::Reader), "reader of the claim's team";
    query: NoQuery, request: Empty, response: Json<ClaimStatus>
}
endpoint! {
    /// The versions a claim admitted for one dataset, a page at a time (what its mount serves)
    ClaimObjects = GET "/v1/claims/{id}/objects", Control, Access::Owner(Role::Reader),
        "reader of the claim's team";
    query: ObjectsQuery, request: Empty, response: Json<ClaimObjectsPage>
}
endpoint! {
    /// The job is alive: the claim's TTL starts again
    ClaimHeartbeat = POST "/v1/claims/{id}/heartbeat", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Heartbeat>, response: Json<ClaimStatus>
}
endpoint! {
    /// Release a claim (idempotent): pins and scratch freed, accounting final
    ReleaseClaim = POST "/v1/claims/{id}/release", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Release>, response: Json<ReleasedClaim>
}
endpoint! {
    /// Mount a ready claim's datasets on this agent's node too (another node of a multi-node job; idempotent)
    AttachClaim = POST "/v1/claims/{id}/attach", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Nothing>, response: Json<ClaimStatus>
}
endpoint! {
    /// Unmount a claim's datasets from this agent's node (idempotent)
    DetachClaim = POST "/v1/claims/{id}/detach", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Nothing>, response: Json<ClaimStatus>
}

endpoint_list!(
    ClaimSchema,
    ValidateClaim,
    SubmitClaim,
    ListClaims,
    GetCoverage,
    GetClaim,
    ClaimObjects,
    ClaimHeartbeat,
    ReleaseClaim,
    AttachClaim,
    DetachClaim,
);
