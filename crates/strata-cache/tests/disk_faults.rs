//! Disk-tier faults injected with failpoints: ENOSPC on write and EIO on read become misses with counters,
//! never failed or wrong reads. Its own test binary, because failpoints are process-wide.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod common;

use common::*;
use strata_cache::PolicyKind;
use strata_telemetry::Telemetry;

#[tokio::test]
async fn full_or_failing_disk_never_fails_a_read() {
    let scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let backend = memory_backend();
    let data = pattern(8 * 64 * 1024, 11);
    put(&backend, "x.bin", &data).await;

    // ENOSPC on every disk write: reads are right, nothing is on disk, counters say why
    fail::cfg("disk-write", "return").unwrap();
    let cache = open(
        config(Some(dir.path()), 64, 2, 64, PolicyKind::Tinylfu),
        Telemetry::new(),
    );
    for _ in 0..2 {
        assert!(get_bytes(&cache, &backend, "x.bin", None).await.unwrap() == data);
    }
    cache.shutdown().await; // waits for queued writes
    let s = cache.stats();
    assert!(
        s.disk_faults.no_space >= 8,
        "no_space = {}",
        s.disk_faults.no_space
    );
    assert_eq!(
        s.disk.as_ref().unwrap().used_bytes,
        0,
        "failed writes release their space"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
        0,
        "no partial files left"
    );
    fail::remove("disk-write");

    // blocks that reached only RAM while the disk was full are written to disk by a warm-up, from RAM
    let dir2 = tempfile::tempdir().unwrap();
    fail::cfg("disk-write", "return").unwrap();
    let cache = open(
        config(Some(dir2.path()), 64, 16, 64, PolicyKind::Tinylfu),
        Telemetry::new(),
    );
    assert!(get_bytes(&cache, &backend, "x.bin", None).await.unwrap() == data);
    // disk writes are queued: wait until all 8 have failed before lifting the fault
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cache.stats().disk_faults.no_space < 8 {
        assert!(
            std::time::Instant::now() < deadline,
            "queued writes never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    fail::remove("disk-write");
    assert_eq!(cache.stats().disk.unwrap().blocks, 0);
    let p = cache
        .warm(&ctx(), &backend, "x.bin", 4, |_| {})
        .await
        .unwrap();
    assert_eq!(p.failed_blocks, 0);
    let s = cache.stats();
    assert_eq!(s.disk.unwrap().blocks, 8, "every block is on disk now");
    assert_eq!(s.fills, 8, "and none was read from the origin twice");
    cache.shutdown().await;

    // EIO on every disk read: misses, refetched from the backend, right bytes
    let cache = open(
        config(Some(dir.path()), 64, 1, 64, PolicyKind::Tinylfu),
        Telemetry::new(),
    );
    cache
        .warm(&ctx(), &backend, "x.bin", 4, |_| {})
        .await
        .unwrap();
    assert_eq!(cache.stats().disk.unwrap().blocks, 8);
    fail::cfg("disk-read", "return").unwrap();
    assert!(get_bytes(&cache, &backend, "x.bin", None).await.unwrap() == data);
    let s = cache.stats();
    assert!(
        s.disk_faults.read_errors >= 7,
        "read_errors = {}",
        s.disk_faults.read_errors
    );
    fail::remove("disk-read");
    cache.shutdown().await;
    scenario.teardown();
}

/// Fills faster than the disk writers: the disk writes are held (a paused failpoint) while 24 blocks are
/// read one by one. A few blocks queue freely; past them a queued block holds in-flight budget until it is
/// written (at most half the budget) instead of being dropped, so more of the fill reaches the disk tier;
/// only what has no budget left is dropped. Once the writes resume, every queued block is written and all the
/// budget comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_faster_than_the_disk_queues_within_the_budget() {
    let scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let backend = memory_backend();
    let bs = 64 * 1024u64;
    let n = 24u64;
    let data = pattern((n * bs) as usize, 12);
    put(&backend, "burst.bin", &data).await;
    let mut cfg = config(Some(dir.path()), 64, 64, 64, PolicyKind::Lru);
    cfg.readahead_blocks = 0;
    let budget = cfg.inflight_budget.bytes();
    assert_eq!(budget, 16 * bs);
    let cache = open(cfg, Telemetry::new());
    fail::cfg("disk-write", "pause").unwrap();
    for i in 0..n {
        let b = get_bytes(&cache, &backend, "burst.bin", Some(i * bs..(i + 1) * bs))
            .await
            .unwrap();
        assert!(b == data.slice((i * bs) as usize..((i + 1) * bs) as usize));
    }
    // Two blocks are with the (paused) writers, 8 queue freely, 8 more hold half the budget. The last demand
    // read's own share goes back on its fill task a moment after the read returned (demand reads may exceed the
    // budget by one block each while they run), so wait for that before reading the figure.
    let settle = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let s = loop {
        let s = cache.stats();
        if s.inflight_bytes <= budget / 2 || std::time::Instant::now() > settle {
            break s;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    };
    assert!(
        s.inflight_bytes >= 6 * bs && s.inflight_bytes <= budget / 2,
        "queued blocks hold budget, at most half of it: {s:?}"
    );
    assert!(
        s.disk_faults.writes_dropped <= n - 16,
        "only blocks with no budget left are dropped: {s:?}"
    );
    fail::remove("disk-write");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let s = cache.stats();
        let on_disk = s.disk.as_ref().unwrap().blocks;
        if on_disk + s.disk_faults.writes_dropped == n && s.inflight_bytes == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "queued writes never finished or kept their budget: {s:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // Everything written reads back right from the disk tier (the RAM tier is dropped with a new cache).
    cache.shutdown().await;
    let mut cfg = config(Some(dir.path()), 64, 2, 64, PolicyKind::Lru);
    cfg.readahead_blocks = 0;
    let cache = open(cfg, Telemetry::new());
    assert!(
        get_bytes(&cache, &backend, "burst.bin", None)
            .await
            .unwrap()
            == data
    );
    let s = cache.stats();
    assert!(s.disk.as_ref().unwrap().hits >= 16, "{s:?}");
    cache.shutdown().await;
    scenario.teardown();
}
