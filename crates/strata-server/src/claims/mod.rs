//! Claims on the control API: a job declares its data ([`strata_claim::ClaimSpec`]) and the agent admits,
//! stages and releases it. `admit` (validation, versions pinned, quota first, protections, pins), `stage`
//! (staging with progress and a verdict, resumed after a restart), `release` (idempotent; TTL expiry). The
//! Slurm and Kubernetes integrations drive these routes; docs/claims.md says what each state means.

mod admit;
mod coverage;
pub mod mounter;
mod mounts;
mod release;
mod stage;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Extension, Path as UrlPath, State};
use axum::routing::{get, post};
use strata_catalog::claims::ClaimRecord;
use strata_catalog::{Principal, Role};
use strata_claim::{ClaimSpec, ClaimState, ClaimStatus, JobUsage};
use strata_types::{Error, ErrorKind, Result};

use crate::Agent;
use crate::http::{ApiResult, Query, Reply, Route, route};
use strata_api as api;
use strata_api::claims as c;

pub use admit::{MAX_OBJECTS, env_name};
pub use coverage::version_of;
pub(crate) use release::expire;
pub(crate) use stage::resume;

/// The claim routes.
pub fn routes() -> Vec<Route> {
    vec![
        route::<api::claims::ClaimSchema>(get(schema)),
        route::<api::claims::ValidateClaim>(post(validate)),
        route::<api::claims::SubmitClaim>(post(submit)),
        route::<api::claims::ListClaims>(get(list)),
        route::<api::claims::GetCoverage>(get(coverage::coverage)),
        route::<api::claims::GetClaim>(get(one)),
        route::<api::claims::ClaimObjects>(get(objects)),
        route::<api::claims::ClaimHeartbeat>(post(heartbeat)),
        route::<api::claims::ReleaseClaim>(post(release_route)),
        route::<api::claims::AttachClaim>(post(attach)),
        route::<api::claims::DetachClaim>(post(detach)),
    ]
}

async fn schema() -> Reply<c::ClaimSchema> {
    Reply(c::SchemaDocument(strata_claim::schema()))
}

async fn validate(
    Extension(_p): Extension<Principal>,
    b: Bytes,
) -> ApiResult<Reply<c::ValidateClaim>> {
    let spec = ClaimSpec::from_json(&b)?;
    // Only the verdict: the document is the caller's own.
    Ok(Reply(c::Validated {
        valid: true,
        datasets: spec.datasets.len(),
        checkpoint: spec.checkpoint.is_some(),
        scratch: spec.scratch.is_some(),
    }))
}

async fn submit(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    b: Bytes,
) -> ApiResult<Reply<c::SubmitClaim>> {
    let spec = ClaimSpec::from_json(&b)?;
    let id = admit::admit(&a, &p, spec).await?;
    stage::spawn(&a, &id);
    Ok(Reply(status(&a, &a.catalog().claim(&id).await?).await?))
}

async fn list(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    Query(q): Query<api::claims::ClaimsQuery>,
) -> ApiResult<Reply<c::ListClaims>> {
    let mut out = Vec::new();
    for c in a
        .catalog()
        .list_claims(p.visible_teams().as_deref(), q.released)
        .await?
    {
        if q.team.as_ref().is_some_and(|t| *t != c.team)
            || q.job.as_ref().is_some_and(|j| *j != c.job)
        {
            continue;
        }
        out.push(status(&a, &c).await?);
    }
    Ok(Reply(out))
}

/// A claim the caller may see with `need`; others' claims do not exist to it.
async fn visible(a: &Agent, p: &Principal, id: &str, need: Role) -> Result<ClaimRecord> {
    let hidden = || Error::new(ErrorKind::NotFound, format!("no claim {id:?}"));
    let c = a.catalog().claim(id).await.map_err(|_| hidden())?;
    if !p.can(&c.team, Role::Reader) {
        return Err(hidden());
    }
    p.require(&c.team, need)?;
    Ok(c)
}

