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
    reply::<an::GetJobProfile>(an::JobProfile {
        summary: summary(v),
        latency,
        timeline: v.timeline.iter().map(slot).collect(),
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
