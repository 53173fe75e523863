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
//! Its background work is in [`crate::background`].

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Extension, Path as UrlPath, Query, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use strata_catalog::access::NewPrincipal;
use strata_catalog::inventory::UsageBy;
use strata_catalog::lifecycle::{Policy, Protection, Scratch};
use strata_catalog::quota::{QuotaLimits, TOTAL};
use strata_catalog::{Catalog, Principal, Role};
use strata_quota::cleanup::{self, Caps};
use strata_quota::forecast::{self, Forecast, Sample};
use strata_types::{Error, ErrorKind, Result};

use crate::Agent;
use crate::http::{ApiError, Plane, Route, RouteDoc};

use crate::http::ApiResult;
type Json = axum::Json<serde_json::Value>;

/// Where a generated administrator token is written (where clients look for it too).
pub use strata_client::token::admin_token_file;

/// Make sure the catalog has an administrator: `admin_token` if set (`STRATA_ADMIN_TOKEN`, shared by the
/// agents of a cluster), else a generated token written to `<data_dir>/admin-token` (mode 0600) on first
/// start.
pub async fn bootstrap_admin(
    catalog: &Catalog,
    data_dir: &Path,
    admin_token: Option<&str>,
) -> Result<()> {
    let env = admin_token.filter(|t| !t.is_empty());
    let file = admin_token_file(data_dir);
    match catalog.bootstrap_admin(env).await? {
        Some(token) => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let _ = std::fs::remove_file(&file);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&file)
                .map_err(|e| Error::from_io(e, format!("creating {}", file.display())))?;
            f.write_all(format!("{token}\n").as_bytes())
                .map_err(|e| Error::from_io(e, format!("writing {}", file.display())))?;
            tracing::info!(token_file = %file.display(), "created the administrator; its API token is in the token file");
        }
        None if env.is_none() && file.exists() => {
            tracing::info!(token_file = %file.display(), "administrator token file")
        }
        None => {}
    }
    Ok(())
}

/// Shared state of the control plane inside the agent.
#[derive(Debug, Default)]
pub struct AccessLog {
    reads: Mutex<PendingReads>,
    pub(crate) dropped: std::sync::atomic::AtomicU64,
    forecasts: Mutex<Vec<ForecastLine>>,
    tokens: Mutex<HashMap<String, (std::time::Instant, Principal)>>,
}

/// Last read time of each object read since the last flush, by backend then key (looked up by `&str`: a read
/// of an object already pending allocates nothing).
#[derive(Debug, Default)]
struct PendingReads {
    by_backend: HashMap<String, HashMap<String, i64>>,
    len: usize,
}

/// Most distinct objects whose read times wait for the next flush; more are dropped (and counted).
const MAX_PENDING_READS: usize = 100_000;
/// How long an authenticated token is remembered (revocation takes effect within this).
const TOKEN_CACHE: Duration = Duration::from_secs(5);

impl AccessLog {
    /// Note a read of `key` on the backend named `backend`.
    pub fn record(&self, backend: &str, key: &str, at: i64) {
        let mut r = self.reads.lock();
        if let Some(e) = r.by_backend.get_mut(backend).and_then(|m| m.get_mut(key)) {
            *e = (*e).max(at);
            return;
        }
        if r.len >= MAX_PENDING_READS {
            self.dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return;
        }
        r.len += 1;
        match r.by_backend.get_mut(backend) {
            Some(m) => {
                m.insert(key.to_string(), at);
            }
            None => {
                r.by_backend
                    .insert(backend.to_string(), HashMap::from([(key.to_string(), at)]));
            }
        }
    }

    /// Write pending reads to the catalog.
    pub async fn flush(&self, catalog: &Catalog) -> Result<()> {
        let pending = std::mem::take(&mut *self.reads.lock());
        let by_backend: BTreeMap<String, Vec<(String, i64)>> = pending
            .by_backend
            .into_iter()
            .map(|(b, m)| (b, m.into_iter().collect()))
            .collect();
        for (b, list) in by_backend {
            catalog.touch(&b, &list).await?;
        }
        Ok(())
    }

    /// The latest forecasts.
    pub fn forecasts(&self) -> Vec<ForecastLine> {
        self.forecasts.lock().clone()
    }
}

