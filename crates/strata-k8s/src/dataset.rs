//! The Dataset reconciler: a Dataset's status says how much of its source's current version the cache
//! cluster holds, and on which nodes; its cache policy `prefetch` or `pin` is a claim on the agents that
//! stages (and for `pin`, pins) that version, and follows the source to its newest version.
//!
//! One pass ([`reconcile_dataset`]):
//! 1. the finalizer `strata.dev/release` goes on first, as on DataClaims: deleting a Dataset releases its
//!    claim (forced after [`Settings::force_release_after`] when the agents cannot be reached); its data is
//!    never deleted;
//! 2. the team is the namespace's `strata.dev/team` label; no label, `replicas` outside 1 to 8, a source the
//!    team may not read, a missing or empty source: `Ready` False with the reason (`Refused`), looked at
//!    again every [`Settings::refused_retry`];
//! 3. the source's coverage is asked of the agents (`GET /v1/coverage` as a reader of the team): the version
//!    listed now (a digest of keys, sizes and ETags) and the bytes of it each agent holds, counted where they
//!    live; nothing is fetched;
//! 4. `prefetch` or `pin`: the Dataset's claim (job [`dataset_job`], one dataset `data` in mode `stage` or
//!    `pin`, heartbeated like a DataClaim's) is submitted when there is none. A settled claim of an older
//!    version is released and one of the newest submitted; a claim of the wrong mode (the policy changed)
//!    goes at once; a failed staging is released (it holds no quota for nothing) and its version kept in
//!    `failedVersion`: not staged again until the source or the spec changes, so a staging that cannot
//!    succeed never loops. `none`: a claim left from an earlier policy is released;
//! 5. the status: per version (the newest, and the one the claim stages while that is older) bytes cached
//!    of the total; `cachedFraction`, whole percent rounded down (`100%` only when every byte is cached);
//!    the nodes whose agents hold blocks of the newest version; conditions `Ready` and `Cached`. Written only
//!    when it differs, with an event for each condition that changes;
//! 6. looked at again after [`Settings::staging_poll`] while a claim stages, else every
//!    [`Settings::dataset_poll`] (the cached share moves as jobs read and the cache evicts).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use strata_claim::{
    ClaimSpec, ClaimState, ClaimStatus, Coverage, DatasetClaim, Mode, SPEC_VERSION,
};
use strata_types::{ByteSize, Error, ErrorKind, Result};

use crate::agent::Claims;
use crate::convert::{self, CLAIM_TTL_SECS, HEARTBEAT_SECS, condition_among};
use crate::crd::{Condition, Dataset, DatasetStatus, DatasetVersionStatus, PrefetchMode};
use crate::reconcile::{
    Context, FINALIZER, finalizer_error, namespace_labels, publish, release_for, write_status,
};

/// The name of the one dataset of a Dataset's claim.
const DATA: &str = "data";

/// The job id of a Dataset's claim: `<namespace>/dataset:<name>/<uid8>` (apart from any DataClaim's, readable
/// in `strata usage --by job`).
pub fn dataset_job(namespace: &str, name: &str, uid: &str) -> String {
    convert::job_id(namespace, &format!("dataset:{name}"), uid)
}

/// One reconcile of `ds`.
pub async fn reconcile_dataset<C: Claims>(
    ds: Arc<Dataset>,
    ctx: Arc<Context<C>>,
) -> Result<Action> {
    let ns = ds.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Dataset> = Api::namespaced(ctx.client.clone(), &ns);
    let started = std::time::Instant::now();
    let r = finalizer(&api, FINALIZER, ds, |event| async {
        match event {
            Finalizer::Apply(ds) => apply(&ds, &ctx, &api).await,
            Finalizer::Cleanup(ds) => cleanup(&ds, &ctx).await,
        }
    })
    .await
    .map_err(finalizer_error);
    ctx.metrics.reconciled(r.is_ok(), started.elapsed());
    r
}

