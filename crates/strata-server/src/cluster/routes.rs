//! The routes of the shared cache: `GET /v1/peer/blocks` (a block for another agent), `GET /v1/peer/meta`
//! (an object's version for another agent, which asks this one because it owns the key's metadata; decided
//! as a block request is), `POST /v1/peer/stage`
//! (a claim's staging, this agent's share: [`super::stage`]), `POST /v1/peer/held` (that share counted, for
//! `GET /v1/coverage`) and `GET /v1/cluster` (the members as this agent sees them).
//!
//! **A block for another agent.** Only the cluster credential is accepted (a token, even an administrator's,
//! is refused: 403). The request names a configured (or open ad-hoc) backend by its canonical id, the object
//! version (key, size, ETag or version id, modification time) and the block; the block is served from the
//! tiers or read from the origin with `If-Match` of that ETag (never another version), and never asked of a
//! third agent. Access is decided as for a read by the principal the request is for (`x-strata-principal`,
//! looked up in this agent's catalog; revoked or unknown: refused), or for a configured key acting for the team
//! it names; when the asking agent's catalog (`x-strata-catalog`) is not this agent's, its decision stands.
//! The answer carries the block's BLAKE3 in `x-strata-blake3`, which the asking agent checks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::extract::{Extension, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use strata_catalog::{Principal, Role};
use strata_types::{Error, ErrorKind, IoContext, ObjectMeta};

use super::client::{
    BLOCK_HASH_HEADER, BUSY_HEADER, CATALOG_HEADER, DATASET_HEADER, JOB_HEADER, PRINCIPAL_HEADER,
    PeerMeta, PeerObject, WAIT_HEADER,
};
use crate::Agent;
use crate::access::Caller;
use crate::access::ClusterCall;
use crate::http::{ApiError, Route, route};
use strata_api as api;

/// How long a principal looked up for a peer read is trusted.
const PRINCIPAL_TTL: Duration = Duration::from_secs(10);

/// Routes of the shared cache, for the route table of [`crate::routes`].
pub fn routes() -> Vec<Route> {
    vec![
        route::<api::cluster::PeerBlock>(get(block)),
        route::<api::cluster::PeerMetaOf>(get(meta)),
        route::<api::cluster::PeerStage>(
            post(super::stage::stage).layer(DefaultBodyLimit::max(super::stage::MAX_REQUEST)),
        ),
        route::<api::cluster::PeerHeld>(
            post(super::stage::held).layer(DefaultBodyLimit::max(super::stage::MAX_REQUEST)),
        ),
        route::<api::cluster::PeerInvalidate>(
            post(super::coherence::invalidate)
                .layer(DefaultBodyLimit::max(super::coherence::MAX_BODY)),
        ),
        route::<api::cluster::PeerPins>(
            post(super::pins::receive).layer(DefaultBodyLimit::max(super::pins::MAX_BODY)),
        ),
        route::<api::cluster::ClusterStatus>(get(status)),
    ]
}

async fn block(
    State(agent): State<Arc<Agent>>,
    cluster: Option<Extension<ClusterCall>>,
    headers: HeaderMap,
    q: Result<Query<api::cluster::BlockQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    // Who asks is decided before what is asked: a user's request is refused whatever its query.
    let Some(Extension(call)) = cluster else {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            "only the other agents of the cluster (with the cluster credential) may ask for blocks",
        )
        .into());
    };
    let Query(q) = q.map_err(|e| Error::invalid_input(format!("block request: {e}")))?;
    let (name, backend) = peer_backend(&agent, &q.backend, q.block_size)?;
    let (caller, ctx) = peer_caller(&agent, &call, &headers).await?;
    agent
        .ownership()
        .check_key(&caller, &name, &q.key, Role::Reader)
        .await?;
    let h = |n: &str| header(&headers, n);
    let meta = ObjectMeta {
        key: q.key,
        size: q.size,
        etag: q.etag,
        version: q.version,
        last_modified_unix: q.mtime,
        attrs: None,
    };
    let fill = q.fill != Some(0);
    // The asker's timeout is twice its wait: past the wait, answer "still reading" (the fill goes on, and the
    // asker's next request joins it) rather than let a slow origin pass for a dead owner.
    let wait = h(WAIT_HEADER)
        .and_then(|w| w.parse::<u64>().ok())
        .map_or(Duration::from_secs(5), Duration::from_millis)
        .clamp(Duration::from_millis(50), Duration::from_secs(60));
    let served = agent
        .cache()
        .serve_peer(&ctx, &backend, meta, q.index, fill);
    let Ok(served) = tokio::time::timeout(wait, served).await else {
        let e = Error::new(
            ErrorKind::Unavailable,
            "the block is still being read from the origin; ask again",
        );
        let mut r = ApiError(e).into_response();
        r.headers_mut()
            .insert(BUSY_HEADER, axum::http::HeaderValue::from_static("1"));
        return Ok(r);
    };
    match served? {
        Some(b) => {
            let hash = blake3::hash(&b).to_hex().to_string();
            Ok(([(BLOCK_HASH_HEADER, hash)], Body::from(b)).into_response())
        }
        None => Err(Error::new(ErrorKind::NotFound, "this agent does not hold the block").into()),
    }
}

