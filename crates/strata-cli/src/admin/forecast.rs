//! `strata forecast`: when volumes and quotas fill.

use super::*;

pub async fn run(out: Out) -> Result<()> {
    let api = Api::new(&out.api)?;
    let v = api
        .call::<api::admin::Forecasts>(&[], &NoQuery {}, &())
        .await?;
    show(&out, &v, |v| {
        let days = |x: Option<f64>| match x {
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
            v.iter()
                .map(|l| {
                    let (growth, to_full, interval) = match &l.forecast {
                        None => ("-".into(), opt(l.note.as_deref()), "-".into()),
                        Some(f) => (
                            size(Some(f.slope_per_day as i64)),
                            days(f.days_until_full),
                            format!("{} .. {}", days(f.days_low), days(f.days_high)),
                        ),
                    };
                    vec![
                        l.kind.clone(),
                        l.scope.clone(),
                        size(Some(l.used)),
                        size(l.capacity),
                        growth,
                        to_full,
                        interval,
                        if l.alert {
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
