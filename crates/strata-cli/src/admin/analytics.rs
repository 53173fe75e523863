//! `strata top`, `strata heat`, `strata job profile`: the agent's access analytics.

use super::*;
use api::analytics as an;

/// `strata top`: jobs by throughput, metadata rate or stall share, refreshed like `top`.
#[derive(Debug, Args, Clone)]
pub struct TopArgs {
    /// Order by `bytes` (data bytes a second), `meta` (metadata operations a second) or `stall` (share of the
    /// last minute spent waiting in reads).
    #[arg(long, default_value = "bytes")]
    pub sort: String,
    /// Only this team's jobs.
    #[arg(long)]
    pub team: Option<String>,
    /// Rows shown.
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 2.0)]
    pub interval: f64,
    /// Print once and exit (no screen clearing): for scripts and logs.
    #[arg(long)]
    pub once: bool,
}

/// `strata job`: one job's analytics.
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// A job's profile as this agent saw it: operations and bytes by class, latency, stall share, hit ratio,
    /// the metadata-runaway flag and the last five minutes in 10-second slots.
    Profile {
        /// The job's team.
        team: String,
        /// The job (a Slurm job id, a pod, a claim's job, what `x-strata-job` said).
        job: String,
    },
    /// Every job's counters in Lustre's job_stats form (YAML; read_bytes and write_bytes per operation in
    /// bytes, getattr and setattr for metadata reads and writes in microseconds), for tools that read it.
    Stats {
        /// Only this team's jobs.
        #[arg(long)]
        team: Option<String>,
    },
}

fn sort_of(s: &str) -> Result<an::JobSort> {
    Ok(match s {
        "bytes" => an::JobSort::Bytes,
        "meta" => an::JobSort::Meta,
        "stall" => an::JobSort::Stall,
        _ => bail!("--sort {s:?}: expected bytes, meta or stall"),
    })
}

fn rate(bytes_per_sec: f64) -> String {
    format!("{}/s", indicatif::HumanBytes(bytes_per_sec.max(0.0) as u64))
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |x| format!("{:.0}%", x * 100.0))
}

fn top_table(jobs: &[an::JobSummary]) {
    table(
        &[
            "team",
            "job",
            "data",
            "meta ops/s",
            "ops/s",
            "stall",
            "hit",
            "runaway",
        ],
        jobs.iter()
            .map(|j| {
                vec![
                    j.team.clone(),
                    j.job.clone(),
                    rate(j.data_bytes_per_sec),
                    format!("{:.1}", j.meta_ops_per_sec),
                    format!("{:.1}", j.ops_per_sec),
                    format!("{:.0}%", j.stall_share * 100.0),
                    pct(j.hit_ratio),
                    if j.runaway {
                        format!("YES since {}", at(j.over_rate_since_unix.map(|t| t as i64)))
                    } else {
                        "-".into()
                    },
                ]
            })
            .collect(),
    );
}

