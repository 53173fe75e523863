//! `strata cache ...`: a running agent's cache: statistics, warm-ups with a progress bar, pins, and how much of
//! a location's version the cluster holds (`coverage`).

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use strata_api::cache::CacheStats;
use strata_api::data;
use strata_api::{Endpoint, NoQuery};
use strata_client::AgentClient;

use crate::{CacheCommand, api_client, human, reached};

/// `strata cache ...`.
pub async fn run(c: CacheCommand) -> Result<()> {
    let client = match &c {
        CacheCommand::Stats { api, .. }
        | CacheCommand::Warm { api, .. }
        | CacheCommand::Pin { api, .. }
        | CacheCommand::Coverage { api, .. }
        | CacheCommand::Unpin { api, .. } => api_client(api)?,
    };
    let base = client.base().to_string();
    match c {
        CacheCommand::Stats { json, .. } => {
            let stats = client
                .call::<data::CacheStats>(&[], &NoQuery {}, &())
                .await
                .map_err(|e| reached(e, &base))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&stats)?);
                return Ok(());
            }
            print_stats(&stats);
            Ok(())
        }
        CacheCommand::Warm {
            location,
            concurrency,
            quiet,
            ..
        } => warm(&client, &location, concurrency, quiet).await,
        CacheCommand::Pin {
            location, warm: w, ..
        } => {
            let body = data::PinLocation {
                location: location.clone(),
            };
            let r = client
                .call::<data::Pin>(&[], &NoQuery {}, &body)
                .await
                .map_err(|e| reached(e, &base))?;
            println!(
                "pinned {location}: {} cached blocks pinned, {} refused (pinned-bytes cap)",
                r.pinned_blocks, r.refused_blocks
            );
            if w {
                warm(&client, &location, 16, false).await?;
            }
            Ok(())
        }
        CacheCommand::Coverage {
            location,
            team,
            json,
            ..
        } => coverage(&client, &location, team.as_deref(), json).await,
        CacheCommand::Unpin { location, .. } => {
            let body = data::PinLocation {
                location: location.clone(),
            };
            let r = client
                .call::<data::Unpin>(&[], &NoQuery {}, &body)
                .await
                .map_err(|e| reached(e, &base))?;
            if r.removed {
                println!("unpinned {location}");
                Ok(())
            } else {
                bail!("{location} was not pinned")
            }
        }
    }
}

fn print_stats(s: &CacheStats) {
    println!("block size {}   policy {}", human(s.block_size), s.policy);
    println!(
        "{:<6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}",
        "tier", "capacity", "used", "pinned", "blocks", "hits", "evictions"
    );
    for (name, t) in [("ram", Some(&s.ram)), ("disk", s.disk.as_ref())] {
        let Some(t) = t else { continue };
        println!(
            "{:<6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}",
            name,
            human(t.capacity_bytes),
            human(t.used_bytes),
            human(t.pinned_bytes),
            t.blocks,
            t.hits,
            t.evictions
        );
    }
    println!(
        "misses {}   hit ratio {:.3} (bytes {:.3})   fills {} ({})   single-flight joins {}   readahead blocks {}",
        s.misses,
        s.hit_ratio,
        s.byte_hit_ratio,
        s.fills,
        human(s.fill_bytes),
        s.single_flight_joins,
        s.readahead_blocks
    );
    let (peer, fills) = (s.peer_blocks, s.fills);
    if peer + s.served_to_peers > 0 {
        println!(
            "peers: {} blocks ({}) from peers, peer hit ratio {:.3}   {} blocks ({}) served to peers",
            peer,
            human(s.peer_bytes),
            peer as f64 / (peer + fills).max(1) as f64,
            s.served_to_peers,
            human(s.served_to_peers_bytes)
        );
    }
    if !s.by_job.is_empty() {
        println!(
            "{:<24} {:<24} {:>12} {:>12} {:>12} {:>9}",
            "job", "dataset", "origin", "from peers", "to peers", "peer hit"
        );
        for j in s.by_job.iter().take(10) {
            println!(
                "{:<24} {:<24} {:>12} {:>12} {:>12} {:>9.3}",
                j.job.as_deref().unwrap_or("-"),
                j.dataset.as_deref().unwrap_or("-"),
                human(j.origin_bytes),
                human(j.peer_bytes),
                human(j.served_to_peers_bytes),
                j.peer_hit_ratio
            );
        }
        if s.by_job.len() > 10 {
            println!("... {} more (--json for all)", s.by_job.len() - 10);
        }
    }
    let f = &s.disk_faults;
    println!(
        "disk faults: checksum {}  read {}  write {}  no-space {}  queue-full {}  removed at start {}",
        f.checksum_failures,
        f.read_errors,
        f.write_errors,
        f.no_space,
        f.writes_dropped,
        f.removed_on_start
    );
    for p in &s.pins {
        println!("pinned: {} {}", p.backend, p.prefix);
    }
}

