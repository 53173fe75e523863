//! `strata cleanup`: plans, runs through the trash, restores, purges.

use super::*;
use api::lifecycle as l;

#[derive(Debug, Subcommand)]
pub enum CleanupCommand {
    /// Plan a clean-up from the retention policies: a dry run that lists what would go (objects, bytes, per
    /// team) and deletes nothing.
    Plan {
        /// Only this team's policies (required unless you are an administrator).
        #[arg(long)]
        team: Option<String>,
    },
    /// Execute a plan: each item is re-checked (skipped if changed, read or protected since), moved to the
    /// trash, and audited. Caps stop the run; run again to continue.
    Run {
        /// Plan id.
        plan: String,
        /// Most items moved by this plan.
        #[arg(long)]
        max_objects: Option<u64>,
        /// Most bytes moved by this plan.
        #[arg(long)]
        max_bytes: Option<strata_types::ByteSize>,
        /// Most percent of a team's data moved.
        #[arg(long)]
        max_team_percent: Option<f64>,
    },
    /// Put a plan's trashed items back (all, or those under a key prefix).
    Restore {
        /// Plan id.
        plan: String,
        /// Only keys starting with this.
        #[arg(long)]
        key_prefix: Option<String>,
    },
    /// Show a plan and its items.
    Show {
        /// Plan id.
        plan: String,
    },
    /// List plans.
    Ls,
    /// Delete trash older than the grace period (administrators).
    Purge {
        /// Grace period in seconds (default: the agent's catalog.trash_grace_secs).
        #[arg(long)]
        grace: Option<String>,
    },
}

fn print_plan(plan: &l::Plan, items: &[l::PlanItem]) {
    println!(
        "plan {}  team {}  status {}  made {} by {}",
        plan.id,
        opt(plan.team.as_deref()),
        plan.status,
        at(Some(plan.created_at)),
        plan.created_by
    );
    let mut per_team: std::collections::BTreeMap<String, (u64, i64)> = Default::default();
    for i in items {
        let e = per_team.entry(opt(i.team.as_deref())).or_default();
        e.0 += 1;
        e.1 += i.size;
    }
    for (t, (n, b)) in &per_team {
        println!("  team {t}: {n} objects, {}", size(Some(*b)));
    }
    table(
        &["state", "backend", "key", "size", "reason"],
        items
            .iter()
            .map(|i| {
                vec![
                    i.state.to_string(),
                    i.backend.clone(),
                    i.key.clone(),
                    size(Some(i.size)),
                    i.reason.clone(),
                ]
            })
            .collect(),
    );
}

pub async fn run(c: CleanupCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        CleanupCommand::Plan { team } => {
            let body = l::NewPlan { team };
            let v = api.call::<l::MakePlan>(&[], &NoQuery {}, &body).await?;
            show(&out, &v, |v| {
                print_plan(&v.plan, &v.items);
                println!(
                    "{} protected objects left out. Nothing was deleted: `strata cleanup run {}` executes the plan.",
                    v.protected, v.plan.id
                );
            })
        }
        CleanupCommand::Run {
            plan,
            max_objects,
            max_bytes,
            max_team_percent,
        } => {
            let body = l::RunCaps {
                max_objects,
                max_bytes: max_bytes.map(|b| b.bytes()),
                max_team_percent,
            };
            let v = api.call::<l::RunPlan>(&[&plan], &NoQuery {}, &body).await?;
            show(&out, &v, |v| {
                println!(
                    "{}: moved {} objects ({}) to the trash; {} skipped, {} deferred by caps",
                    v.status,
                    v.trashed,
                    size(Some(v.trashed_bytes as i64)),
                    v.skipped.len(),
                    v.deferred
                );
                for (key, why) in &v.skipped {
                    println!("  skipped {key}: {why}");
                }
            })
        }
        CleanupCommand::Restore { plan, key_prefix } => {
            let body = l::RestoreItems { key_prefix };
            let v = api
                .call::<l::RestorePlan>(&[&plan], &NoQuery {}, &body)
                .await?;
            show(&out, &v, |v| {
                println!("restored {} objects", v.restored);
                for (key, why) in &v.refused {
                    println!("  not restored {key}: {why}");
                }
            })
        }
        CleanupCommand::Show { plan } => {
            let v = api.call::<l::GetPlan>(&[&plan], &NoQuery {}, &()).await?;
            show(&out, &v, |v| print_plan(&v.plan, &v.items))
        }
        CleanupCommand::Ls => {
            let v = api.call::<l::ListPlans>(&[], &NoQuery {}, &()).await?;
            show(&out, &v, |v| {
                table(
                    &["plan", "team", "status", "made", "by"],
                    v.iter()
                        .map(|p| {
                            vec![
                                p.id.clone(),
                                opt(p.team.as_deref()),
                                p.status.to_string(),
                                at(Some(p.created_at)),
                                p.created_by.clone(),
                            ]
                        })
                        .collect(),
                )
            })
        }
        CleanupCommand::Purge { grace } => {
            let body = l::Purge {
                grace_secs: grace.as_deref().map(parse_secs).transpose()?,
            };
            let v = api.call::<l::PurgeTrash>(&[], &NoQuery {}, &body).await?;
            show(&out, &v, |v| {
                println!(
                    "purged {} trashed objects ({})",
                    v.purged,
                    size(Some(v.bytes as i64))
                )
            })
        }
    }
}
