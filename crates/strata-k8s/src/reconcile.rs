//! The DataClaim reconciler: a DataClaim becomes a claim on the agents, its status follows the agent's claim,
//! and its deletion releases the claim.
//!
//! One pass ([`reconcile`]):
//! 1. the finalizer `strata.dev/release` goes on first (kube-runtime's `finalizer`), so no DataClaim goes
//!    away with its pins and scratch still held;
//! 2. the team is the namespace's `strata.dev/team` label; a DataClaim naming another team, or a bad spec, is
//!    refused: `Failed` with the reason, no claim; looked at again every [`Settings::refused_retry`] (a fixed
//!    label or a created Dataset is enough);
//! 3. no claim yet: the live claim of its job is looked up first (an operator that died between submitting
//!    and writing the status submits nothing twice), else the claim is submitted; the agent's refusals
//!    (quota, missing data, another team's prefix) are `Failed` with the agent's reason;
//! 4. the status is the agent's claim ([`crate::convert::status_of`]) and is written only when it differs:
//!    a second pass over an unchanged claim writes nothing. Every phase change is an event;
//! 5. live claims are heartbeated every [`HEARTBEAT_SECS`]; staging claims are looked at again after
//!    [`Settings::staging_poll`];
//! 6. a Ready claim with mounts: each node one of its pods is bound to (and not started on) has its agent
//!    mount the datasets there ([`attach_for_pods`]; the pods wait in their `strata-mounts` init container),
//!    recorded in `status.mountedNodes`; a node that cannot is a `MountFailed` event and a look again soon.
//!
//! Deletion: the claim is released and the finalizer removed. An agent that cannot be reached is retried
//! (backoff through the error policy) until [`Settings::force_release_after`] has passed since the deletion;
//! then the finalizer goes anyway with a Warning event `ForcedRelease`: the agents release the claim on their
//! own when its TTL ([`crate::convert::CLAIM_TTL_SECS`]) passes without a heartbeat. Nothing waits forever.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use strata_claim::ClaimState;
use strata_types::{Error, ErrorKind, Result};

use crate::agent::Claims;
use crate::convert::{self, HEARTBEAT_SECS};
use crate::crd::{ClaimPhase, DataClaim, DataClaimStatus, Dataset};
use crate::metrics::Metrics;
use crate::webhook::CLAIM_LABEL;

/// The finalizer the operator puts on every DataClaim.
pub const FINALIZER: &str = "strata.dev/release";
/// The field manager of the operator's writes.
pub const MANAGER: &str = "strata-operator";

/// How the reconciler paces itself.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often a claim being staged is looked at (default 2 s).
    pub staging_poll: Duration,
    /// How long a deleted DataClaim's release is retried before the finalizer goes without it (default 5 min).
    pub force_release_after: Duration,
    /// How often a DataClaim the operator refused (no team label, a missing Dataset, a bad spec) is looked
    /// at again, so that fixing the namespace or creating the Dataset is enough (default 60 s). The agent's
    /// own refusals (quota, missing data) are final.
    pub refused_retry: Duration,
    /// How often a Dataset's cached share is counted again when nothing is being staged (default 60 s).
    pub dataset_poll: Duration,
    /// Where the agents mount DataClaims' datasets on the nodes ([`convert::MOUNT_ROOT`] by default): a
    /// directory the agents' mounts propagate from to the node, which pods get as hostPath volumes.
    pub mount_root: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            staging_poll: Duration::from_secs(2),
            force_release_after: Duration::from_secs(300),
            refused_retry: Duration::from_secs(60),
            dataset_poll: Duration::from_secs(60),
            mount_root: convert::MOUNT_ROOT.to_string(),
        }
    }
}

/// What one reconcile needs.
pub struct Context<C> {
    /// The Kubernetes API.
    pub client: Client,
    /// The agents' claims API.
    pub claims: C,
    /// Events about DataClaims.
    pub recorder: Recorder,
    /// Pacing.
    pub settings: Settings,
    /// The operator's metrics.
    pub metrics: Metrics,
    /// The agents' nodes (their Service's ready endpoints): a Ready claim's `status.nodes`, since staging
    /// spreads its blocks over every member. `None`: not known (the status says no nodes).
    pub agent_nodes: Option<Arc<crate::EndpointMembers>>,
}