/// What the controller does after a failed Dataset reconcile: as for DataClaims.
pub fn dataset_error_policy<C: Claims>(
    ds: Arc<Dataset>,
    e: &Error,
    ctx: Arc<Context<C>>,
) -> Action {
    tracing::warn!(dataset = %ds.name_any(), error = %e, "reconcile failed");
    if e.is_retryable() {
        Action::requeue(Duration::from_secs(5))
    } else {
        Action::requeue(ctx.settings.refused_retry)
    }
}

/// The claim mode a cache policy asks for (`None`: no claim).
fn wanted(mode: PrefetchMode) -> Option<Mode> {
    match mode {
        PrefetchMode::None => None,
        PrefetchMode::Prefetch => Some(Mode::Stage),
        PrefetchMode::Pin => Some(Mode::Pin),
    }
}

/// The agents' claim that stages `ds` for `team` in `mode`. Errors name the Dataset's field.
pub fn dataset_claim_spec(ds: &Dataset, team: &str, mode: Mode) -> Result<ClaimSpec> {
    let spec = ClaimSpec {
        version: SPEC_VERSION,
        job: dataset_job(
            ds.metadata.namespace.as_deref().unwrap_or("default"),
            ds.metadata.name.as_deref().unwrap_or_default(),
            ds.metadata.uid.as_deref().unwrap_or_default(),
        ),
        team: team.to_string(),
        datasets: vec![DatasetClaim {
            name: DATA.to_string(),
            location: ds.spec.source.clone(),
            mode,
            mount: None,
            replicas: ds.spec.cache.replicas,
        }],
        checkpoint: None,
        scratch: None,
        ttl_secs: Some(CLAIM_TTL_SECS),
        stage_deadline_secs: ds.spec.cache.stage_deadline_seconds,
    };
    spec.validate().map_err(|errs| {
        let list: Vec<String> = errs
            .iter()
            .map(|e| {
                let field = match e.field.as_str() {
                    "stage_deadline_secs" => "spec.cache.stageDeadlineSeconds".to_string(),
                    f if f.starts_with("datasets[0].location") => "spec.source".to_string(),
                    f if f.starts_with("datasets[0].replicas") => "spec.cache.replicas".to_string(),
                    f => format!("spec ({f})"),
                };
                format!("{field}: {}", e.message)
            })
            .collect();
        Error::invalid_input(list.join("; "))
    })?;
    Ok(spec)
}

/// What one pass decided about the Dataset's claim.
#[derive(Default)]
struct ClaimView {
    claim: Option<ClaimStatus>,
    version: Option<String>,
    failed_version: Option<String>,
    reason: String,
}

