//! The clean-up planner and executor.
//!
//! Safety rules, each enforced here and tested in `tests/cleanup.rs`:
//! - **Dry run first.** [`plan`] only lists and selects; it stores the plan (objects, bytes, per team) and
//!   deletes nothing. [`run`] executes a stored plan, and only its items.
//! - **Stop on any listing error.** A plan is made from complete listings or not at all; a run re-lists what it
//!   needs before its first deletion and stops with zero deletions if that fails.
//! - **Re-check before deleting.** Each item is skipped if it changed (size, ETag, mtime), was read (the
//!   inventory's access time) since the plan, or became protected.
//! - **Never protected data.** Pins, unexpired claims, and every step of a checkpoint run from its latest
//!   committed step on (the latest checkpoint, and saves in progress after it).
//! - **Only the policy's own team.** An object is selected only if it is owned (inventory attribution, else
//!   prefix ownership) by the policy's team; unowned data is never selected.
//! - **Caps.** A run stops moving items once it reaches its object, byte or percent-of-team limit; the rest are
//!   `deferred` and a later run continues.
//! - **Trash first.** An item is copied to `.strata-trash/<plan>/<key>` on its backend, then deleted; `restore`
//!   copies it back, `purge` deletes trash older than the grace period. Every step is recorded in the catalog
//!   before the next, so a run killed at any point is finished by running the plan again.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use strata_catalog::Catalog;
use strata_catalog::inventory::{Listed, ObjectRecord, owner_in};
use strata_catalog::lifecycle::{
    ItemState, Plan, PlanItem, PlanStatus, Policy, PolicyKind, Protection,
};
use strata_object::Backend;
use strata_types::{Error, ErrorKind, IoContext, Result};

use crate::reconcile::{TRASH_PREFIX, list_all, listed};

/// Limits on one run (a request body: a misspelled cap is an error, never no cap).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    /// Most items moved to the trash by this plan, over all its runs.
    pub max_objects: Option<u64>,
    /// Most bytes moved to the trash by this plan.
    pub max_bytes: Option<u64>,
    /// Most bytes of one team's data (as listed when planning) moved, in percent.
    pub max_team_percent: Option<f64>,
}

/// A plan as shown to an operator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanReport {
    /// The plan.
    pub plan: Plan,
    /// Its items.
    pub items: Vec<PlanItem>,
    /// Per team: (objects, bytes) selected.
    pub per_team: BTreeMap<String, (u64, u64)>,
    /// Objects a policy matched but a protection kept out.
    pub protected: u64,
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunReport {
    /// Plan.
    pub plan_id: String,
    /// Items moved to the trash by this run.
    pub trashed: u64,
    /// Bytes moved by this run.
    pub trashed_bytes: u64,
    /// Items skipped, with the reason.
    pub skipped: Vec<(String, String)>,
    /// Items left for a later run by a cap.
    pub deferred: u64,
    /// `done` or `partial`.
    pub status: PlanStatus,
}

/// Details stored with a plan.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct PlanDetail {
    policies: Vec<String>,
    team_bytes: BTreeMap<String, u64>,
    protected: u64,
    #[serde(default)]
    last_run: Option<RunReport>,
}

/// A run's checkpoint layout: `<run>/step-<N>/...`, committed when `<run>/step-<N>/manifest.json` exists.
#[derive(Debug, Default)]
struct Checkpoints {
    /// (backend, run prefix) -> committed steps.
    committed: HashMap<(String, String), BTreeSet<u64>>,
}

/// Split a key into (run prefix, step) if it lies in a checkpoint step directory.
fn step_of(key: &str) -> Option<(&str, u64, &str)> {
    let mut start = 0;
    for seg in key.split('/') {
        if let Some(n) = seg.strip_prefix("step-")
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
            && start + seg.len() < key.len()
        {
            let step = n.parse().ok()?;
            return Some((&key[..start], step, &key[start + seg.len() + 1..]));
        }
        start += seg.len() + 1;
    }
    None
}

