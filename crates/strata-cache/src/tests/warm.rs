//! Warm-ups and the counts a claim's verdict is made of: a warm-up that returns has every block it counts
//! on disk, whoever was writing it.

use std::time::Duration;

use super::common::*;
use crate::state::ObjState;
use strata_cache::PolicyKind;
use strata_telemetry::Telemetry;
use strata_types::BlockKey;

/// A block another fill has reserved on disk and is still writing (a reader's, or a peer's ask served by
/// this agent) is waited for, not counted as held the moment the warm-up sees the reservation: the agent
/// that stages a claim counts ready blocks right after its warm-up returns. A write that is dropped instead
/// (a lossy queue, a failed disk) leaves the block for the warm-up to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_returns_once_the_blocks_another_fill_is_writing_are_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let backend = memory_backend();
    let data = pattern(16 * 64 * 1024, 21);
    put(&backend, "w/x.bin", &data).await;
    let meta = backend.head(&ctx(), "w/x.bin").await.unwrap();
    let cache = open(
        config(Some(dir.path()), 64, 4, 64, PolicyKind::Tinylfu),
        Telemetry::new(),
    );
    let disk = cache.inner.tiers.disk().cloned().unwrap();
    let obj = ObjState::new(&backend, meta.clone());
    let block = |i: u64| {
        let key = BlockKey::new(obj.id.clone(), i);
        let bytes = data.slice((i * 65536) as usize..((i + 1) * 65536) as usize);
        (key, obj.digest(i), bytes)
    };
    // Two blocks reserved by "another fill" whose writes are still under way.
    let (k3, d3, b3) = block(3);
    let (k5, d5, _) = block(5);
    for (k, d) in [(&k3, d3), (&k5, d5)] {
        assert!(disk.reserve(k, d, 65536, false, true).admitted);
    }
    let io = ctx();
    let warm = cache.warm_objects(&io, &backend, vec![meta.clone()], 4, |_| {});
    tokio::pin!(warm);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut warm)
            .await
            .is_err(),
        "the warm-up returned while two of its blocks were still being written"
    );
    // The first write completes: the warm-up still waits for the second.
    disk.write(&k3, &d3, &b3, true).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut warm)
            .await
            .is_err(),
        "the warm-up returned while a block was still being written"
    );
    // The second write is dropped: the warm-up writes that block itself.
    disk.drop_entry(&d5);
    let p = tokio::time::timeout(Duration::from_secs(10), &mut warm)
        .await
        .expect("the warm-up ends once the writes settle")
        .unwrap();
    assert!(p.errors.is_empty(), "{p:?}");
    assert_eq!(p.done_bytes, data.len() as u64, "{p:?}");
    let h = cache.held(&backend, std::slice::from_ref(&meta));
    assert_eq!((h.blocks_held, h.blocks_total), (16, 16), "{h:?}");
    // The blocks on disk are the object's bytes.
    let got = cache
        .read(&ctx(), &backend, "w/x.bin", 0..u64::MAX)
        .await
        .unwrap();
    assert!(got == data);
    cache.shutdown().await;
}

