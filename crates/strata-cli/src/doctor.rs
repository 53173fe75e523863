//! `strata doctor slurm`: is this site set up for Strata's Slurm integration? Each check says what it found and,
//! when it fails, what to change. Reads `scontrol show config` (so it runs where Slurm's client works), the
//! files next to `slurm.conf`, and asks the agent who the configured token is.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Result;

use crate::{ApiArgs, api_client};

/// The site settings `burst_buffer.lua` reads, each `setting("NAME", "default")` in it.
const SETTINGS: [&str; 7] = [
    "STRATA_BIN",
    "STRATA_API",
    "STRATA_TOKEN_FILE",
    "STRATA_STATE_DIR",
    "STRATA_TEAM_GROUPS",
    "STRATA_WAIT_SECS",
    "STRATA_FAIL_GRACE_SECS",
];

/// The script's site settings as slurmctld's Lua ends up with them: the script's defaults, then slurmctld's
/// environment (read from `/proc` where this user may), then this command's own environment (to check a
/// setting before slurmctld has it), then `strata_site.lua` next to the script, which the script reads last.
struct Site {
    values: HashMap<&'static str, String>,
    /// Where each value came from.
    from: HashMap<&'static str, &'static str>,
    /// Assignments of `strata_site.lua` this command cannot read (not a plain string or number).
    unreadable: Vec<String>,
}

impl Site {
    fn read(script: &str, dir: &Path, api: Option<&str>) -> Self {
        let mut site = Site {
            values: HashMap::new(),
            from: HashMap::new(),
            unreadable: Vec::new(),
        };
        for name in SETTINGS {
            let pat = format!("setting(\"{name}\", \"");
            if let Some(d) = script
                .lines()
                .find_map(|l| l.split_once(&pat).map(|(_, r)| r))
                .and_then(|r| r.split('"').next())
            {
                site.set(name, d.to_string(), "the script's default");
            }
        }
        for (k, v) in slurmctld_environment() {
            if let Some(name) = SETTINGS.iter().find(|n| **n == k)
                && !v.is_empty()
            {
                site.set(name, v, "slurmctld's environment");
            }
        }
        for name in SETTINGS {
            if let Ok(v) = std::env::var(name)
                && !v.is_empty()
            {
                site.set(name, v, "this command's environment");
            }
        }
        if let Some(a) = api {
            site.set(
                "STRATA_API",
                a.to_string(),
                "this command's --api / STRATA_API",
            );
        }
        if let Ok(text) = std::fs::read_to_string(dir.join("strata_site.lua")) {
            for (name, value) in lua_assignments(&text) {
                let Some(name) = SETTINGS.iter().find(|n| **n == name) else {
                    continue;
                };
                match value {
                    Some(v) => site.set(name, v, "strata_site.lua"),
                    None => site
                        .unreadable
                        .push(format!("{name}: not a plain string or number")),
                }
            }
        }
        site
    }

    fn set(&mut self, name: &'static str, value: String, from: &'static str) {
        self.values.insert(name, value);
        self.from.insert(name, from);
    }

    fn get(&self, name: &str) -> &str {
        self.values.get(name).map_or("", String::as_str)
    }

    /// `NAME = value (from where)`.
    fn describe(&self, name: &str) -> String {
        format!(
            "{name} = {} ({})",
            self.get(name),
            self.from.get(name).copied().unwrap_or("unset")
        )
    }
}

/// `NAME = "value"`, `NAME = 'value'` and `NAME = 123` lines of a Lua file (`local` and comments allowed):
/// each name with its value, `None` for a value that is not a plain string or number.
fn lua_assignments(text: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split("--").next().unwrap_or("").trim();
        let line = line.strip_prefix("local ").unwrap_or(line).trim();
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        let (name, value) = (name.trim(), value.trim().trim_end_matches(';').trim());
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let plain = ['"', '\''].iter().find_map(|q| {
            value
                .strip_prefix(*q)
                .and_then(|v| v.strip_suffix(*q))
                .filter(|v| !v.contains(*q) && !v.contains('\\'))
                .map(str::to_string)
        });
        let number = value.parse::<f64>().is_ok().then(|| value.to_string());
        out.push((name.to_string(), plain.or(number)));
    }
    out
}

