//! The backend conformance suite ([`suite`]) on the memory, file and S3 backends, and the S3 backend's own
//! behaviour (retries, listings, multipart uploads). S3 runs against a real S3-protocol server (moto) on
//! loopback, started by the test itself; GCS and Azure run the same suite in `emulators.rs`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod suite;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_testkit::{ACCESS_KEY, FaultProxy, S3Server, SECRET_KEY};
use strata_types::ErrorKind;
use suite::{conformance, ctx, fast_retry, pattern};

fn s3_options(endpoint: &str) -> BackendOptions {
    BackendOptions {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..Default::default()
    }
}

#[tokio::test]
async fn memory_backend_conforms() {
    let b = Backend::open(
        "memory://t",
        &BackendOptions::default(),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    conformance(&b, true).await;
}

#[tokio::test]
async fn memory_backend_with_prefix_conforms() {
    let b = Backend::open(
        "memory://t/some/prefix",
        &BackendOptions::default(),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    conformance(&b, true).await;
}

#[tokio::test]
async fn file_backend_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}/root", dir.path().display());
    let b = Backend::open(
        &url,
        &BackendOptions::default(),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    conformance(&b, true).await;
    // The canary next to the root is untouched and unreachable: `../canary` is a key like any other, kept
    // inside the root.
    std::fs::write(dir.path().join("canary"), b"secret").unwrap();
    let e = b.get(&ctx(), "../canary").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    b.put(
        &ctx(),
        "../canary",
        Bytes::from_static(b"mine"),
        PutMode::Overwrite,
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read(dir.path().join("canary")).unwrap(), b"secret");
    assert_eq!(
        b.get(&ctx(), "../canary").await.unwrap().1,
        Bytes::from_static(b"mine")
    );
    // ETags are content MD5s; a file rewritten in place by another tool loses its recorded one.
    let c = ctx();
    let put = b
        .put(&c, "etag/f", Bytes::from_static(b"x"), PutMode::Overwrite)
        .await
        .unwrap();
    assert_eq!(
        put.etag.as_deref(),
        Some("9dd4e461268c8034f5c8564e155c67a6")
    );
    let head = b.head(&c, "etag/f").await.unwrap();
    assert_eq!(head.etag, put.etag);
    assert_eq!(
        b.get_range(&c, "etag/f", 0..1, put.etag.as_deref())
            .await
            .unwrap(),
        Bytes::from_static(b"x")
    );
    std::thread::sleep(Duration::from_millis(20));
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("root/etag/f"))
            .unwrap();
        f.write_all(b"y").unwrap();
    }
    let changed = b.head(&c, "etag/f").await.unwrap();
    assert_ne!(changed.etag, put.etag);
    assert_eq!(changed.size, 2);
    let e = b
        .get_range(&c, "etag/f", 0..1, put.etag.as_deref())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PreconditionFailed);
    b.delete(&c, "etag/f").await.unwrap();
    // Nothing outside the root but the canary and the root itself.
    let mut beside: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    beside.sort();
    assert_eq!(beside, ["canary", "root"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_backend_conforms() {
    let server = S3Server::start();
    server.create_bucket("conf").await;
    let b = Backend::open(
        "s3://conf",
        &s3_options(&server.endpoint()),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    conformance(&b, true).await;
    let b = Backend::open(
        "s3://conf/nested/prefix",
        &s3_options(&server.endpoint()),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    conformance(&b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_transient_errors_are_retried_and_counted() {
    let server = S3Server::start();
    server.create_bucket("faults").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let t = Telemetry::new();
    let b = Backend::open(
        "s3://faults",
        &s3_options(&proxy.endpoint()),
        fast_retry(),
        t.clone(),
    )
    .unwrap();
    let data = pattern(300_000, 9);
    b.put(&ctx(), "k", data.clone(), PutMode::Overwrite)
        .await
        .unwrap();

    // two 503s, then success
    proxy.fail_next(2, 503);
    assert_eq!(b.get(&ctx(), "k").await.unwrap().1, data);
    assert_eq!(t.metrics().retries_total(), 2);

    // connection reset mid-body: retried, and the bytes are right
    proxy.reset_next_bodies(1);
    assert_eq!(
        b.get_range(&ctx(), "k", 1000..200_000, None).await.unwrap(),
        data.slice(1000..200_000)
    );
    assert_eq!(t.metrics().retries_total(), 3);

    // more failures than retries: a clear, retryable error, counted once as a backend error
    proxy.fail_next(10, 503);
    let e = b.get(&ctx(), "k").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.is_retryable());
    assert!(e.message().contains("after 3 retries"), "{e}");
    assert_eq!(t.metrics().backend_errors_total(), 1);
    proxy.fail_next(0, 503);

    // permanent errors are not retried
    let before = proxy.requests().len();
    assert_eq!(
        b.get(&ctx(), "missing").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(proxy.requests().len(), before + 1);
}

/// Paging through a prefix larger than one S3 listing page (1,000 keys) reads only as far as each page needs:
/// a page of 5 keys is one backend request, and 1,100 keys in pages of 500 are three, not a listing of the
/// whole prefix for every page (which made a client's paged listing of N keys cost O(N^2) at the origin).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_listing_pages_read_only_what_they_need() {
    use futures::StreamExt;
    let server = S3Server::start();
    server.create_bucket("pages").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let b = Backend::open(
        "s3://pages",
        &s3_options(&proxy.endpoint()),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    let keys: Vec<String> = (0..1100).map(|i| format!("many/k-{i:05}")).collect();
    futures::stream::iter(keys.iter())
        .for_each_concurrent(32, |k| {
            let b = b.clone();
            async move {
                b.put(&ctx(), k, Bytes::from_static(b"x"), PutMode::Overwrite)
                    .await
                    .unwrap();
            }
        })
        .await;
    b.put(
        &ctx(),
        "more/x",
        Bytes::from_static(b"x"),
        PutMode::Overwrite,
    )
    .await
    .unwrap();
    let lists = |p: &FaultProxy| {
        p.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path.contains("list-type"))
            .count()
    };
    proxy.clear();
    let page = b.list_page(&ctx(), "many/", None, 5).await.unwrap();
    let got: Vec<&str> = page.objects.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(
        got,
        keys[..5].iter().map(|k| k.as_str()).collect::<Vec<_>>()
    );
    assert_eq!(page.next_start_after.as_deref(), Some(keys[4].as_str()));
    assert_eq!(lists(&proxy), 1, "a page of 5 keys is one backend request");

    proxy.clear();
    let (mut seen, mut after, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let page = b
            .list_page(&ctx(), "many/", after.as_deref(), 500)
            .await
            .unwrap();
        pages += 1;
        seen.extend(page.objects.into_iter().map(|o| o.key));
        match page.next_start_after {
            Some(s) => after = Some(s),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen, keys,
        "every key once, in order, none from outside the prefix"
    );
    assert_eq!(lists(&proxy), 3, "one backend request per page");
}

#[test]
fn bad_urls_are_clear_errors() {
    let t = Telemetry::new();
    let o = BackendOptions::default();
    let r = RetryPolicy::default();
    let e = Backend::open("ftp://x/y", &o, r, t.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.message().contains("unknown backend URL scheme"), "{e}");
    let e = Backend::open("not a url", &o, r, t.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let e = Backend::open("s3:///nobucket", &o, r, t.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = Backend::open("file://host/x", &o, r, t.clone()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let e = Backend::open("memory://x/a/../b", &o, r, t.clone());
    // url normalises `..` away; the prefix that remains is valid
    assert!(e.is_ok());
    #[cfg(not(feature = "gcp"))]
    assert_eq!(
        Backend::open("gs://b", &o, r, t.clone())
            .unwrap_err()
            .kind(),
        ErrorKind::Unsupported
    );
    let _ = Arc::clone(&t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_multipart_upload_reports_its_cause_not_the_cleanup() {
    // The store goes away after the upload started: the parts fail, and so does the abort that cleans up.
    // The error the caller reads must be the parts' failure (it used to be the abort's "DELETE ...").
    let server = S3Server::start();
    server.create_bucket("cause").await;
    let proxy = FaultProxy::start(&server.endpoint()).await;
    let b = Backend::open(
        "s3://cause",
        &s3_options(&proxy.endpoint()),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    let mut up = b
        .put_multipart(&ctx(), "ckpt/shard", 5 << 20)
        .await
        .unwrap();
    proxy.fail_next(10_000, 500);
    let mut r = Ok(());
    for i in 0..3u8 {
        r = up.write(pattern(5 << 20, i)).await;
        if r.is_err() {
            break;
        }
    }
    let e = match r {
        Err(e) => e,
        Ok(()) => up.complete().await.unwrap_err(),
    };
    let text = e.to_string();
    assert!(
        !text.contains("DELETE") && !text.contains("abort"),
        "{text}"
    );
    assert!(text.contains("PUT") || text.contains("multipart"), "{text}");
    proxy.fail_next(0, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_uploads_are_listed_by_key_and_aborted() {
    // A writer that dies mid-upload leaves its parts at the store; they are found by key and freed, and only
    // the ones chosen (another key's, or another backend prefix's, stay).
    let server = S3Server::start();
    server.create_bucket("mpu").await;
    let opts = s3_options(&server.endpoint());
    let b = Backend::open("s3://mpu/runs", &opts, fast_retry(), Telemetry::new()).unwrap();
    let other = Backend::open("s3://mpu/elsewhere", &opts, fast_retry(), Telemetry::new()).unwrap();
    let c = ctx();
    for (backend, key) in [
        (&b, "r/step-1/rank-0"),
        (&b, "r/step-1/rank-1"),
        (&b, "odd +%#/ key"),
        (&other, "r/step-1/rank-0"),
    ] {
        let mut up = backend.put_multipart(&c, key, 5 << 20).await.unwrap();
        up.write(pattern(5 << 20, 1)).await.unwrap();
        // Let the part land, then walk away as a killed writer does (nothing completes or aborts it).
        tokio::time::sleep(Duration::from_millis(300)).await;
        std::mem::forget(up);
    }
    let mut keys: Vec<String> = b
        .incomplete_uploads(&c, "")
        .await
        .unwrap()
        .into_iter()
        .map(|u| {
            // moto reports one fixed date for every upload; S3 the real one.
            assert!(u.initiated_unix > 0, "{u:?}");
            u.key
        })
        .collect();
    keys.sort();
    assert_eq!(keys, ["odd +%#/ key", "r/step-1/rank-0", "r/step-1/rank-1"]);
    let n = b
        .abort_uploads(&c, "r/step-1/rank-0", |u| u.key == "r/step-1/rank-0")
        .await
        .unwrap();
    assert_eq!(n, 1);
    let left: Vec<String> = b
        .incomplete_uploads(&c, "")
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.key)
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(!left.contains(&"r/step-1/rank-0".to_string()));
    assert_eq!(b.abort_uploads(&c, "", |_| true).await.unwrap(), 2);
    assert!(b.incomplete_uploads(&c, "").await.unwrap().is_empty());
    // The other prefix's upload was never this backend's.
    assert_eq!(other.incomplete_uploads(&c, "").await.unwrap().len(), 1);
    // Backends that keep no uploads beyond their writer have none to list.
    let mem = Backend::open(
        "memory://",
        &BackendOptions::default(),
        fast_retry(),
        Telemetry::new(),
    )
    .unwrap();
    assert!(mem.incomplete_uploads(&c, "").await.unwrap().is_empty());
}