async fn one(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Reply<c::GetClaim>> {
    let c = visible(&a, &p, &id, Role::Reader).await?;
    Ok(Reply(status(&a, &c).await?))
}

/// A page of the objects one dataset of a claim admitted, named relative to the dataset's location (as
/// `GET /v1/list` names them): `{location, objects, next}`.
async fn objects(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<api::claims::ObjectsQuery>,
) -> ApiResult<Reply<c::ClaimObjects>> {
    let c = visible(&a, &p, &id, Role::Reader).await?;
    let spec = stored_spec(&c)?;
    let d = spec
        .datasets
        .iter()
        .find(|d| d.name == q.dataset)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("claim {id} has no dataset {:?}", q.dataset),
            )
        })?;
    let limit = q.limit.unwrap_or(1000);
    if !(1..=1000).contains(&limit) {
        return Err(Error::invalid_input(format!("limit {limit}: between 1 and 1000")).into());
    }
    let (_, prefix) = a.resolve(&d.location)?;
    let mut page: Vec<api::data::ListedObject> = Vec::new();
    let mut next = None;
    for o in a.catalog().claim_objects(&id).await? {
        if o.dataset != d.name {
            continue;
        }
        let Some(name) = o.key.strip_prefix(&prefix) else {
            continue;
        };
        if q.after.as_deref().is_some_and(|after| name <= after) {
            continue;
        }
        if page.len() == limit {
            next = page.last().map(|v| v.name.clone());
            break;
        }
        page.push(api::data::ListedObject {
            name: name.to_string(),
            size: u64::try_from(o.size).unwrap_or(0),
            etag: o.etag,
            version: o.version,
            last_modified_unix: o.modified_at,
        });
    }
    Ok(Reply(c::ClaimObjectsPage {
        location: d.location.clone(),
        objects: page,
        next,
    }))
}

/// An optional JSON body: empty is the default; unknown fields are refused.
fn optional_body<T: serde::de::DeserializeOwned + Default>(b: &Bytes) -> Result<T> {
    if b.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| Error::invalid_input(format!("request body: {e}")))
}

