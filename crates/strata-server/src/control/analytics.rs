//! Access analytics: the jobs this agent serves now, one job's profile, heat by dataset and prefix
//! ([`strata_analytics`]). Every answer holds only the teams the caller may read.

use std::time::{SystemTime, UNIX_EPOCH};

use super::common::*;
use api::analytics as an;
use strata_analytics::{HeatView, JobView, OpClass, Slot};

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn by_class(v: [u64; 4]) -> an::ByClass {
    let at = |c: OpClass| v[c as usize];
    an::ByClass {
        data_read: at(OpClass::DataRead),
        data_write: at(OpClass::DataWrite),
        meta_read: at(OpClass::MetaRead),
        meta_write: at(OpClass::MetaWrite),
    }
}

fn summary(v: &JobView) -> an::JobSummary {
    an::JobSummary {
        team: v.key.team.to_string(),
        job: v.key.job.to_string(),
        first_seen_unix: unix(v.first_seen),
        last_seen_unix: unix(v.last_seen),
        data_bytes_per_sec: v.data_bytes_per_sec,
        meta_ops_per_sec: v.meta_ops_per_sec,
        ops_per_sec: v.ops_per_sec,
        stall_share: v.stall_share,
        hit_ratio: v.hit_ratio,
        runaway: v.runaway,
        over_rate_since_unix: v.over_since,
        ops: by_class(v.totals_ops),
        bytes: by_class(v.totals_bytes),
    }
}

fn slot(s: &Slot) -> an::TimelineSlot {
    an::TimelineSlot {
        start_unix: s.start,
        ops: by_class(s.ops),
        bytes: by_class(s.bytes),
        read_seconds: s.read_us as f64 / 1e6,
        tiers: an::ByTier {
            ram: s.tier_bytes[0],
            disk: s.tier_bytes[1],
            peer: s.tier_bytes[2],
            origin: s.tier_bytes[3],
        },
    }
}

/// Whether `p` may see what is attributed to `team` (`""`: no team, administrators only).
fn visible(p: &Principal, team: &str) -> bool {
    p.can(team, Role::Reader)
}

fn limit(l: Option<u32>) -> Result<usize> {
    let l = l.unwrap_or(50);
    if !(1..=1000).contains(&l) {
        return Err(Error::invalid_input(format!(
            "limit {l}: between 1 and 1000"
        )));
    }
    Ok(l as usize)
}

pub(super) async fn list_jobs(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<an::JobsQuery>,
) -> ApiResult<Reply<an::ListJobs>> {
    let n = limit(q.limit)?;
    let mut jobs: Vec<an::JobSummary> = a
        .analytics()
        .jobs(SystemTime::now(), |k| {
            visible(&p, &k.team) && q.team.as_deref().is_none_or(|t| *t == *k.team)
        })
        .iter()
        .map(summary)
        .collect();
    let key = |j: &an::JobSummary| match q.sort.unwrap_or_default() {
        an::JobSort::Bytes => j.data_bytes_per_sec,
        an::JobSort::Meta => j.meta_ops_per_sec,
        an::JobSort::Stall => j.stall_share,
    };
    jobs.sort_by(|x, y| {
        key(y)
            .total_cmp(&key(x))
            .then_with(|| (&x.team, &x.job).cmp(&(&y.team, &y.job)))
    });
    jobs.truncate(n);
    reply::<an::ListJobs>(jobs)
}

pub(super) async fn job_profile(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    UrlPath((team, job)): UrlPath<(String, String)>,
) -> ApiResult<Reply<an::GetJobProfile>> {
    p.require(&team, Role::Reader)?;
    let views = a
        .analytics()
        .jobs(SystemTime::now(), |k| *k.team == *team && *k.job == *job);
    let Some(v) = views.first() else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("job {job} of team {team}: no operation seen by this agent"),
        )
        .into());
    };
    let latency = OpClass::ALL
        .iter()
        .filter(|c| v.totals_ops[**c as usize] > 0)
        .map(|&c| an::ClassLatency {
            class: c.as_str().to_string(),
            p50_ms: v.p50[c as usize].as_secs_f64() * 1e3,
            p99_ms: v.p99[c as usize].as_secs_f64() * 1e3,
        })
        .collect();
    let readers = a
        .catalog()
        .job_stalls(&team, &job)
        .await?
        .into_iter()
        .map(|(claim, reporter, ms, at)| an::ReaderStall {
            claim,
            reporter,
            stall_secs: ms as f64 / 1e3,
            reported_at_unix: at,
        })
        .collect();
    reply::<an::GetJobProfile>(an::JobProfile {
        summary: summary(v),
        latency,
        timeline: v.timeline.iter().map(slot).collect(),
        readers,
    })
}

