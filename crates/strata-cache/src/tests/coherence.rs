//! The metadata cache under invalidations from elsewhere (another agent of the cluster): answers to lookups
//! started before an invalidation are not remembered (nor answers of the key's metadata owner confirmed
//! before one), prefix invalidations, and the cluster's lease.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;

use super::common::*;
use strata_cache::{BlockCache, Invalidation, PeerBlock, PeerSource, PolicyKind};
use strata_object::Backend;
use strata_telemetry::Telemetry;
use strata_testkit::{FaultProxy, S3Server};
use strata_types::{BlockKey, Error, ErrorKind, IoContext, ObjectMeta, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_to_a_head_sent_before_an_invalidation_is_not_remembered() {
    let server = S3Server::start();
    server.create_bucket("inflight-head").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let backend = s3_backend(&proxy.endpoint(), "inflight-head", Telemetry::new());
    put(&backend, "k", &pattern(1_000, 1)).await;
    let mut cfg = config(None, 64, 32, 0, PolicyKind::Tinylfu);
    cfg.metadata_ttl_ms = 60_000;
    let cache = open(cfg, Telemetry::new());
    let heads = || {
        proxy
            .requests()
            .iter()
            .filter(|r| r.method == "HEAD")
            .count()
    };
    // A HEAD held at the proxy while another agent's write is announced here.
    proxy.set_delay(Duration::from_millis(400));
    let open = {
        let (cache, backend) = (cache.clone(), backend.clone());
        tokio::spawn(async move { cache.open_object(&ctx(), &backend, "k").await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    cache.invalidate_in(backend.id(), Invalidation::Key("k".into()));
    open.await.unwrap().unwrap();
    proxy.set_delay(Duration::ZERO);
    let before = heads();
    cache.open_object(&ctx(), &backend, "k").await.unwrap();
    assert_eq!(
        heads(),
        before + 1,
        "the answer that started before the invalidation was not kept: the next open asks again"
    );
    // That answer (sent after the invalidation) is remembered as usual.
    cache.open_object(&ctx(), &backend, "k").await.unwrap();
    assert_eq!(heads(), before + 1);
    cache.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opens_of_one_key_share_one_head_but_none_started_after_an_invalidation_joins_it() {
    let server = S3Server::start();
    server.create_bucket("one-head").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let backend = s3_backend(&proxy.endpoint(), "one-head", Telemetry::new());
    put(&backend, "k", &pattern(1_000, 1)).await;
    let mut cfg = config(None, 64, 32, 0, PolicyKind::Tinylfu);
    cfg.metadata_ttl_ms = 60_000;
    let cache = open(cfg, Telemetry::new());
    let heads = || {
        proxy
            .requests()
            .iter()
            .filter(|r| r.method == "HEAD")
            .count()
    };
    let spawn_open = || {
        let (cache, backend) = (cache.clone(), backend.clone());
        tokio::spawn(async move { cache.open_object(&ctx(), &backend, "k").await })
    };
    // Eight opens while one HEAD is held at the proxy: one HEAD.
    proxy.set_delay(Duration::from_millis(400));
    let opens: Vec<_> = (0..8).map(|_| spawn_open()).collect();
    for o in opens {
        o.await.unwrap().unwrap();
    }
    assert_eq!(heads(), 1);
    assert_eq!(cache.stats().metadata_heads, 1);
    // A write announced while a HEAD is held: opens that start after it send a HEAD of their own (the held
    // one may answer the old version), and the ones after those join theirs.
    cache.invalidate_in(backend.id(), Invalidation::Key("k".into()));
    let first = spawn_open();
    tokio::time::sleep(Duration::from_millis(100)).await;
    cache.invalidate_in(backend.id(), Invalidation::Key("k".into()));
    let later: Vec<_> = (0..4).map(|_| spawn_open()).collect();
    first.await.unwrap().unwrap();
    for o in later {
        o.await.unwrap().unwrap();
    }
    assert_eq!(heads(), 3);
    cache.shutdown().await;
}

#[tokio::test]
async fn a_prefix_invalidation_forgets_every_key_under_it_and_no_other() {
    let backend = memory_backend();
    let mut cfg = config(None, 64, 32, 0, PolicyKind::Tinylfu);
    cfg.metadata_ttl_ms = 60_000;
    let cache = open(cfg, Telemetry::new());
    for k in ["run/1/a", "run/1/b", "run/10/a", "other"] {
        put(&backend, k, &pattern(100, 1)).await;
        cache.open_object(&ctx(), &backend, k).await.unwrap();
    }
    for k in ["run/1/a", "run/1/b", "run/10/a", "other"] {
        put(&backend, k, &pattern(200, 2)).await;
    }
    cache.invalidate_in(backend.id(), Invalidation::Prefix("run/1/".into()));
    let size = |k: &'static str| {
        let (cache, backend) = (cache.clone(), backend.clone());
        async move {
            cache
                .open_object(&ctx(), &backend, k)
                .await
                .unwrap()
                .meta()
                .size
        }
    };
    assert_eq!(size("run/1/a").await, 200);
    assert_eq!(size("run/1/b").await, 200);
    assert_eq!(size("run/10/a").await, 100, "not under run/1/");
    assert_eq!(size("other").await, 100);
    // Another backend id: nothing of this one is forgotten.
    cache.invalidate_in("s3://elsewhere", Invalidation::Prefix(String::new()));
    assert_eq!(size("other").await, 100);
    cache.shutdown().await;
}

#[tokio::test]
async fn past_its_lease_the_metadata_cache_is_neither_used_nor_filled_and_a_renewal_starts_empty() {
    let backend = memory_backend();
    let mut cfg = config(None, 64, 32, 0, PolicyKind::Tinylfu);
    cfg.metadata_ttl_ms = 60_000;
    let cache = open(cfg, Telemetry::new());
    let t = backend.telemetry().clone();
    put(&backend, "m", &pattern(100, 1)).await;
    cache.set_metadata_lease(Some(Instant::now() + Duration::from_secs(600)));
    cache.open_object(&ctx(), &backend, "m").await.unwrap();
    put(&backend, "m", &pattern(200, 2)).await;
    let size = || async {
        cache
            .open_object(&ctx(), &backend, "m")
            .await
            .unwrap()
            .meta()
            .size
    };
    assert_eq!(size().await, 100, "trusted while the lease holds");
    assert!(cache.metadata_trusted());
    // The lease runs out: every open asks the backend, and keeps nothing.
    cache.set_metadata_lease(Some(Instant::now()));
    assert!(!cache.metadata_trusted());
    let before = t.emitted();
    assert_eq!(size().await, 200);
    put(&backend, "m", &pattern(300, 3)).await;
    assert_eq!(size().await, 300, "nothing learned while lapsed is used");
    assert!(t.emitted() >= before + 2, "each open asked the backend");
    // Renewed: nothing from before the lapse survives; what is learned now is used again.
    cache.set_metadata_lease(Some(Instant::now() + Duration::from_secs(600)));
    assert!(cache.metadata_trusted());
    assert_eq!(size().await, 300);
    put(&backend, "m", &pattern(400, 4)).await;
    assert_eq!(size().await, 300, "trusted again within the TTL");
    // No lease: the TTL alone, as without a cluster.
    cache.set_metadata_lease(None);
    assert!(cache.metadata_trusted());
    cache.shutdown().await;
}

/// A cluster of two for metadata: every key's metadata is owned by `owner`, asked in process as the server's
/// `GET /v1/peer/meta` asks it; blocks are all read from the origin.
#[derive(Debug)]
struct MetaOwner {
    owner: BlockCache,
}

impl PeerSource for MetaOwner {
    fn is_local(&self, _key: &BlockKey) -> bool {
        true
    }

    fn fetch<'a>(&'a self, _block: PeerBlock<'a>) -> BoxFuture<'a, Option<Bytes>> {
        Box::pin(async { None })
    }

    fn head<'a>(
        &'a self,
        ctx: &'a IoContext,
        backend: &'a Backend,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Result<(ObjectMeta, Duration)>>> {
        Box::pin(async move {
            Some(match self.owner.serve_peer_head(ctx, backend, key).await {
                Ok(Some(found)) => Ok(found),
                Ok(None) => Err(Error::new(ErrorKind::NotFound, "no such object")),
                Err(e) => Err(e),
            })
        })
    }
}

/// Announcements of a write reach the members in no particular order: here the asker hears of it before
/// the key's metadata owner does, and asks the owner in between. The owner's answer (the old version, from
/// its cache) may serve that read, which began before the write was acknowledged, but must not be kept: it
/// was confirmed before the write this agent already knows of. Kept, it was every later read's answer here
/// until the TTL (stale reads in `tests/python/test_coherence.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owners_answer_older_than_a_write_announced_here_is_not_kept() {
    let server = S3Server::start();
    server.create_bucket("owner-lag").await;
    let backend = s3_backend(&server.endpoint(), "owner-lag", Telemetry::new());
    let v1 = pattern(1_000, 1);
    let v2 = pattern(1_000, 2);
    put(&backend, "k", &v1).await;
    let mut cfg = config(None, 64, 32, 0, PolicyKind::Tinylfu);
    cfg.metadata_ttl_ms = 60_000;
    let owner = open(cfg.clone(), Telemetry::new());
    let asker = open(cfg, Telemetry::new());
    asker
        .set_peers(Arc::new(MetaOwner {
            owner: owner.clone(),
        }))
        .unwrap();
    let etag = |o: &crate::reader::CachedObject| o.meta().etag.clone();
    let first = asker.open_object(&ctx(), &backend, "k").await.unwrap();
    // The write: at the backend, then announced here first.
    put(&backend, "k", &v2).await;
    asker.invalidate_in(backend.id(), Invalidation::Key("k".into()));
    let between = asker.open_object(&ctx(), &backend, "k").await.unwrap();
    assert_eq!(
        etag(&between),
        etag(&first),
        "the owner had not heard of it"
    );
    // Then at the owner; the write is acknowledged. Every read from now on sees it.
    owner.invalidate_in(backend.id(), Invalidation::Key("k".into()));
    let after = asker.open_object(&ctx(), &backend, "k").await.unwrap();
    assert_ne!(
        etag(&after),
        etag(&first),
        "a version confirmed before a write announced here was kept"
    );
    asker.shutdown().await;
    owner.shutdown().await;
}
