//! `strata scratch`: scratch allocations.

use super::*;

#[derive(Debug, Subcommand)]
pub enum ScratchCommand {
    /// Allocate scratch space on this node, charged to the team's `scratch` quota until released or expired.
    Alloc {
        /// Team.
        #[arg(long)]
        team: String,
        /// Size, e.g. 100GiB.
        #[arg(long)]
        bytes: strata_types::ByteSize,
        /// Lifetime: 3600, 12h, 7d.
        #[arg(long, default_value = "1d")]
        ttl: String,
    },
    /// List allocations.
    Ls,
    /// Release an allocation (its files are deleted).
    Free {
        /// Id.
        id: String,
    },
}

pub async fn run(c: ScratchCommand, out: Out) -> Result<()> {
    use api::admin as adm;
    let api = Api::new(&out.api)?;
    match c {
        ScratchCommand::Alloc {
            team,
            bytes: b,
            ttl,
        } => {
            let body = adm::NewScratch {
                team,
                bytes: b.bytes() as i64,
                ttl_secs: parse_secs(&ttl)?,
            };
            let v = api
                .call::<adm::AllocScratch>(&[], &NoQuery {}, &body)
                .await?;
            show(&out, &v, |v| {
                println!("{}", v.path);
                eprintln!(
                    "scratch {} ({}), expires {}",
                    v.id,
                    size(Some(v.bytes)),
                    at(Some(v.expires_at))
                );
            })
        }
        ScratchCommand::Ls => {
            let v = api.call::<adm::ListScratch>(&[], &NoQuery {}, &()).await?;
            show(&out, &v, |v| {
                table(
                    &["id", "team", "bytes", "path", "expires"],
                    v.iter()
                        .map(|s| {
                            vec![
                                s.id.clone(),
                                s.team.clone(),
                                size(Some(s.bytes)),
                                s.path.clone(),
                                at(Some(s.expires_at)),
                            ]
                        })
                        .collect(),
                )
            })
        }
        ScratchCommand::Free { id } => {
            let v = api
                .call::<adm::FreeScratch>(&[&id], &NoQuery {}, &())
                .await?;
            show(&out, &v, |_| println!("released {id}"))
        }
    }
}
