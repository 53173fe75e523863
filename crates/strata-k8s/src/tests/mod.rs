//! Reconcile tests, one scenario per path: kube's client talks to a tower-test mock answering as the API
//! server would, request by request in the order the reconcile must make them (an unexpected request fails
//! the test); the agent's claims API is answered by [`Agent`], a table of claims with the agent's rules
//! (one live claim per team and job, refusals, an agent that is away).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use http::{Request, Response};
use kube::Client;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use parking_lot::Mutex;
use serde_json::{Value, json};
use strata_claim::{ClaimSpec, ClaimState, ClaimStatus, Coverage, JobUsage, Progress};
use strata_types::{Error, ErrorKind, Result};

use crate::{ClaimPhase, Claims, Context, DataClaim, FINALIZER, Metrics, Settings, reconcile};

const NS: &str = "vision-ns";
const NAME: &str = "train-run";
const UID: &str = "0a1b2c3d-0000-4000-8000-000000000001";

/// The agent, as far as the reconciler sees it.
#[derive(Default)]
struct Agent {
    claims: Mutex<Vec<ClaimStatus>>,
    away: AtomicBool,
    refuse: Mutex<Option<Error>>,
    submits: AtomicU32,
    releases: AtomicU32,
    /// (agent, claim) of every attach asked for.
    attaches: Mutex<Vec<(String, String)>>,
    /// What coverage answers (`None`: the location is missing).
    coverage: Mutex<Option<Coverage>>,
    /// (location, team) of every coverage asked for.
    coverages: Mutex<Vec<(String, String)>>,
}

impl Agent {
    fn check(&self) -> Result<()> {
        if self.away.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Unavailable, "connection refused"));
        }
        Ok(())
    }
    fn set(&self, id: &str, f: impl FnOnce(&mut ClaimStatus)) {
        let mut all = self.claims.lock();
        f(all.iter_mut().find(|c| c.id == id).unwrap());
    }
}

impl Claims for Arc<Agent> {
    async fn submit(&self, spec: &ClaimSpec) -> Result<ClaimStatus> {
        self.check()?;
        self.submits.fetch_add(1, Ordering::SeqCst);
        if let Some(e) = self.refuse.lock().clone() {
            return Err(e);
        }
        let mut all = self.claims.lock();
        if all
            .iter()
            .any(|c| c.job == spec.job && c.team == spec.team && c.state != ClaimState::Released)
        {
            return Err(Error::new(ErrorKind::AlreadyExists, "job has a live claim"));
        }
        let c = claim(&format!("clm_{}", all.len() + 1), spec);
        all.push(c.clone());
        Ok(c)
    }
    async fn get(&self, id: &str) -> Result<ClaimStatus> {
        self.check()?;
        self.claims
            .lock()
            .iter()
            .find(|c| c.id == id)
            .cloned()
            .ok_or_else(|| Error::new(ErrorKind::NotFound, "no such claim"))
    }
    async fn find_live(&self, team: &str, job: &str) -> Result<Option<ClaimStatus>> {
        self.check()?;
        Ok(self
            .claims
            .lock()
            .iter()
            .find(|c| c.team == team && c.job == job && c.state != ClaimState::Released)
            .cloned())
    }
    async fn heartbeat(&self, id: &str) -> Result<()> {
        self.check()?;
        self.set(id, |c| c.heartbeat_at = now());
        Ok(())
    }
    async fn coverage(&self, location: &str, team: &str) -> Result<Coverage> {
        self.check()?;
        self.coverages
            .lock()
            .push((location.to_string(), team.to_string()));
        self.coverage.lock().clone().ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no objects under {location:?}"),
            )
        })
    }
    async fn attach(&self, agent: &str, id: &str) -> Result<()> {
        self.check()?;
        self.attaches
            .lock()
            .push((agent.to_string(), id.to_string()));
        Ok(())
    }
    async fn release(&self, id: &str, reason: &str) -> Result<()> {
        self.check()?;
        self.releases.fetch_add(1, Ordering::SeqCst);
        self.set(id, |c| {
            c.state = ClaimState::Released;
            c.reason = reason.to_string();
        });
        Ok(())
    }
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn claim(id: &str, spec: &ClaimSpec) -> ClaimStatus {
    ClaimStatus {
        id: id.to_string(),
        job: spec.job.clone(),
        team: spec.team.clone(),
        principal: "p_operator".into(),
        state: ClaimState::Staging,
        reason: String::new(),
        progress: Progress {
            objects_total: 4,
            bytes_total: 4 << 20,
            blocks_total: 4,
            ..Progress::default()
        },
        datasets: spec
            .datasets
            .iter()
            .map(|d| strata_claim::DatasetStatus {
                name: d.name.clone(),
                location: d.location.clone(),
                mode: format!("{:?}", d.mode).to_lowercase(),
                objects: 4,
                bytes: 4 << 20,
                mount: d.mount.clone(),
            })
            .collect(),
        scratch_path: None,
        env: [("STRATA_CLAIM".to_string(), id.to_string())].into(),
        mount_gid: None,
        usage: JobUsage::default(),
        spec: spec.clone(),
        created_at: now(),
        deadline_at: now() + 3600,
        ready_at: None,
        heartbeat_at: now(),
        released_at: None,
    }
}

