//! Tests of the capacity forecast: Student-t quantiles against table values, exact answers on noise-free
//! series, empirical coverage of the prediction interval over many seeds, and the error cases.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_quota::forecast::{Forecast, HORIZON_DAYS, Sample, forecast, student_t_quantile};
use strata_types::ErrorKind;

const DAY: i64 = 86_400;
const T0: i64 = 1_700_000_000;
const GB: f64 = 1e9;

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]: ln never sees 0
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// `n` samples evenly spread over `span_days` from `T0`, on the line `u0 + slope * days` plus Gaussian noise.
fn series(
    rng: &mut StdRng,
    n: usize,
    span_days: f64,
    u0: f64,
    slope: f64,
    sigma: f64,
) -> Vec<Sample> {
    (0..n)
        .map(|i| {
            let d = span_days * i as f64 / (n - 1) as f64;
            Sample {
                at: T0 + (d * DAY as f64).round() as i64,
                used: u0 + slope * d + sigma * normal(rng),
            }
        })
        .collect()
}

fn fc(samples: &[Sample], capacity: f64, now: i64) -> Forecast {
    forecast(samples, capacity, now, 0.95).expect("forecast")
}

#[test]
fn student_t_quantiles_match_tables() {
    let table = [
        (0.975, 5.0, 2.5706),
        (0.975, 30.0, 2.0423),
        (0.95, 10.0, 1.8125),
        (0.975, 1.0, 12.7062),
        (0.995, 2.0, 9.9248),
        (0.9995, 10.0, 4.5869),
        (0.975, 3.0, 3.1824),
        (0.9, 20.0, 1.3253),
        (0.975, 1000.0, 1.9623),
    ];
    for (p, dof, want) in table {
        let got = student_t_quantile(p, dof).expect("quantile");
        assert!(
            (got - want).abs() < 1e-4,
            "t({p}, {dof}) = {got}, want {want}"
        );
        let neg = student_t_quantile(1.0 - p, dof).expect("quantile");
        assert!(
            (neg + got).abs() < 1e-9,
            "t({}, {dof}) = {neg}, want {}",
            1.0 - p,
            -got
        );
    }
    assert_eq!(student_t_quantile(0.5, 7.0).expect("median"), 0.0);
    // Closed forms for 1 and 2 degrees of freedom, checked tightly, far into the tail too.
    for p in [0.6, 0.9, 0.975, 0.999, 0.999_999] {
        let cauchy = (std::f64::consts::PI * (p - 0.5)).tan();
        let got = student_t_quantile(p, 1.0).expect("quantile");
        assert!(
            (got - cauchy).abs() < 1e-8 * cauchy.max(1.0),
            "t({p}, 1) = {got}, want {cauchy}"
        );
        let two = (2.0 * p - 1.0) / (2.0 * p * (1.0 - p)).sqrt();
        let got = student_t_quantile(p, 2.0).expect("quantile");
        assert!(
            (got - two).abs() < 1e-8 * two.max(1.0),
            "t({p}, 2) = {got}, want {two}"
        );
    }
    for (p, dof) in [
        (0.0, 5.0),
        (1.0, 5.0),
        (f64::NAN, 5.0),
        (0.9, 0.0),
        (0.9, -1.0),
        (0.9, f64::INFINITY),
    ] {
        let err = student_t_quantile(p, dof).expect_err("invalid");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }
}

#[test]
fn noise_free_series_gives_the_exact_answer() {
    // 100 GB + 2 GB/day for 30 days, sampled daily; capacity 200 GB is reached on day 50, 20 days after the
    // last sample.
    let samples: Vec<Sample> = (0..=30)
        .map(|d| Sample {
            at: T0 + d * DAY,
            used: 100.0 * GB + 2.0 * GB * d as f64,
        })
        .collect();
    let now = T0 + 30 * DAY;
    let f = fc(&samples, 200.0 * GB, now);
    assert!((f.slope_per_day - 2.0 * GB).abs() < 1e-3, "{f:?}");
    for d in [f.days_until_full, f.days_low, f.days_high] {
        let d = d.expect("fills");
        assert!((d - 20.0).abs() < 1e-6, "{f:?}");
    }
    assert_eq!(f.samples, 31);
    assert_eq!(f.method, "ols_linear");

    // Seen from half a day later, half a day less; from day 60, already full.
    let f = fc(&samples, 200.0 * GB, now + DAY / 2);
    assert!(
        (f.days_until_full.expect("fills") - 19.5).abs() < 1e-6,
        "{f:?}"
    );
    let f = fc(&samples, 200.0 * GB, T0 + 60 * DAY);
    assert_eq!(
        (f.days_until_full, f.days_low, f.days_high),
        (Some(0.0), Some(0.0), Some(0.0))
    );

    // Sample order does not matter.
    let mut shuffled = samples.clone();
    shuffled.reverse();
    shuffled.swap(3, 17);
    let g = fc(&shuffled, 200.0 * GB, now);
    assert!(
        (g.days_until_full.expect("fills") - 20.0).abs() < 1e-6,
        "{g:?}"
    );
}

