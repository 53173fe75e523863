//! `strata token`: API tokens and S3 keys of principals.

use super::*;

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

pub async fn run(c: TokenCommand, out: Out) -> Result<()> {
    use api::teams as t;
    let api = Api::new(&out.api)?;
    match c {
        TokenCommand::Create {
            name,
            team,
            role,
            s3,
            admin,
        } => {
            let body = t::NewToken {
                name: name.clone(),
                kind: if s3 {
                    t::PrincipalKind::S3Key
                } else {
                    t::PrincipalKind::Token
                },
                team,
                role: Some(Role::parse(&role)?),
                admin,
            };
            let v = api.call::<t::CreateToken>(&[], &NoQuery {}, &body).await?;
            show(&out, &v, |v| {
                println!("principal {} ({})", v.principal.id, name);
                if let Some(t) = &v.token {
                    println!("token      {t}");
                    println!("(shown once: export STRATA_TOKEN={t})");
                }
                if let Some(k) = &v.access_key {
                    println!("access key {k}");
                    println!("secret key {}", opt(v.secret_key.as_deref()));
                    println!(
                        "(shown once: use them as AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY with the gateway)"
                    );
                }
            })
        }
        TokenCommand::Ls { team } => {
            let q = t::TokensQuery { team: team.clone() };
            let v = api.call::<t::ListTokens>(&[], &q, &()).await?;
            show(&out, &v, |v| print_principals(v, team.as_deref()))
        }
        TokenCommand::Revoke { id } => {
            let v = api.call::<t::RevokeToken>(&[&id], &NoQuery {}, &()).await?;
            show(&out, &v, |_| println!("revoked {id}"))
        }
        TokenCommand::Whoami => {
            let v = api.call::<t::WhoAmI>(&[], &NoQuery {}, &()).await?;
            show(&out, &v, |v| {
                println!(
                    "{} ({}){}",
                    v.id,
                    v.name,
                    if v.is_admin { ", administrator" } else { "" }
                );
                for m in &v.memberships {
                    println!("  {} in {}", m.role.as_str(), m.team);
                }
            })
        }
    }
}
