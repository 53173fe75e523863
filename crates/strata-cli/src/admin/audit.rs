//! `strata audit`: the audit log.

use super::*;

pub async fn run(team: Option<String>, limit: i64, out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let mut path = format!("/v1/audit?limit={limit}");
    if let Some(t) = &team {
        path.push_str(&format!("&team={}", enc(t)));
    }
    let v = api.get(&path).await?;
    emit(&out, &v, |v| {
        table(
            &["when", "principal", "team", "action", "target", "detail"],
            arr(v)
                .iter()
                .map(|a| {
                    vec![
                        when(&a["at"]),
                        text(&a["principal"]),
                        text(&a["team"]),
                        text(&a["action"]),
                        text(&a["target"]),
                        text(&a["detail"]),
                    ]
                })
                .collect(),
        )
    })
}