fn dataclaim(finalizer: bool, status: Value, deleting: bool) -> DataClaim {
    let mut meta = json!({"name": NAME, "namespace": NS, "uid": UID, "generation": 1,
                          "resourceVersion": "10"});
    if finalizer {
        meta["finalizers"] = json!([FINALIZER]);
    }
    if deleting {
        meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    let mut v = json!({
        "apiVersion": "strata.dev/v1alpha1", "kind": "DataClaim", "metadata": meta,
        "spec": {"datasets": [{"name": "train", "location": "origin/vision/train/"}]},
    });
    if !status.is_null() {
        v["status"] = status;
    }
    serde_json::from_value(v).unwrap()
}

/// One expected request: method, path (with query), and the answer.
struct Step {
    method: &'static str,
    path: String,
    code: u16,
    reply: Value,
}

fn step(method: &'static str, path: &str, code: u16, reply: Value) -> Step {
    Step {
        method,
        path: path.to_string(),
        code,
        reply,
    }
}

fn ns_step(team: Option<&str>) -> Step {
    let mut labels = json!({});
    if let Some(t) = team {
        labels["strata.dev/team"] = json!(t);
    }
    step(
        "GET",
        &format!("/api/v1/namespaces/{NS}"),
        200,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": labels}}),
    )
}

fn event_step() -> Step {
    step(
        "POST",
        &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        201,
        json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e", "namespace": NS},
               "eventTime": "2026-01-01T00:00:00.000000Z"}),
    )
}

/// A pass that reads the namespace (labelled `team`), writes `dc`'s status and says so with an event.
fn write_steps(team: Option<&str>, dc: &DataClaim) -> Vec<Step> {
    vec![
        ns_step(team),
        step("PATCH", &claim_path("/status"), 200, echo(dc)),
        event_step(),
    ]
}

/// The status patch in `bodies[1]` says Failed with a reason containing `needle`.
fn assert_failed(bodies: &[Value], needle: &str) {
    let st = &bodies[1]["status"];
    assert_eq!(st["phase"], "Failed", "{st}");
    let reason = st["reason"].as_str().unwrap_or_default();
    assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
}

fn claim_path(sub: &str) -> String {
    format!("/apis/strata.dev/v1alpha1/namespaces/{NS}/dataclaims/{NAME}{sub}")
}

/// Run one reconcile of `dc` against `steps`; the requests' bodies, in order.
/// A client whose API server answers `steps` in order; the task yields the requests' bodies once the client
/// is dropped (and fails on a request not expected, or one expected and never made).
fn mock_api(steps: Vec<Step>) -> (Client, tokio::task::JoinHandle<Vec<Value>>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(async move {
        let mut bodies = Vec::new();
        let mut steps = steps.into_iter();
        while let Some((req, send)) = handle.next_request().await {
            let (method, path) = (req.method().to_string(), req.uri().to_string());
            let body = req.into_body().collect_bytes().await.unwrap();
            let Some(s) = steps.next() else {
                panic!("unexpected request {method} {path}");
            };
            assert_eq!(
                (method.as_str(), path.split('?').next().unwrap()),
                (s.method, s.path.as_str()),
                "request {}",
                bodies.len() + 1
            );
            bodies.push(serde_json::from_slice(&body).unwrap_or(Value::Null));
            let resp = Response::builder()
                .status(s.code)
                .body(Body::from(serde_json::to_vec(&s.reply).unwrap()))
                .unwrap();
            send.send_response(resp);
        }
        let left: Vec<String> = steps.map(|s| format!("{} {}", s.method, s.path)).collect();
        assert!(left.is_empty(), "requests never made: {left:?}");
        bodies
    });
    (Client::new(svc, "default"), server)
}

