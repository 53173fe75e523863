//! A DataClaim as the agent's claim, and the agent's claim status as the DataClaim's status: pure functions,
//! so that what the operator writes is decided in one place and tested without a cluster.

use std::collections::BTreeMap;

use strata_claim::{
    CheckpointClaim, ClaimSpec, ClaimState, ClaimStatus, DatasetClaim, Mode, SPEC_VERSION,
    ScratchClaim,
};
use strata_types::{ByteSize, Error, ErrorKind, Result};

use crate::crd::{
    ClaimMount, ClaimPhase, ClaimProgress, ClaimUsage, Condition, DataClaim, DataClaimStatus,
    TEAM_LABEL,
};

/// Longest job id the agent takes.
const MAX_JOB: usize = 128;

/// The job id of a DataClaim: `namespace/name/uid8`, unique per object (a DataClaim deleted and created again
/// under its name is a new job), readable in `strata usage --by job`; the name is cut to fit 128 bytes.
pub fn job_id(namespace: &str, name: &str, uid: &str) -> String {
    let uid8: String = uid.chars().filter(|c| *c != '-').take(8).collect();
    let room = MAX_JOB.saturating_sub(namespace.len() + uid8.len() + 2);
    let name: String = name.chars().take(room).collect();
    format!("{namespace}/{name}/{uid8}")
}

/// The team a DataClaim is charged to: its namespace's [`TEAM_LABEL`]. A claim naming another team, or in a
/// namespace without the label, is refused (permanently: the reason goes into its status).
pub fn team_of(dc: &DataClaim, namespace_labels: &BTreeMap<String, String>) -> Result<String> {
    let ns = dc.metadata.namespace.as_deref().unwrap_or("default");
    team_in(ns, namespace_labels, dc.spec.team.as_deref())
}

/// The team of namespace `ns` (its [`TEAM_LABEL`]), which a resource naming team `named` must equal.
pub(crate) fn team_in(
    ns: &str,
    namespace_labels: &BTreeMap<String, String>,
    named: Option<&str>,
) -> Result<String> {
    let Some(team) = namespace_labels.get(TEAM_LABEL).filter(|t| !t.is_empty()) else {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "namespace {ns} has no {TEAM_LABEL} label: a cluster administrator names the team it is charged to"
            ),
        ));
    };
    match named {
        Some(t) if t != team => Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("spec.team: {t:?} is not namespace {ns}'s team ({team:?})"),
        )),
        _ => Ok(team.clone()),
    }
}

/// Where the agents mount DataClaims' datasets on the nodes by default: under the agents' hostPath
/// (`deploy/20-agents.yaml`), whose mounts propagate to the node and from there into pods.
pub const MOUNT_ROOT: &str = "/var/lib/strata/mounts";

/// The node path of dataset `dataset` of `dc` under `root`: `root/<namespace>/<name>-<uid8>/<dataset>`, one
/// directory per DataClaim object (one created again under its name mounts elsewhere), the name cut so that
/// the component fits a file name.
pub fn node_path(root: &str, dc: &DataClaim, dataset: &str) -> String {
    let ns = dc.metadata.namespace.as_deref().unwrap_or("default");
    let name: String = dc
        .metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect();
    let uid8: String = dc
        .metadata
        .uid
        .as_deref()
        .unwrap_or_default()
        .chars()
        .filter(|c| *c != '-')
        .take(8)
        .collect();
    format!(
        "{}/{ns}/{name}-{uid8}/{dataset}",
        root.trim_end_matches('/')
    )
}

/// Why `path` cannot be where a pod's containers see a dataset (`None`: it can).
fn pod_path_problem(path: &str) -> Option<&'static str> {
    let p = std::path::Path::new(path);
    if !p.is_absolute() {
        return Some("must be an absolute path");
    }
    if p.components().count() < 2 {
        return Some("cannot be /");
    }
    if p.components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Some("must not contain '..'");
    }
    if path.contains(':') {
        return Some("must not contain ':'");
    }
    None
}

