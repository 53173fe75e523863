//! `strata forecast`: when volumes and quotas fill.

use super::*;

pub async fn run(out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let v = api.get("/v1/forecast").await?;
    emit(&out, &v, |v| {
        let days = |x: &Value| match x.as_f64() {
            Some(d) => format!("{d:.1}"),
            None => "never".into(),
        };
        table(
            &[
                "kind",
                "scope",
                "used",
                "capacity",
                "growth/day",
                "days to full",
                "95% interval",
                "alert",
            ],
            arr(v)
                .iter()
                .map(|l| {
                    let f = &l["forecast"];
                    vec![
                        text(&l["kind"]),
                        text(&l["scope"]),
                        bytes(&l["used"]),
                        bytes(&l["capacity"]),
                        if f.is_null() {
                            "-".into()
                        } else {
                            bytes(&json!(f["slope_per_day"].as_f64().unwrap_or(0.0) as i64))
                        },
                        if f.is_null() {
                            text(&l["note"])
                        } else {
                            days(&f["days_until_full"])
                        },
                        if f.is_null() {
                            "-".into()
                        } else {
                            format!("{} .. {}", days(&f["days_low"]), days(&f["days_high"]))
                        },
                        if l["alert"] == true {
                            "ALERT".into()
                        } else {
                            String::new()
                        },
                    ]
                })
                .collect(),
        )
    })
}
