//! Lifecycle: retention policies, protections, clean-up plans (plan, run through the trash, restore, purge).

use super::common::*;
use api::lifecycle as l;

pub(super) async fn list_policies(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<l::ListPolicies>> {
    reply::<l::ListPolicies>(wire::all(
        a.catalog()
            .list_policies(p.visible_teams().as_deref())
            .await?,
    ))
}

pub(super) async fn add_policy(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<l::AddPolicy>> {
    let pol: Policy = body::<l::Policy>(&b)?.into();
    p.require(&pol.team, Role::TeamAdmin)?;
    configured_backend(&a, &pol.backend)?;
    reply::<l::AddPolicy>(a.catalog().add_policy(&p.id, pol).await?.into())
}

pub(super) async fn delete_policy(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Reply<l::DeletePolicy>> {
    let pol = a
        .catalog()
        .policy(&id)
        .await
        .map_err(|_| not_found("policy", &id))?;
    if !p.can(&pol.team, Role::TeamAdmin) {
        return Err(not_found("policy", &id));
    }
    a.catalog().delete_policy(&p.id, &id).await?;
    reply::<l::DeletePolicy>(api::teams::Deleted { deleted: id })
}

pub(super) async fn list_protections(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<l::ListProtections>> {
    reply::<l::ListProtections>(wire::all(
        a.catalog()
            .list_protections(p.visible_teams().as_deref())
            .await?,
    ))
}

pub(super) async fn add_protection(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<l::AddProtection>> {
    let prot: Protection = body::<l::Protection>(&b)?.into();
    p.require(&prot.team, Role::Member)?;
    reply::<l::AddProtection>(a.catalog().add_protection(&p.id, prot).await?.into())
}

pub(super) async fn delete_protection(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Reply<l::DeleteProtection>> {
    let visible = a
        .catalog()
        .list_protections(p.visible_teams().as_deref())
        .await?
        .into_iter()
        .find(|x| x.id == id)
        .ok_or_else(|| not_found("pin or claim", &id))?;
    if !p.can(&visible.team, Role::Member) {
        return Err(not_found("pin or claim", &id));
    }
    a.catalog().delete_protection(&p.id, &id).await?;
    reply::<l::DeleteProtection>(api::teams::Deleted { deleted: id })
}

pub(super) async fn list_plans(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<l::ListPlans>> {
    reply::<l::ListPlans>(wire::all(
        a.catalog().list_plans(p.visible_teams().as_deref()).await?,
    ))
}

pub(super) async fn make_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<l::MakePlan>> {
    let req: l::NewPlan = if b.is_empty() {
        l::NewPlan::default()
    } else {
        body(&b)?
    };
    match &req.team {
        Some(t) => {
            p.require(t, Role::Member)?;
            a.catalog().team(t).await?;
        }
        None => p.require_admin()?,
    }
    let made = cleanup::plan(a.catalog(), &a.backend_map(), &p.id, req.team.as_deref()).await?;
    reply::<l::MakePlan>(l::PlanMade {
        plan: made.plan.into(),
        items: wire::all(made.items),
        per_team: made.per_team,
        protected: made.protected,
    })
}

pub(super) async fn visible_plan(
    a: &Agent,
    p: &Principal,
    id: &str,
    need: Role,
) -> ApiResult<strata_catalog::lifecycle::Plan> {
    let plan = a
        .catalog()
        .plan(id)
        .await
        .map_err(|_| not_found("clean-up plan", id))?;
    let allowed = match &plan.team {
        Some(t) => p.can(t, need),
        None => p.is_admin,
    };
    if !allowed {
        return Err(not_found("clean-up plan", id));
    }
    Ok(plan)
}

pub(super) async fn get_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
) -> ApiResult<Reply<l::GetPlan>> {
    let plan = visible_plan(&a, &p, &id, Role::Reader).await?;
    let items = a.catalog().plan_items(&id).await?;
    reply::<l::GetPlan>(l::PlanDetail {
        plan: plan.into(),
        items: wire::all(items),
    })
}

pub(super) async fn run_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<l::RunPlan>> {
    visible_plan(&a, &p, &id, Role::TeamAdmin).await?;
    let req: l::RunCaps = if b.is_empty() {
        l::RunCaps::default()
    } else {
        body(&b)?
    };
    let caps = Caps {
        max_objects: req.max_objects,
        max_bytes: req.max_bytes,
        max_team_percent: req.max_team_percent,
    };
    if caps
        .max_team_percent
        .is_some_and(|x| !(0.0..=100.0).contains(&x))
    {
        return Err(ApiError(Error::invalid_input(
            "max_team_percent must be between 0 and 100",
        )));
    }
    let report = cleanup::run(a.catalog(), &a.backend_map(), &p.id, &id, &caps).await;
    // Whatever the run moved before it ended, every member forgets it before the answer.
    announce_items(&a, &id).await;
    let r = report?;
    reply::<l::RunPlan>(l::RunReport {
        plan_id: r.plan_id,
        trashed: r.trashed,
        trashed_bytes: r.trashed_bytes,
        skipped: r.skipped,
        deferred: r.deferred,
        status: r.status,
    })
}

/// Announce the keys of plan `id` that clean-up moved (to the trash, or back) to the cluster.
async fn announce_items(a: &Agent, id: &str) {
    let items = match a.catalog().plan_items(id).await {
        Ok(items) => items,
        Err(e) => {
            tracing::warn!(error = %e, plan = id, "listing a plan's items to announce them; forgetting all metadata");
            a.cache().invalidate_all();
            return;
        }
    };
    let backends = a.backend_map();
    let changes = items
        .iter()
        .filter(|i| matches!(i.state, l::ItemState::Trashed | l::ItemState::Restored))
        .filter_map(|i| {
            let b = backends.get(&i.backend)?;
            Some(crate::cluster::coherence::Change::key(b.id(), &i.key))
        })
        .collect();
    a.announce(changes).await;
}

pub(super) async fn restore_plan(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath(id): UrlPath<String>,
    b: Bytes,
) -> ApiResult<Reply<l::RestorePlan>> {
    visible_plan(&a, &p, &id, Role::TeamAdmin).await?;
    let req: l::RestoreItems = if b.is_empty() {
        l::RestoreItems::default()
    } else {
        body(&b)?
    };
    let restored = cleanup::restore(
        a.catalog(),
        &a.backend_map(),
        &p.id,
        &id,
        req.key_prefix.as_deref(),
    )
    .await;
    announce_items(&a, &id).await;
    let (restored, refused) = restored?;
    reply::<l::RestorePlan>(l::Restored { restored, refused })
}

pub(super) async fn purge(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<l::PurgeTrash>> {
    p.require_admin()?;
    let req: l::Purge = if b.is_empty() {
        l::Purge::default()
    } else {
        body(&b)?
    };
    let grace = req
        .grace_secs
        .unwrap_or(a.config().catalog.trash_grace_secs);
    let (n, bytes) = cleanup::purge(a.catalog(), &a.backend_map(), &p.id, grace).await?;
    reply::<l::PurgeTrash>(l::Purged { purged: n, bytes })
}
