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
