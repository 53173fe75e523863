//! `strata cluster status`: the members of the shared cache as the local agent sees them.

use anyhow::Result;
use strata_api::NoQuery;
use strata_api::cluster::{ClusterStatus, MemberState};

use crate::{ApiArgs, api_client, human, reached};

/// Print the members (address, weight, state, share of blocks) and the peer counters of `GET /v1/cluster`.
pub async fn status(api: &ApiArgs, json: bool) -> Result<()> {
    let client = api_client(api)?;
    let base = client.base().to_string();
    let s = client
        .call::<ClusterStatus>(&[], &NoQuery {}, &())
        .await
        .map_err(|e| reached(e, &base))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let c = &s.cache;
    let Some(m) = &s.members else {
        println!("this agent does not share its cache ([cluster] cache = \"off\")");
        return Ok(());
    };
    println!(
        "membership {}   members {}   view changes {}",
        m.membership,
        m.members.len(),
        m.view_changes
    );
    println!(
        "{:<2} {:<40} {:>14} {:>8} {:>8}",
        "", "member", "weight", "share", "state"
    );
    for member in &m.members {
        println!(
            "{:<2} {:<40} {:>14} {:>7.1}% {:>8}",
            if member.me { "*" } else { "" },
            member.id,
            member.weight,
            member.share * 100.0,
            match member.state {
                MemberState::Up => "up",
                MemberState::Suspect => "suspect",
            }
        );
    }
    println!(
        "origin {}   from peers {} ({} blocks)   served to peers {} ({} blocks)",
        human(c.origin_bytes),
        human(c.peer_bytes),
        c.peer_blocks,
        human(c.served_to_peers_bytes),
        c.served_to_peers
    );
    println!(
        "peer requests {}   errors {}   corrupt {}   refused {}   suspected {}   moved {}",
        m.asked, m.errors, m.corrupt, m.refused, m.suspected, m.moved
    );
    Ok(())
}
