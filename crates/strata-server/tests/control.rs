//! The control API, in process, on both catalogs (SQLite, and PostgreSQL when the test command provides one):
//! property tests on request bodies, quota reservations, scratch, forecasts, the data plane's prefix
//! ownership. (Every route against every caller: `tenancy.rs`.)

#![allow(clippy::unwrap_used)]

mod support;

use axum::Router;
use axum::body::Body;
use http::{Method, Request};
use serde_json::{Value, json};
use std::sync::Arc;
use strata_catalog::Clock;
use strata_server::config::{Config, Overrides};
use strata_server::{Agent, control, routes};
use support::*;
use tower::ServiceExt;

/// Teams A and B, B owning `default/team-b` with limits on `default`; returns team A's administrator.
async fn setup(e: &Env) -> String {
    let app = &e.app;
    for t in ["team-a", "team-b"] {
        create_team(e, t).await;
    }
    let a = ok(
        app,
        Method::POST,
        "/v1/tokens",
        &e.admin,
        Some(json!({"name": "a-admin", "kind": "token", "team": "team-a", "role": "team_admin"})),
    )
    .await;
    ok(
        app,
        Method::PUT,
        "/v1/quotas/team-b/default",
        &e.admin,
        Some(json!({"hard_bytes": 1000, "soft_bytes": 500, "grace_secs": 60})),
    )
    .await;
    ok(
        app,
        Method::PUT,
        "/v1/prefixes",
        &e.admin,
        Some(json!({"backend": "default", "prefix": "team-b", "team": "team-b"})),
    )
    .await;
    a["token"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_scratch_and_forecasts_through_the_api() {
    let clock = Arc::new(strata_catalog::ManualClock::new(
        strata_catalog::SystemClock.now(),
    ));
    for e in envs_with_clock(clock.clone()).await {
        let app = &e.app;
        create_team(&e, "t").await;
        ok(
            app,
            Method::PUT,
            "/v1/quotas/t/scratch",
            &e.admin,
            Some(json!({"hard_bytes": 100})),
        )
        .await;
        let m = ok(
            app,
            Method::POST,
            "/v1/tokens",
            &e.admin,
            Some(json!({"name": "m", "kind": "token", "team": "t", "role": "member"})),
        )
        .await;
        let mt = m["token"].as_str().unwrap();
        // A member cannot raise its own quota.
        let (s, _) = call(
            app,
            Method::PUT,
            "/v1/quotas/t/scratch",
            Some(mt),
            Some(json!({"hard_bytes": 1000000})),
        )
        .await;
        assert_eq!(s, 403);
        // Scratch is charged before it exists, refused over the hard limit, refunded when freed.
        let s1 = ok(
            app,
            Method::POST,
            "/v1/scratch",
            mt,
            Some(json!({"team": "t", "bytes": 80, "ttl_secs": 1})),
        )
        .await;
        assert!(std::path::Path::new(s1["path"].as_str().unwrap()).is_dir());
        let (s, v) = call(
            app,
            Method::POST,
            "/v1/scratch",
            Some(mt),
            Some(json!({"team": "t", "bytes": 30, "ttl_secs": 60})),
        )
        .await;
        assert_eq!(s, 429, "{v}");
        assert_eq!(v["error"], "resource_exhausted");
        // Expiry moves it to the trash and gives the bytes back.
        clock.advance(2);
        assert_eq!(
            strata_server::background::expire_scratch(&e.agent)
                .await
                .unwrap(),
            1
        );
        assert!(!std::path::Path::new(s1["path"].as_str().unwrap()).exists());
        let q = ok(app, Method::GET, "/v1/quotas/t", mt, None).await;
        let scratch = q
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["scope"] == "scratch")
            .unwrap();
        assert_eq!(scratch["used_bytes"], 0);
        // Reserve, commit (not more than reserved), release.
        let r = ok(
            app,
            Method::POST,
            "/v1/quotas/t/scratch/reserve",
            mt,
            Some(json!({"bytes": 60, "objects": 1})),
        )
        .await;
        let id = r["id"].as_str().unwrap();
        let (s, _) = call(
            app,
            Method::POST,
            &format!("/v1/reservations/{id}/commit"),
            Some(mt),
            Some(json!({"bytes": 61, "objects": 1})),
        )
        .await;
        assert_eq!(s, 400);
        ok(
            app,
            Method::POST,
            &format!("/v1/reservations/{id}/commit"),
            mt,
            Some(json!({"bytes": 50, "objects": 1})),
        )
        .await;
        let (s, _) = call(
            app,
            Method::POST,
            &format!("/v1/reservations/{id}/release"),
            Some(mt),
            None,
        )
        .await;
        assert_eq!(s, 404, "settled once");

        // Forecast: a team growing 10 bytes a day towards a 1000-byte hard limit, 500 used now.
        ok(
            app,
            Method::PUT,
            "/v1/quotas/t/*",
            &e.admin,
            Some(json!({"hard_bytes": 600})),
        )
        .await;
        let now = e.agent.catalog().now();
        for d in 0..20i64 {
            let noise = [3, -2, 1, 0, -3, 2, -1, 2, 0, -2][(d % 10) as usize];
            e.agent
                .catalog()
                .add_sample(
                    "team",
                    "t",
                    strata_catalog::lifecycle::UsageSample {
                        at: now - (19 - d) * 86_400,
                        used: 400 + d * 10 + noise,
                        capacity: Some(600),
                    },
                )
                .await
                .unwrap();
        }
        let f = ok(app, Method::GET, "/v1/forecast", mt, None).await;
        let line = f
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["kind"] == "team" && l["scope"] == "t")
            .unwrap()
            .clone();
        let days = line["forecast"]["days_until_full"].as_f64().unwrap();
        assert!((days - 1.0).abs() < 3.0, "{line}");
        assert_eq!(line["alert"], true, "fills within 14 days: {line}");
        // Metrics are an operator's (they name every team).
        assert_eq!(
            call(app, Method::GET, "/metrics", Some(mt), None).await.0,
            403
        );
        let metrics = call(app, Method::GET, "/metrics", Some(&e.admin), None)
            .await
            .1;
        assert!(
            metrics
                .as_str()
                .unwrap()
                .contains("strata_forecast_alert{kind=\"team\",scope=\"t\"} 1"),
            "{metrics}"
        );
        e.agent.catalog().close().await;
    }
}

