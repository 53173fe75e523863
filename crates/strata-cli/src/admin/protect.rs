//! `strata protect`: protections (pins and claims) clean-up never touches.

use super::*;

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

pub async fn run(c: ProtectCommand, out: Out) -> Result<()> {
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
