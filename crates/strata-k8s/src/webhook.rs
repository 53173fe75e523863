//! The pod admission webhook (`strata operator run --webhook-listen`): a pod that names a DataClaim (label
//! [`CLAIM_LABEL`]) is admitted only once the claim is Ready, with the claim's environment and node affinity
//! toward the nodes whose agents hold its blocks.
//!
//! Why a mutating webhook rather than the operator editing pods: a pod's environment and affinity cannot
//! change after it is created, so they must be decided at creation, and only admission sees a pod before the
//! scheduler does. Why deny until Ready rather than admit and wait: a pod admitted early would run on
//! partial data or hold a GPU node while it waits; denied, it is created again by its Job (or ReplicaSet)
//! controller with backoff, and the denial says how far staging is, like a Slurm job held in `data_in`.
//!
//! What a pod gets, in every container and init container (never overriding what its author set):
//! - `STRATA_AGENT`: the agent on its own node ([`NODE_AGENT`], a Service with `internalTrafficPolicy:
//!   Local`);
//! - the claim's environment from its status (`STRATA_CLAIM`, `STRATA_DATASET_<NAME>`, `STRATA_SCRATCH`,
//!   ...);
//! - node affinity toward `status.nodes`: preferred (weight 100) by default, required when the claim says
//!   `requireCacheAffinity` (then ANDed into every required term the pod already has);
//! - for each dataset with a `mountPath` ([`crate::crd::DataClaimStatus::mounts`]): a hostPath volume of the
//!   agent's mount on the node (`type: Directory`), mounted read-only at `mountPath` in every container with
//!   `mountPropagation: HostToContainer` (a mount the agent makes or makes again later reaches the
//!   container); the mounts' group among the pod's `supplementalGroups`; and a first init container,
//!   [`MOUNTS_INIT`], that waits until every path is a Strata mount (`strata wait-mounts`), so no container
//!   of the pod starts on an empty directory. The operator has the agent of the node the pod is bound to mount
//!   them ([`crate::reconcile`]).
//!
//! The webhook's own failure never admits a pod unchanged: the MutatingWebhookConfiguration selects only pods
//! with the label and fails closed, so other pods never depend on it.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, HostPathVolumeSource, NodeAffinity, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSecurityContext, PodSpec,
    PreferredSchedulingTerm, Volume, VolumeMount,
};

use crate::crd::{ClaimMount, ClaimPhase, DataClaim};

/// The init container that waits for a pod's dataset mounts.
pub const MOUNTS_INIT: &str = "strata-mounts";
/// How long [`MOUNTS_INIT`] waits for the mounts before it fails (the kubelet then starts it again, with
/// backoff, and the pod's events say why).
pub const MOUNTS_WAIT_SECS: u64 = 600;
/// The image [`MOUNTS_INIT`] runs by default: the operator's own (`deploy/10-operator.yaml`).
pub const MOUNTS_IMAGE: &str = "ghcr.io/strata-data/strata:0.1.0";

/// What admitted pods are given besides their claim's status: the agent of their node, and the image that
/// waits for their mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSide {
    /// `STRATA_AGENT` of admitted pods ([`NODE_AGENT`] by default).
    pub agent: String,
    /// The image of [`MOUNTS_INIT`] ([`MOUNTS_IMAGE`] by default): one with the `strata` binary as its
    /// entrypoint.
    pub mounts_image: String,
}

impl Default for NodeSide {
    fn default() -> Self {
        Self {
            agent: NODE_AGENT.to_string(),
            mounts_image: MOUNTS_IMAGE.to_string(),
        }
    }
}

/// The label a pod names its DataClaim (in the pod's namespace) with.
pub const CLAIM_LABEL: &str = "strata.dev/claim";
/// The agent on a pod's own node: the `strata-node` Service (`internalTrafficPolicy: Local`) of
/// `deploy/20-agents.yaml`.
pub const NODE_AGENT: &str = "http://strata-node.strata-system:7070";
/// The node label affinity is expressed on.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// What admission decides for a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The pod names no claim: admitted as it is.
    Untouched,
    /// Admitted as this pod.
    Admit(Box<Pod>),
    /// Refused, with what a person reads in `kubectl describe` of the Job or ReplicaSet.
    Deny(String),
}

/// The claim name a pod's label gives, if any.
pub fn claim_name(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(CLAIM_LABEL)
        .map(String::as_str)
        .filter(|n| !n.is_empty())
}