mod bodies {
    use super::*;
    use proptest::prelude::*;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|f| json!(f)),
            "[a-z_*./ -]{0,12}".prop_map(Value::String),
            Just(json!("team-a")),
            Just(json!("default")),
        ];
        leaf.prop_recursive(3, 24, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("name".to_string()),
                        Just("team".to_string()),
                        Just("kind".to_string()),
                        Just("prefix".to_string()),
                        Just("bytes".to_string()),
                        Just("age_secs".to_string()),
                        Just("hard_bytes".to_string()),
                        Just("role".to_string()),
                        "[a-z_]{1,8}",
                    ],
                    inner,
                    0..5
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    #[test]
    fn arbitrary_bodies_never_cause_a_server_error() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let env = rt.block_on(async {
            let mut v = envs().await;
            let e = v.remove(0);
            create_team(&e, "team-a").await;
            e
        });
        let routes: Vec<(Method, String)> = control::routes()
            .into_iter()
            .filter(|(d, _)| d.method != strata_api::Method::GET)
            .map(|(d, _)| {
                (
                    Method::from_bytes(d.method.as_str().as_bytes()).unwrap(),
                    d.path
                        .replace("{team}", "team-a")
                        .replace("{scope}", "default")
                        .replace("{principal}", "p_x")
                        .replace("{id}", "x"),
                )
            })
            .collect();
        let config = ProptestConfig {
            cases: 96,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest!(config, |(body in json_value(), which in 0usize..1000)| {
            let (m, path) = &routes[which % routes.len()];
            let (s, v) = rt.block_on(call(&env.app, m.clone(), path, Some(&env.admin), Some(body.clone())));
            prop_assert!(s < 500, "{} {} with {}: {} {}", m, path, body, s, v);
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_backend_names_are_404_naming_the_backend() {
    for e in envs().await {
        create_team(&e, "team-a").await;
        for (m, path, body) in [
            (
                Method::POST,
                "/v1/usage/reconcile",
                json!({"backend": "nope"}),
            ),
            (Method::POST, "/v1/usage/scan", json!({"backend": "nope"})),
            (
                Method::PUT,
                "/v1/prefixes",
                json!({"backend": "nope", "prefix": "a/", "team": "team-a"}),
            ),
            (
                Method::POST,
                "/v1/policies",
                json!({"team": "team-a", "backend": "nope", "kind": "ttl", "prefix": "tmp/", "age_secs": 60}),
            ),
        ] {
            let (s, v) = call(&e.app, m.clone(), path, Some(&e.admin), Some(body)).await;
            assert_eq!(s, 404, "{m} {path}: {v}");
            assert!(
                v.to_string().contains("no backend \\\"nope\\\""),
                "{m} {path}: {v}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_starts_one_run_that_later_reads_find_in_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("d");
    let mut cfg = Config::default();
    cfg.cache.block_size = strata_types::ByteSize::mib(1);
    let resolved = cfg
        .resolve(&Overrides {
            data_dir: Some(data_dir.clone()),
            api_listen: Some("127.0.0.1:0".into()),
            ..Default::default()
        })
        .unwrap();
    let agent = Agent::start(resolved).await.unwrap();
    let app = routes::router(agent.clone());
    let admin = std::fs::read_to_string(control::admin_token_file(&data_dir)).unwrap();
    let admin = admin.trim();
    let blob: Vec<u8> = (0..(4 << 20) + 1000u32).map(|i| (i % 253) as u8).collect();
    std::fs::create_dir_all(data_dir.join("objects/data")).unwrap();
    std::fs::write(data_dir.join("objects/data/blob.bin"), &blob).unwrap();

    let prefetch = |range: Option<&str>, location: &str| {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(format!("/v1/prefetch?location={location}"))
            .header("authorization", format!("Bearer {admin}"));
        if let Some(r) = range {
            req = req.header("range", r);
        }
        app.clone().oneshot(req.body(Body::empty()).unwrap())
    };
    // Blocks 1..=3 (bytes 1 MiB .. 4 MiB - 1): one backend request for the three of them.
    let resp = prefetch(Some("bytes=1048576-4194303"), "default/data/blob.bin")
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    let stats = |app: Router| async move {
        call(&app, Method::GET, "/v1/cache", Some(admin), None)
            .await
            .1
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let s = stats(app.clone()).await;
        if s["fills"] == 3 {
            assert_eq!(s["fill_requests"], 1, "{s}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "prefetch never landed: {s}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Reading those bytes now takes the three staged blocks: three misses (their bytes came from the backend,
    // if ahead of the read), no other fill, nothing left staged.
    let req = Request::builder()
        .uri("/v1/read?location=default/data/blob.bin")
        .header("authorization", format!("Bearer {admin}"))
        .header("range", "bytes=1048576-4194303")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 206);
    let got = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .unwrap();
    assert_eq!(got.as_ref(), &blob[1 << 20..4 << 20]);
    let s = stats(app.clone()).await;
    assert_eq!(
        (&s["misses"], &s["staged_read"], &s["staged_blocks"]),
        (&json!(3), &json!(3), &json!(0)),
        "{s}"
    );
    // Without a range: the rest of the object; a missing object is a 404; a bad range a 400.
    assert_eq!(
        prefetch(None, "default/data/blob.bin")
            .await
            .unwrap()
            .status()
            .as_u16(),
        202
    );
    assert_eq!(
        prefetch(None, "default/data/missing.bin")
            .await
            .unwrap()
            .status()
            .as_u16(),
        404
    );
    assert_eq!(
        prefetch(Some("bytes=9-1"), "default/data/blob.bin")
            .await
            .unwrap()
            .status()
            .as_u16(),
        400
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_plane_routes_apply_prefix_ownership() {
    for e in envs().await {
        let a_admin = setup(&e).await; // team-b owns default/team-b
        let b_reader = token_for(&e, "b-reader", "team-b", "reader").await;
        let b_member = token_for(&e, "b-member", "team-b", "member").await;
        let (backend, _) = e.agent.resolve("default/").unwrap();
        let ctx = strata_types::IoContext::default();
        let secret = bytes::Bytes::from_static(b"team b's weights");
        for key in ["team-b/secret.bin", "open/x.bin"] {
            backend
                .put(&ctx, key, secret.clone(), strata_object::PutMode::Overwrite)
                .await
                .unwrap();
        }
        let read = |t: String, loc: &'static str| {
            let app = e.app.clone();
            async move {
                call(
                    &app,
                    Method::GET,
                    &format!("/v1/read?location={loc}"),
                    Some(&t),
                    None,
                )
                .await
                .0
            }
        };
        let post = |t: String, path: String, body: Option<Value>| {
            let app = e.app.clone();
            async move { call(&app, Method::POST, &path, Some(&t), body).await }
        };

        // Another team's key: every data-plane route refuses it, as the gateway does.
        assert_eq!(
            read(a_admin.clone(), "default/team-b/secret.bin").await,
            403
        );
        let (s, v) = post(
            a_admin.clone(),
            "/v1/prefetch?location=default/team-b/secret.bin".into(),
            None,
        )
        .await;
        assert_eq!(s, 403, "{v}");
        for loc in ["default/team-b/", "default/"] {
            let (s, v) = post(
                a_admin.clone(),
                "/v1/cache/warm".into(),
                Some(json!({"location": loc})),
            )
            .await;
            assert_eq!(s, 403, "warm {loc}: {v}");
            let (s, v) = post(
                a_admin.clone(),
                "/v1/cache/pin".into(),
                Some(json!({"location": loc})),
            )
            .await;
            assert_eq!(s, 403, "pin {loc}: {v}");
        }
        // Keys nobody owns stay open; the owner's reader reads; pinning needs a member.
        assert_eq!(read(a_admin.clone(), "default/open/x.bin").await, 200);
        assert_eq!(
            read(b_reader.clone(), "default/team-b/secret.bin").await,
            200
        );
        assert_eq!(
            read(e.admin.clone(), "default/team-b/secret.bin").await,
            200
        );
        let (s, _) = post(
            b_reader.clone(),
            "/v1/cache/pin".into(),
            Some(json!({"location": "default/team-b/"})),
        )
        .await;
        assert_eq!(s, 403, "a reader does not pin");
        let (s, v) = post(
            b_member.clone(),
            "/v1/cache/pin".into(),
            Some(json!({"location": "default/team-b/"})),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let usage = |t: String| {
            let app = e.app.clone();
            async move {
                call(&app, Method::GET, "/v1/quotas?team=team-b", Some(&t), None)
                    .await
                    .1
            }
        };
        let before = usage(e.admin.clone()).await;
        // Team A cannot remove team B's pin (nor zero its cache usage); team B's member can.
        let (s, v) = post(
            a_admin.clone(),
            "/v1/cache/unpin".into(),
            Some(json!({"location": "default/team-b/"})),
        )
        .await;
        assert_eq!(s, 404, "another team's pin does not exist for it: {v}");
        let pins = call(&e.app, Method::GET, "/v1/cache", Some(&e.admin), None)
            .await
            .1["pins"]
            .clone();
        assert_eq!(pins.as_array().map(Vec::len), Some(1), "{pins}");
        assert_eq!(usage(e.admin.clone()).await, before);
        let (s, v) = post(
            b_member.clone(),
            "/v1/cache/unpin".into(),
            Some(json!({"location": "default/team-b/"})),
        )
        .await;
        assert_eq!((s, &v["removed"]), (200, &json!(true)), "{v}");
        e.agent.catalog().close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_with_unknown_fields_are_refused_and_change_nothing() {
    for e in envs().await {
        create_team(&e, "team-b").await;
        let limits = json!({"hard_bytes": 1000, "soft_bytes": 500, "grace_secs": 60});
        ok(
            &e.app,
            Method::PUT,
            "/v1/quotas/team-b/default",
            &e.admin,
            Some(limits),
        )
        .await;
        let before = ok(&e.app, Method::GET, "/v1/quotas/team-b", &e.admin, None).await;
        // A typo must not clear every limit.
        for (method, path, body) in [
            (
                Method::PUT,
                "/v1/quotas/team-b/default",
                json!({"hard_byte": 100}),
            ),
            (
                Method::POST,
                "/v1/policies",
                json!({"team": "team-b", "backend": "default", "kind": "ttl",
                                                   "prefix": "x/", "age_secs": 1, "age": 5}),
            ),
            (
                Method::POST,
                "/v1/protections",
                json!({"kind": "pin", "team": "team-b", "backend": "default",
                                                      "prefix": "x/", "forever": true}),
            ),
            (
                Method::POST,
                "/v1/tokens",
                json!({"name": "n", "kind": "token", "team": "team-b",
                                                 "role": "reader", "admn": true}),
            ),
        ] {
            let (s, v) = call(&e.app, method, path, Some(&e.admin), Some(body)).await;
            assert_eq!(s, 400, "{path}: {v}");
            assert!(v.to_string().contains("unknown field"), "{path}: {v}");
        }
        assert_eq!(
            ok(&e.app, Method::GET, "/v1/quotas/team-b", &e.admin, None).await,
            before
        );
        // Every body whose fields are all optional (where a typo would silently mean "no value"), from the
        // route table: an unknown field is refused.
        let plan = ok(
            &e.app,
            Method::POST,
            "/v1/cleanup/plans",
            &e.admin,
            Some(json!({"team": "team-b"})),
        )
        .await["plan"]["id"]
            .as_str()
            .unwrap()
            .to_string();
        let reservation = ok(
            &e.app,
            Method::POST,
            "/v1/quotas/team-b/default/reserve",
            &e.admin,
            Some(json!({"bytes": 1})),
        )
        .await["id"]
            .as_str()
            .unwrap()
            .to_string();
        let mut optional_only = 0;
        let doc = routes::openapi_doc();
        for (d, _) in routes::table() {
            let op = &doc["paths"][d.path][d.method.as_str().to_lowercase()];
            let Some(name) = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                .as_str()
                .and_then(|r| r.rsplit('/').next())
            else {
                continue;
            };
            let schema = &doc["components"]["schemas"][name];
            if schema["required"].as_array().is_some_and(|r| !r.is_empty()) {
                continue;
            }
            let path = d
                .path
                .replace("{team}", "team-b")
                .replace("{scope}", "default")
                .replace(
                    "{id}",
                    if d.path.starts_with("/v1/cleanup") {
                        &plan
                    } else {
                        &reservation
                    },
                );
            let method = Method::from_bytes(d.method.as_str().as_bytes()).unwrap();
            let (s, v) = call(
                &e.app,
                method,
                &path,
                Some(&e.admin),
                Some(json!({"zz_unknown": 1})),
            )
            .await;
            assert_eq!(s, 400, "{:?} {path}: {v}", d.method);
            assert!(v.to_string().contains("unknown field"), "{path}: {v}");
            optional_only += 1;
        }
        assert!(optional_only >= 6, "{optional_only}");
        e.agent.catalog().close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_that_cannot_list_answers_its_error_not_200() {
    let envs = envs_with(|_| {
        let mut c = Config::default();
        c.retry.max_retries = 0;
        c.backends = vec![strata_server::config::BackendSection {
            name: "gone".into(),
            url: "s3://gone-bucket".into(),
            options: strata_object::BackendOptions {
                endpoint: Some("http://127.0.0.1:1".into()),
                region: Some("us-east-1".into()),
                access_key_id: Some("k".into()),
                secret_access_key: Some("s".into()),
                ..Default::default()
            },
        }];
        c
    })
    .await;
    for e in envs {
        let (s, v) = call(
            &e.app,
            Method::POST,
            "/v1/cache/warm",
            Some(&e.admin),
            Some(json!({"location": "gone/data/"})),
        )
        .await;
        assert_eq!(s, 503, "{v}");
        assert_eq!(v["error"], "unavailable", "{v}");
    }
}
