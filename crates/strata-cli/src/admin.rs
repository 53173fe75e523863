//! Operator commands: teams, tokens, quotas, usage, prefixes, policies, protections, clean-up, forecasts,
//! scratch and the audit log. Each is a client of the agent's control API; tables by default, `--json` for
//! scripts.

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

#[derive(Debug, Subcommand)]
pub enum TeamCommand {
    /// List the teams you can see.
    Ls,
    /// Create a team (administrators).
    Create {
        /// Name: a-z, 0-9, '.', '_', '-'.
        name: String,
    },
    /// Delete a team that owns nothing (administrators).
    Rm {
        /// Team.
        name: String,
    },
    /// List a team's members.
    Members {
        /// Team.
        team: String,
    },
    /// Add a member to a team, or change its role (team admins).
    AddMember {
        /// Team.
        team: String,
        /// Principal id (`p_...`, see `strata token ls`).
        principal: String,
        /// reader, member or team_admin.
        #[arg(long, default_value = "member")]
        role: String,
    },
    /// Remove a member from a team (team admins).
    RmMember {
        /// Team.
        team: String,
        /// Principal id.
        principal: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create an API bearer token, or with --s3 an S3 access key pair for the gateway. The secret is printed
    /// once and never stored in clear.
    Create {
        /// Who or what holds it.
        #[arg(long)]
        name: String,
        /// Home team: writes are charged to it.
        #[arg(long)]
        team: Option<String>,
        /// reader, member or team_admin.
        #[arg(long, default_value = "member")]
        role: String,
        /// Create an S3 access key instead of a bearer token.
        #[arg(long)]
        s3: bool,
        /// A global administrator (administrators only).
        #[arg(long)]
        admin: bool,
    },
    /// List principals (of a team; all for administrators).
    Ls {
        /// Team.
        #[arg(long)]
        team: Option<String>,
    },
    /// Revoke a principal's credential.
    Revoke {
        /// Principal id.
        id: String,
    },
    /// Who the current token belongs to.
    Whoami,
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set a team's limits on a scope (administrators). Sizes like 500GiB; unset limits are unlimited.
    Set {
        /// Team.
        team: String,
        /// A backend name, cache, scratch, peer, ckpt, or * for the team's total.
        #[arg(long, default_value = "*")]
        scope: String,
        /// Soft limit on bytes (writes admitted during the grace period).
        #[arg(long)]
        soft_bytes: Option<strata_types::ByteSize>,
        /// Hard limit on bytes.
        #[arg(long)]
        hard_bytes: Option<strata_types::ByteSize>,
        /// Soft limit on objects.
        #[arg(long)]
        soft_objects: Option<i64>,
        /// Hard limit on objects.
        #[arg(long)]
        hard_objects: Option<i64>,
        /// Grace period over a soft limit: 3600, 12h, 7d.
        #[arg(long, default_value = "7d")]
        grace: String,
    },
    /// Show quotas and usage counters (of one team, or every visible team).
    Show {
        /// Team.
        team: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum UsageCommand {
    /// List a backend completely and correct the inventory and every team's usage on it (administrators).
    Reconcile {
        /// Backend name.
        backend: String,
        /// For a local-directory backend: scan its tree in parallel (per project = top-level directory,
        /// charged to the team owning it) instead of listing it object by object.
        #[arg(long)]
        posix: bool,
    },
    /// Scan a POSIX directory tree in parallel: usage per owner (uid) and per project (top-level directory),
    /// like a parallel file system's project quota. Runs locally, no agent needed.
    Scan {
        /// Root directory.
        path: std::path::PathBuf,
        /// Worker threads (0 = one per core).
        #[arg(long, default_value_t = 0)]
        threads: usize,
        /// Path components below the root that name a project.
        #[arg(long, default_value_t = 1)]
        project_depth: usize,
        /// Also descend into other file systems.
        #[arg(long)]
        cross_devices: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PrefixCommand {
    /// Give a prefix of a backend to a team: its keys are the team's (access, attribution, quotas).
    Own {
        /// Backend name.
        backend: String,
        /// Prefix (literal; `team-a` covers `team-a/...` only, never `team-ab/...`).
        prefix: String,
        /// Team.
        team: String,
    },
    /// List owned prefixes.
    Ls,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Add a retention policy (team admins).
    Add {
        /// Team whose data it applies to (only that team's objects are ever selected).
        #[arg(long)]
        team: String,
        /// Backend name.
        #[arg(long)]
        backend: String,
        /// ttl (age since written), stale (not read for), keep_last (checkpoints per run).
        #[arg(long)]
        kind: String,
        /// Key prefix.
        #[arg(long)]
        prefix: Option<String>,
        /// Or a label: dataset:NAME or job:ID.
        #[arg(long)]
        label: Option<String>,
        /// Age for ttl and stale: 3600, 12h, 30d.
        #[arg(long)]
        age: Option<String>,
        /// Checkpoints to keep for keep_last.
        #[arg(long)]
        keep: Option<i64>,
    },
    /// List policies.
    Ls,
    /// Delete a policy.
    Rm {
        /// Policy id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProtectCommand {
    /// Pin a key or prefix: clean-up never touches it.
    Pin {
        /// Team.
        #[arg(long)]
        team: String,
        /// Backend name.
        #[arg(long)]
        backend: String,
        /// Key, or prefix ending with '/'.
        prefix: String,
    },
    /// Claim a key or prefix for a job until an expiry: clean-up never touches it meanwhile.
    Claim {
        /// Team.
        #[arg(long)]
        team: String,
        /// Backend name.
        #[arg(long)]
        backend: String,
        /// Job id.
        #[arg(long)]
        job: String,
        /// How long: 3600, 12h, 7d.
        #[arg(long)]
        r#for: String,
        /// Key, or prefix ending with '/'.
        prefix: String,
    },
    /// List pins and claims.
    Ls,
    /// Remove a pin or claim.
    Rm {
        /// Id.
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CleanupCommand {
    /// Plan a clean-up from the retention policies: a dry run that lists what would go (objects, bytes, per
    /// team) and deletes nothing.
    Plan {
        /// Only this team's policies (required unless you are an administrator).
        #[arg(long)]
        team: Option<String>,
    },
    /// Execute a plan: each item is re-checked (skipped if changed, read or protected since), moved to the
    /// trash, and audited. Caps stop the run; run again to continue.
    Run {
        /// Plan id.
        plan: String,
        /// Most items moved by this plan.
        #[arg(long)]
        max_objects: Option<u64>,
        /// Most bytes moved by this plan.
        #[arg(long)]
        max_bytes: Option<strata_types::ByteSize>,
        /// Most percent of a team's data moved.
        #[arg(long)]
        max_team_percent: Option<f64>,
    },
    /// Put a plan's trashed items back (all, or those under a key prefix).
    Restore {
        /// Plan id.
        plan: String,
        /// Only keys starting with this.
        #[arg(long)]
        key_prefix: Option<String>,
    },
    /// Show a plan and its items.
    Show {
        /// Plan id.
        plan: String,
    },
    /// List plans.
    Ls,
    /// Delete trash older than the grace period (administrators).
    Purge {
        /// Grace period in seconds (default: the agent's catalog.trash_grace_secs).
        #[arg(long)]
        grace: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ScratchCommand {
    /// Allocate scratch space on this node, charged to the team's `scratch` quota until released or expired.
    Alloc {
        /// Team.
        #[arg(long)]
        team: String,
        /// Size, e.g. 100GiB.
        #[arg(long)]
        bytes: strata_types::ByteSize,
        /// Lifetime: 3600, 12h, 7d.
        #[arg(long, default_value = "1d")]
        ttl: String,
    },
    /// List allocations.
    Ls,
    /// Release an allocation (its files are deleted).
    Free {
        /// Id.
        id: String,
    },
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

pub async fn team(c: TeamCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        TeamCommand::Ls => {
            let v = api.get("/v1/teams").await?;
            emit(&out, &v, |v| {
                table(
                    &["team", "created"],
                    arr(v)
                        .iter()
                        .map(|t| vec![text(&t["name"]), when(&t["created_at"])])
                        .collect(),
                )
            })
        }
        TeamCommand::Create { name } => {
            let v = api.post("/v1/teams", json!({"name": name})).await?;
            emit(&out, &v, |_| println!("created team {name}"))
        }
        TeamCommand::Rm { name } => {
            let v = api.delete(&format!("/v1/teams/{}", enc(&name))).await?;
            emit(&out, &v, |_| println!("deleted team {name}"))
        }
        TeamCommand::Members { team } => {
            let v = api
                .get(&format!("/v1/teams/{}/members", enc(&team)))
                .await?;
            emit(&out, &v, |v| print_principals(v, Some(&team)))
        }
        TeamCommand::AddMember {
            team,
            principal,
            role,
        } => {
            let v = api
                .put(
                    &format!("/v1/teams/{}/members/{}", enc(&team), enc(&principal)),
                    json!({"role": role}),
                )
                .await?;
            emit(&out, &v, |_| println!("{principal} is a {role} of {team}"))
        }
        TeamCommand::RmMember { team, principal } => {
            let v = api
                .delete(&format!(
                    "/v1/teams/{}/members/{}",
                    enc(&team),
                    enc(&principal)
                ))
                .await?;
            emit(&out, &v, |_| println!("removed {principal} from {team}"))
        }
    }
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

pub async fn token(c: TokenCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        TokenCommand::Create {
            name,
            team,
            role,
            s3,
            admin,
        } => {
            let v = api
                .post(
                    "/v1/tokens",
                    json!({"name": name, "kind": if s3 { "s3_key" } else { "token" }, "team": team,
                           "role": role, "admin": admin}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("principal {} ({})", text(&v["principal"]["id"]), name);
                if let Some(t) = v["token"].as_str() {
                    println!("token      {t}");
                    println!("(shown once: export STRATA_TOKEN={t})");
                }
                if let Some(k) = v["access_key"].as_str() {
                    println!("access key {k}");
                    println!("secret key {}", text(&v["secret_key"]));
                    println!(
                        "(shown once: use them as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY with the gateway)"
                    );
                }
            })
        }
        TokenCommand::Ls { team } => {
            let path = match &team {
                Some(t) => format!("/v1/tokens?team={}", enc(t)),
                None => "/v1/tokens".into(),
            };
            let v = api.get(&path).await?;
            emit(&out, &v, |v| print_principals(v, team.as_deref()))
        }
        TokenCommand::Revoke { id } => {
            let v = api.delete(&format!("/v1/tokens/{}", enc(&id))).await?;
            emit(&out, &v, |_| println!("revoked {id}"))
        }
        TokenCommand::Whoami => {
            let v = api.get("/v1/whoami").await?;
            emit(&out, &v, |v| {
                println!(
                    "{} ({}){}",
                    text(&v["id"]),
                    text(&v["name"]),
                    if v["is_admin"] == true {
                        ", administrator"
                    } else {
                        ""
                    }
                );
                for m in arr(&v["memberships"]) {
                    println!("  {} in {}", text(&m["role"]), text(&m["team"]));
                }
            })
        }
    }
}

fn print_quotas(v: &Value) {
    table(
        &[
            "team",
            "scope",
            "used",
            "reserved",
            "objects",
            "soft",
            "hard",
            "obj hard",
            "status",
            "grace ends",
        ],
        arr(v)
            .iter()
            .map(|q| {
                vec![
                    text(&q["team"]),
                    text(&q["scope"]),
                    bytes(&q["used_bytes"]),
                    bytes(&q["reserved_bytes"]),
                    text(&q["used_objects"]),
                    bytes(&q["limits"]["soft_bytes"]),
                    bytes(&q["limits"]["hard_bytes"]),
                    text(&q["limits"]["hard_objects"]),
                    text(&q["status"]),
                    when(&q["grace_ends_at"]),
                ]
            })
            .collect(),
    )
}

pub async fn quota(c: QuotaCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        QuotaCommand::Set {
            team,
            scope,
            soft_bytes,
            hard_bytes,
            soft_objects,
            hard_objects,
            grace,
        } => {
            let b = |x: Option<strata_types::ByteSize>| x.map(|b| b.bytes() as i64);
            let v = api
                .put(
                    &format!("/v1/quotas/{}/{}", enc(&team), enc(&scope)),
                    json!({"soft_bytes": b(soft_bytes), "hard_bytes": b(hard_bytes),
                           "soft_objects": soft_objects, "hard_objects": hard_objects,
                           "grace_secs": parse_secs(&grace)?}),
                )
                .await?;
            emit(&out, &v, |v| print_quotas(&Value::Array(vec![v.clone()])))
        }
        QuotaCommand::Show { team } => {
            let path = match &team {
                Some(t) => format!("/v1/quotas/{}", enc(t)),
                None => "/v1/quotas".into(),
            };
            let v = api.get(&path).await?;
            emit(&out, &v, print_quotas)
        }
    }
}

pub async fn usage(by: String, sub: Option<UsageCommand>, out: Out) -> Result<()> {
    match sub {
        Some(UsageCommand::Scan {
            path,
            threads,
            project_depth,
            cross_devices,
        }) => {
            let opts = strata_quota::scan::ScanOptions {
                threads,
                one_file_system: !cross_devices,
                project_depth,
            };
            let started = std::time::Instant::now();
            let r = tokio::task::spawn_blocking(move || strata_quota::scan::scan(&path, &opts))
                .await??;
            let v = serde_json::to_value(&r)?;
            return emit(&out, &v, |_| {
                println!(
                    "{} in {} files, {} directories ({} apparent), scanned in {:.2} s",
                    indicatif::HumanBytes(r.total.bytes),
                    r.total.files,
                    r.total.dirs,
                    indicatif::HumanBytes(r.total.apparent_bytes),
                    started.elapsed().as_secs_f64()
                );
                let rows =
                    |m: Vec<(String, &strata_quota::scan::UsageTotals)>| -> Vec<Vec<String>> {
                        m.into_iter()
                            .map(|(k, t)| {
                                vec![
                                    k,
                                    indicatif::HumanBytes(t.bytes).to_string(),
                                    t.files.to_string(),
                                    t.dirs.to_string(),
                                ]
                            })
                            .collect()
                    };
                table(
                    &["owner uid", "bytes", "files", "dirs"],
                    rows(r.by_owner.iter().map(|(k, t)| (k.to_string(), t)).collect()),
                );
                table(
                    &["project", "bytes", "files", "dirs"],
                    rows(r.by_project.iter().map(|(k, t)| (k.clone(), t)).collect()),
                );
                if r.errors_total > 0 {
                    eprintln!("{} entries could not be read, e.g.:", r.errors_total);
                    for e in r.errors.iter().take(5) {
                        eprintln!("  {e}");
                    }
                }
            });
        }
        Some(UsageCommand::Reconcile {
            backend,
            posix: true,
        }) => {
            let api = Api::new(&out.api)?;
            let v = api
                .post("/v1/usage/scan", json!({"backend": backend}))
                .await?;
            return emit(&out, &v, |v| {
                println!(
                    "{backend}: {} files ({}) scanned in {:.2} s",
                    text(&v["total"]["files"]),
                    bytes(&v["total"]["file_bytes"]),
                    v["secs"].as_f64().unwrap_or(0.0)
                );
                if let Some(t) = v["teams"].as_object() {
                    table(
                        &["team", "bytes", "files"],
                        t.iter()
                            .map(|(k, x)| vec![k.clone(), bytes(&x[0]), text(&x[1])])
                            .collect(),
                    );
                }
            });
        }
        Some(UsageCommand::Reconcile { backend, .. }) => {
            let api = Api::new(&out.api)?;
            let v = api
                .post("/v1/usage/reconcile", json!({"backend": backend}))
                .await?;
            return emit(&out, &v, |v| {
                println!(
                    "{backend}: {} objects ({}) listed in {:.2} s; {} added, {} updated, {} removed",
                    text(&v["listed"]),
                    bytes(&v["listed_bytes"]),
                    v["list_secs"].as_f64().unwrap_or(0.0),
                    text(&v["added"]),
                    text(&v["updated"]),
                    text(&v["removed"])
                );
            });
        }
        None => {}
    }
    let api = Api::new(&out.api)?;
    let v = api.get(&format!("/v1/usage?by={}", enc(&by))).await?;
    emit(&out, &v, |v| {
        let headers: &[&str] = if by == "team" {
            &["team", "bytes", "objects"]
        } else {
            &[by.as_str(), "team", "bytes", "objects"]
        };
        table(
            headers,
            arr(v)
                .iter()
                .map(|l| {
                    let group = if l["group"] == "" {
                        "(none)".into()
                    } else {
                        text(&l["group"])
                    };
                    let mut row = vec![
                        group,
                        text(&l["team"]),
                        bytes(&l["bytes"]),
                        text(&l["objects"]),
                    ];
                    if by == "team" {
                        row.remove(1);
                    }
                    row
                })
                .collect(),
        )
    })
}

pub async fn prefix(c: PrefixCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        PrefixCommand::Own {
            backend,
            prefix,
            team,
        } => {
            let v = api
                .put(
                    "/v1/prefixes",
                    json!({"backend": backend, "prefix": prefix, "team": team}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("{}:{} belongs to {team}", backend, text(&v["prefix"]))
            })
        }
        PrefixCommand::Ls => {
            let v = api.get("/v1/prefixes").await?;
            emit(&out, &v, |v| {
                table(
                    &["backend", "prefix", "team"],
                    arr(v)
                        .iter()
                        .map(|p| vec![text(&p["backend"]), text(&p["prefix"]), text(&p["team"])])
                        .collect(),
                )
            })
        }
    }
}

pub async fn policy(c: PolicyCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        PolicyCommand::Add {
            team,
            backend,
            kind,
            prefix,
            label,
            age,
            keep,
        } => {
            let age = age.as_deref().map(parse_secs).transpose()?;
            let v = api
                .post(
                    "/v1/policies",
                    json!({"team": team, "backend": backend, "kind": kind, "prefix": prefix,
                           "label": label, "age_secs": age, "keep_last": keep}),
                )
                .await?;
            emit(&out, &v, |v| println!("added policy {}", text(&v["id"])))
        }
        PolicyCommand::Ls => {
            let v = api.get("/v1/policies").await?;
            emit(&out, &v, |v| {
                table(
                    &[
                        "id", "team", "backend", "kind", "selects", "age (s)", "keep",
                    ],
                    arr(v)
                        .iter()
                        .map(|p| {
                            vec![
                                text(&p["id"]),
                                text(&p["team"]),
                                text(&p["backend"]),
                                text(&p["kind"]),
                                if p["prefix"].is_null() {
                                    text(&p["label"])
                                } else {
                                    text(&p["prefix"])
                                },
                                text(&p["age_secs"]),
                                text(&p["keep_last"]),
                            ]
                        })
                        .collect(),
                )
            })
        }
        PolicyCommand::Rm { id } => {
            let v = api.delete(&format!("/v1/policies/{}", enc(&id))).await?;
            emit(&out, &v, |_| println!("deleted policy {id}"))
        }
    }
}

pub async fn protect(c: ProtectCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    match c {
        ProtectCommand::Pin {
            team,
            backend,
            prefix,
        } => {
            let v = api
                .post(
                    "/v1/protections",
                    json!({"kind": "pin", "team": team, "backend": backend, "prefix": prefix,
                           "job": null, "expires_at": null}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("pinned {backend}:{prefix} ({})", text(&v["id"]))
            })
        }
        ProtectCommand::Claim {
            team,
            backend,
            job,
            r#for,
            prefix,
        } => {
            let until = now + parse_secs(&r#for)?;
            let v = api
                .post(
                    "/v1/protections",
                    json!({"kind": "claim", "team": team, "backend": backend, "prefix": prefix,
                           "job": job, "expires_at": until}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("claimed {backend}:{prefix} for {job} ({})", text(&v["id"]))
            })
        }
        ProtectCommand::Ls => {
            let v = api.get("/v1/protections").await?;
            emit(&out, &v, |v| {
                table(
                    &["id", "kind", "team", "backend", "prefix", "job", "expires"],
                    arr(v)
                        .iter()
                        .map(|p| {
                            vec![
                                text(&p["id"]),
                                text(&p["kind"]),
                                text(&p["team"]),
                                text(&p["backend"]),
                                text(&p["prefix"]),
                                text(&p["job"]),
                                when(&p["expires_at"]),
                            ]
                        })
                        .collect(),
                )
            })
        }
        ProtectCommand::Rm { id } => {
            let v = api.delete(&format!("/v1/protections/{}", enc(&id))).await?;
            emit(&out, &v, |_| println!("removed {id}"))
        }
    }
}

fn print_plan(plan: &Value, items: &[Value]) {
    println!(
        "plan {}  team {}  status {}  made {} by {}",
        text(&plan["id"]),
        text(&plan["team"]),
        text(&plan["status"]),
        when(&plan["created_at"]),
        text(&plan["created_by"])
    );
    let mut per_team: std::collections::BTreeMap<String, (u64, i64)> = Default::default();
    for i in items {
        let e = per_team.entry(text(&i["team"])).or_default();
        e.0 += 1;
        e.1 += i["size"].as_i64().unwrap_or(0);
    }
    for (t, (n, b)) in &per_team {
        println!("  team {t}: {n} objects, {}", bytes(&json!(b)));
    }
    table(
        &["state", "backend", "key", "size", "reason"],
        items
            .iter()
            .map(|i| {
                vec![
                    text(&i["state"]),
                    text(&i["backend"]),
                    text(&i["key"]),
                    bytes(&i["size"]),
                    text(&i["reason"]),
                ]
            })
            .collect(),
    );
}

pub async fn cleanup(c: CleanupCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        CleanupCommand::Plan { team } => {
            let v = api.post("/v1/cleanup/plans", json!({"team": team})).await?;
            emit(&out, &v, |v| {
                print_plan(&v["plan"], &arr(&v["items"]));
                println!(
                    "{} protected objects left out. Nothing was deleted: `strata cleanup run {}` executes the plan.",
                    text(&v["protected"]),
                    text(&v["plan"]["id"])
                );
            })
        }
        CleanupCommand::Run {
            plan,
            max_objects,
            max_bytes,
            max_team_percent,
        } => {
            let v = api
                .post(
                    &format!("/v1/cleanup/plans/{}/run", enc(&plan)),
                    json!({"max_objects": max_objects, "max_bytes": max_bytes.map(|b| b.bytes()),
                           "max_team_percent": max_team_percent}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!(
                    "{}: moved {} objects ({}) to the trash; {} skipped, {} deferred by caps",
                    text(&v["status"]),
                    text(&v["trashed"]),
                    bytes(&v["trashed_bytes"]),
                    arr(&v["skipped"]).len(),
                    text(&v["deferred"])
                );
                for s in arr(&v["skipped"]) {
                    println!("  skipped {}: {}", text(&s[0]), text(&s[1]));
                }
            })
        }
        CleanupCommand::Restore { plan, key_prefix } => {
            let v = api
                .post(
                    &format!("/v1/cleanup/plans/{}/restore", enc(&plan)),
                    json!({"key_prefix": key_prefix}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("restored {} objects", text(&v["restored"]));
                for r in arr(&v["refused"]) {
                    println!("  not restored {}: {}", text(&r[0]), text(&r[1]));
                }
            })
        }
        CleanupCommand::Show { plan } => {
            let v = api
                .get(&format!("/v1/cleanup/plans/{}", enc(&plan)))
                .await?;
            emit(&out, &v, |v| print_plan(&v["plan"], &arr(&v["items"])))
        }
        CleanupCommand::Ls => {
            let v = api.get("/v1/cleanup/plans").await?;
            emit(&out, &v, |v| {
                table(
                    &["plan", "team", "status", "made", "by"],
                    arr(v)
                        .iter()
                        .map(|p| {
                            vec![
                                text(&p["id"]),
                                text(&p["team"]),
                                text(&p["status"]),
                                when(&p["created_at"]),
                                text(&p["created_by"]),
                            ]
                        })
                        .collect(),
                )
            })
        }
        CleanupCommand::Purge { grace } => {
            let grace = grace.as_deref().map(parse_secs).transpose()?;
            let v = api
                .post("/v1/cleanup/purge", json!({"grace_secs": grace}))
                .await?;
            emit(&out, &v, |v| {
                println!(
                    "purged {} trashed objects ({})",
                    text(&v["purged"]),
                    bytes(&v["bytes"])
                )
            })
        }
    }
}

pub async fn forecast(out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let v = api.get("/v1/forecast").await?;
    emit(&out, &v, |v| {
        let days = |x: &Value| match x.as_f64() {
            Some(d) => format!("{d:.1}"),
            None => "never".into(),
        };
        table(
            &[
                "kind",
                "scope",
                "used",
                "capacity",
                "growth/day",
                "days to full",
                "95% interval",
                "alert",
            ],
            arr(v)
                .iter()
                .map(|l| {
                    let f = &l["forecast"];
                    vec![
                        text(&l["kind"]),
                        text(&l["scope"]),
                        bytes(&l["used"]),
                        bytes(&l["capacity"]),
                        if f.is_null() {
                            "-".into()
                        } else {
                            bytes(&json!(f["slope_per_day"].as_f64().unwrap_or(0.0) as i64))
                        },
                        if f.is_null() {
                            text(&l["note"])
                        } else {
                            days(&f["days_until_full"])
                        },
                        if f.is_null() {
                            "-".into()
                        } else {
                            format!("{} .. {}", days(&f["days_low"]), days(&f["days_high"]))
                        },
                        if l["alert"] == true {
                            "ALERT".into()
                        } else {
                            String::new()
                        },
                    ]
                })
                .collect(),
        )
    })
}

pub async fn audit(team: Option<String>, limit: i64, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let mut path = format!("/v1/audit?limit={limit}");
    if let Some(t) = &team {
        path.push_str(&format!("&team={}", enc(t)));
    }
    let v = api.get(&path).await?;
    emit(&out, &v, |v| {
        table(
            &["when", "principal", "team", "action", "target", "detail"],
            arr(v)
                .iter()
                .map(|a| {
                    vec![
                        when(&a["at"]),
                        text(&a["principal"]),
                        text(&a["team"]),
                        text(&a["action"]),
                        text(&a["target"]),
                        text(&a["detail"]),
                    ]
                })
                .collect(),
        )
    })
}

pub async fn scratch(c: ScratchCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        ScratchCommand::Alloc {
            team,
            bytes: b,
            ttl,
        } => {
            let v = api
                .post(
                    "/v1/scratch",
                    json!({"team": team, "bytes": b.bytes(), "ttl_secs": parse_secs(&ttl)?}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("{}", text(&v["path"]));
                eprintln!(
                    "scratch {} ({}), expires {}",
                    text(&v["id"]),
                    bytes(&v["bytes"]),
                    when(&v["expires_at"])
                );
            })
        }
        ScratchCommand::Ls => {
            let v = api.get("/v1/scratch").await?;
            emit(&out, &v, |v| {
                table(
                    &["id", "team", "bytes", "path", "expires"],
                    arr(v)
                        .iter()
                        .map(|s| {
                            vec![
                                text(&s["id"]),
                                text(&s["team"]),
                                bytes(&s["bytes"]),
                                text(&s["path"]),
                                when(&s["expires_at"]),
                            ]
                        })
                        .collect(),
                )
            })
        }
        ScratchCommand::Free { id } => {
            let v = api.delete(&format!("/v1/scratch/{}", enc(&id))).await?;
            emit(&out, &v, |_| println!("released {id}"))
        }
    }
}

/// Refuse obviously wrong combinations early (clap cannot express them all).
pub fn sanity(by: &str) -> Result<()> {
    if !matches!(by, "team" | "prefix" | "job" | "dataset") {
        bail!("--by must be team, prefix, job or dataset");
    }
    Ok(())
}