impl Checkpoints {
    fn add_listing(&mut self, backend: &str, listing: &[Listed]) {
        for o in listing {
            if let Some((run, step, rest)) = step_of(&o.key)
                && rest == "manifest.json"
            {
                self.committed
                    .entry((backend.to_string(), run.to_string()))
                    .or_default()
                    .insert(step);
            }
        }
    }

    fn latest(&self, backend: &str, run: &str) -> Option<u64> {
        self.committed
            .get(&(backend.to_string(), run.to_string()))
            .and_then(|s| s.last().copied())
    }

    /// Whether `key` is part of the latest committed checkpoint of its run, or of a save after it.
    fn protects(&self, backend: &str, key: &str) -> bool {
        match step_of(key) {
            Some((run, step, _)) => self.latest(backend, run).is_some_and(|l| step >= l),
            None => false,
        }
    }
}

fn protection_reason(
    protections: &[Protection],
    ckpts: &Checkpoints,
    backend: &str,
    key: &str,
    now: i64,
) -> Option<String> {
    if let Some(p) = protections.iter().find(|p| p.covers(backend, key, now)) {
        return Some(format!("protected by {} {}", p.kind, p.id));
    }
    if ckpts.protects(backend, key) {
        return Some("protected: latest checkpoint".into());
    }
    None
}

fn label_matches(label: &str, rec: Option<&ObjectRecord>) -> bool {
    let Some(rec) = rec else { return false };
    match label.split_once(':') {
        Some(("dataset", v)) => rec.dataset.as_deref() == Some(v),
        Some(("job", v)) => rec.job.as_deref() == Some(v),
        _ => false,
    }
}

fn trash_key(plan_id: &str, key: &str) -> String {
    format!("{TRASH_PREFIX}{plan_id}/{key}")
}

fn backend_of<'a>(backends: &'a BTreeMap<String, Backend>, name: &str) -> Result<&'a Backend> {
    backends.get(name).ok_or_else(|| {
        Error::new(
            ErrorKind::NotFound,
            format!("no backend named {name:?} on this agent"),
        )
    })
}

