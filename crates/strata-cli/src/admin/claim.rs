//! `strata claim`: a job's declared data. `validate` needs no agent; the rest are clients of the control API.
//! The Slurm burst-buffer script and the prolog/epilog scripts (`contrib/slurm/`) call these commands.

use super::*;
use api::claims::{self as c, ClaimState};

#[derive(Debug, Subcommand)]
pub enum ClaimCommand {
    /// Check a claim file (YAML or JSON; `-` for stdin) without an agent: every problem, each naming its field.
    Validate {
        /// The claim file.
        file: String,
        /// Set the claim's job (overrides the file's `job`).
        #[arg(long)]
        job: Option<String>,
    },
    /// Submit a claim: admitted against the team's quotas, its datasets' versions pinned, staging started.
    /// Prints the claim's id.
    Submit {
        /// The claim file (YAML or JSON; `-` for stdin).
        file: String,
        /// Set the claim's job (overrides the file's `job`), e.g. the Slurm job id.
        #[arg(long)]
        job: Option<String>,
        /// Wait until the claim is ready (exit 0) or failed (exit 1), printing progress.
        #[arg(long)]
        wait: bool,
    },
    /// Wait until a claim is ready (exit 0) or failed or released (exit 1), printing progress on stderr; exit 3
    /// on timeout.
    Wait {
        /// The claim's id.
        id: String,
        /// Give up after this long (3600, 90s, 15m, 12h); exit 3.
        #[arg(long)]
        timeout: Option<String>,
    },
    /// One claim: state, reason, progress, accounting.
    Status {
        /// The claim's id.
        id: String,
    },
    /// Claims of your teams.
    Ls {
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
        /// Include released claims.
        #[arg(long)]
        all: bool,
    },
    /// The environment a claim gives its job, as `export NAME=value` lines for a shell to source.
    Env {
        /// The claim's id.
        id: String,
    },
    /// The job is alive: the claim's TTL starts again.
    Heartbeat {
        /// The claim's id.
        id: String,
    },
    /// Release a claim (idempotent): staging stops, pins and scratch are freed, accounting is final.
    Release {
        /// The claim's id.
        id: String,
        /// Why (kept with the claim and in the audit log).
        #[arg(long)]
        reason: Option<String>,
    },
    /// Mount a ready claim's datasets on this node too (run against the node's own agent, e.g. from a
    /// multi-node job's node prolog; the agents share one catalog). Idempotent.
    Attach {
        /// The claim's id.
        #[arg(required_unless_present = "job")]
        id: Option<String>,
        /// The live claim of this job instead (a node prolog knows its job, e.g. $SLURM_JOB_ID).
        #[arg(long, conflicts_with = "id")]
        job: Option<String>,
    },
    /// Unmount a claim's datasets from this node (idempotent; a release unmounts every node by itself).
    Detach {
        /// The claim's id.
        #[arg(required_unless_present = "job")]
        id: Option<String>,
        /// The live claim of this job instead.
        #[arg(long, conflicts_with = "id")]
        job: Option<String>,
    },
    /// Print the claim document's JSON Schema.
    Schema,
}

fn read_file(file: &str) -> Result<String> {
    if file == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
            .context("reading the claim from stdin")?;
        Ok(s)
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file}"))
    }
}

/// The id of job `job`'s live claim (one per team and job; several teams' claims of one job name is ambiguous).
async fn claim_of_job(api: &Api, job: &str) -> Result<String> {
    let q = c::ClaimsQuery {
        job: Some(job.to_string()),
        ..Default::default()
    };
    let v = api.call::<c::ListClaims>(&[], &q, &()).await?;
    let ids: Vec<&str> = v.iter().map(|c| c.id.as_str()).collect();
    match ids.as_slice() {
        [one] => Ok(one.to_string()),
        [] => anyhow::bail!("job {job} has no live claim this token can see"),
        many => anyhow::bail!(
            "job {job} has {} live claims ({}): name one",
            many.len(),
            many.join(", ")
        ),
    }
}

/// A claim file, with its job set from `--job` when given, checked.
fn load(file: &str, job: Option<String>) -> Result<strata_claim::ClaimSpec> {
    let mut spec = strata_claim::ClaimSpec::parse_unchecked(&read_file(file)?)?;
    if let Some(j) = job {
        spec.job = j;
    }
    spec.check()?;
    Ok(spec)
}