/// The environment of the running slurmctld (empty when none runs here or this user may not read it).
fn slurmctld_environment() -> Vec<(String, String)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for p in procs.flatten() {
        let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
        if comm.trim() != "slurmctld" {
            continue;
        }
        if let Ok(env) = std::fs::read(p.path().join("environ")) {
            return env
                .split(|b| *b == 0)
                .filter_map(|kv| {
                    let kv = String::from_utf8_lossy(kv);
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect();
        }
    }
    Vec::new()
}

/// `StageInTimeout` of `burst_buffer.conf` (Slurm's default: 86400 s).
fn stage_in_timeout(bb_conf: &str) -> u64 {
    bb_conf
        .lines()
        .filter_map(|l| l.split('#').next())
        .filter_map(|l| l.trim().split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("StageInTimeout"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(86400)
}

/// The checks of the script's own settings: its binary, its token file, the agent at its API with that
/// token, and its stage-in wait against Slurm's.
async fn site_checks(site: &Site, bb_conf: &str, api: &ApiArgs) -> Vec<Check> {
    use std::os::unix::fs::PermissionsExt;
    let mut checks = Vec::new();
    let bin = site.get("STRATA_BIN");
    let executable =
        std::fs::metadata(bin).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    checks.push(check(
        executable,
        format!(
            "the script's strata binary: {}{}",
            site.describe("STRATA_BIN"),
            if executable {
                ""
            } else {
                ": not an executable file"
            }
        ),
        "install strata there, or set STRATA_BIN in strata_site.lua (or slurmctld's environment)",
    ));
    let token_file = site.get("STRATA_TOKEN_FILE");
    let token = std::fs::read_to_string(token_file)
        .ok()
        .and_then(|t| t.lines().next().map(str::trim).map(str::to_string))
        .filter(|t| !t.is_empty());
    checks.push(check(
        token.is_some(),
        format!(
            "the script's token: {}{}",
            site.describe("STRATA_TOKEN_FILE"),
            if token.is_some() { "" } else { ": missing, unreadable or empty" }
        ),
        "write a token of the site's principal there (readable by SlurmUser), or set STRATA_TOKEN_FILE",
    ));
    let opts = strata_client::ClientOptions {
        // The script's token; without one, this command's (to tell a missing file from a down agent).
        token: token.or_else(|| {
            strata_client::token::discover(
                api.token.clone(),
                Some(
                    &api.data_dir
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("./.strata")),
                ),
            )
        }),
        connect_timeout: std::time::Duration::from_secs(3),
        timeout: Some(std::time::Duration::from_secs(10)),
        ..Default::default()
    };
    match strata_client::AgentClient::new(site.get("STRATA_API"), &opts) {
        Ok(client) => checks.push(agent_check(&client).await),
        Err(e) => checks.push(check(
            false,
            format!("the script's agent: {}: {e}", site.describe("STRATA_API")),
            "set STRATA_API to the agent's control API (http://host:port)",
        )),
    }
    let timeout = stage_in_timeout(bb_conf);
    let wait = site.get("STRATA_WAIT_SECS").parse::<f64>().ok();
    checks.push(check(
        wait.is_some_and(|w| w > 0.0 && w < timeout as f64),
        format!(
            "{} against StageInTimeout = {timeout} s (burst_buffer.conf)",
            site.describe("STRATA_WAIT_SECS")
        ),
        "keep STRATA_WAIT_SECS below StageInTimeout: Slurm kills a stage-in that outlasts it, before the script \
         can fail the claim with its reason",
    ));
    checks
}

/// Who the agent says the client's token is.
async fn agent_check(client: &strata_client::AgentClient) -> Check {
    let base = client.base().to_string();
    let whoami = client.call::<strata_api::teams::WhoAmI>(&[], &strata_api::NoQuery {}, &());
    match whoami.await {
        Ok(v) => check(
            true,
            format!(
                "agent {base}: token of {} ({})",
                v.name,
                if v.is_admin {
                    "administrator"
                } else {
                    "not an administrator: it submits claims only for its own teams"
                }
            ),
            "",
        ),
        Err(e) => check(
            false,
            format!("agent {base}: {e}"),
            "start `strata serve` on this node and give the script a token (STRATA_TOKEN_FILE)",
        ),
    }
}

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
        let bb_conf = std::fs::read_to_string(dir.join("burst_buffer.conf")).unwrap_or_default();
        let site = Site::read(&text, dir, api.api.as_deref());
        for problem in &site.unreadable {
            checks.push(check(
                false,
                format!("{}: {problem}", dir.join("strata_site.lua").display()),
                "write plain assignments there (NAME = \"value\" or NAME = 123), as the script reads them",
            ));
        }
        checks.extend(site_checks(&site, &bb_conf, api).await);
    } else {
        // Without Slurm's configuration, at least the agent this command was pointed at.
        let client = api_client(api)?;
        checks.push(agent_check(&client).await);
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
