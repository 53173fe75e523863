//! The parallel listing used by reconciliation and clean-up returns exactly a full listing, on a real S3
//! server and on a local directory, with key names that sort between the ranges it splits the key space into.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_quota::reconcile::{list_all, list_all_with};
use strata_telemetry::Telemetry;
use strata_types::IoContext;

const KEYS: &[&str] = &[
    "a",
    "p1",
    "p1-x/k",
    "p1/k",
    "p1/sub/k",
    "p10/k",
    "p1./k",
    "p2/k",
    "p2/k2",
    "q/r/s/t",
    "z",
    ".strata-trash/plan/p1/k",
];

async fn check(backend: &Backend, keys: &[&str]) {
    let ctx = IoContext::anonymous();
    for k in keys {
        backend
            .put(&ctx, k, Bytes::from(k.to_string()), PutMode::Overwrite)
            .await
            .unwrap();
    }
    let mut want: Vec<String> = keys
        .iter()
        .filter(|k| !k.starts_with(".strata-trash/"))
        .map(|k| k.to_string())
        .collect();
    want.sort();
    for concurrency in [1, 2, 3, 16] {
        let got: Vec<String> = list_all(backend, concurrency)
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(got, want, "concurrency {concurrency}");
        // The key-range strategy, forced.
        let got: Vec<String> = list_all_with(backend, concurrency, 0)
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(got, want, "key ranges, concurrency {concurrency}");
    }
}

#[tokio::test]
async fn parallel_listing_equals_a_full_listing() {
    let dir = tempfile::tempdir().unwrap();
    let local = Backend::open(
        &format!("file://{}", dir.path().display()),
        &BackendOptions::default(),
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .unwrap();
    // A directory cannot hold both a file `p1` and a directory `p1/`.
    let local_keys: Vec<&str> = KEYS.iter().copied().filter(|k| *k != "p1").collect();
    check(&local, &local_keys).await;
    let s3 = strata_testkit::S3Server::start();
    s3.create_bucket("rec").await;
    for url in ["s3://rec", "s3://rec/under/a/prefix"] {
        let b = Backend::open(
            url,
            &BackendOptions {
                endpoint: Some(s3.endpoint()),
                region: Some("us-east-1".into()),
                access_key_id: Some(strata_testkit::ACCESS_KEY.into()),
                secret_access_key: Some(strata_testkit::SECRET_KEY.into()),
                ..Default::default()
            },
            RetryPolicy::default(),
            Telemetry::new(),
        )
        .unwrap();
        check(&b, KEYS).await;
    }
    // More top-level prefixes than are listed one by one: the key-range listing.
    let many = tempfile::tempdir().unwrap();
    let local = Backend::open(
        &format!("file://{}", many.path().display()),
        &BackendOptions::default(),
        RetryPolicy::default(),
        Telemetry::new(),
    )
    .unwrap();
    let n = strata_quota::reconcile::PER_PREFIX_MAX + 10;
    let names: Vec<String> = (0..n)
        .map(|i| format!("d{i:05}/k"))
        .chain(["d00007-x/k".to_string(), "d00007.y".to_string()])
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    check(&local, &refs).await;
}