/// Run one reconcile of `dc` against `steps`; the requests' bodies, in order.
async fn run(
    agent: &Arc<Agent>,
    settings: Settings,
    dc: DataClaim,
    steps: Vec<Step>,
) -> (Result<Action>, Vec<Value>) {
    run_with(agent, settings, dc, steps, None).await
}

/// [`run`], with the agents' nodes known.
async fn run_with(
    agent: &Arc<Agent>,
    settings: Settings,
    dc: DataClaim,
    steps: Vec<Step>,
    agent_nodes: Option<Arc<crate::EndpointMembers>>,
) -> (Result<Action>, Vec<Value>) {
    let (client, server) = mock_api(steps);
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), "strata-operator".into()),
        client,
        claims: agent.clone(),
        settings,
        metrics: Metrics::new(),
        agent_nodes,
    });
    let r = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(dc), ctx))
        .await
        .expect("a reconcile never hangs");
    let bodies = server.await.unwrap();
    (r, bodies)
}

/// `dc` after the API server applied the merge patch `patch` (RFC 7386: `null` removes).
fn with_status<K: serde::Serialize + serde::de::DeserializeOwned>(dc: &K, patch: &Value) -> K {
    fn merge(target: &mut Value, patch: &Value) {
        match (target.as_object_mut(), patch.as_object()) {
            (Some(t), Some(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(Value::Null), v);
                    }
                }
            }
            _ => *target = patch.clone(),
        }
    }
    let mut v = serde_json::to_value(dc).unwrap();
    merge(&mut v, patch);
    serde_json::from_value(v).unwrap()
}

fn echo(dc: &DataClaim) -> Value {
    serde_json::to_value(dc).unwrap()
}

#[tokio::test]
async fn a_new_claim_gets_the_finalizer_first_and_nothing_else() {
    let agent = Arc::new(Agent::default());
    let dc = dataclaim(false, Value::Null, false);
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        vec![step(
            "PATCH",
            &claim_path(""),
            200,
            echo(&dataclaim(true, Value::Null, false)),
        )],
    )
    .await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert!(bodies[0].to_string().contains(FINALIZER), "{:?}", bodies[0]);
    assert_eq!(
        agent.submits.load(Ordering::SeqCst),
        0,
        "no claim before the finalizer"
    );
}

