//! Forecasts of when volumes and quotas fill, the audit log, and scratch allocations.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quotas::Released;
use crate::{Access, Empty, Json, NoQuery, Role, endpoint, endpoint_list};

/// `?team=&limit=` of the routes that list one team's records.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Only this team's records (else those of every visible team).
    pub team: Option<String>,
    /// The newest this many (1 to 10000, default 100).
    #[schemars(range(min = 0))]
    pub limit: Option<i64>,
}

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditRecord {
    /// Record id.
    pub id: String,
    /// When (unix seconds).
    pub at: i64,
    /// Who (principal id, or `system`).
    pub principal: String,
    /// Which team it concerns, if any.
    pub team: Option<String>,
    /// What (`team.create`, `quota.set`, `cleanup.trash`, ...).
    pub action: String,
    /// On what.
    pub target: String,
    /// Details (JSON text).
    pub detail: String,
}

/// Body of `POST /v1/scratch`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewScratch {
    /// Team charged.
    pub team: String,
    /// Bytes reserved against the team's `scratch` quota.
    pub bytes: i64,
    /// Lifetime in seconds.
    pub ttl_secs: i64,
}

/// A scratch allocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Scratch {
    /// Id (`scr_...`).
    pub id: String,
    /// Team charged.
    pub team: String,
    /// Bytes reserved against the team's `scratch` quota.
    pub bytes: i64,
    /// Directory.
    pub path: String,
    /// Expiry (unix seconds).
    pub expires_at: i64,
    /// Creation (unix seconds).
    pub created_at: i64,
    /// Release time, once released.
    pub released_at: Option<i64>,
}

/// When usage reaches a capacity: a linear fit of the samples with a prediction interval.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct Forecast {
    /// Fitted growth rate, in bytes per day (negative when usage shrinks).
    pub slope_per_day: f64,
    /// Point estimate of the fill time, in days from now (`0` when already full; `null` when usage is not
    /// growing or fills only past the horizon).
    pub days_until_full: Option<f64>,
    /// Earliest plausible fill time, in days from now (`null`: not within the horizon).
    pub days_low: Option<f64>,
    /// Latest plausible fill time, in days from now (`null`: may never fill within the horizon).
    pub days_high: Option<f64>,
    /// Samples the fit used.
    pub samples: usize,
    /// The method (`ols_linear`).
    pub method: String,
}

/// One forecast.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ForecastLine {
    /// `team` (a team's total against its hard byte limit), `quota` (`team/scope`: one scope's hard limit)
    /// or `volume` (a file system).
    pub kind: String,
    /// Team name, `team/scope`, or mount path.
    pub scope: String,
    /// Bytes used at the last sample.
    pub used: i64,
    /// Capacity (hard quota or volume size).
    pub capacity: Option<i64>,
    /// The forecast, when there is enough history.
    pub forecast: Option<Forecast>,
    /// Why there is no forecast.
    pub note: Option<String>,
    /// True when the earliest likely fill date is within `catalog.forecast_alert_days`.
    pub alert: bool,
}

endpoint! {
    /// Days until volumes and team quotas fill, with prediction intervals and alerts
    Forecasts = GET "/v1/forecast", Control, Access::Any, "any principal (only visible teams)";
    query: NoQuery, request: Empty, response: Json<Vec<ForecastLine>>
}
endpoint! {
    /// The audit log
    Audit = GET "/v1/audit", Control, Access::Team(Role::Reader), "reader of the team (admins: all)";
    query: AuditQuery, request: Empty, response: Json<Vec<AuditRecord>>
}
endpoint! {
    /// Scratch allocations of the visible teams
    ListScratch = GET "/v1/scratch", Control, Access::Any, "any principal";
    query: NoQuery, request: Empty, response: Json<Vec<Scratch>>
}
endpoint! {
    /// Allocate scratch space; charged to the team's scratch quota
    AllocScratch = POST "/v1/scratch", Control, Access::Team(Role::Member), "member of the team";
    query: NoQuery, request: Json<NewScratch>, response: Json<Scratch>
}
endpoint! {
    /// Release a scratch allocation (its files are deleted)
    FreeScratch = DELETE "/v1/scratch/{id}", Control, Access::Owner(Role::Member), "member of its team";
    query: NoQuery, request: Empty, response: Json<Released>
}

endpoint_list!(Forecasts, Audit, ListScratch, AllocScratch, FreeScratch);
