//! Capacity forecasting: when will a volume (or a quota) fill up, and how sure are we?
//!
//! # Model
//!
//! The forecast fits an ordinary least squares (OLS) straight line to `(time, used bytes)` samples and
//! extrapolates it to the capacity. The uncertainty comes from the classical *prediction interval* for a new
//! observation at time `t`:
//!
//! ```text
//! ŷ(t) ± q · s · sqrt(1 + 1/n + (t − t̄)² / Sxx)
//! ```
//!
//! where `s` is the residual standard error (n − 2 degrees of freedom), `Sxx = Σ (tᵢ − t̄)²` and `q` the
//! Student-t quantile for the requested two-sided confidence. The earliest plausible fill time is where the
//! upper band first reaches the capacity, the latest where the lower band does. Both are found numerically
//! (bracketing and bisection on `t`), because the bands are curved: a closed form for the line would not
//! describe them, and with a shrinking trend the upper band can still turn up and reach the capacity.
//!
//! # Why linear OLS and not Holt's method
//!
//! * Between clean-ups, usage of a scratch or project volume grows close to linearly (jobs write at a
//!   roughly steady rate); a clean-up is a step down that starts a new linear segment. Callers feed the
//!   samples since the last clean-up, and a line is the right shape for that window.
//! * The OLS prediction interval is well defined, has exact coverage under the textbook assumptions
//!   (independent Gaussian residuals around a line), and is therefore testable: the tests check its
//!   empirical coverage on synthetic series over many seeds.
//! * Holt's linear exponential smoothing needs two smoothing parameters (level and trend) that must be tuned
//!   or fitted per series, and it has no closed-form prediction interval without further model assumptions
//!   (the ETS state-space view or simulation). It reacts faster to a change of rate, but that is also what
//!   makes its fill-date estimate jumpy on noisy usage data.

use serde::Serialize;
use strata_types::{Error, Result};

/// Seconds in a day; slopes and fill times are reported per day.
const DAY: f64 = 86_400.0;

/// How far ahead the forecast looks: a fill time beyond this (100 years, in days) is reported as "never".
pub const HORIZON_DAYS: f64 = 36_525.0;

/// One observation of used space.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Sample {
    /// When the observation was taken, in Unix seconds.
    pub at: i64,
    /// Used space at that time, in bytes.
    pub used: f64,
}

/// The result of [`forecast`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    /// Fitted growth rate, in bytes per day (negative when usage shrinks).
    pub slope_per_day: f64,
    /// Point estimate of the fill time, in days from `now`: where the fitted line reaches the capacity. `Some(0.0)`
    /// when the line is already at or above the capacity at `now`; `None` when usage is not growing or the line
    /// reaches the capacity only after [`HORIZON_DAYS`].
    pub days_until_full: Option<f64>,
    /// Earliest plausible fill time, in days from `now`: the first time at or after `now` where the upper
    /// prediction band reaches the capacity. `None` when even the upper band stays below the capacity within
    /// [`HORIZON_DAYS`].
    pub days_low: Option<f64>,
    /// Latest plausible fill time, in days from `now`: the first time at or after `now` where the lower
    /// prediction band reaches the capacity. `None` means the volume may never fill (not within
    /// [`HORIZON_DAYS`]).
    pub days_high: Option<f64>,
    /// Number of samples the fit used.
    pub samples: usize,
    /// The method, for reports: always `"ols_linear"` for now.
    pub method: &'static str,
}

/// Forecast when usage reaches `capacity` (bytes), seen from `now` (Unix seconds), with a two-sided
/// prediction interval at `confidence` (for example `0.95`).
///
/// See the [module documentation](self) for the model. Sample order does not matter.
///
/// # Errors
///
/// [`ErrorKind::InvalidInput`](strata_types::ErrorKind::InvalidInput) when there are fewer than 3 samples,
/// a value is not finite, `confidence` is not strictly between 0 and 1, `capacity` is not positive, or all
/// samples were taken at the same time.
pub fn forecast(samples: &[Sample], capacity: f64, now: i64, confidence: f64) -> Result<Forecast> {
    let n = samples.len();
    if n < 3 {
        return Err(Error::invalid_input(format!(
            "a forecast needs at least 3 samples, got {n}"
        )));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(Error::invalid_input(format!(
            "confidence must be in (0, 1), got {confidence}"
        )));
    }
    if !(capacity.is_finite() && capacity > 0.0) {
        return Err(Error::invalid_input(format!(
            "capacity must be positive and finite, got {capacity}"
        )));
    }
    if let Some(bad) = samples.iter().find(|s| !s.used.is_finite()) {
        return Err(Error::invalid_input(format!(
            "sample at {} has a non-finite value {}",
            bad.at, bad.used
        )));
    }

    // Work in days relative to the first sample: Unix seconds squared would lose precision.
    let origin = samples[0].at;
    let days = |at: i64| (i128::from(at) - i128::from(origin)) as f64 / DAY;
    let nf = n as f64;
    let x_mean = samples.iter().map(|s| days(s.at)).sum::<f64>() / nf;
    let y_mean = samples.iter().map(|s| s.used).sum::<f64>() / nf;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for s in samples {
        let dx = days(s.at) - x_mean;
        sxx += dx * dx;
        sxy += dx * (s.used - y_mean);
    }
    if sxx <= 0.0 {
        return Err(Error::invalid_input(
            "all samples were taken at the same time: no trend can be fitted",
        ));
    }
    let slope = sxy / sxx;
    let line = |x: f64| y_mean + slope * (x - x_mean);
    let ssr: f64 = samples
        .iter()
        .map(|s| {
            let r = s.used - line(days(s.at));
            r * r
        })
        .sum();
    let dof = nf - 2.0;
    let s = (ssr / dof).sqrt();
    let q = t_upper_quantile((1.0 - confidence) / 2.0, dof);
    let half_width = |x: f64| q * s * (1.0 + 1.0 / nf + (x - x_mean).powi(2) / sxx).sqrt();
    let upper = |x: f64| line(x) + half_width(x);
    let lower = |x: f64| line(x) - half_width(x);

    let x_now = days(now);
    let x_end = x_now + HORIZON_DAYS;

    let days_until_full = if line(x_now) >= capacity {
        Some(0.0)
    } else if slope > 0.0 {
        let d = x_mean + (capacity - y_mean) / slope - x_now;
        (d <= HORIZON_DAYS).then_some(d)
    } else {
        None
    };

    // The upper band is convex in x, so once below the capacity at `now` it crosses it at most once going up.
    let days_low = if upper(x_now) >= capacity {
        Some(0.0)
    } else if upper(x_end) >= capacity {
        Some(first_crossing(&upper, capacity, x_now, x_end) - x_now)
    } else {
        None
    };

    // The lower band is concave: it rises to a single maximum and falls again. Find the maximum within the
    // horizon, then the crossing on the rising part before it.
    let days_high = if lower(x_now) >= capacity {
        Some(0.0)
    } else {
        let x_peak = argmax_concave(&lower, x_now, x_end);
        (lower(x_peak) >= capacity).then(|| first_crossing(&lower, capacity, x_now, x_peak) - x_now)
    };

    Ok(Forecast {
        slope_per_day: slope,
        days_until_full,
        days_low,
        days_high,
        samples: n,
        method: "ols_linear",
    })
}

