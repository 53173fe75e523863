//! Teams, members, principals and their tokens and keys.

use super::common::*;

pub(super) async fn whoami(Extension(p): Authed) -> ApiResult<Json> {
    ok(p)
}

pub(super) async fn list_teams(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Json> {
    let visible = p.visible_teams();
    let teams: Vec<_> = a
        .catalog()
        .list_teams()
        .await?
        .into_iter()
        .filter(|t| visible.as_ref().is_none_or(|v| v.contains(&t.name)))
        .collect();
    ok(teams)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NameBody {
    name: String,
}

pub(super) async fn create_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    p.require_admin()?;
    let req: NameBody = body(&b)?;
    ok(a.catalog().create_team(&p.id, &req.name).await?)
}

pub(super) async fn get_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require(&team, Role::Reader)?;
    ok(a.catalog().team(&team).await?)
}

pub(super) async fn delete_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require_admin()?;
    a.catalog().delete_team(&p.id, &team).await?;
    ok(serde_json::json!({"deleted": team}))
}

pub(super) async fn list_members(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Json> {
    p.require(&team, Role::Reader)?;
    a.catalog().team(&team).await?;
    ok(a.catalog().list_principals(Some(&team)).await?)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RoleBody {
    role: Role,
}

pub(super) async fn set_member(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, principal)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Json> {
    p.require(&team, Role::TeamAdmin)?;
    let req: RoleBody = body(&b)?;
    a.catalog()
        .set_membership(&p.id, &team, &principal, req.role)
        .await?;
    ok(serde_json::json!({"team": team, "principal": principal, "role": req.role}))
}

pub(super) async fn remove_member(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, principal)): UrlPath<(String, String)>,
) -> ApiResult<Json> {
    p.require(&team, Role::TeamAdmin)?;
    a.catalog()
        .remove_membership(&p.id, &team, &principal)
        .await?;
    ok(serde_json::json!({"removed": principal}))
}

pub(super) async fn list_tokens(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<TeamQuery>,
) -> ApiResult<Json> {
    match q.team {
        Some(t) => {
            p.require(&t, Role::TeamAdmin)?;
            ok(a.catalog().list_principals(Some(&t)).await?)
        }
        None if p.is_admin => ok(a.catalog().list_principals(None).await?),
        None => {
            // The principals of every team the caller administers.
            let mut seen = std::collections::BTreeMap::new();
            for m in p.memberships.iter().filter(|m| m.role == Role::TeamAdmin) {
                for x in a.catalog().list_principals(Some(&m.team)).await? {
                    seen.insert(x.id.clone(), x);
                }
            }
            ok(seen.into_values().collect::<Vec<_>>())
        }
    }
}

pub(super) async fn create_token(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Json> {
    let req: NewPrincipal = body(&b)?;
    if req.admin {
        p.require_admin()?;
    } else {
        let team = req
            .team
            .as_deref()
            .ok_or_else(|| Error::invalid_input("a token needs a team (or admin: true)"))?;
        p.require(team, Role::TeamAdmin)?;
    }
    ok(a.catalog().create_principal(&p.id, &req).await?)
}

pub(super) async fn revoke_token(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Json> {
    let target = a
        .catalog()
        .principal(&id)
        .await
        .map_err(|_| not_found("principal", &id))?;
    let allowed = p.id == target.id
        || p.is_admin
        || target
            .team
            .as_deref()
            .is_some_and(|t| p.can(t, Role::TeamAdmin) && !target.is_admin);
    if !allowed {
        return Err(not_found("principal", &id));
    }
    a.catalog().revoke_principal(&p.id, &id).await?;
    a.access.tokens.lock().clear();
    ok(serde_json::json!({"revoked": id}))
}
