//! Quotas and reservations: limits, admission, commits and releases.

use super::common::*;
use api::quotas as q;

pub(super) async fn list_quotas(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<q::ListQuotas>> {
    reply::<q::ListQuotas>(wire::all(
        a.catalog()
            .list_quotas(p.visible_teams().as_deref())
            .await?,
    ))
}

pub(super) async fn team_quotas(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Reply<q::TeamQuotas>> {
    p.require(&team, Role::Reader)?;
    a.catalog().team(&team).await?;
    reply::<q::TeamQuotas>(wire::all(a.catalog().list_quotas(Some(&[team])).await?))
}

pub(super) async fn set_quota(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Reply<q::SetQuota>> {
    p.require_admin()?;
    let limits: QuotaLimits = body::<q::QuotaLimits>(&b)?.into();
    reply::<q::SetQuota>(
        a.catalog()
            .set_quota(&p.id, &team, &scope, &limits)
            .await?
            .into(),
    )
}

pub(super) async fn reserve(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Reply<q::ReserveQuota>> {
    p.require(&team, Role::Member)?;
    let req: q::Reserve = body(&b)?;
    a.catalog().team(&team).await?;
    let ttl = req
        .ttl_secs
        .unwrap_or(a.config().catalog.reservation_ttl_secs)
        .clamp(1, 7 * 86_400);
    reply::<q::ReserveQuota>(
        a.catalog()
            .reserve(&team, &scope, req.bytes, req.objects, ttl)
            .await?
            .into(),
    )
}

pub(super) async fn free_usage(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Reply<q::FreeUsage>> {
    // A correction of the counters, as reconciliation makes: usage otherwise changes only through admitted
    // writes and recorded deletes, so a member cannot talk its team's usage down.
    p.require_admin()?;
    let req: q::Charge = body(&b)?;
    if req.key.is_some() {
        return Err(ApiError(Error::invalid_input("free takes no key")));
    }
    a.catalog().team(&team).await?;
    a.catalog()
        .free_usage(&team, &scope, req.bytes, req.objects)
        .await?;
    reply::<q::FreeUsage>(a.catalog().quota(&team, &scope).await?.into())
}

/// The scope whose objects are records of checkpoint shards the agent cannot list itself (a node's local
/// tier): charged with a key, given back by `deleted`.
const CKPT_SCOPE: &str = "ckpt";

/// Where a team's checkpoint records live in the inventory: backend `ckpt`, keys `<team>/<run>/...`.
fn ckpt_key(team: &str, key: &str) -> ApiResult<String> {
    strata_types::validate_key(key).map_err(ApiError)?;
    if key.len() > 512 {
        return Err(ApiError(Error::invalid_input(
            "a checkpoint key is at most 512 bytes",
        )));
    }
    Ok(format!("{team}/{key}"))
}

/// Checkpoints deleted from a local tier: the team gets back exactly what was recorded for them.
pub(super) async fn deleted(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Reply<q::ShardsDeleted>> {
    p.require(&team, Role::Member)?;
    let req: q::DeletedShards = body(&b)?;
    if scope != CKPT_SCOPE {
        return Err(ApiError(Error::invalid_input(format!(
            "only the {CKPT_SCOPE} scope records deletes here; a backend's deletes go through the backend"
        ))));
    }
    if req.prefix.is_empty() {
        return Err(ApiError(Error::invalid_input(
            "deleted needs a non-empty prefix",
        )));
    }
    a.catalog().team(&team).await?;
    let prefix = ckpt_key(&team, &req.prefix)?;
    let (mut bytes, mut objects) = (0i64, 0i64);
    for o in a.catalog().objects_under(CKPT_SCOPE, &prefix).await? {
        if o.team.as_deref() == Some(team.as_str())
            && let Some(gone) = a.catalog().commit_delete(CKPT_SCOPE, &o.key).await?
        {
            bytes += gone.size;
            objects += 1;
        }
    }
    reply::<q::ShardsDeleted>(q::Freed {
        freed_bytes: bytes,
        freed_objects: objects,
    })
}

pub(super) async fn visible_reservation(
    a: &Agent,
    p: &Principal,
    id: &str,
) -> ApiResult<strata_catalog::quota::Reservation> {
    let r = a
        .catalog()
        .reservation(id)
        .await
        .map_err(|_| not_found("reservation", id))?;
    if !p.can(&r.team, Role::Member) {
        return Err(not_found("reservation", id));
    }
    Ok(r)
}

pub(super) async fn commit_reservation(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<q::CommitReservation>> {
    let r = visible_reservation(&a, &p, &id).await?;
    let req: q::Charge = body(&b)?;
    if req.bytes > r.bytes || req.objects > r.objects || req.bytes < 0 || req.objects < 0 {
        return Err(ApiError(Error::invalid_input(format!(
            "charge between 0 and what was reserved ({} bytes, {} objects)",
            r.bytes, r.objects
        ))));
    }
    match req.key {
        Some(key) => {
            if r.scope != CKPT_SCOPE || req.objects != 1 {
                return Err(ApiError(Error::invalid_input(format!(
                    "a key names one checkpoint shard charged on the {CKPT_SCOPE} scope"
                ))));
            }
            let cat = a.catalog();
            let rec = strata_catalog::inventory::ObjectRecord {
                backend: CKPT_SCOPE.into(),
                key: ckpt_key(&r.team, &key)?,
                size: req.bytes,
                etag: String::new(),
                modified_at: cat.now(),
                team: Some(r.team.clone()),
                principal: Some(p.id.clone()),
                job: None,
                dataset: None,
                accessed_at: None,
            };
            cat.commit_write(vec![r], &rec).await?;
        }
        None => {
            a.catalog()
                .commit_reservation(&r, req.bytes, req.objects)
                .await?
        }
    }
    reply::<q::CommitReservation>(q::Committed { committed: id })
}

/// A body that must be empty (or `{}`).
pub(super) async fn release_reservation(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<q::ReleaseReservation>> {
    let r = visible_reservation(&a, &p, &id).await?;
    if !b.is_empty() {
        let _: q::Nothing = body(&b)?;
    }
    a.catalog().release_reservation(&r).await?;
    reply::<q::ReleaseReservation>(q::Released { released: id })
}
