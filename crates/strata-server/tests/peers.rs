//! The peer API and handed-over saves, as a hostile caller tries them: each team's replicas apart, the
//! cluster credential the only thing an agent sends to another, handoffs confined to what the caller may
//! write, replicas streamed to disk.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::{Method, Request};
use serde_json::{Value, json};
use strata_server::config::Config;
use support::*;
use tower::ServiceExt;

const SECRET: &str = "cluster-secret-of-the-test-0123";

/// Agents whose cluster is `peers` (and the test's secret), with teams A and B owning `default/team-a` and
/// `default/team-b`. Returns each env with A's member, A's reader and B's member tokens.
async fn cluster_envs(peers: Vec<String>) -> Vec<(Env, [String; 3])> {
    let envs = envs_with(move |dir| {
        let secret = dir.join("cluster-secret");
        std::fs::write(&secret, SECRET).unwrap();
        let mut c = Config::default();
        c.cluster.peers = peers.clone();
        c.cluster.secret_file = Some(secret);
        c
    })
    .await;
    let mut out = Vec::new();
    for e in envs {
        for t in ["team-a", "team-b"] {
            create_team(&e, t).await;
            ok(
                &e.app,
                Method::PUT,
                "/v1/prefixes",
                &e.admin,
                Some(json!({"backend": "default", "prefix": format!("{t}/"), "team": t})),
            )
            .await;
        }
        let a_member = token_for(&e, "a-member", "team-a", "member").await;
        let a_reader = token_for(&e, "a-reader", "team-a", "reader").await;
        let b_member = token_for(&e, "b-member", "team-b", "member").await;
        out.push((e, [a_member, a_reader, b_member]));
    }
    out
}

fn objects(e: &Env) -> PathBuf {
    e.dir.path().join("d/objects")
}

async fn put(e: &Env, path: &str, auth: &[(&str, &str)], body: Body) -> (u16, String) {
    let mut req = Request::builder().method(Method::PUT).uri(path);
    for (k, v) in auth {
        req = req.header(*k, *v);
    }
    // As a client sends it (the router in process does not add it).
    if let Some(n) = axum::body::HttpBody::size_hint(&body).exact()
        && !auth.iter().any(|(k, _)| *k == "content-length")
    {
        req = req.header("content-length", n);
    }
    let resp = e
        .app
        .clone()
        .oneshot(req.body(body).unwrap())
        .await
        .unwrap();
    let s = resp.status().as_u16();
    let b = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (s, String::from_utf8_lossy(&b).into())
}

async fn get(e: &Env, path: &str, auth: &[(&str, &str)]) -> (u16, Vec<u8>) {
    let mut req = Request::builder().method(Method::GET).uri(path);
    for (k, v) in auth {
        req = req.header(*k, *v);
    }
    let resp = e
        .app
        .clone()
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let s = resp.status().as_u16();
    let b = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .unwrap();
    (s, b.to_vec())
}

