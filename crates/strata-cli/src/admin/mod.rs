//! Operator commands: claims, teams, tokens, quotas, usage, prefixes, policies, protections, clean-up, forecasts,
//! scratch and the audit log. Each is a client of the agent's control API; tables by default, `--json` for
//! scripts.

pub mod analytics;
pub mod audit;
pub mod claim;
pub mod cleanup;
pub mod forecast;
pub mod policy;
pub mod prefix;
pub mod protect;
pub mod quota;
pub mod scratch;
pub mod team;
pub mod token;
pub mod usage;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::Value;

use strata_api::{self as api, Endpoint, NoQuery, Payload, Role};

use crate::{ApiArgs, api_client, reached};

/// `--json` and the API location, shared by every operator command.
#[derive(Debug, Args, Clone)]
pub struct Out {
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// Parse `3600`, `90s`, `15m`, `12h`, `7d` into seconds.
pub fn parse_secs(s: &str) -> Result<i64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, 's')) => (&s[..i], 1),
        Some((i, 'm')) => (&s[..i], 60),
        Some((i, 'h')) => (&s[..i], 3600),
        Some((i, 'd')) => (&s[..i], 86_400),
        _ => (s, 1),
    };
    let n: i64 = num
        .parse()
        .with_context(|| format!("{s:?} is not a duration (3600, 90s, 15m, 12h, 7d)"))?;
    Ok(n * mult)
}

struct Api {
    client: strata_client::AgentClient,
}

impl Api {
    fn new(a: &ApiArgs) -> Result<Self> {
        Ok(Self {
            client: api_client(a)?,
        })
    }

    /// Call endpoint `E` of the contract: its typed answer.
    async fn call<E: Endpoint>(
        &self,
        path: &[&str],
        query: &E::Query,
        body: &<E::Request as Payload>::Value,
    ) -> Result<<E::Response as Payload>::Value> {
        self.client
            .call::<E>(path, query, body)
            .await
            .map_err(|e| reached(e, self.client.base()))
    }
}

/// A byte count, human-readable; `-` when absent.
fn size(n: Option<i64>) -> String {
    match n {
        Some(n) if n >= 0 => indicatif::HumanBytes(n as u64).to_string(),
        Some(n) => format!("-{}", indicatif::HumanBytes(n.unsigned_abs())),
        None => "-".into(),
    }
}

/// A time (Unix seconds) relative to now: `in 5m`, `3h ago`; `-` when absent.
fn at(t: Option<i64>) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let d = t - now;
    let (a, unit) = match d.abs() {
        x if x < 120 => (x, "s"),
        x if x < 7200 => (x / 60, "m"),
        x if x < 172_800 => (x / 3600, "h"),
        x => (x / 86_400, "d"),
    };
    if d >= 0 {
        format!("in {a}{unit}")
    } else {
        format!("{a}{unit} ago")
    }
}

/// Print rows as an aligned table.
fn table(headers: &[&str], rows: Vec<Vec<String>>) {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<width$}", width = w[i]))
            .collect();
        println!("{}", s.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect());
    for r in rows {
        line(r);
    }
}

/// Print a typed answer: as JSON with `--json`, else as `render` writes it.
fn show<T: serde::Serialize>(out: &Out, v: &T, render: impl FnOnce(&T)) -> Result<()> {
    if out.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        render(v);
    }
    Ok(())
}

/// An optional text, `-` when absent.
fn opt(v: Option<&str>) -> String {
    v.unwrap_or("-").to_string()
}

/// A number, `-` when absent.
fn num(n: Option<i64>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// An enum as its wire name.
fn name<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "-".into(),
    }
}

fn emit(out: &Out, v: &Value, render: impl FnOnce(&Value)) -> Result<()> {
    if out.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        render(v);
    }
    Ok(())
}

fn print_principals(v: &[api::teams::Principal], team: Option<&str>) {
    table(
        &["id", "name", "kind", "team", "role", "admin", "revoked"],
        v.iter()
            .map(|p| {
                let role = p
                    .memberships
                    .iter()
                    .find(|m| team.is_none_or(|t| m.team == t) && Some(&m.team) == p.team.as_ref())
                    .map_or_else(|| "-".into(), |m| m.role.as_str().to_string());
                vec![
                    p.id.clone(),
                    p.name.clone(),
                    name(&p.kind),
                    opt(p.team.as_deref()),
                    role,
                    p.is_admin.to_string(),
                    at(p.revoked_at),
                ]
            })
            .collect(),
    )
}
