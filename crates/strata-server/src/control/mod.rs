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

use crate::http::{Access, Plane, Route, RouteDoc};
use strata_catalog::Role;

pub use auth::{bootstrap_admin, require_token};
pub use forecasts::compute_forecasts;
pub(crate) use scratch::{allocate_scratch, release_scratch, scratch_path};
pub use state::{AccessLog, ForecastLine};
/// Where a generated administrator token is written (where clients look for it too).
pub use strata_client::token::admin_token_file;

macro_rules! r {
    ($m:literal, $p:literal, $s:literal, $a:literal, $rule:expr, $h:expr) => {
        (
            RouteDoc {
                method: $m,
                path: $p,
                summary: $s,
                access: $a,
                rule: $rule,
                plane: Plane::Control,
            },
            $h,
        )
    };
}

/// Every control-plane route, with its documentation.
pub fn routes() -> Vec<Route> {
    vec![
        r!(
            "GET",
            "/v1/whoami",
            "The calling principal and its memberships",
            "any principal",
            Access::Any,
            get(teams::whoami)
        ),
        r!(
            "GET",
            "/v1/teams",
            "Teams the caller can see",
            "any principal (admins see all)",
            Access::Any,
            get(teams::list_teams)
        ),
        r!(
            "POST",
            "/v1/teams",
            "Create a team: {\"name\"}",
            "admin",
            Access::Admin,
            post(teams::create_team)
        ),
        r!(
            "GET",
            "/v1/teams/{team}",
            "One team",
            "reader of the team",
            Access::Team(Role::Reader),
            get(teams::get_team)
        ),
        r!(
            "DELETE",
            "/v1/teams/{team}",
            "Delete a team that owns nothing",
            "admin",
            Access::Admin,
            delete(teams::delete_team)
        ),
        r!(
            "GET",
            "/v1/teams/{team}/members",
            "Members of a team",
            "reader of the team",
            Access::Team(Role::Reader),
            get(teams::list_members)
        ),
        r!(
            "PUT",
            "/v1/teams/{team}/members/{principal}",
            "Add a member or change its role: {\"role\"}",
            "team_admin of the team",
            Access::Team(Role::TeamAdmin),
            put(teams::set_member)
        ),
        r!(
            "DELETE",
            "/v1/teams/{team}/members/{principal}",
            "Remove a member",
            "team_admin of the team",
            Access::Team(Role::TeamAdmin),
            delete(teams::remove_member)
        ),
        r!(
            "GET",
            "/v1/tokens",
            "Principals (tokens and S3 keys) of a team: ?team=",
            "team_admin of the team (admins: all)",
            Access::Team(Role::TeamAdmin),
            get(teams::list_tokens)
        ),
        r!(
            "POST",
            "/v1/tokens",
            "Create a bearer token or an S3 key pair: {\"name\",\"kind\",\"team\",\"role\",\"admin\"}; the secret is returned once",
            "team_admin of the team (admin for admin principals)",
            Access::Team(Role::TeamAdmin),
            post(teams::create_token)
        ),
        r!(
            "DELETE",
            "/v1/tokens/{id}",
            "Revoke a principal's credential",
            "team_admin of its team, or itself",
            Access::Owner(Role::TeamAdmin),
            delete(teams::revoke_token)
        ),
        r!(
            "GET",
            "/v1/quotas",
            "Quotas and usage counters of the visible teams",
            "any principal",
            Access::Any,
            get(quotas::list_quotas)
        ),
        r!(
            "GET",
            "/v1/quotas/{team}",
            "Quotas and usage counters of a team",
            "reader of the team",
            Access::Team(Role::Reader),
            get(quotas::team_quotas)
        ),
        r!(
            "PUT",
            "/v1/quotas/{team}/{scope}",
            "Set a team's limits on a scope (a backend, a created bucket, bucket_root for every bucket the team created together, cache, scratch, peer, ckpt, or * for its total)",
            "admin",
            Access::Admin,
            put(quotas::set_quota)
        ),
        r!(
            "POST",
            "/v1/quotas/{team}/{scope}/reserve",
            "Admit a write before its bytes are accepted: {\"bytes\",\"objects\",\"ttl_secs\"}; 429 resource_exhausted over the limit",
            "member of the team",
            Access::Team(Role::Member),
            post(quotas::reserve)
        ),
        r!(
            "POST",
            "/v1/quotas/{team}/{scope}/free",
            "Correct usage counters by hand: {\"bytes\",\"objects\"} given back (never below zero)",
            "admin",
            Access::Admin,
            post(quotas::free_usage)
        ),
        r!(
            "POST",
            "/v1/quotas/{team}/{scope}/deleted",
            "Checkpoint shards deleted from a local tier (scope ckpt): {\"prefix\"}; gives back exactly what was charged for them",
            "member of the team",
            Access::Team(Role::Member),
            post(quotas::deleted)
        ),
        r!(
            "POST",
            "/v1/reservations/{id}/commit",
            "Charge an admitted write: {\"bytes\",\"objects\"} actually written; on scope ckpt {\"key\"} records the shard",
            "member of its team",
            Access::Owner(Role::Member),
            post(quotas::commit_reservation)
        ),
        r!(
            "POST",
            "/v1/reservations/{id}/release",
            "Give an admitted write back",
            "member of its team",
            Access::Owner(Role::Member),
            post(quotas::release_reservation)
        ),
        r!(
            "GET",
            "/v1/usage",
            "Usage grouped ?by=team|prefix|job|dataset",
            "any principal (only visible teams)",
            Access::Any,
            get(usage::usage)
        ),
        r!(
            "POST",
            "/v1/usage/reconcile",
            "List a backend completely and correct the inventory and usage: {\"backend\"}",
            "admin",
            Access::Admin,
            post(usage::reconcile)
        ),
        r!(
            "POST",
            "/v1/usage/scan",
            "Scan a local-directory backend's tree in parallel (like a parallel file system's project quota) and set each team's usage on it from the projects (top-level directories) it owns: {\"backend\",\"threads\"}",
            "admin",
            Access::Admin,
            post(usage::scan_backend)
        ),
        r!(
            "GET",
            "/v1/prefixes",
            "Owned prefixes of the visible teams",
            "any principal",
            Access::Any,
            get(usage::list_prefixes)
        ),
        r!(
            "PUT",
            "/v1/prefixes",
            "Give a prefix to a team: {\"backend\",\"prefix\",\"team\"}",
            "admin",
            Access::Admin,
            put(usage::set_prefix)
        ),
        r!(
            "GET",
            "/v1/policies",
            "Retention policies of the visible teams",
            "any principal",
            Access::Any,
            get(lifecycle::list_policies)
        ),
        r!(
            "POST",
            "/v1/policies",
            "Add a retention policy (ttl, stale, keep_last)",
            "team_admin of its team",
            Access::Team(Role::TeamAdmin),
            post(lifecycle::add_policy)
        ),
        r!(
            "DELETE",
            "/v1/policies/{id}",
            "Delete a retention policy",
            "team_admin of its team",
            Access::Owner(Role::TeamAdmin),
            delete(lifecycle::delete_policy)
        ),
        r!(
            "GET",
            "/v1/protections",
            "Pins and claims of the visible teams",
            "any principal",
            Access::Any,
            get(lifecycle::list_protections)
        ),
        r!(
            "POST",
            "/v1/protections",
            "Pin data, or claim it for a job until an expiry",
            "member of its team",
            Access::Team(Role::Member),
            post(lifecycle::add_protection)
        ),
        r!(
            "DELETE",
            "/v1/protections/{id}",
            "Remove a pin or claim",
            "member of its team",
            Access::Owner(Role::Member),
            delete(lifecycle::delete_protection)
        ),
        r!(
            "GET",
            "/v1/cleanup/plans",
            "Clean-up plans of the visible teams",
            "any principal",
            Access::Any,
            get(lifecycle::list_plans)
        ),
        r!(
            "POST",
            "/v1/cleanup/plans",
            "Plan a clean-up (a dry run): {\"team\"}",
            "member of the team (admin for every team)",
            Access::Team(Role::Member),
            post(lifecycle::make_plan)
        ),
        r!(
            "GET",
            "/v1/cleanup/plans/{id}",
            "A plan and its items",
            "reader of its team",
            Access::Owner(Role::Reader),
            get(lifecycle::get_plan)
        ),
        r!(
            "POST",
            "/v1/cleanup/plans/{id}/run",
            "Execute a plan within caps: {\"max_objects\",\"max_bytes\",\"max_team_percent\"}",
            "team_admin of its team",
            Access::Owner(Role::TeamAdmin),
            post(lifecycle::run_plan)
        ),
        r!(
            "POST",
            "/v1/cleanup/plans/{id}/restore",
            "Restore a plan's trashed items: {\"key_prefix\"}",
            "team_admin of its team",
            Access::Owner(Role::TeamAdmin),
            post(lifecycle::restore_plan)
        ),
        r!(
            "POST",
            "/v1/cleanup/purge",
            "Delete trash older than the grace period: {\"grace_secs\"}",
            "admin",
            Access::Admin,
            post(lifecycle::purge)
        ),
        r!(
            "GET",
            "/v1/forecast",
            "Days until volumes and team quotas fill, with prediction intervals and alerts",
            "any principal (only visible teams)",
            Access::Any,
            get(forecasts::forecasts)
        ),
        r!(
            "GET",
            "/v1/audit",
            "The audit log: ?team=&limit=",
            "reader of the team (admins: all)",
            Access::Team(Role::Reader),
            get(forecasts::audit)
        ),
        r!(
            "GET",
            "/v1/scratch",
            "Scratch allocations of the visible teams",
            "any principal",
            Access::Any,
            get(scratch::list_scratch)
        ),
        r!(
            "POST",
            "/v1/scratch",
            "Allocate scratch space: {\"team\",\"bytes\",\"ttl_secs\"}; charged to the team's scratch quota",
            "member of the team",
            Access::Team(Role::Member),
            post(scratch::alloc_scratch)
        ),
        r!(
            "DELETE",
            "/v1/scratch/{id}",
            "Release a scratch allocation (its files are deleted)",
            "member of its team",
            Access::Owner(Role::Member),
            delete(scratch::free_scratch)
        ),
    ]
}
