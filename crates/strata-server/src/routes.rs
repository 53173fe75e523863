//! The one route table of the agent's API: data plane ([`crate::api`]), checkpoint replicas ([`crate::replicas`]),
//! the cluster ([`crate::cluster::routes`]), control ([`crate::control`]) and claims ([`crate::claims`]). Each
//! route is a handler registered for an endpoint type of [`strata_api`], which also writes `/openapi.json`
//! ([`strata_api::openapi`]); a test checks that the table serves every endpoint of the contract and nothing
//! else. Every route but the public ones sits behind [`crate::control::require_token`].

use std::sync::Arc;

use axum::Router;
use axum::routing::get;

use crate::Agent;
use crate::http::{Route, route};

/// Every route of the API, with its documentation.
pub fn table() -> Vec<Route> {
    let mut t = vec![route::<strata_api::data::OpenApi>(get(openapi))];
    t.extend(crate::api::routes());
    t.extend(crate::replicas::routes());
    t.extend(crate::cluster::routes::routes());
    t.extend(crate::control::routes());
    t.extend(crate::claims::routes());
    t
}

/// The agent's API: every route of [`table`], behind the token check.
pub fn router(agent: Arc<Agent>) -> Router {
    let mut r = Router::new();
    for (doc, mr) in table() {
        r = r.route(doc.path, mr);
    }
    // Inside the token check (the caller is known) and around every route: the checkpoint routes'
    // operations recorded for the analytics.
    r.with_state(agent.clone())
        .layer(axum::middleware::from_fn_with_state(
            agent.clone(),
            crate::replicas::record::record,
        ))
        .layer(axum::middleware::from_fn_with_state(
            agent,
            crate::control::require_token,
        ))
}

/// The OpenAPI 3 document of every route.
pub fn openapi_doc() -> serde_json::Value {
    let docs: Vec<_> = table().into_iter().map(|(d, _)| d).collect();
    strata_api::openapi::document(&docs, env!("CARGO_PKG_VERSION"))
}

async fn openapi() -> crate::http::Reply<strata_api::data::OpenApi> {
    crate::http::Reply(strata_api::data::OpenApiDocument(openapi_doc()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_serves_the_contract() {
        let served: Vec<_> = table()
            .into_iter()
            .map(|(d, _)| (d.method, d.path))
            .collect();
        let mut unique = served.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), served.len(), "a route is in the table twice");
        let mut contract: Vec<_> = strata_api::endpoints()
            .into_iter()
            .map(|d| (d.method, d.path))
            .collect();
        contract.sort();
        assert_eq!(
            unique, contract,
            "the table and strata_api::endpoints() differ"
        );
    }
}
