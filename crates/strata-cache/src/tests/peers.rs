//! The peer tier's split of fills, with four real caches (one origin: a real S3 server behind a counting
//! proxy) joined by an in-process [`PeerSource`] that calls the owner's [`BlockCache::serve_peer`], as the
//! server's HTTP peer path does (that path, its checks and failures are tested end to end in
//! `tests/python/test_shared_cache.py`). Here: readers, readahead and warm-ups of four caches read each block
//! from the origin once; a peer that serves nothing sends its blocks to the origin, never to a failed read.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;

use super::common::*;
use strata_cache::{BlockCache, PeerBlock, PeerSource, PolicyKind};
use strata_telemetry::Telemetry;
use strata_testkit::{FaultProxy, S3Server};
use strata_types::BlockKey;

/// The cluster of the test: cache `me` of `caches`, owners by the block's digest.
#[derive(Debug)]
struct Ring {
    me: usize,
    caches: Arc<OnceLock<Vec<BlockCache>>>,
    /// Peers answer nothing (a dead or refusing owner).
    down: Arc<AtomicBool>,
    asked: AtomicU64,
}

fn owner(key: &BlockKey, n: usize) -> usize {
    key.digest()[0] as usize % n
}

impl PeerSource for Ring {
    fn is_local(&self, key: &BlockKey) -> bool {
        owner(key, self.caches.get().map_or(1, Vec::len)) == self.me
    }

    fn fetch<'a>(&'a self, b: PeerBlock<'a>) -> BoxFuture<'a, Option<Bytes>> {
        async move {
            self.asked.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return None;
            }
            let caches = self.caches.get()?;
            let o = &caches[owner(b.key, caches.len())];
            o.serve_peer(b.ctx, b.backend, b.meta.clone(), b.key.index, true)
                .await
                .ok()
                .flatten()
        }
        .boxed()
    }
}

/// The ranges of the origin's GETs of `key` tile `[0, len)`: every byte was read from the origin once.
fn assert_tiled(proxy: &FaultProxy, key: &str, len: u64) {
    let gets = proxy.gets_of(key);
    let mut ranges: Vec<(u64, u64)> = gets
        .iter()
        .map(|g| {
            let r = g.range.as_deref().expect("ranged GET");
            let (a, b) = r.trim_start_matches("bytes=").split_once('-').unwrap();
            (a.parse().unwrap(), b.parse::<u64>().unwrap() + 1)
        })
        .collect();
    ranges.sort();
    let mut next = 0;
    for (a, b) in &ranges {
        assert_eq!(
            *a, next,
            "{key}: origin ranges overlap or leave a gap: {ranges:?}"
        );
        next = *b;
    }
    assert_eq!(next, len, "{key}: origin ranges {ranges:?}");
}

struct Cluster {
    caches: Vec<BlockCache>,
    rings: Vec<Arc<Ring>>,
    down: Arc<AtomicBool>,
    _dirs: Vec<tempfile::TempDir>,
}

