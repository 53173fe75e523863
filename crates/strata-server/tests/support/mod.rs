//! Helpers of the API tests: agents on both catalogs, calls through the router in process, teams and tokens.

#![allow(dead_code, clippy::unwrap_used)]

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use http::{Method, Request};
use serde_json::{Value, json};
use std::path::Path;
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
    envs_timed(cfg, || Arc::new(strata_catalog::SystemClock)).await
}

/// [`envs`] whose catalogs read `clock` (a `ManualClock` a test moves instead of sleeping).
pub async fn envs_with_clock(clock: Arc<strata_catalog::ManualClock>) -> Vec<Env> {
    envs_timed(|_| Config::default(), || clock.clone()).await
}

async fn envs_timed(
    cfg: impl Fn(&std::path::Path) -> Config,
    clock: impl Fn() -> Arc<dyn strata_catalog::Clock>,
) -> Vec<Env> {
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
        let agent = Agent::start_with_clock(resolved, clock()).await.unwrap();
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

/// Save step 1 of `run` (one rank) into the local tier `dir`, as a training process does before it hands the
/// save over.
pub async fn local_save(dir: &Path, run: &str) {
    use std::time::Duration;
    use strata_ckpt::{CheckpointConfig, Checkpointer, Overlap, Retention, Tier};
    let ck = Checkpointer::new(
        CheckpointConfig {
            run_id: run.into(),
            rank: 0,
            world_size: 1,
            local_is_shared: false,
            local: Tier::Local(dir.to_path_buf()),
            remote: None,
            peers: Vec::new(),
            self_peer: None,
            replicas: 0,
            upload_every: 1,
            keep_local: Retention::default(),
            keep_remote: Retention::default(),
            overlap: Overlap::Wait,
            commit_timeout: Duration::from_secs(10),
            handoff: None,
            quota: None,
        },
        strata_types::IoContext::default(),
    )
    .unwrap();
    let t = vec![strata_ckpt::blob(
        "w",
        bytes::Bytes::from(vec![7u8; 100_000]),
    )];
    let rt = tokio::runtime::Handle::current();
    let h = ck.save(&rt, 1, t, Default::default()).await.unwrap();
    let _ = h.wait().await;
}

pub fn handoff_body(run: &str, local: &Path, remote: Option<String>, peers: Vec<String>) -> Value {
    json!({
        "run_id": run, "step": 1, "rank": 0, "world_size": 1, "upload": remote.is_some(),
        "local_dir": local, "remote_url": remote, "peers": peers, "self_peer": null,
        "replicas": if peers.is_empty() { 0 } else { 1 }, "keep_local": 0, "keep_remote": 1,
        "keep_every": null, "commit_timeout_ms": 5000
    })
}

/// A call with a raw body; the answer's status and body as text.
pub async fn call_raw(
    app: &Router,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (u16, String) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-length", body.len());
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into())
}

/// What the administrator sees of `team` over the control API (audit excluded: append-only by design).
pub async fn team_state(e: &Env, team: &str) -> serde_json::Map<String, Value> {
    let mut out = serde_json::Map::new();
    for path in [
        format!("/v1/teams/{team}"),
        format!("/v1/teams/{team}/members"),
        format!("/v1/quotas/{team}"),
        "/v1/policies".into(),
        "/v1/protections".into(),
        "/v1/cleanup/plans".into(),
        "/v1/scratch".into(),
        "/v1/prefixes".into(),
        format!("/v1/tokens?team={team}"),
        "/v1/usage?by=team".into(),
    ] {
        let v = ok(&e.app, Method::GET, &path, &e.admin, None).await;
        out.insert(path, v);
    }
    out
}