impl<C> std::fmt::Debug for Context<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A Kubernetes API error as a Strata error: its kind from the status code, retryable unless the request
/// itself was wrong.
pub fn kube_error(what: &str, e: kube::Error) -> Error {
    let kind = match &e {
        kube::Error::Api(s) => match s.code {
            404 => ErrorKind::NotFound,
            409 => ErrorKind::AlreadyExists,
            410 => ErrorKind::PreconditionFailed,
            401 => ErrorKind::Unauthenticated,
            403 => ErrorKind::PermissionDenied,
            422 | 400 => ErrorKind::InvalidInput,
            429 => ErrorKind::ResourceExhausted,
            _ => ErrorKind::Unavailable,
        },
        _ => ErrorKind::Unavailable,
    };
    // A conflict or a stale version is answered by reading again: retryable, like the server being away.
    let retryable = !matches!(
        kind,
        ErrorKind::InvalidInput | ErrorKind::PermissionDenied | ErrorKind::Unauthenticated
    );
    Error::new(kind, format!("Kubernetes API, {what}: {e}")).with_retryable(retryable)
}

/// One reconcile of `dc`.
pub async fn reconcile<C: Claims>(dc: Arc<DataClaim>, ctx: Arc<Context<C>>) -> Result<Action> {
    let ns = dc.namespace().unwrap_or_else(|| "default".into());
    let api: Api<DataClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let started = std::time::Instant::now();
    let r = finalizer(&api, FINALIZER, dc, |event| async {
        match event {
            Finalizer::Apply(dc) => apply(&dc, &ctx, &api).await,
            Finalizer::Cleanup(dc) => cleanup(&dc, &ctx).await,
        }
    })
    .await
    .map_err(finalizer_error);
    ctx.metrics.reconciled(r.is_ok(), started.elapsed());
    r
}

/// A finalizer helper's error as the error of the step that failed.
pub(crate) fn finalizer_error(e: kube::runtime::finalizer::Error<Error>) -> Error {
    match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => kube_error("the finalizer", e),
        other => Error::new(ErrorKind::InvalidInput, other.to_string()),
    }
}

/// What the controller does after a failed reconcile: try again soon, later (every
/// [`Settings::refused_retry`]) for errors that need a person.
pub fn error_policy<C: Claims>(dc: Arc<DataClaim>, e: &Error, ctx: Arc<Context<C>>) -> Action {
    tracing::warn!(claim = %dc.name_any(), error = %e, "reconcile failed");
    if e.is_retryable() {
        Action::requeue(Duration::from_secs(5))
    } else {
        // An error a person must mend (RBAC, a bad token) is looked at as often as a refused DataClaim.
        Action::requeue(ctx.settings.refused_retry)
    }
}

