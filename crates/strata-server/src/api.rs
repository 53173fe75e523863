//! The data plane of the agent's API (JSON over HTTP, loopback by default); [`crate::routes`] puts it in the
//! route table with the peer and control routes.
//!
//! Its routes, with what each does and who may call it, are in [`routes`] below (served as `/openapi.json`).
//!
//! Locations are `NAME/key`, a URL under a configured backend, or an ad-hoc `s3://bucket/key`.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use strata_types::{Error, ErrorKind, IoContext};

use crate::Agent;
use crate::access::Caller;
use crate::http::{ApiError, ApiResult, Query, Reply, Route, principal_context, route};
use strata_analytics::{Access, OpClass};
use strata_api as api;
use strata_catalog::{Principal, Role};

/// The data-plane routes (and `/healthz`, `/metrics`), for the route table of [`crate::routes`].
pub fn routes() -> Vec<Route> {
    vec![
        route::<api::data::Healthz>(get(healthz)),
        route::<api::data::Metrics>(get(metrics)),
        route::<api::data::CacheStats>(get(cache_stats)),
        route::<api::data::Backends>(get(backends)),
        route::<api::data::WarmPrefix>(post(warm)),
        route::<api::data::Pin>(post(pin)),
        route::<api::data::Unpin>(post(unpin)),
        route::<api::data::Read>(get(read)),
        route::<api::data::List>(get(list)),
        route::<api::data::Prefetch>(post(prefetch)),
    ]
}

