//! Cyclic scans of a data set twice the cache size: hit ratio per scan for Strata's policy (TinyLFU admission)
//! and for a plain LRU of the same size, side by side, through the whole cache (RAM tier, then disk tier).
//!
//! `cargo run --release -p strata-bench --bin scan-policy [-- BLOCKS_IN_CACHE SCANS]`

use std::time::Instant;

use bytes::Bytes;
use strata_cache::{BlockCache, CacheConfig, DiskConfig, GetOptions, PolicyKind};
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_types::{ByteSize, IoContext};

const BLOCK: u64 = 64 * 1024;

async fn run(
    policy: PolicyKind,
    tier: &str,
    cache_blocks: u64,
    scans: usize,
    backend: &Backend,
) -> Vec<f64> {
    let dir = std::env::temp_dir().join(format!(
        "strata-scan-bench-{}-{tier}-{policy:?}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cfg = match tier {
        "ram" => CacheConfig::new(ByteSize(cache_blocks * BLOCK), None),
        _ => CacheConfig::new(
            ByteSize(BLOCK),
            Some(DiskConfig {
                dir: dir.clone(),
                capacity: ByteSize(cache_blocks * BLOCK),
            }),
        ),
    };
    cfg.block_size = ByteSize(BLOCK);
    cfg.policy = policy;
    cfg.readahead_blocks = 0;
    cfg.disk_write_queue = 4096;
    let cache = BlockCache::open(cfg, Telemetry::new()).expect("cache");
    let ctx = IoContext::default();
    let dataset = cache_blocks * 2;
    let mut ratios = Vec::new();
    for _ in 0..scans {
        let before = cache.stats();
        for i in 0..dataset {
            let key = format!("ds/{i:06}");
            let opts = GetOptions::default().bytes(0..BLOCK);
            let got = cache.get(&ctx, backend, &key, opts).await.expect("read");
            got.body.collect().await.expect("read");
        }
        // let queued disk writes land before counting, as a paced reader would
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let after = cache.stats();
        let hits = (after.ram.hits - before.ram.hits) + after.disk.as_ref().map_or(0, |d| d.hits)
            - before.disk.as_ref().map_or(0, |d| d.hits);
        ratios.push(hits as f64 / dataset as f64);
    }
    cache.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    ratios
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let cache_blocks: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(512);
    let scans: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(6);
    let backend = Backend::open(
        "memory://bench",
        &BackendOptions::default(),
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .expect("backend");
    let block = Bytes::from(vec![7u8; BLOCK as usize]);
    for i in 0..cache_blocks * 2 {
        backend
            .put(
                &IoContext::default(),
                &format!("ds/{i:06}"),
                block.clone(),
                PutMode::Overwrite,
            )
            .await
            .expect("put");
    }
    println!(
        "cyclic scans: data set {} blocks of {} KiB, cache {} blocks (ratio cache/dataset = 0.50)",
        cache_blocks * 2,
        BLOCK / 1024,
        cache_blocks
    );
    for tier in ["ram", "disk"] {
        let t0 = Instant::now();
        let lfu = run(PolicyKind::Tinylfu, tier, cache_blocks, scans, &backend).await;
        let lru = run(PolicyKind::Lru, tier, cache_blocks, scans, &backend).await;
        println!("\n{tier} tier ({:.1} s)", t0.elapsed().as_secs_f64());
        println!("scan  strata(tinylfu)  lru");
        for (i, (a, b)) in lfu.iter().zip(&lru).enumerate() {
            println!("{:>4}  {:>15.3}  {:>5.3}", i + 1, a, b);
        }
        let (ml, mr) = (median(lfu[1..].to_vec()), median(lru[1..].to_vec()));
        println!(
            "median hit ratio of scans 2..{scans}: strata {ml:.3}, lru {mr:.3} (target strata >= 0.40); strata - lru = {:+.3}",
            ml - mr
        );
    }
}
