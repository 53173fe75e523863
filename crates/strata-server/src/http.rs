//! HTTP plumbing shared by every handler of the agent's API: the error answer ([`ApiError`], one status per
//! kind and the JSON body of [`strata_client::wire`]), the I/O context a request names in its headers, and the
//! documentation record of a route ([`RouteDoc`]) that [`crate::routes`] builds the router and
//! `/openapi.json` from. It knows no handler.

use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use strata_types::{Error, ErrorKind, IoContext};

use crate::Agent;

/// An error answered as JSON with a status that follows its kind.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        Self(e)
    }
}

/// A handler's result.
pub type ApiResult<T> = std::result::Result<T, ApiError>;

/// The HTTP status for an error kind ([`strata_client::wire::status_of`], the table clients read back).
pub fn status_of(kind: ErrorKind) -> StatusCode {
    StatusCode::from_u16(strata_client::wire::status_of(kind))
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = status_of(self.0.kind());
        if status.is_server_error() {
            tracing::warn!(error = %self.0, "request failed");
        }
        (status, Json(strata_client::wire::ErrorBody::of(&self.0))).into_response()
    }
}

/// The I/O context a request names: the job from the `x-strata-job` header, the team from `x-strata-team`
/// (values of at most 256 bytes; others are ignored).
/// [`io_context`] of a request made by `principal`: the read is for that principal (an agent asked for one of
/// its blocks decides access for it).
///
/// The team is the one `x-strata-team` names if the principal reads there, else the principal's home team: no
/// caller has its I/O counted as another team's (nor another team's job's, which is counted by team).
pub fn principal_context(headers: &HeaderMap, principal: &strata_catalog::Principal) -> IoContext {
    let mut ctx = io_context(headers);
    ctx.principal = Some(Arc::from(principal.id.as_str()));
    let named = ctx
        .team
        .take()
        .filter(|t| principal.can(t, strata_catalog::Role::Reader));
    ctx.team = named.or_else(|| principal.team.as_deref().map(Arc::from));
    ctx
}

pub fn io_context(headers: &HeaderMap) -> IoContext {
    let h = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 256)
            .map(Arc::from)
    };
    IoContext {
        principal: None,
        team: h("x-strata-team"),
        job: h("x-strata-job"),
        dataset: h("x-strata-dataset"),
    }
}

/// Which part of the API a route belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// Answered without a token (`/healthz`, `/openapi.json`).
    Public,
    /// Data plane: reads, prefetches, cache state and pins, metrics.
    Data,
    /// Checkpoint replicas and handed-over saves, from other agents and training processes.
    Peer,
    /// Teams, tokens, quotas, usage, lifecycle: every route names team data.
    Control,
}

/// Who may call a route, as a rule the handlers enforce and the tenancy tests check: the structured form of
/// [`RouteDoc::access`], published in `/openapi.json` as `x-strata-access`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone, without a token.
    Public,
    /// Any principal; what it lists is only what it may see.
    Any,
    /// Global administrators.
    Admin,
    /// The role in the team the request names (`{team}`, or the body's or query's `team`).
    Team(strata_catalog::Role),
    /// The role in the team that owns the resource the request names (`{id}`, `{principal}`, a pin); to
    /// others the resource does not exist (404).
    Owner(strata_catalog::Role),
    /// The role in the team owning the location the request names (prefix ownership, [`crate::access`]).
    Location(strata_catalog::Role),
    /// The role in the caller's own team, whose resources (replicas, handed-over saves) are the only ones it
    /// names.
    OwnTeam(strata_catalog::Role),
    /// Other agents of the cluster only, with the cluster credential; no token, not even an administrator's.
    Cluster,
}

impl Access {
    /// The rule as JSON (`{"rule": "team", "role": "member"}`).
    pub fn to_json(self) -> serde_json::Value {
        let (rule, role) = match self {
            Access::Public => ("public", None),
            Access::Any => ("any", None),
            Access::Admin => ("admin", None),
            Access::Team(r) => ("team", Some(r)),
            Access::Owner(r) => ("owner", Some(r)),
            Access::Location(r) => ("location", Some(r)),
            Access::OwnTeam(r) => ("own_team", Some(r)),
            Access::Cluster => ("cluster", None),
        };
        match role {
            Some(r) => serde_json::json!({"rule": rule, "role": r.as_str()}),
            None => serde_json::json!({"rule": rule}),
        }
    }
}

/// Documentation of one route, the source of `/openapi.json`.
#[derive(Debug, Clone, Copy)]
pub struct RouteDoc {
    /// HTTP method.
    pub method: &'static str,
    /// Path, with `{param}` segments.
    pub path: &'static str,
    /// What it does.
    pub summary: &'static str,
    /// Who may call it, in words.
    pub access: &'static str,
    /// Who may call it, as a rule.
    pub rule: Access,
    /// The part of the API it belongs to.
    pub plane: Plane,
}

impl RouteDoc {
    /// The route's method.
    pub fn method(&self) -> Method {
        Method::from_bytes(self.method.as_bytes()).unwrap_or(Method::GET)
    }
}

/// A route: its documentation and its handler.
pub type Route = (RouteDoc, MethodRouter<Arc<Agent>>);
