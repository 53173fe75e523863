//! What the analytics add to one operation at a front door, measured where it is paid: the caller's side of
//! `Analytics::record` (an `Access` built and offered to the bounded queue) and of the block's telemetry event,
//! which the analytics' tier subscription also receives when on; with the analytics on and off
//! (`[analytics] enabled`), side by side in one run, the folding tasks draining their queues as in the agent.
//!
//!     cargo run --release -p strata-bench --bin analytics-record [-- OPS ROUNDS]
//!
//! Prints ns per operation, on and off, their difference, and what that difference is on the gateway's hot
//! GETs as measured in bench/RESULTS.md (a 16 KiB GET at about 52 us, a 64 MiB GET at about 25 ms, which
//! also sends 64 block events).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use strata_analytics::{Access, Analytics, AnalyticsConfig, OpClass, Served};
use strata_types::{IoContext, IoEvent, Op, Outcome, Tier};

fn access(i: u64, ctx: &IoContext) -> Access {
    Access {
        at: SystemTime::now(),
        class: OpClass::DataRead,
        ctx: ctx.clone(),
        backend: Arc::from("default"),
        key: Arc::from(format!("train/shard-{:05}.tar", i % 1000)),
        count: 1,
        bytes: 16 << 10,
        latency: Duration::from_micros(50),
        served: Served::None,
        ok: true,
    }
}

/// ns per recorded operation over `ops`, the folding task running.
fn run(enabled: bool, ops: u64, rt: &tokio::runtime::Runtime) -> f64 {
    let a = Analytics::new(AnalyticsConfig {
        enabled,
        ..AnalyticsConfig::default()
    });
    let tasks = tokio_util::task::TaskTracker::new();
    let cancel = tokio_util::sync::CancellationToken::new();
    // Every agent's telemetry; on, the analytics also take the block lookups (the jobs' bytes by tier).
    let tel = strata_telemetry::Telemetry::new();
    {
        let _g = rt.enter();
        a.start(&tasks, cancel.clone());
        if enabled {
            let rx = tel.subscribe_ops(65_536, &[Op::CacheLookup, Op::Get]);
            a.start_tiers(rx, Default::default(), &tasks, cancel.clone());
        }
    }
    let ctx = IoContext {
        principal: Some(Arc::from("alice")),
        team: Some(Arc::from("vision")),
        job: Some(Arc::from("job-7")),
        dataset: Some(Arc::from("imagenet")),
    };
    let (backend, key): (Arc<str>, Arc<str>) = (Arc::from("s3://b"), Arc::from("train/x"));
    let t = Instant::now();
    for i in 0..ops {
        // What a front door does: ask, then build and offer (the key is the request's, already there).
        if a.enabled() {
            a.record(access(i, &ctx));
        } else {
            std::hint::black_box(i % 1000);
        }
        // The block this operation read, as the cache reports it (on or off).
        tel.emit(IoEvent {
            at: SystemTime::now(),
            op: Op::CacheLookup,
            backend: backend.clone(),
            key: key.clone(),
            bytes: 16 << 10,
            latency: Duration::from_micros(1),
            tier: Tier::Ram,
            outcome: Outcome::Ok,
            ctx: ctx.clone(),
        });
        // Pace like a busy gateway (one op per ~2 us of other work), so the queue drains as in the agent.
        if i % 64 == 63 {
            std::thread::sleep(Duration::from_micros(1));
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / ops as f64;
    cancel.cancel();
    rt.block_on(async {
        tasks.close();
        tasks.wait().await;
    });
    let s = a.stats();
    assert!(!enabled || s.recorded + s.dropped == ops, "{s:?}");
    ns
}

fn main() {
    let mut args = std::env::args().skip(1);
    let ops: u64 = args
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rounds: usize = args.next().and_then(|v| v.parse().ok()).unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        // Alternate which goes first.
        for enabled in if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        } {
            let ns = run(enabled, ops, &rt);
            if enabled { on.push(ns) } else { off.push(ns) }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (on, off) = (median(&mut on), median(&mut off));
    let cost = (on - off).max(0.0);
    println!("{ops} operations x {rounds} rounds, medians:");
    println!(
        "  per operation: analytics on {on:.0} ns, off {off:.0} ns (pacing included), cost {cost:.0} ns"
    );
    println!(
        "  on a hot 16 KiB GET (~52 us; one record, one block): +{:.2}%; on a hot 64 MiB GET (~25 ms; one \
         record, 64 blocks: at most 64 x the cost): +{:.3}%",
        cost / 52_000.0 * 100.0,
        64.0 * cost / 25_000_000.0 * 100.0
    );
}