/// The agent's claim for `dc`, charged to `team`; `dataset_source` resolves a `datasetRef` to its Dataset's
/// `source` in the claim's namespace (`None`: no such Dataset). A dataset's `mountPath` is where its pods see
/// it; the agents mount it on the nodes under `mount_root` ([`node_path`]). Errors name the field, as the
/// agent's do.
pub fn claim_spec(
    dc: &DataClaim,
    team: &str,
    mount_root: &str,
    dataset_source: impl Fn(&str) -> Option<String>,
) -> Result<ClaimSpec> {
    let ns = dc.metadata.namespace.as_deref().unwrap_or("default");
    let name = dc.metadata.name.as_deref().unwrap_or_default();
    let uid = dc.metadata.uid.as_deref().unwrap_or_default();
    let mut datasets = Vec::new();
    for (i, d) in dc.spec.datasets.iter().enumerate() {
        let field = format!("spec.datasets[{i}]");
        let location = match (&d.location, &d.dataset_ref) {
            (Some(l), None) => l.clone(),
            (None, Some(r)) => dataset_source(r).ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!("{field}.datasetRef: no Dataset {r:?} in namespace {ns}"),
                )
            })?,
            _ => {
                return Err(Error::invalid_input(format!(
                    "{field}: give exactly one of location and datasetRef"
                )));
            }
        };
        let mode = match d.mode.as_deref() {
            None | Some("stage") => Mode::Stage,
            Some("pin") => Mode::Pin,
            Some("stream") => Mode::Stream,
            Some(m) => {
                return Err(Error::invalid_input(format!(
                    "{field}.mode: {m:?} is not one of stage, pin, stream"
                )));
            }
        };
        let mount = match &d.mount_path {
            None => None,
            Some(p) => {
                if let Some(why) = pod_path_problem(p) {
                    return Err(Error::invalid_input(format!(
                        "{field}.mountPath: {p:?} {why}"
                    )));
                }
                let clash = dc.spec.datasets[..i].iter().any(|o| {
                    o.mount_path.as_deref().map(|q| q.trim_end_matches('/'))
                        == Some(p.trim_end_matches('/'))
                });
                if clash {
                    return Err(Error::invalid_input(format!(
                        "{field}.mountPath: {p:?} is another dataset's mountPath too"
                    )));
                }
                Some(node_path(mount_root, dc, &d.name))
            }
        };
        datasets.push(DatasetClaim {
            name: d.name.clone(),
            location,
            mode,
            mount,
            replicas: d.replicas,
        });
    }
    let scratch = match &dc.spec.scratch {
        None => None,
        Some(s) => Some(ScratchClaim {
            size: s.size.parse::<ByteSize>().map_err(|e| {
                Error::invalid_input(format!("spec.scratch.size: {:?}: {e}", s.size))
            })?,
            ttl_secs: s.ttl_seconds,
        }),
    };
    let spec = ClaimSpec {
        version: SPEC_VERSION,
        job: job_id(ns, name, uid),
        team: team.to_string(),
        datasets,
        checkpoint: dc.spec.checkpoint.as_ref().map(|c| CheckpointClaim {
            location: c.location.clone(),
            keep_last: c.keep_last,
        }),
        scratch,
        // The operator heartbeats the claim while the DataClaim exists; an operator away this long lets the
        // agents release it on their own.
        ttl_secs: Some(CLAIM_TTL_SECS),
        stage_deadline_secs: dc.spec.stage_deadline_seconds,
    };
    spec.validate().map_err(|errs| {
        let list: Vec<String> = errs
            .iter()
            .map(|e| format!("spec.{}: {}", k8s_field(&e.field), e.message))
            .collect();
        Error::invalid_input(list.join("; "))
    })?;
    Ok(spec)
}

/// Seconds without a heartbeat after which the agents release an operator's claim (the operator heartbeats
/// every [`HEARTBEAT_SECS`]).
pub const CLAIM_TTL_SECS: u64 = 3_600;
/// How often the operator heartbeats a live claim.
pub const HEARTBEAT_SECS: u64 = 300;

/// A claim field (`datasets[1].mount`) as the DataClaim names it (`datasets[1].mountPath`).
fn k8s_field(field: &str) -> String {
    field
        .replace(".mount", ".mountPath")
        .replace("ttl_secs", "ttlSeconds")
        .replace("keep_last", "keepLast")
        .replace("stage_deadline_secs", "stageDeadlineSeconds")
}