/// A warm-up writes each block to its file as the block arrives. A body cut mid-block (its run is retried)
/// must leave neither the partial file nor the block's reservation behind: a leaked reservation would make
/// the retry skip the block and the warm-up wait for a write that never comes. The blocks are 1 MiB, so the
/// cut lands after some of a block's pieces were written.
/// A warm-up's requests are as long as spreads its blocks over its concurrency: from `max_request_size` (4
/// blocks here) up to half the in-flight budget (8 of 16 blocks), never one per block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_spreads_its_blocks_over_its_concurrency_in_long_requests() {
    let server = strata_testkit::S3Server::start();
    server.create_bucket("runs").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let backend = s3_backend(&proxy.endpoint(), "runs", Telemetry::new());
    let data = pattern(10 * 64 * 1024, 7);
    put(&backend, "r/x.bin", &data).await;
    let meta = backend.head(&ctx(), "r/x.bin").await.unwrap();
    // (concurrency, the requests): 10 blocks over 1 request are capped at 8; over 2, 5 each; over 5, 2 each
    // are raised to 4.
    let cases: [(usize, &[(u64, u64)]); 3] = [
        (1, &[(0, 8), (8, 10)]),
        (2, &[(0, 5), (5, 10)]),
        (5, &[(0, 4), (4, 8), (8, 10)]),
    ];
    for (concurrency, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cache = open(
            config(Some(dir.path()), 64, 4, 64, PolicyKind::Tinylfu),
            Telemetry::new(),
        );
        proxy.clear();
        let p = cache
            .warm_objects(&ctx(), &backend, vec![meta.clone()], concurrency, |_| {})
            .await
            .unwrap();
        assert!(
            p.errors.is_empty() && p.done_bytes == data.len() as u64,
            "{p:?}"
        );
        let mut ranges: Vec<_> = proxy
            .gets_of("r/x.bin")
            .into_iter()
            .filter_map(|r| r.range)
            .collect();
        ranges.sort();
        let mut want: Vec<_> = want
            .iter()
            .map(|(a, b)| format!("bytes={}-{}", a * 65536, b * 65536 - 1))
            .collect();
        want.sort();
        assert_eq!(ranges, want, "concurrency {concurrency}");
        let h = cache.held(&backend, std::slice::from_ref(&meta));
        assert_eq!((h.blocks_held, h.blocks_total), (10, 10), "{h:?}");
        cache.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_up_cut_mid_block_is_retried_and_leaves_no_partial_block() {
    let dir = tempfile::tempdir().unwrap();
    let server = strata_testkit::S3Server::start();
    server.create_bucket("warm").await;
    let proxy = strata_testkit::FaultProxy::start(&server.endpoint()).await;
    let t = Telemetry::new();
    let backend = s3_backend(&proxy.endpoint(), "warm", t.clone());
    // 3.5 blocks in one run: the cut, half-way through the body, falls inside the second block.
    let data = pattern(3 * 1024 * 1024 + 512 * 1024, 23);
    put(&backend, "w/x.bin", &data).await;
    let meta = backend.head(&ctx(), "w/x.bin").await.unwrap();
    let cfg = || config(Some(dir.path()), 1024, 2, 16, PolicyKind::Tinylfu);
    let cache = open(cfg(), t.clone());
    proxy.reset_next_bodies(1);
    let p = tokio::time::timeout(
        Duration::from_secs(60),
        cache.warm_objects(&ctx(), &backend, vec![meta.clone()], 4, |_| {}),
    )
    .await
    .expect("the warm-up ends")
    .unwrap();
    assert!(p.errors.is_empty(), "{p:?}");
    assert!(t.metrics().retries_total() >= 1, "the cut body was retried");
    // The retry starts at the block the cut fell in: the first block, complete, is not read again.
    let ranges: Vec<_> = proxy
        .gets_of("w/x.bin")
        .into_iter()
        .filter_map(|r| r.range)
        .collect();
    assert_eq!(
        ranges,
        ["bytes=0-3670015", "bytes=1048576-3670015"],
        "the run's requests"
    );
    let h = cache.held(&backend, std::slice::from_ref(&meta));
    assert_eq!((h.blocks_held, h.blocks_total), (4, 4), "{h:?}");
    let partial = std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
    assert_eq!(partial, 0, "a partial block file was left behind");
    cache.shutdown().await;
    // The files alone hold the object: a new cache on the directory, with the origin's copy gone, reads it
    // whole and right (each block's checksum is verified as it is read).
    let cache = open(cfg(), Telemetry::new());
    let before = cache.stats().fills;
    let obj = cache
        .open_object(&ctx(), &backend, "w/x.bin")
        .await
        .unwrap();
    backend.delete(&ctx(), "w/x.bin").await.unwrap();
    assert!(obj.read(0..data.len() as u64).await.unwrap() == data);
    assert_eq!(
        cache.stats().fills,
        before,
        "a block was read from the origin"
    );
    cache.shutdown().await;
}