/// Decide for `pod` in `namespace`, given its DataClaim as the API server has it (`None`: there is none).
pub fn admit(pod: &Pod, namespace: &str, claim: Option<&DataClaim>, side: &NodeSide) -> Verdict {
    let Some(name) = claim_name(pod) else {
        return Verdict::Untouched;
    };
    let Some(dc) = claim else {
        return Verdict::Deny(format!(
            "the pod names DataClaim {name:?} ({CLAIM_LABEL}), and namespace {namespace} has none of that name"
        ));
    };
    let status = dc.status.clone().unwrap_or_default();
    match status.phase {
        ClaimPhase::Ready => {}
        ClaimPhase::Failed => {
            return Verdict::Deny(format!(
                "DataClaim {name} failed: {}",
                if status.reason.is_empty() {
                    "no reason given"
                } else {
                    &status.reason
                }
            ));
        }
        ClaimPhase::Released => {
            return Verdict::Deny(format!(
                "DataClaim {name} is released (being deleted): no pod may start on it"
            ));
        }
        phase => {
            let p = &status.progress;
            let done = if p.bytes_total > 0 {
                format!(
                    " ({:.0}%: {} of {} bytes, {} of {} objects)",
                    100.0 * p.bytes_done as f64 / p.bytes_total as f64,
                    p.bytes_done,
                    p.bytes_total,
                    p.objects_done,
                    p.objects_total
                )
            } else {
                String::new()
            };
            return Verdict::Deny(format!(
                "DataClaim {name} is {phase:?}{done}: pods that read it start once it is Ready (their \
                 controller creates them again)"
            ));
        }
    }
    let nodes: BTreeSet<String> = status.nodes.iter().cloned().collect();
    if dc.spec.require_cache_affinity && nodes.is_empty() {
        return Verdict::Deny(format!(
            "DataClaim {name} requires cache affinity and no node holds its data yet"
        ));
    }
    let mut out = pod.clone();
    if let Some(spec) = out.spec.as_mut() {
        let mut env = vec![("STRATA_AGENT".to_string(), side.agent.clone())];
        env.extend(status.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
            .filter(|c| c.name != MOUNTS_INIT)
        {
            add_env(c, &env);
        }
        if !nodes.is_empty() {
            let aff = spec.affinity.get_or_insert_with(Affinity::default);
            let na = aff.node_affinity.get_or_insert_with(NodeAffinity::default);
            let near = NodeSelectorRequirement {
                key: HOSTNAME_LABEL.into(),
                operator: "In".into(),
                values: Some(nodes.into_iter().collect()),
            };
            if dc.spec.require_cache_affinity {
                let req = na
                    .required_during_scheduling_ignored_during_execution
                    .get_or_insert_with(NodeSelector::default);
                if req.node_selector_terms.is_empty() {
                    req.node_selector_terms.push(NodeSelectorTerm::default());
                }
                // Terms are ORed: the claim's nodes go into each, so every way the pod may schedule is near.
                for t in &mut req.node_selector_terms {
                    let exprs = t.match_expressions.get_or_insert_with(Vec::new);
                    if !exprs.contains(&near) {
                        exprs.push(near.clone());
                    }
                }
            } else {
                let pref = na
                    .preferred_during_scheduling_ignored_during_execution
                    .get_or_insert_with(Vec::new);
                let term = PreferredSchedulingTerm {
                    weight: 100,
                    preference: NodeSelectorTerm {
                        match_expressions: Some(vec![near]),
                        ..Default::default()
                    },
                };
                if !pref.contains(&term) {
                    pref.push(term);
                }
            }
        }
        if !status.mounts.is_empty() {
            add_mounts(spec, &status.mounts, status.mount_group, &side.mounts_image);
        }
    }
    Verdict::Admit(Box::new(out))
}

/// The volume name of a dataset's mount: `strata-` and the dataset's name as a DNS label (its `_` as `-`).
fn volume_name(dataset: &str) -> String {
    format!("strata-{}", dataset.replace('_', "-"))
        .chars()
        .take(63)
        .collect()
}

/// Give `spec` the claim's `mounts`: the volumes, a read-only mount of each in every container (where the
/// container has nothing at that path already), `gid` among the supplemental groups, and [`MOUNTS_INIT`]
/// first among the init containers. Admitting an admitted pod again changes nothing.
fn add_mounts(spec: &mut PodSpec, mounts: &[ClaimMount], gid: Option<u32>, image: &str) {
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    let mut mounted = Vec::new();
    for m in mounts {
        let name = volume_name(&m.name);
        if !volumes.iter().any(|v| v.name == name) {
            volumes.push(Volume {
                name: name.clone(),
                host_path: Some(HostPathVolumeSource {
                    path: m.node_path.clone(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            });
        }
        mounted.push(VolumeMount {
            name,
            mount_path: m.mount_path.clone(),
            read_only: Some(true),
            mount_propagation: Some("HostToContainer".into()),
            ..Default::default()
        });
    }
    let inits = spec.init_containers.get_or_insert_with(Vec::new);
    if !inits.iter().any(|c| c.name == MOUNTS_INIT) {
        let mut args: Vec<String> = vec![
            "wait-mounts".into(),
            "--timeout-secs".into(),
            MOUNTS_WAIT_SECS.to_string(),
        ];
        args.extend(mounts.iter().map(|m| m.mount_path.clone()));
        inits.insert(
            0,
            Container {
                name: MOUNTS_INIT.into(),
                image: Some(image.into()),
                args: Some(args),
                ..Default::default()
            },
        );
    }
    for c in spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
    {
        let have = c.volume_mounts.get_or_insert_with(Vec::new);
        for vm in &mounted {
            let taken = have.iter().any(|h| {
                h.name == vm.name
                    || h.mount_path.trim_end_matches('/') == vm.mount_path.trim_end_matches('/')
            });
            if !taken {
                have.push(vm.clone());
            }
        }
    }
    if let Some(gid) = gid.map(i64::from) {
        let groups = spec
            .security_context
            .get_or_insert_with(PodSecurityContext::default)
            .supplemental_groups
            .get_or_insert_with(Vec::new);
        if !groups.contains(&gid) {
            groups.push(gid);
        }
    }
}

/// Add `env` to `c`, leaving every variable the container already sets as it is.
fn add_env(c: &mut Container, env: &[(String, String)]) {
    let list = c.env.get_or_insert_with(Vec::new);
    for (k, v) in env {
        if !list.iter().any(|e| &e.name == k) {
            list.push(EnvVar {
                name: k.clone(),
                value: Some(v.clone()),
                value_from: None,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::{Value, json};

    fn pod(labels: Value, spec: Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "train-", "namespace": "vision", "labels": labels},
            "spec": spec,
        }))
        .unwrap()
    }

    fn two_containers() -> Value {
        json!({
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [
                {"name": "train", "image": "pytorch", "env": [{"name": "STRATA_AGENT", "value": "http://mine:1"}]},
                {"name": "sidecar", "image": "busybox"},
            ],
        })
    }

    fn claim(phase: &str, nodes: &[&str], required: bool) -> DataClaim {
        serde_json::from_value(json!({
            "apiVersion": "strata.dev/v1alpha1", "kind": "DataClaim",
            "metadata": {"name": "imagenet", "namespace": "vision"},
            "spec": {"datasets": [{"name": "train", "location": "origin/vision/train/"}],
                     "requireCacheAffinity": required},
            "status": {"phase": phase, "claimId": "clm_1", "reason": if phase == "Failed" { "missing object x" } else { "" },
                       "progress": {"bytesDone": 50, "bytesTotal": 200, "objectsDone": 1, "objectsTotal": 4,
                                    "blocksHeld": 0, "blocksTotal": 0},
                       "env": {"STRATA_CLAIM": "clm_1", "STRATA_DATASET_TRAIN": "origin/vision/train/"},
                       "nodes": nodes},
        }))
        .unwrap()
    }

    fn env_of(p: &Pod, container: usize) -> Vec<(String, String)> {
        p.spec.as_ref().unwrap().containers[container]
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    fn admitted(v: Verdict) -> Pod {
        match v {
            Verdict::Admit(p) => *p,
            other => panic!("not admitted: {other:?}"),
        }
    }

    #[test]
    fn a_pod_without_the_label_is_untouched_and_one_naming_a_missing_claim_is_denied() {
        let p = pod(json!({"app": "x"}), two_containers());
        assert_eq!(
            admit(&p, "vision", None, &NodeSide::default()),
            Verdict::Untouched
        );
        let p = pod(json!({CLAIM_LABEL: ""}), two_containers());
        assert_eq!(
            admit(&p, "vision", None, &NodeSide::default()),
            Verdict::Untouched
        );
        let p = pod(json!({CLAIM_LABEL: "imagenet"}), two_containers());
        let Verdict::Deny(why) = admit(&p, "vision", None, &NodeSide::default()) else {
            panic!()
        };
        assert!(
            why.contains("\"imagenet\"") && why.contains("namespace vision"),
            "{why}"
        );
    }

    #[test]
    fn a_claim_not_ready_denies_with_its_progress_and_a_failed_one_with_its_reason() {
        let p = pod(json!({CLAIM_LABEL: "imagenet"}), two_containers());
        for (phase, want) in [
            ("Pending", "is Pending"),
            (
                "Staging",
                "is Staging (25%: 50 of 200 bytes, 1 of 4 objects)",
            ),
            ("Failed", "failed: missing object x"),
            ("Released", "released"),
        ] {
            let Verdict::Deny(why) = admit(
                &p,
                "vision",
                Some(&claim(phase, &[], false)),
                &NodeSide::default(),
            ) else {
                panic!("{phase} admitted")
            };
            assert!(why.contains(want), "{phase}: {why}");
        }
    }

    #[test]
    fn a_ready_claim_gives_every_container_its_environment_without_overriding_the_authors() {
        let p = pod(json!({CLAIM_LABEL: "imagenet"}), two_containers());
        let out = admitted(admit(
            &p,
            "vision",
            Some(&claim("Ready", &[], false)),
            &NodeSide::default(),
        ));
        let train = env_of(&out, 0);
        assert!(
            train.contains(&("STRATA_AGENT".into(), "http://mine:1".into())),
            "{train:?}"
        );
        assert_eq!(train.iter().filter(|(k, _)| k == "STRATA_AGENT").count(), 1);
        assert!(train.contains(&("STRATA_CLAIM".into(), "clm_1".into())));
        let side = env_of(&out, 1);
        assert!(
            side.contains(&("STRATA_AGENT".into(), NODE_AGENT.into())),
            "{side:?}"
        );
        assert!(side.contains(&("STRATA_DATASET_TRAIN".into(), "origin/vision/train/".into())));
        let init = &out.spec.as_ref().unwrap().init_containers.as_ref().unwrap()[0];
        assert!(init.env.iter().flatten().any(|e| e.name == "STRATA_CLAIM"));
        // No nodes known: no affinity.
        assert!(out.spec.as_ref().unwrap().affinity.is_none());
        // Admitting the admitted pod again changes nothing (a reinvoked webhook).
        assert_eq!(
            admitted(admit(
                &out,
                "vision",
                Some(&claim("Ready", &[], false)),
                &NodeSide::default()
            )),
            out
        );
    }

    #[test]
    fn affinity_is_preferred_by_default_and_required_on_request_within_every_term() {
        let p = pod(json!({CLAIM_LABEL: "imagenet"}), two_containers());
        let out = admitted(admit(
            &p,
            "vision",
            Some(&claim("Ready", &["n2", "n1"], false)),
            &NodeSide::default(),
        ));
        let na = out
            .spec
            .as_ref()
            .unwrap()
            .affinity
            .clone()
            .unwrap()
            .node_affinity
            .unwrap();
        assert!(
            na.required_during_scheduling_ignored_during_execution
                .is_none()
        );
        let pref = na
            .preferred_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(pref.len(), 1);
        assert_eq!(pref[0].weight, 100);
        let e = &pref[0].preference.match_expressions.as_ref().unwrap()[0];
        assert_eq!(
            (e.key.as_str(), e.operator.as_str()),
            (HOSTNAME_LABEL, "In")
        );
        assert_eq!(e.values.as_deref().unwrap(), ["n1", "n2"]);

        // Required: ANDed into each of the pod's own terms (which are ORed).
        let mut spec = two_containers();
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]},
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100"]}]},
        ]}}});
        let p = pod(json!({CLAIM_LABEL: "imagenet"}), spec);
        let out = admitted(admit(
            &p,
            "vision",
            Some(&claim("Ready", &["n1"], true)),
            &NodeSide::default(),
        ));
        let terms = out
            .spec
            .unwrap()
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 2);
        for t in &terms {
            let keys: Vec<&str> = t
                .match_expressions
                .iter()
                .flatten()
                .map(|e| e.key.as_str())
                .collect();
            assert_eq!(keys, ["gpu", HOSTNAME_LABEL]);
        }
        // Required with no node holding the data yet: denied, not scheduled anywhere.
        let Verdict::Deny(why) = admit(
            &p,
            "vision",
            Some(&claim("Ready", &[], true)),
            &NodeSide::default(),
        ) else {
            panic!()
        };
        assert!(why.contains("requires cache affinity"), "{why}");
    }

    #[test]
    fn a_ready_claims_mounts_are_volumes_of_every_container_behind_an_init_container_that_waits() {
        let mut spec = two_containers();
        // The author's own volume at the sidecar's /data/train stays: the sidecar does not get the dataset.
        spec["containers"][1]["volumeMounts"] =
            json!([{"name": "own", "mountPath": "/data/train/"}]);
        spec["volumes"] = json!([{"name": "own", "emptyDir": {}}]);
        spec["securityContext"] = json!({"supplementalGroups": [7]});
        let p = pod(json!({CLAIM_LABEL: "imagenet"}), spec);
        let mut dc = claim("Ready", &[], false);
        let st = dc.status.as_mut().unwrap();
        st.mounts = vec![
            ClaimMount {
                name: "train".into(),
                mount_path: "/data/train".into(),
                node_path: "/var/lib/strata/mounts/vision/imagenet-0a1b2c3d/train".into(),
            },
            ClaimMount {
                name: "val_set".into(),
                mount_path: "/data/val".into(),
                node_path: "/var/lib/strata/mounts/vision/imagenet-0a1b2c3d/val_set".into(),
            },
        ];
        st.mount_group = Some(4242);
        let side = NodeSide {
            agent: NODE_AGENT.into(),
            mounts_image: "registry.local/strata:9".into(),
        };
        let out = admitted(admit(&p, "vision", Some(&dc), &side));
        let spec = out.spec.as_ref().unwrap();
        let vols = spec.volumes.as_ref().unwrap();
        let host = |name: &str| {
            vols.iter()
                .find(|v| v.name == name)
                .and_then(|v| v.host_path.clone())
                .unwrap()
        };
        assert_eq!(
            host("strata-train").path,
            "/var/lib/strata/mounts/vision/imagenet-0a1b2c3d/train"
        );
        assert_eq!(host("strata-train").type_.as_deref(), Some("Directory"));
        assert!(host("strata-val-set").path.ends_with("/val_set"));
        let mounts = |c: &Container| -> Vec<(String, String, bool, String)> {
            c.volume_mounts
                .iter()
                .flatten()
                .map(|m| {
                    (
                        m.name.clone(),
                        m.mount_path.clone(),
                        m.read_only == Some(true),
                        m.mount_propagation.clone().unwrap_or_default(),
                    )
                })
                .collect()
        };
        let ro = |n: &str, at: &str| {
            (
                n.to_string(),
                at.to_string(),
                true,
                "HostToContainer".to_string(),
            )
        };
        assert_eq!(
            mounts(&spec.containers[0]),
            [
                ro("strata-train", "/data/train"),
                ro("strata-val-set", "/data/val")
            ]
        );
        let side_mounts = mounts(&spec.containers[1]);
        assert_eq!(side_mounts[0].0, "own");
        assert_eq!(side_mounts[1..], [ro("strata-val-set", "/data/val")]);
        // The waiting init container comes first, runs the image asked for, sees the mounts where the
        // containers do, and gets no environment of the claim (it needs none).
        let inits = spec.init_containers.as_ref().unwrap();
        assert_eq!(inits[0].name, MOUNTS_INIT);
        assert_eq!(inits[0].image.as_deref(), Some("registry.local/strata:9"));
        assert_eq!(
            inits[0].args.as_deref().unwrap(),
            [
                "wait-mounts",
                "--timeout-secs",
                "600",
                "/data/train",
                "/data/val"
            ]
        );
        assert_eq!(mounts(&inits[0]).len(), 2);
        assert!(inits[0].env.is_none());
        assert_eq!(inits[1].name, "fetch");
        assert_eq!(mounts(&inits[1]).len(), 2);
        assert_eq!(
            spec.security_context
                .as_ref()
                .unwrap()
                .supplemental_groups
                .as_deref(),
            Some(&[7, 4242][..])
        );
        // A reinvoked webhook changes nothing.
        assert_eq!(admitted(admit(&out, "vision", Some(&dc), &side)), out);
        // No mounts, no volumes nor init container.
        let plain = admitted(admit(
            &p,
            "vision",
            Some(&claim("Ready", &[], false)),
            &side,
        ));
        let plain_spec = plain.spec.unwrap();
        assert_eq!(plain_spec.init_containers.unwrap().len(), 1);
        assert_eq!(plain_spec.volumes.unwrap().len(), 1);
    }
}