fn heat_entry(h: &HeatView) -> an::HeatEntry {
    an::HeatEntry {
        team: h.key.team.to_string(),
        kind: match h.key.kind {
            strata_analytics::HeatKind::Dataset => an::HeatKind::Dataset,
            strata_analytics::HeatKind::Prefix => an::HeatKind::Prefix,
        },
        name: h.key.name.to_string(),
        score: h.score,
        last_access_unix: unix(h.last_access),
        reads: h.reads,
        bytes: h.bytes,
    }
}

pub(super) async fn heat(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<an::HeatQuery>,
) -> ApiResult<Reply<an::ListHeat>> {
    let n = limit(q.limit)?;
    let kind = q.kind.map(|k| match k {
        an::HeatKind::Dataset => strata_analytics::HeatKind::Dataset,
        an::HeatKind::Prefix => strata_analytics::HeatKind::Prefix,
    });
    let mut v: Vec<an::HeatEntry> = a
        .analytics()
        .heat(SystemTime::now(), |k| {
            visible(&p, &k.team)
                && q.team.as_deref().is_none_or(|t| *t == *k.team)
                && kind.is_none_or(|x| x == k.kind)
        })
        .iter()
        .map(heat_entry)
        .collect();
    v.truncate(n);
    reply::<an::ListHeat>(v)
}

/// A YAML string: plain when it is safely plain, else double-quoted with escapes.
fn yaml_str(v: &str) -> String {
    let plain = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '@'))
        && !v.starts_with(['-', '.', '@']);
    if plain {
        return v.to_string();
    }
    let mut o = String::from("\"");
    for c in v.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

pub(super) async fn job_stats(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<an::JobStatsQuery>,
) -> ApiResult<Reply<an::JobStats>> {
    use std::fmt::Write;
    let now = SystemTime::now();
    let mut jobs = a.analytics().jobs(now, |k| {
        visible(&p, &k.team) && q.team.as_deref().is_none_or(|t| *t == *k.team)
    });
    jobs.sort_by(|x, y| x.key.cmp(&y.key));
    let mut o = String::from("job_stats:\n");
    for j in &jobs {
        let id = if j.key.team.is_empty() {
            j.key.job.to_string()
        } else {
            format!("{}/{}", j.key.team, j.key.job)
        };
        let _ = writeln!(o, "- job_id:          {}", yaml_str(&id));
        let _ = writeln!(o, "  snapshot_time:   {}", unix(now));
        let _ = writeln!(o, "  start_time:      {}", unix(j.first_seen));
        let _ = writeln!(
            o,
            "  elapsed_time:    {}",
            unix(now).saturating_sub(unix(j.first_seen))
        );
        for (name, class, unit) in [
            ("read_bytes", OpClass::DataRead, "bytes"),
            ("write_bytes", OpClass::DataWrite, "bytes"),
            ("getattr", OpClass::MetaRead, "usecs"),
            ("setattr", OpClass::MetaWrite, "usecs"),
        ] {
            let m = j.moments[class as usize];
            let _ = writeln!(
                o,
                "  {:<16} {{ samples: {}, unit: {unit}, min: {}, max: {}, sum: {}, sumsq: {} }}",
                format!("{name}:"),
                m.samples,
                m.min,
                m.max,
                m.sum,
                m.sumsq
            );
        }
    }
    reply::<an::JobStats>(o)
}

/// Operations a client answered itself (a mount's metadata from its listing), counted as the agent counts its
/// own: to the caller's team (never another's: [`crate::http::principal_context`]) and the job and dataset
/// the request names, under the location's prefix. The caller must read the location, so a report names only
/// data its team may see.
pub(super) async fn report(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    headers: axum::http::HeaderMap,
    b: Bytes,
) -> ApiResult<Reply<an::ReportOps>> {
    let r: an::OpsReport = body(&b)?;
    if r.ops.len() > an::MAX_REPORT_ROWS {
        return Err(Error::invalid_input(format!(
            "{} rows: a report holds at most {}",
            r.ops.len(),
            an::MAX_REPORT_ROWS
        ))
        .into());
    }
    for o in &r.ops {
        if !(1..=1_000_000_000).contains(&o.count) || o.errors > o.count {
            return Err(Error::invalid_input(format!(
                "{:?}: count {} and errors {}: 1 to 1,000,000,000 operations, of which at most all failed",
                o.class, o.count, o.errors
            ))
            .into());
        }
    }
    let ctx = crate::http::principal_context(&headers, &p);
    let caller = crate::access::Caller::Principal(p);
    let (name, _, key, _) = a
        .authorize_named(&caller, &r.location, Role::Reader, true)
        .await?;
    if !a.analytics().enabled() {
        return reply::<an::ReportOps>(());
    }
    let at = SystemTime::now();
    let (backend, key): (Arc<str>, Arc<str>) = (Arc::from(name.as_str()), Arc::from(key));
    for o in r.ops {
        let class = match o.class {
            an::OpClass::DataRead => OpClass::DataRead,
            an::OpClass::DataWrite => OpClass::DataWrite,
            an::OpClass::MetaRead => OpClass::MetaRead,
            an::OpClass::MetaWrite => OpClass::MetaWrite,
        };
        let mean = std::time::Duration::from_micros(o.latency_us / o.count);
        // The failed and the good as two records: the rollups count errors by record.
        for (n, ok, bytes) in [(o.count - o.errors, true, o.bytes), (o.errors, false, 0)] {
            if n == 0 {
                continue;
            }
            a.analytics().record(strata_analytics::Access {
                at,
                class,
                ctx: ctx.clone(),
                backend: backend.clone(),
                key: key.clone(),
                count: n,
                bytes,
                latency: mean,
                served: strata_analytics::Served::None,
                ok,
            });
        }
    }
    reply::<an::ReportOps>(())
}

