//! Usage by team, prefix, job or dataset; reconciliation and POSIX scans; prefix ownership.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Empty, Json, NoQuery, Untyped, endpoint, endpoint_list};

/// How to group usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UsageBy {
    /// Owning team.
    #[default]
    Team,
    /// Owned prefix (backend + prefix).
    Prefix,
    /// Job id.
    Job,
    /// Dataset.
    Dataset,
}

/// Query of `GET /v1/usage`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    /// How to group (default `team`).
    pub by: Option<UsageBy>,
}

/// One line of a usage report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct UsageLine {
    /// The group (team name, `backend:prefix`, job id or dataset; `""` = none).
    pub group: String,
    /// Owning team of the group (for prefixes; the team itself for teams).
    pub team: Option<String>,
    /// Bytes.
    pub bytes: i64,
    /// Objects.
    pub objects: i64,
}

/// An owned prefix: every key under it is the team's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OwnedPrefix {
    /// Backend name.
    pub backend: String,
    /// Prefix (ends with `/`).
    pub prefix: String,
    /// Owning team.
    pub team: String,
}

/// Body of `POST /v1/usage/reconcile`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reconcile {
    /// The configured backend to list completely.
    pub backend: String,
}

/// Body of `POST /v1/usage/scan`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Scan {
    /// The configured local-directory backend to scan.
    pub backend: String,
    /// Threads walking the tree (0: one per core; at most 256).
    #[serde(default)]
    pub threads: usize,
}

endpoint! {
    /// Usage grouped by team, prefix, job or dataset
    GetUsage = GET "/v1/usage", Control, Access::Any, "any principal (only visible teams)";
    query: UsageQuery, request: Empty, response: Json<Vec<UsageLine>>
}
endpoint! {
    /// List a backend completely and correct the inventory and usage
    ReconcileUsage = POST "/v1/usage/reconcile", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<Reconcile>, response: Json<Untyped>
}
endpoint! {
    /// Scan a local-directory backend's tree in parallel (like a parallel file system's project quota) and set each team's usage on it from the projects (top-level directories) it owns
    ScanUsage = POST "/v1/usage/scan", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<Scan>, response: Json<Untyped>
}
endpoint! {
    /// Owned prefixes of the visible teams
    ListPrefixes = GET "/v1/prefixes", Control, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Vec<OwnedPrefix>>
}
endpoint! {
    /// Give a prefix to a team
    SetPrefix = PUT "/v1/prefixes", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<OwnedPrefix>, response: Json<OwnedPrefix>
}

endpoint_list!(GetUsage, ReconcileUsage, ScanUsage, ListPrefixes, SetPrefix);
