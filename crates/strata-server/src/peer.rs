//! The peer API: checkpoint shard replicas that other nodes' checkpointers push to this agent.
//!
//! Replicas are stored (`PUT .../{run}/{step}/{file}`: a shard, verified against `x-strata-blake3` when
//! given, a rank's record or a manifest, durably with fsync + rename), read back (the reader verifies them
//! against the manifest), listed and deleted (manifest first); training processes hand saves over
//! (`/v1/ckpt/handoff`, [`strata_ckpt::handoff`]). The routes are in [`routes`] below.
//!
//! Replicas live under `<data-dir>/peer-checkpoints`, in the same layout as a checkpointer's local tier.
//! Handed-over saves run two at a time; their states are kept for the last 1,024.

use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use strata_ckpt::Tier;
use strata_ckpt::manifest::{MANIFEST, Manifest, ShardRecord, validate_run_id};
use strata_types::{Error, ErrorKind, IoContext};

use crate::Agent;
use crate::http::{ApiError, Plane, Route, RouteDoc};
use strata_catalog::Principal;

/// Largest replica accepted in one request.
const MAX_REPLICA: usize = 64 << 30;

/// Routes of the peer API, for the route table of [`crate::routes`].
pub fn routes() -> Vec<Route> {
    let r = |method, path, summary, h: axum::routing::MethodRouter<Arc<Agent>>| {
        (
            RouteDoc {
                method,
                path,
                summary,
                access: "any principal",
                plane: Plane::Peer,
            },
            h.layer(DefaultBodyLimit::max(MAX_REPLICA)),
        )
    };
    vec![
        r(
            "GET",
            "/v1/peer/ckpt/{run}",
            "Checkpoint replicas of a run",
            get(list),
        ),
        r(
            "DELETE",
            "/v1/peer/ckpt/{run}/{step}",
            "Delete a replica step",
            axum::routing::delete(delete),
        ),
        r(
            "GET",
            "/v1/peer/ckpt/{run}/{step}/{file}",
            "Read a replica file",
            get(read),
        ),
        r(
            "PUT",
            "/v1/peer/ckpt/{run}/{step}/{file}",
            "Store a replica file",
            axum::routing::put(write),
        ),
        r(
            "POST",
            "/v1/ckpt/handoff",
            "Hand a checkpoint save over to the agent",
            axum::routing::post(handoff),
        ),
        r(
            "GET",
            "/v1/ckpt/handoff",
            "State of a handed-over save",
            get(handoff_status),
        ),
    ]
}

fn tier(agent: &Agent) -> Tier {
    Tier::Local(agent.config().data_dir.join("peer-checkpoints"))
}

/// `rank-NNNNN.safetensors`, `rank-NNNNN.json` or `manifest.json`; returns the rank for the first two.
fn parse_file(file: &str) -> Result<(Option<u32>, bool), Error> {
    if file == MANIFEST {
        return Ok((None, false));
    }
    let bad = || Error::invalid_input(format!("{file:?} is not a checkpoint file name"));
    let rest = file.strip_prefix("rank-").ok_or_else(bad)?;
    let (digits, shard) = match (
        rest.strip_suffix(".safetensors"),
        rest.strip_suffix(".json"),
    ) {
        (Some(d), _) => (d, true),
        (_, Some(d)) => (d, false),
        _ => return Err(bad()),
    };
    if digits.len() != 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok((Some(digits.parse().map_err(|_| bad())?), shard))
}

/// The catalog's name for this agent's replica store (inventory backend and quota scope).
pub const PEER_SCOPE: &str = "peer";

async fn write(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    Path((run, step, file)): Path<(String, u64, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    validate_run_id(&run)?;
    parse_file(&file)?;
    // Quota before bytes: a replica is charged to the writer's team on scope `peer`, admitted before its body
    // is read.
    let team = principal.team.clone();
    let len = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i64>().ok());
    let res = match (&team, len) {
        (Some(t), Some(n)) => Some(
            agent
                .catalog()
                .reserve(
                    t,
                    PEER_SCOPE,
                    n,
                    1,
                    agent.config().catalog.reservation_ttl_secs,
                )
                .await?,
        ),
        (Some(_), None) => {
            return Err(Error::invalid_input(
                "a replica charged to a quota needs its Content-Length",
            )
            .into());
        }
        (None, _) => None,
    };
    let stored = async {
        let body = axum::body::to_bytes(body, MAX_REPLICA)
            .await
            .map_err(|e| Error::invalid_input(format!("reading the replica: {e}")))?;
        store(&agent, &run, step, &file, &headers, &body).await?;
        Ok::<_, ApiError>(body.len() as i64)
    }
    .await;
    let cat = agent.catalog();
    match stored {
        Ok(size) => {
            let rec = strata_catalog::inventory::ObjectRecord {
                backend: PEER_SCOPE.into(),
                key: format!("{run}/{step}/{file}"),
                size,
                etag: String::new(),
                modified_at: cat.now(),
                team,
                principal: Some(principal.id.clone()),
                job: None,
                dataset: None,
                accessed_at: None,
            };
            if let Err(e) = cat.commit_write(res.into_iter().collect(), &rec).await {
                tracing::warn!(error = %e, "recording a replica in the catalog");
            }
            Ok(StatusCode::NO_CONTENT)
        }
        Err(e) => {
            if let Some(r) = res {
                let _ = cat.release_reservation(&r).await;
            }
            Err(e)
        }
    }
}