/// One forecast as served by `/v1/forecast` and exported as metrics.
#[derive(Debug, Clone, Serialize)]
pub struct ForecastLine {
    /// `team` (a team's total against its hard byte limit), `quota` (`team/scope`: one scope's hard limit) or
    /// `volume` (a file system).
    pub kind: String,
    /// Team name or mount path.
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

/// The authenticated principal of a request.
type Authed = Extension<Principal>;

/// Middleware: every request but `/healthz` and `/openapi.json` must carry a valid bearer token.
pub async fn require_token(
    State(agent): State<Arc<Agent>>,
    mut req: Request,
    next: Next,
) -> Response {
    let path = req.uri().path();
    if path == "/healthz" || path == "/openapi.json" {
        return next.run(req).await;
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= 512)
        .map(str::to_string);
    let Some(token) = token else {
        return ApiError(Error::new(
            ErrorKind::Unauthenticated,
            "this route needs `Authorization: Bearer <token>` (see `strata token create`; the administrator's \
             token is in <data-dir>/admin-token or STRATA_ADMIN_TOKEN)",
        ))
        .into_response();
    };
    match authenticate(&agent, &token).await {
        Ok(Some(p)) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Ok(None) => ApiError(Error::new(
            ErrorKind::Unauthenticated,
            "the token is not valid (unknown or revoked)",
        ))
        .into_response(),
        Err(e) => ApiError(e).into_response(),
    }
}

async fn authenticate(agent: &Agent, token: &str) -> Result<Option<Principal>> {
    let key = blake3::hash(token.as_bytes()).to_hex().to_string();
    {
        let cache = agent.access.tokens.lock();
        if let Some((at, p)) = cache.get(&key)
            && at.elapsed() < TOKEN_CACHE
        {
            return Ok(Some(p.clone()));
        }
    }
    let p = agent.catalog().authenticate(token).await?;
    if let Some(p) = &p {
        let mut cache = agent.access.tokens.lock();
        if cache.len() > 10_000 {
            cache.clear();
        }
        cache.insert(key, (std::time::Instant::now(), p.clone()));
    }
    Ok(p)
}

/// Parse a JSON body into `T`, as a 400 with the serde message on failure.
fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T> {
    serde_json::from_slice(b).map_err(|e| Error::invalid_input(format!("request body: {e}")))
}

fn ok<T: Serialize>(v: T) -> ApiResult<Json> {
    serde_json::to_value(v)
        .map(axum::Json)
        .map_err(|e| ApiError(Error::internal(e.to_string())))
}

fn not_found(what: &str, id: &str) -> ApiError {
    ApiError(Error::new(ErrorKind::NotFound, format!("no {what} {id:?}")))
}

/// The configured backend called `name`, or 404.
fn configured_backend<'a>(a: &'a Agent, name: &str) -> Result<&'a crate::NamedBackend, ApiError> {
    a.backends()
        .iter()
        .find(|x| x.name == name)
        .ok_or_else(|| not_found("backend", name))
}

