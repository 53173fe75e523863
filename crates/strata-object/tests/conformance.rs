//! The backend conformance suite: every backend must pass the same checks. The S3 backend runs against a real
//! S3-protocol server (moto) on loopback, started by the test itself.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_object::{Backend, BackendOptions, PutMode, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_testkit::{ACCESS_KEY, FaultProxy, S3Server, SECRET_KEY};
use strata_types::{ErrorKind, IoContext, ObjectAttrs};

fn ctx() -> IoContext {
    IoContext::default()
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
    }
}

fn s3_options(endpoint: &str) -> BackendOptions {
    BackendOptions {
        endpoint: Some(endpoint.to_string()),
        region: Some("us-east-1".into()),
        access_key_id: Some(ACCESS_KEY.into()),
        secret_access_key: Some(SECRET_KEY.into()),
        ..Default::default()
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

/// The suite itself. `supports_create` says whether the backend implements create-only puts.
async fn conformance(b: &Backend, supports_create: bool) {
    let c = ctx();
    // put + get + head
    let data = pattern(100_000, 1);
    let put = b
        .put(&c, "dir/a.bin", data.clone(), PutMode::Overwrite)
        .await
        .unwrap();
    let (meta, got) = b.get(&c, "dir/a.bin").await.unwrap();
    assert_eq!(got, data);
    assert_eq!(meta.size, 100_000);
    let head = b.head(&c, "dir/a.bin").await.unwrap();
    assert_eq!(head.size, 100_000);
    assert_eq!(head.key, "dir/a.bin");
    if put.etag.is_some() {
        assert_eq!(
            head.etag, put.etag,
            "head reports the ETag the put returned"
        );
    }

    // ranged get, including the last byte and a range with the old ETag as a precondition
    let r = b.get_range(&c, "dir/a.bin", 10..1010, None).await.unwrap();
    assert_eq!(r, data.slice(10..1010));
    let r = b
        .get_range(&c, "dir/a.bin", 99_999..100_000, head.etag.as_deref())
        .await
        .unwrap();
    assert_eq!(r, data.slice(99_999..));

    // overwrite changes the version; a ranged read pinned to the old ETag fails, never mixes versions
    let data2 = pattern(100_000, 2);
    b.put(&c, "dir/a.bin", data2.clone(), PutMode::Overwrite)
        .await
        .unwrap();
    let head2 = b.head(&c, "dir/a.bin").await.unwrap();
    assert_ne!(
        head.version_tag(),
        head2.version_tag(),
        "overwrite changes the version tag"
    );
    if let Some(old) = head.etag.as_deref() {
        let e = b
            .get_range(&c, "dir/a.bin", 0..10, Some(old))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PreconditionFailed, "{e}");
    }
    assert_eq!(
        b.get_range(&c, "dir/a.bin", 0..10, head2.etag.as_deref())
            .await
            .unwrap(),
        data2.slice(0..10)
    );

    // missing objects
    let e = b.head(&c, "dir/missing").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(!e.is_retryable());
    assert_eq!(
        b.get(&c, "nope").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // Keys that are not plain paths: S3 stores and reads them as the keys they are (through Strata's own
    // requests); a local directory too, escaped inside itself (the file test checks nothing lands outside);
    // the in-memory store (object_store paths) refuses them.
    for odd in ["../etc/passwd", "/abs", "a/../../b", "a\0b", "dir/"] {
        match b.scheme() {
            "s3" | "file" => {
                assert_eq!(
                    b.head(&c, odd).await.unwrap_err().kind(),
                    ErrorKind::NotFound
                );
                b.put(&c, odd, Bytes::from_static(b"odd"), PutMode::Overwrite)
                    .await
                    .unwrap();
                assert_eq!(b.get(&c, odd).await.unwrap().1, Bytes::from_static(b"odd"));
                b.delete(&c, odd).await.unwrap();
                assert_eq!(
                    b.head(&c, odd).await.unwrap_err().kind(),
                    ErrorKind::NotFound
                );
                continue;
            }
            // `P/` names no object there (none can be written), the others are no keys at all.
            _ => assert_eq!(
                b.head(&c, odd).await.unwrap_err().kind(),
                if odd.ends_with('/') {
                    ErrorKind::NotFound
                } else {
                    ErrorKind::InvalidInput
                },
                "{odd}"
            ),
        }
        assert_eq!(
            b.put(&c, odd, Bytes::from_static(b"x"), PutMode::Overwrite)
                .await
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidInput
        );
    }

    // conditional put
    if supports_create {
        let e = b
            .put(&c, "dir/a.bin", Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        b.put(&c, "dir/new.bin", Bytes::from_static(b"x"), PutMode::Create)
            .await
            .unwrap();
        assert_eq!(
            b.get(&c, "dir/new.bin").await.unwrap().1,
            Bytes::from_static(b"x")
        );
    }

    // listing: prefix, delimiter, pagination over more than one S3 page (1000 keys)
    let n = 1_050;
    let mut keys: Vec<String> = (0..n)
        .map(|i| format!("list/p{:02}/k{i:05}", i % 3))
        .collect();
    futures::future::join_all(
        keys.iter()
            .map(|k| b.put(&c, k, Bytes::from_static(b"v"), PutMode::Overwrite)),
    )
    .await
    .into_iter()
    .collect::<Result<Vec<_>, _>>()
    .unwrap();
    b.put(
        &c,
        "list/top.txt",
        Bytes::from_static(b"t"),
        PutMode::Overwrite,
    )
    .await
    .unwrap();
    keys.push("list/top.txt".into());
    keys.sort();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = b
            .list_page(&c, "list/", after.as_deref(), 400)
            .await
            .unwrap();
        pages += 1;
        seen.extend(page.objects.iter().map(|o| o.key.clone()));
        match page.next_start_after {
            Some(s) => after = Some(s),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, keys, "paged listing returns every key once, in order");
    let p1 = b.list_page(&c, "list/p01/", None, 10_000).await.unwrap();
    assert_eq!(p1.objects.len(), n / 3);
    assert!(p1.objects.iter().all(|o| o.key.starts_with("list/p01/")));
    let partial = b.list_page(&c, "list/p0", None, 10_000).await.unwrap();
    assert_eq!(
        partial.objects.len(),
        n,
        "a prefix need not end at a delimiter"
    );
    let d = b.list_delimited(&c, "list/").await.unwrap();
    assert_eq!(
        d.common_prefixes,
        vec!["list/p00/", "list/p01/", "list/p02/"]
    );
    assert_eq!(
        d.objects.iter().map(|o| o.key.as_str()).collect::<Vec<_>>(),
        vec!["list/top.txt"]
    );

    // Paging past keys with characters a path would percent-encode (`#` sorts before `%`): none lost.
    let odd = [
        "odd/a#x", "odd/a#y", "odd/a b", "odd/a%3", "odd/a~4", "odd/b",
    ];
    for k in odd {
        b.put(&c, k, Bytes::from_static(b"o"), PutMode::Overwrite)
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = b.list_page(&c, "odd/", after.as_deref(), 1).await.unwrap();
        seen.extend(page.objects.iter().map(|o| o.key.clone()));
        match page.next_start_after {
            Some(s) => after = Some(s),
            None => break,
        }
    }
    let mut want: Vec<String> = odd.iter().map(|k| k.to_string()).collect();
    want.sort();
    assert_eq!(seen, want, "paging one key at a time sees every key");
    let span = b
        .list_span(&c, "odd/a#x", Some("odd/b"), 100)
        .await
        .unwrap();
    assert_eq!(
        span.objects
            .iter()
            .map(|o| o.key.as_str())
            .collect::<Vec<_>>(),
        want[2..want.len() - 1]
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>(),
        "a span after a key with a '#'"
    );
    for k in odd {
        b.delete(&c, k).await.unwrap();
    }

    // delete (idempotent)
    b.delete(&c, "list/top.txt").await.unwrap();
    b.delete(&c, "list/top.txt").await.unwrap();
    assert_eq!(
        b.head(&c, "list/top.txt").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // copy
    b.copy(&c, "dir/a.bin", "dir/copy.bin").await.unwrap();
    assert_eq!(b.get(&c, "dir/copy.bin").await.unwrap().1, data2);

    // multipart: 3 parts of 5 MiB + a tail; invisible until complete; abort leaves nothing
    let big = pattern(16 * 1024 * 1024 + 123, 3);
    let mut up = b
        .put_multipart(&c, "mp/big.bin", 5 * 1024 * 1024)
        .await
        .unwrap();
    for chunk in big.chunks(1024 * 1024 + 7) {
        up.write(Bytes::copy_from_slice(chunk)).await.unwrap();
    }
    assert_eq!(
        b.head(&c, "mp/big.bin").await.unwrap_err().kind(),
        ErrorKind::NotFound,
        "invisible before complete"
    );
    up.complete().await.unwrap();
    let (_, got) = b.get(&c, "mp/big.bin").await.unwrap();
    assert_eq!(got.len(), big.len());
    assert!(got == big, "multipart bytes intact");
    let mut up = b
        .put_multipart(&c, "mp/aborted.bin", 5 * 1024 * 1024)
        .await
        .unwrap();
    up.write(pattern(6 * 1024 * 1024, 4)).await.unwrap();
    up.abort().await.unwrap();
    assert_eq!(
        b.head(&c, "mp/aborted.bin").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // attributes: kept with single and multipart writes, returned by HEAD, GET and the first-bytes GET,
    // kept by a copy; an overwrite without them has none
    let attrs = ObjectAttrs {
        content_type: Some("application/x-tar".into()),
        cache_control: Some("max-age=60".into()),
        content_disposition: Some("attachment; filename=\"s.tar\"".into()),
        user: [
            ("shard-index".to_string(), "7".to_string()),
            ("source".into(), "laion".into()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    b.put_with(&c, "attrs/s.tar", data.clone(), PutMode::Overwrite, &attrs)
        .await
        .unwrap();
    assert_eq!(
        b.head(&c, "attrs/s.tar").await.unwrap().attrs.as_deref(),
        Some(&attrs)
    );
    assert_eq!(
        b.get(&c, "attrs/s.tar").await.unwrap().0.attrs.as_deref(),
        Some(&attrs)
    );
    assert_eq!(
        b.get_head(&c, "attrs/s.tar", 10)
            .await
            .unwrap()
            .0
            .attrs
            .as_deref(),
        Some(&attrs)
    );
    b.copy(&c, "attrs/s.tar", "attrs/copy.tar").await.unwrap();
    assert_eq!(
        b.head(&c, "attrs/copy.tar").await.unwrap().attrs.as_deref(),
        Some(&attrs)
    );
    let mut up = b
        .put_multipart_with(&c, "attrs/big.bin", 5 * 1024 * 1024, &attrs)
        .await
        .unwrap();
    up.write(pattern(6 * 1024 * 1024, 5)).await.unwrap();
    up.complete().await.unwrap();
    assert_eq!(
        b.head(&c, "attrs/big.bin").await.unwrap().attrs.as_deref(),
        Some(&attrs)
    );
    b.put(&c, "attrs/s.tar", data.clone(), PutMode::Overwrite)
        .await
        .unwrap();
    // (an S3 server reports its default Content-Type, binary/octet-stream, for an object written without one)
    let bare = |a: Option<Arc<ObjectAttrs>>| {
        a.is_none_or(|a| {
            a.user.is_empty()
                && a.cache_control.is_none()
                && a.content_type
                    .as_deref()
                    .is_none_or(|t| t == "binary/octet-stream")
        })
    };
    assert!(
        bare(b.head(&c, "attrs/s.tar").await.unwrap().attrs),
        "replaced without attributes"
    );
    assert!(bare(b.head(&c, "dir/a.bin").await.unwrap().attrs));

    // events were emitted for all of it
    assert!(b.telemetry().emitted() > 1_000);
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
