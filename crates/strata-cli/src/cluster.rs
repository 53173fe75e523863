//! `strata cluster status`: the members of the shared cache as the local agent sees them.

use anyhow::Result;

use crate::{ApiArgs, api_client, human, reached};

/// Print the members (address, weight, state, share of blocks) and the peer counters of `GET /v1/cluster`.
pub async fn status(api: &ApiArgs, json: bool) -> Result<()> {
    let client = api_client(api)?;
    let base = client.base().to_string();
    let s: serde_json::Value = client
        .get_json("/v1/cluster")
        .await
        .map_err(|e| reached(e, &base))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    let c = &s["cache"];
    if s["shared"].as_bool() != Some(true) {
        println!("this agent does not share its cache ([cluster] cache = \"off\")");
        return Ok(());
    }
    println!(
        "membership {}   members {}   view changes {}",
        s["membership"].as_str().unwrap_or("?"),
        s["members"].as_array().map_or(0, Vec::len),
        n(&s["view_changes"])
    );
    println!(
        "{:<2} {:<40} {:>14} {:>8} {:>8}",
        "", "member", "weight", "share", "state"
    );
    for m in s["members"].as_array().into_iter().flatten() {
        println!(
            "{:<2} {:<40} {:>14} {:>7.1}% {:>8}",
            if m["me"].as_bool() == Some(true) {
                "*"
            } else {
                ""
            },
            m["id"].as_str().unwrap_or("?"),
            m["weight"].as_f64().unwrap_or(0.0),
            m["share"].as_f64().unwrap_or(0.0) * 100.0,
            m["state"].as_str().unwrap_or("?")
        );
    }
    println!(
        "origin {}   from peers {} ({} blocks)   served to peers {} ({} blocks)",
        human(n(&c["origin_bytes"])),
        human(n(&c["peer_bytes"])),
        n(&c["peer_blocks"]),
        human(n(&c["served_to_peers_bytes"])),
        n(&c["served_to_peers"])
    );
    println!(
        "peer requests {}   errors {}   corrupt {}   refused {}   suspected {}   moved {}",
        n(&s["asked"]),
        n(&s["errors"]),
        n(&s["corrupt"]),
        n(&s["refused"]),
        n(&s["suspected"]),
        n(&s["moved"])
    );
    Ok(())
}
