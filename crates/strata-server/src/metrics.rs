//! Prometheus text for the cache's own state, appended to the event-derived families.

use std::fmt::Write;

use strata_cache::CacheStats;

fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[(&str, u64)]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {v}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {v}");
        }
    }
}

/// The shared cache's peer requests by outcome, and members by state.
pub(crate) fn render_cluster(c: &crate::cluster::Cluster) -> String {
    let mut o = String::new();
    let st = c.status(0);
    family(
        &mut o,
        "strata_cluster_peer_requests_total",
        "counter",
        "Block requests this agent sent to peers, by outcome (every request counts once as sent)",
        &[
            ("outcome=\"sent\"", st.asked),
            ("outcome=\"sent_to_previous_owner\"", st.move_asks),
            ("outcome=\"error\"", st.errors),
            ("outcome=\"corrupt\"", st.corrupt),
            ("outcome=\"refused\"", st.refused),
        ],
    );
    family(
        &mut o,
        "strata_cluster_suspected_total",
        "counter",
        "Times a peer was marked suspect (skipped for a backoff)",
        &[("", st.suspected)],
    );
    family(
        &mut o,
        "strata_cluster_moved_blocks_total",
        "counter",
        "Blocks served by their owner in the view before a membership change",
        &[("", st.moved)],
    );
    let up = st
        .members
        .iter()
        .filter(|m| m.state == strata_api::cluster::MemberState::Up)
        .count() as u64;
    family(
        &mut o,
        "strata_cluster_members",
        "gauge",
        "Members of the current view, by state as this agent sees them",
        &[
            ("state=\"up\"", up),
            ("state=\"suspect\"", st.members.len() as u64 - up),
        ],
    );
    o
}