async fn apply<C: Claims>(
    dc: &DataClaim,
    ctx: &Context<C>,
    api: &Api<DataClaim>,
) -> Result<Action> {
    let ns = dc.namespace().unwrap_or_else(|| "default".into());
    let now = Timestamp::now().to_string();
    let generation = dc.metadata.generation;
    let old = dc.status.as_ref();
    let refuse = |e: &Error| convert::refused(e.message(), generation, old, &now);

    let labels = namespace_labels(ctx, &ns).await?;
    let team = match convert::team_of(dc, &labels) {
        Ok(t) => t,
        Err(e) => return settle(dc, ctx, api, refuse(&e), ctx.settings.refused_retry).await,
    };

    let claim = match old.and_then(|s| s.claim_id.clone()) {
        Some(id) => match ctx.claims.get(&id).await {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                let e = Error::new(
                    ErrorKind::NotFound,
                    format!("the agents have no claim {id} any more (released by its TTL?)"),
                );
                return settle(dc, ctx, api, refuse(&e), Duration::ZERO).await;
            }
            Err(e) => return Err(e),
        },
        None => {
            let datasets = dataset_sources(ctx, &ns, dc).await?;
            let spec = match convert::claim_spec(dc, &team, &ctx.settings.mount_root, |r| {
                datasets.get(r).cloned()
            }) {
                Ok(s) => s,
                Err(e) => {
                    return settle(dc, ctx, api, refuse(&e), ctx.settings.refused_retry).await;
                }
            };
            match ctx.claims.find_live(&team, &spec.job).await? {
                Some(c) => c,
                None => match ctx.claims.submit(&spec).await {
                    Ok(c) => c,
                    Err(e) if !e.is_retryable() => {
                        return settle(dc, ctx, api, refuse(&e), Duration::ZERO).await;
                    }
                    Err(e) => return Err(e),
                },
            }
        }
    };
    let live = !matches!(claim.state, ClaimState::Released);
    let stale_heartbeat =
        Timestamp::now().as_second() - claim.heartbeat_at >= HEARTBEAT_SECS as i64;
    if live && stale_heartbeat {
        ctx.claims.heartbeat(&claim.id).await?;
    }
    let mut status = convert::status_of(dc, &claim, generation, old, &now);
    status.nodes = match (&status.phase, &ctx.agent_nodes) {
        (ClaimPhase::Ready, Some(m)) => m.nodes(),
        _ => Vec::new(),
    };
    let mut attach_failed = false;
    if status.phase == ClaimPhase::Ready && !status.mounts.is_empty() {
        let (mounted, failed) = attach_for_pods(dc, ctx, &claim.id, &status.mounted_nodes).await?;
        status.mounted_nodes = mounted;
        attach_failed = failed;
    }
    let next = match status.phase {
        ClaimPhase::Pending | ClaimPhase::Staging => ctx.settings.staging_poll,
        _ if attach_failed => ctx.settings.staging_poll,
        _ => Duration::from_secs(HEARTBEAT_SECS),
    };
    settle(dc, ctx, api, status, next).await
}

/// Most nodes asked to mount a claim's datasets at once.
const ATTACH_CONCURRENCY: usize = 16;
/// Longest one node's agent may take to mount them.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(120);

/// Have the agent of each node a pod of `dc` is bound to, and not started on yet, mount claim `id`'s datasets
/// there (idempotent on the agent: a mount already there is kept, so a node whose agent lost its mounts gets
/// them again). The pods wait for the mounts in their `strata-mounts` init container. Returns the nodes
/// mounted so far (`done` and those mounted now, sorted) and whether a node could not be mounted (each such
/// node is a Warning event; the caller looks again soon).
async fn attach_for_pods<C: Claims>(
    dc: &DataClaim,
    ctx: &Context<C>,
    id: &str,
    done: &[String],
) -> Result<(Vec<String>, bool)> {
    use futures::StreamExt;
    let ns = dc.namespace().unwrap_or_else(|| "default".into());
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("{CLAIM_LABEL}={}", dc.name_any())))
        .await
        .map_err(|e| kube_error("listing the DataClaim's pods", e))?;
    // Bound to a node and not started there yet: a pod that runs already has its mounts.
    let nodes: BTreeSet<String> = list
        .items
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            matches!(phase, None | Some("Pending"))
        })
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let agents = ctx
        .agent_nodes
        .as_ref()
        .map(|m| m.agents_by_node())
        .unwrap_or_default();
    let results: Vec<(String, Result<()>)> = futures::stream::iter(nodes)
        .map(|node| {
            let agent = agents.get(&node).cloned();
            async move {
                let r = match agent {
                    None => Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "node {node} runs no ready Strata agent: the DataClaim's datasets cannot be \
                             mounted there (its pods wait in their strata-mounts init container)"
                        ),
                    )),
                    Some(a) => match tokio::time::timeout(ATTACH_TIMEOUT, ctx.claims.attach(&a, id)).await {
                        Ok(r) => r,
                        Err(_) => Err(Error::new(
                            ErrorKind::Timeout,
                            format!("the agent of node {node} did not mount the datasets in {} s", ATTACH_TIMEOUT.as_secs()),
                        )),
                    },
                };
                (node, r)
            }
        })
        .buffer_unordered(ATTACH_CONCURRENCY)
        .collect()
        .await;
    let mut mounted: BTreeSet<String> = done.iter().cloned().collect();
    let mut failed = false;
    for (node, r) in results {
        match r {
            Ok(()) => {
                if mounted.insert(node.clone()) {
                    tracing::info!(claim = %id, %node, "datasets mounted for a pod");
                }
            }
            Err(e) => {
                failed = true;
                let note = format!("mounting the datasets on node {node}: {e}");
                publish(ctx, dc, EventType::Warning, "MountFailed", "Attach", note).await;
            }
        }
    }
    Ok((mounted.into_iter().collect(), failed))
}

