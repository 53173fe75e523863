//! Reconcile tests of Datasets, one scenario per path: counted on the agents, a claim for `prefetch` and `pin`
//! that follows the newest version, refusals, a failed staging not retried, an agent away, deletion.

use super::*;
use crate::{Dataset, reconcile_dataset};
use strata_claim::{Coverage, MemberCoverage};

const DS: &str = "imagenet";
const MEMBER: &str = "http://10.0.0.1:7070";

fn dataset(status: Value, cache: Value, deleting: bool) -> Dataset {
    let mut meta = json!({"name": DS, "namespace": NS, "uid": UID, "generation": 1, "resourceVersion": "10",
                          "finalizers": [FINALIZER]});
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    let mut v = json!({"apiVersion": "strata.dev/v1alpha1", "kind": "Dataset", "metadata": meta,
                       "spec": {"source": "origin/imagenet/", "cache": cache}});
    if !status.is_null() {
        v["status"] = status;
    }
    serde_json::from_value(v).unwrap()
}

fn ds_path(sub: &str) -> String {
    format!("/apis/strata.dev/v1alpha1/namespaces/{NS}/datasets/{DS}{sub}")
}

/// The agents hold `held` bytes of version `version` (4 MiB, 4 objects), all on [`MEMBER`].
fn covered(version: &str, held: u64) -> Coverage {
    Coverage {
        location: "origin/imagenet/".into(),
        version: version.into(),
        objects: 4,
        objects_held: if held == 4 << 20 { 4 } else { 0 },
        bytes_total: 4 << 20,
        bytes_held: held,
        blocks_total: 4,
        blocks_held: held >> 20,
        members: vec![MemberCoverage {
            member: MEMBER.into(),
            blocks_total: 4,
            blocks_held: held >> 20,
            bytes_total: 4 << 20,
            bytes_held: held,
            error: None,
        }],
        complete: true,
    }
}

/// The agents' EndpointSlice: [`MEMBER`] ready on node-a.
fn node_a() -> Arc<crate::EndpointMembers> {
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "strata-agents-x"}, "addressType": "IPv4", "ports": [{"name": "api", "port": 7070}],
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "node-a"}]}))
    .unwrap();
    Arc::new(crate::EndpointMembers::fixed(&[Arc::new(slice)]))
}

fn settings() -> Settings {
    Settings {
        dataset_poll: Duration::from_secs(30),
        ..Settings::default()
    }
}

/// One reconcile of `ds` against `steps`; the requests' bodies, in order.
async fn run_ds(agent: &Arc<Agent>, ds: Dataset, steps: Vec<Step>) -> (Result<Action>, Vec<Value>) {
    let (client, server) = mock_api(steps);
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "strata-operator".into()),
        client,
        claims: agent.clone(),
        settings: settings(),
        metrics: Metrics::new(),
        agent_nodes: Some(node_a()),
    });
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        reconcile_dataset(Arc::new(ds), ctx),
    )
    .await
    .expect("a reconcile never hangs");
    (r, server.await.unwrap())
}

/// A pass that writes the status and says so with `events` events.
fn writes(ds: &Dataset, events: usize) -> Vec<Step> {
    let mut v = vec![
        ns_step(Some("vision")),
        step("PATCH", &ds_path("/status"), 200, echo_ds(ds)),
    ];
    v.extend((0..events).map(|_| event_step()));
    v
}

