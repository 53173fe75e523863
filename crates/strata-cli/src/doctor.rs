//! `strata doctor slurm`: is this site set up for Strata's Slurm integration? Each check says what it found and,
//! when it fails, what to change. Reads `scontrol show config` (so it runs where Slurm's client works), the
//! files next to `slurm.conf`, and asks the agent who the configured token is.

use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::{ApiArgs, api_client};

/// One finding.
struct Check {
    ok: bool,
    what: String,
    fix: String,
}

fn check(ok: bool, what: impl Into<String>, fix: impl Into<String>) -> Check {
    Check {
        ok,
        what: what.into(),
        fix: fix.into(),
    }
}

/// `KEY = value` lines of `scontrol show config`.
fn parse_config(text: &str) -> std::collections::HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// Run the checks; exit 1 when one fails.
pub async fn slurm(api: &ApiArgs, json: bool) -> Result<()> {
    let mut checks = Vec::new();
    let out = std::process::Command::new("scontrol")
        .args(["show", "config"])
        .output();
    let config = match out {
        Ok(o) if o.status.success() => Some(parse_config(&String::from_utf8_lossy(&o.stdout))),
        Ok(o) => {
            checks.push(check(
                false,
                format!(
                    "scontrol show config failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                "run this where Slurm's client commands work (SLURM_CONF, munge)",
            ));
            None
        }
        Err(e) => {
            checks.push(check(
                false,
                format!("scontrol not found: {e}"),
                "install Slurm's client commands (Debian: slurm-client) or run this on a Slurm node",
            ));
            None
        }
    };
    if let Some(c) = &config {
        let get = |k: &str| c.get(k).map(String::as_str).unwrap_or("");
        let bb = get("BurstBufferType");
        checks.push(check(
            bb == "burst_buffer/lua",
            format!("BurstBufferType = {}", if bb.is_empty() { "(none)" } else { bb }),
            "set BurstBufferType=burst_buffer/lua in slurm.conf, or use contrib/slurm/prolog.sh and epilog.sh",
        ));
        let sched = get("SchedulerType");
        checks.push(check(
            sched == "sched/backfill",
            format!("SchedulerType = {sched}"),
            "burst-buffer stage-in starts only under SchedulerType=sched/backfill",
        ));
        let conf = PathBuf::from(get("SLURM_CONF"));
        let dir = conf.parent().unwrap_or(Path::new("/etc/slurm"));
        let lua = dir.join("burst_buffer.lua");
        let text = std::fs::read_to_string(&lua).unwrap_or_default();
        checks.push(check(
            text.contains("Strata's burst buffer"),
            format!(
                "{}: {}",
                lua.display(),
                if text.is_empty() {
                    "missing"
                } else if text.contains("Strata's burst buffer") {
                    "Strata's"
                } else {
                    "not Strata's"
                }
            ),
            "install contrib/slurm/burst_buffer.lua next to slurm.conf (slurmctld reads it there)",
        ));
        let bin = text
            .lines()
            .find_map(|l| l.strip_prefix("STRATA_BIN = setting(\"STRATA_BIN\", \""))
            .and_then(|r| r.split('"').next())
            .map(str::to_string);
        let bin = std::env::var("STRATA_BIN").ok().or(bin);
        if let Some(b) = bin {
            checks.push(check(
                Path::new(&b).is_file(),
                format!("the script's strata binary {b}"),
                "install strata there, or set STRATA_BIN for slurmctld (or in strata_site.lua)",
            ));
        }
    }
    let root = nix_root();
    checks.push(check(
        true,
        if root {
            "running as root: Slurm refuses burst buffers to root's jobs; submit as a user"
                .to_string()
        } else {
            "running as a user: jobs may use burst buffers".to_string()
        },
        "",
    ));
    let client = api_client(api)?;
    let base = client.base().to_string();
    match client.get_json::<serde_json::Value>("/v1/whoami").await {
        Ok(v) => checks.push(check(
            true,
            format!(
                "agent {base}: token of {} ({})",
                v["name"].as_str().unwrap_or("?"),
                if v["is_admin"].as_bool() == Some(true) {
                    "administrator"
                } else {
                    "not an administrator: it submits claims only for its own teams"
                }
            ),
            "",
        )),
        Err(e) => checks.push(check(
            false,
            format!("agent {base}: {e}"),
            "start `strata serve` on this node and give the script a token (STRATA_TOKEN_FILE)",
        )),
    }
    if json {
        let v: Vec<serde_json::Value> = checks
            .iter()
            .map(|c| serde_json::json!({"ok": c.ok, "what": c.what, "fix": c.fix}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        for c in &checks {
            println!("{} {}", if c.ok { "ok  " } else { "FAIL" }, c.what);
            if !c.ok && !c.fix.is_empty() {
                println!("     -> {}", c.fix);
            }
        }
    }
    if checks.iter().any(|c| !c.ok) {
        std::process::exit(1);
    }
    Ok(())
}

fn nix_root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
            })
            .unwrap_or(false)
}
