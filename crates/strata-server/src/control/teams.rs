//! Teams, members, principals and their tokens and keys.

use super::common::*;
use api::teams as t;

pub(super) async fn whoami(Extension(p): Authed) -> ApiResult<Reply<t::WhoAmI>> {
    reply::<t::WhoAmI>(p.into())
}

pub(super) async fn list_teams(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<t::ListTeams>> {
    let visible = p.visible_teams();
    let teams: Vec<_> = a
        .catalog()
        .list_teams()
        .await?
        .into_iter()
        .filter(|t| visible.as_ref().is_none_or(|v| v.contains(&t.name)))
        .collect();
    reply::<t::ListTeams>(wire::all(teams))
}

pub(super) async fn create_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<t::CreateTeam>> {
    p.require_admin()?;
    let req: t::NewTeam = body(&b)?;
    reply::<t::CreateTeam>(a.catalog().create_team(&p.id, &req.name).await?.into())
}

pub(super) async fn get_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Reply<t::GetTeam>> {
    p.require(&team, Role::Reader)?;
    reply::<t::GetTeam>(a.catalog().team(&team).await?.into())
}

pub(super) async fn delete_team(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Reply<t::DeleteTeam>> {
    p.require_admin()?;
    a.catalog().delete_team(&p.id, &team).await?;
    reply::<t::DeleteTeam>(t::Deleted { deleted: team })
}

pub(super) async fn list_members(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(team): UrlPath<String>,
) -> ApiResult<Reply<t::ListMembers>> {
    p.require(&team, Role::Reader)?;
    a.catalog().team(&team).await?;
    reply::<t::ListMembers>(wire::all(a.catalog().list_principals(Some(&team)).await?))
}

pub(super) async fn set_member(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, principal)): UrlPath<(String, String)>,
    b: Bytes,
) -> ApiResult<Reply<t::SetMember>> {
    p.require(&team, Role::TeamAdmin)?;
    let req: t::SetRole = body(&b)?;
    a.catalog()
        .set_membership(&p.id, &team, &principal, req.role)
        .await?;
    reply::<t::SetMember>(t::MemberSet {
        team,
        principal,
        role: req.role,
    })
}

pub(super) async fn remove_member(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, principal)): UrlPath<(String, String)>,
) -> ApiResult<Reply<t::RemoveMember>> {
    p.require(&team, Role::TeamAdmin)?;
    a.catalog()
        .remove_membership(&p.id, &team, &principal)
        .await?;
    reply::<t::RemoveMember>(t::Removed { removed: principal })
}

pub(super) async fn list_tokens(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<t::TokensQuery>,
) -> ApiResult<Reply<t::ListTokens>> {
    match q.team {
        Some(team) => {
            p.require(&team, Role::TeamAdmin)?;
            reply::<t::ListTokens>(wire::all(a.catalog().list_principals(Some(&team)).await?))
        }
        None if p.is_admin => {
            reply::<t::ListTokens>(wire::all(a.catalog().list_principals(None).await?))
        }
        None => {
            // The principals of every team the caller administers.
            let mut seen = std::collections::BTreeMap::new();
            for m in p.memberships.iter().filter(|m| m.role == Role::TeamAdmin) {
                for x in a.catalog().list_principals(Some(&m.team)).await? {
                    seen.insert(x.id.clone(), x);
                }
            }
            reply::<t::ListTokens>(wire::all(seen.into_values()))
        }
    }
}

pub(super) async fn create_token(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<t::CreateToken>> {
    let req: NewPrincipal = body::<t::NewToken>(&b)?.into();
    if req.admin {
        p.require_admin()?;
    } else {
        let team = req
            .team
            .as_deref()
            .ok_or_else(|| Error::invalid_input("a token needs a team (or admin: true)"))?;
        p.require(team, Role::TeamAdmin)?;
    }
    reply::<t::CreateToken>(a.catalog().create_principal(&p.id, &req).await?.into())
}

pub(super) async fn revoke_token(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Reply<t::RevokeToken>> {
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
    reply::<t::RevokeToken>(t::Revoked { revoked: id })
}
