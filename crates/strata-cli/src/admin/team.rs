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
    use api::teams as t;
    let api = Api::new(&out.api)?;
    match c {
        TeamCommand::Ls => {
            let v = api.call::<t::ListTeams>(&[], &NoQuery {}, &()).await?;
            show(&out, &v, |v| {
                table(
                    &["team", "created"],
                    v.iter()
                        .map(|t| vec![t.name.clone(), at(Some(t.created_at))])
                        .collect(),
                )
            })
        }
        TeamCommand::Create { name } => {
            let body = t::NewTeam { name: name.clone() };
            let v = api.call::<t::CreateTeam>(&[], &NoQuery {}, &body).await?;
            show(&out, &v, |_| println!("created team {name}"))
        }
        TeamCommand::Rm { name } => {
            let v = api
                .call::<t::DeleteTeam>(&[&name], &NoQuery {}, &())
                .await?;
            show(&out, &v, |_| println!("deleted team {name}"))
        }
        TeamCommand::Members { team } => {
            let v = api
                .call::<t::ListMembers>(&[&team], &NoQuery {}, &())
                .await?;
            show(&out, &v, |v| print_principals(v, Some(&team)))
        }
        TeamCommand::AddMember {
            team,
            principal,
            role,
        } => {
            let body = t::SetRole {
                role: Role::parse(&role)?,
            };
            let v = api
                .call::<t::SetMember>(&[&team, &principal], &NoQuery {}, &body)
                .await?;
            show(&out, &v, |_| println!("{principal} is a {role} of {team}"))
        }
        TeamCommand::RmMember { team, principal } => {
            let v = api
                .call::<t::RemoveMember>(&[&team, &principal], &NoQuery {}, &())
                .await?;
            show(&out, &v, |_| println!("removed {principal} from {team}"))
        }
    }
}
