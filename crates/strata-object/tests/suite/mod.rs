//! The backend conformance suite, shared by the test targets that run it: `conformance` (memory, file, S3 on
//! moto) and `emulators` (GCS on fake-gcs-server, Azure Blob on Azurite). Every backend must pass the same
//! checks.

#![allow(dead_code, clippy::unwrap_used)] // each target uses part of it; a panic is the failure report

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use strata_object::{Backend, PutMode, RetryPolicy};
use strata_types::{ErrorKind, IoContext, ObjectAttrs};

pub fn ctx() -> IoContext {
    IoContext::default()
}

pub fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
    }
}

pub fn pattern(len: usize, seed: u8) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect::<Vec<u8>>(),
    )
}

/// The suite itself, every case in turn. `supports_create` says whether the backend implements create-only
/// puts.
pub async fn conformance(b: &Backend, supports_create: bool) {
    reads(b).await;
    overwrite(b).await;
    missing(b).await;
    odd_keys(b).await;
    if supports_create {
        conditional_put(b).await;
    }
    if_match_put(b).await;
    listing(b).await;
    listing_odd_keys(b).await;
    listed_etags(b).await;
    delete(b).await;
    copy(b).await;
    multipart(b).await;
    attributes(b).await;
    user_metadata_names(b).await;
    // events were emitted for all of it
    assert!(b.telemetry().emitted() > 1_000);
}

/// Writes the objects a case then reads: a backend under test writes its own ([`Backend::put`]); a test may
/// write them to the server directly instead, where the backend cannot (fake-gcs-server takes none of the XML
/// API writes `object_store`'s GCS client makes). The cases that only read what they write take one.
pub trait Seed {
    /// Write `data` at `key` (a key of the backend under test); the ETag, where known.
    fn seed(&self, key: &str, data: Bytes) -> impl Future<Output = Option<String>>;
}

impl Seed for Backend {
    async fn seed(&self, key: &str, data: Bytes) -> Option<String> {
        self.put(&ctx(), key, data, PutMode::Overwrite)
            .await
            .unwrap()
            .etag
    }
}

// The cases. Each writes what it reads, under keys of its own, so that any may run alone.

/// Put, get and head; ranged gets, one pinned to the object's ETag.
pub async fn reads(b: &Backend) {
    reads_seeded(b, b).await;
}

