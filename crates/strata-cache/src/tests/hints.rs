//! Hints (`BlockCache::prefetch`): staged blocks, their share of the in-flight budget, and the size of the
//! backend requests a hint makes.

use std::time::Duration;

use super::common::*;
use strata_cache::{BlockCache, PolicyKind};
use strata_telemetry::Telemetry;
use strata_testkit::{FaultProxy, S3Server};

/// Fill `cache`'s RAM tier with blocks read often enough that its TinyLFU filter refuses one-off newcomers.
async fn fill_ram_with_hot_blocks(
    cache: &BlockCache,
    backend: &strata_object::Backend,
    blocks: u64,
) {
    use strata_cache::GetOptions;
    let hot = pattern((blocks * 64 * KIB) as usize, 9);
    put(backend, "hot.bin", &hot).await;
    for _ in 0..4 {
        let r = cache
            .get(&ctx(), backend, "hot.bin", GetOptions::default())
            .await
            .unwrap();
        assert!(r.body.collect().await.unwrap() == hot);
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hinted_blocks_a_full_ram_tier_refuses_are_fetched_once_and_give_their_budget_back() {
    use strata_cache::GetOptions;
    let server = S3Server::start();
    server.create_bucket("hints").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let backend = s3_backend(&proxy.endpoint(), "hints", Telemetry::new());
    let cache = open(
        config(None, 64, 4, 0, PolicyKind::Tinylfu),
        Telemetry::new(),
    );
    fill_ram_with_hot_blocks(&cache, &backend, 4).await;
    let bs = 64 * KIB;
    let data = pattern((3 * bs) as usize, 3);
    put(&backend, "window.bin", &data).await;

    // A loader entering its shuffle window: one hint for the whole object, then reads in another order.
    proxy.clear();
    let fills = cache.stats().fills;
    cache
        .prefetch(&ctx(), &backend, "window.bin", GetOptions::default())
        .await
        .unwrap();
    until("the hint's run to land", || {
        cache.stats().fills >= fills + 3
    })
    .await;
    assert_eq!(cache.stats().staged_blocks, 3);
    assert_eq!(cache.stats().staged_bytes, 3 * bs);
    for i in [2u64, 0, 1] {
        let r = cache
            .get(
                &ctx(),
                &backend,
                "window.bin",
                GetOptions::default().bytes(i * bs + 7..i * bs + 99),
            )
            .await
            .unwrap();
        let want = data.slice((i * bs + 7) as usize..(i * bs + 99) as usize);
        assert!(r.body.collect().await.unwrap() == want, "block {i}");
    }
    assert!(
        cache.stats().ram.admissions_rejected > 0,
        "the RAM tier refused the window's blocks (else this test proves nothing)"
    );
    assert_eq!(
        proxy.gets_of("window.bin").len(),
        1,
        "the hint's one run is the only origin read: {:?}",
        proxy.gets_of("window.bin")
    );
    let s = cache.stats();
    assert_eq!(
        (s.staged_blocks, s.staged_bytes),
        (0, 0),
        "reads took every staged block"
    );
    assert_eq!(s.inflight_bytes, 0, "and their budget went back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_hints_yield_their_budget_to_reads_and_expire_after_the_hold() {
    use strata_cache::GetOptions;
    let backend = memory_backend();
    let mut cfg = config(None, 64, 4, 0, PolicyKind::Tinylfu);
    cfg.prefetch_hold_ms = 2_000;
    let budget = cfg.inflight_budget.bytes();
    let cache = open(cfg, Telemetry::new());
    let bs = 64 * KIB;
    let data = pattern((40 * bs) as usize, 4);
    put(&backend, "big.bin", &data).await;
    put(&backend, "other.bin", &data).await;
    // A hint larger than the budget stages what the budget holds, and no more.
    cache
        .prefetch(&ctx(), &backend, "big.bin", GetOptions::default())
        .await
        .unwrap();
    let s = cache.stats();
    assert_eq!(s.staged_bytes, budget, "the hint took the free budget");
    until("the hint's runs to land", || cache.stats().fills >= 16).await;
    // A read of other bytes that must wait for budget gets it back from the landed hints, at once.
    let r = tokio::time::timeout(
        Duration::from_secs(5),
        cache.get(
            &ctx(),
            &backend,
            "other.bin",
            GetOptions::default().bytes(bs..5 * bs),
        ),
    )
    .await
    .expect("a read never waits for unread hints")
    .unwrap();
    assert!(r.body.collect().await.unwrap() == data.slice(bs as usize..(5 * bs) as usize));
    let s = cache.stats();
    assert!(s.staged_reclaimed >= 4, "{s:?}");
    assert!(
        s.staged_blocks > 0,
        "only what the read needed was reclaimed"
    );
    // Nobody reads the rest: after the hold the sweeper drops them, with their budget.
    until("expired hints to be dropped", || {
        cache.stats().staged_blocks == 0
    })
    .await;
    assert_eq!(cache.stats().inflight_bytes, 0, "their budget went back");
    // What a hint staged reads back right after it expired (from the tier, or the origin again).
    let r = cache
        .get(&ctx(), &backend, "big.bin", GetOptions::default())
        .await
        .unwrap();
    assert!(r.body.collect().await.unwrap() == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_hint_is_fetched_as_parallel_requests_of_at_most_max_request_size() {
    // A mount's sequential reader asks for a 128 MiB window ahead. Fetched as one backend request, the window
    // arrives at the speed of one stream (one third of what the origin gives the warm-ups beside it); split at
    // `max_request_size` (4 blocks here), its runs are fetched side by side.
    use strata_cache::GetOptions;
    let server = S3Server::start();
    server.create_bucket("window").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let backend = s3_backend(&proxy.endpoint(), "window", Telemetry::new());
    let cfg = config(None, 64, 64, 0, PolicyKind::Lru);
    let run = cfg.max_request_size.bytes();
    let cache = open(cfg, Telemetry::new());
    let bs = 64 * KIB;
    let data = pattern((12 * bs) as usize, 5);
    put(&backend, "long.bin", &data).await;
    proxy.clear();
    let fills = cache.stats().fills;
    cache
        .prefetch(&ctx(), &backend, "long.bin", GetOptions::default())
        .await
        .unwrap();
    until("the hint's runs to land", || {
        cache.stats().fills >= fills + 12
    })
    .await;
    let mut ranges: Vec<_> = proxy
        .gets_of("long.bin")
        .into_iter()
        .map(|r| r.range.unwrap_or_default())
        .collect();
    ranges.sort();
    let want: Vec<_> = (0..3)
        .map(|i| format!("bytes={}-{}", i * run, (i + 1) * run - 1))
        .collect();
    assert_eq!(ranges, want, "three requests of max_request_size each");
    // (From byte 1: a read from the start opens with a GET when metadata is not trusted, as here.)
    let r = cache
        .get(
            &ctx(),
            &backend,
            "long.bin",
            GetOptions::default().bytes(1..12 * bs),
        )
        .await
        .unwrap();
    assert!(r.body.collect().await.unwrap() == data.slice(1..));
    assert_eq!(
        proxy.gets_of("long.bin").len(),
        3,
        "the read took the hint's blocks"
    );
}
