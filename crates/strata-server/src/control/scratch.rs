//! Scratch allocations: quota-admitted directories with a TTL.

use super::common::*;
use api::admin as adm;

pub(super) fn scratch_dir(a: &Agent) -> std::path::PathBuf {
    a.config().data_dir.join("scratch")
}

/// Where the scratch allocation `id` lives while it is held.
pub(crate) fn scratch_path(a: &Agent, id: &str) -> std::path::PathBuf {
    scratch_dir(a).join(id)
}

pub(super) async fn list_scratch(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<adm::ListScratch>> {
    reply::<adm::ListScratch>(wire::all(
        a.catalog()
            .list_scratch(p.visible_teams().as_deref())
            .await?,
    ))
}

pub(super) async fn alloc_scratch(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<adm::AllocScratch>> {
    let req: adm::NewScratch = body(&b)?;
    p.require(&req.team, Role::Member)?;
    if req.bytes <= 0 || req.ttl_secs <= 0 || req.ttl_secs > 90 * 86_400 {
        return Err(ApiError(Error::invalid_input(
            "scratch needs bytes > 0 and 0 < ttl_secs <= 90 days",
        )));
    }
    a.catalog().team(&req.team).await?;
    let s = allocate_scratch(&a, &req.team, req.bytes, req.ttl_secs).await?;
    let (cat, id) = (a.catalog(), s.id.clone());
    cat.audit(
        &p.id,
        Some(&req.team),
        "scratch.alloc",
        &id,
        serde_json::json!({"bytes": req.bytes, "ttl_secs": req.ttl_secs}),
    )
    .await?;
    reply::<adm::AllocScratch>(s.into())
}

/// Allocate scratch for `team`: admitted against its `scratch` quota, then charged in full; a directory under
/// the agent's data dir, released when `ttl_secs` pass.
pub(crate) async fn allocate_scratch(
    a: &Agent,
    team: &str,
    bytes: i64,
    ttl_secs: i64,
) -> Result<Scratch> {
    let cat = a.catalog();
    // Quota before bytes: the allocation is admitted, then charged in full.
    let res = cat.reserve(team, "scratch", bytes, 1, 600).await?;
    let now = cat.now();
    let id = format!("scr_{now}_{:08x}", rand::random::<u32>());
    let path = scratch_dir(a).join(&id);
    if let Err(e) = std::fs::create_dir_all(&path) {
        cat.release_reservation(&res).await?;
        return Err(Error::from_io(e, format!("creating {}", path.display())));
    }
    cat.commit_reservation(&res, bytes, 1).await?;
    let s = Scratch {
        id,
        team: team.to_string(),
        bytes,
        path: path.display().to_string(),
        expires_at: now + ttl_secs,
        created_at: now,
        released_at: None,
    };
    cat.insert_scratch(&s).await?;
    Ok(s)
}

pub(super) async fn free_scratch(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Reply<adm::FreeScratch>> {
    let s = a
        .catalog()
        .list_scratch(p.visible_teams().as_deref())
        .await?
        .into_iter()
        .find(|s| s.id == id)
        .ok_or_else(|| not_found("scratch allocation", &id))?;
    p.require(&s.team, Role::Member)?;
    release_scratch(&a, &s, &p.id, false).await?;
    reply::<adm::FreeScratch>(api::quotas::Released { released: id })
}

/// Release a scratch allocation: its directory is deleted (or, on expiry, moved to the scratch trash) and its
/// bytes are given back to the team's quota.
pub(crate) async fn release_scratch(
    a: &Agent,
    s: &Scratch,
    actor: &str,
    expired: bool,
) -> Result<()> {
    let dir = std::path::PathBuf::from(&s.path);
    if dir.starts_with(scratch_dir(a)) && dir.exists() {
        if expired {
            let trash = a.config().data_dir.join("scratch-trash");
            std::fs::create_dir_all(&trash)
                .map_err(|e| Error::from_io(e, format!("creating {}", trash.display())))?;
            std::fs::rename(&dir, trash.join(&s.id))
                .map_err(|e| Error::from_io(e, format!("moving {} to the trash", dir.display())))?;
        } else {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::from_io(e, format!("deleting {}", dir.display())))?;
        }
    }
    if a.catalog().release_scratch(&s.id).await? {
        a.catalog()
            .adjust_usage(&s.team, "scratch", -s.bytes, -1)
            .await?;
        a.catalog()
            .audit(
                actor,
                Some(&s.team),
                if expired {
                    "scratch.expire"
                } else {
                    "scratch.release"
                },
                &s.id,
                serde_json::json!({"bytes": s.bytes}),
            )
            .await?;
    }
    Ok(())
}
