//! `strata prefix`: prefix ownership.

use super::*;

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

pub async fn run(c: PrefixCommand, out: Out) -> Result<()> {
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
