//! Retention policies, protections (pins and claims), clean-up plans and the trash.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::teams::Deleted;
use crate::{Access, Empty, Json, NoQuery, Role, endpoint, endpoint_list};

/// What a retention policy does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Delete objects older than `age_secs` (by modification time).
    Ttl,
    /// Delete objects not read for `age_secs` (by the access times Strata recorded; modification time if
    /// never read).
    Stale,
    /// Keep the last `keep_last` committed checkpoints of each run under the prefix; older steps go.
    KeepLast,
}

impl PolicyKind {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Ttl => "ttl",
            PolicyKind::Stale => "stale",
            PolicyKind::KeepLast => "keep_last",
        }
    }

    /// Parse a stored name.
    pub fn parse(s: &str) -> strata_types::Result<Self> {
        match s {
            "ttl" => Ok(PolicyKind::Ttl),
            "stale" => Ok(PolicyKind::Stale),
            "keep_last" => Ok(PolicyKind::KeepLast),
            _ => Err(strata_types::Error::new(
                strata_types::ErrorKind::InvalidInput,
                format!("policy kind {s:?}: expected ttl, stale or keep_last"),
            )),
        }
    }
}

/// A retention policy of one team on one backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Id (`pol_...`), assigned on creation.
    #[serde(default)]
    pub id: String,
    /// Owning team: the policy only ever selects this team's objects.
    pub team: String,
    /// Backend name.
    pub backend: String,
    /// What it does.
    pub kind: PolicyKind,
    /// Key prefix it applies to (literal, segment-aware).
    pub prefix: Option<String>,
    /// Or a label: `dataset:NAME` or `job:ID`, matched against the inventory.
    pub label: Option<String>,
    /// Age for `ttl` and `stale`, seconds (> 0).
    pub age_secs: Option<i64>,
    /// Checkpoints to keep for `keep_last` (> 0).
    pub keep_last: Option<i64>,
    /// Creation time, assigned on creation.
    #[serde(default)]
    pub created_at: i64,
}

/// What a protection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProtectionKind {
    /// Until removed.
    Pin,
    /// A job's declared data, until `expires_at`.
    Claim,
}

/// A protection: data the clean-up never touches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Protection {
    /// Id (`pin_...` or `clm_...`), assigned on creation.
    #[serde(default)]
    pub id: String,
    /// Pin or claim.
    pub kind: ProtectionKind,
    /// Owning team.
    pub team: String,
    /// Backend name.
    pub backend: String,
    /// Protected prefix (ends with `/`), or an exact key (no trailing `/`).
    pub prefix: String,
    /// Claiming job.
    pub job: Option<String>,
    /// Expiry (claims; unix seconds).
    pub expires_at: Option<i64>,
    /// Creation time, assigned on creation.
    #[serde(default)]
    pub created_at: i64,
}

/// Where a clean-up plan is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PlanStatus {
    /// Made (a dry run); nothing moved yet.
    #[default]
    Planned,
    /// Being run: its items are moving to the trash.
    Running,
    /// Run; every item it could move is in the trash.
    Done,
    /// Run; some items were skipped or deferred.
    Partial,
}

/// Where one item of a clean-up plan is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Selected by a policy; not run yet.
    Planned,
    /// Moved to the trash (restorable until purged).
    Trashed,
    /// Not moved: changed since it was planned, protected, or gone (`reason` says which).
    Skipped,
    /// Not moved this run (the run stopped early); a later run tries it again.
    Deferred,
    /// Moved back from the trash.
    Restored,
    /// Deleted from the trash once its grace period ended.
    Purged,
}

/// A stored state name, parsed; the error names what was expected.
macro_rules! stored_names {
    ($t:ident { $($v:ident => $s:literal),+ $(,)? }) => {
        impl $t {
            /// The name stored and shown.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$v => $s),+
                }
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl TryFrom<String> for $t {
            type Error = strata_types::Error;

            fn try_from(s: String) -> strata_types::Result<Self> {
                match s.as_str() {
                    $($s => Ok(Self::$v),)+
                    _ => Err(strata_types::Error::new(
                        strata_types::ErrorKind::InvalidInput,
                        format!(concat!(stringify!($t), " {:?}: expected one of ", $($s, " "),+), s),
                    )),
                }
            }
        }
    };
}

stored_names!(PlanStatus { Planned => "planned", Running => "running", Done => "done", Partial => "partial" });
stored_names!(ItemState {
    Planned => "planned",
    Trashed => "trashed",
    Skipped => "skipped",
    Deferred => "deferred",
    Restored => "restored",
    Purged => "purged",
});

/// A clean-up plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Plan {
    /// Id (`plan_...`).
    pub id: String,
    /// Team it is restricted to (`null` = every team).
    pub team: Option<String>,
    /// When it was made (unix seconds).
    pub created_at: i64,
    /// Who made it.
    pub created_by: String,
    /// Where it is.
    pub status: PlanStatus,
    /// JSON details (policies, counts).
    pub detail: String,
}

/// One candidate of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PlanItem {
    /// Plan.
    pub plan_id: String,
    /// Backend name.
    pub backend: String,
    /// Key.
    pub key: String,
    /// Size when planned.
    pub size: i64,
    /// ETag when planned.
    pub etag: String,
    /// Modification time when planned.
    pub modified_at: i64,
    /// Owning team.
    pub team: Option<String>,
    /// Policy that selected it.
    pub policy_id: String,
    /// Where it is.
    pub state: ItemState,
    /// Why it was selected or skipped.
    pub reason: String,
    /// Where it is in the trash.
    pub trash_key: Option<String>,
    /// When it was moved to the trash.
    pub trashed_at: Option<i64>,
}