/// Make a clean-up plan from the policies of `team` (None = every team): list each backend the policies name
/// completely, select, exclude protected data, and store the plan. Deletes nothing.
pub async fn plan(
    catalog: &Catalog,
    backends: &BTreeMap<String, Backend>,
    actor: &str,
    team: Option<&str>,
) -> Result<PlanReport> {
    let now = catalog.now();
    let teams = team.map(|t| vec![t.to_string()]);
    let policies = catalog.list_policies(teams.as_deref()).await?;
    let protections = catalog.list_protections(None).await?;
    let prefixes = catalog.list_prefixes().await?;
    let names: BTreeSet<&str> = policies.iter().map(|p| p.backend.as_str()).collect();
    // List everything first: any failure here means no plan at all.
    let mut listings: BTreeMap<&str, Vec<Listed>> = BTreeMap::new();
    let mut ckpts = Checkpoints::default();
    for name in &names {
        let listing = list_all(backend_of(backends, name)?, 8)
            .await
            .map_err(|e| e.context(format!("listing backend {name:?}; no plan was made")))?;
        ckpts.add_listing(name, &listing);
        listings.insert(name, listing);
    }
    let plan_id = strata_catalog::new_id(&format!("plan_{now}_"));
    let mut items: BTreeMap<(String, String), PlanItem> = BTreeMap::new();
    let mut team_bytes: BTreeMap<String, u64> = BTreeMap::new();
    let mut protected = BTreeSet::new();
    for (name, listing) in &listings {
        let inventory: HashMap<String, ObjectRecord> = catalog
            .objects_under(name, "")
            .await?
            .into_iter()
            .map(|r| (r.key.clone(), r))
            .collect();
        let owner = |key: &str| -> Option<String> {
            inventory
                .get(key)
                .and_then(|r| r.team.clone())
                .or_else(|| owner_in(&prefixes, name, key))
        };
        for o in listing.iter() {
            if let Some(t) = owner(&o.key) {
                *team_bytes.entry(t).or_default() += o.size.max(0) as u64;
            }
        }
        for pol in policies.iter().filter(|p| p.backend == *name) {
            for o in select(pol, listing, &inventory, now) {
                if owner(&o.key).as_deref() != Some(pol.team.as_str()) {
                    continue;
                }
                if protection_reason(&protections, &ckpts, name, &o.key, now).is_some() {
                    protected.insert((name.to_string(), o.key.clone()));
                    continue;
                }
                items
                    .entry((name.to_string(), o.key.clone()))
                    .or_insert_with(|| PlanItem {
                        plan_id: plan_id.clone(),
                        backend: name.to_string(),
                        key: o.key.clone(),
                        size: o.size,
                        etag: o.etag.clone(),
                        modified_at: o.modified_at,
                        team: Some(pol.team.clone()),
                        policy_id: pol.id.clone(),
                        state: ItemState::Planned,
                        reason: describe(pol),
                        trash_key: None,
                        trashed_at: None,
                    });
            }
        }
    }
    // A team's plan tells of that team's bytes only: its readers see its detail.
    if let Some(t) = team {
        team_bytes.retain(|k, _| k == t);
    }
    let items: Vec<PlanItem> = items.into_values().collect();
    let mut per_team: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for i in &items {
        let e = per_team
            .entry(i.team.clone().unwrap_or_default())
            .or_default();
        e.0 += 1;
        e.1 += i.size.max(0) as u64;
    }
    let detail = PlanDetail {
        policies: policies.iter().map(|p| p.id.clone()).collect(),
        team_bytes,
        protected: protected.len() as u64,
        last_run: None,
    };
    let plan = Plan {
        id: plan_id,
        team: team.map(str::to_string),
        created_at: now,
        created_by: actor.to_string(),
        status: PlanStatus::Planned,
        detail: serde_json::to_string(&detail).unwrap_or_default(),
    };
    catalog.insert_plan(&plan, &items).await?;
    catalog
        .audit(
            actor,
            team,
            "cleanup.plan",
            &plan.id,
            serde_json::json!({"objects": items.len(), "per_team": per_team, "protected": detail.protected}),
        )
        .await?;
    Ok(PlanReport {
        plan,
        items,
        per_team,
        protected: detail.protected,
    })
}

fn describe(p: &Policy) -> String {
    let sel = p
        .prefix
        .clone()
        .or_else(|| p.label.clone())
        .unwrap_or_default();
    match p.kind {
        PolicyKind::Ttl => format!("ttl {} s on {sel}", p.age_secs.unwrap_or_default()),
        PolicyKind::Stale => format!("not read for {} s on {sel}", p.age_secs.unwrap_or_default()),
        PolicyKind::KeepLast => format!(
            "keep last {} checkpoints under {sel}",
            p.keep_last.unwrap_or_default()
        ),
    }
}

/// The listed objects a policy selects (before ownership and protection checks).
fn select<'a>(
    pol: &Policy,
    listing: &'a [Listed],
    inventory: &HashMap<String, ObjectRecord>,
    now: i64,
) -> Vec<&'a Listed> {
    let in_scope = |o: &Listed| match (&pol.prefix, &pol.label) {
        (Some(p), _) => o.key.starts_with(p.as_str()),
        (None, Some(l)) => label_matches(l, inventory.get(&o.key)),
        (None, None) => false,
    };
    match pol.kind {
        PolicyKind::Ttl => {
            let cutoff = now - pol.age_secs.unwrap_or(i64::MAX / 2);
            listing
                .iter()
                .filter(|o| in_scope(o) && o.modified_at <= cutoff)
                .collect()
        }
        PolicyKind::Stale => {
            let cutoff = now - pol.age_secs.unwrap_or(i64::MAX / 2);
            listing
                .iter()
                .filter(|o| {
                    let read = inventory.get(&o.key).and_then(|r| r.accessed_at);
                    in_scope(o) && read.unwrap_or(o.modified_at).max(o.modified_at) <= cutoff
                })
                .collect()
        }
        PolicyKind::KeepLast => {
            let keep = pol.keep_last.unwrap_or(i64::MAX).max(1) as usize;
            let mut ckpts = Checkpoints::default();
            let scoped: Vec<&Listed> = listing.iter().filter(|o| in_scope(o)).collect();
            let owned: Vec<Listed> = scoped.iter().map(|o| (*o).clone()).collect();
            ckpts.add_listing("", &owned);
            scoped
                .into_iter()
                .filter(|o| {
                    let Some((run, step, _)) = step_of(&o.key) else {
                        return false;
                    };
                    let Some(steps) = ckpts.committed.get(&(String::new(), run.to_string())) else {
                        return false;
                    };
                    // The oldest committed step that is kept; everything older goes.
                    match steps.iter().rev().nth(keep - 1) {
                        Some(oldest_kept) => step < *oldest_kept,
                        None => false,
                    }
                })
                .collect()
        }
    }
}