async fn apply<C: Claims>(ds: &Dataset, ctx: &Context<C>, api: &Api<Dataset>) -> Result<Action> {
    let ns = ds.namespace().unwrap_or_else(|| "default".into());
    let now = Timestamp::now().to_string();
    let generation = ds.metadata.generation;
    let old = ds.status.as_ref();
    let refuse = |team: Option<String>, reason: String| DatasetStatus {
        observed_generation: generation,
        conditions: vec![
            condition_among(
                old.map(|o| o.conditions.as_slice()),
                "Ready",
                "False",
                "Refused",
                &reason,
                generation,
                &now,
            ),
            condition_among(
                old.map(|o| o.conditions.as_slice()),
                "Cached",
                "Unknown",
                "Refused",
                &reason,
                generation,
                &now,
            ),
        ],
        team,
        reason,
        // A claim it had stays known, so that deleting the Dataset still releases it.
        claim_id: old.and_then(|o| o.claim_id.clone()),
        claim_version: old.and_then(|o| o.claim_version.clone()),
        ..DatasetStatus::default()
    };
    let retry = ctx.settings.refused_retry;

    let labels = namespace_labels(ctx, &ns).await?;
    let team = match convert::team_in(&ns, &labels, None) {
        Ok(t) => t,
        Err(e) => return settle(ds, ctx, api, refuse(None, e.message().into()), retry).await,
    };
    if let Some(r) = ds
        .spec
        .cache
        .replicas
        .filter(|r| !(1..=strata_claim::MAX_REPLICAS).contains(r))
    {
        let why = format!(
            "spec.cache.replicas: {r}: use 1 to {} (copies of each block, at most one per node)",
            strata_claim::MAX_REPLICAS
        );
        return settle(ds, ctx, api, refuse(Some(team), why), retry).await;
    }
    let cov = match ctx.claims.coverage(&ds.spec.source, &team).await {
        Ok(c) if c.objects == 0 => {
            let why = format!("spec.source: no objects under {:?}", ds.spec.source);
            return settle(ds, ctx, api, refuse(Some(team), why), retry).await;
        }
        Ok(c) => c,
        Err(e) if !e.is_retryable() => {
            let why = format!("spec.source: {}", e.message());
            return settle(ds, ctx, api, refuse(Some(team), why), retry).await;
        }
        Err(e) => return Err(e),
    };
    let want = wanted(ds.spec.cache.mode);
    let view = match claim_of(ds, ctx, &team, want, &cov).await {
        Ok(v) => v,
        Err(e) if !e.is_retryable() => {
            return settle(ds, ctx, api, refuse(Some(team), e.message().into()), retry).await;
        }
        Err(e) => return Err(e),
    };
    if let Some(c) = &view.claim {
        let stale = Timestamp::now().as_second() - c.heartbeat_at >= HEARTBEAT_SECS as i64;
        if stale && c.state != ClaimState::Released {
            ctx.claims.heartbeat(&c.id).await?;
        }
    }
    let status = status_of(ds, ctx, team, want, &cov, &view, generation, &now);
    let staging = view
        .claim
        .as_ref()
        .is_some_and(|c| matches!(c.state, ClaimState::Pending | ClaimState::Staging));
    let next = if staging {
        ctx.settings.staging_poll
    } else {
        ctx.settings.dataset_poll
    };
    settle(ds, ctx, api, status, next).await
}

