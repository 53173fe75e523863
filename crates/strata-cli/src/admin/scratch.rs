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
    let api = Api::new(&out.api)?;
    match c {
        ScratchCommand::Alloc {
            team,
            bytes: b,
            ttl,
        } => {
            let v = api
                .post(
                    "/v1/scratch",
                    json!({"team": team, "bytes": b.bytes(), "ttl_secs": parse_secs(&ttl)?}),
                )
                .await?;
            emit(&out, &v, |v| {
                println!("{}", text(&v["path"]));
                eprintln!(
                    "scratch {} ({}), expires {}",
                    text(&v["id"]),
                    bytes(&v["bytes"]),
                    when(&v["expires_at"])
                );
            })
        }
        ScratchCommand::Ls => {
            let v = api.get("/v1/scratch").await?;
            emit(&out, &v, |v| {
                table(
                    &["id", "team", "bytes", "path", "expires"],
                    arr(v)
                        .iter()
                        .map(|s| {
                            vec![
                                text(&s["id"]),
                                text(&s["team"]),
                                bytes(&s["bytes"]),
                                text(&s["path"]),
                                when(&s["expires_at"]),
                            ]
                        })
                        .collect(),
                )
            })
        }
        ScratchCommand::Free { id } => {
            let v = api.delete(&format!("/v1/scratch/{}", enc(&id))).await?;
            emit(&out, &v, |_| println!("released {id}"))
        }
    }
}