fn bearer(t: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {t}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_teams_replicas_are_its_own() {
    for (e, [a_member, a_reader, b_member]) in cluster_envs(Vec::new()).await {
        let shard = "/v1/peer/ckpt/run-x/1/rank-00000.safetensors";
        let (ba, br, bb) = (bearer(&a_member), bearer(&a_reader), bearer(&b_member));
        let (s, v) = put(&e, shard, &[(ba.0, &ba.1)], Body::from("team a's shard")).await;
        assert_eq!(s, 204, "{v}");
        // A's reader reads it; nobody else sees it under the same name.
        assert_eq!(
            get(&e, shard, &[(br.0, &br.1)]).await,
            (200, b"team a's shard".to_vec())
        );
        let (s, body) = get(&e, shard, &[(bb.0, &bb.1)]).await;
        assert_eq!(s, 404);
        assert!(
            !String::from_utf8_lossy(&body).contains("peer-checkpoints"),
            "no path in errors"
        );
        let (s, _) = get(&e, "/v1/peer/ckpt/run-x", &[(bb.0, &bb.1)]).await;
        assert_eq!(s, 200);
        // B writes and deletes the same names in its own store only: A's replica stays as it was.
        let (s, _) = put(&e, shard, &[(bb.0, &bb.1)], Body::from("team b")).await;
        assert_eq!(s, 204);
        let (s, v) = call(
            &e.app,
            Method::DELETE,
            "/v1/peer/ckpt/run-x/1",
            Some(&b_member),
            None,
        )
        .await;
        assert_eq!(s, 204, "{v}");
        assert_eq!(
            get(&e, shard, &[(ba.0, &ba.1)]).await,
            (200, b"team a's shard".to_vec())
        );
        // A reader writes and deletes nothing.
        let (s, _) = put(&e, shard, &[(br.0, &br.1)], Body::from("x")).await;
        assert_eq!(s, 403);
        let (s, _) = call(
            &e.app,
            Method::DELETE,
            "/v1/peer/ckpt/run-x/1",
            Some(&a_reader),
            None,
        )
        .await;
        assert_eq!(s, 403);
        // No credential, a forged token, a forged cluster key: 401. The cluster key for team A reads A's.
        assert_eq!(get(&e, shard, &[]).await.0, 401);
        let forged = bearer("forged");
        assert_eq!(get(&e, shard, &[(forged.0, &forged.1)]).await.0, 401);
        let bad_key = [
            ("x-strata-cluster-key", "not-the-secret-0123456789"),
            ("x-strata-team", "team-a"),
        ];
        assert_eq!(get(&e, shard, &bad_key).await.0, 401);
        let key_a = [
            ("x-strata-cluster-key", SECRET),
            ("x-strata-team", "team-a"),
        ];
        assert_eq!(
            get(&e, shard, &key_a).await,
            (200, b"team a's shard".to_vec())
        );
        // The cluster key is no token anywhere else.
        let (s, _) = get(&e, "/v1/teams", &key_a).await;
        assert_eq!(s, 401);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_streamed_to_disk_not_held_in_memory() {
    let (e, [a_member, ..]) = cluster_envs(Vec::new()).await.remove(0);
    let store = e
        .dir
        .path()
        .join("d/peer-checkpoints/teams/team-a/run-big/step-00000000000000000001");
    const CHUNK: usize = 1 << 20;
    const CHUNKS: usize = 64;
    // While the 40th MiB is being sent, the first 32 must already be in the file on disk.
    let seen_on_disk = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = seen_on_disk.clone();
    let body = futures::stream::iter(0..CHUNKS).map(move |i| {
        if i == 40 {
            let on_disk = std::fs::read_dir(&store)
                .map(|d| {
                    d.filter_map(|f| f.ok())
                        .filter(|f| f.file_name().to_string_lossy().contains(".tmp-"))
                        .map(|f| f.metadata().map_or(0, |m| m.len()))
                        .sum::<u64>()
                })
                .unwrap_or(0);
            seen.store(on_disk, std::sync::atomic::Ordering::SeqCst);
        }
        Ok::<_, std::io::Error>(bytes::Bytes::from(vec![i as u8; CHUNK]))
    });
    use futures::StreamExt;
    let ba = bearer(&a_member);
    let len = (CHUNK * CHUNKS).to_string();
    let (s, v) = put(
        &e,
        "/v1/peer/ckpt/run-big/1/rank-00000.safetensors",
        &[(ba.0, &ba.1), ("content-length", &len)],
        Body::from_stream(body),
    )
    .await;
    assert_eq!(s, 204, "{v}");
    let on_disk = seen_on_disk.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        on_disk >= 32 * CHUNK as u64,
        "only {on_disk} bytes were on disk while the 40th MiB was sent: the body is buffered"
    );
    let (s, got) = get(
        &e,
        "/v1/peer/ckpt/run-big/1/rank-00000.safetensors",
        &[(ba.0, &ba.1)],
    )
    .await;
    assert_eq!((s, got.len()), (200, CHUNK * CHUNKS));
    // A declared checksum that does not match: nothing stored, no temporary file left.
    let (s, _) = put(
        &e,
        "/v1/peer/ckpt/run-big/2/rank-00000.safetensors",
        &[
            (ba.0, &ba.1),
            ("x-strata-blake3", blake3::hash(b"other").to_hex().as_ref()),
        ],
        Body::from("bytes"),
    )
    .await;
    assert_eq!(s, 422);
    let dir2 = e
        .dir
        .path()
        .join("d/peer-checkpoints/teams/team-a/run-big/step-00000000000000000002");
    assert_eq!(std::fs::read_dir(&dir2).map_or(0, |d| d.count()), 0);
}

async fn handoff_verdict(e: &Env, token: &str, run: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (s, v) = call(
            &e.app,
            Method::GET,
            &format!("/v1/ckpt/handoff?run={run}&step=1&rank=0"),
            Some(token),
            None,
        )
        .await;
        assert_eq!(s, 200, "{v}");
        if v["state"] != "pending" || Instant::now() > deadline {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Hand step 1 of `run-a` in `dir` over (to be uploaded to `remote`) and wait for the verdict.
async fn hand_over(e: &Env, token: &str, dir: &Path, remote: &str) -> Value {
    let (s, v) = call(
        &e.app,
        Method::POST,
        "/v1/ckpt/handoff",
        Some(token),
        Some(handoff_body("run-a", dir, Some(remote.to_string()), vec![])),
    )
    .await;
    assert_eq!(s, 202, "{v}");
    handoff_verdict(e, token, "run-a").await
}

/// A listener on loopback that records every request's head and answers 500.
fn listener() -> (String, std::sync::mpsc::Receiver<String>) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", l.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let mut head = String::new();
            let mut r = BufReader::new(s.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let _ = tx.send(head);
            let _ = s.write_all(
                b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_goes_only_where_its_caller_may_write() {
    let (member_peer, member_heads) = listener();
    let (chosen, chosen_heads) = listener();
    for (e, [a_member, a_reader, b_member]) in cluster_envs(vec![member_peer.clone()]).await {
        let root = objects(&e);
        let a_dir = root.join("team-a/ckpt");
        let b_dir = root.join("team-b/ckpt");
        for d in [&a_dir, &b_dir] {
            std::fs::create_dir_all(d).unwrap();
        }
        local_save(&a_dir, "run-a").await;
        local_save(&b_dir, "run-b").await;
        let post = |t: String, body: Value| {
            let app = e.app.clone();
            async move { call(&app, Method::POST, "/v1/ckpt/handoff", Some(&t), Some(body)).await }
        };
        let b_remote = format!("file://{}/team-b/remote", root.display());
        let a_remote = format!("file://{}/team-a/remote", root.display());

        // A's reader hands nothing over, even into A's own space.
        let (s, v) = post(
            a_reader.clone(),
            handoff_body("run-a", &a_dir, Some(a_remote.clone()), vec![]),
        )
        .await;
        assert_eq!(s, 403, "{v}");
        // Another team's checkpoint directory as the local tier: refused (it would be copied out).
        let (s, v) = post(
            a_member.clone(),
            handoff_body("run-b", &b_dir, Some(a_remote.clone()), vec![]),
        )
        .await;
        assert_eq!(s, 403, "{v}");
        // Another team's prefix as the object store: refused (objects written there, retention deleting).
        let (s, v) = post(
            a_member.clone(),
            handoff_body("run-a", &a_dir, Some(b_remote.clone()), vec![]),
        )
        .await;
        assert_eq!(s, 403, "{v}");
        // A directory outside every backend, or one that does not exist: the same refusal, telling nothing.
        let (s1, v1) = post(
            a_member.clone(),
            handoff_body("run-a", Path::new("/etc"), None, vec![]),
        )
        .await;
        let (s2, v2) = post(
            a_member.clone(),
            handoff_body("run-a", Path::new("/nonexistent/x"), None, vec![]),
        )
        .await;
        assert_eq!((s1, s2), (403, 403), "{v1} {v2}");
        assert_eq!(
            v1["message"].as_str().unwrap().replace("/etc", "P"),
            v2["message"]
                .as_str()
                .unwrap()
                .replace("/nonexistent/x", "P")
        );
        // A peer the caller chose: refused before any connection, with any credential.
        let (s, v) = post(
            a_member.clone(),
            handoff_body("run-a", &a_dir, None, vec![chosen.clone()]),
        )
        .await;
        assert_eq!(s, 403, "{v}");
        assert!(
            v["message"]
                .as_str()
                .unwrap()
                .contains("not an agent of this agent's cluster"),
            "{v}"
        );
        assert!(
            chosen_heads
                .recv_timeout(Duration::from_millis(300))
                .is_err(),
            "a chosen URL was called"
        );

        // Its own team's directories: the save is finished, the upload charged to the team.
        let (s, v) = post(
            a_member.clone(),
            handoff_body("run-a", &a_dir, Some(a_remote.clone()), vec![]),
        )
        .await;
        assert_eq!(s, 202, "{v}");
        let st = handoff_verdict(&e, &a_member, "run-a").await;
        assert_eq!(st["state"], "done", "{st}");
        assert!(
            root.join("team-a/remote/run-a/step-00000000000000000001/manifest.json")
                .exists()
        );
        let q = ok(&e.app, Method::GET, "/v1/quotas/team-a", &e.admin, None).await;
        let used = q
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["scope"] == "default")
            .cloned();
        assert!(
            used.is_some_and(|u| u["used_bytes"].as_i64().unwrap() > 100_000),
            "{q}"
        );
        // B does not see A's handoffs.
        let (s, _) = call(
            &e.app,
            Method::GET,
            "/v1/ckpt/handoff?run=run-a&step=1&rank=0",
            Some(&b_member),
            None,
        )
        .await;
        assert_eq!(s, 404);

        // A member of the cluster gets the replica with the cluster credential for team A, never a token.
        let (s, v) = post(
            a_member.clone(),
            handoff_body("run-a", &a_dir, None, vec![member_peer.clone()]),
        )
        .await;
        assert_eq!(s, 202, "{v}");
        let head = member_heads
            .recv_timeout(Duration::from_secs(20))
            .expect("the member peer was called");
        let lower = head.to_ascii_lowercase();
        assert!(
            !lower.contains("authorization"),
            "a token was sent to a peer:\n{head}"
        );
        assert!(
            lower.contains(&format!("x-strata-cluster-key: {SECRET}")),
            "{head}"
        );
        assert!(lower.contains("x-strata-team: team-a"), "{head}");
        while member_heads
            .recv_timeout(Duration::from_millis(200))
            .is_ok()
        {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_record_cannot_point_outside_its_checkpoint() {
    let (e, [a_member, ..]) = cluster_envs(Vec::new()).await.remove(0);
    let root = objects(&e);
    let a_dir = root.join("team-a/ckpt");
    std::fs::create_dir_all(&a_dir).unwrap();
    local_save(&a_dir, "run-a").await;
    let step = a_dir.join("run-a/step-00000000000000000001");
    let outside = e.dir.path().join("outside.bin");
    std::fs::write(&outside, b"a file of the agent's host").unwrap();
    let rec_path = step.join("rank-00000.json");
    let mut rec: Value = serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    for target in [
        outside.display().to_string(),
        "../../../outside.bin".into(),
        "/nonexistent".into(),
    ] {
        rec["file"] = json!(target);
        std::fs::write(&rec_path, rec.to_string()).unwrap();
        let st = hand_over(
            &e,
            &a_member,
            &a_dir,
            &format!("file://{}/team-a/r", root.display()),
        )
        .await;
        assert_eq!(st["state"], "failed", "{st}");
        assert_eq!(st["error_kind"], "corrupt", "{st}");
        let msg = st["error"].as_str().unwrap();
        assert!(
            !msg.contains("does not exist") && !msg.contains("does not match"),
            "{msg}"
        );
        assert!(
            msg.contains("must be named rank-00000.safetensors"),
            "{msg}"
        );
    }
    // A link in place of the shard is not followed.
    rec["file"] = json!("rank-00000.safetensors");
    std::fs::write(&rec_path, rec.to_string()).unwrap();
    std::fs::remove_file(step.join("rank-00000.safetensors")).unwrap();
    std::os::unix::fs::symlink(&outside, step.join("rank-00000.safetensors")).unwrap();
    let st = hand_over(
        &e,
        &a_member,
        &a_dir,
        &format!("file://{}/team-a/r2", root.display()),
    )
    .await;
    assert_eq!(st["state"], "failed", "{st}");
    assert!(
        !root
            .join("team-a/r2/run-a/step-00000000000000000001/rank-00000.safetensors")
            .exists()
    );
}
