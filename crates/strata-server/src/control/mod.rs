//! The control plane's API: teams and access, quotas, usage, lifecycle clean-up, forecasts, scratch, audit.
//!
//! Every route but `/healthz` and `/openapi.json` needs `Authorization: Bearer <token>` ([`require_token`]
//! wraps the whole router, data-plane routes included). What a principal may do follows its role in each team
//! ([`strata_catalog::Role`]); a resource of a team the principal is not a member of answers 403 on team-named
//! routes and 404 on id-named ones (an id of another team's object is indistinguishable from a made-up id).
//!
//! Its routes are [`routes`], part of the one table of [`crate::routes`] that builds the router and
//! `/openapi.json`, so the document cannot drift from what is served; the tenant-isolation test enumerates
//! the document.
//!
//! One room per resource: `teams` (teams, members, principals, tokens), `quotas` (limits, reservations),
//! `usage` (usage, reconciliation, scans, prefixes), `lifecycle` (policies, protections, clean-up plans),
//! `forecasts` (forecasts, audit), `scratch`; `auth` (bootstrap, the token middleware), `state` (access times,
//! token cache, forecasts kept on the agent), `common` (imports and helpers). Its background work is in
//! [`crate::background`].

mod analytics;
mod auth;
mod common;
mod forecasts;
mod lifecycle;
mod quotas;
mod scratch;
mod state;
mod teams;
mod usage;

use axum::routing::{delete, get, post, put};

use crate::http::{Route, route};
use strata_api as api;

pub(crate) use analytics::CatalogSink;
pub use auth::{bootstrap_admin, require_token};
pub use forecasts::compute_forecasts;
pub(crate) use scratch::{allocate_scratch, release_scratch, scratch_path};
pub use state::{ACCESS_RESOLUTION_SECS, AccessLog, ForecastLine};
/// Where a generated administrator token is written (where clients look for it too).
pub use strata_client::token::admin_token_file;

/// Every control-plane route, with its documentation.
pub fn routes() -> Vec<Route> {
    vec![
        route::<api::teams::WhoAmI>(get(teams::whoami)),
        route::<api::teams::ListTeams>(get(teams::list_teams)),
        route::<api::teams::CreateTeam>(post(teams::create_team)),
        route::<api::teams::GetTeam>(get(teams::get_team)),
        route::<api::teams::DeleteTeam>(delete(teams::delete_team)),
        route::<api::teams::ListMembers>(get(teams::list_members)),
        route::<api::teams::SetMember>(put(teams::set_member)),
        route::<api::teams::RemoveMember>(delete(teams::remove_member)),
        route::<api::teams::ListTokens>(get(teams::list_tokens)),
        route::<api::teams::CreateToken>(post(teams::create_token)),
        route::<api::teams::RevokeToken>(delete(teams::revoke_token)),
        route::<api::quotas::ListQuotas>(get(quotas::list_quotas)),
        route::<api::quotas::TeamQuotas>(get(quotas::team_quotas)),
        route::<api::analytics::ListJobs>(get(analytics::list_jobs)),
        route::<api::analytics::GetJobProfile>(get(analytics::job_profile)),
        route::<api::analytics::ListHeat>(get(analytics::heat)),
        route::<api::analytics::JobStats>(get(analytics::job_stats)),
        route::<api::analytics::ReportOps>(post(analytics::report)),
        route::<api::analytics::ListCold>(get(analytics::cold)),
        route::<api::analytics::GetFleet>(get(analytics::fleet)),
        route::<api::quotas::SetQuota>(put(quotas::set_quota)),
        route::<api::quotas::ReserveQuota>(post(quotas::reserve)),
        route::<api::quotas::FreeUsage>(post(quotas::free_usage)),
        route::<api::quotas::ShardsDeleted>(post(quotas::deleted)),
        route::<api::quotas::CommitReservation>(post(quotas::commit_reservation)),
        route::<api::quotas::ReleaseReservation>(post(quotas::release_reservation)),
        route::<api::usage::GetUsage>(get(usage::usage)),
        route::<api::usage::ReconcileUsage>(post(usage::reconcile)),
        route::<api::usage::ScanUsage>(post(usage::scan_backend)),
        route::<api::usage::ListPrefixes>(get(usage::list_prefixes)),
        route::<api::usage::SetPrefix>(put(usage::set_prefix)),
        route::<api::lifecycle::ListPolicies>(get(lifecycle::list_policies)),
        route::<api::lifecycle::AddPolicy>(post(lifecycle::add_policy)),
        route::<api::lifecycle::DeletePolicy>(delete(lifecycle::delete_policy)),
        route::<api::lifecycle::ListProtections>(get(lifecycle::list_protections)),
        route::<api::lifecycle::AddProtection>(post(lifecycle::add_protection)),
        route::<api::lifecycle::DeleteProtection>(delete(lifecycle::delete_protection)),
        route::<api::lifecycle::ListPlans>(get(lifecycle::list_plans)),
        route::<api::lifecycle::MakePlan>(post(lifecycle::make_plan)),
        route::<api::lifecycle::GetPlan>(get(lifecycle::get_plan)),
        route::<api::lifecycle::RunPlan>(post(lifecycle::run_plan)),
        route::<api::lifecycle::RestorePlan>(post(lifecycle::restore_plan)),
        route::<api::lifecycle::PurgeTrash>(post(lifecycle::purge)),
        route::<api::admin::Forecasts>(get(forecasts::forecasts)),
        route::<api::admin::Audit>(get(forecasts::audit)),
        route::<api::admin::ListScratch>(get(scratch::list_scratch)),
        route::<api::admin::AllocScratch>(post(scratch::alloc_scratch)),
        route::<api::admin::FreeScratch>(delete(scratch::free_scratch)),
    ]
}
