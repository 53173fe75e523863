//! Usage by team, prefix, job or dataset; reconciliation and POSIX scans; prefix ownership.

use super::common::*;
use api::usage as u;

pub(super) async fn usage(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<u::UsageQuery>,
) -> ApiResult<Reply<u::GetUsage>> {
    let by: UsageBy = q.by.unwrap_or_default();
    reply::<u::GetUsage>(wire::all(
        a.catalog().usage(by, p.visible_teams().as_deref()).await?,
    ))
}

pub(super) async fn reconcile(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<u::ReconcileUsage>> {
    p.require_admin()?;
    let req: u::Reconcile = body(&b)?;
    let backend = &configured_backend(&a, &req.backend)?.backend;
    let run = strata_quota::reconcile::reconcile(a.catalog(), &req.backend, backend, 16).await?;
    a.catalog()
        .audit(
            &p.id,
            None,
            "usage.reconcile",
            &req.backend,
            serde_json::json!({"added": run.report.added, "updated": run.report.updated, "removed": run.report.removed}),
        )
        .await?;
    let r = run.report;
    reply::<u::ReconcileUsage>(u::Reconciled {
        backend: r.backend,
        listed: r.listed,
        listed_bytes: r.listed_bytes,
        added: r.added,
        updated: r.updated,
        removed: r.removed,
        teams: r.teams,
        released_reservations: r.released_reservations,
        list_secs: run.list_secs,
        apply_secs: run.apply_secs,
    })
}

pub(super) async fn scan_backend(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<u::ScanUsage>> {
    p.require_admin()?;
    let req: u::Scan = body(&b)?;
    let nb = configured_backend(&a, &req.backend)?;
    let Some(root) = nb.url.strip_prefix("file://").map(std::path::PathBuf::from) else {
        return Err(ApiError(Error::invalid_input(format!(
            "backend {:?} is not a local directory (file://); use /v1/usage/reconcile",
            req.backend
        ))));
    };
    let opts = strata_quota::scan::ScanOptions {
        threads: req.threads.min(256),
        one_file_system: true,
        project_depth: 1,
    };
    let started = std::time::Instant::now();
    let report = tokio::task::spawn_blocking(move || strata_quota::scan::scan(&root, &opts))
        .await
        .map_err(|e| ApiError(Error::internal(format!("scan task: {e}"))))??;
    let secs = started.elapsed().as_secs_f64();
    // Projects -> owning teams (a project `p` is the prefix `p/`); the trash is not data.
    let prefixes = a.catalog().list_prefixes().await?;
    let mut teams: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (project, t) in &report.by_project {
        if project == ".strata-trash" {
            continue;
        }
        if let Some(team) =
            strata_catalog::inventory::owner_in(&prefixes, &req.backend, &format!("{project}/"))
        {
            let e = teams.entry(team).or_default();
            e.0 += t.file_bytes as i64;
            e.1 += t.files as i64;
        }
    }
    for q in a.catalog().list_quotas(None).await? {
        if q.scope == req.backend && !teams.contains_key(&q.team) {
            teams.insert(q.team.clone(), (0, 0));
        }
    }
    for (team, (bytes, files)) in &teams {
        a.catalog()
            .set_usage(team, &req.backend, *bytes, *files)
            .await?;
    }
    a.catalog()
        .audit(
            &p.id,
            None,
            "usage.scan",
            &req.backend,
            serde_json::json!({"files": report.total.files, "bytes": report.total.file_bytes, "secs": secs}),
        )
        .await?;
    let t = report.total;
    reply::<u::ScanUsage>(u::Scanned {
        backend: req.backend,
        secs,
        total: u::TreeTotals {
            bytes: t.bytes,
            apparent_bytes: t.apparent_bytes,
            file_bytes: t.file_bytes,
            files: t.files,
            dirs: t.dirs,
        },
        teams,
        errors_total: report.errors_total,
    })
}

pub(super) async fn list_prefixes(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<u::ListPrefixes>> {
    let visible = p.visible_teams();
    let v = a
        .catalog()
        .list_prefixes()
        .await?
        .into_iter()
        .filter(|x| visible.as_ref().is_none_or(|v| v.contains(&x.team)));
    reply::<u::ListPrefixes>(wire::all(v))
}

pub(super) async fn set_prefix(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    b: Bytes,
) -> ApiResult<Reply<u::SetPrefix>> {
    p.require_admin()?;
    let req: u::OwnedPrefix = body(&b)?;
    configured_backend(&a, &req.backend)?;
    let owned = a
        .catalog()
        .set_prefix_owner(&p.id, &req.backend, &req.prefix, &req.team)
        .await?;
    a.ownership().invalidate();
    reply::<u::SetPrefix>(owned.into())
}