/// The smallest `x` in `[lo, hi]` with `f(x) >= level`, given `f(lo) < level <= f(hi)` and `f` crossing the
/// level once in between. Bisection to well below a second.
fn first_crossing(f: &impl Fn(f64) -> f64, level: f64, mut lo: f64, mut hi: f64) -> f64 {
    for _ in 0..200 {
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi || hi - lo < 1e-9 {
            break;
        }
        if f(mid) >= level {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The maximiser of a concave `f` on `[lo, hi]`, by ternary search.
fn argmax_concave(f: &impl Fn(f64) -> f64, mut lo: f64, mut hi: f64) -> f64 {
    for _ in 0..300 {
        if hi - lo < 1e-9 {
            break;
        }
        let m1 = lo + (hi - lo) / 3.0;
        let m2 = hi - (hi - lo) / 3.0;
        if f(m1) < f(m2) {
            lo = m1;
        } else {
            hi = m2;
        }
    }
    lo + (hi - lo) / 2.0
}

/// The `p`-quantile of Student's t distribution with `dof` degrees of freedom (`dof` may be fractional):
/// the `t` with `P(T <= t) = p`. For example `student_t_quantile(0.975, 5.0)` is 2.5706.
///
/// Computed by inverting the CDF, written with the regularized incomplete beta function, by bisection; accurate
/// to about 1e-12 relative.
///
/// # Errors
///
/// [`ErrorKind::InvalidInput`](strata_types::ErrorKind::InvalidInput) when `p` is not strictly between 0 and 1
/// or `dof` is not positive and finite.
pub fn student_t_quantile(p: f64, dof: f64) -> Result<f64> {
    if !(p > 0.0 && p < 1.0) {
        return Err(Error::invalid_input(format!(
            "quantile probability must be in (0, 1), got {p}"
        )));
    }
    if !(dof.is_finite() && dof > 0.0) {
        return Err(Error::invalid_input(format!(
            "degrees of freedom must be positive, got {dof}"
        )));
    }
    Ok(if p > 0.5 {
        t_upper_quantile(1.0 - p, dof)
    } else if p < 0.5 {
        -t_upper_quantile(p, dof)
    } else {
        0.0
    })
}

/// The `t >= 0` whose upper tail `P(T > t)` is `tail` (`0 < tail <= 0.5`). Works on the tail directly so that
/// confidences close to 1 keep their precision.
fn t_upper_quantile(tail: f64, dof: f64) -> f64 {
    // P(T > t) = I_{dof / (dof + t²)}(dof / 2, 1 / 2) / 2 for t >= 0; decreasing in t.
    let upper_tail = |t: f64| 0.5 * inc_beta(dof / 2.0, 0.5, dof / (dof + t * t));
    let (mut lo, mut hi) = (0.0_f64, 1.0_f64);
    while upper_tail(hi) > tail && hi < 1e300 {
        lo = hi;
        hi *= 2.0;
    }
    for _ in 0..2000 {
        let mid = lo + (hi - lo) / 2.0;
        if mid <= lo || mid >= hi || (hi - lo) <= 1e-14 * hi {
            break;
        }
        if upper_tail(mid) > tail {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo + (hi - lo) / 2.0
}

/// The regularized incomplete beta function `I_x(a, b)`, by its continued fraction (Lentz's method).
fn inc_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// The continued fraction for the incomplete beta function (Numerical Recipes' `betacf`).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    const EPS: f64 = 1e-16;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..=10_000 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < EPS {
            break;
        }
    }
    h
}

/// `ln Γ(x)` for `x > 0` (Lanczos approximation, g = 7, about 15 significant digits).
fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEF: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 − x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut acc = COEF[0];
    for (i, c) in COEF.iter().enumerate().skip(1) {
        acc += c / (x + i as f64);
    }
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + acc.ln()
}