/// Most prefixes one cold report folds the inventory into; past it, a team's further prefixes are not
/// reported (the report says so in the log).
const MAX_COLD_GROUPS: usize = 200_000;

/// Cold prefixes with their sizes: the inventory folded by (team, prefix), one pass, streamed; a prefix is
/// cold when nothing under it was read or written for the window.
pub(super) async fn cold(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<an::ColdQuery>,
) -> ApiResult<Reply<an::ListCold>> {
    let n = limit(q.limit)?;
    let depth = match q.depth {
        None => a.analytics().config().prefix_depth,
        Some(d @ 0..=16) => d as usize,
        Some(d) => return Err(Error::invalid_input(format!("depth {d}: at most 16")).into()),
    };
    let idle = q
        .idle_secs
        .unwrap_or(a.analytics().config().cold_after.as_secs());
    let cutoff = a
        .catalog()
        .now()
        .saturating_sub(i64::try_from(idle).unwrap_or(i64::MAX));
    // A non-administrator's scan reads only its teams' rows.
    let teams: Option<Vec<String>> = (!p.is_admin).then(|| {
        p.memberships
            .iter()
            .map(|m| m.team.clone())
            .chain(p.team.clone())
            .filter(|t| visible(&p, t))
            .collect()
    });
    let mut groups: HashMap<(String, String), (u64, u64, i64)> = HashMap::new();
    let mut over = 0u64;
    a.catalog()
        .scan_objects(teams.as_deref(), |o| {
            let team = o.team.unwrap_or("");
            if q.team.as_deref().is_some_and(|t| t != team) {
                return;
            }
            let key = (
                team.to_string(),
                strata_analytics::prefix_of(o.backend, o.key, depth),
            );
            if !groups.contains_key(&key) && groups.len() >= MAX_COLD_GROUPS {
                over += 1;
                return;
            }
            let g = groups.entry(key).or_insert((0, 0, i64::MIN));
            g.0 += o.size;
            g.1 += 1;
            g.2 = g.2.max(o.last_used);
        })
        .await?;
    if over > 0 {
        tracing::warn!(
            objects = over,
            groups = MAX_COLD_GROUPS,
            "the cold report left out objects past its bound of prefixes"
        );
    }
    let mut v: Vec<an::ColdPrefix> = groups
        .into_iter()
        .filter(|((team, _), (_, _, used))| *used < cutoff && visible(&p, team))
        .map(|((team, prefix), (bytes, objects, used))| an::ColdPrefix {
            team,
            prefix,
            bytes,
            objects,
            last_used_unix: used,
        })
        .collect();
    v.sort_by(|x, y| {
        y.bytes
            .cmp(&x.bytes)
            .then_with(|| (&x.team, &x.prefix).cmp(&(&y.team, &y.prefix)))
    });
    v.truncate(n);
    reply::<an::ListCold>(v)
}

/// The fleet's share of the rollups: every minute the writer persists also goes to the catalog, which the
/// agents of a cluster share ([`strata_catalog::fleet`]); what is past the retention is pruned, at most once
/// an hour per agent.
pub(crate) struct CatalogSink {
    pub catalog: Catalog,
    pub retention: Duration,
    pub pruned_at: std::sync::atomic::AtomicI64,
}