async fn healthz() -> Reply<api::data::Healthz> {
    Reply(api::data::Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

async fn metrics(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Response> {
    // Per-team forecasts are in it: an operator's view.
    principal.require_admin()?;
    let mut text = agent.telemetry().metrics().render();
    text.push_str(&crate::metrics::render_cache(&agent.cache().stats()));
    if let Some(c) = agent.cluster() {
        text.push_str(&crate::metrics::render_cluster(c));
    }
    text.push_str(&crate::metrics::render_forecasts(&agent));
    text.push_str(&crate::metrics::render_analytics(agent.analytics()));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

async fn cache_stats(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Reply<api::data::CacheStats>> {
    let mut stats = agent.cache().stats();
    // Pins name prefixes: a caller sees those it may read.
    if !principal.is_admin {
        let owned = agent.ownership().owned().await?;
        stats.pins.retain(|pin| {
            let name = agent
                .backends()
                .iter()
                .find(|b| &**b.backend.id() == pin.backend.as_str())
                .map_or(pin.backend.as_str(), |b| b.name.as_str());
            let prefix = pin.prefix.as_str();
            // The pin's own owner, and every owned prefix beneath it, as a warm-up would check.
            strata_catalog::inventory::owner_in(&owned, name, prefix)
                .into_iter()
                .chain(
                    owned
                        .iter()
                        .filter(|p| p.backend == name && p.prefix.starts_with(prefix))
                        .map(|p| p.team.clone()),
                )
                .all(|t| principal.can(&t, Role::Reader))
        });
        // Jobs are their team's: a caller sees the I/O of teams it reads (I/O of no team: administrators).
        stats.by_job.retain(|j| {
            j.team
                .as_deref()
                .is_some_and(|t| principal.can(t, Role::Reader))
        });
    }
    Ok(Reply(stats))
}

async fn backends(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
) -> Reply<api::data::Backends> {
    let admin = principal.is_admin;
    Reply(
        agent
            .backends()
            .iter()
            .map(|b| api::data::BackendInfo {
                name: b.name.clone(),
                scheme: b.backend.scheme().to_string(),
                url: admin.then(|| b.url.clone()),
                id: admin.then(|| b.backend.id().to_string()),
            })
            .collect(),
    )
}

async fn warm(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    Json(req): Json<api::data::Warm>,
) -> ApiResult<Response> {
    let concurrency = req.concurrency.unwrap_or(16);
    if !(1..=256).contains(&concurrency) {
        return Err(
            Error::invalid_input(format!("concurrency = {concurrency}: must be 1..=256")).into(),
        );
    }
    let ctx = principal_context(&headers, &principal);
    let caller = Caller::Principal(principal);
    let (backend, prefix, _) = agent
        .authorize(&caller, &req.location, Role::Reader, true)
        .await?;
    // Lines of progress, then the end: a warm-up that fails before its first progress line (the listing was
    // refused, the bucket does not exist) answers with its error's status; one that fails later ends with an
    // error line and a cut body, never a clean 200.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::result::Result<Bytes, Error>>(16);
    let line = |p: &strata_cache::WarmProgress, done: bool, error: Option<String>| {
        let mut v = serde_json::to_vec(&api::data::WarmLine {
            progress: p.clone(),
            done,
            error,
        })
        .unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    };
    agent.clone().spawn(async move {
        let last = std::sync::Mutex::new(std::time::Instant::now());
        let progress_tx = tx.clone();
        let r = agent
            .cache()
            .warm(&ctx, &backend, &prefix, concurrency, |p| {
                // Progress is lossy: at most every 100 ms, dropped if the client is slow.
                let mut l = last.lock().unwrap_or_else(|e| e.into_inner());
                if l.elapsed().as_millis() >= 100 {
                    *l = std::time::Instant::now();
                    let _ = progress_tx.try_send(Ok(line(p, false, None)));
                }
            })
            .await;
        let end = match r {
            Ok(p) => Ok(line(&p, true, None)),
            Err(e) => Err(e),
        };
        let _ = tx.send(end).await;
    });
    let first = match rx.recv().await {
        Some(Ok(b)) => b,
        Some(Err(e)) => return Err(e.into()),
        None => return Err(Error::internal("the warm-up stopped without a word").into()),
    };
    // States: 0 streaming, 1 an error line was sent (the body is cut next), 2 over.
    let stream = futures::stream::unfold(
        (Some(first), rx, 0u8),
        move |(first, mut rx, st)| async move {
            if let Some(b) = first {
                return Some((Ok(b), (None, rx, 0)));
            }
            match st {
                1 => {
                    return Some((
                        Err(std::io::Error::other("the warm-up failed")),
                        (None, rx, 2),
                    ));
                }
                2 => return None,
                _ => {}
            }
            match rx.recv().await {
                Some(Ok(b)) => Some((Ok(b), (None, rx, 0))),
                Some(Err(e)) => Some((
                    Ok(line(&Default::default(), true, Some(e.to_string()))),
                    (None, rx, 1),
                )),
                None => None,
            }
        },
    );
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The catalog's name for the cache (inventory backend and quota scope of pinned bytes).
pub const CACHE_SCOPE: &str = "cache";

/// The inventory key of a pinned prefix on the `cache` scope.
pub(crate) fn pin_key(backend: &strata_object::Backend, prefix: &str) -> String {
    format!("{}/{prefix}", backend.id())
}

async fn pin(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    Json(req): Json<api::data::PinLocation>,
) -> ApiResult<Reply<api::data::Pin>> {
    let caller = Caller::Principal(principal.clone());
    let (backend, prefix, owner) = agent
        .authorize(&caller, &req.location, Role::Member, true)
        .await?;
    // Quota before bytes: the prefix's size is admitted on the owning team's `cache` scope (the caller's
    // home team outside owned prefixes) before it is pinned.
    let charged = match owner.or_else(|| principal.team.clone()) {
        Some(team) => {
            let page = backend
                .list_page(&IoContext::default(), &prefix, None, usize::MAX)
                .await?;
            let bytes: i64 = page.objects.iter().map(|o| o.size as i64).sum();
            let res = agent
                .catalog()
                .reserve(&team, CACHE_SCOPE, bytes, 1, 600)
                .await?;
            Some((team, bytes, res))
        }
        None => None,
    };
    let report = match agent.cache().pin(backend.id(), &prefix) {
        Ok(r) => r,
        Err(e) => {
            if let Some((_, _, res)) = charged {
                let _ = agent.catalog().release_reservation(&res).await;
            }
            return Err(e.into());
        }
    };
    if let Some((team, bytes, res)) = charged {
        let rec = strata_catalog::inventory::ObjectRecord {
            backend: CACHE_SCOPE.into(),
            key: pin_key(&backend, &prefix),
            size: bytes,
            etag: String::new(),
            modified_at: agent.catalog().now(),
            team: Some(team),
            principal: Some(principal.id.clone()),
            job: None,
            dataset: None,
            accessed_at: None,
        };
        agent.catalog().commit_write(vec![res], &rec).await?;
    }
    agent.pins_changed();
    Ok(Reply(report))
}

async fn unpin(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    Json(req): Json<api::data::PinLocation>,
) -> ApiResult<Reply<api::data::Unpin>> {
    let (backend, prefix) = agent.resolve(&req.location)?;
    // The pin belongs to the team it is charged to: only its members (or an administrator) remove it; its
    // readers are told so. To anyone else (and for a pin with no team, an administrator's) there is no pin.
    if !principal.is_admin {
        let rec = agent
            .catalog()
            .object(CACHE_SCOPE, &pin_key(&backend, &prefix))
            .await?;
        match rec.and_then(|r| r.team) {
            Some(team) if principal.can(&team, Role::Reader) => {
                principal.require(&team, Role::Member)?
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("no pin of your teams at {}", req.location),
                )
                .into());
            }
        }
    }
    let removed = agent.cache().unpin(backend.id(), &prefix)?;
    agent.pins_changed();
    agent
        .catalog()
        .commit_delete(CACHE_SCOPE, &pin_key(&backend, &prefix))
        .await?;
    Ok(Reply(api::data::Unpinned { removed }))
}

/// What a `?location=` request with these headers asks the cache for: the whole object, or its `Range`; with
/// `If-Match`, only the version of that ETag (a changed object is `precondition_failed`, never other bytes: a
/// mount reads the version it listed).
fn get_options(headers: &HeaderMap) -> ApiResult<strata_cache::GetOptions> {
    let mut opts = strata_cache::GetOptions::default();
    if let Some(h) = headers.get(header::RANGE) {
        let h = h
            .to_str()
            .map_err(|_| Error::invalid_input("the Range header is not ASCII"))?;
        opts = opts.range(strata_cache::ByteRange::parse(h)?);
    }
    if let Some(h) = headers.get(header::IF_MATCH) {
        let h = h
            .to_str()
            .map_err(|_| Error::invalid_input("the If-Match header is not ASCII"))?
            .trim();
        opts.if_match = Some(if h == "*" {
            strata_cache::ETagMatch::Any
        } else if let Some(weak) = h.strip_prefix("W/") {
            strata_cache::ETagMatch::Weak(weak.trim_matches('"').to_string())
        } else {
            strata_cache::ETagMatch::Strong(h.trim_matches('"').to_string())
        });
    }
    Ok(opts)
}

/// A page of the objects under a location, straight from the backend (a mount takes its snapshot from these
/// pages). The caller must read every key under the location.
async fn list(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<api::data::ListQuery>,
) -> ApiResult<Reply<api::data::List>> {
    let ctx = principal_context(&headers, &principal);
    let start = std::time::Instant::now();
    let r = list_page(&agent, &ctx, principal, &q).await;
    record(
        &agent,
        OpClass::MetaRead,
        ctx,
        &q.location,
        0,
        start,
        r.is_ok(),
    );
    r
}

async fn list_page(
    agent: &Agent,
    ctx: &IoContext,
    principal: Principal,
    q: &api::data::ListQuery,
) -> ApiResult<Reply<api::data::List>> {
    let caller = Caller::Principal(principal);
    let (backend, prefix, _) = agent
        .authorize(&caller, &q.location, Role::Reader, true)
        .await?;
    let limit = q.limit.unwrap_or(1000);
    if !(1..=1000).contains(&limit) {
        return Err(Error::invalid_input(format!("limit {limit}: between 1 and 1000")).into());
    }
    let after = q.after.as_ref().map(|a| format!("{prefix}{a}"));
    let page = backend
        .list_page(ctx, &prefix, after.as_deref(), limit)
        .await?;
    let objects = page
        .objects
        .into_iter()
        .filter_map(|m| {
            Some(api::data::ListedObject {
                name: m.key.strip_prefix(&prefix)?.to_string(),
                size: m.size,
                etag: m.etag,
                version: m.version,
                last_modified_unix: m.last_modified_unix,
            })
        })
        .collect();
    let next = page
        .next_start_after
        .and_then(|n| n.strip_prefix(&prefix).map(str::to_string));
    Ok(Reply(api::data::ListPage { objects, next }))
}

/// An object's bytes, or its `Range`, through [`strata_cache::BlockCache::get`]: the body streams block by
/// block (a large object never sits in memory whole) and keeps a block's in-flight budget share until the
/// connection asks for the next one.
async fn read(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<api::data::LocationQuery>,
) -> ApiResult<Response> {
    let ctx = principal_context(&headers, &principal);
    let start = std::time::Instant::now();
    let r = read_response(&agent, &ctx, principal, &headers, &q).await;
    let bytes = r.as_ref().map_or(0, |(n, _)| *n);
    record(
        &agent,
        OpClass::DataRead,
        ctx,
        &q.location,
        bytes,
        start,
        r.is_ok(),
    );
    r.map(|(_, resp)| resp)
}

/// The response of [`read`] and the bytes it promises.
async fn read_response(
    agent: &Agent,
    ctx: &IoContext,
    principal: Principal,
    headers: &HeaderMap,
    q: &api::data::LocationQuery,
) -> ApiResult<(u64, Response)> {
    let caller = Caller::Principal(principal);
    let (name, backend, key, _) = agent
        .authorize_named(&caller, &q.location, Role::Reader, false)
        .await?;
    let res = agent
        .cache()
        .get(ctx, &backend, &key, get_options(headers)?)
        .await?;
    // Its access time, as the gateway records a GET's: a dataset read through mounts and loaders from the
    // cache is not cold.
    let now = agent.catalog().now();
    if res.mark_read(now, crate::control::ACCESS_RESOLUTION_SECS) {
        agent.access_log().record(&name, &key, now);
    }
    let status = if res.partial {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let mut resp = Response::builder()
        .status(status)
        .header(header::CONTENT_LENGTH, res.range.end - res.range.start)
        .header(header::CONTENT_TYPE, "application/octet-stream");
    if let Some(etag) = &res.meta.etag {
        resp = resp.header(header::ETAG, etag);
    }
    if let Some(cr) = res.content_range() {
        resp = resp.header(header::CONTENT_RANGE, cr);
    }
    let bytes = res.range.end - res.range.start;
    resp.body(Body::from_stream(res.body))
        .map(|r| (bytes, r))
        .map_err(|e| ApiError(Error::internal(format!("building response: {e}"))))
}

/// Record one data-plane operation for the analytics: on the backend and key its location names (`name/key`,
/// or a URL's bucket and key), attributed to `ctx`.
fn record(
    agent: &Agent,
    class: OpClass,
    ctx: IoContext,
    location: &str,
    bytes: u64,
    start: std::time::Instant,
    ok: bool,
) {
    if !agent.analytics().enabled() {
        return;
    }
    let rest = location.split_once("://").map_or(location, |(_, r)| r);
    let (backend, key) = rest.split_once('/').unwrap_or((rest, ""));
    agent.analytics().record(Access::one(
        class,
        ctx,
        Arc::from(backend),
        Arc::from(key),
        bytes,
        start.elapsed(),
        ok,
    ));
}

/// Start fetching an object, or its `Range`, into the cache (runs of consecutive blocks, one backend request
/// each, as far as the in-flight budget allows right now) and answer once they are started. A loader sends this
/// when it enters a shuffle window, before reading the window's samples one by one.
async fn prefetch(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    Query(q): Query<api::data::LocationQuery>,
) -> ApiResult<Reply<api::data::Prefetch>> {
    let ctx = principal_context(&headers, &principal);
    let caller = Caller::Principal(principal);
    let (backend, key, _) = agent
        .authorize(&caller, &q.location, Role::Reader, false)
        .await?;
    agent
        .cache()
        .prefetch(&ctx, &backend, &key, get_options(&headers)?)
        .await?;
    Ok(Reply(api::data::Started { started: true }))
}