fn echo_ds(ds: &Dataset) -> Value {
    serde_json::to_value(ds).unwrap()
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[tokio::test]
async fn a_prefetched_dataset_is_claimed_counted_until_cached_on_its_node_and_a_second_pass_writes_nothing()
 {
    let agent = Arc::new(Agent::default());
    *agent.coverage.lock() = Some(covered("v1", 0));
    let ds = dataset(
        Value::Null,
        json!({"mode": "prefetch", "replicas": 2}),
        false,
    );
    let (r, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    assert_eq!(r.unwrap(), Action::requeue(settings().staging_poll));
    let st = &bodies[1]["status"];
    assert_eq!(st["claimId"], "clm_1", "{st}");
    assert_eq!(st["claimVersion"], "v1");
    assert_eq!(st["cachedFraction"], "0%");
    assert_eq!(st["versions"][0]["totalBytes"], 4 << 20);
    assert_eq!(condition(st, "Ready")["reason"], "Staging");
    assert_eq!(condition(st, "Cached")["reason"], "Partial");
    let c = agent.claims.lock()[0].clone();
    assert_eq!(c.job, "vision-ns/dataset:imagenet/0a1b2c3d");
    assert_eq!(
        (c.team.as_str(), c.spec.datasets[0].mode),
        ("vision", strata_claim::Mode::Stage)
    );
    assert_eq!(c.spec.datasets[0].location, "origin/imagenet/");
    assert_eq!(c.spec.datasets[0].replicas, Some(2), "the copies asked for");
    assert_eq!(
        agent.coverages.lock()[0],
        ("origin/imagenet/".into(), "vision".into())
    );

    // Staged: Ready and Cached, on node-a; each condition's change an event.
    agent.set("clm_1", |c| c.state = ClaimState::Ready);
    *agent.coverage.lock() = Some(covered("v1", 4 << 20));
    let staging = with_status(&ds, &bodies[1]);
    let (r, bodies) = run_ds(&agent, staging.clone(), writes(&staging, 2)).await;
    assert_eq!(r.unwrap(), Action::requeue(settings().dataset_poll));
    let st = &bodies[1]["status"];
    assert_eq!(st["cachedFraction"], "100%", "{st}");
    assert_eq!(st["nodes"], json!(["node-a"]));
    assert_eq!(condition(st, "Ready")["reason"], "Staged");
    assert_eq!(condition(st, "Cached")["status"], "True");
    assert_eq!(bodies[2]["reason"], "Staged");
    assert_eq!(bodies[3]["reason"], "Cached");

    // Nothing changed: no write, no event, no claim.
    let ready = with_status(&staging, &bodies[1]);
    let (r, _) = run_ds(&agent, ready, vec![ns_step(Some("vision"))]).await;
    assert_eq!(r.unwrap(), Action::requeue(settings().dataset_poll));
    assert_eq!(agent.submits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_newer_version_replaces_a_settled_claim_and_a_failed_staging_is_not_tried_again_until_the_spec_changes()
 {
    let agent = Arc::new(Agent::default());
    *agent.coverage.lock() = Some(covered("v1", 4 << 20));
    let ds = dataset(Value::Null, json!({"mode": "pin"}), false);
    let (_, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    agent.set("clm_1", |c| c.state = ClaimState::Ready);
    let ready = with_status(&ds, &bodies[1]);
    let (_, bodies) = run_ds(&agent, ready.clone(), writes(&ready, 1)).await;
    let ready = with_status(&ready, &bodies[1]);
    assert_eq!(condition(&bodies[1]["status"], "Ready")["reason"], "Staged");

    // The source changed: the settled claim of v1 is released (an event), one for v2 submitted.
    *agent.coverage.lock() = Some(covered("v2", 3 << 20));
    let mut steps = vec![ns_step(Some("vision")), event_step()];
    steps.extend(writes(&ready, 2).into_iter().skip(1));
    let (_, bodies) = run_ds(&agent, ready.clone(), steps).await;
    assert_eq!(bodies[1]["reason"], "Released");
    let st = &bodies[2]["status"];
    assert_eq!(
        (st["claimId"].as_str(), st["claimVersion"].as_str()),
        (Some("clm_2"), Some("v2")),
        "{st}"
    );
    assert_eq!(st["cachedFraction"], "75%");
    assert_eq!(agent.releases.load(Ordering::SeqCst), 1);
    assert_eq!(agent.claims.lock()[0].state, ClaimState::Released);

    // Its staging fails: released, the version and the reason recorded, a Warning event.
    agent.set("clm_2", |c| {
        c.state = ClaimState::Failed;
        c.reason = "1 of 4 blocks not in the cache after staging: origin/imagenet/a: gone".into();
    });
    let staging = with_status(&ready, &bodies[2]);
    let mut steps = vec![ns_step(Some("vision")), event_step()];
    steps.extend(writes(&staging, 1).into_iter().skip(1));
    let (r, bodies) = run_ds(&agent, staging.clone(), steps).await;
    assert_eq!(r.unwrap(), Action::requeue(settings().dataset_poll));
    let st = &bodies[2]["status"];
    assert_eq!(st["failedVersion"], "v2", "{st}");
    assert!(st.get("claimId").is_none_or(Value::is_null), "{st}");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("blocks not in the cache"),
        "{st}"
    );
    assert_eq!(condition(st, "Ready")["reason"], "StagingFailed");
    assert_eq!(bodies[3]["type"], "Warning");
    assert_eq!(agent.releases.load(Ordering::SeqCst), 2);

    // Looked at again, the same version: nothing submitted, nothing written.
    let failed = with_status(&staging, &bodies[2]);
    let (_, _) = run_ds(&agent, failed.clone(), vec![ns_step(Some("vision"))]).await;
    assert_eq!(agent.submits.load(Ordering::SeqCst), 2);

    // The spec changed (a new generation): tried again.
    let mut changed = failed.clone();
    changed.metadata.generation = Some(2);
    let (_, bodies) = run_ds(&agent, changed.clone(), writes(&changed, 1)).await;
    assert_eq!(agent.submits.load(Ordering::SeqCst), 3);
    assert_eq!(bodies[1]["status"]["claimId"], "clm_3");
}

#[tokio::test]
async fn refusals_say_why_with_the_field_and_make_no_claim() {
    let agent = Arc::new(Agent::default());
    // More copies than a claim may keep: refused before the agents are asked anything.
    let ds = dataset(
        Value::Null,
        json!({"mode": "prefetch", "replicas": 9}),
        false,
    );
    let (r, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    assert_eq!(
        r.unwrap(),
        Action::requeue(Settings::default().refused_retry)
    );
    let st = &bodies[1]["status"];
    assert_eq!(condition(st, "Ready")["reason"], "Refused");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("spec.cache.replicas: 9"),
        "{st}"
    );
    assert_eq!(bodies[2]["type"], "Warning");
    assert!(agent.coverages.lock().is_empty());

    // No team label on the namespace.
    let ds = dataset(Value::Null, json!({"mode": "prefetch"}), false);
    let mut steps = writes(&ds, 2);
    steps[0] = ns_step(None);
    let (_, bodies) = run_ds(&agent, ds.clone(), steps).await;
    assert!(
        bodies[1]["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("strata.dev/team")
    );

    // A source the agents cannot list (missing, or the team may not read it).
    let (_, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    let reason = bodies[1]["status"]["reason"].as_str().unwrap().to_string();
    assert!(
        reason.starts_with("spec.source: no objects under"),
        "{reason}"
    );

    // An empty one.
    *agent.coverage.lock() = Some(Coverage {
        objects: 0,
        ..covered("v0", 0)
    });
    let (_, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    assert!(
        bodies[1]["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("no objects under")
    );

    // Refused by the agents at submission (quota): StagingFailed, the version recorded.
    *agent.coverage.lock() = Some(covered("v1", 0));
    *agent.refuse.lock() = Some(Error::new(
        ErrorKind::ResourceExhausted,
        "datasets[0] (pin): over quota",
    ));
    let (_, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    let st = &bodies[1]["status"];
    assert_eq!(condition(st, "Ready")["reason"], "StagingFailed", "{st}");
    assert_eq!(st["failedVersion"], "v1");
    assert!(
        st["reason"].as_str().unwrap().contains("over quota"),
        "{st}"
    );
    assert!(agent.claims.lock().is_empty());
}

#[tokio::test]
async fn an_unreachable_agent_is_a_retryable_error_and_writes_nothing() {
    let agent = Arc::new(Agent::default());
    agent.away.store(true, Ordering::SeqCst);
    let ds = dataset(Value::Null, json!({"mode": "prefetch"}), false);
    let (r, _) = run_ds(&agent, ds, vec![ns_step(Some("vision"))]).await;
    let e = r.unwrap_err();
    assert!(e.is_retryable(), "{e}");
}

#[tokio::test]
async fn deletion_releases_the_datasets_claim_then_removes_the_finalizer() {
    let agent = Arc::new(Agent::default());
    *agent.coverage.lock() = Some(covered("v1", 0));
    let ds = dataset(Value::Null, json!({"mode": "prefetch"}), false);
    let (_, bodies) = run_ds(&agent, ds.clone(), writes(&ds, 2)).await;
    let mut deleting = with_status(&ds, &bodies[1]);
    deleting.metadata.deletion_timestamp = dataset(Value::Null, json!({}), true)
        .metadata
        .deletion_timestamp;
    let (r, bodies) = run_ds(
        &agent,
        deleting.clone(),
        vec![
            event_step(),
            step("PATCH", &ds_path(""), 200, echo_ds(&deleting)),
        ],
    )
    .await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert_eq!(bodies[0]["reason"], "Released");
    assert!(
        bodies[1].to_string().contains("/metadata/finalizers/0"),
        "{}",
        bodies[1]
    );
    assert_eq!(agent.claims.lock()[0].state, ClaimState::Released);
}
