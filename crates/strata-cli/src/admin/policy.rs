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