/// Execute a stored plan within `caps`. Safe to run again after a crash or a cap: it continues.
pub async fn run(
    catalog: &Catalog,
    backends: &BTreeMap<String, Backend>,
    actor: &str,
    plan_id: &str,
    caps: &Caps,
) -> Result<RunReport> {
    let plan = catalog.plan(plan_id).await?;
    let mut detail: PlanDetail = serde_json::from_str(&plan.detail).unwrap_or_default();
    let items = catalog.plan_items(plan_id).await?;
    let now = catalog.now();
    let ctx = IoContext::anonymous();
    // Pre-flight, before any deletion: re-read protections and re-list every checkpoint run an item is in.
    let protections = catalog.list_protections(None).await?;
    let mut ckpts = Checkpoints::default();
    let runs: BTreeSet<(String, String)> = items
        .iter()
        .filter(|i| matches!(i.state, ItemState::Planned | ItemState::Deferred))
        .filter_map(|i| step_of(&i.key).map(|(run, _, _)| (i.backend.clone(), run.to_string())))
        .collect();
    for (name, run_prefix) in &runs {
        let b = backend_of(backends, name)?;
        let page = b
            .list_page(&ctx, run_prefix, None, usize::MAX)
            .await
            .map_err(|e| {
                e.context(format!(
                    "re-listing {name}:{run_prefix}; nothing was deleted"
                ))
            })?;
        let listed: Vec<Listed> = page.objects.iter().map(listed).collect();
        ckpts.add_listing(name, &listed);
    }
    for i in &items {
        backend_of(backends, &i.backend)?;
    }
    let mut report = RunReport {
        plan_id: plan_id.to_string(),
        ..Default::default()
    };
    // Caps count what this plan already moved in earlier runs.
    let mut moved_objects: u64 = items
        .iter()
        .filter(|i| i.state == ItemState::Trashed)
        .count() as u64;
    let mut moved_bytes: u64 = items
        .iter()
        .filter(|i| i.state == ItemState::Trashed)
        .map(|i| i.size.max(0) as u64)
        .sum();
    let mut moved_by_team: BTreeMap<String, u64> = BTreeMap::new();
    for i in items.iter().filter(|i| i.state == ItemState::Trashed) {
        *moved_by_team
            .entry(i.team.clone().unwrap_or_default())
            .or_default() += i.size.max(0) as u64;
    }
    catalog
        .set_plan_status(plan_id, PlanStatus::Running, &plan.detail)
        .await?;
    for item in items
        .iter()
        .filter(|i| matches!(i.state, ItemState::Planned | ItemState::Deferred))
    {
        let backend = backend_of(backends, &item.backend)?;
        let size = item.size.max(0) as u64;
        let team = item.team.clone().unwrap_or_default();
        if let Some(why) = protection_reason(&protections, &ckpts, &item.backend, &item.key, now) {
            skip(catalog, item, &mut report, &why).await?;
            continue;
        }
        let rec = catalog.object(&item.backend, &item.key).await?;
        if rec
            .as_ref()
            .and_then(|r| r.accessed_at)
            .is_some_and(|a| a > plan.created_at)
        {
            skip(catalog, item, &mut report, "read since the plan was made").await?;
            continue;
        }
        let tkey = trash_key(plan_id, &item.key);
        match backend.head(&ctx, &item.key).await {
            Ok(m) => {
                if m.size as i64 != item.size
                    || m.etag.clone().unwrap_or_default() != item.etag
                    || m.last_modified_unix != item.modified_at
                {
                    skip(
                        catalog,
                        item,
                        &mut report,
                        "changed since the plan was made",
                    )
                    .await?;
                    continue;
                }
                let over_cap = caps.max_objects.is_some_and(|m| moved_objects + 1 > m)
                    || caps.max_bytes.is_some_and(|m| moved_bytes + size > m)
                    || caps.max_team_percent.is_some_and(|pct| {
                        let total = detail.team_bytes.get(&team).copied().unwrap_or(0) as f64;
                        (moved_by_team.get(&team).copied().unwrap_or(0) + size) as f64
                            > total * pct / 100.0
                    });
                if over_cap {
                    report.deferred += 1;
                    catalog
                        .set_item_state(
                            item,
                            ItemState::Deferred,
                            "cap reached; run the plan again",
                            None,
                            None,
                        )
                        .await?;
                    continue;
                }
                backend.copy(&ctx, &item.key, &tkey).await?;
                fail::fail_point!("cleanup-after-copy", |_| Err(Error::internal(
                    "failpoint cleanup-after-copy"
                )));
                backend.delete(&ctx, &item.key).await?;
                fail::fail_point!("cleanup-after-delete", |_| Err(Error::internal(
                    "failpoint cleanup-after-delete"
                )));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                // Resuming after a crash between delete and record: the trash copy is the proof.
                match backend.head(&ctx, &tkey).await {
                    Ok(t) if t.size as i64 == item.size => {}
                    Ok(_) | Err(_) => {
                        skip(catalog, item, &mut report, "gone before the run").await?;
                        continue;
                    }
                }
            }
            Err(e) => return Err(e.context(format!("checking {}:{}", item.backend, item.key))),
        }
        catalog
            .set_item_state(
                item,
                ItemState::Trashed,
                &item.reason,
                Some(&tkey),
                Some(catalog.now()),
            )
            .await?;
        if catalog
            .record_delete(&item.backend, &item.key)
            .await?
            .is_some()
            && !team.is_empty()
        {
            catalog
                .adjust_usage(&team, &item.backend, -item.size, -1)
                .await?;
        }
        catalog
            .audit(
                actor,
                item.team.as_deref(),
                "cleanup.trash",
                &format!("{}:{}", item.backend, item.key),
                serde_json::json!({"plan": plan_id, "bytes": item.size, "trash_key": tkey}),
            )
            .await?;
        moved_objects += 1;
        moved_bytes += size;
        *moved_by_team.entry(team).or_default() += size;
        report.trashed += 1;
        report.trashed_bytes += size;
    }
    report.status = if report.deferred > 0 {
        PlanStatus::Partial
    } else {
        PlanStatus::Done
    };
    detail.last_run = Some(report.clone());
    catalog
        .set_plan_status(
            plan_id,
            report.status,
            &serde_json::to_string(&detail).unwrap_or_default(),
        )
        .await?;
    catalog
        .audit(
            actor,
            plan.team.as_deref(),
            "cleanup.run",
            plan_id,
            serde_json::json!({"trashed": report.trashed, "bytes": report.trashed_bytes,
                               "skipped": report.skipped.len(), "deferred": report.deferred}),
        )
        .await?;
    Ok(report)
}

