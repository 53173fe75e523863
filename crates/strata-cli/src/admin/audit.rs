//! `strata audit`: the audit log.

use super::*;

pub async fn run(team: Option<String>, limit: i64, out: Out) -> Result<()> {
    use api::admin::{Audit, AuditQuery};
    let api = Api::new(&out.api)?;
    let q = AuditQuery {
        team,
        limit: Some(limit),
    };
    let v = api.call::<Audit>(&[], &q, &()).await?;
    show(&out, &v, |v| {
        table(
            &["when", "principal", "team", "action", "target", "detail"],
            v.iter()
                .map(|a| {
                    vec![
                        at(Some(a.at)),
                        a.principal.clone(),
                        opt(a.team.as_deref()),
                        a.action.clone(),
                        a.target.clone(),
                        a.detail.clone(),
                    ]
                })
                .collect(),
        )
    })
}
