//! `strata cleanup`: plans, runs through the trash, restores, purges.

use super::*;

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

fn print_plan(plan: &Value, items: &[Value]) {
    println!(
        "plan {}  team {}  status {}  made {} by {}",
        text(&plan["id"]),
        text(&plan["team"]),
        text(&plan["status"]),
        when(&plan["created_at"]),
        text(&plan["created_by"])
    );
    let mut per_team: std::collections::BTreeMap<String, (u64, i64)> = Default::default();
    for i in items {
        let e = per_team.entry(text(&i["team"])).or_default();
        e.0 += 1;
        e.1 += i["size"].as_i64().unwrap_or(0);
    }
    for (t, (n, b)) in &per_team {
        println!("  team {t}: {n} objects, {}", bytes(&json!(b)));
    }
    table(
        &["state", "backend", "key", "size", "reason"],
        items
            .iter()
            .map(|i| {
                vec![
                    text(&i["state"]),
                    text(&i["backend"]),
                    text(&i["key"]),
                    bytes(&i["size"]),
                    text(&i["reason"]),
                ]
            })
            .collect(),
    );
}

pub async fn run(c: CleanupCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        CleanupCommand::Plan { team } => {
            let v = api.post("/v1/cleanup/plans", json!({"team": team})).await?;
            emit(&out, &v, |v| {
                print_plan(&v["plan"], &arr(&v["items"]));
                println!(
                    "{} protected objects left out. Nothing was deleted: `strata cleanup run {}` executes the plan.",
                    text(&v["protected"]),
                    text(&v["plan"]["id"])
                );
            })
        }
        CleanupCommand::Run {
            plan,
            max_objects,
            max_bytes,
            max_team_percent,
        } => {
            let v = api
                .post(
                    &format!("/v1/cleanup/plans/{}/run", enc(&plan)),
                    json!({"max_objects": max_objects, "max_bytes": max_bytes.map(|b| b.bytes()),
                           "max_team_percent": max_team_percent}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!(
                    "{}: moved {} objects ({}) to the trash; {} skipped, {} deferred by caps",
                    text(&v["status"]),
                    text(&v["trashed"]),
                    bytes(&v["trashed_bytes"]),
                    arr(&v["skipped"]).len(),
                    text(&v["deferred"])
                );
                for s in arr(&v["skipped"]) {
                    println!("  skipped {}: {}", text(&s[0]), text(&s[1]));
                }
            })
        }
        CleanupCommand::Restore { plan, key_prefix } => {
            let v = api
                .post(
                    &format!("/v1/cleanup/plans/{}/restore", enc(&plan)),
                    json!({"key_prefix": key_prefix}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("restored {} objects", text(&v["restored"]));
                for r in arr(&v["refused"]) {
                    println!("  not restored {}: {}", text(&r[0]), text(&r[1]));
                }
            })
        }
        CleanupCommand::Show { plan } => {
            let v = api
                .get(&format!("/v1/cleanup/plans/{}", enc(&plan)))
                .await?;
            emit(&out, &v, |v| print_plan(&v["plan"], &arr(&v["items"])))
        }
        CleanupCommand::Ls => {
            let v = api.get("/v1/cleanup/plans").await?;
            emit(&out, &v, |v| {
                table(
                    &["plan", "team", "status", "made", "by"],
                    arr(v)
                        .iter()
                        .map(|p| {
                            vec![
                                text(&p["id"]),
                                text(&p["team"]),
                                text(&p["status"]),
                                when(&p["created_at"]),
                                text(&p["created_by"]),
                            ]
                        })
                        .collect(),
                )
            })
        }
        CleanupCommand::Purge { grace } => {
            let grace = grace.as_deref().map(parse_secs).transpose()?;
            let v = api
                .post("/v1/cleanup/purge", json!({"grace_secs": grace}))
                .await?;
            emit(&out, &v, |v| {
                println!(
                    "purged {} trashed objects ({})",
                    text(&v["purged"]),
                    bytes(&v["bytes"])
                )
            })
        }
    }
}