macro_rules! r {
    ($m:literal, $p:literal, $s:literal, $a:literal, $h:expr) => {
        (
            RouteDoc {
                method: $m,
                path: $p,
                summary: $s,
                access: $a,
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
            get(whoami)
        ),
        r!(
            "GET",
            "/v1/teams",
            "Teams the caller can see",
            "any principal (admins see all)",
            get(list_teams)
        ),
        r!(
            "POST",
            "/v1/teams",
            "Create a team: {\"name\"}",
            "admin",
            post(create_team)
        ),
        r!(
            "GET",
            "/v1/teams/{team}",
            "One team",
            "reader of the team",
            get(get_team)
        ),
        r!(
            "DELETE",
            "/v1/teams/{team}",
            "Delete a team that owns nothing",
            "admin",
            delete(delete_team)
        ),
        r!(
            "GET",
            "/v1/teams/{team}/members",
            "Members of a team",
            "reader of the team",
            get(list_members)
        ),
        r!(
            "PUT",
            "/v1/teams/{team}/members/{principal}",
            "Add a member or change its role: {\"role\"}",
            "team_admin of the team",
            put(set_member)
        ),
        r!(
            "DELETE",
            "/v1/teams/{team}/members/{principal}",
            "Remove a member",
            "team_admin of the team",
            delete(remove_member)
        ),
        r!(
            "GET",
            "/v1/tokens",
            "Principals (tokens and S3 keys) of a team: ?team=",
            "team_admin of the team (admins: all)",
            get(list_tokens)
        ),
        r!(
            "POST",
            "/v1/tokens",
            "Create a bearer token or an S3 key pair: {\"name\",\"kind\",\"team\",\"role\",\"admin\"}; the secret is returned once",
            "team_admin of the team (admin for admin principals)",
            post(create_token)
        ),
        r!(
            "DELETE",
            "/v1/tokens/{id}",
            "Revoke a principal's credential",
            "team_admin of its team, or itself",
            delete(revoke_token)
        ),
        r!(
            "GET",
            "/v1/quotas",
            "Quotas and usage counters of the visible teams",
            "any principal",
            get(list_quotas)
        ),
        r!(
            "GET",
            "/v1/quotas/{team}",
            "Quotas and usage counters of a team",
            "reader of the team",
            get(team_quotas)
        ),
        r!(
            "PUT",
            "/v1/quotas/{team}/{scope}",
            "Set a team's limits on a scope (a backend, cache, scratch, peer, ckpt, or * for its total)",
            "admin",
            put(set_quota)
        ),
        r!(
            "POST",
            "/v1/quotas/{team}/{scope}/reserve",
            "Admit a write before its bytes are accepted: {\"bytes\",\"objects\",\"ttl_secs\"}; 429 resource_exhausted over the limit",
            "member of the team",
            post(reserve)
        ),
        r!(
            "POST",
            "/v1/quotas/{team}/{scope}/free",
            "Give usage back after deleting data: {\"bytes\",\"objects\"} (never below zero)",
            "member of the team",
            post(free_usage)
        ),
        r!(
            "POST",
            "/v1/reservations/{id}/commit",
            "Charge an admitted write: {\"bytes\",\"objects\"} actually written",
            "member of its team",
            post(commit_reservation)
        ),
        r!(
            "POST",
            "/v1/reservations/{id}/release",
            "Give an admitted write back",
            "member of its team",
            post(release_reservation)
        ),
        r!(
            "GET",
            "/v1/usage",
            "Usage grouped ?by=team|prefix|job|dataset",
            "any principal (only visible teams)",
            get(usage)
        ),
        r!(
            "POST",
            "/v1/usage/reconcile",
            "List a backend completely and correct the inventory and usage: {\"backend\"}",
            "admin",
            post(reconcile)
        ),
        r!(
            "POST",
            "/v1/usage/scan",
            "Scan a local-directory backend's tree in parallel (like a parallel file system's project quota) and set each team's usage on it from the projects (top-level directories) it owns: {\"backend\",\"threads\"}",
            "admin",
            post(scan_backend)
        ),
        r!(
            "GET",
            "/v1/prefixes",
            "Owned prefixes of the visible teams",
            "any principal",
            get(list_prefixes)
        ),
        r!(
            "PUT",
            "/v1/prefixes",
            "Give a prefix to a team: {\"backend\",\"prefix\",\"team\"}",
            "admin",
            put(set_prefix)
        ),
        r!(
            "GET",
            "/v1/policies",
            "Retention policies of the visible teams",
            "any principal",
            get(list_policies)
        ),
        r!(
            "POST",
            "/v1/policies",
            "Add a retention policy (ttl, stale, keep_last)",
            "team_admin of its team",
            post(add_policy)
        ),
        r!(
            "DELETE",
            "/v1/policies/{id}",
            "Delete a retention policy",
            "team_admin of its team",
            delete(delete_policy)
        ),
        r!(
            "GET",
            "/v1/protections",
            "Pins and claims of the visible teams",
            "any principal",
            get(list_protections)
        ),
        r!(
            "POST",
            "/v1/protections",
            "Pin data, or claim it for a job until an expiry",
            "member of its team",
            post(add_protection)
        ),
        r!(
            "DELETE",
            "/v1/protections/{id}",
            "Remove a pin or claim",
            "member of its team",
            delete(delete_protection)
        ),
        r!(
            "GET",
            "/v1/cleanup/plans",
            "Clean-up plans of the visible teams",
            "any principal",
            get(list_plans)
        ),
        r!(
            "POST",
            "/v1/cleanup/plans",
            "Plan a clean-up (a dry run): {\"team\"}",
            "member of the team (admin for every team)",
            post(make_plan)
        ),
        r!(
            "GET",
            "/v1/cleanup/plans/{id}",
            "A plan and its items",
            "reader of its team",
            get(get_plan)
        ),
        r!(
            "POST",
            "/v1/cleanup/plans/{id}/run",
            "Execute a plan within caps: {\"max_objects\",\"max_bytes\",\"max_team_percent\"}",
            "team_admin of its team",
            post(run_plan)
        ),
        r!(
            "POST",
            "/v1/cleanup/plans/{id}/restore",
            "Restore a plan's trashed items: {\"key_prefix\"}",
            "team_admin of its team",
            post(restore_plan)
        ),
        r!(
            "POST",
            "/v1/cleanup/purge",
            "Delete trash older than the grace period: {\"grace_secs\"}",
            "admin",
            post(purge)
        ),
        r!(
            "GET",
            "/v1/forecast",
            "Days until volumes and team quotas fill, with prediction intervals and alerts",
            "any principal (only visible teams)",
            get(forecasts)
        ),
        r!(
            "GET",
            "/v1/audit",
            "The audit log: ?team=&limit=",
            "reader of the team (admins: all)",
            get(audit)
        ),
        r!(
            "GET",
            "/v1/scratch",
            "Scratch allocations of the visible teams",
            "any principal",
            get(list_scratch)
        ),
        r!(
            "POST",
            "/v1/scratch",
            "Allocate scratch space: {\"team\",\"bytes\",\"ttl_secs\"}; charged to the team's scratch quota",
            "member of the team",
            post(alloc_scratch)
        ),
        r!(
            "DELETE",
            "/v1/scratch/{id}",
            "Release a scratch allocation (its files are deleted)",
            "member of its team",
            delete(free_scratch)
        ),
    ]
}

// ---- teams and principals ----

async fn whoami(Extension(p): Authed) -> ApiResult<Json> {
    ok(p)
}

async fn list_teams(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    let visible = p.visible_teams();
    let teams: Vec<_> = a
        .catalog()
        .list_teams()
        .await?
        .into_iter()
        .filter(|t| visible.as_ref().is_none_or(|v| v.contains(&t.name)))
        .collect();
    ok(teams)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameBody {
    name: String,
}

async fn create_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    p.require_admin()?;
    let req: NameBody = body(&b)?;
    ok(a.catalog().create_team(&p.id, &req.name).await?)
}

async fn get_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require(&team, Role::Reader)?;
    ok(a.catalog().team(&team).await?)
}

