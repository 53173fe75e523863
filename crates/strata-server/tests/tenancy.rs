//! The tenancy matrix of the agent's API, generated from `/openapi.json`: every route × every kind of caller
//! (none, forged, team B's reader/member/team admin, team A's reader/member/team admin, the administrator),
//! with team B's resources substituted for every id, team and location the route takes. The outcome each
//! call must have is derived from the route's declared rule (`x-strata-access`) and the resource's owner
//! (team B); a route without a request here fails the test, so no route is added without its outcome.
//!
//! Phase one makes every call the rule refuses, and checks that team B's state and data did not change;
//! phase two makes the calls it allows (the ones that change or consume things last), and checks that they
//! pass the access decision (never 401, 403, or the 404 that hides a resource, never a server error).

#![allow(clippy::unwrap_used)]

mod support;

use http::Method;
use serde_json::{Value, json};
use support::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    None,
    Forged,
    A(&'static str),
    B(&'static str),
    Admin,
}

const CALLERS: [Who; 9] = [
    Who::None,
    Who::Forged,
    Who::A("reader"),
    Who::A("member"),
    Who::A("team_admin"),
    Who::B("reader"),
    Who::B("member"),
    Who::B("team_admin"),
    Who::Admin,
];

fn rank(role: &str) -> u8 {
    match role {
        "reader" => 1,
        "member" => 2,
        "team_admin" => 3,
        r => panic!("unknown role {r}"),
    }
}

/// Team B's resources, and everything a call needs.
struct World {
    tokens: std::collections::HashMap<String, String>,
    victim: String,
    policy: String,
    protection: String,
    plan: String,
    scratch: String,
    claim: String,
    reservation: String,
    /// A second one, for the release route (commit uses up the first).
    reservation2: String,
    b_local: std::path::PathBuf,
}

impl World {
    fn token(&self, who: Who, e: &Env) -> Option<String> {
        match who {
            Who::None => None,
            Who::Forged => Some("stk_forged_0123456789".into()),
            Who::A(r) => Some(self.tokens[&format!("a-{r}")].clone()),
            Who::B(r) => Some(self.tokens[&format!("b-{r}")].clone()),
            Who::Admin => Some(e.admin.clone()),
        }
    }
}

const SECRET: &[u8] = b"team b's private bytes";
const REPLICA: &[u8] = b"team b's replica";

async fn setup(e: &Env) -> World {
    let app = &e.app;
    let mut tokens = std::collections::HashMap::new();
    for (t, short) in [("team-a", "a"), ("team-b", "b")] {
        create_team(e, t).await;
        ok(
            app,
            Method::PUT,
            "/v1/prefixes",
            &e.admin,
            Some(json!({"backend": "default", "prefix": format!("{t}/"), "team": t})),
        )
        .await;
        for role in ["reader", "member", "team_admin"] {
            let name = format!("{short}-{role}");
            tokens.insert(name.clone(), token_for(e, &name, t, role).await);
        }
    }
    let bt = tokens["b-team_admin"].clone();
    let bm = tokens["b-member"].clone();
    // Team B's job as the analytics saw it: a read of its data, under its dataset.
    e.agent.analytics().apply_all(&[strata_analytics::Access {
        at: std::time::SystemTime::now(),
        class: strata_analytics::OpClass::DataRead,
        ctx: strata_types::IoContext {
            principal: Some("b-reader".into()),
            team: Some("team-b".into()),
            job: Some("job-b".into()),
            dataset: Some("dataset-team-b".into()),
        },
        backend: "default".into(),
        key: "team-b/secret.bin".into(),
        count: 1,
        bytes: 5,
        latency: std::time::Duration::from_millis(1),
        served: strata_analytics::Served::Origin,
        ok: true,
    }]);
    let victim = ok(
        app,
        Method::POST,
        "/v1/tokens",
        &bt,
        Some(json!({"name": "victim", "kind": "s3_key", "team": "team-b", "role": "member"})),
    )
    .await["principal"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (backend, _) = e.agent.resolve("default/").unwrap();
    let ctx = strata_types::IoContext::default();
    for key in [
        "team-b/secret.bin",
        "team-b/pinned/p.bin",
        "team-b/x/old.bin",
        "team-a/a.bin",
    ] {
        backend
            .put(
                &ctx,
                key,
                bytes::Bytes::from_static(SECRET),
                strata_object::PutMode::Overwrite,
            )
            .await
            .unwrap();
    }
    ok(
        app,
        Method::POST,
        "/v1/cache/pin",
        &bm,
        Some(json!({"location": "default/team-b/pinned/"})),
    )
    .await;
    let policy = ok(
        app,
        Method::POST,
        "/v1/policies",
        &bt,
        Some(
            json!({"team": "team-b", "backend": "default", "kind": "ttl", "prefix": "team-b/x",
                    "age_secs": 1}),
        ),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let protection = ok(
        app,
        Method::POST,
        "/v1/protections",
        &bt,
        Some(
            json!({"kind": "pin", "team": "team-b", "backend": "default", "prefix": "team-b/keep/",
                    "job": null, "expires_at": null}),
        ),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let plan = ok(
        app,
        Method::POST,
        "/v1/cleanup/plans",
        &bt,
        Some(json!({"team": "team-b"})),
    )
    .await["plan"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let scratch = ok(
        app,
        Method::POST,
        "/v1/scratch",
        &bt,
        Some(json!({"team": "team-b", "bytes": 10, "ttl_secs": 3600})),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let claim = ok(
        app,
        Method::POST,
        "/v1/claims",
        &bm,
        Some(claim_body("job-b")),
    )
    .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Staged before the matrix runs, so its state holds still while refused calls are checked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let c = ok(app, Method::GET, &format!("/v1/claims/{claim}"), &bm, None).await;
        if c["state"] == "ready" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "team B's claim: {c}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut reservations = Vec::new();
    for _ in 0..2 {
        reservations.push(
            ok(
                app,
                Method::POST,
                "/v1/quotas/team-b/default/reserve",
                &bm,
                Some(json!({"bytes": 5, "objects": 1})),
            )
            .await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let (reservation, reservation2) = (reservations[0].clone(), reservations[1].clone());
    // A replica and a handed-over save of team B.
    let (s, v) = call_raw(
        app,
        Method::PUT,
        "/v1/peer/ckpt/run-b/1/rank-00000.safetensors",
        Some(&bm),
        REPLICA.to_vec(),
    )
    .await;
    assert_eq!(s, 204, "{v}");
    let b_local = e.dir.path().join("d/objects/team-b/ckpt");
    std::fs::create_dir_all(&b_local).unwrap();
    local_save(&b_local, "run-b").await;
    let (s, v) = call(
        app,
        Method::POST,
        "/v1/ckpt/handoff",
        Some(&bm),
        Some(handoff_body("run-b", &b_local, None, vec![])),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    World {
        tokens,
        victim,
        policy,
        protection,
        plan,
        scratch,
        claim,
        reservation,
        reservation2,
        b_local,
    }
}

/// A claim of team B's data.
fn claim_body(job: &str) -> Value {
    json!({"version": 1, "job": job, "team": "team-b",
           "datasets": [{"name": "b", "location": "default/team-b/"}]})
}

/// The request that aims `method path` at team B's resources: its concrete path (with query) and body. A route
/// this does not know fails the test.
fn request(w: &World, method: &str, path: &str) -> (String, Option<Value>) {
    let id = |p: &str| -> String {
        if p.starts_with("/v1/policies") {
            w.policy.clone()
        } else if p.starts_with("/v1/protections") {
            w.protection.clone()
        } else if p.starts_with("/v1/cleanup/plans") {
            w.plan.clone()
        } else if p.starts_with("/v1/scratch") {
            w.scratch.clone()
        } else if p.starts_with("/v1/claims") {
            w.claim.clone()
        } else if p.starts_with("/v1/tokens") {
            w.victim.clone()
        } else if p.ends_with("/release") {
            w.reservation2.clone()
        } else if p.starts_with("/v1/reservations") {
            w.reservation.clone()
        } else {
            panic!("{method} {p}: an {{id}} this test does not know; add its resource here")
        }
    };
    let concrete = path
        .replace("{team}", "team-b")
        .replace("{scope}", "default")
        .replace("{principal}", &w.victim)
        .replace("{run}", "run-b")
        .replace("{step}", "1")
        .replace("{file}", "rank-00000.safetensors")
        .replace("{job}", "job-b");
    let concrete = if concrete.contains("{id}") {
        concrete.replace("{id}", &id(path))
    } else {
        concrete
    };
    assert!(
        !concrete.contains('{'),
        "{method} {path}: a parameter this test does not know; add its resource here"
    );
    let body = match (method, path) {
        ("GET", "/v1/tokens") => return ("/v1/tokens?team=team-b".into(), None),
        ("GET", "/v1/audit") => return ("/v1/audit?team=team-b".into(), None),
        ("GET", "/v1/read") => return ("/v1/read?location=default/team-b/secret.bin".into(), None),
        ("GET", "/v1/list") => return ("/v1/list?location=default/team-b/".into(), None),
        ("GET", "/v1/coverage") => {
            return ("/v1/coverage?location=default/team-b/".into(), None);
        }
        ("GET", "/v1/claims/{id}/objects") => return (format!("{concrete}?dataset=b"), None),
        ("POST", "/v1/prefetch") => {
            return (
                "/v1/prefetch?location=default/team-b/secret.bin".into(),
                None,
            );
        }
        ("GET", "/v1/ckpt/handoff") => {
            return ("/v1/ckpt/handoff?run=run-b&step=1&rank=0".into(), None);
        }
        ("POST", "/v1/ckpt/handoff") => Some(handoff_body("run-b", &w.b_local, None, vec![])),
        ("POST", "/v1/cache/warm") => Some(json!({"location": "default/team-b/"})),
        ("POST", "/v1/analytics/report") => Some(json!({"location": "default/team-b/",
                                                        "ops": [{"class": "meta_read", "count": 1}]})),
        ("POST", "/v1/cache/pin") => Some(json!({"location": "default/team-b/pinme/"})),
        ("POST", "/v1/cache/unpin") => Some(json!({"location": "default/team-b/pinned/"})),
        ("POST", "/v1/teams") => Some(json!({"name": "team-c"})),
        ("PUT", "/v1/teams/{team}/members/{principal}") => Some(json!({"role": "reader"})),
        ("POST", "/v1/tokens") => Some(json!({"name": "x", "kind": "token", "team": "team-b",
                                              "role": "team_admin"})),
        ("PUT", "/v1/quotas/{team}/{scope}") => Some(json!({"hard_bytes": 1u64 << 40})),
        ("POST", "/v1/quotas/{team}/{scope}/reserve") => Some(json!({"bytes": 1, "objects": 1})),
        ("POST", "/v1/quotas/{team}/{scope}/free") => Some(json!({"bytes": 0, "objects": 0})),
        ("POST", "/v1/quotas/{team}/{scope}/deleted") => {
            return (
                "/v1/quotas/team-b/ckpt/deleted".into(),
                Some(json!({"prefix": "run-b/"})),
            );
        }
        ("POST", "/v1/reservations/{id}/commit") => Some(json!({"bytes": 5, "objects": 1})),
        ("POST", "/v1/reservations/{id}/release") => Some(json!({})),
        ("POST", "/v1/usage/reconcile") | ("POST", "/v1/usage/scan") => {
            Some(json!({"backend": "default"}))
        }
        ("PUT", "/v1/prefixes") => {
            Some(json!({"backend": "default", "prefix": "team-b/sub", "team": "team-b"}))
        }
        ("POST", "/v1/policies") => Some(json!({"team": "team-b", "backend": "default",
                                                "kind": "ttl", "prefix": "team-b/y", "age_secs": 1})),
        ("POST", "/v1/protections") => Some(json!({"kind": "pin", "team": "team-b",
                                                   "backend": "default", "prefix": "team-b/",
                                                   "job": null, "expires_at": null})),
        ("POST", "/v1/cleanup/plans") => Some(json!({"team": "team-b"})),
        ("POST", "/v1/cleanup/plans/{id}/run") | ("POST", "/v1/cleanup/plans/{id}/restore") => {
            Some(json!({}))
        }
        ("POST", "/v1/cleanup/purge") => Some(json!({"grace_secs": 0})),
        ("POST", "/v1/scratch") => Some(json!({"team": "team-b", "bytes": 1, "ttl_secs": 60})),
        ("POST", "/v1/claims") | ("POST", "/v1/claims/validate") => Some(claim_body("job-b2")),
        ("POST", "/v1/claims/{id}/heartbeat") => Some(json!({})),
        ("POST", "/v1/claims/{id}/release") => Some(json!({"reason": "tenancy test"})),
        ("POST", "/v1/claims/{id}/attach") | ("POST", "/v1/claims/{id}/detach") => Some(json!({})),
        ("POST", "/v1/peer/stage") | ("POST", "/v1/peer/held") => {
            Some(json!({"backend": "default", "block_size": 1048576,
                                                  "objects": [{"key": "team-b/secret.bin", "size": 1,
                                                               "etag": null, "version": null, "mtime": 0}]}))
        }
        ("POST", "/v1/peer/pins") => Some(json!({"from": "http://127.0.0.1:9",
                                                 "pins": [{"backend": "memory://tenancy", "prefix": "team-b/"}]})),
        ("POST", "/v1/peer/invalidate") => Some(json!({"from": "http://127.0.0.1:9",
                                                       "changes": [{"backend": "memory://tenancy",
                                                                    "key": "team-b/secret.bin"}]})),
        ("PUT", "/v1/peer/ckpt/{run}/{step}/{file}") => {
            return (
                concrete,
                Some(Value::String("replica of the caller".into())),
            );
        }
        ("GET" | "DELETE", _) => None,
        _ => panic!(
            "{method} {path}: no request (and so no expected outcome) for this route; add it here"
        ),
    };
    (concrete, body)
}

/// Whether `rule` lets `who` act on team B's resource.
fn allowed(rule: &Value, who: Who) -> bool {
    let kind = rule["rule"].as_str().unwrap();
    let need = rule["role"].as_str().map(rank);
    match (kind, who) {
        ("public", _) => true,
        ("cluster", _) => false,
        (_, Who::None | Who::Forged) => false,
        (_, Who::Admin) => true,
        ("any", _) => true,
        ("admin", _) => false,
        ("team" | "owner" | "location", Who::B(r)) => rank(r) >= need.unwrap(),
        ("team" | "owner" | "location", Who::A(_)) => false,
        ("own_team", Who::A(r) | Who::B(r)) => rank(r) >= need.unwrap(),
        (k, _) => panic!("a rule this test does not know: {k}"),
    }
}

/// Routes whose allowed calls change or use up what they name: made last, and only the first allowed caller
/// must find the resource still there.
fn consumes(method: &str, path: &str) -> bool {
    method == "DELETE"
        || path.ends_with("/commit")
        || path.ends_with("/release")
        || path.ends_with("/run")
        || path.ends_with("/restore")
        || path == "/v1/cache/unpin"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_every_caller_against_another_teams_resources() {
    for e in envs().await {
        let w = setup(&e).await;
        let doc = call(&e.app, Method::GET, "/openapi.json", None, None)
            .await
            .1;
        let mut routes: Vec<(String, String, Value)> = Vec::new();
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (m, op) in ops.as_object().unwrap() {
                let rule = op["x-strata-access"].clone();
                assert!(rule.is_object(), "{m} {path} declares no access rule");
                routes.push((m.to_uppercase(), path.clone(), rule));
            }
        }
        assert!(routes.len() >= 55, "only {} routes", routes.len());
        let before = b_state(&e, &w).await;

        // Phase one: every refused call, then nothing of team B changed.
        let mut refused = 0;
        for (m, path, rule) in &routes {
            let (concrete, body) = request(&w, m, path);
            for who in CALLERS {
                if allowed(rule, who) {
                    continue;
                }
                let method = Method::from_bytes(m.as_bytes()).unwrap();
                let (s, v) = call(
                    &e.app,
                    method,
                    &concrete,
                    w.token(who, &e).as_deref(),
                    body.clone(),
                )
                .await;
                let want: &[u16] = match who {
                    Who::None | Who::Forged => &[401],
                    _ => &[403, 404],
                };
                assert!(
                    want.contains(&s),
                    "{who:?} {m} {concrete}: {s} {:.300}, wanted {want:?}",
                    v.to_string()
                );
                assert!(!v.to_string().contains(std::str::from_utf8(SECRET).unwrap()));
                refused += 1;
            }
        }
        assert!(refused > 200, "only {refused} refusals checked");
        assert_eq!(
            b_state(&e, &w).await,
            before,
            "a refused call changed team B's state"
        );

        // Phase two: the allowed calls, those that use things up last.
        routes.sort_by_key(|(m, p, _)| (consumes(m, p), p == "/v1/teams/{team}" && m == "DELETE"));
        for (m, path, rule) in &routes {
            let (concrete, body) = request(&w, m, path);
            let mut first = true;
            for who in CALLERS {
                if !allowed(rule, who) {
                    continue;
                }
                let method = Method::from_bytes(m.as_bytes()).unwrap();
                let (s, v) = call(
                    &e.app,
                    method,
                    &concrete,
                    w.token(who, &e).as_deref(),
                    body.clone(),
                )
                .await;
                let text = v.to_string();
                assert!(s < 500, "{who:?} {m} {concrete}: {s} {v}");
                assert!(
                    s != 401 && s != 403,
                    "{who:?} {m} {concrete} refused: {s} {v}"
                );
                let kind = rule["rule"].as_str().unwrap();
                let b_side = matches!(who, Who::B(_)) || kind != "own_team";
                if s == 404 {
                    // A 404 to an allowed caller is the refusal that hides a resource, unless the caller's own
                    // team has no such resource (own-team routes) or an earlier allowed call used it up.
                    assert!(
                        !b_side
                            || (consumes(m, path) && !first)
                            || m == "GET" && kind == "own_team",
                        "{who:?} {m} {concrete}: 404 {v}"
                    );
                }
                if !matches!(who, Who::B(_) | Who::Admin) {
                    // What another team is allowed to call shows nothing of team B.
                    for needle in [
                        "team-b",
                        std::str::from_utf8(SECRET).unwrap(),
                        std::str::from_utf8(REPLICA).unwrap(),
                        &w.policy,
                        &w.protection,
                        &w.plan,
                        &w.scratch,
                        &w.claim,
                        &w.victim,
                        &w.reservation,
                        &w.reservation2,
                    ] {
                        assert!(
                            !text.contains(needle),
                            "{who:?} {m} {concrete} shows {needle}: {text}"
                        );
                    }
                }
                if let Who::B(_) = who {
                    // Nor does team B see anything of team A (a plan's detail once told every team's bytes).
                    assert!(
                        !text.contains("team-a"),
                        "{who:?} {m} {concrete} shows team-a: {text}"
                    );
                }
                if s < 300 {
                    first = false;
                }
            }
        }
        // What team B's own people and the administrator did to its data is audited.
        let audit = ok(&e.app, Method::GET, "/v1/audit?team=team-b", &e.admin, None).await;
        let actions: Vec<&str> = audit
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["action"].as_str().unwrap())
            .collect();
        for want in [
            "team.create",
            "principal.create",
            "quota.set",
            "prefix.own",
            "policy.add",
            "pin.add",
            "cleanup.plan",
            "scratch.alloc",
        ] {
            assert!(actions.contains(&want), "{want} not audited: {actions:?}");
        }
        e.agent.catalog().close().await;
    }
}

/// Team B's state as its administrator and the administrator see it, its object and its replica.
async fn b_state(e: &Env, w: &World) -> Value {
    let mut out = team_state(e, "team-b").await;
    out.insert(
        "replicas".into(),
        ok(
            &e.app,
            Method::GET,
            "/v1/peer/ckpt/run-b",
            &w.tokens["b-reader"],
            None,
        )
        .await,
    );
    let (s, replica) = call_raw(
        &e.app,
        Method::GET,
        "/v1/peer/ckpt/run-b/1/rank-00000.safetensors",
        Some(&w.tokens["b-reader"]),
        Vec::new(),
    )
    .await;
    out.insert("replica".into(), json!([s, replica]));
    let claims = ok(
        &e.app,
        Method::GET,
        "/v1/claims?released=true",
        &w.tokens["b-reader"],
        None,
    )
    .await;
    let claims: Vec<Value> = claims
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            json!([
                c["id"],
                c["state"],
                c["reason"],
                c["heartbeat_at"],
                c["released_at"]
            ])
        })
        .collect();
    out.insert("claims".into(), json!(claims));
    let obj = std::fs::read(e.dir.path().join("d/objects/team-b/secret.bin")).unwrap();
    out.insert("object".into(), json!(String::from_utf8_lossy(&obj)));
    Value::Object(out)
}