pub async fn run(c: ClaimCommand, out: Out) -> Result<()> {
    match c {
        ClaimCommand::Validate { file, job } => {
            // A file may leave its job to whoever submits it (the Slurm integration, `submit --job`): valid
            // without one, the rest checked as it will be then.
            let mut spec = strata_claim::ClaimSpec::parse_unchecked(&read_file(&file)?)?;
            let unset = job.is_none() && spec.job.is_empty();
            if let Some(j) = job {
                spec.job = j;
            } else if unset {
                spec.job = "pending".into();
            }
            spec.check()?;
            let mut v = serde_json::to_value(&spec)?;
            if unset {
                v["job"] = serde_json::Value::Null;
            }
            return emit(&out, &v, |_| {
                println!(
                    "valid: job {} of team {}, {} dataset(s){}{}",
                    if unset {
                        "(set at submission)"
                    } else {
                        spec.job.as_str()
                    },
                    spec.team,
                    spec.datasets.len(),
                    if spec.checkpoint.is_some() {
                        ", a checkpoint"
                    } else {
                        ""
                    },
                    if spec.scratch.is_some() {
                        ", scratch"
                    } else {
                        ""
                    }
                )
            });
        }
        ClaimCommand::Schema => {
            println!("{}", serde_json::to_string_pretty(&strata_claim::schema())?);
            return Ok(());
        }
        _ => {}
    }
    let api = Api::new(&out.api)?;
    match c {
        ClaimCommand::Validate { .. } | ClaimCommand::Schema => unreachable!("handled above"),
        ClaimCommand::Submit { file, job, wait } => {
            let spec = load(&file, job)?;
            let v = api.call::<c::SubmitClaim>(&[], &NoQuery {}, &spec).await?;
            let id = v.id.clone();
            if !wait {
                return show(&out, &v, |v| {
                    println!("{}", v.id);
                    eprintln!("claim {} of job {}: {}", v.id, v.job, v.state.as_str());
                });
            }
            eprintln!("claim {id}");
            wait_for(&api, &out, &id, None).await
        }
        ClaimCommand::Wait { id, timeout } => {
            let t = timeout.map(|t| parse_secs(&t)).transpose()?;
            wait_for(&api, &out, &id, t).await
        }
        ClaimCommand::Status { id } => {
            let v = api.call::<c::GetClaim>(&[&id], &NoQuery {}, &()).await?;
            show(&out, &v, print_claim)
        }
        ClaimCommand::Ls { team, job, all } => {
            let q = c::ClaimsQuery {
                team,
                job,
                released: all,
            };
            let v = api.call::<c::ListClaims>(&[], &q, &()).await?;
            show(&out, &v, |v| {
                table(
                    &["id", "team", "job", "state", "progress", "reason"],
                    v.iter()
                        .map(|c| {
                            vec![
                                c.id.clone(),
                                c.team.clone(),
                                c.job.clone(),
                                c.state.as_str().to_string(),
                                progress(&c.progress),
                                c.reason.clone(),
                            ]
                        })
                        .collect(),
                )
            })
        }
        ClaimCommand::Env { id } => {
            let v = api.call::<c::GetClaim>(&[&id], &NoQuery {}, &()).await?;
            if out.json {
                println!("{}", serde_json::to_string_pretty(&v.env)?);
                return Ok(());
            }
            for (k, val) in &v.env {
                println!("export {k}={}", shell_quote(val));
            }
            Ok(())
        }
        ClaimCommand::Heartbeat { id } => {
            let v = api
                .call::<c::ClaimHeartbeat>(&[&id], &NoQuery {}, &c::Heartbeat::default())
                .await?;
            show(&out, &v, |v| println!("{}: {}", v.id, v.state.as_str()))
        }
        c @ (ClaimCommand::Attach { .. } | ClaimCommand::Detach { .. }) => {
            let (id, job, attach, done) = match c {
                ClaimCommand::Attach { id, job } => (id, job, true, "mounted here"),
                ClaimCommand::Detach { id, job } => (id, job, false, "unmounted here"),
                _ => unreachable!("matched above"),
            };
            let id = match (id, job) {
                (Some(id), _) => id,
                (None, Some(job)) => claim_of_job(&api, &job).await?,
                (None, None) => anyhow::bail!("name the claim, or --job"),
            };
            let nothing = api::quotas::Nothing {};
            let v = if attach {
                api.call::<c::AttachClaim>(&[&id], &NoQuery {}, &nothing)
                    .await?
            } else {
                api.call::<c::DetachClaim>(&[&id], &NoQuery {}, &nothing)
                    .await?
            };
            show(&out, &v, |v| {
                println!("{}: {done}", v.id);
                for d in &v.datasets {
                    if let Some(m) = &d.mount {
                        println!("  {} {m}", d.name);
                    }
                }
            })
        }
        ClaimCommand::Release { id, reason } => {
            let body = c::Release { reason };
            let v = api
                .call::<c::ReleaseClaim>(&[&id], &NoQuery {}, &body)
                .await?;
            show(&out, &v, |v| {
                if v.released_now {
                    println!("released {}", v.status.id);
                } else {
                    println!("{} was already released ({})", v.status.id, v.status.reason);
                }
                print_usage(&v.status.usage);
            })
        }
    }
}