#[tokio::test]
async fn a_claim_is_submitted_as_the_namespaces_team_then_staging_then_ready_and_a_second_pass_writes_nothing()
 {
    let agent = Arc::new(Agent::default());
    let dc = dataclaim(true, Value::Null, false);
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        write_steps(Some("vision"), &dc),
    )
    .await;
    assert_eq!(
        r.unwrap(),
        Action::requeue(Settings::default().staging_poll)
    );
    let status = &bodies[1]["status"];
    assert_eq!(status["phase"], "Staging", "{status}");
    assert_eq!(status["claimId"], "clm_1");
    assert_eq!(status["team"], "vision");
    assert_eq!(status["progress"]["blocksTotal"], 4);
    let submitted = agent.claims.lock()[0].clone();
    assert_eq!(submitted.team, "vision");
    assert_eq!(submitted.job, "vision-ns/train-run/0a1b2c3d");
    assert_eq!(
        bodies[2]["reason"], "Staging",
        "an event says so: {}",
        bodies[2]
    );

    // The same claim again, unchanged at the agent: no write, no event.
    let staged = with_status(&dc, &bodies[1]);
    let (r, _) = run(
        &agent,
        Settings::default(),
        staged.clone(),
        vec![ns_step(Some("vision"))],
    )
    .await;
    assert_eq!(
        r.unwrap(),
        Action::requeue(Settings::default().staging_poll)
    );
    assert_eq!(agent.submits.load(Ordering::SeqCst), 1);

    // Progress, then ready: each written once, with its event for the phase change.
    agent.set("clm_1", |c| {
        c.progress.bytes_done = 2 << 20;
        c.progress.blocks_held = 2;
        c.progress.eta_secs = Some(7);
    });
    let (_, bodies) = run(
        &agent,
        Settings::default(),
        staged.clone(),
        vec![
            ns_step(Some("vision")),
            step("PATCH", &claim_path("/status"), 200, echo(&staged)),
        ],
    )
    .await;
    assert_eq!(bodies[1]["status"]["progress"]["bytesDone"], 2 << 20);
    assert!(
        bodies[1]["status"]["progress"]["summary"]
            .as_str()
            .unwrap()
            .contains("(50%)"),
        "{}",
        bodies[1]
    );
    let staged = with_status(&staged, &bodies[1]);
    agent.set("clm_1", |c| {
        c.state = ClaimState::Ready;
        c.progress.bytes_done = 4 << 20;
        c.progress.blocks_held = 4;
        c.progress.eta_secs = None;
    });
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        staged.clone(),
        write_steps(Some("vision"), &staged),
    )
    .await;
    assert_eq!(bodies[1]["status"]["phase"], "Ready");
    // What goes away is removed (a merge patch keeps what it leaves out): the ETA is null in the patch.
    assert!(
        bodies[1]["status"]["progress"]
            .as_object()
            .unwrap()
            .get("etaSeconds")
            .is_some_and(Value::is_null),
        "{}",
        bodies[1]
    );
    assert_eq!(bodies[2]["reason"], "Ready");
    // And the ready claim, as stored, is what the next pass computes: nothing written.
    let ready = with_status(&staged, &bodies[1]);
    let (_, bodies) = run(
        &agent,
        Settings::default(),
        ready,
        vec![ns_step(Some("vision"))],
    )
    .await;
    assert_eq!(bodies.len(), 1);
    assert_eq!(
        r.unwrap(),
        Action::requeue(Duration::from_secs(crate::HEARTBEAT_SECS)),
        "a ready claim is heartbeated"
    );
}

#[tokio::test]
async fn a_namespace_without_a_team_or_a_claim_naming_another_team_is_refused_without_a_claim() {
    let agent = Arc::new(Agent::default());
    let dc = dataclaim(true, Value::Null, false);
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        write_steps(None, &dc),
    )
    .await;
    assert_eq!(
        r.unwrap(),
        Action::requeue(Settings::default().refused_retry),
        "looked at again: a label added later is enough"
    );
    assert_eq!(bodies[1]["status"]["phase"], "Failed");
    assert!(
        bodies[1]["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("strata.dev/team"),
        "{}",
        bodies[1]
    );
    assert_eq!(bodies[2]["type"], "Warning");

    let mut other = dc.clone();
    other.spec.team = Some("audio".into());
    let (_, bodies) = run(
        &agent,
        Settings::default(),
        other.clone(),
        write_steps(Some("vision"), &other),
    )
    .await;
    assert!(
        bodies[1]["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("spec.team"),
        "{}",
        bodies[1]
    );
    assert_eq!(
        agent.submits.load(Ordering::SeqCst),
        0,
        "nothing was submitted"
    );
}

#[tokio::test]
async fn the_agents_refusal_is_the_claims_reason_and_is_not_retried() {
    let agent = Arc::new(Agent::default());
    *agent.refuse.lock() = Some(Error::new(
        ErrorKind::ResourceExhausted,
        "quota exceeded: team vision cache 10 GiB of 10 GiB",
    ));
    let dc = dataclaim(true, Value::Null, false);
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        write_steps(Some("vision"), &dc),
    )
    .await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert_failed(&bodies, "quota exceeded");
    assert_eq!(bodies[2]["reason"], "Failed");
}

#[tokio::test]
async fn an_operator_that_died_before_writing_the_status_adopts_the_claim_instead_of_submitting_twice()
 {
    let agent = Arc::new(Agent::default());
    let dc = dataclaim(true, Value::Null, false);
    // The first pass's status write is refused (409: the object changed meanwhile): the pass fails, retryably.
    let (r, _) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        vec![
            ns_step(Some("vision")),
            step("PATCH", &claim_path("/status"), 409,
                 json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict",
                        "code": 409, "message": "the object has been modified"})),
        ],
    )
    .await;
    let e = r.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    // The next pass finds the claim the first one submitted.
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        write_steps(Some("vision"), &dc),
    )
    .await;
    r.unwrap();
    assert_eq!(bodies[1]["status"]["claimId"], "clm_1");
    assert_eq!(agent.submits.load(Ordering::SeqCst), 1, "submitted once");
    assert_eq!(agent.claims.lock().len(), 1);
}

