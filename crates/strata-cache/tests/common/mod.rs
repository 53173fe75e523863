//! Shared helpers for the cache test binaries.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_cache::{BlockCache, CacheConfig, DiskConfig, GetOptions, PolicyKind};
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_types::{ByteSize, IoContext};

pub const KIB: u64 = 1024;

pub fn ctx() -> IoContext {
    IoContext {
        principal: Some("tester".into()),
        team: Some("team-a".into()),
        job: Some("job-1".into()),
        dataset: Some("ds-1".into()),
    }
}

pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(2),
        max_backoff: Duration::from_millis(10),
    }
}

pub fn memory_backend() -> Backend {
    Backend::open(
        "memory://test",
        &BackendOptions::default(),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap()
}

pub fn s3_backend(endpoint: &str, bucket: &str, telemetry: Arc<Telemetry>) -> Backend {
    let o = BackendOptions {
        endpoint: Some(endpoint.into()),
        access_key_id: Some(strata_testkit::ACCESS_KEY.into()),
        secret_access_key: Some(strata_testkit::SECRET_KEY.into()),
        ..Default::default()
    };
    Backend::open(&format!("s3://{bucket}"), &o, fast_retry(), telemetry).unwrap()
}

/// A cache with `block` KiB blocks, `ram` and `disk` blocks of capacity (disk 0 = none).
pub fn config(
    dir: Option<&Path>,
    block_kib: u64,
    ram_blocks: u64,
    disk_blocks: u64,
    policy: PolicyKind,
) -> CacheConfig {
    let bs = block_kib * KIB;
    let mut c = CacheConfig::new(
        ByteSize(bs * ram_blocks),
        dir.filter(|_| disk_blocks > 0).map(|d| DiskConfig {
            dir: d.to_path_buf(),
            capacity: ByteSize(bs * disk_blocks),
        }),
    );
    c.block_size = ByteSize(bs);
    c.policy = policy;
    c.inflight_budget = ByteSize(bs * 16);
    c.max_request_size = ByteSize(bs * 4);
    // Every open asks the backend: these tests change objects behind the cache's back and expect it to see.
    c.metadata_ttl_ms = 0;
    c
}

pub fn open(cfg: CacheConfig, telemetry: Arc<Telemetry>) -> BlockCache {
    BlockCache::open(cfg, telemetry).unwrap()
}

/// A cache whose metadata reads the time from a clock the test moves forward: TTLs pass at once.
#[allow(dead_code)] // not every test binary moves time
pub fn open_with_clock(
    cfg: CacheConfig,
    telemetry: Arc<Telemetry>,
) -> (BlockCache, Arc<strata_cache::ManualClock>) {
    let clock = Arc::new(strata_cache::ManualClock::new());
    let cache = BlockCache::open_with_clock(cfg, telemetry, clock.clone()).unwrap();
    (cache, clock)
}

pub fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    Bytes::from(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

pub async fn put(b: &Backend, key: &str, data: &Bytes) {
    b.put(&ctx(), key, data.clone(), PutMode::Overwrite)
        .await
        .unwrap();
}

/// Bytes `range` of `key` (the whole object when `None`) through [`BlockCache::get`].
pub async fn get_bytes(
    cache: &BlockCache,
    backend: &Backend,
    key: &str,
    range: Option<std::ops::Range<u64>>,
) -> strata_types::Result<Bytes> {
    let opts = match range {
        Some(r) => GetOptions::default().bytes(r),
        None => GetOptions::default(),
    };
    cache
        .get(&ctx(), backend, key, opts)
        .await?
        .body
        .collect()
        .await
}
