//! `strata cache ...`: a running agent's cache: statistics, warm-ups with a progress bar, pins, and how much of
//! a location's version the cluster holds (`coverage`).

use anyhow::{Context, Result, bail};
use futures::StreamExt;
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
            let stats: serde_json::Value = client
                .get_json("/v1/cache")
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
            let r: serde_json::Value = client
                .post_json(
                    "/v1/cache/pin",
                    &serde_json::json!({ "location": location }),
                )
                .await
                .map_err(|e| reached(e, &base))?;
            println!(
                "pinned {location}: {} cached blocks pinned, {} refused (pinned-bytes cap)",
                r["pinned_blocks"], r["refused_blocks"]
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
            let r: serde_json::Value = client
                .post_json(
                    "/v1/cache/unpin",
                    &serde_json::json!({ "location": location }),
                )
                .await
                .map_err(|e| reached(e, &base))?;
            if r["removed"].as_bool() == Some(true) {
                println!("unpinned {location}");
                Ok(())
            } else {
                bail!("{location} was not pinned")
            }
        }
    }
}

fn print_stats(s: &serde_json::Value) {
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    println!(
        "block size {}   policy {}",
        human(n(&s["block_size"])),
        s["policy"].as_str().unwrap_or("?")
    );
    println!(
        "{:<6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}",
        "tier", "capacity", "used", "pinned", "blocks", "hits", "evictions"
    );
    for (name, t) in [("ram", &s["ram"]), ("disk", &s["disk"])] {
        if t.is_null() {
            continue;
        }
        println!(
            "{:<6} {:>12} {:>12} {:>12} {:>10} {:>10} {:>10}",
            name,
            human(n(&t["capacity_bytes"])),
            human(n(&t["used_bytes"])),
            human(n(&t["pinned_bytes"])),
            n(&t["blocks"]),
            n(&t["hits"]),
            n(&t["evictions"])
        );
    }
    println!(
        "misses {}   hit ratio {:.3} (bytes {:.3})   fills {} ({})   single-flight joins {}   readahead blocks {}",
        n(&s["misses"]),
        s["hit_ratio"].as_f64().unwrap_or(0.0),
        s["byte_hit_ratio"].as_f64().unwrap_or(0.0),
        n(&s["fills"]),
        human(n(&s["fill_bytes"])),
        n(&s["single_flight_joins"]),
        n(&s["readahead_blocks"])
    );
    let (peer, fills) = (n(&s["peer_blocks"]), n(&s["fills"]));
    if peer + n(&s["served_to_peers"]) > 0 {
        println!(
            "peers: {} blocks ({}) from peers, peer hit ratio {:.3}   {} blocks ({}) served to peers",
            peer,
            human(n(&s["peer_bytes"])),
            peer as f64 / (peer + fills).max(1) as f64,
            n(&s["served_to_peers"]),
            human(n(&s["served_to_peers_bytes"]))
        );
    }
    if let Some(jobs) = s["by_job"].as_array()
        && !jobs.is_empty()
    {
        println!(
            "{:<24} {:<24} {:>12} {:>12} {:>12} {:>9}",
            "job", "dataset", "origin", "from peers", "to peers", "peer hit"
        );
        for j in jobs.iter().take(10) {
            println!(
                "{:<24} {:<24} {:>12} {:>12} {:>12} {:>9.3}",
                j["job"].as_str().unwrap_or("-"),
                j["dataset"].as_str().unwrap_or("-"),
                human(n(&j["origin_bytes"])),
                human(n(&j["peer_bytes"])),
                human(n(&j["served_to_peers_bytes"])),
                j["peer_hit_ratio"].as_f64().unwrap_or(0.0)
            );
        }
        if jobs.len() > 10 {
            println!("... {} more (--json for all)", jobs.len() - 10);
        }
    }
    let f = &s["disk_faults"];
    println!(
        "disk faults: checksum {}  read {}  write {}  no-space {}  queue-full {}  removed at start {}",
        n(&f["checksum_failures"]),
        n(&f["read_errors"]),
        n(&f["write_errors"]),
        n(&f["no_space"]),
        n(&f["writes_dropped"]),
        n(&f["removed_on_start"])
    );
    if let Some(pins) = s["pins"].as_array()
        && !pins.is_empty()
    {
        for p in pins {
            println!(
                "pinned: {} {}",
                p["backend"].as_str().unwrap_or("?"),
                p["prefix"].as_str().unwrap_or("")
            );
        }
    }
}

async fn warm(
    client: &strata_client::AgentClient,
    location: &str,
    concurrency: u16,
    quiet: bool,
) -> Result<()> {
    let req = client
        .request(strata_client::Method::POST, client.url("/v1/cache/warm"))
        .json(&serde_json::json!({ "location": location, "concurrency": concurrency }));
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
    let mut last: Option<serde_json::Value> = None;
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.context("reading the warm-up progress stream")?);
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let v: serde_json::Value =
                serde_json::from_slice(&line).context("malformed progress line")?;
            bar.set_length(v["total_bytes"].as_u64().unwrap_or(0));
            bar.set_position(v["done_bytes"].as_u64().unwrap_or(0));
            bar.set_message(format!("{} objects", v["objects"]));
            last = Some(v);
        }
    }
    bar.finish_and_clear();
    let Some(v) = last.filter(|v| v["done"].as_bool() == Some(true)) else {
        bail!("the agent closed the progress stream before the warm-up finished");
    };
    if let Some(e) = v["error"].as_str() {
        bail!("warm-up of {location} failed: {e}");
    }
    if quiet {
        println!("{v}");
    } else {
        println!(
            "warmed {location}: {} objects, {} ({} blocks fetched, {} already cached, {} failed)",
            v["objects"],
            human(v["done_bytes"].as_u64().unwrap_or(0)),
            v["fetched_blocks"],
            v["cached_blocks"],
            v["failed_blocks"]
        );
    }
    let failed = v["failed_blocks"].as_u64().unwrap_or(0);
    if failed > 0 {
        for e in v["errors"].as_array().into_iter().flatten() {
            eprintln!("  {}", e.as_str().unwrap_or_default());
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
    let enc = |s: &str| -> String { url::form_urlencoded::byte_serialize(s.as_bytes()).collect() };
    let mut path = format!("/v1/coverage?location={}", enc(location));
    if let Some(t) = team {
        path.push_str(&format!("&team={}", enc(t)));
    }
    let base = client.base().to_string();
    let c: strata_claim::Coverage = client
        .get_json(&path)
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