/// `n` caches, each with room for every block of the tests (an evicted block is rightly read again, which is
/// not what these tests are about).
fn cluster(n: usize, t: &Arc<Telemetry>) -> Cluster {
    let shared = Arc::new(OnceLock::new());
    let down = Arc::new(AtomicBool::new(false));
    let (mut caches, mut rings, mut dirs) = (Vec::new(), Vec::new(), Vec::new());
    for me in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let c = open(
            config(Some(dir.path()), 64, 512, 512, PolicyKind::Tinylfu),
            t.clone(),
        );
        let ring = Arc::new(Ring {
            me,
            caches: shared.clone(),
            down: down.clone(),
            asked: AtomicU64::new(0),
        });
        c.set_peers(ring.clone()).unwrap();
        assert!(
            c.set_peers(ring.clone()).is_err(),
            "a cache joins one cluster"
        );
        caches.push(c);
        rings.push(ring);
        dirs.push(dir);
    }
    shared.set(caches.clone()).unwrap();
    Cluster {
        caches,
        rings,
        down,
        _dirs: dirs,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_caches_read_each_block_from_the_origin_once() {
    let server = S3Server::start();
    server.create_bucket("peers").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    proxy.set_delay(Duration::from_millis(10));
    let t = Telemetry::new();
    let backend = s3_backend(&proxy.endpoint(), "peers", t.clone());
    let objects: Vec<(String, Bytes)> = (0..6)
        .map(|i| {
            (
                format!("ds/obj-{i}.bin"),
                pattern(13 * 64 * 1024 + 777 * i, i as u64),
            )
        })
        .collect();
    for (k, d) in &objects {
        put(&backend, k, d).await;
    }
    let cl = cluster(4, &t);
    proxy.clear();
    // Every cache reads every object at once: whole reads (readahead runs) and ranged reads.
    let mut tasks = Vec::new();
    for (ci, cache) in cl.caches.iter().enumerate() {
        for (oi, (k, d)) in objects.iter().enumerate() {
            let (cache, backend, k, d) = (cache.clone(), backend.clone(), k.clone(), d.clone());
            tasks.push(tokio::spawn(async move {
                if (ci + oi) % 2 == 0 {
                    let got = get_bytes(&cache, &backend, &k, None).await.unwrap();
                    assert!(got == d, "{k}: whole read through cache {ci}");
                } else {
                    let r = 100_000..(d.len() as u64 - 5);
                    let got = get_bytes(&cache, &backend, &k, Some(r.clone()))
                        .await
                        .unwrap();
                    assert!(
                        got == d.slice(r.start as usize..r.end as usize),
                        "{k}: range"
                    );
                    let got = get_bytes(&cache, &backend, &k, None).await.unwrap();
                    assert!(got == d, "{k}: whole read after a range through cache {ci}");
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    for (k, d) in &objects {
        assert_tiled(&proxy, k, d.len() as u64);
    }
    let stats: Vec<_> = cl.caches.iter().map(BlockCache::stats).collect();
    let total: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    let origin: u64 = stats.iter().map(|s| s.fill_bytes).sum();
    assert_eq!(
        origin, total,
        "the dataset was read from the origin once in all"
    );
    let from_peers: u64 = stats.iter().map(|s| s.peer_bytes).sum();
    let served: u64 = stats.iter().map(|s| s.served_to_peers_bytes).sum();
    assert!(
        from_peers > 0 && served >= from_peers,
        "peers {from_peers} served {served}"
    );
    for (i, s) in stats.iter().enumerate() {
        assert!(s.fills > 0, "cache {i} owns and filled some blocks: {s:?}");
    }
    for c in &cl.caches {
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_ups_use_the_peers_and_dead_peers_send_blocks_to_the_origin() {
    let server = S3Server::start();
    server.create_bucket("peers-warm").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let t = Telemetry::new();
    let backend = s3_backend(&proxy.endpoint(), "peers-warm", t.clone());
    let data = pattern(40 * 64 * 1024 + 3, 7);
    put(&backend, "w/a.bin", &data).await;
    let other = pattern(20 * 64 * 1024, 8);
    put(&backend, "w/b.bin", &other).await;
    let cl = cluster(3, &t);
    proxy.clear();
    // A warm-up of the prefix through two of the caches: one origin read per block.
    for c in &cl.caches[..2] {
        let p = c.warm(&ctx(), &backend, "w/", 4, |_| {}).await.unwrap();
        assert!(p.errors.is_empty(), "{p:?}");
    }
    assert_tiled(&proxy, "w/a.bin", data.len() as u64);
    assert_tiled(&proxy, "w/b.bin", other.len() as u64);
    assert!(cl.caches[1].stats().peer_blocks > 0);
    // The third cache with every peer gone: its reads are served, the others' blocks from the origin.
    cl.down.store(true, Ordering::Relaxed);
    proxy.clear();
    let got = get_bytes(&cl.caches[2], &backend, "w/a.bin", None)
        .await
        .unwrap();
    assert!(got == data, "a read with every peer down is served");
    assert!(cl.rings[2].asked.load(Ordering::Relaxed) > 0);
    let s = cl.caches[2].stats();
    assert_eq!(s.peer_blocks, 0, "no peer answered: {s:?}");
    // The blocks it owned (filled for the others' warm-ups) came from its tiers; the rest from the origin,
    // each once.
    let mut ranges: Vec<(u64, u64)> = proxy
        .gets_of("w/a.bin")
        .iter()
        .map(|g| {
            let r = g.range.as_deref().unwrap().trim_start_matches("bytes=");
            let (a, b) = r.split_once('-').unwrap();
            (a.parse().unwrap(), b.parse::<u64>().unwrap() + 1)
        })
        .collect();
    ranges.sort();
    assert!(
        ranges.windows(2).all(|w| w[0].1 <= w[1].0),
        "no byte twice: {ranges:?}"
    );
    let origin: u64 = ranges.iter().map(|(a, b)| b - a).sum();
    assert!(
        origin > 0 && origin < data.len() as u64,
        "the others' blocks from the origin, its own from its tiers: {origin} of {}",
        data.len()
    );
    for c in &cl.caches {
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_warm_ups_split_a_staging_by_owner_and_ask_no_peer() {
    let server = S3Server::start();
    server.create_bucket("peers-owned").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let t = Telemetry::new();
    let backend = s3_backend(&proxy.endpoint(), "peers-owned", t.clone());
    let data = pattern(40 * 64 * 1024 + 3, 9);
    put(&backend, "o/a.bin", &data).await;
    let other = pattern(7 * 64 * 1024, 10);
    put(&backend, "o/b.bin", &other).await;
    let metas = vec![
        backend.head(&ctx(), "o/a.bin").await.unwrap(),
        backend.head(&ctx(), "o/b.bin").await.unwrap(),
    ];
    let cl = cluster(3, &t);
    proxy.clear();
    let mut shares = 0;
    for c in &cl.caches {
        let p = c
            .warm_owned(&ctx(), &backend, metas.clone(), 4, 1, |_| {})
            .await
            .unwrap();
        assert!(p.errors.is_empty(), "{p:?}");
        assert_eq!(p.done_bytes, p.total_bytes, "{p:?}");
        let h = c.held_owned(&backend, &metas, 1);
        assert_eq!(h.blocks_held, h.blocks_total, "{h:?}");
        assert_eq!(h.bytes_held, p.total_bytes, "{h:?}");
        // Only its own share: the whole is not held by any one cache.
        assert!(c.held(&backend, &metas).blocks_held < c.held(&backend, &metas).blocks_total);
        shares += h.blocks_total;
    }
    assert_eq!(shares, 40 + 1 + 7, "the shares add up to every block");
    // Each block read from the origin once, by its owner; no owner asked another.
    assert_tiled(&proxy, "o/a.bin", data.len() as u64);
    assert_tiled(&proxy, "o/b.bin", other.len() as u64);
    for (c, r) in cl.caches.iter().zip(&cl.rings) {
        assert_eq!(r.asked.load(Ordering::Relaxed), 0);
        assert_eq!(c.stats().peer_blocks, 0);
    }
    // A second staging finds every share held and reads nothing.
    proxy.clear();
    for c in &cl.caches {
        let p = c
            .warm_owned(&ctx(), &backend, metas.clone(), 4, 1, |_| {})
            .await
            .unwrap();
        assert_eq!(p.cached_bytes, p.total_bytes, "{p:?}");
    }
    assert!(proxy.gets_of("o/a.bin").is_empty());
    for c in &cl.caches {
        c.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn origin_and_peer_bytes_are_counted_by_job_and_dataset() {
    let server = S3Server::start();
    server.create_bucket("peers-jobs").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let t = Telemetry::new();
    let backend = s3_backend(&proxy.endpoint(), "peers-jobs", t.clone());
    let data = pattern(24 * 64 * 1024, 3);
    put(&backend, "j/a.bin", &data).await;
    let cl = cluster(2, &t);
    let job = |j: &str, d: &str| strata_types::IoContext {
        job: Some(j.into()),
        dataset: Some(d.into()),
        ..ctx()
    };
    let read = |c: &BlockCache, cx: strata_types::IoContext| {
        let (c, b) = (c.clone(), backend.clone());
        async move {
            let o = c.open_object(&cx, &b, "j/a.bin").await.unwrap();
            o.read_all().await.unwrap()
        }
    };
    assert!(read(&cl.caches[0], job("train-1", "imagenet")).await == data);
    assert!(read(&cl.caches[1], job("train-2", "imagenet")).await == data);
    let (s0, s1) = (cl.caches[0].stats(), cl.caches[1].stats());
    let of = |s: &strata_cache::CacheStats, j: &str| {
        s.by_job
            .iter()
            .find(|x| x.job.as_deref() == Some(j) && x.dataset.as_deref() == Some("imagenet"))
            .cloned()
            .unwrap_or_default()
    };
    let (a, b) = (of(&s0, "train-1"), of(&s1, "train-2"));
    let size = data.len() as u64;
    // train-1 read everything first: cache 0 filled its own blocks and cache 1 filled the rest for it.
    assert_eq!(a.origin_bytes + a.peer_bytes, size, "{a:?}");
    assert_eq!(of(&s1, "train-1").served_to_peers_bytes, a.peer_bytes);
    assert_eq!(
        of(&s1, "train-1").origin_bytes,
        a.peer_bytes,
        "the owner's fill is the job's egress"
    );
    // train-2 then found every block cached: its own in cache 1, the rest from cache 0.
    assert_eq!(b.origin_bytes, 0, "{b:?}");
    assert_eq!(
        b.peer_bytes,
        size - s1.by_job.iter().map(|x| x.origin_bytes).sum::<u64>()
    );
    assert!(a.peer_hit_ratio > 0.0 && a.peer_hit_ratio < 1.0);
    for c in &cl.caches {
        c.shutdown().await;
    }
}
