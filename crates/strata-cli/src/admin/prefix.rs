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
    use api::usage::{ListPrefixes, OwnedPrefix, SetPrefix};
    let api = Api::new(&out.api)?;
    match c {
        PrefixCommand::Own {
            backend,
            prefix,
            team,
        } => {
            let body = OwnedPrefix {
                backend: backend.clone(),
                prefix,
                team: team.clone(),
            };
            let v = api.call::<SetPrefix>(&[], &NoQuery {}, &body).await?;
            show(&out, &v, |v| {
                println!("{}:{} belongs to {team}", backend, v.prefix)
            })
        }
        PrefixCommand::Ls => {
            let v = api.call::<ListPrefixes>(&[], &NoQuery {}, &()).await?;
            show(&out, &v, |v| {
                table(
                    &["backend", "prefix", "team"],
                    v.iter()
                        .map(|p| vec![p.backend.clone(), p.prefix.clone(), p.team.clone()])
                        .collect(),
                )
            })
        }
    }
}