#[tokio::test]
async fn an_unreachable_agent_is_a_retryable_error_and_writes_nothing() {
    let agent = Arc::new(Agent::default());
    agent.away.store(true, Ordering::SeqCst);
    let dc = dataclaim(true, Value::Null, false);
    let (r, _) = run(
        &agent,
        Settings::default(),
        dc,
        vec![ns_step(Some("vision"))],
    )
    .await;
    let e = r.unwrap_err();
    assert!(
        e.is_retryable() && e.kind() == ErrorKind::Unavailable,
        "{e}"
    );
}

#[tokio::test]
async fn deletion_releases_the_claim_then_removes_the_finalizer() {
    let agent = Arc::new(Agent::default());
    submit_default(&agent).await;
    let dc = dataclaim(
        true,
        json!({"phase": "Ready", "claimId": "clm_1", "team": "vision"}),
        true,
    );
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        vec![event_step(), step("PATCH", &claim_path(""), 200, echo(&dc))],
    )
    .await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert_eq!(bodies[0]["reason"], "Released");
    let patch = bodies[1].to_string();
    assert!(
        patch.contains("remove") && patch.contains("/metadata/finalizers/0"),
        "{patch}"
    );
    assert_eq!(agent.claims.lock()[0].state, ClaimState::Released);
}

#[tokio::test]
async fn deletion_with_the_agent_away_keeps_the_finalizer_then_forces_it_off_with_a_warning() {
    let agent = Arc::new(Agent::default());
    submit_default(&agent).await;
    agent.away.store(true, Ordering::SeqCst);
    let dc = dataclaim(
        true,
        json!({"phase": "Ready", "claimId": "clm_1", "team": "vision"}),
        true,
    );
    // Within the bound: an error (the controller retries with backoff), the finalizer stays.
    let patient = Settings {
        force_release_after: Duration::from_secs(100 * 365 * 86_400),
        ..Settings::default()
    };
    let (r, bodies) = run(&agent, patient, dc.clone(), vec![]).await;
    assert!(r.unwrap_err().is_retryable());
    assert!(bodies.is_empty(), "nothing written: the finalizer stays");
    // Past it (the deletion was long ago): a Warning event, and the finalizer goes.
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        vec![event_step(), step("PATCH", &claim_path(""), 200, echo(&dc))],
    )
    .await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert_eq!(bodies[0]["reason"], "ForcedRelease");
    assert_eq!(bodies[0]["type"], "Warning");
    assert!(
        bodies[0]["note"].as_str().unwrap().contains("clm_1"),
        "{}",
        bodies[0]
    );
    assert_eq!(agent.releases.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_claim_the_agents_forgot_is_failed_with_a_reason() {
    let agent = Arc::new(Agent::default());
    let dc = dataclaim(
        true,
        json!({"phase": "Ready", "claimId": "clm_9", "team": "vision"}),
        false,
    );
    let (r, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        write_steps(Some("vision"), &dc),
    )
    .await;
    assert_eq!(r.unwrap(), Action::await_change());
    assert_failed(&bodies, "clm_9");
}

/// The agent's claim of the test's DataClaim, submitted (`clm_1`).
async fn submit_default(agent: &Arc<Agent>) {
    let dc = dataclaim(true, Value::Null, false);
    let spec = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |_| None).unwrap();
    agent.submit(&spec).await.unwrap();
}

#[test]
fn the_checked_in_crds_are_the_generated_ones() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/00-crds.yaml");
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == crate::crds_yaml(),
        "deploy/00-crds.yaml drifted from the types: run `strata operator crds > deploy/00-crds.yaml`"
    );
}

