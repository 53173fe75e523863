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

fn print_quotas(v: &[api::quotas::QuotaState]) {
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
        v.iter()
            .map(|q| {
                vec![
                    q.team.clone(),
                    q.scope.clone(),
                    size(Some(q.used_bytes)),
                    size(Some(q.reserved_bytes)),
                    q.used_objects.to_string(),
                    size(q.limits.soft_bytes),
                    size(q.limits.hard_bytes),
                    num(q.limits.hard_objects),
                    name(&q.status),
                    at(q.grace_ends_at),
                ]
            })
            .collect(),
    )
}

pub async fn run(c: QuotaCommand, out: Out) -> Result<()> {
    use api::quotas as q;
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
            let limits = q::QuotaLimits {
                soft_bytes: b(soft_bytes),
                hard_bytes: b(hard_bytes),
                soft_objects,
                hard_objects,
                grace_secs: parse_secs(&grace)?,
            };
            let v = api
                .call::<q::SetQuota>(&[&team, &scope], &NoQuery {}, &limits)
                .await?;
            show(&out, &v, |v| print_quotas(std::slice::from_ref(v)))
        }
        QuotaCommand::Show { team } => {
            let v = match &team {
                Some(t) => api.call::<q::TeamQuotas>(&[t], &NoQuery {}, &()).await?,
                None => api.call::<q::ListQuotas>(&[], &NoQuery {}, &()).await?,
            };
            show(&out, &v, |v| print_quotas(v))
        }
    }
}