async fn meta(
    State(agent): State<Arc<Agent>>,
    cluster: Option<Extension<ClusterCall>>,
    headers: HeaderMap,
    q: Result<Query<api::cluster::MetaQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<crate::http::Reply<api::cluster::PeerMetaOf>, ApiError> {
    let Some(Extension(call)) = cluster else {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            "only the other agents of the cluster (with the cluster credential) may ask for metadata",
        )
        .into());
    };
    let Query(q) = q.map_err(|e| Error::invalid_input(format!("metadata request: {e}")))?;
    strata_types::validate_key(&q.key)?;
    let (name, backend) = agent.backend_by_id(&q.backend).ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("{} is not a backend of this agent", q.backend),
        )
    })?;
    let (caller, ctx) = peer_caller(&agent, &call, &headers).await?;
    agent
        .ownership()
        .check_key(&caller, &name, &q.key, Role::Reader)
        .await?;
    let got = agent
        .cache()
        .serve_peer_head(&ctx, &backend, &q.key)
        .await?;
    Ok(crate::http::Reply(match got {
        Some((meta, age)) => PeerMeta {
            object: Some(PeerObject::from_meta(&meta)),
            // Rounded up: the asker must never take the version for younger than it is.
            age_ms: age.as_micros().div_ceil(1000) as u64,
        },
        None => PeerMeta {
            object: None,
            age_ms: 0,
        },
    }))
}

/// The backend a peer request names by its canonical id (name, backend), once its block size is checked to
/// be this agent's.
pub(super) fn peer_backend(
    agent: &Agent,
    id: &str,
    block_size: u64,
) -> Result<(String, strata_object::Backend), Error> {
    let bs = agent.cache().config().block_size.bytes();
    if block_size != bs {
        return Err(Error::invalid_input(format!(
            "block size {block_size} asked, this agent's is {bs}: every agent of a cluster must have the same cache.block_size"
        )));
    }
    agent.backend_by_id(id).ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("{id} is not a backend of this agent"),
        )
    })
}

/// A header's value, if it is short, non-empty text.
pub(super) fn header(headers: &HeaderMap, n: &str) -> Option<Arc<str>> {
    headers
        .get(n)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 256)
        .map(Arc::<str>::from)
}

/// Who a peer request acts for, and the context of its reads: the principal, team, job and dataset headers.
///
/// One catalog, one decision: a principal of the catalog this agent shares with the asking one is decided
/// for here as it would be for that principal itself (unknown or revoked: refused). Agents with catalogs
/// of their own know nothing of each other's principals: the asking agent's decision stands.
pub(super) async fn peer_caller(
    agent: &Agent,
    call: &ClusterCall,
    headers: &HeaderMap,
) -> Result<(Caller, IoContext), Error> {
    let principal = header(headers, PRINCIPAL_HEADER);
    let shared = agent
        .cluster()
        .is_some_and(|c| header(headers, CATALOG_HEADER).as_deref() == Some(c.catalog()));
    let caller = match principal.as_deref() {
        Some(id) if shared && id.starts_with("p_") => {
            Caller::Principal(principal_for(agent, id).await?)
        }
        _ => Caller::Root {
            team: call.team.clone(),
        },
    };
    let ctx = IoContext {
        principal,
        team: call.team.as_deref().map(Arc::from),
        job: header(headers, JOB_HEADER),
        dataset: header(headers, DATASET_HEADER),
    };
    Ok((caller, ctx))
}

/// The principal `id` from the catalog (cached briefly); revoked or unknown ones are refused.
async fn principal_for(agent: &Agent, id: &str) -> Result<Principal, Error> {
    let cache = agent.peer_principals();
    if let Some((at, p)) = cache.lock().get(id)
        && at.elapsed() < PRINCIPAL_TTL
    {
        return Ok(p.clone());
    }
    let p = agent
        .catalog()
        .principal(id)
        .await
        .map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::new(
                ErrorKind::PermissionDenied,
                format!("principal {id} is not known to this agent"),
            ),
            _ => e,
        })?;
    if p.revoked_at.is_some() {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("principal {id} is revoked"),
        ));
    }
    let mut c = cache.lock();
    if c.len() >= 10_000 {
        c.clear();
    }
    c.insert(id.to_string(), (Instant::now(), p.clone()));
    Ok(p)
}

async fn status(
    State(agent): State<Arc<Agent>>,
) -> crate::http::Reply<api::cluster::ClusterStatus> {
    let stats = agent.cache().stats();
    let cache = api::cluster::ClusterCacheCounters {
        origin_bytes: stats.fill_bytes,
        peer_blocks: stats.peer_blocks,
        peer_bytes: stats.peer_bytes,
        served_to_peers: stats.served_to_peers,
        served_to_peers_bytes: stats.served_to_peers_bytes,
    };
    let members = agent.cluster().map(|c| {
        let mut m = c.status(20_000);
        m.pins.kept_for = agent.cache().pinning_members();
        m
    });
    crate::http::Reply(api::cluster::ClusterView {
        shared: members.is_some(),
        cache,
        members,
    })
}