#[test]
fn spec_errors_name_the_dataclaims_field() {
    let mut dc = dataclaim(true, Value::Null, false);
    dc.spec.datasets[0].mode = Some("fast".into());
    let e = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |_| None).unwrap_err();
    assert!(e.message().contains("spec.datasets[0].mode"), "{e}");
    dc.spec.datasets[0].mode = None;
    dc.spec.datasets[0].mount_path = Some("relative/path".into());
    let e = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |_| None).unwrap_err();
    assert!(e.message().contains("spec.datasets[0].mountPath"), "{e}");
    dc.spec.datasets[0].mount_path = None;
    dc.spec.datasets[0].location = None;
    dc.spec.datasets[0].dataset_ref = Some("imagenet".into());
    let e = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |_| None).unwrap_err();
    assert!(
        e.message().contains("datasetRef") && e.kind() == ErrorKind::NotFound,
        "{e}"
    );
    let s = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |r| {
        (r == "imagenet").then(|| "origin/in/".into())
    })
    .unwrap();
    assert_eq!(s.datasets[0].location, "origin/in/");
    let long = "n".repeat(253);
    assert!(crate::job_id(NS, &long, UID).len() <= 128);
    let _ = ClaimPhase::Pending;
}

#[tokio::test]
async fn a_watch_whose_resource_version_is_too_old_relists_and_sees_the_new_state() {
    // The controller's input: the watcher the operator runs (`run.rs`'s config) on DataClaims. The API server
    // answers the watch with 410 Gone (its history no longer holds the list's version); the watcher must
    // list again and deliver the DataClaim as it is now, not stall or skip it.
    use futures::StreamExt;
    use kube::runtime::watcher;
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let list = |rv: &str, phase: &str| {
        let mut dc = serde_json::to_value(dataclaim(true, Value::Null, false)).unwrap();
        dc["metadata"]["resourceVersion"] = json!(rv);
        dc["status"] = json!({"phase": phase});
        json!({"apiVersion": "strata.dev/v1alpha1", "kind": "DataClaimList",
               "metadata": {"resourceVersion": rv}, "items": [dc]})
    };
    let server = tokio::spawn(async move {
        let mut seen = Vec::new();
        let answers = [
            (false, list("5", "Staging")),
            (
                true,
                json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status",
                "status": "Failure", "reason": "Expired", "code": 410,
                "message": "too old resource version: 5 (9)"}}),
            ),
            (false, list("9", "Ready")),
        ];
        for (watch, body) in answers {
            let (req, send) = handle.next_request().await.unwrap();
            let uri = req.uri().to_string();
            assert!(
                uri.starts_with("/apis/strata.dev/v1alpha1/dataclaims?"),
                "{uri}"
            );
            assert_eq!(uri.contains("watch=true"), watch, "{uri}");
            seen.push(uri);
            let mut bytes = serde_json::to_vec(&body).unwrap();
            bytes.push(b'\n');
            send.send_response(Response::builder().body(Body::from(bytes)).unwrap());
        }
        // Later watches are left unanswered: the test has what it needs.
        let _later = handle.next_request().await;
        seen
    });
    let api: kube::Api<DataClaim> = kube::Api::all(Client::new(svc, "default"));
    let mut stream = watcher(api, crate::run::watch_config()).boxed();
    let mut phases = Vec::new();
    let mut errors = 0;
    while phases.len() < 2 {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the watcher goes on after the 410")
            .unwrap();
        match ev {
            Ok(watcher::Event::InitApply(dc)) => phases.push(dc.status.unwrap().phase),
            Ok(_) => {}
            Err(_) => errors += 1,
        }
    }
    assert_eq!(phases, vec![ClaimPhase::Staging, ClaimPhase::Ready]);
    assert_eq!(errors, 1, "the 410 surfaced once, then the relist");
    drop(stream);
    let seen = server.await.unwrap();
    assert_eq!(seen.len(), 3, "{seen:?}");
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/strata-system/leases";

fn lease(holder: &str, renewed_secs_ago: i64, transitions: i32) -> Value {
    let renewed = jiff_ago(renewed_secs_ago);
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "strata-operator", "namespace": "strata-system", "resourceVersion": "41"},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": renewed,
                    "renewTime": renewed, "leaseTransitions": transitions}})
}

fn jiff_ago(secs: i64) -> String {
    let t =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs);
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

async fn elect(steps: Vec<Step>) -> (Result<bool>, Vec<Value>) {
    let (client, server) = mock_api(steps);
    let e = crate::Elector::new(
        kube::Api::namespaced(client, "strata-system"),
        "strata-operator",
        "operator-b",
        Duration::from_secs(15),
    );
    let r = e.try_acquire().await;
    drop(e);
    (r, server.await.unwrap())
}