/// Render the cache families.
pub(crate) fn render_cache(s: &CacheStats) -> String {
    let mut o = String::new();
    let mut tiers: Vec<(&str, &strata_cache::TierStats)> = vec![("tier=\"ram\"", &s.ram)];
    if let Some(d) = &s.disk {
        tiers.push(("tier=\"disk\"", d));
    }
    let per_tier = |f: fn(&strata_cache::TierStats) -> u64| {
        tiers.iter().map(|(l, t)| (*l, f(t))).collect::<Vec<_>>()
    };
    family(
        &mut o,
        "strata_cache_capacity_bytes",
        "gauge",
        "Capacity of a cache tier",
        &per_tier(|t| t.capacity_bytes),
    );
    family(
        &mut o,
        "strata_cache_used_bytes",
        "gauge",
        "Bytes held by a cache tier",
        &per_tier(|t| t.used_bytes),
    );
    family(
        &mut o,
        "strata_cache_pinned_bytes",
        "gauge",
        "Bytes held by pinned blocks",
        &per_tier(|t| t.pinned_bytes),
    );
    family(
        &mut o,
        "strata_cache_blocks",
        "gauge",
        "Blocks held by a cache tier",
        &per_tier(|t| t.blocks),
    );
    family(
        &mut o,
        "strata_cache_evictions_total",
        "counter",
        "Blocks evicted from a tier",
        &per_tier(|t| t.evictions),
    );
    family(
        &mut o,
        "strata_cache_admissions_rejected_total",
        "counter",
        "Blocks the admission filter kept out of a tier",
        &per_tier(|t| t.admissions_rejected),
    );
    let f = &s.disk_faults;
    family(
        &mut o,
        "strata_cache_checksum_failures_total",
        "counter",
        "Disk blocks that failed verification on read (served from elsewhere)",
        &[("", f.checksum_failures)],
    );
    family(
        &mut o,
        "strata_cache_disk_errors_total",
        "counter",
        "Disk tier faults by kind (each one a miss, never a failed read)",
        &[
            ("kind=\"read\"", f.read_errors),
            ("kind=\"write\"", f.write_errors),
            ("kind=\"no_space\"", f.no_space),
            ("kind=\"queue_full\"", f.writes_dropped),
            ("kind=\"removed_on_start\"", f.removed_on_start),
        ],
    );
    family(
        &mut o,
        "strata_cache_read_bytes_total",
        "counter",
        "Bytes of the blocks reads took from a tier (hit) or had to fill (miss); their ratio is the byte-weighted hit ratio",
        &[
            ("outcome=\"hit\"", s.hit_bytes),
            ("outcome=\"miss\"", s.miss_bytes),
        ],
    );
    family(
        &mut o,
        "strata_cache_fills_total",
        "counter",
        "Blocks filled from backends",
        &[("", s.fills)],
    );
    family(
        &mut o,
        "strata_cache_fill_requests_total",
        "counter",
        "Backend requests made to fill blocks (one may fill several consecutive blocks)",
        &[("", s.fill_requests)],
    );
    family(
        &mut o,
        "strata_cache_fill_bytes_total",
        "counter",
        "Bytes read from backends to fill blocks",
        &[("", s.fill_bytes)],
    );
    family(
        &mut o,
        "strata_cache_peer_blocks_total",
        "counter",
        "Blocks of this agent's fills that other agents of the cluster served (from: peers) and blocks this agent served to them (to: peers)",
        &[
            ("direction=\"from_peers\"", s.peer_blocks),
            ("direction=\"to_peers\"", s.served_to_peers),
        ],
    );
    family(
        &mut o,
        "strata_cache_peer_bytes_total",
        "counter",
        "Bytes of those blocks",
        &[
            ("direction=\"from_peers\"", s.peer_bytes),
            ("direction=\"to_peers\"", s.served_to_peers_bytes),
        ],
    );
    family(
        &mut o,
        "strata_cache_single_flight_joins_total",
        "counter",
        "Lookups that joined a fill in flight",
        &[("", s.single_flight_joins)],
    );
    family(
        &mut o,
        "strata_cache_readahead_blocks_total",
        "counter",
        "Blocks prefetched for sequential readers",
        &[("", s.readahead_blocks)],
    );
    family(
        &mut o,
        "strata_cache_stale_version_errors_total",
        "counter",
        "Reads refused because the object changed while being read",
        &[("", s.stale_version_errors)],
    );
    family(
        &mut o,
        "strata_cache_metadata_refreshes_total",
        "counter",
        "Object metadata refreshed in the background before its TTL ran out",
        &[("", s.metadata_refreshes)],
    );
    family(
        &mut o,
        "strata_cache_metadata_refresh_lists_total",
        "counter",
        "Directory listings sent to refresh the metadata of many cached objects at once",
        &[("", s.metadata_refresh_lists)],
    );
    family(
        &mut o,
        "strata_cache_block_buffers_total",
        "counter",
        "Block-sized buffers taken from the pool of freed ones (reused) or newly allocated, and freed ones given \
         back to the allocator (released)",
        &[
            ("event=\"reused\"", s.pool_reused_blocks),
            ("event=\"allocated\"", s.pool_allocated_blocks),
            ("event=\"released\"", s.pool_released_blocks),
        ],
    );
    family(
        &mut o,
        "strata_cache_block_pool_bytes",
        "gauge",
        "Bytes of freed block buffers kept for reuse",
        &[("", s.pool_kept_bytes)],
    );
    family(
        &mut o,
        "strata_cache_inflight_bytes",
        "gauge",
        "Bytes being fetched from backends",
        &[("", s.inflight_bytes)],
    );
    family(
        &mut o,
        "strata_cache_inflight_budget_bytes",
        "gauge",
        "Budget for bytes being fetched from backends",
        &[("", s.inflight_budget_bytes)],
    );
    o
}

