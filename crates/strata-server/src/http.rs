//! HTTP plumbing shared by every handler of the agent's API: the error answer ([`ApiError`], one status per
//! kind and the JSON body of [`strata_client::wire`]), the I/O context a request names in its headers, and the
//! route of an endpoint of [`strata_api`] ([`route`]) that [`crate::routes`] builds the router from. It knows no handler.

use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderMap, StatusCode};
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

pub use strata_api::{Access, EndpointDoc, Plane};

/// A route: its endpoint (method, path, access, types; [`strata_api`]) and its handler.
pub type Route = (EndpointDoc, MethodRouter<Arc<Agent>>);

/// The route of endpoint `E`, answered by `handler`.
pub fn route<E: strata_api::Endpoint>(handler: MethodRouter<Arc<Agent>>) -> Route {
    (EndpointDoc::of::<E>(), handler)
}

/// The answer of endpoint `E`: its typed JSON ([`strata_api::Endpoint::Response`]) with its success status.
/// A handler that answers `ApiResult<Reply<E>>` cannot answer anything but what the contract says.
pub struct Reply<E: strata_api::Endpoint>(pub <E::Response as strata_api::Payload>::Value);

impl<E: strata_api::Endpoint> std::fmt::Debug for Reply<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reply<{}>", std::any::type_name::<E>())
    }
}

impl<E: strata_api::Endpoint> IntoResponse for Reply<E> {
    /// The answer encoded as its payload says (JSON, text, ...), with that media type: a text answer is the
    /// text, not a JSON string of it.
    fn into_response(self) -> Response {
        use strata_api::Payload;
        let status = StatusCode::from_u16(E::STATUS).unwrap_or(StatusCode::OK);
        match <E::Response as Payload>::encode(&self.0) {
            Ok(Some(body)) => {
                let media = <E::Response as Payload>::MEDIA
                    .map_or("application/json", |m| m.content_type());
                (status, [(axum::http::header::CONTENT_TYPE, media)], body).into_response()
            }
            Ok(None) => status.into_response(),
            Err(e) => ApiError(e).into_response(),
        }
    }
}

/// `Ok(Reply(v))`: the typed answer of `E`.
pub fn reply<E: strata_api::Endpoint>(
    v: <E::Response as strata_api::Payload>::Value,
) -> ApiResult<Reply<E>> {
    Ok(Reply(v))
}

/// Query parameters of type `T`, refused as an [`ApiError`] (`invalid_input`, the JSON error body) rather than
/// axum's plain-text rejection.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> axum::extract::FromRequestParts<S>
    for Query<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| Query(q.0))
            .map_err(|e| ApiError(Error::invalid_input(format!("query: {}", e.body_text()))))
    }
}
