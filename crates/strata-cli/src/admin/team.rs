//! `strata team`: teams and their members.

use super::*;

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

pub async fn run(c: TeamCommand, out: Out) -> Result<()> {
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