async fn delete_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require_admin()?;
    a.catalog().delete_team(&p.id, &team).await?;
    ok(serde_json::json!({"deleted": team}))
}

async fn list_members(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require(&team, Role::Reader)?;
    a.catalog().team(&team).await?;
    ok(a.catalog().list_principals(Some(&team)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RoleBody {
    role: Role,
}

async fn set_member(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, principal)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require(&team, Role::TeamAdmin)?;
    let req: RoleBody = body(&b)?;
    a.catalog()
        .set_membership(&p.id, &team, &principal, req.role)
        .await?;
    ok(serde_json::json!({"team": team, "principal": principal, "role": req.role}))
}

async fn remove_member(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, principal)): UrlPath<(String, String)>,
) -> ApiResult<Json> {
    p.require(&team, Role::TeamAdmin)?;
    a.catalog()
        .remove_membership(&p.id, &team, &principal)
        .await?;
    ok(serde_json::json!({"removed": principal}))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeamQuery {
    team: Option<String>,
    limit: Option<i64>,
}

async fn list_tokens(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<TeamQuery>,
) -> ApiResult<Json> {
    match q.team {
        Some(t) => {
            p.require(&t, Role::TeamAdmin)?;
            ok(a.catalog().list_principals(Some(&t)).await?)
        }
        None if p.is_admin => ok(a.catalog().list_principals(None).await?),
        None => {
            // The principals of every team the caller administers.
            let mut seen = std::collections::BTreeMap::new();
            for m in p.memberships.iter().filter(|m| m.role == Role::TeamAdmin) {
                for x in a.catalog().list_principals(Some(&m.team)).await? {
                    seen.insert(x.id.clone(), x);
                }
            }
            ok(seen.into_values().collect::<Vec<_>>())
        }
    }
}

async fn create_token(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    let req: NewPrincipal = body(&b)?;
    if req.admin {
        p.require_admin()?;
    } else {
        let team = req
            .team
            .as_deref()
            .ok_or_else(|| Error::invalid_input("a token needs a team (or admin: true)"))?;
        p.require(team, Role::TeamAdmin)?;
    }
    ok(a.catalog().create_principal(&p.id, &req).await?)
}

async fn revoke_token(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let target = a
        .catalog()
        .principal(&id)
        .await
        .map_err(|_| not_found("principal", &id))?;
    let allowed = p.id == target.id
        || p.is_admin
        || target
            .team
            .as_deref()
            .is_some_and(|t| p.can(t, Role::TeamAdmin) && !target.is_admin);
    if !allowed {
        return Err(not_found("principal", &id));
    }
    a.catalog().revoke_principal(&p.id, &id).await?;
    a.access.tokens.lock().clear();
    ok(serde_json::json!({"revoked": id}))
}

// ---- quotas ----

async fn list_quotas(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    ok(a.catalog()
        .list_quotas(p.visible_teams().as_deref())
        .await?)
}

async fn team_quotas(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require(&team, Role::Reader)?;
    a.catalog().team(&team).await?;
    ok(a.catalog().list_quotas(Some(&[team])).await?)
}

async fn set_quota(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require_admin()?;
    let limits: QuotaLimits = body(&b)?;
    ok(a.catalog().set_quota(&p.id, &team, &scope, &limits).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    bytes: i64,
    #[serde(default)]
    objects: i64,
    ttl_secs: Option<i64>,
}

async fn reserve(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require(&team, Role::Member)?;
    let req: ReserveBody = body(&b)?;
    a.catalog().team(&team).await?;
    let ttl = req
        .ttl_secs
        .unwrap_or(a.config().catalog.reservation_ttl_secs)
        .clamp(1, 7 * 86_400);
    ok(a.catalog()
        .reserve(&team, &scope, req.bytes, req.objects, ttl)
        .await?)
}

async fn free_usage(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require(&team, Role::Member)?;
    let req: ChargeBody = body(&b)?;
    a.catalog().team(&team).await?;
    a.catalog()
        .free_usage(&team, &scope, req.bytes, req.objects)
        .await?;
    ok(a.catalog().quota(&team, &scope).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChargeBody {
    bytes: i64,
    #[serde(default)]
    objects: i64,
}

async fn visible_reservation(
    a: &Agent,
    p: &Principal,
    id: &str,
) -> ApiResult<strata_catalog::quota::Reservation> {
    let r = a
        .catalog()
        .reservation(id)
        .await
        .map_err(|_| not_found("reservation", id))?;
    if !p.can(&r.team, Role::Member) {
        return Err(not_found("reservation", id));
    }
    Ok(r)
}

async fn commit_reservation(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Json> {
    let r = visible_reservation(&a, &p, &id).await?;
    let req: ChargeBody = body(&b)?;
    if req.bytes > r.bytes || req.objects > r.objects || req.bytes < 0 || req.objects < 0 {
        return Err(ApiError(Error::invalid_input(format!(
            "charge between 0 and what was reserved ({} bytes, {} objects)",
            r.bytes, r.objects
        ))));
    }
    a.catalog()
        .commit_reservation(&r, req.bytes, req.objects)
        .await?;
    ok(serde_json::json!({"committed": id}))
}

async fn release_reservation(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let r = visible_reservation(&a, &p, &id).await?;
    a.catalog().release_reservation(&r).await?;
    ok(serde_json::json!({"released": id}))
}

// ---- usage ----

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    by: Option<String>,
}

async fn usage(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<UsageQuery>,
) -> ApiResult<Json> {
    let by = UsageBy::parse(q.by.as_deref().unwrap_or("team"))?;
    ok(a.catalog().usage(by, p.visible_teams().as_deref()).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackendBody {
    backend: String,
}

async fn reconcile(State(a): State<Arc<Agent>>, Extension(p): Authed, b: Bytes) -> ApiResult<Json> {
    p.require_admin()?;
    let req: BackendBody = body(&b)?;
    let backend = &configured_backend(&a, &req.backend)?.backend;
    let run = strata_quota::reconcile::reconcile(a.catalog(), &req.backend, backend, 16).await?;
    a.catalog()
        .audit(
            &p.id,
            None,
            "usage.reconcile",
            &req.backend,
            serde_json::json!({"added": run.report.added, "updated": run.report.updated, "removed": run.report.removed}),
        )
        .await?;
    ok(run)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScanBody {
    backend: String,
    #[serde(default)]
    threads: usize,
}

async fn scan_backend(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    p.require_admin()?;
    let req: ScanBody = body(&b)?;
    let nb = configured_backend(&a, &req.backend)?;
    let Some(root) = nb.url.strip_prefix("file://").map(std::path::PathBuf::from) else {
        return Err(ApiError(Error::invalid_input(format!(
            "backend {:?} is not a local directory (file://); use /v1/usage/reconcile",
            req.backend
        ))));
    };
    let opts = strata_quota::scan::ScanOptions {
        threads: req.threads.min(256),
        one_file_system: true,
        project_depth: 1,
    };
    let started = std::time::Instant::now();
    let report = tokio::task::spawn_blocking(move || strata_quota::scan::scan(&root, &opts))
        .await
        .map_err(|e| ApiError(Error::internal(format!("scan task: {e}"))))??;
    let secs = started.elapsed().as_secs_f64();
    // Projects -> owning teams (a project `p` is the prefix `p/`); the trash is not data.
    let prefixes = a.catalog().list_prefixes().await?;
    let mut teams: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (project, t) in &report.by_project {
        if project == ".strata-trash" {
            continue;
        }
        if let Some(team) =
            strata_catalog::inventory::owner_in(&prefixes, &req.backend, &format!("{project}/"))
        {
            let e = teams.entry(team).or_default();
            e.0 += t.file_bytes as i64;
            e.1 += t.files as i64;
        }
    }
    for q in a.catalog().list_quotas(None).await? {
        if q.scope == req.backend && !teams.contains_key(&q.team) {
            teams.insert(q.team.clone(), (0, 0));
        }
    }
    for (team, (bytes, files)) in &teams {
        a.catalog()
            .set_usage(team, &req.backend, *bytes, *files)
            .await?;
    }
    a.catalog()
        .audit(
            &p.id,
            None,
            "usage.scan",
            &req.backend,
            serde_json::json!({"files": report.total.files, "bytes": report.total.file_bytes, "secs": secs}),
        )
        .await?;
    ok(
        serde_json::json!({"backend": req.backend, "secs": secs, "total": report.total,
                          "teams": teams, "errors_total": report.errors_total}),
    )
}

async fn list_prefixes(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    let visible = p.visible_teams();
    let v: Vec<_> = a
        .catalog()
        .list_prefixes()
        .await?
        .into_iter()
        .filter(|x| visible.as_ref().is_none_or(|v| v.contains(&x.team)))
        .collect();
    ok(v)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PrefixBody {
    backend: String,
    prefix: String,
    team: String,
}

async fn set_prefix(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    p.require_admin()?;
    let req: PrefixBody = body(&b)?;
    configured_backend(&a, &req.backend)?;
    ok(a.catalog()
        .set_prefix_owner(&p.id, &req.backend, &req.prefix, &req.team)
        .await?)
}

// ---- lifecycle ----

async fn list_policies(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    ok(a.catalog()
        .list_policies(p.visible_teams().as_deref())
        .await?)
}

async fn add_policy(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    let pol: Policy = body(&b)?;
    p.require(&pol.team, Role::TeamAdmin)?;
    configured_backend(&a, &pol.backend)?;
    ok(a.catalog().add_policy(&p.id, pol).await?)
}

async fn delete_policy(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let pol = a
        .catalog()
        .policy(&id)
        .await
        .map_err(|_| not_found("policy", &id))?;
    if !p.can(&pol.team, Role::TeamAdmin) {
        return Err(not_found("policy", &id));
    }
    a.catalog().delete_policy(&p.id, &id).await?;
    ok(serde_json::json!({"deleted": id}))
}

async fn list_protections(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    ok(a.catalog()
        .list_protections(p.visible_teams().as_deref())
        .await?)
}

async fn add_protection(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    let prot: Protection = body(&b)?;
    p.require(&prot.team, Role::Member)?;
    ok(a.catalog().add_protection(&p.id, prot).await?)
}

async fn delete_protection(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let visible = a
        .catalog()
        .list_protections(p.visible_teams().as_deref())
        .await?
        .into_iter()
        .find(|x| x.id == id)
        .ok_or_else(|| not_found("pin or claim", &id))?;
    if !p.can(&visible.team, Role::Member) {
        return Err(not_found("pin or claim", &id));
    }
    a.catalog().delete_protection(&p.id, &id).await?;
    ok(serde_json::json!({"deleted": id}))
}

async fn list_plans(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    ok(a.catalog().list_plans(p.visible_teams().as_deref()).await?)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PlanBody {
    team: Option<String>,
}

async fn make_plan(State(a): State<Arc<Agent>>, Extension(p): Authed, b: Bytes) -> ApiResult<Json> {
    let req: PlanBody = if b.is_empty() {
        PlanBody::default()
    } else {
        body(&b)?
    };
    match &req.team {
        Some(t) => {
            p.require(t, Role::Member)?;
            a.catalog().team(t).await?;
        }
        None => p.require_admin()?,
    }
    ok(cleanup::plan(a.catalog(), &a.backend_map(), &p.id, req.team.as_deref()).await?)
}

async fn visible_plan(
    a: &Agent,
    p: &Principal,
    id: &str,
    need: Role,
) -> ApiResult<strata_catalog::lifecycle::Plan> {
    let plan = a
        .catalog()
        .plan(id)
        .await
        .map_err(|_| not_found("clean-up plan", id))?;
    let allowed = match &plan.team {
        Some(t) => p.can(t, need),
        None => p.is_admin,
    };
    if !allowed {
        return Err(not_found("clean-up plan", id));
    }
    Ok(plan)
}

async fn get_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let plan = visible_plan(&a, &p, &id, Role::Reader).await?;
    let items = a.catalog().plan_items(&id).await?;
    ok(serde_json::json!({"plan": plan, "items": items}))
}

async fn run_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Json> {
    visible_plan(&a, &p, &id, Role::TeamAdmin).await?;
    let caps: Caps = if b.is_empty() {
        Caps::default()
    } else {
        body(&b)?
    };
    if caps
        .max_team_percent
        .is_some_and(|x| !(0.0..=100.0).contains(&x))
    {
        return Err(ApiError(Error::invalid_input(
            "max_team_percent must be between 0 and 100",
        )));
    }
    ok(cleanup::run(a.catalog(), &a.backend_map(), &p.id, &id, &caps).await?)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RestoreBody {
    key_prefix: Option<String>,
}

async fn restore_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Json> {
    visible_plan(&a, &p, &id, Role::TeamAdmin).await?;
    let req: RestoreBody = if b.is_empty() {
        RestoreBody::default()
    } else {
        body(&b)?
    };
    let (restored, refused) = cleanup::restore(
        a.catalog(),
        &a.backend_map(),
        &p.id,
        &id,
        req.key_prefix.as_deref(),
    )
    .await?;
    ok(serde_json::json!({"restored": restored, "refused": refused}))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    grace_secs: Option<i64>,
}

async fn purge(State(a): State<Arc<Agent>>, Extension(p): Authed, b: Bytes) -> ApiResult<Json> {
    p.require_admin()?;
    let req: PurgeBody = if b.is_empty() {
        PurgeBody::default()
    } else {
        body(&b)?
    };
    let grace = req
        .grace_secs
        .unwrap_or(a.config().catalog.trash_grace_secs);
    let (n, bytes) = cleanup::purge(a.catalog(), &a.backend_map(), &p.id, grace).await?;
    ok(serde_json::json!({"purged": n, "bytes": bytes}))
}

// ---- forecasts, audit ----

async fn forecasts(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    let lines = compute_forecasts(&a).await?;
    let visible = p.visible_teams();
    let v: Vec<_> = lines
        .into_iter()
        .filter(|l| {
            let team = l.scope.split('/').next().unwrap_or_default().to_string();
            l.kind == "volume" || visible.as_ref().is_none_or(|v| v.contains(&team))
        })
        .collect();
    ok(v)
}

/// Forecast every sampled series (teams' totals against their hard byte limits, volumes against their size).
pub async fn compute_forecasts(a: &Agent) -> Result<Vec<ForecastLine>> {
    let c = &a.config().catalog;
    let now = a.catalog().now();
    let since = now - (c.forecast_window_days as i64) * 86_400;
    let mut out = Vec::new();
    for (kind, scope) in a.catalog().sample_series().await? {
        let samples = a.catalog().samples(&kind, &scope, since).await?;
        let Some(last) = samples.last().copied() else {
            continue;
        };
        let capacity = match kind.as_str() {
            "team" => a.catalog().quota(&scope, TOTAL).await?.limits.hard_bytes,
            "quota" => match scope.split_once('/') {
                Some((t, sc)) => a.catalog().quota(t, sc).await?.limits.hard_bytes,
                None => None,
            },
            _ => last.capacity,
        };
        let mut line = ForecastLine {
            kind: kind.clone(),
            scope: scope.clone(),
            used: last.used,
            capacity,
            forecast: None,
            note: None,
            alert: false,
        };
        match capacity {
            None => line.note = Some("no hard limit: nothing to fill".into()),
            Some(cap) => {
                let pts: Vec<Sample> = samples
                    .iter()
                    .map(|s| Sample {
                        at: s.at,
                        used: s.used as f64,
                    })
                    .collect();
                match forecast::forecast(&pts, cap as f64, now, 0.95) {
                    Ok(f) => {
                        line.alert = f.days_low.is_some_and(|d| d <= c.forecast_alert_days);
                        line.forecast = Some(f);
                    }
                    Err(e) => line.note = Some(e.message().to_string()),
                }
            }
        }
        out.push(line);
    }
    *a.access.forecasts.lock() = out.clone();
    Ok(out)
}

async fn audit(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<TeamQuery>,
) -> ApiResult<Json> {
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    match q.team {
        Some(t) => {
            p.require(&t, Role::Reader)?;
            ok(a.catalog().list_audit(Some(&[t]), limit).await?)
        }
        None if p.is_admin => ok(a.catalog().list_audit(None, limit).await?),
        None => ok(a
            .catalog()
            .list_audit(p.visible_teams().as_deref(), limit)
            .await?),
    }
}

// ---- scratch ----

fn scratch_dir(a: &Agent) -> std::path::PathBuf {
    a.config().data_dir.join("scratch")
}

async fn list_scratch(State(a): State<Arc<Agent>>, Extension(p): Authed) -> ApiResult<Json> {
    ok(a.catalog()
        .list_scratch(p.visible_teams().as_deref())
        .await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScratchBody {
    team: String,
    bytes: i64,
    ttl_secs: i64,
}

async fn alloc_scratch(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    let req: ScratchBody = body(&b)?;
    p.require(&req.team, Role::Member)?;
    if req.bytes <= 0 || req.ttl_secs <= 0 || req.ttl_secs > 90 * 86_400 {
        return Err(ApiError(Error::invalid_input(
            "scratch needs bytes > 0 and 0 < ttl_secs <= 90 days",
        )));
    }
    a.catalog().team(&req.team).await?;
    let cat = a.catalog();
    // Quota before bytes: the allocation is admitted, then charged in full.
    let res = cat.reserve(&req.team, "scratch", req.bytes, 1, 600).await?;
    let now = cat.now();
    let id = format!("scr_{now}_{:08x}", rand::random::<u32>());
    let path = scratch_dir(&a).join(&id);
    if let Err(e) = std::fs::create_dir_all(&path) {
        cat.release_reservation(&res).await?;
        return Err(ApiError(Error::from_io(
            e,
            format!("creating {}", path.display()),
        )));
    }
    cat.commit_reservation(&res, req.bytes, 1).await?;
    let s = Scratch {
        id: id.clone(),
        team: req.team.clone(),
        bytes: req.bytes,
        path: path.display().to_string(),
        expires_at: now + req.ttl_secs,
        created_at: now,
        released_at: None,
    };
    cat.insert_scratch(&s).await?;
    cat.audit(
        &p.id,
        Some(&req.team),
        "scratch.alloc",
        &id,
        serde_json::json!({"bytes": req.bytes, "ttl_secs": req.ttl_secs}),
    )
    .await?;
    ok(s)
}

async fn free_scratch(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let s = a
        .catalog()
        .list_scratch(p.visible_teams().as_deref())
        .await?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| not_found("scratch allocation", &id))?;
    p.require(&s.team, Role::Member)?;
    release_scratch(&a, &s, &p.id, false).await?;
    ok(serde_json::json!({"released": id}))
}

/// Release a scratch allocation: its directory is deleted (or, on expiry, moved to the scratch trash) and its
/// bytes are given back to the team's quota.
pub(crate) async fn release_scratch(
    a: &Agent,
    s: &Scratch,
    actor: &str,
    expired: bool,
) -> Result<()> {
    let dir = std::path::PathBuf::from(&s.path);
    if dir.starts_with(scratch_dir(a)) && dir.exists() {
        if expired {
            let trash = a.config().data_dir.join("scratch-trash");
            std::fs::create_dir_all(&trash)
                .map_err(|e| Error::from_io(e, format!("creating {}", trash.display())))?;
            std::fs::rename(&dir, trash.join(&s.id))
                .map_err(|e| Error::from_io(e, format!("moving {} to the trash", dir.display())))?;
        } else {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::from_io(e, format!("deleting {}", dir.display())))?;
        }
    }
    if a.catalog().release_scratch(&s.id).await? {
        a.catalog()
            .adjust_usage(&s.team, "scratch", -s.bytes, -1)
            .await?;
        a.catalog()
            .audit(
                actor,
                Some(&s.team),
                if expired {
                    "scratch.expire"
                } else {
                    "scratch.release"
                },
                &s.id,
                serde_json::json!({"bytes": s.bytes}),
            )
            .await?;
    }
    Ok(())
}