impl strata_analytics::MinuteSink for CatalogSink {
    fn put<'a>(
        &'a self,
        agent: &'a str,
        minutes: &'a [strata_analytics::Minute],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            for m in minutes {
                let rows: Vec<strata_catalog::fleet::FleetRow> = m
                    .rows
                    .iter()
                    .map(|(k, r)| {
                        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                        strata_catalog::fleet::FleetRow {
                            team: k.team.to_string(),
                            job: k.job.to_string(),
                            dataset: k.dataset.to_string(),
                            prefix: k.prefix.to_string(),
                            class: k.class.as_str().to_string(),
                            ops: i(r.count),
                            errors: i(r.errors),
                            bytes: i(r.bytes),
                            latency_us: i(r.latency_sum_us),
                            tiers: r.tier_bytes.map(i),
                        }
                    })
                    .collect();
                self.catalog
                    .put_minutes(agent, i64::try_from(m.start).unwrap_or(0), &rows)
                    .await?;
            }
            let now = self.catalog.now();
            let last = self.pruned_at.load(std::sync::atomic::Ordering::Relaxed);
            if now - last >= 3600 {
                self.pruned_at
                    .store(now, std::sync::atomic::Ordering::Relaxed);
                let before = now - i64::try_from(self.retention.as_secs()).unwrap_or(i64::MAX);
                let n = self.catalog.prune_minutes(before).await?;
                if n > 0 {
                    tracing::debug!(rows = n, "pruned the fleet's rollups past their retention");
                }
            }
            Ok(())
        })
    }
}

/// The fleet view: every agent's rollups in the catalog, grouped, only the teams the caller may read.
pub(super) async fn fleet(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<an::FleetQuery>,
) -> ApiResult<Reply<an::GetFleet>> {
    use strata_catalog::fleet::FleetBy;
    let n = limit(q.limit)?;
    let minutes = q.minutes.unwrap_or(15);
    if !(1..=10_080).contains(&minutes) {
        return Err(Error::invalid_input(format!("minutes {minutes}: 1 to 10080")).into());
    }
    let by = match q.by.unwrap_or_default() {
        an::FleetBy::Team => FleetBy::Team,
        an::FleetBy::Job => FleetBy::Job,
        an::FleetBy::Dataset => FleetBy::Dataset,
        an::FleetBy::Prefix => FleetBy::Prefix,
    };
    let now = a.catalog().now();
    let since = now - now.rem_euclid(60) - 60 * (i64::from(minutes) - 1);
    let groups = a.catalog().fleet_groups(by, since).await?;
    let mut lines: BTreeMap<(String, String), an::FleetLine> = BTreeMap::new();
    for g in groups {
        if !visible(&p, &g.team) || q.team.as_deref().is_some_and(|t| t != g.team) {
            continue;
        }
        let l = lines
            .entry((g.team.clone(), g.name.clone()))
            .or_insert_with(|| an::FleetLine {
                team: g.team.clone(),
                name: g.name.clone(),
                agents: Vec::new(),
                ops: an::ByClass::default(),
                bytes: an::ByClass::default(),
                errors: 0,
                tiers: an::ByTier::default(),
                read_seconds: 0.0,
                first_minute_unix: g.first_minute,
                last_minute_unix: g.last_minute,
            });
        // An agent's name is `<agent>-<process start>`: the agent, whichever of its runs.
        let agent = g
            .agent
            .rsplit_once('-')
            .map_or(g.agent.as_str(), |(name, _)| name);
        if !l.agents.iter().any(|x| x == agent) {
            l.agents.push(agent.to_string());
        }
        let u = |v: i64| u64::try_from(v).unwrap_or(0);
        let (ops, bytes) = match g.class.as_str() {
            "data_read" => {
                l.read_seconds += g.latency_us as f64 / 1e6;
                (&mut l.ops.data_read, &mut l.bytes.data_read)
            }
            "data_write" => (&mut l.ops.data_write, &mut l.bytes.data_write),
            "meta_read" => (&mut l.ops.meta_read, &mut l.bytes.meta_read),
            _ => (&mut l.ops.meta_write, &mut l.bytes.meta_write),
        };
        *ops += u(g.ops);
        *bytes += u(g.bytes);
        l.errors += u(g.errors);
        l.tiers.ram += u(g.tiers[0]);
        l.tiers.disk += u(g.tiers[1]);
        l.tiers.peer += u(g.tiers[2]);
        l.tiers.origin += u(g.tiers[3]);
        l.first_minute_unix = l.first_minute_unix.min(g.first_minute);
        l.last_minute_unix = l.last_minute_unix.max(g.last_minute);
    }
    let total = |l: &an::FleetLine| l.bytes.data_read + l.bytes.data_write;
    let mut v: Vec<an::FleetLine> = lines.into_values().collect();
    for l in &mut v {
        l.agents.sort();
    }
    v.sort_by(|x, y| {
        total(y)
            .cmp(&total(x))
            .then_with(|| (&x.team, &x.name).cmp(&(&y.team, &y.name)))
    });
    v.truncate(n);
    reply::<an::GetFleet>(v)
}
