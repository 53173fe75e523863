use std::sync::Arc;
use std::time::{Duration, SystemTime};

use strata_types::IoContext;

use super::*;

fn t(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn ctx(team: &str, job: Option<&str>, dataset: Option<&str>) -> IoContext {
    IoContext {
        principal: Some(Arc::from("alice")),
        team: Some(Arc::from(team)),
        job: job.map(Arc::from),
        dataset: dataset.map(Arc::from),
    }
}

fn access(at: SystemTime, class: OpClass, ctx: &IoContext, key: &str, bytes: u64) -> Access {
    Access {
        at,
        class,
        ctx: ctx.clone(),
        backend: Arc::from("default"),
        key: Arc::from(key),
        count: 1,
        bytes,
        latency: Duration::from_millis(2),
        served: if class == OpClass::DataRead {
            Served::Origin
        } else {
            Served::None
        },
        ok: true,
    }
}

#[test]
fn a_metadata_storm_is_its_jobs_and_flags_it_while_the_reader_next_to_it_is_counted_apart() {
    let a = Analytics::new(AnalyticsConfig {
        runaway_ops_per_sec: 100.0,
        runaway_window: Duration::from_secs(60),
        ..AnalyticsConfig::default()
    });
    let storm = ctx("vision", Some("j1"), None);
    let reader = ctx("vision", Some("j2"), Some("imagenet"));
    // 90 s: J1 sends 200 HEADs and 50 LISTs a second, J2 reads one 1 MiB block a second.
    for s in 0..90 {
        let mut batch = Vec::new();
        for i in 0..200 {
            batch.push(access(
                t(s),
                OpClass::MetaRead,
                &storm,
                &format!("train/x{i}"),
                0,
            ));
        }
        for _ in 0..50 {
            batch.push(access(t(s), OpClass::MetaRead, &storm, "train/", 0));
        }
        batch.push(access(
            t(s),
            OpClass::DataRead,
            &reader,
            "imagenet/shard-1.tar",
            1 << 20,
        ));
        a.apply_all(&batch);
    }
    let views = a.jobs(t(90), |_| true);
    let j1 = views.iter().find(|v| &*v.key.job == "j1").expect("j1");
    let j2 = views.iter().find(|v| &*v.key.job == "j2").expect("j2");
    assert!(j1.runaway, "{j1:?}");
    assert!(
        (j1.meta_ops_per_sec - 250.0).abs() < 1.0,
        "{}",
        j1.meta_ops_per_sec
    );
    assert_eq!(j1.totals_bytes.iter().sum::<u64>(), 0);
    assert_eq!(
        j1.totals_ops[OpClass::DataRead as usize],
        0,
        "none of J2's reads counted to J1"
    );
    assert!(!j2.runaway && j2.meta_ops_per_sec == 0.0, "{j2:?}");
    assert_eq!(
        j2.totals_ops[OpClass::MetaRead as usize],
        0,
        "none of J1's storm counted to J2"
    );
    assert_eq!(j2.totals_bytes[OpClass::DataRead as usize], 90 << 20);
    assert!((j2.data_bytes_per_sec - (1 << 20) as f64).abs() < 1.0);
    // Its read time: 2 ms a second of a minute.
    assert!((j2.stall_share - 0.002).abs() < 1e-6, "{}", j2.stall_share);
    assert_eq!(j2.hit_ratio, Some(0.0), "every byte from the origin");
    // Not a runaway before the window has passed.
    let early = Analytics::new(AnalyticsConfig {
        runaway_ops_per_sec: 100.0,
        ..AnalyticsConfig::default()
    });
    for s in 0..30 {
        let b: Vec<Access> = (0..300)
            .map(|i| access(t(s), OpClass::MetaRead, &storm, &format!("k{i}"), 0))
            .collect();
        early.apply_all(&b);
    }
    assert!(
        !early.jobs(t(30), |_| true)[0].runaway,
        "30 s over the rate is not yet 60"
    );
}

#[test]
fn rollups_attribute_each_access_and_close_with_their_minute() {
    let a = Analytics::new(AnalyticsConfig::default());
    let c = ctx("vision", Some("j1"), Some("imagenet"));
    a.apply_all(&[
        access(t(0), OpClass::DataRead, &c, "imagenet/train/a.tar", 100),
        access(t(10), OpClass::DataRead, &c, "imagenet/train/b.tar", 50),
        access(t(20), OpClass::MetaRead, &c, "imagenet/val/", 0),
        access(t(61), OpClass::DataWrite, &c, "imagenet/out.bin", 7),
    ]);
    let mut mins = a.take_minutes(false);
    assert_eq!(mins.len(), 1, "the first minute closed when the next began");
    let m = mins.remove(0);
    assert_eq!(m.start, minute_of(t(0)));
    let row = |prefix: &str, class| {
        m.rows
            .iter()
            .find(|(k, _)| &*k.prefix == prefix && k.class == class)
            .map(|(k, r)| (k.clone(), r.clone()))
    };
    let (k, r) = row("default/imagenet/train/", OpClass::DataRead).expect("reads");
    assert_eq!(
        (&*k.team, &*k.job, &*k.dataset),
        ("vision", "j1", "imagenet")
    );
    assert_eq!((r.count, r.bytes, r.tier_bytes[3]), (2, 150, 150));
    assert_eq!(
        row("default/imagenet/val/", OpClass::MetaRead)
            .expect("listing")
            .1
            .count,
        1
    );
    let rest = a.take_minutes(true);
    assert_eq!(rest.len(), 1, "the minute in progress on a final flush");
    assert_eq!(rest[0].rows.values().map(|r| r.bytes).sum::<u64>(), 7);
    assert!(a.take_minutes(true).is_empty(), "taken once");
}

#[test]
fn memory_stays_bounded_over_100000_keys_and_10000_jobs() {
    let a = Analytics::new(AnalyticsConfig {
        max_rollup_keys: 1_000,
        max_heat: 2_000,
        max_jobs: 500,
        ..AnalyticsConfig::default()
    });
    let mut batch = Vec::new();
    for i in 0..100_000u64 {
        let job = format!("job-{}", i % 10_000);
        let c = ctx(
            if i % 2 == 0 { "vision" } else { "speech" },
            Some(&job),
            None,
        );
        batch.push(access(
            t(i / 4_000),
            OpClass::DataRead,
            &c,
            &format!("p{i}/q/obj"),
            1,
        ));
        if batch.len() == 1_000 {
            a.apply_all(&batch);
            batch.clear();
        }
    }
    let st = a.stats();
    assert_eq!(st.recorded, 100_000);
    assert!(st.jobs <= 500 && st.jobs_evicted >= 9_500, "{st:?}");
    assert!(st.heat_entries <= 2_000 && st.heat_evicted > 0, "{st:?}");
    assert!(st.folded > 0, "{st:?}");
    for m in a.take_minutes(true) {
        // The bound, plus one `(other)` row per team and class.
        assert!(m.rows.len() <= 1_000 + 2, "{}", m.rows.len());
        let others: u64 = m
            .rows
            .iter()
            .filter(|(k, _)| &*k.job == OTHER)
            .map(|(_, r)| r.count)
            .sum();
        assert_eq!(others, m.folded, "what was folded is in the (other) rows");
        assert!(
            m.rows
                .keys()
                .filter(|k| &*k.job == OTHER)
                .all(|k| &*k.team != OTHER),
            "teams kept apart"
        );
    }
}

#[test]
fn a_full_queue_drops_and_counts_and_never_waits() {
    let a = Analytics::new(AnalyticsConfig {
        queue: 4,
        ..AnalyticsConfig::default()
    });
    let c = ctx("vision", None, None);
    for _ in 0..10 {
        a.record(access(t(0), OpClass::MetaRead, &c, "k", 0));
    }
    assert_eq!(a.stats().dropped, 6);
}

#[test]
fn prefixes_keep_the_configured_depth() {
    assert_eq!(prefix_of("b", "a/b/c/d.bin", 2), "b/a/b/");
    assert_eq!(prefix_of("b", "a/d.bin", 2), "b/a/");
    assert_eq!(prefix_of("b", "d.bin", 2), "b/");
    assert_eq!(prefix_of("b", "a/b/c/", 0), "b/");
    assert_eq!(prefix_of("b", "ünï/cødé/x", 1), "b/ünï/");
}

#[test]
fn a_refused_read_warms_nothing() {
    let a = Analytics::new(AnalyticsConfig::default());
    let c = ctx("team-a", Some("j"), Some("theirs"));
    let mut refused = access(t(0), OpClass::DataRead, &c, "team-b/x", 0);
    refused.ok = false;
    let listing = access(t(0), OpClass::MetaRead, &c, "mine/", 0);
    a.apply_all(&[refused, listing]);
    assert!(
        a.heat(t(1), |_| true).is_empty(),
        "a refused read names team B's key and warms nothing; a listing is no data read"
    );
    let jobs = a.jobs(t(1), |_| true);
    assert_eq!(
        jobs[0].totals_ops[OpClass::DataRead as usize],
        1,
        "the caller's job still counts what it sent"
    );
}

#[test]
fn a_jobs_bytes_by_tier_come_from_the_cache_and_origin_events_of_its_reads() {
    use strata_types::{IoEvent, Op, Outcome, Tier};
    let a = Analytics::new(AnalyticsConfig::default());
    let c = ctx("vision", Some("loader"), None);
    let ev = |op, tier, bytes| IoEvent {
        at: t(5),
        op,
        backend: Arc::from("s3://b"),
        key: Arc::from("k"),
        bytes,
        latency: Duration::from_millis(1),
        tier,
        outcome: Outcome::Ok,
        ctx: c.clone(),
    };
    let mut other = ev(Op::Get, Tier::Backend, 999);
    other.ctx.job = None;
    let names = std::collections::HashMap::from([("s3://b".to_string(), "origin".to_string())]);
    a.apply_events(
        &[
            ev(Op::CacheLookup, Tier::Ram, 10),
            ev(Op::CacheLookup, Tier::Disk, 20),
            ev(Op::Get, Tier::Peer, 30),
            ev(Op::CacheLookup, Tier::Miss, 0),
            ev(Op::Get, Tier::Backend, 40),
            ev(Op::Head, Tier::Backend, 0),
            other,
        ],
        &names,
    );
    let v = &a.jobs(t(6), |_| true)[0];
    let tiers = v.timeline.iter().fold([0u64; 4], |mut acc, s| {
        for (a, b) in acc.iter_mut().zip(s.tier_bytes) {
            *a += b;
        }
        acc
    });
    assert_eq!(
        tiers,
        [10, 20, 30, 40],
        "RAM, disk, peer, origin; the job-less read is nobody's"
    );
    assert_eq!(v.hit_ratio, Some(60.0 / 100.0));
    // The rollups' tier mix too, under the backend's configured name, with no operation of its own.
    let m = a.take_minutes(true);
    let rows: Vec<_> = m.iter().flat_map(|m| m.rows.iter()).collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    let (k, r) = rows[0];
    assert_eq!(
        (&*k.job, &*k.prefix, k.class),
        ("loader", "origin/", OpClass::DataRead)
    );
    assert_eq!((r.count, r.tier_bytes), (0, [10, 20, 30, 40]));
}

#[test]
fn a_batch_counts_as_its_operations_everywhere() {
    let a = Analytics::new(AnalyticsConfig {
        runaway_ops_per_sec: 100.0,
        runaway_window: Duration::from_secs(20),
        ..AnalyticsConfig::default()
    });
    let c = ctx("vision", Some("mount-job"), None);
    // A mount's reports: 3,000 lookups a second for 30 s, 1,000 of each report failed, 5 µs each.
    for s in 0..30 {
        let mut ok = access(t(s), OpClass::MetaRead, &c, "train/", 0);
        ok.count = 2_000;
        ok.latency = Duration::from_micros(5);
        let mut failed = ok.clone();
        failed.count = 1_000;
        failed.ok = false;
        a.apply_all(&[ok, failed]);
    }
    let j = &a.jobs(t(30), |_| true)[0];
    assert_eq!(j.totals_ops[OpClass::MetaRead as usize], 90_000);
    assert!(j.runaway, "{j:?}");
    // Over the last minute, of which the job ran half.
    assert!(
        (j.meta_ops_per_sec - 1_500.0).abs() < 1.0,
        "{}",
        j.meta_ops_per_sec
    );
    let m = j.moments[OpClass::MetaRead as usize];
    assert_eq!((m.samples, m.min, m.max, m.sum), (90_000, 5, 5, 450_000));
    assert_eq!(m.sumsq, 90_000 * 25);
    let rows: Vec<_> = a.take_minutes(true);
    let (count, errors): (u64, u64) = rows
        .iter()
        .flat_map(|m| m.rows.values())
        .fold((0, 0), |(c, e), r| (c + r.count, e + r.errors));
    assert_eq!((count, errors), (90_000, 30_000));
    assert_eq!(a.stats().recorded, 90_000);
    assert_eq!(a.teams()[0].1.ops[OpClass::MetaRead as usize], 90_000);
}