#[test]
fn already_full_is_zero_days() {
    let mut rng = StdRng::seed_from_u64(7);
    let samples = series(&mut rng, 20, 19.0, 150.0 * GB, 1.0 * GB, 0.5 * GB);
    let f = fc(&samples, 100.0 * GB, T0 + 19 * DAY);
    assert_eq!(f.days_until_full, Some(0.0));
    assert_eq!(f.days_low, Some(0.0));
    assert_eq!(f.days_high, Some(0.0));
}

#[test]
fn flat_and_shrinking_series_never_fill() {
    let flat: Vec<Sample> = (0..10)
        .map(|d| Sample {
            at: T0 + d * DAY,
            used: 50.0 * GB,
        })
        .collect();
    let f = fc(&flat, 100.0 * GB, T0 + 9 * DAY);
    assert_eq!(f.slope_per_day, 0.0);
    assert_eq!(
        (f.days_until_full, f.days_low, f.days_high),
        (None, None, None)
    );

    let shrinking: Vec<Sample> = (0..10)
        .map(|d| Sample {
            at: T0 + d * DAY,
            used: 90.0 * GB - GB * d as f64,
        })
        .collect();
    let f = fc(&shrinking, 100.0 * GB, T0 + 9 * DAY);
    assert!((f.slope_per_day + GB).abs() < 1e-3, "{f:?}");
    assert_eq!(
        (f.days_until_full, f.days_low, f.days_high),
        (None, None, None)
    );

    // A noisy, shrinking series: the point estimate never fills, but the upper band widens faster than the
    // trend falls, so it does reach the capacity: the earliest plausible fill time is finite. Here slope
    // -1.5 GB/day, s = 2.214 GB, q(0.975, 3) = 3.182, and the band grows by about 0.73 GB/day far out.
    let noisy: Vec<Sample> = [10.0, 12.0, 7.0, 9.0, 4.0]
        .iter()
        .enumerate()
        .map(|(d, gb)| Sample {
            at: T0 + d as i64 * DAY,
            used: gb * GB,
        })
        .collect();
    let now = T0 + 4 * DAY;
    let f = fc(&noisy, 20.0 * GB, now);
    assert!((f.slope_per_day + 1.5 * GB).abs() < 1e-3, "{f:?}");
    assert_eq!(f.days_until_full, None);
    assert_eq!(f.days_high, None);
    let low = f.days_low.expect("the upper band reaches the capacity");
    assert!(low > 0.0 && low < HORIZON_DAYS, "{f:?}");
    // Check the crossing against the band computed here from the textbook formula.
    let upper = band(&noisy, 0.95, 4.0 + low).1;
    assert!(
        (upper - 20.0 * GB).abs() < 1e-3 * GB,
        "upper band at the crossing is {upper}"
    );
}

/// The prediction band `(lower, upper)` at `x` days after `T0`, computed independently of the crate.
fn band(samples: &[Sample], confidence: f64, x: f64) -> (f64, f64) {
    let n = samples.len() as f64;
    let xs: Vec<f64> = samples
        .iter()
        .map(|s| (s.at - T0) as f64 / DAY as f64)
        .collect();
    let xm = xs.iter().sum::<f64>() / n;
    let ym = samples.iter().map(|s| s.used).sum::<f64>() / n;
    let sxx: f64 = xs.iter().map(|x| (x - xm).powi(2)).sum();
    let sxy: f64 = xs
        .iter()
        .zip(samples)
        .map(|(x, s)| (x - xm) * (s.used - ym))
        .sum();
    let b = sxy / sxx;
    let ssr: f64 = xs
        .iter()
        .zip(samples)
        .map(|(x, s)| (s.used - ym - b * (x - xm)).powi(2))
        .sum();
    let s = (ssr / (n - 2.0)).sqrt();
    let q = student_t_quantile(0.5 + confidence / 2.0, n - 2.0).expect("quantile");
    let fit = ym + b * (x - xm);
    let h = q * s * (1.0 + 1.0 / n + (x - xm).powi(2) / sxx).sqrt();
    (fit - h, fit + h)
}

#[test]
fn interval_bounds_are_where_the_bands_cross_the_capacity() {
    let mut rng = StdRng::seed_from_u64(42);
    let samples = series(&mut rng, 12, 22.0, 300.0 * GB, 3.0 * GB, 4.0 * GB);
    let capacity = 400.0 * GB;
    let now = T0 + 25 * DAY;
    let f = fc(&samples, capacity, now);
    let (low, point, high) = (
        f.days_low.expect("low"),
        f.days_until_full.expect("point"),
        f.days_high.expect("high"),
    );
    assert!(0.0 < low && low < point && point < high, "{f:?}");
    let at = |d: f64| 25.0 + d;
    assert!(
        (band(&samples, 0.95, at(low)).1 - capacity).abs() < 1e-3 * GB,
        "{f:?}"
    );
    assert!(
        (band(&samples, 0.95, at(high)).0 - capacity).abs() < 1e-3 * GB,
        "{f:?}"
    );
    // A higher confidence widens the interval around the same point estimate.
    let wide = forecast(&samples, capacity, now, 0.99).expect("forecast");
    assert_eq!(wide.days_until_full, f.days_until_full);
    assert!(
        wide.days_low.expect("low") < low && wide.days_high.expect("high") > high,
        "{wide:?}"
    );
}

