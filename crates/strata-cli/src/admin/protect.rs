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
    use api::lifecycle::{self as l, ProtectionKind};
    let api = Api::new(&out.api)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let protection = |kind, team, backend, prefix, job, expires_at| l::Protection {
        id: String::new(),
        kind,
        team,
        backend,
        prefix,
        job,
        expires_at,
        created_at: 0,
    };
    match c {
        ProtectCommand::Pin {
            team,
            backend,
            prefix,
        } => {
            let body = protection(
                ProtectionKind::Pin,
                team,
                backend.clone(),
                prefix.clone(),
                None,
                None,
            );
            let v = api
                .call::<l::AddProtection>(&[], &NoQuery {}, &body)
                .await?;
            show(&out, &v, |v| {
                println!("pinned {backend}:{prefix} ({})", v.id)
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
            let body = protection(
                ProtectionKind::Claim,
                team,
                backend.clone(),
                prefix.clone(),
                Some(job.clone()),
                Some(until),
            );
            let v = api
                .call::<l::AddProtection>(&[], &NoQuery {}, &body)
                .await?;
            show(&out, &v, |v| {
                println!("claimed {backend}:{prefix} for {job} ({})", v.id)
            })
        }
        ProtectCommand::Ls => {
            let v = api
                .call::<l::ListProtections>(&[], &NoQuery {}, &())
                .await?;
            show(&out, &v, |v| {
                table(
                    &["id", "kind", "team", "backend", "prefix", "job", "expires"],
                    v.iter()
                        .map(|p| {
                            vec![
                                p.id.clone(),
                                name(&p.kind),
                                p.team.clone(),
                                p.backend.clone(),
                                p.prefix.clone(),
                                opt(p.job.as_deref()),
                                at(p.expires_at),
                            ]
                        })
                        .collect(),
                )
            })
        }
        ProtectCommand::Rm { id } => {
            let v = api
                .call::<l::DeleteProtection>(&[&id], &NoQuery {}, &())
                .await?;
            show(&out, &v, |_| println!("removed {id}"))
        }
    }
}