/// Render the forecast metrics (appended to `/metrics`).
pub(crate) fn render_forecasts(a: &crate::Agent) -> String {
    let mut s = String::from(
        "# HELP strata_forecast_days_until_full Days until a volume or a team's hard quota fills (earliest of the 95% interval).\n\
         # TYPE strata_forecast_days_until_full gauge\n\
         # HELP strata_forecast_alert 1 when the forecast fill date is within catalog.forecast_alert_days.\n\
         # TYPE strata_forecast_alert gauge\n",
    );
    let esc = |v: &str| v.replace('\\', "\\\\").replace('"', "\\\"");
    for l in a.access.forecasts() {
        if let Some(d) = l.forecast.as_ref().and_then(|f| f.days_low) {
            s.push_str(&format!(
                "strata_forecast_days_until_full{{kind=\"{}\",scope=\"{}\"}} {d}\n",
                l.kind,
                esc(&l.scope)
            ));
        }
        s.push_str(&format!(
            "strata_forecast_alert{{kind=\"{}\",scope=\"{}\"}} {}\n",
            l.kind,
            esc(&l.scope),
            u8::from(l.alert)
        ));
    }
    s.push_str(&format!(
        "# HELP strata_access_times_dropped_total Reads not recorded as access times (pending set full).\n\
         # TYPE strata_access_times_dropped_total counter\nstrata_access_times_dropped_total {}\n",
        a.access.dropped.load(std::sync::atomic::Ordering::Relaxed)
    ));
    s
}

/// A label value in the text format: `\`, `"` and newlines escaped.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Jobs with series of their own, at most; the rest of a team's jobs are its `job_id="other"`. (The label is
/// `job_id`: `job` is the scrape job Prometheus attaches to every series.)
pub(crate) const TOP_JOBS: usize = 20;

