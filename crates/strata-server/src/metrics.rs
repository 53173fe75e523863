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
