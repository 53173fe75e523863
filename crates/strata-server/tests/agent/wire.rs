//! The agent's wire as clients see it: every error kind answered with its own status and a JSON body that
//! carries the kind and the retryable flag, so that no client has to guess either from the status.

use std::sync::Arc;

use axum::body::Body;
use http::{Method, Request};
use serde_json::Value;
use strata_server::{Agent, control, routes};
use tower::ServiceExt;

struct Env {
    app: axum::Router,
    _agent: Arc<Agent>,
    admin: String,
    _dir: tempfile::TempDir,
}

async fn env() -> Env {
    let (agent, dir) = super::common::agent().await;
    let admin = std::fs::read_to_string(control::admin_token_file(&dir.path().join("d"))).unwrap();
    Env {
        app: routes::router(agent.clone()),
        _agent: agent,
        admin: admin.trim().to_string(),
        _dir: dir,
    }
}

/// A peer replica whose body does not match the hash its sender computed is corrupt, not "unavailable": the
/// sender must not retry it as if the agent were down. (The agent answered 500, which every client read as a
/// retryable failure.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_peer_replica_is_answered_as_corrupt_not_unavailable() {
    let e = env().await;
    let body = b"not the bytes that were hashed".to_vec();
    let req = Request::builder()
        .method(Method::PUT)
        .uri("/v1/peer/ckpt/run-w/1/rank-00000.safetensors")
        .header("authorization", format!("Bearer {}", e.admin))
        .header("content-length", body.len())
        .header(
            "x-strata-blake3",
            blake3::hash(b"other bytes").to_hex().as_str(),
        )
        .body(Body::from(body))
        .unwrap();
    let resp = e.app.clone().oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"], "corrupt", "{v}");
    assert_eq!(v["retryable"], false, "{v}");
}

/// The same refusal through the agent's client over TCP: the kind and the retryable flag survive the round
/// trip, and a request retried through the policy is not sent again for it (it is, for an agent that is down).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reads_kinds_back_and_never_retries_corruption() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use strata_client::{AgentClient, ClientOptions, Method};
    use strata_types::ErrorKind;

    let e = env().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = e.app.clone();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let opts = ClientOptions {
        token: Some(e.admin.clone()),
        retry: strata_object::RetryPolicy {
            max_retries: 3,
            initial_backoff: std::time::Duration::from_millis(1),
            max_backoff: std::time::Duration::from_millis(2),
        },
        ..Default::default()
    };
    let client = AgentClient::new(&addr.to_string(), &opts).unwrap();
    let sent = AtomicU32::new(0);
    let url = client.url("/v1/peer/ckpt/run-w/1/rank-00000.safetensors");
    let err = client
        .send_retried("peer PUT", || {
            sent.fetch_add(1, Ordering::SeqCst);
            client
                .request(Method::PUT, url.as_str())
                .header("x-strata-blake3", blake3::hash(b"other").to_hex().as_str())
                .body("these bytes")
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(!err.is_retryable(), "{err}");
    assert!(err.message().contains("not stored"), "{err}");
    assert_eq!(sent.load(Ordering::SeqCst), 1, "corruption is not retried");

    // Kinds of other routes come back too: an unknown backend is NotFound, a forged token Unauthenticated.
    let q = strata_api::data::LocationQuery {
        location: "nosuch/key".into(),
    };
    let err = client
        .call::<strata_api::data::Read>(&[], &q, &())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    let forged = AgentClient::new(
        &addr.to_string(),
        &ClientOptions {
            token: Some("forged".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let err = forged
        .call::<strata_api::data::CacheStats>(&[], &strata_api::NoQuery {}, &())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unauthenticated, "{err}");

    // An agent that is gone: Unavailable, retryable, and retried.
    server.abort();
    let _ = server.await;
    sent.store(0, Ordering::SeqCst);
    let err = client
        .send_retried("GET /v1/cache", || {
            sent.fetch_add(1, Ordering::SeqCst);
            client.request(Method::GET, client.url("/v1/cache"))
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert_eq!(sent.load(Ordering::SeqCst), 4, "1 attempt + 3 retries");
}
