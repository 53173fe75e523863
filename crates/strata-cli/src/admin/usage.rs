//! `strata usage`: usage by team, prefix, job or dataset; reconciliation and POSIX scans.

use super::*;

#[derive(Debug, Subcommand)]
pub enum UsageCommand {
    /// List a backend completely and correct the inventory and every team's usage on it (administrators).
    Reconcile {
        /// Backend name.
        backend: String,
        /// For a local-directory backend: scan its tree in parallel (per project = top-level directory,
        /// charged to the team owning it) instead of listing it object by object.
        #[arg(long)]
        posix: bool,
    },
    /// Scan a POSIX directory tree in parallel: usage per owner (uid) and per project (top-level directory),
    /// like a parallel file system's project quota. Runs locally, no agent needed.
    Scan {
        /// Root directory.
        path: std::path::PathBuf,
        /// Worker threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Path components below the root that name a project.
        #[arg(long, default_value_t = 1)]
        project_depth: usize,
        /// Also descend into other file systems.
        #[arg(long)]
        cross_devices: bool,
    },
}

pub async fn run(by: String, sub: Option<UsageCommand>, out: Out) -> Result<()> {
    match sub {
        Some(UsageCommand::Scan {
            path,
            threads,
            project_depth,
            cross_devices,
        }) => {
            let opts = strata_quota::scan::ScanOptions {
                threads,
                one_file_system: !cross_devices,
                project_depth,
            };
            let started = std::time::Instant::now();
            let r = tokio::task::spawn_blocking(move || strata_quota::scan::scan(&path, &opts))
                .await??;
            let v = serde_json::to_value(&r)?;
            return emit(&out, &v, |_| {
                println!(
                    "{} in {} files, {} directories ({} apparent), scanned in {:.2} s",
                    indicatif::HumanBytes(r.total.bytes),
                    r.total.files,
                    r.total.dirs,
                    indicatif::HumanBytes(r.total.apparent_bytes),
                    started.elapsed().as_secs_f64()
                );
                let rows =
                    |m: Vec<(String, &strata_quota::scan::UsageTotals)>| -> Vec<Vec<String>> {
                        m.into_iter()
                            .map(|(k, t)| {
                                vec![
                                    k,
                                    indicatif::HumanBytes(t.bytes).to_string(),
                                    t.files.to_string(),
                                    t.dirs.to_string(),
                                ]
                            })
                            .collect()
                    };
                table(
                    &["owner uid", "bytes", "files", "dirs"],
                    rows(r.by_owner.iter().map(|(k, t)| (k.to_string(), t)).collect()),
                );
                table(
                    &["project", "bytes", "files", "dirs"],
                    rows(r.by_project.iter().map(|(k, t)| (k.clone(), t)).collect()),
                );
                if r.errors_total > 0 {
                    eprintln!("{} entries could not be read, e.g.:", r.errors_total);
                    for e in r.errors.iter().take(5) {
                        eprintln!("  {e}");
                    }
                }
            });
        }
        Some(UsageCommand::Reconcile {
            backend,
            posix: true,
        }) => {
            let api = Api::new(&out.api)?;
            let body = api::usage::Scan {
                backend: backend.clone(),
                threads: 0,
            };
            let v = api
                .call::<api::usage::ScanUsage>(&[], &NoQuery {}, &body)
                .await?;
            return show(&out, &v, |v| {
                println!(
                    "{backend}: {} files ({}) scanned in {:.2} s",
                    v.total.files,
                    size(Some(v.total.file_bytes as i64)),
                    v.secs
                );
                table(
                    &["team", "bytes", "files"],
                    v.teams
                        .iter()
                        .map(|(k, (b, f))| vec![k.clone(), size(Some(*b)), f.to_string()])
                        .collect(),
                );
            });
        }
        Some(UsageCommand::Reconcile { backend, .. }) => {
            let api = Api::new(&out.api)?;
            let body = api::usage::Reconcile {
                backend: backend.clone(),
            };
            let v = api
                .call::<api::usage::ReconcileUsage>(&[], &NoQuery {}, &body)
                .await?;
            return show(&out, &v, |v| {
                println!(
                    "{backend}: {} objects ({}) listed in {:.2} s; {} added, {} updated, {} removed",
                    v.listed,
                    size(Some(v.listed_bytes as i64)),
                    v.list_secs,
                    v.added,
                    v.updated,
                    v.removed
                );
            });
        }
        None => {}
    }
    let api = Api::new(&out.api)?;
    sanity(&by)?;
    let q = api::usage::UsageQuery {
        by: Some(serde_json::from_value(Value::String(by.clone()))?),
    };
    let v = api.call::<api::usage::GetUsage>(&[], &q, &()).await?;
    show(&out, &v, |v| {
        let headers: &[&str] = if by == "team" {
            &["team", "bytes", "objects"]
        } else {
            &[by.as_str(), "team", "bytes", "objects"]
        };
        table(
            headers,
            v.iter()
                .map(|l| {
                    let group = if l.group.is_empty() {
                        "(none)".into()
                    } else {
                        l.group.clone()
                    };
                    let mut row = vec![
                        group,
                        opt(l.team.as_deref()),
                        size(Some(l.bytes)),
                        l.objects.to_string(),
                    ];
                    if by == "team" {
                        row.remove(1);
                    }
                    row
                })
                .collect(),
        )
    })
}

/// Refuse obviously wrong combinations early (clap cannot express them all).
pub fn sanity(by: &str) -> Result<()> {
    if !matches!(by, "team" | "prefix" | "job" | "dataset") {
        bail!("--by must be team, prefix, job or dataset");
    }
    Ok(())
}