/// A plan and its items.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PlanDetail {
    /// The plan.
    pub plan: Plan,
    /// Its items.
    pub items: Vec<PlanItem>,
}

/// A plan just made: what it selects, nothing deleted yet.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PlanMade {
    /// The plan.
    pub plan: Plan,
    /// Its items.
    pub items: Vec<PlanItem>,
    /// Per team: (objects, bytes) selected.
    pub per_team: std::collections::BTreeMap<String, (u64, u64)>,
    /// Objects a policy matched but a protection kept out.
    pub protected: u64,
}

/// What a run of a plan did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RunReport {
    /// The plan.
    pub plan_id: String,
    /// Items moved to the trash by this run.
    pub trashed: u64,
    /// Bytes moved by this run.
    pub trashed_bytes: u64,
    /// Items skipped: (key, why).
    pub skipped: Vec<(String, String)>,
    /// Items left for a later run by a cap.
    pub deferred: u64,
    /// `done` or `partial`.
    pub status: PlanStatus,
}

/// Body of `POST /v1/cleanup/plans`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewPlan {
    /// Only this team's objects (an administrator may leave it out for every team).
    pub team: Option<String>,
}

/// Body of `POST /v1/cleanup/plans/{id}/run`: caps on what one run may trash.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCaps {
    /// Objects at most.
    pub max_objects: Option<u64>,
    /// Bytes at most.
    pub max_bytes: Option<u64>,
    /// At most this share of a team's bytes, in percent.
    pub max_team_percent: Option<f64>,
}

/// Body of `POST /v1/cleanup/plans/{id}/restore`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreItems {
    /// Only the items whose key starts so.
    pub key_prefix: Option<String>,
}

/// What a restore did.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Restored {
    /// Items put back.
    pub restored: u64,
    /// Items not put back (a newer object now has the key): (key, why).
    pub refused: Vec<(String, String)>,
}

/// Body of `POST /v1/cleanup/purge`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Purge {
    /// Trash older than this goes (default: the configured grace).
    pub grace_secs: Option<i64>,
}

/// What a purge deleted.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Purged {
    /// Items deleted for good.
    pub purged: u64,
    /// Their bytes.
    pub bytes: u64,
}

endpoint! {
    /// Retention policies of the visible teams
    ListPolicies = GET "/v1/policies", Control, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Vec<Policy>>
}
endpoint! {
    /// Add a retention policy (ttl, stale, keep_last)
    AddPolicy = POST "/v1/policies", Control, Access::Team(Role::TeamAdmin), "team_admin of its team";
    query: NoQuery, request: Json<Policy>, response: Json<Policy>
}
endpoint! {
    /// Delete a retention policy
    DeletePolicy = DELETE "/v1/policies/{id}", Control, Access::Owner(Role::TeamAdmin), "team_admin of its team";
    query: NoQuery, request: Empty, response: Json<Deleted>
}
endpoint! {
    /// Pins and claims of the visible teams
    ListProtections = GET "/v1/protections", Control, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Vec<Protection>>
}
endpoint! {
    /// Pin data, or claim it for a job until an expiry
    AddProtection = POST "/v1/protections", Control, Access::Team(Role::Member), "member of its team";
    query: NoQuery, request: Json<Protection>, response: Json<Protection>
}
endpoint! {
    /// Remove a pin or claim
    DeleteProtection = DELETE "/v1/protections/{id}", Control, Access::Owner(Role::Member), "member of its team";
    query: NoQuery, request: Empty, response: Json<Deleted>
}
endpoint! {
    /// Clean-up plans of the visible teams
    ListPlans = GET "/v1/cleanup/plans", Control, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Vec<Plan>>
}
endpoint! {
    /// Plan a clean-up (a dry run)
    MakePlan = POST "/v1/cleanup/plans", Control, Access::Team(Role::Member),
        "member of the team (admin for every team)";
    query: NoQuery, request: Json<NewPlan>, response: Json<PlanMade>
}
endpoint! {
    /// A plan and its items
    GetPlan = GET "/v1/cleanup/plans/{id}", Control, Access::Owner(Role::Reader), "reader of its team";
    query: NoQuery, request: Empty, response: Json<PlanDetail>
}
endpoint! {
    /// Execute a plan within caps
    RunPlan = POST "/v1/cleanup/plans/{id}/run", Control, Access::Owner(Role::TeamAdmin), "team_admin of its team";
    query: NoQuery, request: Json<RunCaps>, response: Json<RunReport>
}
endpoint! {
    /// Restore a plan's trashed items
    RestorePlan = POST "/v1/cleanup/plans/{id}/restore", Control, Access::Owner(Role::TeamAdmin),
        "team_admin of its team";
    query: NoQuery, request: Json<RestoreItems>, response: Json<Restored>
}
endpoint! {
    /// Delete trash older than the grace period
    PurgeTrash = POST "/v1/cleanup/purge", Control, Access::Admin, "admin";
    query: NoQuery, request: Json<Purge>, response: Json<Purged>
}

endpoint_list!(
    ListPolicies,
    AddPolicy,
    DeletePolicy,
    ListProtections,
    AddProtection,
    DeleteProtection,
    ListPlans,
    MakePlan,
    GetPlan,
    RunPlan,
    RestorePlan,
    PurgeTrash,
);