/// Write `status` if it differs from what `dc` has (and say so with an event when the phase changed); then
/// look again after `next` (never, for zero: a refused claim waits for its spec to change).
async fn settle<C: Claims>(
    dc: &DataClaim,
    ctx: &Context<C>,
    api: &Api<DataClaim>,
    status: DataClaimStatus,
    next: Duration,
) -> Result<Action> {
    let old = dc.status.as_ref();
    let changed = !same(old, &status);
    ctx.metrics.status("DataClaim", changed);
    if !changed {
        tracing::debug!(object = %format!("{}/{}", dc.namespace().unwrap_or_default(), dc.name_any()),
            kind = "DataClaim", "status unchanged, nothing written");
    }
    if changed {
        write_status(api, &dc.name_any(), old, &status, "writing the status").await?;
        let was = old.map(|o| o.phase);
        if was != Some(status.phase) {
            let (type_, reason) = match status.phase {
                ClaimPhase::Failed => (EventType::Warning, "Failed"),
                ClaimPhase::Ready => (EventType::Normal, "Ready"),
                ClaimPhase::Staging => (EventType::Normal, "Staging"),
                ClaimPhase::Pending => (EventType::Normal, "Admitted"),
                ClaimPhase::Released => (EventType::Normal, "Released"),
            };
            let note = if status.reason.is_empty() {
                format!("{:?}: {}", status.phase, status.progress.summary)
            } else {
                status.reason.clone()
            };
            publish(ctx, dc, type_, reason, "Reconcile", note).await;
        }
    }
    Ok(if next.is_zero() {
        Action::await_change()
    } else {
        Action::requeue(next)
    })
}

/// Write `new` as object `name`'s status through the status subresource: a merge patch of what differs from
/// `old` ([`merge_diff`]); an error is `what` failing.
pub(crate) async fn write_status<K, S>(
    api: &Api<K>,
    name: &str,
    old: Option<&S>,
    new: &S,
    what: &str,
) -> Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    S: serde::Serialize,
{
    let before = old.map_or(serde_json::Value::Null, |o| {
        serde_json::to_value(o).unwrap_or_default()
    });
    let after = serde_json::to_value(new).unwrap_or_default();
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": merge_diff(&before, &after) })),
    )
    .await
    .map_err(|e| kube_error(what, e))?;
    Ok(())
}

/// The JSON merge patch (RFC 7386) that turns `old` into `new`: what `new` leaves out is `null`, so a field
/// that goes away (an ETA at Ready) is removed, not kept by the merge; without it the stored status never
/// equals the computed one and every pass would write again.
pub(crate) fn merge_diff(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) => {
                        out.insert(k.clone(), merge_diff(ov, nv));
                    }
                    None => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                out.insert(k.clone(), Value::Null);
            }
            Value::Object(out)
        }
        _ => new.clone(),
    }
}

/// Whether writing `new` over `old` would change anything.
fn same(old: Option<&DataClaimStatus>, new: &DataClaimStatus) -> bool {
    old.is_some_and(|o| o == new)
}