/// The Dataset's claim after this pass: the one it has, released when it is of the wrong mode, an older
/// version (once settled) or failed, and a new one submitted where the policy wants one.
async fn claim_of<C: Claims>(
    ds: &Dataset,
    ctx: &Context<C>,
    team: &str,
    want: Option<Mode>,
    cov: &Coverage,
) -> Result<ClaimView> {
    let old = ds.status.as_ref();
    let mut v = ClaimView {
        version: old.and_then(|s| s.claim_version.clone()),
        // A changed spec is a reason to try a failed version again.
        failed_version: old
            .filter(|s| s.observed_generation == ds.metadata.generation)
            .and_then(|s| s.failed_version.clone()),
        ..ClaimView::default()
    };
    if let Some(id) = old.and_then(|s| s.claim_id.clone()) {
        v.claim = match ctx.claims.get(&id).await {
            Ok(c) if c.state != ClaimState::Released => Some(c),
            Ok(_) => None,
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
    }
    if let Some(c) = v.claim.clone() {
        let mode = c.spec.datasets.first().map(|d| d.mode);
        let current = v.version.as_deref() == Some(cov.version.as_str());
        let why = if want.is_none() {
            Some("the Dataset's cache mode is none now".to_string())
        } else if mode != want {
            Some("the Dataset's cache mode changed".to_string())
        } else if c.state == ClaimState::Failed {
            v.failed_version = v.version.clone();
            v.reason = format!(
                "staging version {} failed: {}",
                v.version.as_deref().unwrap_or("?"),
                c.reason
            );
            Some("its staging failed".to_string())
        } else if c.state.settled() && !current {
            Some(format!("the source has a newer version, {}", cov.version))
        } else {
            None
        };
        if let Some(why) = why {
            match ctx.claims.release(&c.id, &why).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let note = format!("released {} ({why})", c.id);
            publish(ctx, ds, EventType::Normal, "Released", "Release", note).await;
            v.claim = None;
            v.version = None;
        }
    }
    let Some(mode) = want else {
        v.version = None;
        return Ok(v);
    };
    if v.claim.is_some() {
        return Ok(v);
    }
    if v.failed_version.as_deref() == Some(cov.version.as_str()) {
        // Not tried again until the source or the spec changes.
        if v.reason.is_empty() {
            v.reason = old.map(|s| s.reason.clone()).unwrap_or_default();
        }
        return Ok(v);
    }
    v.failed_version = None;
    let spec = dataset_claim_spec(ds, team, mode)?;
    let c = match ctx.claims.find_live(team, &spec.job).await? {
        Some(c) => c,
        None => match ctx.claims.submit(&spec).await {
            Ok(c) => c,
            Err(e) if !e.is_retryable() => {
                v.failed_version = Some(cov.version.clone());
                v.reason = format!(
                    "the agents refused to stage version {}: {}",
                    cov.version,
                    e.message()
                );
                return Ok(v);
            }
            Err(e) => return Err(e),
        },
    };
    // The claim's snapshot was listed after the coverage's (and a claim found live may have been submitted
    // by an operator that died before writing the status): it is of this version if its size says so; else
    // it counts as another, replaced once it settles.
    let same = c
        .datasets
        .first()
        .is_some_and(|d| d.objects == cov.objects && d.bytes == cov.bytes_total);
    v.version = same.then(|| cov.version.clone());
    v.claim = Some(c);
    Ok(v)
}

/// The nodes whose agents hold blocks of `cov`, from the agents' EndpointSlices (sorted).
fn nodes_holding<C: Claims>(ctx: &Context<C>, cov: &Coverage) -> Vec<String> {
    let Some(members) = &ctx.agent_nodes else {
        return Vec::new();
    };
    let node_of: BTreeMap<String, String> = members
        .agents_by_node()
        .into_iter()
        .map(|(node, agent)| (agent, node))
        .collect();
    let mut nodes: Vec<String> = cov
        .members
        .iter()
        .filter(|m| m.bytes_held > 0)
        .filter_map(|m| node_of.get(m.member.trim_end_matches('/')).cloned())
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

#[allow(clippy::too_many_arguments)]
fn status_of<C: Claims>(
    ds: &Dataset,
    ctx: &Context<C>,
    team: String,
    want: Option<Mode>,
    cov: &Coverage,
    view: &ClaimView,
    generation: Option<i64>,
    now: &str,
) -> DatasetStatus {
    let old = ds.status.as_ref().map(|o| o.conditions.as_slice());
    let mut versions = vec![DatasetVersionStatus {
        version: cov.version.clone(),
        objects: cov.objects,
        total_bytes: cov.bytes_total,
        cached_bytes: cov.bytes_held,
    }];
    if let (Some(c), Some(ver)) = (&view.claim, &view.version)
        && *ver != cov.version
    {
        let d = c.datasets.first();
        versions.push(DatasetVersionStatus {
            version: ver.clone(),
            objects: d.map_or(c.progress.objects_total, |d| d.objects),
            total_bytes: d.map_or(c.progress.bytes_total, |d| d.bytes),
            cached_bytes: c.progress.bytes_done,
        });
    }
    let current = view.version.as_deref() == Some(cov.version.as_str());
    let listed = format!(
        "version {}: {} objects, {}",
        cov.version,
        cov.objects,
        ByteSize(cov.bytes_total)
    );
    let (ready, why, message) = match (&want, &view.claim) {
        (None, _) => ("True", "Listed", listed),
        (Some(m), Some(c)) if c.state == ClaimState::Ready && current => (
            "True",
            "Staged",
            format!(
                "{listed}, staged{}",
                if *m == Mode::Pin { " and pinned" } else { "" }
            ),
        ),
        (Some(_), Some(c)) => (
            "False",
            "Staging",
            format!("{}: {}", c.id, c.progress.summary()),
        ),
        (Some(_), None) => ("False", "StagingFailed", view.reason.clone()),
    };
    let (cached, cached_why, cached_message) = if !cov.complete {
        let silent: Vec<&str> = cov
            .members
            .iter()
            .filter(|m| m.error.is_some())
            .map(|m| m.member.as_str())
            .collect();
        (
            "Unknown",
            "Uncounted",
            format!(
                "not every agent could be counted (silent: {}); at least {}% of version {} is cached",
                silent.join(", "),
                cov.percent(),
                cov.version
            ),
        )
    } else if cov.bytes_held == cov.bytes_total && cov.blocks_held == cov.blocks_total {
        (
            "True",
            "Cached",
            format!("every block of version {} is cached", cov.version),
        )
    } else {
        (
            "False",
            "Partial",
            format!(
                "{}% of version {} is cached ({} of {})",
                cov.percent(),
                cov.version,
                ByteSize(cov.bytes_held),
                ByteSize(cov.bytes_total)
            ),
        )
    };
    DatasetStatus {
        observed_generation: generation,
        versions,
        cached_fraction: Some(format!("{}%", cov.percent())),
        nodes: nodes_holding(ctx, cov),
        conditions: vec![
            condition_among(old, "Ready", ready, why, &message, generation, now),
            condition_among(
                old,
                "Cached",
                cached,
                cached_why,
                &cached_message,
                generation,
                now,
            ),
        ],
        team: Some(team),
        reason: if ready == "True" {
            String::new()
        } else {
            view.reason.clone()
        },
        claim_id: view.claim.as_ref().map(|c| c.id.clone()),
        claim_version: view.claim.as_ref().and(view.version.clone()),
        progress: view
            .claim
            .as_ref()
            .map(|c| convert::progress_of(&c.progress)),
        failed_version: view.failed_version.clone(),
    }
}

/// Write `status` if it differs from what `ds` has, with an event for each condition whose status or reason
/// changed;
/// then look again after `next`.
async fn settle<C: Claims>(
    ds: &Dataset,
    ctx: &Context<C>,
    api: &Api<Dataset>,
    status: DatasetStatus,
    next: Duration,
) -> Result<Action> {
    let old = ds.status.as_ref();
    let changed = old != Some(&status);
    ctx.metrics.status("Dataset", changed);
    if !changed {
        tracing::debug!(object = %format!("{}/{}", ds.namespace().unwrap_or_default(), ds.name_any()),
            kind = "Dataset", "status unchanged, nothing written");
    }
    if changed {
        write_status(
            api,
            &ds.name_any(),
            old,
            &status,
            "writing the Dataset's status",
        )
        .await?;
        for c in &status.conditions {
            let was = old.and_then(|o| o.conditions.iter().find(|o| o.type_ == c.type_));
            if was.is_some_and(|w| w.status == c.status && w.reason == c.reason) {
                continue;
            }
            publish(
                ctx,
                ds,
                event_type(c),
                &c.reason,
                "Reconcile",
                c.message.clone(),
            )
            .await;
        }
    }
    Ok(Action::requeue(next))
}

fn event_type(c: &Condition) -> EventType {
    match (c.status.as_str(), c.reason.as_str()) {
        ("False", "Refused" | "StagingFailed") => EventType::Warning,
        _ => EventType::Normal,
    }
}

async fn cleanup<C: Claims>(ds: &Dataset, ctx: &Context<C>) -> Result<Action> {
    let job = dataset_job(
        &ds.namespace().unwrap_or_default(),
        &ds.name_any(),
        ds.metadata.uid.as_deref().unwrap_or_default(),
    );
    let status = ds.status.as_ref();
    release_for(
        ctx,
        ds,
        status.and_then(|s| s.claim_id.clone()),
        status.and_then(|s| s.team.clone()),
        &job,
        "the Dataset was deleted",
    )
    .await
}
