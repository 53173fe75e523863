//! `strata policy`: retention policies.

use super::*;

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

pub async fn run(c: PolicyCommand, out: Out) -> Result<()> {
    use api::lifecycle as l;
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
            let kind: l::PolicyKind = serde_json::from_value(Value::String(kind.clone()))
                .with_context(|| {
                    format!("policy kind {kind:?}: expected ttl, stale or keep_last")
                })?;
            let body = l::Policy {
                id: String::new(),
                team,
                backend,
                kind,
                prefix,
                label,
                age_secs: age,
                keep_last: keep,
                created_at: 0,
            };
            let v = api.call::<l::AddPolicy>(&[], &NoQuery {}, &body).await?;
            show(&out, &v, |v| println!("added policy {}", v.id))
        }
        PolicyCommand::Ls => {
            let v = api.call::<l::ListPolicies>(&[], &NoQuery {}, &()).await?;
            show(&out, &v, |v| {
                table(
                    &[
                        "id", "team", "backend", "kind", "selects", "age (s)", "keep",
                    ],
                    v.iter()
                        .map(|p| {
                            vec![
                                p.id.clone(),
                                p.team.clone(),
                                p.backend.clone(),
                                name(&p.kind),
                                opt(p.prefix.as_deref().or(p.label.as_deref())),
                                num(p.age_secs),
                                num(p.keep_last),
                            ]
                        })
                        .collect(),
                )
            })
        }
        PolicyCommand::Rm { id } => {
            let v = api
                .call::<l::DeletePolicy>(&[&id], &NoQuery {}, &())
                .await?;
            show(&out, &v, |_| println!("deleted policy {id}"))
        }
    }
}