async fn cleanup<C: Claims>(dc: &DataClaim, ctx: &Context<C>) -> Result<Action> {
    let job = convert::job_id(
        &dc.namespace().unwrap_or_default(),
        &dc.name_any(),
        dc.metadata.uid.as_deref().unwrap_or_default(),
    );
    let status = dc.status.as_ref();
    release_for(
        ctx,
        dc,
        status.and_then(|s| s.claim_id.clone()),
        status.and_then(|s| s.team.clone()),
        &job,
        "the DataClaim was deleted",
    )
    .await
}

/// Release the claim of `obj` being deleted: claim `id`, else the live claim of `job` charged to `team` (an
/// operator that died between submitting and writing the status). Retried (an error) while the agents cannot
/// be reached, until [`Settings::force_release_after`] has passed since the deletion: then given up with a
/// `ForcedRelease` Warning event (the agents release the claim when its TTL passes without a heartbeat).
pub(crate) async fn release_for<C: Claims, K: Resource<DynamicType = ()>>(
    ctx: &Context<C>,
    obj: &K,
    id: Option<String>,
    team: Option<String>,
    job: &str,
    why: &str,
) -> Result<Action> {
    let id = match (id, team) {
        (Some(id), _) => Some(id),
        (None, Some(team)) => ctx
            .claims
            .find_live(&team, job)
            .await
            .ok()
            .flatten()
            .map(|c| c.id),
        (None, None) => None,
    };
    let Some(id) = id else {
        return Ok(Action::await_change());
    };
    match ctx.claims.release(&id, why).await {
        Ok(()) => {
            publish(
                ctx,
                obj,
                EventType::Normal,
                "Released",
                "Release",
                format!("released {id}"),
            )
            .await;
            Ok(Action::await_change())
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Action::await_change()),
        Err(e) => {
            let deleted = obj
                .meta()
                .deletion_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or_else(|| Timestamp::now().as_second());
            let waited = Timestamp::now().as_second() - deleted;
            if waited >= ctx.settings.force_release_after.as_secs() as i64 {
                let note = format!(
                    "could not release {id} for {waited} s ({e}); the finalizer is removed and the agents \
                     release the claim when {} s pass without a heartbeat",
                    convert::CLAIM_TTL_SECS
                );
                publish(
                    ctx,
                    obj,
                    EventType::Warning,
                    "ForcedRelease",
                    "Release",
                    note,
                )
                .await;
                ctx.metrics.forced_release();
                Ok(Action::await_change())
            } else {
                Err(e)
            }
        }
    }
}

/// Object `name`, or `None` for any 404 (kube's own `get_opt` wants the reason `NotFound` as well, which
/// not every server sends).
pub(crate) async fn get_opt<K>(api: &Api<K>, name: &str, what: &str) -> Result<Option<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get(name).await {
        Ok(o) => Ok(Some(o)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(kube_error(what, e)),
    }
}

pub(crate) async fn namespace_labels<C: Claims>(
    ctx: &Context<C>,
    ns: &str,
) -> Result<BTreeMap<String, String>> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    Ok(get_opt(&api, ns, "reading the namespace")
        .await?
        .map(|n| n.labels().clone())
        .unwrap_or_default())
}

/// The `source` of each Dataset a DataClaim refers to.
async fn dataset_sources<C: Claims>(
    ctx: &Context<C>,
    ns: &str,
    dc: &DataClaim,
) -> Result<BTreeMap<String, String>> {
    let api: Api<Dataset> = Api::namespaced(ctx.client.clone(), ns);
    let mut out = BTreeMap::new();
    for r in dc
        .spec
        .datasets
        .iter()
        .filter_map(|d| d.dataset_ref.as_ref())
    {
        if let Some(d) = get_opt(&api, r, "reading a Dataset").await? {
            out.insert(r.clone(), d.spec.source);
        }
    }
    Ok(out)
}

pub(crate) async fn publish<C: Claims, K: Resource<DynamicType = ()>>(
    ctx: &Context<C>,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    // An event that cannot be written is not worth failing the reconcile for.
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        tracing::debug!(error = %e, "an event could not be written");
    }
}
