//! Forecasts of when volumes and quotas fill, and the audit log.

use super::common::*;
use api::admin as adm;

pub(super) async fn forecasts(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
) -> ApiResult<Reply<adm::Forecasts>> {
    let lines = compute_forecasts(&a).await?;
    let visible = p.visible_teams();
    let v: Vec<_> = lines
        .into_iter()
        .filter(|l| {
            let team = l.scope.split('/').next().unwrap_or_default().to_string();
            l.kind == "volume" || visible.as_ref().is_none_or(|v| v.contains(&team))
        })
        .collect();
    reply::<adm::Forecasts>(v)
}

/// Forecast every sampled series (teams' totals against their hard byte limits, volumes against their size).
pub async fn compute_forecasts(a: &Agent) -> Result<Vec<ForecastLine>> {
    let c = &a.config().catalog;
    let now = a.catalog().now();
    let since = now - (c.forecast_window_days as i64) * 86_400;
    let mut out = Vec::new();
    for (kind, scope) in a.catalog().sample_series().await? {
        let samples = a.catalog().samples(&kind, &scope, since).await?;
        let Some(last) = samples.last().copied() else {
            continue;
        };
        let capacity = match kind.as_str() {
            "team" => a.catalog().quota(&scope, TOTAL).await?.limits.hard_bytes,
            "quota" => match scope.split_once('/') {
                Some((t, sc)) => a.catalog().quota(t, sc).await?.limits.hard_bytes,
                None => None,
            },
            _ => last.capacity,
        };
        let mut line = ForecastLine {
            kind: kind.clone(),
            scope: scope.clone(),
            used: last.used,
            capacity,
            forecast: None,
            note: None,
            alert: false,
        };
        match capacity {
            None => line.note = Some("no hard limit: nothing to fill".into()),
            Some(cap) => {
                let pts: Vec<Sample> = samples
                    .iter()
                    .map(|s| Sample {
                        at: s.at,
                        used: s.used as f64,
                    })
                    .collect();
                match forecast::forecast(&pts, cap as f64, now, 0.95) {
                    Ok(f) => {
                        line.alert = f.days_low.is_some_and(|d| d <= c.forecast_alert_days);
                        line.forecast = Some(api::admin::Forecast {
                            slope_per_day: f.slope_per_day,
                            days_until_full: f.days_until_full,
                            days_low: f.days_low,
                            days_high: f.days_high,
                            samples: f.samples,
                            method: f.method.to_string(),
                        });
                    }
                    Err(e) => line.note = Some(e.message().to_string()),
                }
            }
        }
        out.push(line);
    }
    *a.access.forecasts.lock() = out.clone();
    Ok(out)
}

pub(super) async fn audit(
    State(a): State<Arc<Agent>>,
    Extension(p): Authed,
    Query(q): Query<adm::AuditQuery>,
) -> ApiResult<Reply<adm::Audit>> {
    let limit = q.limit.unwrap_or(100).clamp(1, 10_000);
    match q.team {
        Some(t) => {
            p.require(&t, Role::Reader)?;
            reply::<adm::Audit>(wire::all(a.catalog().list_audit(Some(&[t]), limit).await?))
        }
        None if p.is_admin => {
            reply::<adm::Audit>(wire::all(a.catalog().list_audit(None, limit).await?))
        }
        None => reply::<adm::Audit>(wire::all(
            a.catalog()
                .list_audit(p.visible_teams().as_deref(), limit)
                .await?,
        )),
    }
}