/// Poll a claim until it settles. Ready: exit 0; failed or released: exit 1; timeout: exit 3 (other errors,
/// such as an unreachable agent, exit 2 as every command's do).
async fn wait_for(api: &Api, out: &Out, id: &str, timeout: Option<i64>) -> Result<()> {
    let start = std::time::Instant::now();
    let mut last = String::new();
    loop {
        let v = api.call::<c::GetClaim>(&[id], &NoQuery {}, &()).await?;
        let state = v.state.as_str();
        let line = format!("{state}: {}", progress(&v.progress));
        if line != last {
            eprintln!("{line}");
            last = line;
        }
        match v.state {
            ClaimState::Ready => return show(out, &v, |v| println!("{}", v.id)),
            ClaimState::Failed | ClaimState::Released => {
                eprintln!("claim {id} {state}: {}", v.reason);
                std::process::exit(1);
            }
            ClaimState::Pending | ClaimState::Staging => {}
        }
        if let Some(t) = timeout
            && start.elapsed().as_secs() as i64 >= t
        {
            eprintln!("claim {id} still {state} after {t} s");
            std::process::exit(3);
        }
        // Often at first (a small claim is ready in moments, and a job waits on this), then twice a second.
        let every = if start.elapsed().as_secs() < 5 {
            100
        } else {
            500
        };
        tokio::time::sleep(std::time::Duration::from_millis(every)).await;
    }
}

fn progress(p: &c::Progress) -> String {
    let (done, total) = (p.bytes_done, p.bytes_total);
    let pct = if total == 0 {
        100.0
    } else {
        done as f64 * 100.0 / total as f64
    };
    let mut s = format!(
        "{}/{} objects, {} of {} ({pct:.1}%), {}/{} blocks",
        p.objects_done,
        p.objects_total,
        indicatif::HumanBytes(done),
        indicatif::HumanBytes(total),
        p.blocks_held,
        p.blocks_total
    );
    if p.rate_bytes_per_sec > 0.0 {
        s.push_str(&format!(
            ", {}/s",
            indicatif::HumanBytes(p.rate_bytes_per_sec as u64)
        ));
    }
    if let Some(eta) = p.eta_secs {
        s.push_str(&format!(", ETA {eta} s"));
    }
    s
}

fn print_claim(v: &c::ClaimStatus) {
    println!("claim    {}", v.id);
    println!("job      {} (team {})", v.job, v.team);
    println!("state    {}", v.state.as_str());
    if !v.reason.is_empty() {
        println!("reason   {}", v.reason);
    }
    println!("progress {}", progress(&v.progress));
    for d in &v.datasets {
        println!(
            "dataset  {} {} ({}): {} objects, {}",
            d.name,
            d.location,
            d.mode,
            d.objects,
            indicatif::HumanBytes(d.bytes)
        );
    }
    print_usage(&v.usage);
}

fn print_usage(u: &c::JobUsage) {
    let b = |n: u64| indicatif::HumanBytes(n).to_string();
    println!(
        "usage    staged {} (already cached {}), origin {}, from peers {}, scratch peak {}, checkpoints {}",
        b(u.staged_bytes),
        b(u.staged_cached_bytes),
        b(u.origin_bytes),
        b(u.peer_bytes),
        b(u.scratch_peak_bytes),
        b(u.checkpoint_bytes)
    );
}

/// `'...'` with embedded quotes escaped, for `export` lines.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