pub async fn top(args: TopArgs, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let q = an::JobsQuery {
        team: args.team.clone(),
        sort: Some(sort_of(&args.sort)?),
        limit: Some(args.limit),
    };
    if !(0.2..=3600.0).contains(&args.interval) {
        bail!("--interval {}: between 0.2 and 3600 seconds", args.interval);
    }
    loop {
        let jobs = api.call::<an::ListJobs>(&[], &q, &()).await?;
        if out.json {
            println!("{}", serde_json::to_string(&jobs)?);
        } else {
            if !args.once {
                // Clear the screen and go home, as top does.
                print!("\x1b[2J\x1b[H");
            }
            println!(
                "strata top: {} jobs, by {} (last minute){}",
                jobs.len(),
                args.sort,
                if args.once { "" } else { "; Ctrl-C to quit" }
            );
            top_table(&jobs);
        }
        if args.once {
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs_f64(args.interval)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

pub async fn heat(team: Option<String>, kind: Option<String>, limit: u32, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let kind = match kind.as_deref() {
        None => None,
        Some("dataset") => Some(an::HeatKind::Dataset),
        Some("prefix") => Some(an::HeatKind::Prefix),
        Some(k) => bail!("--kind {k:?}: expected dataset or prefix"),
    };
    let q = an::HeatQuery {
        team,
        kind,
        limit: Some(limit),
    };
    let v = api.call::<an::ListHeat>(&[], &q, &()).await?;
    show(&out, &v, |v| {
        table(
            &[
                "team",
                "kind",
                "name",
                "heat",
                "reads",
                "bytes read",
                "last read",
            ],
            v.iter()
                .map(|h| {
                    vec![
                        h.team.clone(),
                        match h.kind {
                            an::HeatKind::Dataset => "dataset".into(),
                            an::HeatKind::Prefix => "prefix".into(),
                        },
                        h.name.clone(),
                        format!("{:.2}", h.score),
                        h.reads.to_string(),
                        size(Some(h.bytes as i64)),
                        at(Some(h.last_access_unix as i64)),
                    ]
                })
                .collect(),
        )
    })
}

pub async fn cold(
    team: Option<String>,
    idle_secs: Option<u64>,
    depth: Option<u32>,
    limit: u32,
    out: Out,
) -> Result<()> {
    let api = Api::new(&out.api)?;
    let q = an::ColdQuery {
        team,
        idle_secs,
        depth,
        limit: Some(limit),
    };
    let v = api.call::<an::ListCold>(&[], &q, &()).await?;
    show(&out, &v, |v| {
        table(
            &["team", "cold prefix", "size", "objects", "last used"],
            v.iter()
                .map(|c| {
                    vec![
                        c.team.clone(),
                        c.prefix.clone(),
                        size(Some(c.bytes as i64)),
                        c.objects.to_string(),
                        at(Some(c.last_used_unix)),
                    ]
                })
                .collect(),
        )
    })
}

/// `strata fleet` arguments.
#[derive(Debug, Args, Clone)]
pub struct FleetArgs {
    /// Group by `job`, `team`, `dataset` or `prefix`.
    #[arg(long, default_value = "job")]
    pub by: String,
    /// Over the last this many minutes.
    #[arg(long, default_value_t = 15)]
    pub minutes: u32,
    /// Only this team's.
    #[arg(long)]
    pub team: Option<String>,
    /// Rows shown.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
}

pub async fn fleet(args: FleetArgs, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let by = match args.by.as_str() {
        "job" => an::FleetBy::Job,
        "team" => an::FleetBy::Team,
        "dataset" => an::FleetBy::Dataset,
        "prefix" => an::FleetBy::Prefix,
        b => bail!("--by {b:?}: expected job, team, dataset or prefix"),
    };
    let q = an::FleetQuery {
        by: Some(by),
        minutes: Some(args.minutes),
        team: args.team,
        limit: Some(args.limit),
    };
    let v = api.call::<an::GetFleet>(&[], &q, &()).await?;
    show(&out, &v, |v| {
        table(
            &[
                "team", "name", "agents", "read", "written", "meta ops", "origin", "peer", "hit",
            ],
            v.iter()
                .map(|l| {
                    let t = &l.tiers;
                    let known = t.ram + t.disk + t.peer + t.origin;
                    vec![
                        l.team.clone(),
                        l.name.clone(),
                        l.agents.len().to_string(),
                        size(Some(l.bytes.data_read as i64)),
                        size(Some(l.bytes.data_write as i64)),
                        (l.ops.meta_read + l.ops.meta_write).to_string(),
                        size(Some(t.origin as i64)),
                        size(Some(t.peer as i64)),
                        pct((known > 0).then(|| (known - t.origin) as f64 / known as f64)),
                    ]
                })
                .collect(),
        )
    })
}

pub async fn job(cmd: JobCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let (team, job) = match cmd {
        JobCommand::Profile { team, job } => (team, job),
        JobCommand::Stats { team } => {
            let q = an::JobStatsQuery { team };
            print!("{}", api.call::<an::JobStats>(&[], &q, &()).await?);
            return Ok(());
        }
    };
    let v = api
        .call::<an::GetJobProfile>(&[&team, &job], &NoQuery {}, &())
        .await?;
    show(&out, &v, |p| {
        let s = &p.summary;
        println!(
            "job {} of team {}: seen {} to {}",
            s.job,
            s.team,
            at(Some(s.first_seen_unix as i64)),
            at(Some(s.last_seen_unix as i64))
        );
        println!(
            "last minute: {} data, {:.1} metadata ops/s, {:.1} ops/s, stall {:.0}%, hit ratio {}{}",
            rate(s.data_bytes_per_sec),
            s.meta_ops_per_sec,
            s.ops_per_sec,
            s.stall_share * 100.0,
            pct(s.hit_ratio),
            if s.runaway { "; METADATA RUNAWAY" } else { "" }
        );
        let class = |name: &str, ops: u64, bytes: u64| {
            let l = p.latency.iter().find(|l| l.class == name);
            vec![
                name.to_string(),
                ops.to_string(),
                size(Some(bytes as i64)),
                l.map_or("-".into(), |l| format!("{:.2} ms", l.p50_ms)),
                l.map_or("-".into(), |l| format!("{:.2} ms", l.p99_ms)),
            ]
        };
        table(
            &["class", "ops", "bytes", "p50", "p99"],
            vec![
                class("data_read", s.ops.data_read, s.bytes.data_read),
                class("data_write", s.ops.data_write, s.bytes.data_write),
                class("meta_read", s.ops.meta_read, s.bytes.meta_read),
                class("meta_write", s.ops.meta_write, s.bytes.meta_write),
            ],
        );
        table(
            &[
                "slot",
                "data read",
                "meta ops",
                "read wait",
                "ram",
                "disk",
                "peer",
                "origin",
            ],
            p.timeline
                .iter()
                .map(|t| {
                    vec![
                        at(Some(t.start_unix as i64)),
                        size(Some(t.bytes.data_read as i64)),
                        (t.ops.meta_read + t.ops.meta_write).to_string(),
                        format!("{:.2} s", t.read_seconds),
                        size(Some(t.tiers.ram as i64)),
                        size(Some(t.tiers.disk as i64)),
                        size(Some(t.tiers.peer as i64)),
                        size(Some(t.tiers.origin as i64)),
                    ]
                })
                .collect(),
        );
        if !p.readers.is_empty() {
            table(
                &["reader (rank)", "claim", "stall", "reported"],
                p.readers
                    .iter()
                    .map(|r| {
                        vec![
                            r.reporter.clone(),
                            r.claim.clone(),
                            format!("{:.2} s", r.stall_secs),
                            at(Some(r.reported_at_unix)),
                        ]
                    })
                    .collect(),
            );
        }
    })
}
