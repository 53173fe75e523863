//! Checkpoint replicas and handed-over saves: the shard replicas other nodes' checkpointers (or agents) push to
//! this agent, and the saves training processes hand over to it.
//!
//! Replicas are stored (`PUT .../{run}/{step}/{file}`: a shard, streamed to disk and verified against
//! `x-strata-blake3` when given, a rank's record or a manifest, durably with fsync + rename), read back (the
//! reader verifies them against the manifest), listed and deleted (manifest first); training processes hand
//! saves over (`/v1/ckpt/handoff`, [`strata_ckpt::handoff`]). The routes are in [`routes`] below.
//!
//! **Whose replicas.** Every team has its own replica store, `<data-dir>/peer-checkpoints/teams/<team>` (callers
//! without a team, administrators and root keys: `.../shared`), in the layout of a checkpointer's local tier. A
//! caller only ever names runs of its own team's store: a token acts for its principal's home team (reading
//! needs the reader role there, writing and deleting the member role); another agent of the cluster acts for
//! the team it names, authenticated by the cluster secret ([`strata_client::ClusterCredential`], checked in
//! [`crate::control::require_token`]), which only these routes accept. Replicas are charged to the team on
//! scope `peer`.
//!
//! **Handed-over saves** are confined to what the caller may write: `local_dir` must be a directory under a
//! configured local-directory backend and `remote_url` a location of a configured (or ad-hoc `s3://`) backend,
//! each with the member role on the run's prefix as [`crate::access`] decides; peers must be agents of this
//! agent's `[cluster] peers`, called with the cluster credential for the caller's team, never a URL a request
//! chose with any credential. The upload is charged to the caller's team on the backend's scope and recorded in
//! the inventory. Handed-over saves run two at a time; their states are kept for the last 1,024.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use strata_catalog::{Principal, Role};
use strata_ckpt::Tier;
use strata_ckpt::manifest::{
    MANIFEST, Manifest, ShardRecord, shard_file, step_dir, validate_run_id,
};
use strata_types::{Error, ErrorKind, IoContext};
use tokio::io::AsyncWriteExt;

use crate::Agent;
use crate::access::{Caller, ClusterCall};
use crate::http::{ApiError, Route, route};
use strata_api as api;

pub(crate) mod record;

/// Largest replica accepted in one request (a shard, streamed to disk).
const MAX_REPLICA: u64 = 64 << 30;
/// Largest record or manifest (held in memory to be parsed).
const MAX_DOCUMENT: usize = 16 << 20;

/// Routes of the peer API, for the route table of [`crate::routes`] (which records their operations:
/// [`record`]).
pub fn routes() -> Vec<Route> {
    // Records and manifests are held in memory to be parsed; replicas stream to disk (their own limit).
    fn r<E: api::Endpoint>(h: axum::routing::MethodRouter<Arc<Agent>>) -> Route {
        route::<E>(h.layer(DefaultBodyLimit::max(MAX_DOCUMENT)))
    }
    vec![
        r::<api::ckpt::ListReplicas>(get(list)),
        r::<api::ckpt::DeleteReplicaStep>(axum::routing::delete(delete)),
        r::<api::ckpt::ReadReplica>(get(read)),
        r::<api::ckpt::WriteReplica>(axum::routing::put(write)),
        r::<api::ckpt::Handoff>(axum::routing::post(handoff)),
        r::<api::ckpt::HandoffStatusOf>(get(handoff_status)),
    ]
}

/// The replica store a call acts on, and who to record and charge for what it writes.
struct Space {
    tier: Tier,
    root: PathBuf,
    /// The inventory key prefix of this store (`teams/<team>/` or `shared/`).
    keys: String,
    team: Option<String>,
    principal: Option<String>,
}

