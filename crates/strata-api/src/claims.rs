//! Claims: what a job declares about its data (datasets, checkpoint, scratch), admitted, staged, mounted
//! and released; coverage of a location by the cache cluster.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quotas::Nothing;
use crate::{Access, Empty, Json, NoQuery, Role, Untyped, endpoint, endpoint_list};

pub use strata_claim::ClaimState;

/// A claim document (JSON; YAML through the CLI), as `GET /v1/claims/schema` describes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClaimDocument(pub serde_json::Value);

impl JsonSchema for ClaimDocument {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ClaimDocument".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // The document as published at /v1/claims/schema, less what OpenAPI 3.0 has no place for.
        let mut v = strata_claim::schema();
        if let Some(o) = v.as_object_mut() {
            o.remove("$schema");
            o.remove("$id");
        }
        schemars::Schema::try_from(v).unwrap_or_default()
    }
}

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
    query: NoQuery, request: Json<ClaimDocument>, response: Json<Validated>
}
endpoint! {
    /// Submit a claim: admitted against quota, versions pinned, staging started
    SubmitClaim = POST "/v1/claims", Control, Access::Team(Role::Member),
        "member of the claim's team (and reader of each dataset)";
    query: NoQuery, request: Json<ClaimDocument>, response: Json<Untyped>
}
endpoint! {
    /// Claims of the caller's teams
    ListClaims = GET "/v1/claims", Control, Access::Any, "any principal (sees its teams' claims; admins all)";
    query: ClaimsQuery, request: Empty, response: Json<Vec<Untyped>>
}
endpoint! {
    /// How much of a location's current version the cache cluster holds, per agent, counted (nothing fetched)
    Coverage = GET "/v1/coverage", Control, Access::Location(Role::Reader),
        "reader of every key under the location (as a reader of `team`, when given)";
    query: CoverageQuery, request: Empty, response: Json<Untyped>
}
endpoint! {
    /// One claim: state, reason, progress, environment, accounting
    GetClaim = GET "/v1/claims/{id}", Control, Access::Owner(Role::Reader), "reader of the claim's team";
    query: NoQuery, request: Empty, response: Json<Untyped>
}
endpoint! {
    /// The versions a claim admitted for one dataset, a page at a time (what its mount serves)
    ClaimObjects = GET "/v1/claims/{id}/objects", Control, Access::Owner(Role::Reader),
        "reader of the claim's team";
    query: ObjectsQuery, request: Empty, response: Json<Untyped>
}
endpoint! {
    /// The job is alive: the claim's TTL starts again
    ClaimHeartbeat = POST "/v1/claims/{id}/heartbeat", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Heartbeat>, response: Json<Untyped>
}
endpoint! {
    /// Release a claim (idempotent): pins and scratch freed, accounting final
    ReleaseClaim = POST "/v1/claims/{id}/release", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Release>, response: Json<Untyped>
}
endpoint! {
    /// Mount a ready claim's datasets on this agent's node too (another node of a multi-node job; idempotent)
    AttachClaim = POST "/v1/claims/{id}/attach", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Nothing>, response: Json<Untyped>
}
endpoint! {
    /// Unmount a claim's datasets from this agent's node (idempotent)
    DetachClaim = POST "/v1/claims/{id}/detach", Control, Access::Owner(Role::Member),
        "member of the claim's team";
    query: NoQuery, request: Json<Nothing>, response: Json<Untyped>
}

endpoint_list!(
    ClaimSchema,
    ValidateClaim,
    SubmitClaim,
    ListClaims,
    Coverage,
    GetClaim,
    ClaimObjects,
    ClaimHeartbeat,
    ReleaseClaim,
    AttachClaim,
    DetachClaim,
);