async fn warm(
    client: &strata_client::AgentClient,
    location: &str,
    concurrency: u16,
    quiet: bool,
) -> Result<()> {
    // The progress is read line by line as it streams, so this is a request of its own, not a `call`.
    let req = client
        .request(
            strata_client::Method::POST,
            client.url(data::WarmPrefix::PATH),
        )
        .json(&data::Warm {
            location: location.to_string(),
            concurrency: Some(concurrency.into()),
        });
    let resp = client
        .send(req, "warm-up")
        .await
        .map_err(|e| reached(e, client.base()))?;
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    };
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut last: Option<data::WarmLine> = None;
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.context("reading the warm-up progress stream")?);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: data::WarmLine =
                serde_json::from_slice(&line).context("malformed progress line")?;
            bar.set_length(v.progress.total_bytes);
            bar.set_position(v.progress.done_bytes);
            bar.set_message(format!("{} objects", v.progress.objects));
            last = Some(v);
        }
    }
    bar.finish_and_clear();
    let Some(v) = last.filter(|v| v.done) else {
        bail!("the agent closed the progress stream before the warm-up finished");
    };
    if let Some(e) = &v.error {
        bail!("warm-up of {location} failed: {e}");
    }
    let p = &v.progress;
    if quiet {
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!(
            "warmed {location}: {} objects, {} ({} blocks fetched, {} already cached, {} failed)",
            p.objects,
            human(p.done_bytes),
            p.fetched_blocks,
            p.cached_blocks,
            p.failed_blocks
        );
    }
    let failed = p.failed_blocks;
    if failed > 0 {
        for e in &p.errors {
            eprintln!("  {e}");
        }
        bail!("{failed} blocks could not be cached");
    }
    Ok(())
}

/// Print `GET /v1/coverage` of `location` (read as a reader of `team`, when given): the version, the share held
/// and each member's, or the raw JSON.
async fn coverage(
    client: &AgentClient,
    location: &str,
    team: Option<&str>,
    json: bool,
) -> Result<()> {
    let q = strata_api::claims::CoverageQuery {
        location: location.to_string(),
        team: team.map(str::to_string),
    };
    let base = client.base().to_string();
    let c = client
        .call::<strata_api::claims::GetCoverage>(&[], &q, &())
        .await
        .map_err(|e| reached(e, &base))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
        return Ok(());
    }
    println!(
        "{} version {}: {}% cached, {}/{} objects, {}/{} bytes, {}/{} blocks{}",
        c.location,
        c.version,
        c.percent(),
        c.objects_held,
        c.objects,
        c.bytes_held,
        c.bytes_total,
        c.blocks_held,
        c.blocks_total,
        if c.complete {
            ""
        } else {
            " (not every agent answered)"
        }
    );
    for m in &c.members {
        match &m.error {
            Some(e) => println!("  {}: not counted: {e}", m.member),
            None => println!(
                "  {}: {}/{} bytes, {}/{} blocks of its share",
                m.member, m.bytes_held, m.bytes_total, m.blocks_held, m.blocks_total
            ),
        }
    }
    Ok(())
}