/// Over `seeds` synthetic series of `n` samples, the fraction where the fill time lies in
/// `[days_low, days_high]`: for the noise-free trend line reaching the capacity (`fresh == false`), and for a
/// fresh noisy observation at that time standing in for the capacity (`fresh == true`), which is exactly what
/// a 95% prediction interval covers 95% of the time.
fn coverage(n: usize, seeds: u64, fresh: bool) -> f64 {
    let (u0, slope, sigma, span) = (100.0 * GB, 1.0 * GB, 3.0 * GB, 30.0);
    let ahead = 20.0; // the true fill time, in days after the last sample
    let mut hits = 0;
    for seed in 0..seeds {
        let mut rng = StdRng::seed_from_u64(seed);
        let samples = series(&mut rng, n, span, u0, slope, sigma);
        let mut capacity = u0 + slope * (span + ahead);
        if fresh {
            capacity += sigma * normal(&mut rng);
        }
        let f = fc(&samples, capacity, T0 + (span as i64) * DAY);
        let low = f.days_low.unwrap_or(f64::INFINITY);
        let high = f.days_high.unwrap_or(f64::INFINITY);
        if low <= ahead && ahead <= high {
            hits += 1;
        }
    }
    hits as f64 / seeds as f64
}

#[test]
fn prediction_interval_has_its_nominal_coverage() {
    // With 5 samples (3 degrees of freedom) a normal quantile instead of Student's t would cover only ~86%;
    // with 30 samples the fit is good and the interval must still not be much wider than needed.
    for n in [5, 30] {
        let c = coverage(n, 400, true);
        assert!(
            (0.90..=0.99).contains(&c),
            "n = {n}: coverage of a new observation {c}, want about 0.95"
        );
    }
}

#[test]
fn true_fill_date_lies_in_the_interval() {
    // The interval is for a new (noisy) observation, so it covers the noise-free trend's fill date more
    // often than the nominal 95%.
    for n in [5, 10, 30] {
        let c = coverage(n, 200, false);
        assert!(
            c >= 0.90,
            "n = {n}: the true fill date was inside the interval for {c} of seeds"
        );
    }
}

#[test]
fn interval_narrows_with_more_samples() {
    let width = |n: usize| {
        let mut total = 0.0;
        for seed in 0..100 {
            let mut rng = StdRng::seed_from_u64(1000 + seed);
            let samples = series(&mut rng, n, 30.0, 100.0 * GB, 1.0 * GB, 3.0 * GB);
            let f = fc(&samples, 150.0 * GB, T0 + 30 * DAY);
            total += f.days_high.expect("high") - f.days_low.expect("low");
        }
        total / 100.0
    };
    // With 5 samples the lower band sometimes never reaches the capacity (an unbounded interval); from 10 on
    // it always does here.
    let (w10, w30, w100) = (width(10), width(30), width(100));
    assert!(
        w30 < w10 && w100 < w30 && w100 < 0.7 * w10,
        "mean widths: 10 -> {w10}, 30 -> {w30}, 100 -> {w100} days"
    );
}

#[test]
fn invalid_inputs_are_rejected() {
    let ok: Vec<Sample> = (0..5)
        .map(|d| Sample {
            at: T0 + d * DAY,
            used: GB * d as f64,
        })
        .collect();
    let now = T0 + 5 * DAY;
    let check = |samples: &[Sample], capacity: f64, confidence: f64| {
        let err = forecast(samples, capacity, now, confidence).expect_err("invalid input");
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    };
    check(&ok[..2], 10.0 * GB, 0.95);
    check(&[], 10.0 * GB, 0.95);
    for confidence in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
        check(&ok, 10.0 * GB, confidence);
    }
    for capacity in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        check(&ok, capacity, 0.95);
    }
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut samples = ok.clone();
        samples[2].used = bad;
        check(&samples, 10.0 * GB, 0.95);
    }
    let same_time: Vec<Sample> = (0..5)
        .map(|d| Sample {
            at: T0,
            used: GB * d as f64,
        })
        .collect();
    check(&same_time, 10.0 * GB, 0.95);
    // Three samples at two distinct times are enough.
    let two_times = [
        Sample {
            at: T0,
            used: 1.0 * GB,
        },
        Sample {
            at: T0,
            used: 1.2 * GB,
        },
        Sample {
            at: T0 + DAY,
            used: 2.0 * GB,
        },
    ];
    assert!(forecast(&two_times, 10.0 * GB, now, 0.95).is_ok());
}