/// The DataClaim status for the agent's `claim` of `dc`, keeping `old`'s condition times where nothing
/// changed.
pub fn status_of(
    dc: &DataClaim,
    claim: &ClaimStatus,
    generation: Option<i64>,
    old: Option<&DataClaimStatus>,
    now: &str,
) -> DataClaimStatus {
    let phase = match claim.state {
        ClaimState::Pending => ClaimPhase::Pending,
        ClaimState::Staging => ClaimPhase::Staging,
        ClaimState::Ready => ClaimPhase::Ready,
        ClaimState::Failed => ClaimPhase::Failed,
        ClaimState::Released => ClaimPhase::Released,
    };
    let progress = progress_of(&claim.progress);
    let mounts = mounts_of(dc, claim);
    let u = &claim.usage;
    let usage = ClaimUsage {
        staged_bytes: u.staged_bytes,
        staged_cached_bytes: u.staged_cached_bytes,
        stall_seconds: format!("{:.1}", u.stall_secs),
        origin_bytes: u.origin_bytes,
        peer_bytes: u.peer_bytes,
        scratch_peak_bytes: u.scratch_peak_bytes,
        checkpoint_bytes: u.checkpoint_bytes,
    };
    // A Ready claim's reason says what it holds less of than it asked for (fewer copies).
    let staged = match claim.reason.as_str() {
        "" => "every block of every staged dataset is cached".to_string(),
        less => format!("every block of every staged dataset is cached; {less}"),
    };
    let ready = match phase {
        ClaimPhase::Ready => ("True", "Staged", staged.as_str()),
        ClaimPhase::Failed => ("False", "Failed", claim.reason.as_str()),
        ClaimPhase::Released => ("False", "Released", claim.reason.as_str()),
        _ => ("False", "Staging", "staging"),
    };
    let conditions = vec![
        condition(
            old,
            "Admitted",
            "True",
            "Admitted",
            "the agent admitted the claim",
            generation,
            now,
        ),
        condition(old, "Ready", ready.0, ready.1, ready.2, generation, now),
    ];
    DataClaimStatus {
        observed_generation: generation,
        phase,
        claim_id: Some(claim.id.clone()),
        team: Some(claim.team.clone()),
        reason: claim.reason.clone(),
        progress,
        usage,
        env: pod_env(&claim.env, &mounts),
        nodes: old.map(|o| o.nodes.clone()).unwrap_or_default(),
        mounts,
        mount_group: claim.mount_gid,
        mounted_nodes: old.map(|o| o.mounted_nodes.clone()).unwrap_or_default(),
        conditions,
    }
}

/// A claim's staging progress as a resource's status shows it.
pub(crate) fn progress_of(p: &strata_claim::Progress) -> ClaimProgress {
    let pct = (p.bytes_done * 100)
        .checked_div(p.bytes_total)
        .unwrap_or(100);
    ClaimProgress {
        bytes_done: p.bytes_done,
        bytes_total: p.bytes_total,
        objects_done: p.objects_done,
        objects_total: p.objects_total,
        blocks_held: p.blocks_held,
        blocks_total: p.blocks_total,
        eta_seconds: p.eta_secs,
        summary: format!(
            "{}/{} ({pct}%)",
            ByteSize(p.bytes_done),
            ByteSize(p.bytes_total)
        ),
    }
}

/// The claim's environment as its pods get it: a `STRATA_MOUNT_<NAME>` that names a mount's node path names its
/// path in the pod instead.
fn pod_env(env: &BTreeMap<String, String>, mounts: &[ClaimMount]) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| {
            let in_pod = mounts
                .iter()
                .find(|m| k.starts_with("STRATA_MOUNT_") && *v == m.node_path)
                .map_or_else(|| v.clone(), |m| m.mount_path.clone());
            (k.clone(), in_pod)
        })
        .collect()
}

/// The DataClaim's datasets with a `mountPath`, each with the node path the agent's claim mounts it on.
fn mounts_of(dc: &DataClaim, claim: &ClaimStatus) -> Vec<ClaimMount> {
    dc.spec
        .datasets
        .iter()
        .filter_map(|d| {
            let mount_path = d.mount_path.clone()?;
            let node_path = claim
                .spec
                .datasets
                .iter()
                .find(|c| c.name == d.name)?
                .mount
                .clone()?;
            Some(ClaimMount {
                name: d.name.clone(),
                mount_path,
                node_path,
            })
        })
        .collect()
}

/// The status of a DataClaim the operator refuses (bad spec, wrong team): Failed with the reason, no claim.
pub fn refused(
    reason: &str,
    generation: Option<i64>,
    old: Option<&DataClaimStatus>,
    now: &str,
) -> DataClaimStatus {
    DataClaimStatus {
        observed_generation: generation,
        phase: ClaimPhase::Failed,
        reason: reason.to_string(),
        conditions: vec![
            condition(old, "Admitted", "False", "Refused", reason, generation, now),
            condition(old, "Ready", "False", "Refused", reason, generation, now),
        ],
        ..DataClaimStatus::default()
    }
}

/// Condition `type_`, with `old`'s transition time when its status is unchanged.
fn condition(
    old: Option<&DataClaimStatus>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &str,
) -> Condition {
    condition_among(
        old.map(|o| o.conditions.as_slice()),
        type_,
        status,
        reason,
        message,
        generation,
        now,
    )
}

/// Condition `type_`, with the transition time it has among `old` when its status is unchanged.
pub(crate) fn condition_among(
    old: Option<&[Condition]>,
    type_: &str,
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &str,
) -> Condition {
    let since = old
        .and_then(|o| o.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.to_string());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time: Some(since),
        observed_generation: generation,
    }
}
