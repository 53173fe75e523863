//! Quotas and reservations: limits, admission, commits and releases.

use super::common::*;

pub(super) async fn list_quotas(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Json> {
    ok(a.catalog()
        .list_quotas(p.visible_teams().as_deref())
        .await?)
}

pub(super) async fn team_quotas(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require(&team, Role::Reader)?;
    a.catalog().team(&team).await?;
    ok(a.catalog().list_quotas(Some(&[team])).await?)
}

pub(super) async fn set_quota(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require_admin()?;
    let limits: QuotaLimits = body(&b)?;
    ok(a.catalog().set_quota(&p.id, &team, &scope, &limits).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReserveBody {
    bytes: i64,
    #[serde(default)]
    objects: i64,
    ttl_secs: Option<i64>,
}

pub(super) async fn reserve(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require(&team, Role::Member)?;
    let req: ReserveBody = body(&b)?;
    a.catalog().team(&team).await?;
    let ttl = req
        .ttl_secs
        .unwrap_or(a.config().catalog.reservation_ttl_secs)
        .clamp(1, 7 * 86_400);
    ok(a.catalog()
        .reserve(&team, &scope, req.bytes, req.objects, ttl)
        .await?)
}

pub(super) async fn free_usage(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, scope)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require(&team, Role::Member)?;
    let req: ChargeBody = body(&b)?;
    a.catalog().team(&team).await?;
    a.catalog()
        .free_usage(&team, &scope, req.bytes, req.objects)
        .await?;
    ok(a.catalog().quota(&team, &scope).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ChargeBody {
    bytes: i64,
    #[serde(default)]
    objects: i64,
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
) -> ApiResult<Json> {
    let r = visible_reservation(&a, &p, &id).await?;
    let req: ChargeBody = body(&b)?;
    if req.bytes > r.bytes || req.objects > r.objects || req.bytes < 0 || req.objects < 0 {
        return Err(ApiError(Error::invalid_input(format!(
            "charge between 0 and what was reserved ({} bytes, {} objects)",
            r.bytes, r.objects
        ))));
    }
    a.catalog()
        .commit_reservation(&r, req.bytes, req.objects)
        .await?;
    ok(serde_json::json!({"committed": id}))
}

pub(super) async fn release_reservation(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let r = visible_reservation(&a, &p, &id).await?;
    a.catalog().release_reservation(&r).await?;
    ok(serde_json::json!({"released": id}))
}
