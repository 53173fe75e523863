//! What every room of the control plane uses: the imports, the JSON answer type, the authenticated
//! principal, and the small helpers (parse a body, answer JSON, a 404).

#![allow(unused_imports)]

pub(super) use super::state::{AccessLog, ForecastLine};
pub(super) use crate::Agent;
pub(super) use crate::http::ApiResult;
pub(super) use crate::http::Query;
pub(super) use crate::http::{ApiError, Reply, reply};
pub(super) use axum::body::Bytes;
pub(super) use axum::extract::{Extension, Path as UrlPath, Request, State};
pub(super) use axum::http::header;
pub(super) use axum::middleware::Next;
pub(super) use axum::response::{IntoResponse, Response};
pub(super) use axum::routing::{delete, get, post, put};
pub(super) use parking_lot::Mutex;
pub(super) use serde::de::DeserializeOwned;
pub(super) use serde::{Deserialize, Serialize};
pub(super) use std::collections::{BTreeMap, HashMap};
pub(super) use std::path::Path;
pub(super) use std::sync::Arc;
pub(super) use std::time::Duration;
pub(super) use strata_api as api;
pub(super) use strata_catalog::access::NewPrincipal;
pub(super) use strata_catalog::inventory::UsageBy;
pub(super) use strata_catalog::lifecycle::{Policy, Protection, Scratch};
pub(super) use strata_catalog::quota::{QuotaLimits, TOTAL};
pub(super) use strata_catalog::wire;
pub(super) use strata_catalog::{Catalog, Principal, Role};
pub(super) use strata_quota::cleanup::{self, Caps};
pub(super) use strata_quota::forecast::{self, Forecast, Sample};
pub(super) use strata_types::{Error, ErrorKind, Result};

/// The authenticated principal of a request.
pub(super) type Authed = Extension<Principal>;

/// Parse a JSON body into `T`, as a 400 with the serde message on failure.
pub(super) fn body<T: DeserializeOwned>(b: &Bytes) -> Result<T> {
    serde_json::from_slice(b).map_err(|e| Error::invalid_input(format!("request body: {e}")))
}

pub(super) fn not_found(what: &str, id: &str) -> ApiError {
    ApiError(Error::new(ErrorKind::NotFound, format!("no {what} {id:?}")))
}

/// The configured backend called `name`, or 404.
pub(super) fn configured_backend<'a>(
    a: &'a Agent,
    name: &str,
) -> Result<&'a crate::NamedBackend, ApiError> {
    a.backends()
        .iter()
        .find(|x| x.name == name)
        .ok_or_else(|| not_found("backend", name))
}