/// The store of the caller's team, if the caller holds `need` there.
fn space(
    agent: &Agent,
    principal: Option<&Principal>,
    cluster: Option<&ClusterCall>,
    need: Role,
) -> Result<Space, Error> {
    let (team, principal) = match (cluster, principal) {
        (Some(c), _) => (c.team.clone(), None),
        (None, Some(p)) => {
            match &p.team {
                Some(t) if p.is_admin || p.can(t, need) => {}
                None if p.is_admin => {}
                Some(t) => {
                    return Err(Error::new(
                        ErrorKind::PermissionDenied,
                        format!(
                            "replicas are your team's ({t}); this needs the role {} in it",
                            need.as_str()
                        ),
                    ));
                }
                None => {
                    return Err(Error::new(
                        ErrorKind::PermissionDenied,
                        "replicas belong to a team, and this principal has none",
                    ));
                }
            }
            (p.team.clone(), Some(p.id.clone()))
        }
        (None, None) => {
            return Err(Error::new(ErrorKind::Unauthenticated, "no caller"));
        }
    };
    let base = agent.config().data_dir.join("peer-checkpoints");
    let (root, keys) = match &team {
        Some(t) => (base.join("teams").join(t), format!("teams/{t}/")),
        None => (base.join("shared"), "shared/".to_string()),
    };
    Ok(Space {
        tier: Tier::Local(root.clone()),
        root,
        keys,
        team,
        principal,
    })
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

type Who = (Option<Extension<Principal>>, Option<Extension<ClusterCall>>);

async fn write(
    State(agent): State<Arc<Agent>>,
    (principal, cluster): Who,
    Path((run, step, file)): Path<(String, u64, String)>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    validate_run_id(&run)?;
    parse_file(&file)?;
    let sp = space(
        &agent,
        principal.as_deref(),
        cluster.as_deref(),
        Role::Member,
    )?;
    // Quota before bytes: a replica is charged to the store's team on scope `peer`, admitted before its body
    // is read, for the length it declares (the body may not exceed it: the server holds it to
    // Content-Length).
    let len = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if len.is_some_and(|n| n > MAX_REPLICA) {
        return Err(
            Error::invalid_input(format!("a replica is at most {MAX_REPLICA} bytes")).into(),
        );
    }
    let res = match (&sp.team, len) {
        (Some(t), Some(n)) => Some(
            agent
                .catalog()
                .reserve(
                    t,
                    PEER_SCOPE,
                    n as i64,
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
    let stored = store(
        &sp,
        &run,
        step,
        &file,
        &headers,
        body,
        len.unwrap_or(MAX_REPLICA),
    )
    .await;
    let cat = agent.catalog();
    match stored {
        Ok(size) => {
            let rec = strata_catalog::inventory::ObjectRecord {
                backend: PEER_SCOPE.into(),
                key: format!("{}{run}/{step}/{file}", sp.keys),
                size: size as i64,
                etag: String::new(),
                modified_at: cat.now(),
                team: sp.team.clone(),
                principal: sp.principal.clone(),
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

/// Store one replica file; returns its size.
async fn store(
    sp: &Space,
    run: &str,
    step: u64,
    file: &str,
    headers: &HeaderMap,
    body: Body,
    limit: u64,
) -> Result<u64, ApiError> {
    let (rank, is_shard) = parse_file(file)?;
    let ctx = IoContext::default();
    if let (Some(_), true) = (rank, is_shard) {
        let want = headers
            .get("x-strata-blake3")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let dir = Tier::local_step(&sp.root, run, step);
        return Ok(stream_to_file(&dir, file, body, want.as_deref(), limit).await?);
    }
    let body = axum::body::to_bytes(body, MAX_DOCUMENT)
        .await
        .map_err(|e| Error::invalid_input(format!("reading {file}: {e}")))?;
    match rank {
        Some(rank) => {
            let rec = ShardRecord::parse(&body, file)
                .map_err(|e| Error::invalid_input(e.message().to_string()))?;
            if rec.rank != rank {
                return Err(Error::invalid_input(format!("{file} holds rank {}", rec.rank)).into());
            }
            sp.tier.write_record(&ctx, run, step, &rec).await?;
        }
        None => {
            let m = Manifest::parse(&body, file)?;
            if m.run_id != run || m.step != step {
                return Err(Error::invalid_input("manifest of another run or step").into());
            }
            sp.tier.commit(&ctx, &m).await?;
        }
    }
    Ok(body.len() as u64)
}

/// Write a streamed body to `dir/file` durably (a temporary file, fsync, rename, fsync of the directory),
/// hashing it on the way: at most `limit` bytes, and its blake3 must be `want` when given. Nothing is left
/// behind when it fails. Memory use is one body chunk, whatever the size.
async fn stream_to_file(
    dir: &FsPath,
    file: &str,
    body: Body,
    want: Option<&str>,
    limit: u64,
) -> Result<u64, Error> {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let io = |e: std::io::Error, what: &str| Error::from_io(e, format!("{what} {file}"));
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| io(e, "creating the directory of"))?;
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{file}.tmp-{}-{seq}", std::process::id()));
    let result = async {
        let mut f = tokio::fs::File::create(&tmp)
            .await
            .map_err(|e| io(e, "creating"))?;
        let mut h = blake3::Hasher::new();
        let mut size = 0u64;
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                Error::new(ErrorKind::Unavailable, format!("reading the replica: {e}"))
                    .with_retryable(true)
            })?;
            size += chunk.len() as u64;
            if size > limit {
                return Err(Error::invalid_input(format!(
                    "the replica is longer than {limit} bytes; not stored"
                )));
            }
            h.update(&chunk);
            f.write_all(&chunk).await.map_err(|e| io(e, "writing"))?;
        }
        if let Some(want) = want {
            let got = h.finalize().to_hex();
            if got.as_str() != want {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{file}: body blake3 {got} != {want}; not stored"),
                ));
            }
        }
        f.sync_all().await.map_err(|e| io(e, "fsync of"))?;
        drop(f);
        tokio::fs::rename(&tmp, dir.join(file))
            .await
            .map_err(|e| io(e, "renaming"))?;
        let d = dir.to_path_buf();
        tokio::task::spawn_blocking(move || std::fs::File::open(&d).and_then(|f| f.sync_all()))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
            .map_err(|e| io(e, "fsync of the directory of"))?;
        Ok(size)
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

async fn read(
    State(agent): State<Arc<Agent>>,
    (principal, cluster): Who,
    Path((run, step, file)): Path<(String, u64, String)>,
) -> Result<Response, ApiError> {
    validate_run_id(&run)?;
    parse_file(&file)?;
    let sp = space(
        &agent,
        principal.as_deref(),
        cluster.as_deref(),
        Role::Reader,
    )?;
    let b = sp
        .tier
        .read_file(&IoContext::default(), &run, step, &file)
        .await
        .map_err(|e| match e.kind() {
            // The store's own path is nobody's business.
            ErrorKind::NotFound => Error::new(
                ErrorKind::NotFound,
                format!("no replica {run}/{step}/{file}"),
            ),
            _ => e,
        })?;
    Ok(Body::from(b).into_response())
}

async fn list(
    State(agent): State<Arc<Agent>>,
    (principal, cluster): Who,
    Path(run): Path<String>,
) -> Result<crate::http::Reply<api::ckpt::ListReplicas>, ApiError> {
    validate_run_id(&run)?;
    let sp = space(
        &agent,
        principal.as_deref(),
        cluster.as_deref(),
        Role::Reader,
    )?;
    let ctx = IoContext::default();
    Ok(crate::http::Reply(api::ckpt::ReplicaSteps {
        steps: sp.tier.steps(&ctx, &run).await?,
        committed: sp.tier.committed(&ctx, &run).await?,
    }))
}

async fn delete(
    State(agent): State<Arc<Agent>>,
    (principal, cluster): Who,
    Path((run, step)): Path<(String, u64)>,
) -> Result<StatusCode, ApiError> {
    validate_run_id(&run)?;
    let sp = space(
        &agent,
        principal.as_deref(),
        cluster.as_deref(),
        Role::Member,
    )?;
    sp.tier
        .delete_step(&IoContext::default(), &run, step)
        .await?;
    // Give the team its bytes back.
    let cat = agent.catalog();
    for o in cat
        .objects_under(PEER_SCOPE, &format!("{}{run}/{step}/", sp.keys))
        .await?
    {
        cat.commit_delete(PEER_SCOPE, &o.key).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Saves handed over by training processes: their states (with the team that handed each over), and a limit on
/// how many run at once.
#[derive(Debug)]
pub struct Handoffs {
    states: parking_lot::Mutex<std::collections::VecDeque<(Option<String>, HandoffStatus)>>,
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
    fn set(&self, team: &Option<String>, st: HandoffStatus) {
        let mut v = self.states.lock();
        if let Some((_, old)) = v.iter_mut().find(|(t, s)| {
            t == team && s.run_id == st.run_id && s.step == st.step && s.rank == st.rank
        }) {
            *old = st;
            return;
        }
        if v.len() >= KEPT_STATES {
            v.pop_front();
        }
        v.push_back((team.clone(), st));
    }

    fn get(&self, team: Option<&str>, run: &str, step: u64, rank: u32) -> Option<HandoffStatus> {
        self.states
            .lock()
            .iter()
            .find(|(t, s)| {
                t.as_deref() == team && s.run_id == run && s.step == step && s.rank == rank
            })
            .map(|(_, s)| s.clone())
    }
}

use strata_ckpt::handoff::{HandoffRequest, HandoffRequestExt, HandoffState, HandoffStatus};

/// The refusal of a handed-over save that names a peer outside the cluster.
fn not_a_member(peer: &str) -> Error {
    Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "peer {peer:?} is not an agent of this agent's cluster ([cluster] peers); replicas go only to members"
        ),
    )
}

/// What a handed-over upload is charged to: the team, the backend's scope, where the run's objects are, and
/// the reservation admitted before any byte was sent.
struct Charge {
    team: String,
    scope: String,
    run_prefix: String,
    reservation: Option<strata_catalog::quota::Reservation>,
    principal: String,
}

async fn handoff(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    Json(req): Json<HandoffRequest>,
) -> Result<StatusCode, ApiError> {
    req.validate()?;
    let run = req.run_id.clone();
    let caller = Caller::Principal(principal.clone());
    let team = principal.team.clone();
    // The local tier: a directory of a local-directory backend where the caller may write the run.
    let (loc, local) = agent.local_location(&req.local_dir)?;
    agent
        .authorize(&caller, &format!("{loc}/{run}/"), Role::Member, true)
        .await?;
    for d in [local.join(&run), Tier::local_step(&local, &run, req.step)] {
        if std::fs::symlink_metadata(&d).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(Error::new(
                ErrorKind::PermissionDenied,
                "a checkpoint's directories must not be links",
            )
            .into());
        }
    }
    // The object store: a backend location where the caller may write the run (retention deletes there too).
    let mut charge = None;
    let mut remote_run = None;
    let remote = match &req.remote_url {
        Some(u) => {
            let u = u.trim_end_matches('/');
            let (scope, _, key, _) = agent
                .authorize_named(&caller, &format!("{u}/{run}/"), Role::Member, true)
                .await?;
            strata_types::validate_key(&key)?;
            let backend = agent.open_url(u)?;
            // Announced as readers name it: the configured backend the URL lies under, and the run's prefix
            // there (the backend opened for the URL is rooted at it, with an id of its own).
            remote_run = agent
                .resolve(&format!("{u}/{run}/"))
                .ok()
                .map(|(b, k)| crate::cluster::coherence::Change::prefix(b.id(), &k));
            // Charged on a configured backend's scope (ad-hoc buckets have no quota scope).
            if let (Some(t), true, false) = (&team, req.upload, scope.contains("://")) {
                let shard = Tier::local_step(&local, &run, req.step).join(shard_file(req.rank));
                let bytes = std::fs::symlink_metadata(&shard).map_or(0, |m| m.len() as i64);
                let reservation = agent
                    .catalog()
                    .reserve(
                        t,
                        &scope,
                        bytes,
                        1,
                        agent.config().catalog.reservation_ttl_secs,
                    )
                    .await?;
                charge = Some(Charge {
                    team: t.clone(),
                    scope,
                    run_prefix: key,
                    reservation: Some(reservation),
                    principal: principal.id.clone(),
                });
            }
            Some(backend)
        }
        None => None,
    };
    // Peers: members of this agent's cluster only, called with the cluster credential for the caller's team.
    let mut peers = Vec::with_capacity(req.peers.len());
    for p in &req.peers {
        let n = crate::config::normalize_peer(p).map_err(|_| not_a_member(p))?;
        if !agent.config().peers.contains(&n) {
            return Err(not_a_member(p).into());
        }
        let Some(secret) = agent.config().cluster_secret.clone() else {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "this agent has no cluster secret (STRATA_CLUSTER_SECRET), so it cannot push replicas to peers",
            )
            .into());
        };
        peers.push(strata_ckpt::tier::Peer::for_cluster(
            &n,
            strata_client::ClusterCredential {
                secret,
                team: team.clone(),
            },
        )?);
    }
    let cfg = req.config(local, remote.clone().map(Tier::Remote), peers)?;
    let ck = strata_ckpt::Checkpointer::new(cfg, IoContext::default())?;
    let pending = HandoffStatus {
        run_id: req.run_id.clone(),
        step: req.step,
        rank: req.rank,
        state: HandoffState::Pending,
        error: None,
        error_kind: None,
        retryable: false,
    };
    agent.handoffs().set(&team, pending.clone());
    let running = agent.handoffs().running.clone();
    let (step, upload, rank) = (req.step, req.upload, req.rank);
    agent.clone().spawn(async move {
        let Ok(_permit) = running.acquire_owned().await else {
            return;
        };
        let result = ck.finish_from_local(step, upload).await;
        // The step's files, its manifest and what retention deleted: seen by every member before the verdict.
        if let Some(c) = remote_run {
            agent.announce(vec![c]).await;
        }
        if let (Some(c), Some(b)) = (charge, remote) {
            settle_upload(&agent, c, &b, &run, step, rank, result.is_ok()).await;
        }
        let verdict = match result {
            Ok(()) => HandoffStatus {
                state: HandoffState::Done,
                ..pending
            },
            Err(e) => {
                tracing::error!(error = %e, step, "handed-over checkpoint save failed");
                HandoffStatus {
                    state: HandoffState::Failed,
                    error: Some(e.to_string()),
                    error_kind: Some(e.kind().as_str().into()),
                    retryable: e.is_retryable(),
                    ..pending
                }
            }
        };
        agent.handoffs().set(&team, verdict);
    });
    Ok(StatusCode::ACCEPTED)
}

/// After a handed-over upload: charge the uploaded shard to the team (or give the admission back), and give
/// back what retention deleted from the run's prefix since.
async fn settle_upload(
    agent: &Agent,
    mut c: Charge,
    backend: &strata_object::Backend,
    run: &str,
    step: u64,
    rank: u32,
    uploaded: bool,
) {
    let cat = agent.catalog();
    let ctx = IoContext::default();
    let res = c.reservation.take();
    let key = format!("{}{}/{}", c.run_prefix, step_dir(step), shard_file(rank));
    let r = async {
        if uploaded {
            let size = backend
                .head(
                    &ctx,
                    &format!("{run}/{}/{}", step_dir(step), shard_file(rank)),
                )
                .await?
                .size as i64;
            let rec = strata_catalog::inventory::ObjectRecord {
                backend: c.scope.clone(),
                key,
                size,
                etag: String::new(),
                modified_at: cat.now(),
                team: Some(c.team.clone()),
                principal: Some(c.principal.clone()),
                job: None,
                dataset: None,
                accessed_at: None,
            };
            cat.commit_write(res.into_iter().collect(), &rec).await?;
        } else if let Some(r) = res {
            cat.release_reservation(&r).await?;
        }
        let kept = Tier::Remote(backend.clone()).steps(&ctx, run).await?;
        for o in cat.objects_under(&c.scope, &c.run_prefix).await? {
            let step_of = o.key[c.run_prefix.len()..]
                .split('/')
                .next()
                .and_then(strata_ckpt::manifest::parse_step_dir);
            if step_of.is_some_and(|s| !kept.contains(&s)) && o.team.as_deref() == Some(&c.team) {
                cat.commit_delete(&c.scope, &o.key).await?;
            }
        }
        Ok::<_, Error>(())
    }
    .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, step, "charging a handed-over upload (a reconcile corrects it)");
    }
}

async fn handoff_status(
    State(agent): State<Arc<Agent>>,
    Extension(principal): Extension<Principal>,
    crate::http::Query(q): crate::http::Query<api::ckpt::HandoffQuery>,
) -> Result<crate::http::Reply<api::ckpt::HandoffStatusOf>, ApiError> {
    // A team sees the saves it handed over (an administrator without a team: those of callers without one).
    agent
        .handoffs()
        .get(principal.team.as_deref(), &q.run, q.step, q.rank)
        .map(crate::http::Reply)
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