async fn skip(catalog: &Catalog, item: &PlanItem, report: &mut RunReport, why: &str) -> Result<()> {
    report
        .skipped
        .push((format!("{}:{}", item.backend, item.key), why.to_string()));
    catalog
        .set_item_state(item, ItemState::Skipped, why, None, None)
        .await
}

/// Restore trashed items of a plan (all, or those whose key starts with `key_prefix`). An item whose key was
/// written again since is not overwritten: it is reported and left in the trash.
pub async fn restore(
    catalog: &Catalog,
    backends: &BTreeMap<String, Backend>,
    actor: &str,
    plan_id: &str,
    key_prefix: Option<&str>,
) -> Result<(u64, Vec<(String, String)>)> {
    let ctx = IoContext::anonymous();
    let mut restored = 0;
    let mut refused = Vec::new();
    for item in catalog.plan_items(plan_id).await? {
        if item.state != ItemState::Trashed || key_prefix.is_some_and(|p| !item.key.starts_with(p))
        {
            continue;
        }
        let backend = backend_of(backends, &item.backend)?;
        let Some(tkey) = item.trash_key.clone() else {
            continue;
        };
        match backend.head(&ctx, &item.key).await {
            Ok(_) => {
                refused.push((
                    item.key.clone(),
                    "a new object exists at this key; not overwritten".into(),
                ));
                continue;
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        backend.copy(&ctx, &tkey, &item.key).await?;
        let m = backend.head(&ctx, &item.key).await?;
        backend.delete(&ctx, &tkey).await?;
        catalog
            .set_item_state(
                &item,
                ItemState::Restored,
                "restored from the trash",
                None,
                None,
            )
            .await?;
        catalog
            .record_write(&ObjectRecord {
                backend: item.backend.clone(),
                key: item.key.clone(),
                size: m.size as i64,
                etag: m.etag.clone().unwrap_or_default(),
                modified_at: m.last_modified_unix,
                team: item.team.clone(),
                principal: None,
                job: None,
                dataset: None,
                accessed_at: None,
            })
            .await?;
        if let Some(team) = &item.team {
            catalog
                .adjust_usage(team, &item.backend, item.size, 1)
                .await?;
        }
        catalog
            .audit(
                actor,
                item.team.as_deref(),
                "cleanup.restore",
                &format!("{}:{}", item.backend, item.key),
                serde_json::json!({"plan": plan_id}),
            )
            .await?;
        restored += 1;
    }
    Ok((restored, refused))
}

/// Delete trash older than `grace_secs` for good. Returns (items, bytes) purged.
pub async fn purge(
    catalog: &Catalog,
    backends: &BTreeMap<String, Backend>,
    actor: &str,
    grace_secs: i64,
) -> Result<(u64, u64)> {
    if grace_secs < 0 {
        return Err(Error::invalid_input("the grace period cannot be negative"));
    }
    let ctx = IoContext::anonymous();
    let now = catalog.now();
    let (mut n, mut bytes) = (0, 0);
    for item in catalog.trashed_items().await? {
        if item.trashed_at.is_none_or(|t| t + grace_secs > now) {
            continue;
        }
        let (Ok(backend), Some(tkey)) = (
            backend_of(backends, &item.backend),
            item.trash_key.as_deref(),
        ) else {
            continue;
        };
        backend.delete(&ctx, tkey).await?;
        catalog
            .set_item_state(&item, ItemState::Purged, "grace period over", None, None)
            .await?;
        catalog
            .audit(
                actor,
                item.team.as_deref(),
                "cleanup.purge",
                &format!("{}:{}", item.backend, item.key),
                serde_json::json!({"plan": item.plan_id, "bytes": item.size}),
            )
            .await?;
        n += 1;
        bytes += item.size.max(0) as u64;
    }
    Ok((n, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_parsing() {
        assert_eq!(
            step_of("ck/run1/step-00000000000000000005/manifest.json"),
            Some(("ck/run1/", 5, "manifest.json"))
        );
        assert_eq!(step_of("step-3/x"), Some(("", 3, "x")));
        assert_eq!(step_of("ck/step-/x"), None);
        assert_eq!(step_of("ck/step-12"), None, "a file named like a step dir");
        assert_eq!(step_of("ck/stepx-1/a"), None);
    }
}