/// The analytics' families: per team and class (operations, bytes; counters), per job (rates, stall share,
/// runaway; gauges) for the [`TOP_JOBS`] busiest jobs, the others summed per team as `job="other"`, and the
/// analytics' own counters. Cardinality: teams x 4 classes, plus at most TOP_JOBS + teams job series.
pub(crate) fn render_analytics(a: &strata_analytics::Analytics) -> String {
    use std::fmt::Write;
    use strata_analytics::OpClass;
    let mut o = String::new();
    let teams = a.teams();
    for (name, help, f) in [
        (
            "strata_team_operations_total",
            "Operations at the front doors by team and class (data_read, data_write, meta_read, meta_write)",
            (|t: &strata_analytics::TeamTotals, i: usize| t.ops[i]) as fn(&_, usize) -> u64,
        ),
        (
            "strata_team_bytes_total",
            "Bytes moved at the front doors by team and class",
            |t, i| t.bytes[i],
        ),
    ] {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} counter");
        for (team, t) in &teams {
            for c in OpClass::ALL {
                let _ = writeln!(
                    o,
                    "{name}{{team=\"{}\",class=\"{}\"}} {}",
                    label(team),
                    c.as_str(),
                    f(t, c as usize)
                );
            }
        }
    }
    let mut jobs = a.jobs(std::time::SystemTime::now(), |_| true);
    jobs.sort_by(|x, y| {
        (y.data_bytes_per_sec + y.meta_ops_per_sec)
            .total_cmp(&(x.data_bytes_per_sec + x.meta_ops_per_sec))
            .then_with(|| x.key.cmp(&y.key))
    });
    // (team, job) -> (data B/s, meta ops/s, stall share, runaway)
    let mut rows: Vec<(String, String, [f64; 4])> = Vec::new();
    let mut other: std::collections::BTreeMap<String, [f64; 4]> = Default::default();
    for (i, j) in jobs.iter().enumerate() {
        let v = [
            j.data_bytes_per_sec,
            j.meta_ops_per_sec,
            j.stall_share,
            f64::from(u8::from(j.runaway)),
        ];
        if i < TOP_JOBS {
            rows.push((j.key.team.to_string(), j.key.job.to_string(), v));
        } else {
            let e = other.entry(j.key.team.to_string()).or_default();
            for k in 0..3 {
                e[k] += v[k];
            }
            e[3] = e[3].max(v[3]);
        }
    }
    rows.extend(other.into_iter().map(|(t, v)| (t, "other".to_string(), v)));
    for (k, (name, help)) in [
        (
            "strata_job_data_bytes_per_second",
            "Data bytes a second over the last minute, per job (the busiest; others as job_id=\"other\")",
        ),
        (
            "strata_job_metadata_operations_per_second",
            "Metadata operations a second over the last minute, per job",
        ),
        (
            "strata_job_stall_share",
            "Share of the last minute the job's readers waited in data reads (summed over readers)",
        ),
        (
            "strata_job_metadata_runaway",
            "1 while the job's metadata rate has stayed over [analytics] runaway_ops_per_sec for the window",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let _ = writeln!(o, "# HELP {name} {help}");
        let _ = writeln!(o, "# TYPE {name} gauge");
        for (team, job, v) in &rows {
            let _ = writeln!(
                o,
                "{name}{{team=\"{}\",job_id=\"{}\"}} {}",
                label(team),
                label(job),
                v[k]
            );
        }
    }
    let st = a.stats();
    family(
        &mut o,
        "strata_analytics_operations_total",
        "counter",
        "Operations the analytics folded (recorded), dropped because its queue was full, or counted in a team's (other) rollup row",
        &[
            ("outcome=\"recorded\"", st.recorded),
            ("outcome=\"dropped\"", st.dropped),
            ("outcome=\"folded\"", st.folded),
        ],
    );
    family(
        &mut o,
        "strata_analytics_entries",
        "gauge",
        "Jobs and heat entries the analytics hold now (each bounded: [analytics] max_jobs, max_heat)",
        &[
            ("kind=\"jobs\"", st.jobs),
            ("kind=\"heat\"", st.heat_entries),
        ],
    );
    family(
        &mut o,
        "strata_analytics_evicted_total",
        "counter",
        "Jobs (the least recently seen) and heat entries (the coldest) dropped by their bound",
        &[
            ("kind=\"jobs\"", st.jobs_evicted),
            ("kind=\"heat\"", st.heat_evicted),
        ],
    );
    family(
        &mut o,
        "strata_analytics_minutes_total",
        "counter",
        "Rollup minutes written as Parquet files and put in the catalog for the fleet, or not (failed; dropped before the writer took them)",
        &[
            ("sink=\"files\",result=\"written\"", st.files_written),
            ("sink=\"files\",result=\"failed\"", st.files_failed),
            ("sink=\"fleet\",result=\"written\"", st.fleet_written),
            ("sink=\"fleet\",result=\"failed\"", st.fleet_failed),
            ("sink=\"any\",result=\"dropped\"", st.minutes_dropped),
        ],
    );
    o
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, SystemTime};

    use strata_analytics::{Access, Analytics, AnalyticsConfig, OpClass, Served};
    use strata_types::IoContext;

    #[test]
    fn job_series_stay_bounded_and_label_values_are_escaped() {
        let a = Analytics::new(AnalyticsConfig::default());
        let now = SystemTime::now();
        let accesses: Vec<Access> = (0..50)
            .map(|i| Access {
                at: now - Duration::from_secs(1),
                class: OpClass::MetaRead,
                ctx: IoContext {
                    principal: None,
                    team: Some(Arc::from("vision")),
                    job: Some(Arc::from(if i == 0 {
                        "a \"quoted\"\nnew\\line".to_string()
                    } else {
                        format!("job-{i}")
                    })),
                    dataset: None,
                },
                backend: Arc::from("default"),
                key: Arc::from("k"),
                count: 1,
                bytes: 0,
                latency: Duration::from_millis(1),
                served: Served::None,
                ok: true,
            })
            .collect();
        a.apply_all(&accesses);
        let text = super::render_analytics(&a);
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("strata_job_metadata_operations_per_second{"))
            .collect();
        assert_eq!(series.len(), super::TOP_JOBS + 1, "{series:#?}");
        assert!(series.iter().any(|l| l.contains("job_id=\"other\"")));
        let other: f64 = series
            .iter()
            .find(|l| l.contains("job_id=\"other\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        assert!(
            (other - 30.0 / 60.0).abs() < 1e-9,
            "the 30 jobs past the top, summed: {other}"
        );
        assert!(
            !text.contains("\"quoted\"") || text.contains("a \\\"quoted\\\"\\nnew\\\\line"),
            "escaped"
        );
        assert!(text.lines().all(|l| !l.is_empty()));
    }
}