async fn store(
    agent: &Agent,
    run: &str,
    step: u64,
    file: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(), ApiError> {
    let (rank, is_shard) = parse_file(file)?;
    let t = tier(agent);
    let ctx = IoContext::default();
    match (rank, is_shard) {
        (Some(rank), true) => {
            if let Some(want) = headers.get("x-strata-blake3").and_then(|v| v.to_str().ok()) {
                let got = blake3::hash(body).to_hex();
                if got.as_str() != want {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("{file}: body blake3 {got} != {want}; not stored"),
                    )
                    .into());
                }
            }
            t.write_shard(&ctx, run, step, rank, body, &[]).await?;
        }
        (Some(rank), false) => {
            let rec: ShardRecord = serde_json::from_slice(body)
                .map_err(|e| Error::invalid_input(format!("{file}: not a shard record: {e}")))?;
            if rec.rank != rank {
                return Err(Error::invalid_input(format!("{file} holds rank {}", rec.rank)).into());
            }
            t.write_record(&ctx, run, step, &rec).await?;
        }
        (None, _) => {
            let m = Manifest::parse(body, file)?;
            if m.run_id != run || m.step != step {
                return Err(Error::invalid_input("manifest of another run or step").into());
            }
            t.commit(&ctx, &m).await?;
        }
    }
    Ok(())
}

async fn read(
    State(agent): State<Arc<Agent>>,
    Path((run, step, file)): Path<(String, u64, String)>,
) -> Result<Response, ApiError> {
    validate_run_id(&run)?;
    parse_file(&file)?;
    let b = tier(&agent)
        .read_file(&IoContext::default(), &run, step, &file)
        .await?;
    Ok(Body::from(b).into_response())
}

async fn list(
    State(agent): State<Arc<Agent>>,
    Path(run): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    validate_run_id(&run)?;
    let t = tier(&agent);
    let ctx = IoContext::default();
    Ok(Json(serde_json::json!({
        "steps": t.steps(&ctx, &run).await?,
        "committed": t.committed(&ctx, &run).await?,
    })))
}

async fn delete(
    State(agent): State<Arc<Agent>>,
    Path((run, step)): Path<(String, u64)>,
) -> Result<StatusCode, ApiError> {
    validate_run_id(&run)?;
    tier(&agent)
        .delete_step(&IoContext::default(), &run, step)
        .await?;
    // Give the writers' teams their bytes back.
    let cat = agent.catalog();
    for o in cat
        .objects_under(PEER_SCOPE, &format!("{run}/{step}/"))
        .await?
    {
        cat.commit_delete(PEER_SCOPE, &o.key).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Saves handed over by training processes: their states, and a limit on how many run at once.
#[derive(Debug)]
pub struct Handoffs {
    states: parking_lot::Mutex<std::collections::VecDeque<HandoffStatus>>,
    running: Arc<tokio::sync::Semaphore>,
}

impl Default for Handoffs {
    fn default() -> Self {
        Self {
            states: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            running: Arc::new(tokio::sync::Semaphore::new(2)),
        }
    }
}

const KEPT_STATES: usize = 1024;

impl Handoffs {
    fn set(&self, st: HandoffStatus) {
        let mut v = self.states.lock();
        if let Some(old) = v
            .iter_mut()
            .find(|s| s.run_id == st.run_id && s.step == st.step && s.rank == st.rank)
        {
            *old = st;
            return;
        }
        if v.len() >= KEPT_STATES {
            v.pop_front();
        }
        v.push_back(st);
    }

    fn get(&self, run: &str, step: u64, rank: u32) -> Option<HandoffStatus> {
        self.states
            .lock()
            .iter()
            .find(|s| s.run_id == run && s.step == step && s.rank == rank)
            .cloned()
    }
}

use strata_ckpt::handoff::{HandoffRequest, HandoffStatus};

async fn handoff(
    State(agent): State<Arc<Agent>>,
    Json(req): Json<HandoffRequest>,
) -> Result<StatusCode, ApiError> {
    req.validate()?;
    let remote = match &req.remote_url {
        Some(u) => Some(Tier::Remote(agent.open_url(u)?)),
        None => None,
    };
    let cfg = req.config(remote)?;
    let ck = strata_ckpt::Checkpointer::new(cfg, IoContext::default())?;
    let pending = HandoffStatus {
        run_id: req.run_id.clone(),
        step: req.step,
        rank: req.rank,
        state: "pending".into(),
        error: None,
        error_kind: None,
        retryable: false,
    };
    agent.handoffs().set(pending.clone());
    let running = agent.handoffs().running.clone();
    let (step, upload) = (req.step, req.upload);
    tokio::spawn(async move {
        let Ok(_permit) = running.acquire_owned().await else {
            return;
        };
        let verdict = match ck.finish_from_local(step, upload).await {
            Ok(()) => HandoffStatus {
                state: "done".into(),
                ..pending
            },
            Err(e) => {
                tracing::error!(error = %e, step, "handed-over checkpoint save failed");
                HandoffStatus {
                    state: "failed".into(),
                    error: Some(e.to_string()),
                    error_kind: Some(e.kind().as_str().into()),
                    retryable: e.is_retryable(),
                    ..pending
                }
            }
        };
        agent.handoffs().set(verdict);
    });
    Ok(StatusCode::ACCEPTED)
}

/// Query of `GET /v1/ckpt/handoff`.
#[derive(Debug, serde::Deserialize)]
struct HandoffQuery {
    run: String,
    step: u64,
    rank: u32,
}

async fn handoff_status(
    State(agent): State<Arc<Agent>>,
    axum::extract::Query(q): axum::extract::Query<HandoffQuery>,
) -> Result<Json<HandoffStatus>, ApiError> {
    agent
        .handoffs()
        .get(&q.run, q.step, q.rank)
        .map(Json)
        .ok_or_else(|| {
            ApiError(Error::new(
                ErrorKind::NotFound,
                format!(
                    "no handed-over save of run {} step {} rank {}",
                    q.run, q.step, q.rank
                ),
            ))
        })
}
