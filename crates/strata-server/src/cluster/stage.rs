//! Staging spread over the cluster: `POST /v1/peer/stage` asks a member to warm the blocks *it owns* of a
//! list of exact object versions (a claim's snapshot), so a multi-node job's staging reads each block from
//! the origin once, on its owner, and no block travels to the agent that took the claim.
//!
//! The request names a backend by its canonical id and the versions; access is decided per key as for a
//! block ([`super::routes`]: the cluster credential only, for the principal the staging is for). The answer
//! is a stream of JSON lines ([`StageLine`]): progress about once a second, then the verdict (what the member
//! holds of its share, counted after the warm-up) or the error the warm-up ended with. The warm-up lives as
//! long as the request: an asking agent that goes away (a release, its own restart) stops it.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
pub use strata_api::cluster::{
    HeldShare, StageDone, StageLine, StageObject, StageProgress, StageRequest,
};

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use parking_lot::Mutex;
use strata_cache::WarmProgress;
use strata_catalog::Role;
use strata_client::wire::ErrorBody;
use strata_types::{Error, ErrorKind, IoContext, ObjectMeta};

use crate::Agent;
use crate::access::ClusterCall;
use crate::http::ApiError;

/// The longest a staging member may say nothing (it sends progress every second) before it is taken for gone.
pub const SILENCE: Duration = Duration::from_secs(30);
/// The longest line of a staging answer.
pub const MAX_LINE: usize = 1 << 20;
/// The largest staging request (its list of object versions).
pub const MAX_REQUEST: usize = 256 << 20;
/// How often a staging member reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);
/// Blocks a member fetches at once for one staging request.
const CONCURRENCY: usize = 16;

/// Most copies of a block a staging may ask for.
pub const MAX_REPLICAS: u32 = 8;

/// The request for `objects` of the backend `backend` (a canonical id), `replicas` copies of each block.
pub fn stage_request(
    backend: String,
    block_size: u64,
    objects: &[ObjectMeta],
    replicas: u32,
) -> StageRequest {
    StageRequest {
        backend,
        block_size,
        replicas,
        objects: objects
            .iter()
            .map(|o| StageObject {
                key: o.key.clone(),
                size: o.size,
                etag: o.etag.clone(),
                version: o.version.clone(),
                mtime: o.last_modified_unix,
            })
            .collect(),
    }
}

fn progress_of(p: &WarmProgress) -> StageProgress {
    StageProgress {
        total_bytes: p.total_bytes,
        done_bytes: p.done_bytes,
        cached_bytes: p.cached_bytes,
    }
}

fn line(l: &StageLine) -> Bytes {
    let mut v = serde_json::to_vec(l).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// The object versions of a request from another agent, each checked readable by the principal it acts for;
/// with the backend and the context of the reads.
async fn authorized(
    agent: &Agent,
    call: &ClusterCall,
    headers: &HeaderMap,
    req: StageRequest,
) -> Result<(strata_object::Backend, IoContext, Vec<ObjectMeta>), Error> {
    if !(1..=MAX_REPLICAS).contains(&req.replicas) {
        return Err(Error::invalid_input(format!(
            "replicas {}: use 1 to {MAX_REPLICAS}",
            req.replicas
        )));
    }
    let (name, backend) = super::routes::peer_backend(agent, &req.backend, req.block_size)?;
    let (caller, ctx) = super::routes::peer_caller(agent, call, headers).await?;
    for o in &req.objects {
        agent
            .ownership()
            .check_key(&caller, &name, &o.key, Role::Reader)
            .await?;
    }
    let objects = req
        .objects
        .into_iter()
        .map(|o| ObjectMeta {
            key: o.key,
            size: o.size,
            etag: o.etag,
            version: o.version,
            last_modified_unix: o.mtime,
            attrs: None,
        })
        .collect();
    Ok((backend, ctx, objects))
}

fn cluster_only(cluster: Option<Extension<ClusterCall>>, what: &str) -> Result<ClusterCall, Error> {
    match cluster {
        Some(Extension(call)) => Ok(call),
        None => Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "only the other agents of the cluster (with the cluster credential) may ask for {what}"
            ),
        )),
    }
}

/// `POST /v1/peer/held`: what this agent holds of its share (the blocks it owns) of a list of object
/// versions, counted; nothing is fetched. What `GET /v1/coverage` asks each member.
pub(super) async fn held(
    State(agent): State<Arc<Agent>>,
    cluster: Option<Extension<ClusterCall>>,
    headers: HeaderMap,
    body: Result<Json<StageRequest>, JsonRejection>,
) -> Result<crate::http::Reply<strata_api::cluster::PeerHeld>, ApiError> {
    let call = cluster_only(cluster, "counts of held blocks")?;
    let Json(req) = body.map_err(|e| Error::invalid_input(format!("held request: {e}")))?;
    let replicas = req.replicas as usize;
    let (backend, _, objects) = authorized(&agent, &call, &headers, req).await?;
    let mut bits = vec![0u8; objects.len().div_ceil(8)];
    let mut i = 0;
    let held = agent
        .cache()
        .held_owned_each(&backend, &objects, replicas, |all| {
            if !all {
                bits[i / 8] |= 1 << (i % 8);
            }
            i += 1;
        });
    let lacking = bits.iter().map(|b| format!("{b:02x}")).collect();
    Ok(crate::http::Reply(HeldShare { held, lacking }))
}

/// `POST /v1/peer/stage`.
pub(super) async fn stage(
    State(agent): State<Arc<Agent>>,
    cluster: Option<Extension<ClusterCall>>,
    headers: HeaderMap,
    body: Result<Json<StageRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let call = cluster_only(cluster, "staging")?;
    let Json(req) = body.map_err(|e| Error::invalid_input(format!("stage request: {e}")))?;
    let replicas = req.replicas as usize;
    let (backend, ctx, objects) = authorized(&agent, &call, &headers, req).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let cache = agent.cache().clone();
    agent.spawn(async move {
        let latest = Mutex::new(StageProgress::default());
        let warm = cache.warm_owned(
            &ctx,
            &backend,
            objects.clone(),
            CONCURRENCY,
            replicas,
            |p| *latest.lock() = progress_of(p),
        );
        tokio::pin!(warm);
        let mut tick = tokio::time::interval(PROGRESS_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let r = loop {
            tokio::select! {
                r = &mut warm => break r,
                // The asking agent went away: the staging it asked for stops with it.
                _ = tx.closed() => return,
                _ = tick.tick() => {
                    let p = latest.lock().clone();
                    if tx.send(line(&StageLine::Progress(p))).await.is_err() {
                        return;
                    }
                }
            }
        };
        let last = match r {
            Ok(p) => StageLine::Done(StageDone {
                progress: progress_of(&p),
                held: cache.held_owned(&backend, &objects, replicas),
                errors: p.errors,
            }),
            Err(e) => StageLine::Failed(ErrorBody::of(&e)),
        };
        let _ = tx.send(line(&last)).await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(body),
    )
        .into_response())
}
