//! Operator commands: claims, teams, tokens, quotas, usage, prefixes, policies, protections, clean-up, forecasts,
//! scratch and the audit log. Each is a client of the agent's control API; tables by default, `--json` for
//! scripts.

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
use serde_json::{Value, json};

use strata_client::Method;

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

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        self.client
            .json(method, path, body.as_ref())
            .await
            .map_err(|e| reached(e, self.client.base()))
    }
    async fn get(&self, path: &str) -> Result<Value> {
        self.call(Method::GET, path, None).await
    }
    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.call(Method::POST, path, Some(body)).await
    }
    async fn put(&self, path: &str, body: Value) -> Result<Value> {
        self.call(Method::PUT, path, Some(body)).await
    }
    async fn delete(&self, path: &str) -> Result<Value> {
        self.call(Method::DELETE, path, None).await
    }
}

use strata_types::encode_segment as enc;

fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn bytes(v: &Value) -> String {
    match v.as_i64() {
        Some(n) if n >= 0 => indicatif::HumanBytes(n as u64).to_string(),
        Some(n) => format!("-{}", indicatif::HumanBytes(n.unsigned_abs())),
        None => "-".into(),
    }
}

fn when(v: &Value) -> String {
    match v.as_i64() {
        Some(t) => {
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
        None => "-".into(),
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

fn emit(out: &Out, v: &Value, render: impl FnOnce(&Value)) -> Result<()> {
    if out.json {
        println!("{}", serde_json::to_string_pretty(v)?);
    } else {
        render(v);
    }
    Ok(())
}

fn arr(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

fn print_principals(v: &Value, team: Option<&str>) {
    table(
        &["id", "name", "kind", "team", "role", "admin", "revoked"],
        arr(v)
            .iter()
            .map(|p| {
                let role = arr(&p["memberships"])
                    .iter()
                    .find(|m| team.is_none_or(|t| m["team"] == t) && m["team"] == p["team"])
                    .map(|m| text(&m["role"]))
                    .unwrap_or_else(|| "-".into());
                vec![
                    text(&p["id"]),
                    text(&p["name"]),
                    text(&p["kind"]),
                    text(&p["team"]),
                    role,
                    text(&p["is_admin"]),
                    when(&p["revoked_at"]),
                ]
            })
            .collect(),
    )
}
