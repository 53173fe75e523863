//! Reconcile tests of a Ready claim's mounts: the nodes its pods are bound to, through their agents.

use super::*;

/// The agents' EndpointSlice: ready agents on node-a and node-b, one starting on node-c.
fn agents_on_nodes() -> Arc<crate::EndpointMembers> {
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
    "metadata": {"name": "strata-agents-x"}, "addressType": "IPv4",
    "ports": [{"name": "api", "port": 7070}],
    "endpoints": [
        {"addresses": ["10.0.0.1"], "conditions": {"ready": true}, "nodeName": "node-a"},
        {"addresses": ["10.0.0.2"], "conditions": {"ready": true}, "nodeName": "node-b"},
        {"addresses": ["10.0.0.3"], "conditions": {"ready": false}, "nodeName": "node-c"},
    ]}))
    .unwrap();
    Arc::new(crate::EndpointMembers::fixed(&[Arc::new(slice)]))
}

fn pod_on(name: &str, node: Option<&str>, phase: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": NS, "labels": {"strata.dev/claim": NAME}},
                       "spec": {"containers": [{"name": "train", "image": "x"}]}});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    if let Some(ph) = phase {
        p["status"] = json!({"phase": ph});
    }
    p
}

#[tokio::test]
async fn a_ready_claims_datasets_are_mounted_on_the_nodes_its_waiting_pods_are_bound_to() {
    let agent = Arc::new(Agent::default());
    let mut dc = dataclaim(true, Value::Null, false);
    dc.spec.datasets[0].mount_path = Some("/data/train".into());
    let (_, bodies) = run(
        &agent,
        Settings::default(),
        dc.clone(),
        write_steps(Some("vision"), &dc),
    )
    .await;
    // The claim asks the agents to mount it under the mount root, one directory per DataClaim object.
    let node_path = format!("{}/{NS}/{NAME}-0a1b2c3d/train", crate::MOUNT_ROOT);
    assert_eq!(
        agent.claims.lock()[0].spec.datasets[0].mount.as_deref(),
        Some(node_path.as_str())
    );
    let staged = with_status(&dc, &bodies[1]);
    agent.set("clm_1", |c| {
        c.state = ClaimState::Ready;
        c.mount_gid = Some(4242);
        c.env.insert("STRATA_MOUNT_TRAIN".into(), node_path.clone());
    });
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "5"}, "items": [
        pod_on("waiting-a", Some("node-a"), Some("Pending")),
        pod_on("running-b", Some("node-b"), Some("Running")),
        pod_on("unbound", None, None),
        pod_on("waiting-c", Some("node-c"), Some("Pending")),
    ]});
    let pods_path = format!("/api/v1/namespaces/{NS}/pods");
    let (r, bodies) = run_with(
        &agent,
        Settings::default(),
        staged.clone(),
        vec![
            ns_step(Some("vision")),
            step("GET", &pods_path, 200, pods.clone()),
            event_step(), // node-c: its agent is not ready
            step("PATCH", &claim_path("/status"), 200, echo(&staged)),
            event_step(), // Ready
        ],
        Some(agents_on_nodes()),
    )
    .await;
    // Only the waiting pod on a node with a ready agent was mounted for; the running one has its mounts.
    assert_eq!(
        *agent.attaches.lock(),
        [("http://10.0.0.1:7070".to_string(), "clm_1".to_string())]
    );
    assert_eq!(bodies[2]["reason"], "MountFailed", "{}", bodies[2]);
    assert_eq!(bodies[2]["type"], "Warning");
    assert!(
        bodies[2]["note"].as_str().unwrap().contains("node-c"),
        "{}",
        bodies[2]
    );
    let st = &bodies[3]["status"];
    assert_eq!(st["phase"], "Ready", "{st}");
    assert_eq!(st["mountedNodes"], json!(["node-a"]), "{st}");
    assert_eq!(st["mountGroup"], 4242, "{st}");
    // The mounts were written with the Staging status already: the Ready status has them. Pods see the
    // dataset at its mountPath, and their environment says so (not the node's path).
    let ready = with_status(&staged, &bodies[3]);
    assert_eq!(
        ready
            .status
            .as_ref()
            .unwrap()
            .env
            .get("STRATA_MOUNT_TRAIN")
            .map(String::as_str),
        Some("/data/train")
    );
    assert_eq!(
        serde_json::to_value(&ready.status.as_ref().unwrap().mounts).unwrap(),
        json!([{"name": "train", "mountPath": "/data/train", "nodePath": node_path}]),
    );
    // A node that cannot be mounted yet is looked at again soon, not in five minutes.
    assert_eq!(
        r.unwrap(),
        Action::requeue(Settings::default().staging_poll)
    );

    // The pods of node-c gone: mounted again on node-a (idempotent at the agent), nothing written.
    let mut pods = pods;
    pods["items"].as_array_mut().unwrap().pop();
    let (r, _) = run_with(
        &agent,
        Settings::default(),
        ready,
        vec![ns_step(Some("vision")), step("GET", &pods_path, 200, pods)],
        Some(agents_on_nodes()),
    )
    .await;
    assert_eq!(
        r.unwrap(),
        Action::requeue(Duration::from_secs(crate::HEARTBEAT_SECS))
    );
    assert_eq!(agent.attaches.lock().len(), 2);
}

#[test]
fn a_mount_path_is_where_pods_see_the_dataset_and_bad_ones_name_the_field() {
    let mut dc = dataclaim(true, Value::Null, false);
    dc.spec.datasets[0].mount_path = Some("/data/train".into());
    let s = crate::claim_spec(&dc, "vision", "/mnt/strata/", |_| None).unwrap();
    assert_eq!(
        s.datasets[0].mount.as_deref(),
        Some("/mnt/strata/vision-ns/train-run-0a1b2c3d/train")
    );
    for (bad, why) in [
        ("data", "absolute"),
        ("/", "cannot be /"),
        ("/data/../etc", "'..'"),
        ("/data:x", "':'"),
    ] {
        dc.spec.datasets[0].mount_path = Some(bad.into());
        let e = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |_| None).unwrap_err();
        assert!(
            e.message().contains("spec.datasets[0].mountPath") && e.message().contains(why),
            "{bad}: {e}"
        );
    }
    dc.spec.datasets[0].mount_path = Some("/data/train".into());
    let mut second = dc.spec.datasets[0].clone();
    second.name = "val".into();
    second.mount_path = Some("/data/train/".into());
    dc.spec.datasets.push(second);
    let e = crate::claim_spec(&dc, "vision", crate::MOUNT_ROOT, |_| None).unwrap_err();
    assert!(
        e.message().contains("spec.datasets[1].mountPath") && e.message().contains("another"),
        "{e}"
    );
}