fn not_found() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
           "message": "leases.coordination.k8s.io \"strata-operator\" not found"})
}

fn conflict() -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
           "message": "the object has been modified"})
}

#[tokio::test]
async fn the_first_candidate_creates_the_lease_and_leads() {
    let path = format!("{LEASES}/strata-operator");
    let (r, bodies) = elect(vec![
        step("GET", &path, 404, not_found()),
        step("POST", LEASES, 201, lease("operator-b", 0, 0)),
    ])
    .await;
    assert!(r.unwrap());
    assert_eq!(bodies[1]["spec"]["holderIdentity"], "operator-b");
    assert_eq!(bodies[1]["spec"]["leaseDurationSeconds"], 15);
}

#[tokio::test]
async fn a_lease_another_holder_renewed_is_left_alone() {
    let path = format!("{LEASES}/strata-operator");
    let (r, bodies) = elect(vec![step("GET", &path, 200, lease("operator-a", 2, 3))]).await;
    assert!(!r.unwrap(), "not ours, and nothing written");
    assert_eq!(bodies.len(), 1);
}

#[tokio::test]
async fn an_expired_lease_is_taken_with_the_version_read_and_one_more_transition() {
    let path = format!("{LEASES}/strata-operator");
    let (r, bodies) = elect(vec![
        step("GET", &path, 200, lease("operator-a", 60, 3)),
        step("PUT", &path, 200, lease("operator-b", 0, 4)),
    ])
    .await;
    assert!(r.unwrap());
    let put = &bodies[1];
    assert_eq!(
        put["metadata"]["resourceVersion"], "41",
        "optimistic: the version read"
    );
    assert_eq!(put["spec"]["holderIdentity"], "operator-b");
    assert_eq!(put["spec"]["leaseTransitions"], 4);
}

#[tokio::test]
async fn two_candidates_taking_an_expired_lease_at_once_one_loses_with_409() {
    let path = format!("{LEASES}/strata-operator");
    let (r, _) = elect(vec![
        step("GET", &path, 200, lease("operator-a", 60, 3)),
        step("PUT", &path, 409, conflict()),
    ])
    .await;
    assert!(!r.unwrap(), "a lost race is not an error");
    let (r, _) = elect(vec![
        step("GET", &path, 404, not_found()),
        step("POST", LEASES, 409, conflict()),
    ])
    .await;
    assert!(!r.unwrap());
}

#[tokio::test]
async fn the_holder_renews_its_lease_and_keeps_its_acquire_time() {
    let path = format!("{LEASES}/strata-operator");
    let held = lease("operator-b", 5, 2);
    let (r, bodies) = elect(vec![
        step("GET", &path, 200, held.clone()),
        step("PUT", &path, 200, lease("operator-b", 0, 2)),
    ])
    .await;
    assert!(r.unwrap());
    assert_eq!(
        bodies[1]["spec"]["leaseTransitions"], 2,
        "a renewal is no transition"
    );
    assert_eq!(
        bodies[1]["spec"]["acquireTime"],
        held["spec"]["acquireTime"]
    );
    assert_ne!(bodies[1]["spec"]["renewTime"], held["spec"]["renewTime"]);
}

mod datasets;
mod mounts;

#[test]
fn a_ready_claim_with_fewer_copies_than_asked_says_so_in_its_status() {
    let dc = dataclaim(true, Value::Null, false);
    let spec = crate::convert::claim_spec(&dc, "vision", "/mnt/strata", |_| None).unwrap();
    let mut c = claim("clm_1", &spec);
    c.state = ClaimState::Ready;
    let st = crate::convert::status_of(&dc, &c, Some(1), None, "2026-12-06T00:00:00Z");
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), st.reason.as_str()), ("True", ""));
    assert_eq!(
        ready.message,
        "every block of every staged dataset is cached"
    );
    let less = "train: one copy of each block kept, not 2 (a member did not stage its share)";
    c.reason = less.to_string();
    let st = crate::convert::status_of(&dc, &c, Some(1), None, "2026-12-06T00:00:00Z");
    let ready = st.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), st.reason.as_str()), ("True", less));
    assert!(ready.message.ends_with(less), "{}", ready.message);
}
