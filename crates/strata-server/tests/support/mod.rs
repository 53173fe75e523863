//! Helpers of the API tests: agents on both catalogs, calls through the router in process, teams and tokens.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::{Method, Request};
use serde_json::{Value, json};
use strata_server::config::{Config, Overrides};
use strata_server::{Agent, control, routes};
use tower::ServiceExt;

/// One agent and its API, in process.
pub struct Env {
    pub app: Router,
    pub agent: Arc<Agent>,
    pub admin: String,
    pub dir: tempfile::TempDir,
}

pub async fn envs() -> Vec<Env> {
    envs_with(|_| Config::default()).await
}

/// An agent per catalog (SQLite; PostgreSQL when the test command provides one), configured by `cfg` from its
/// data directory.
pub async fn envs_with(cfg: impl Fn(&std::path::Path) -> Config) -> Vec<Env> {
    let mut urls = vec![None];
    if let Some(admin) = strata_catalog::testing::postgres_url() {
        urls.push(Some(
            strata_catalog::testing::fresh_postgres(&admin)
                .await
                .unwrap(),
        ));
    }
    let mut out = Vec::new();
    for url in urls {
        let dir = tempfile::tempdir().unwrap();
        let resolved = cfg(dir.path())
            .resolve(&Overrides {
                data_dir: Some(dir.path().join("d")),
                api_listen: Some("127.0.0.1:0".into()),
                catalog: url,
                ..Default::default()
            })
            .unwrap();
        let agent = Agent::start(resolved).await.unwrap();
        let admin =
            std::fs::read_to_string(control::admin_token_file(&dir.path().join("d"))).unwrap();
        out.push(Env {
            app: routes::router(agent.clone()),
            agent,
            admin: admin.trim().to_string(),
            dir,
        });
    }
    out
}

pub async fn call(
    app: &Router,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = match body {
        Some(b) => req
            .header("content-type", "application/json")
            .body(Body::from(b.to_string()))
            .unwrap(),
        None => req.body(Body::empty()).unwrap(),
    };
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .unwrap();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

pub async fn ok(
    app: &Router,
    method: Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> Value {
    let (s, v) = call(app, method.clone(), path, Some(token), body).await;
    assert_eq!(s, 200, "{method} {path}: {v}");
    v
}

/// Create team `name` as the administrator.
pub async fn create_team(e: &Env, name: &str) {
    ok(
        &e.app,
        Method::POST,
        "/v1/teams",
        &e.admin,
        Some(json!({"name": name})),
    )
    .await;
}

/// Issue a token for `team` with `role`.
pub async fn token_for(e: &Env, name: &str, team: &str, role: &str) -> String {
    let v = ok(
        &e.app,
        Method::POST,
        "/v1/tokens",
        &e.admin,
        Some(json!({"name": name, "kind": "token", "team": team, "role": role})),
    )
    .await;
    v["token"].as_str().unwrap().to_string()
}
