//! The peer API: checkpoint shard replicas that other nodes' checkpointers push to this agent.
//!
//! | verb | path | what |
//! | --- | --- | --- |
//! | PUT | `/v1/peer/ckpt/{run}/{step}/{file}` | store a shard (`rank-N.safetensors`, verified against `x-strata-blake3` when given), a rank's record (`rank-N.json`) or a manifest (`manifest.json`), durably (fsync + rename) |
//! | GET | `/v1/peer/ckpt/{run}/{step}/{file}` | read one back (the reader verifies it against the manifest) |
//! | GET | `/v1/peer/ckpt/{run}` | `{"steps": [...], "committed": [...]}` |
//! | DELETE | `/v1/peer/ckpt/{run}/{step}` | delete a step (manifest first) |
//!
//! Replicas live under `<data-dir>/peer-checkpoints`, in the same layout as a checkpointer's local tier.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use strata_ckpt::Tier;
use strata_ckpt::manifest::{MANIFEST, Manifest, ShardRecord, validate_run_id};
use strata_types::{Error, ErrorKind, IoContext};

use crate::Agent;
use crate::api::ApiError;

/// Largest replica accepted in one request.
const MAX_REPLICA: usize = 64 << 30;

/// Routes of the peer API.
pub fn router(agent: Arc<Agent>) -> Router {
    Router::new()
        .route("/v1/peer/ckpt/{run}", get(list))
        .route("/v1/peer/ckpt/{run}/{step}", axum::routing::delete(delete))
        .route("/v1/peer/ckpt/{run}/{step}/{file}", get(read).put(write))
        .layer(DefaultBodyLimit::max(MAX_REPLICA))
        .with_state(agent)
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

async fn write(
    State(agent): State<Arc<Agent>>,
    Path((run, step, file)): Path<(String, u64, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    validate_run_id(&run)?;
    let (rank, is_shard) = parse_file(&file)?;
    let t = tier(&agent);
    let ctx = IoContext::default();
    match (rank, is_shard) {
        (Some(rank), true) => {
            if let Some(want) = headers.get("x-strata-blake3").and_then(|v| v.to_str().ok()) {
                let got = blake3::hash(&body).to_hex();
                if got.as_str() != want {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!("{file}: body blake3 {got} != {want}; not stored"),
                    )
                    .into());
                }
            }
            t.write_shard(&ctx, &run, step, rank, &body, &[]).await?;
        }
        (Some(rank), false) => {
            let rec: ShardRecord = serde_json::from_slice(&body)
                .map_err(|e| Error::invalid_input(format!("{file}: not a shard record: {e}")))?;
            if rec.rank != rank {
                return Err(Error::invalid_input(format!("{file} holds rank {}", rec.rank)).into());
            }
            t.write_record(&ctx, &run, step, &rec).await?;
        }
        (None, _) => {
            let m = Manifest::parse(&body, &file)?;
            if m.run_id != run || m.step != step {
                return Err(Error::invalid_input("manifest of another run or step").into());
            }
            t.commit(&ctx, &m).await?;
        }
    }
    Ok(StatusCode::NO_CONTENT)
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
    Ok(StatusCode::NO_CONTENT)
}
