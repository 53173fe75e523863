//! `strata quota`: limits and usage of a team's scopes.

use super::*;

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set a team's limits on a scope (administrators). Sizes like 500GiB; unset limits are unlimited.
    Set {
        /// Team.
        team: String,
        /// A backend name, a created bucket, bucket_root (every bucket the team created, together), cache,
        /// scratch, peer, ckpt, or * for the team's total.
        #[arg(long, default_value = "*")]
        scope: String,
        /// Soft limit on bytes (writes admitted during the grace period).
        #[arg(long)]
        soft_bytes: Option<strata_types::ByteSize>,
        /// Hard limit on bytes.
        #[arg(long)]
        hard_bytes: Option<strata_types::ByteSize>,
        /// Soft limit on objects.
        #[arg(long)]
        soft_objects: Option<i64>,
        /// Hard limit on objects.
        #[arg(long)]
        hard_objects: Option<i64>,
        /// Grace period over a soft limit: 3600, 12h, 7d.
        #[arg(long, default_value = "7d")]
        grace: String,
    },
    /// Show quotas and usage counters (of one team, or every visible team).
    Show {
        /// Team.
        team: Option<String>,
    },
}

fn print_quotas(v: &Value) {
    table(
        &[
            "team",
            "scope",
            "used",
            "reserved",
            "objects",
            "soft",
            "hard",
            "obj hard",
            "status",
            "grace ends",
        ],
        arr(v)
            .iter()
            .map(|q| {
                vec![
                    text(&q["team"]),
                    text(&q["scope"]),
                    bytes(&q["used_bytes"]),
                    bytes(&q["reserved_bytes"]),
                    text(&q["used_objects"]),
                    bytes(&q["limits"]["soft_bytes"]),
                    bytes(&q["limits"]["hard_bytes"]),
                    text(&q["limits"]["hard_objects"]),
                    text(&q["status"]),
                    when(&q["grace_ends_at"]),
                ]
            })
            .collect(),
    )
}

pub async fn run(c: QuotaCommand, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    match c {
        QuotaCommand::Set {
            team,
            scope,
            soft_bytes,
            hard_bytes,
            soft_objects,
            hard_objects,
            grace,
        } => {
            let b = |x: Option<strata_types::ByteSize>| x.map(|b| b.bytes() as i64);
            let v = api
                .put(
                    &format!("/v1/quotas/{}/{}", enc(&team), enc(&scope)),
                    json!({"soft_bytes": b(soft_bytes), "hard_bytes": b(hard_bytes),
                           "soft_objects": soft_objects, "hard_objects": hard_objects,
                           "grace_secs": parse_secs(&grace)?}),
                )
                .await?;
            emit(&out, &v, |v| print_quotas(&Value::Array(vec![v.clone()])))
        }
        QuotaCommand::Show { team } => {
            let path = match &team {
                Some(t) => format!("/v1/quotas/{}", enc(t)),
                None => "/v1/quotas".into(),
            };
            let v = api.get(&path).await?;
            emit(&out, &v, print_quotas)
        }
    }
}