/// [`reads`], its object written by `seed`.
pub async fn reads_seeded(b: &Backend, seed: &impl Seed) {
    let c = ctx();
    // put + get + head
    let data = pattern(100_000, 1);
    let put_etag = seed.seed("dir/a.bin", data.clone()).await;
    let (meta, got) = b.get(&c, "dir/a.bin").await.unwrap();
    assert_eq!(got, data);
    assert_eq!(meta.size, 100_000);
    let head = b.head(&c, "dir/a.bin").await.unwrap();
    assert_eq!(head.size, 100_000);
    assert_eq!(head.key, "dir/a.bin");
    if put_etag.is_some() {
        assert_eq!(
            head.etag, put_etag,
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
}

/// An overwrite changes the version; a ranged read pinned to the old ETag fails, never mixes versions.
pub async fn overwrite(b: &Backend) {
    overwrite_seeded(b, b).await;
}

/// [`overwrite`], its objects written by `seed`.
pub async fn overwrite_seeded(b: &Backend, seed: &impl Seed) {
    let c = ctx();
    seed.seed("over/a.bin", pattern(100_000, 1)).await;
    let head = b.head(&c, "over/a.bin").await.unwrap();
    let data2 = pattern(100_000, 2);
    seed.seed("over/a.bin", data2.clone()).await;
    let head2 = b.head(&c, "over/a.bin").await.unwrap();
    assert_ne!(
        head.version_tag(),
        head2.version_tag(),
        "overwrite changes the version tag"
    );
    if let Some(old) = head.etag.as_deref() {
        let e = b
            .get_range(&c, "over/a.bin", 0..10, Some(old))
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PreconditionFailed, "{e}");
    }
    assert_eq!(
        b.get_range(&c, "over/a.bin", 0..10, head2.etag.as_deref())
            .await
            .unwrap(),
        data2.slice(0..10)
    );
}

/// Missing objects are `NotFound`, not retried.
pub async fn missing(b: &Backend) {
    let c = ctx();
    let e = b.head(&c, "dir/missing").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(!e.is_retryable());
    assert_eq!(
        b.get(&c, "nope").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

/// Keys that are not plain paths.
pub async fn odd_keys(b: &Backend) {
    let c = ctx();
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
}

/// Create-only puts: refused over an existing object, done where there is none.
pub async fn conditional_put(b: &Backend) {
    let c = ctx();
    b.put(&c, "cond/a.bin", pattern(1_000, 1), PutMode::Overwrite)
        .await
        .unwrap();
    let e = b
        .put(&c, "cond/a.bin", Bytes::from_static(b"x"), PutMode::Create)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    b.put(
        &c,
        "cond/new.bin",
        Bytes::from_static(b"x"),
        PutMode::Create,
    )
    .await
    .unwrap();
    assert_eq!(
        b.get(&c, "cond/new.bin").await.unwrap().1,
        Bytes::from_static(b"x")
    );
}

/// Puts pinned to a version (`If-Match`): refused over another, done over the one named, NotFound for a missing
/// key (a local directory, whose file store has no conditional update, compares under Strata's own lock).
pub async fn if_match_put(b: &Backend) {
    let c = ctx();
    b.put(
        &c,
        "ifm/a.bin",
        Bytes::from_static(b"x"),
        PutMode::Overwrite,
    )
    .await
    .unwrap();
    let etag = b.head(&c, "ifm/a.bin").await.unwrap().etag.unwrap();
    let stale = PutMode::IfMatch("\"0123456789abcdef\"".into());
    let e = b
        .put(&c, "ifm/a.bin", Bytes::from_static(b"y"), stale)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PreconditionFailed, "{e}");
    assert_eq!(
        b.get(&c, "ifm/a.bin").await.unwrap().1,
        Bytes::from_static(b"x")
    );
    b.put(
        &c,
        "ifm/a.bin",
        Bytes::from_static(b"z"),
        PutMode::IfMatch(etag),
    )
    .await
    .unwrap();
    assert_eq!(
        b.get(&c, "ifm/a.bin").await.unwrap().1,
        Bytes::from_static(b"z")
    );
    // As S3: If-Match on a key that does not exist is NotFound, not a failed precondition.
    let e = b
        .put(
            &c,
            "ifm/missing.bin",
            Bytes::from_static(b"w"),
            PutMode::IfMatch("\"0123456789abcdef\"".into()),
        )
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(b.head(&c, "ifm/missing.bin").await.is_err());
}

/// Listing: prefix, delimiter, pagination over more than one S3 page (1000 keys).
pub async fn listing(b: &Backend) {
    listing_seeded(b, b).await;
}

/// [`listing`], its objects written by `seed`.
pub async fn listing_seeded(b: &Backend, seed: &impl Seed) {
    let c = ctx();
    let n = 1_050;
    let mut keys: Vec<String> = (0..n)
        .map(|i| format!("list/p{:02}/k{i:05}", i % 3))
        .collect();
    futures::future::join_all(keys.iter().map(|k| seed.seed(k, Bytes::from_static(b"v")))).await;
    seed.seed("list/top.txt", Bytes::from_static(b"t")).await;
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
}

/// Paging past keys with characters a path would percent-encode.
pub async fn listing_odd_keys(b: &Backend) {
    listing_odd_keys_seeded(b, b).await;
}

/// [`listing_odd_keys`], its objects written by `seed`.
pub async fn listing_odd_keys_seeded(b: &Backend, seed: &impl Seed) {
    let c = ctx();
    // Paging past keys with characters a path would percent-encode (`#` sorts before `%`): none lost.
    let odd = [
        "odd/a#x", "odd/a#y", "odd/a b", "odd/a%3", "odd/a~4", "odd/b",
    ];
    for k in odd {
        seed.seed(k, Bytes::from_static(b"o")).await;
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
}

/// Listings report an object's ETag as reads do (the cache confirms what a read returned against a listing; a
/// client may pin a read to a listed ETag).
pub async fn listed_etags(b: &Backend) {
    listed_etags_seeded(b, b).await;
}

/// [`listed_etags`], its objects written by `seed`.
pub async fn listed_etags_seeded(b: &Backend, seed: &impl Seed) {
    let c = ctx();
    seed.seed("etags/a.bin", pattern(1_000, 7)).await;
    seed.seed("etags/sub/b.bin", pattern(1_000, 8)).await;
    let a = b.head(&c, "etags/a.bin").await.unwrap().etag;
    let sub = b.head(&c, "etags/sub/b.bin").await.unwrap().etag;
    assert!(a.is_some() && sub.is_some());
    let etags = |objects: &[strata_types::ObjectMeta]| {
        objects
            .iter()
            .map(|o| (o.key.clone(), o.etag.clone()))
            .collect::<Vec<_>>()
    };
    let want = vec![
        ("etags/a.bin".to_string(), a.clone()),
        ("etags/sub/b.bin".to_string(), sub),
    ];
    let page = b.list_page(&c, "etags/", None, 10).await.unwrap();
    assert_eq!(
        etags(&page.objects),
        want,
        "a page lists the ETags HEAD reports"
    );
    let span = b.list_span(&c, "etags", Some("etags0"), 10).await.unwrap();
    assert_eq!(
        etags(&span.objects),
        want,
        "a span lists the ETags HEAD reports"
    );
    let level = b.list_delimited(&c, "etags/").await.unwrap();
    assert_eq!(
        etags(&level.objects),
        want[..1],
        "a level lists the ETags HEAD reports"
    );
    // A read pinned to the listed ETag is a read of that version.
    let listed = page.objects[0].etag.as_deref();
    assert_eq!(
        b.get_range(&c, "etags/a.bin", 0..10, listed).await.unwrap(),
        pattern(1_000, 7).slice(0..10)
    );
}

/// Delete, idempotent.
pub async fn delete(b: &Backend) {
    delete_seeded(b, b).await;
}

/// [`delete`], its object written by `seed`.
pub async fn delete_seeded(b: &Backend, seed: &impl Seed) {
    let c = ctx();
    seed.seed("del/top.txt", Bytes::from_static(b"t")).await;
    b.delete(&c, "del/top.txt").await.unwrap();
    b.delete(&c, "del/top.txt").await.unwrap();
    assert_eq!(
        b.head(&c, "del/top.txt").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

/// Server-side copy.
pub async fn copy(b: &Backend) {
    let c = ctx();
    let data = pattern(100_000, 2);
    b.put(&c, "copy/a.bin", data.clone(), PutMode::Overwrite)
        .await
        .unwrap();
    b.copy(&c, "copy/a.bin", "copy/b.bin").await.unwrap();
    assert_eq!(b.get(&c, "copy/b.bin").await.unwrap().1, data);
}

/// Multipart uploads.
pub async fn multipart(b: &Backend) {
    let c = ctx();
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
}

/// Object attributes (content headers, user metadata with names every backend takes).
pub async fn attributes(b: &Backend) {
    let c = ctx();
    let data = pattern(100_000, 1);
    // attributes: kept with single and multipart writes, returned by HEAD, GET and the first-bytes GET,
    // kept by a copy; an overwrite without them has none
    let attrs = ObjectAttrs {
        content_type: Some("application/x-tar".into()),
        cache_control: Some("max-age=60".into()),
        content_disposition: Some("attachment; filename=\"s.tar\"".into()),
        user: [
            ("shard_index".to_string(), "7".to_string()),
            ("source".into(), "laion".into()),
        ]
        .into_iter()
        .collect(),
        // What S3 keeps beyond the headers: in the attributes' JSON on a local directory, in the one reserved
        // metadata entry on object stores, and back out of it, never among the user's metadata.
        expires: Some("Thu, 01 Dec 2033 16:00:00 GMT".into()),
        checksum: Some(strata_types::StoredChecksum {
            algorithm: strata_types::ChecksumAlgorithm::Sha256,
            value: "n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V1sFbDwCgg=-2".into(),
            full_object: false,
            parts: vec!["a+/=".into(), "b".into()],
        }),
        parts: vec![5 << 20, 17],
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
    // S3's own copy with other attributes (`REPLACE`); elsewhere none is made (the caller copies the bytes).
    let replaced = ObjectAttrs {
        content_type: Some("text/x-new".into()),
        ..Default::default()
    };
    match b
        .copy_with(&c, "attrs/s.tar", "attrs/replaced.tar", &replaced, None)
        .await
        .unwrap()
    {
        Some(_) => {
            let m = b.head(&c, "attrs/replaced.tar").await.unwrap();
            assert_eq!(m.attrs.as_deref(), Some(&replaced));
            assert_eq!(b.get(&c, "attrs/replaced.tar").await.unwrap().1, data);
        }
        None => assert!(b.head(&c, "attrs/replaced.tar").await.is_err()),
    }
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
    // (a server reports its default Content-Type for an object written without one: binary/octet-stream on S3,
    // application/octet-stream on Azure Blob and GCS)
    let bare = |a: Option<Arc<ObjectAttrs>>| {
        a.is_none_or(|a| {
            a.user.is_empty()
                && a.cache_control.is_none()
                && a.content_type
                    .as_deref()
                    .is_none_or(|t| t == "binary/octet-stream" || t == "application/octet-stream")
        })
    };
    let replaced = b.head(&c, "attrs/s.tar").await.unwrap().attrs;
    assert!(
        bare(replaced.clone()),
        "replaced without attributes: {replaced:?}"
    );
    b.put(&c, "attrs/plain.bin", data.clone(), PutMode::Overwrite)
        .await
        .unwrap();
    assert!(bare(b.head(&c, "attrs/plain.bin").await.unwrap().attrs));
}

/// User metadata names with hyphens (as S3 clients send them: `x-amz-meta-shard-index`) round-trip. Azure Blob
/// refuses them (its metadata names are C# identifiers), so the Azure backend runs another check instead.
pub async fn user_metadata_names(b: &Backend) {
    let c = ctx();
    let attrs = ObjectAttrs {
        user: [
            ("shard-index".to_string(), "7".to_string()),
            ("a-b-c".into(), "v".into()),
        ]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    b.put_with(
        &c,
        "meta/h.bin",
        Bytes::from_static(b"h"),
        PutMode::Overwrite,
        &attrs,
    )
    .await
    .unwrap();
    let got = b.head(&c, "meta/h.bin").await.unwrap().attrs.unwrap();
    assert_eq!(got.user, attrs.user);
}