async fn heartbeat(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<c::ClaimHeartbeat>> {
    let body: api::claims::Heartbeat = optional_body(&b)?;
    let stall = match (body.stall_secs, body.reporter) {
        (None, None) => None,
        (Some(s), Some(r)) => {
            if !s.is_finite() || !(0.0..=1e9).contains(&s) {
                return Err(Error::invalid_input(format!(
                    "stall_secs {s}: a number of seconds, 0 to 1e9"
                ))
                .into());
            }
            if r.is_empty() || r.len() > 200 || r.chars().any(char::is_control) {
                return Err(Error::invalid_input(
                    "reporter: 1 to 200 characters, no control characters",
                )
                .into());
            }
            Some(((s * 1000.0).round() as i64, r))
        }
        _ => {
            return Err(Error::invalid_input(
                "stall_secs and reporter go together (a reporter's running total)",
            )
            .into());
        }
    };
    let c = visible(&a, &p, &id, Role::Member).await?;
    if !a.catalog().heartbeat_claim(&id).await? {
        return Err(Error::new(
            ErrorKind::PreconditionFailed,
            format!("claim {id} is released: {}", c.reason),
        )
        .into());
    }
    if let Some((ms, reporter)) = stall {
        a.catalog().report_claim_stall(&id, &reporter, ms).await?;
    }
    if let Ok(spec) = serde_json::from_str::<ClaimSpec>(&c.spec) {
        let until = a.catalog().now() + spec.ttl() as i64;
        a.catalog().extend_claim_protections(&id, until).await?;
    }
    Ok(Reply(status(&a, &a.catalog().claim(&id).await?).await?))
}

async fn release_route(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<c::ReleaseClaim>> {
    let body: api::claims::Release = optional_body(&b)?;
    visible(&a, &p, &id, Role::Member).await?;
    let reason = body.reason.unwrap_or_else(|| "released".into());
    if reason.len() > 1024 {
        return Err(Error::invalid_input("reason: at most 1024 bytes").into());
    }
    let released = release::release(&a, &id, &reason, &p.id).await?;
    Ok(Reply(c::ReleasedClaim {
        status: status(&a, &a.catalog().claim(&id).await?).await?,
        released_now: released,
    }))
}

/// The document a claim was admitted with.
pub(crate) fn stored_spec(c: &ClaimRecord) -> Result<ClaimSpec> {
    serde_json::from_str(&c.spec)
        .map_err(|e| Error::internal(format!("claim {}: stored spec: {e}", c.id)))
}

/// `POST /v1/claims/{id}/attach`: the claim's mounts on this node (the staging agent mounts them on its own;
/// the other nodes of a multi-node job ask their agents, which read the claim from the catalog they share).
async fn attach(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<c::AttachClaim>> {
    Ok(Reply(here(&a, &p, &id, &b, true).await?))
}

/// `POST /v1/claims/{id}/detach`: the claim's mounts on this node taken down.
async fn detach(
    State(a): State<Arc<Agent>>,
    Extension(p): Extension<Principal>,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<c::DetachClaim>> {
    Ok(Reply(here(&a, &p, &id, &b, false).await?))
}

/// The claim's mounts on this node made (`attach`: a ready claim only) or taken down.
async fn here(
    a: &Agent,
    p: &Principal,
    id: &str,
    b: &Bytes,
    attach: bool,
) -> ApiResult<ClaimStatus> {
    let _: api::quotas::Nothing = optional_body(b)?;
    let c = visible(a, p, id, Role::Member).await?;
    let spec = stored_spec(&c)?;
    if !attach {
        mounts::unmount_all(id, &spec);
    } else if c.state != ClaimState::Ready {
        let why = if c.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", c.reason)
        };
        return Err(Error::new(
            ErrorKind::PreconditionFailed,
            format!(
                "claim {id} is {}: its datasets are mounted once it is ready{why}",
                c.state.as_str()
            ),
        )
        .into());
    } else {
        mounts::mount_all(a, id, &spec).await?;
    }
    Ok(status(a, &c).await?)
}

/// This agent as a claim's stager.
pub(crate) fn agent_id(a: &Agent) -> String {
    a.id().to_string()
}

/// The agent's API as the job reaches it.
fn agent_url(a: &Agent) -> String {
    match &a.cluster {
        Some(c) => c.me().to_string(),
        None => a
            .api_url
            .get()
            .cloned()
            .unwrap_or_else(|| format!("http://{}", a.config().api_listen)),
    }
}

/// A claim as the API reports it (live accounting for a live claim staged here).
pub(crate) async fn status(a: &Agent, c: &ClaimRecord) -> Result<ClaimStatus> {
    let bad = |what: &str, e: serde_json::Error| {
        Error::internal(format!("claim {}: stored {what}: {e}", c.id))
    };
    let spec: ClaimSpec = serde_json::from_str(&c.spec).map_err(|e| bad("spec", e))?;
    let state = c.state;
    let scratch_path = c
        .scratch_id
        .as_ref()
        .map(|sid| crate::control::scratch_path(a, sid).display().to_string());
    let usage = if c.released_at.is_none() {
        usage(a, c, &spec).await
    } else {
        serde_json::from_str(&c.usage).map_err(|e| bad("usage", e))?
    };
    let mut env = BTreeMap::new();
    env.insert("STRATA_AGENT".into(), agent_url(a));
    env.insert("STRATA_CLAIM".into(), c.id.clone());
    env.insert("STRATA_JOB".into(), c.job.clone());
    env.insert("STRATA_TEAM".into(), c.team.clone());
    for d in &spec.datasets {
        env.insert(
            format!("STRATA_DATASET_{}", env_name(&d.name)),
            d.location.clone(),
        );
        if let Some(m) = &d.mount {
            env.insert(format!("STRATA_MOUNT_{}", env_name(&d.name)), m.clone());
        }
    }
    if let Some(ck) = &spec.checkpoint {
        env.insert("STRATA_CKPT".into(), ck.location.clone());
        if let Some(k) = ck.keep_last {
            env.insert("STRATA_CKPT_KEEP_LAST".into(), k.to_string());
        }
    }
    if let Some(p) = &scratch_path {
        env.insert("STRATA_SCRATCH".into(), p.clone());
    }
    Ok(ClaimStatus {
        id: c.id.clone(),
        job: c.job.clone(),
        team: c.team.clone(),
        principal: c.principal.clone(),
        state,
        reason: c.reason.clone(),
        progress: serde_json::from_str(&c.progress).unwrap_or_default(),
        datasets: serde_json::from_str(&c.datasets).map_err(|e| bad("datasets", e))?,
        scratch_path,
        env,
        mount_gid: mounts::gid_of(&spec),
        usage,
        spec,
        created_at: c.created_at,
        deadline_at: c.deadline_at,
        ready_at: c.ready_at,
        heartbeat_at: c.heartbeat_at,
        released_at: c.released_at,
    })
}

/// A live claim's accounting now: what staging recorded, the job's cache I/O on this agent, its scratch's
/// size (the peak so far kept) and the bytes under its checkpoint location.
pub(crate) async fn usage(a: &Agent, c: &ClaimRecord, spec: &ClaimSpec) -> JobUsage {
    let mut u: JobUsage = serde_json::from_str(&c.usage).unwrap_or_default();
    // Staging's share is its progress, which only the staging task writes.
    let p: strata_claim::Progress = serde_json::from_str(&c.progress).unwrap_or_default();
    u.staged_cached_bytes = p.cached_bytes;
    u.staged_bytes = p.bytes_done.saturating_sub(p.cached_bytes);
    if c.agent == a.id() {
        let (mut origin, mut peer) = (0, 0);
        for j in a.cache().stats().by_job {
            // Only the claim's team's I/O: another team naming this job charges it nothing.
            if j.job.as_deref() == Some(c.job.as_str())
                && j.team.as_deref() == Some(c.team.as_str())
            {
                origin += j.origin_bytes;
                peer += j.peer_bytes;
            }
        }
        // The cache's counters start again with the agent; the catalog keeps the most seen.
        u.origin_bytes = u.origin_bytes.max(origin);
        u.peer_bytes = u.peer_bytes.max(peer);
        if let Some(sid) = &c.scratch_id {
            let dir = crate::control::scratch_path(a, sid);
            let used = tokio::task::spawn_blocking(move || dir_bytes(&dir))
                .await
                .unwrap_or(0);
            u.scratch_peak_bytes = u.scratch_peak_bytes.max(used);
        }
    }
    if let Ok(ms) = a.catalog().claim_stall_ms(&c.id).await {
        u.stall_secs = u.stall_secs.max(ms as f64 / 1000.0);
    }
    if let Some(ck) = &spec.checkpoint
        && let Ok((name, _, prefix)) = a.locate(&ck.location)
    {
        let name = name.unwrap_or_default();
        if let Ok(objs) = a.catalog().objects_under(&name, &prefix).await {
            u.checkpoint_bytes = objs.iter().map(|o| o.size.max(0) as u64).sum();
        }
    }
    if c.released_at.is_none()
        && let Ok(doc) = admit::json(&u)
    {
        let _ = a.catalog().set_claim_usage(&c.id, &doc).await;
    }
    u
}

/// Bytes of the files under `dir` (a scratch directory), links not followed.
fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            seen += 1;
            if seen > 1_000_000 {
                return total;
            }
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else if m.is_file() {
                total += m.len();
            }
        }
    }
    total
}
