//! The one route table of the agent's API: data plane ([`crate::api`]), peer ([`crate::peer`]) and control
//! ([`crate::control`]) routes with their documentation. It builds both the router and `/openapi.json`, so
//! no list of routes is kept by hand anywhere else; every route but the public ones sits behind
//! [`crate::control::require_token`].

use std::sync::Arc;

use axum::Router;
use axum::routing::get;

use crate::Agent;
use crate::http::{Access, Plane, Route, RouteDoc};

/// Every route of the API, with its documentation.
pub fn table() -> Vec<Route> {
    let mut t = vec![(
        RouteDoc {
            method: "GET",
            path: "/openapi.json",
            summary: "This document",
            access: "anyone",
            rule: Access::Public,
            plane: Plane::Public,
        },
        get(openapi),
    )];
    t.extend(crate::api::routes());
    t.extend(crate::peer::routes());
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
    r.with_state(agent.clone())
        .layer(axum::middleware::from_fn_with_state(
            agent,
            crate::control::require_token,
        ))
}

/// The OpenAPI 3 document of every route.
pub fn openapi_doc() -> serde_json::Value {
    let mut paths = serde_json::Map::new();
    for (d, _) in table() {
        let mut params: Vec<serde_json::Value> = d
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| serde_json::json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        for (name, required, schema) in crate::schemas::query(d.method, d.path) {
            params.push(serde_json::json!({"name": name, "in": "query", "required": required, "schema": schema}));
        }
        let mut op = serde_json::json!({
            "summary": d.summary,
            "description": format!("Access: {}.", d.access),
            "x-strata-access": d.rule.to_json(),
            "parameters": params,
            "responses": {
                "200": {"description": "OK (JSON)"},
                "400": {"description": "invalid_input"},
                "401": {"description": "unauthenticated"},
                "403": {"description": "permission_denied"},
                "404": {"description": "not_found"},
                "429": {"description": "resource_exhausted (quota)"}
            }
        });
        if d.plane == Plane::Public {
            op["security"] = serde_json::json!([]);
        }
        if let Some(schema) = crate::schemas::request_body(d.method, d.path) {
            op["requestBody"] = serde_json::json!({
                "required": true,
                "content": {"application/json": {"schema": schema}},
            });
        } else if crate::schemas::binary_body(d.method, d.path) {
            op["requestBody"] = serde_json::json!({
                "required": true,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            });
        }
        let entry = paths
            .entry(d.path.to_string())
            .or_insert_with(|| serde_json::json!({}));
        entry[d.method.to_lowercase()] = op;
    }
    serde_json::json!({
        "openapi": "3.0.3",
        "info": {"title": "Strata control API", "version": env!("CARGO_PKG_VERSION")},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": paths,
    })
}

async fn openapi() -> axum::Json<serde_json::Value> {
    axum::Json(openapi_doc())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_body_route_documents_its_body() {
        // Routes that take no body although they change something.
        const NO_BODY: &[(&str, &str)] = &[("POST", "/v1/prefetch")];
        for (d, _) in table() {
            if !matches!(d.method, "POST" | "PUT") || NO_BODY.contains(&(d.method, d.path)) {
                continue;
            }
            assert!(
                crate::schemas::request_body(d.method, d.path).is_some()
                    || crate::schemas::binary_body(d.method, d.path),
                "{} {} takes a body /openapi.json does not describe: add it to schemas.rs",
                d.method,
                d.path
            );
        }
    }

    #[test]
    fn every_route_is_in_the_table_once() {
        let mut seen = std::collections::HashSet::new();
        for (d, _) in table() {
            assert!(
                seen.insert((d.method, d.path)),
                "{} {} twice",
                d.method,
                d.path
            );
        }
        let doc = openapi_doc();
        let n: usize = doc["paths"]
            .as_object()
            .map(|p| {
                p.values()
                    .map(|ops| ops.as_object().map_or(0, |o| o.len()))
                    .sum()
            })
            .unwrap_or(0);
        assert_eq!(n, seen.len());
    }
}
