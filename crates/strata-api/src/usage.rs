//! Usage by team, prefix, job or dataset; reconciliation and POSIX scans; prefix ownership.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Empty, Json, NoQuery, endpoint, endpoint_list};

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

impl UsageBy {
    /// Parse `team|prefix|job|dataset`.
    pub fn parse(s: &str) -> strata_types::Result<Self> {
        match s {
            "team" => Ok(UsageBy::Team),
            "prefix" => Ok(UsageBy::Prefix),
            "job" => Ok(UsageBy::Job),
            "dataset" => Ok(UsageBy::Dataset),
            _ => Err(strata_types::Error::new(
                strata_types::ErrorKind::InvalidInput,
                format!("usage grouping {s:?}: expected team, prefix, job or dataset"),
            )),
        }
    }
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

/// What a reconciliation did: the backend listed completely, the inventory and usage corrected.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Reconciled {
    /// Backend reconciled.
    pub backend: String,
    /// Objects listed.
    pub listed: u64,
    /// Bytes listed.
    pub listed_bytes: u64,
    /// Inventory rows added (unknown to the inventory).
    pub added: u64,
    /// Rows whose size or ETag changed.
    pub updated: u64,
    /// Rows removed (gone from the backend).
    pub removed: u64,
    /// Usage per team after reconciliation: (bytes, objects); `""` = unowned.
    pub teams: std::collections::BTreeMap<String, (i64, i64)>,
    /// Stale reservations on the backend's scope released.
    pub released_reservations: u64,
    /// Seconds spent listing.
    pub list_secs: f64,
    /// Seconds spent updating the catalog.
    pub apply_secs: f64,
}

/// Usage counters of a tree, as `du` counts them.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema)]
pub struct TreeTotals {
    /// Allocated bytes (`st_blocks * 512`).
    pub bytes: u64,
    /// Apparent size (`st_size`).
    pub apparent_bytes: u64,
    /// Apparent size of the non-directory entries only: what an object store would count.
    pub file_bytes: u64,
    /// Non-directory entries.
    pub files: u64,
    /// Directories, the root included.
    pub dirs: u64,
}

/// What a scan of a local-directory backend found and set.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Scanned {
    /// The backend scanned.
    pub backend: String,
    /// Seconds the scan took.
    pub secs: f64,
    /// The whole tree.
    pub total: TreeTotals,
    /// Each team's usage set on the backend: (bytes, files).
    pub teams: std::collections::BTreeMap<String, (i64, i64)>,
    /// Entries that could not be read.
    pub errors_total: u64,
}

endpoint! {
    /// Usage grouped by team, prefix, job or dataset
    GetUsage = GET "/v1/usage", Control, Access::Any, "any principal (only visible teams)";
    query: UsageQuery, request: Empty, response: Json<Vec<UsageLine>>
}
endpoint! {
    /// List a backend completely and correct the inventory and usage
    ReconcileUsage = POST "/v1/usage/reconcile", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<Reconcile>, response: Json<Reconciled>
}
endpoint! {
    /// Scan a local-directory backend's tree in parallel (like a parallel file system's project quota) and set each team's usage on it from the projects (top-level directories) it owns
    ScanUsage = POST "/v1/usage/scan", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<Scan>, response: Json<Scanned>
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
