//! The S3 gateway driven in process through its `s3s::S3` implementation (no HTTP, no signing: the requests
//! arrive as s3s hands them over after authentication): range resolution, read conditions, HEAD, key
//! validation, request checks and checksum enforcement. The real clients (boto3, the aws cli, s5cmd) and SigV4
//! are tested in `tests/python`.

use bytes::Bytes;
use futures::TryStreamExt;
use s3s::auth::Credentials;
use s3s::dto::*;
use s3s::{S3, S3ErrorCode, S3Request};
use strata_server::gateway::Gateway;
use strata_server::gateway::auth::AccessKey;

const KEY: &str = "gwkey";
const SECRET: &str = "gw-secret-0123456789";

struct Env {
    gw: Gateway,
    _dir: tempfile::TempDir,
}

async fn env() -> Env {
    let (agent, dir) = super::common::agent().await;
    let keys = vec![AccessKey {
        access_key: KEY.into(),
        secret_key: SECRET.into(),
        principal: Some("root".into()),
        team: None,
        job: None,
    }];
    let gw = Gateway::new(agent, keys, "us-east-1".into()).unwrap();
    Env { gw, _dir: dir }
}

fn req<T>(input: T) -> S3Request<T> {
    S3Request {
        input,
        method: http::Method::GET,
        uri: http::Uri::from_static("/"),
        headers: http::HeaderMap::new(),
        extensions: http::Extensions::new(),
        credentials: Some(Credentials {
            access_key: KEY.into(),
            secret_key: SECRET.into(),
        }),
        region: None,
        service: None,
        trailing_headers: None,
    }
}

fn code<T: std::fmt::Debug>(r: s3s::S3Result<T>) -> S3ErrorCode {
    r.unwrap_err().code().clone()
}

async fn put(e: &Env, key: &str, data: &[u8]) -> String {
    let body = StreamingBlob::wrap(futures::stream::once({
        let b = Bytes::copy_from_slice(data);
        async move { Ok::<_, std::io::Error>(b) }
    }));
    let out =
        e.gw.put_object(req(PutObjectInput {
            bucket: "default".into(),
            key: key.into(),
            body: Some(body),
            content_length: Some(data.len() as i64),
            ..Default::default()
        }))
        .await
        .unwrap();
    match out.output.e_tag.unwrap() {
        ETag::Strong(v) | ETag::Weak(v) => v,
    }
}

async fn get(e: &Env, input: GetObjectInput) -> s3s::S3Result<(GetObjectOutput, Bytes)> {
    let mut out = e.gw.get_object(req(input)).await?.output;
    let body = out.body.take().unwrap();
    let parts: Vec<Bytes> = body.try_collect().await.unwrap();
    Ok((out, Bytes::from(parts.concat())))
}

fn get_input(key: &str) -> GetObjectInput {
    GetObjectInput {
        bucket: "default".into(),
        key: key.into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranges_resolve_as_s3_does() {
    let e = env().await;
    let data: Vec<u8> = (0..100u8).collect();
    put(&e, "r/obj", &data).await;
    let cases = [
        (
            Range::Int {
                first: 0,
                last: Some(9),
            },
            0..10,
            "bytes 0-9/100",
        ),
        (
            Range::Int {
                first: 90,
                last: None,
            },
            90..100,
            "bytes 90-99/100",
        ),
        (
            Range::Int {
                first: 50,
                last: Some(500),
            },
            50..100,
            "bytes 50-99/100",
        ),
        (Range::Suffix { length: 5 }, 95..100, "bytes 95-99/100"),
        (Range::Suffix { length: 500 }, 0..100, "bytes 0-99/100"),
    ];
    for (range, want, content_range) in cases {
        let (out, body) = get(
            &e,
            GetObjectInput {
                range: Some(range),
                ..get_input("r/obj")
            },
        )
        .await
        .unwrap();
        assert_eq!(&body[..], &data[want.clone()], "{range:?}");
        assert_eq!(out.content_length, Some((want.end - want.start) as i64));
        assert_eq!(out.content_range.as_deref(), Some(content_range));
    }
    let (out, body) = get(&e, get_input("r/obj")).await.unwrap();
    assert_eq!(&body[..], &data[..]);
    assert_eq!(out.content_range, None);
    for range in [
        Range::Int {
            first: 100,
            last: None,
        },
        Range::Int {
            first: 200,
            last: Some(300),
        },
        Range::Suffix { length: 0 },
    ] {
        let r = get(
            &e,
            GetObjectInput {
                range: Some(range),
                ..get_input("r/obj")
            },
        )
        .await;
        assert_eq!(code(r), S3ErrorCode::InvalidRange, "{range:?}");
    }
    // HEAD answers the range's length without a body.
    let out =
        e.gw.head_object(req(HeadObjectInput {
            bucket: "default".into(),
            key: "r/obj".into(),
            range: Some(Range::Int {
                first: 10,
                last: Some(19),
            }),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    assert_eq!(out.content_length, Some(10));
    assert_eq!(out.content_range.as_deref(), Some("bytes 10-19/100"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_conditions_follow_rfc_9110_order() {
    let e = env().await;
    let etag = put(&e, "c/obj", b"conditional").await;
    let strong = |v: &str| ETagCondition::ETag(ETag::Strong(v.into()));
    let modified = {
        let out =
            e.gw.head_object(req(HeadObjectInput {
                bucket: "default".into(),
                key: "c/obj".into(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .output;
        out.last_modified.unwrap()
    };
    let at = |delta: i64| -> Timestamp {
        let t: time::OffsetDateTime = modified.clone().into();
        Timestamp::from(t + time::Duration::seconds(delta))
    };
    // If-Match: the current ETag or `*` reads; another is 412; it wins over If-Unmodified-Since.
    assert!(
        get(
            &e,
            GetObjectInput {
                if_match: Some(strong(&etag)),
                ..get_input("c/obj")
            }
        )
        .await
        .is_ok()
    );
    assert!(
        get(
            &e,
            GetObjectInput {
                if_match: Some(ETagCondition::Any),
                ..get_input("c/obj")
            }
        )
        .await
        .is_ok()
    );
    let r = get(
        &e,
        GetObjectInput {
            if_match: Some(strong("other")),
            ..get_input("c/obj")
        },
    )
    .await;
    assert_eq!(code(r), S3ErrorCode::PreconditionFailed);
    let r = GetObjectInput {
        if_match: Some(strong(&etag)),
        if_unmodified_since: Some(at(-3600)),
        ..get_input("c/obj")
    };
    assert!(get(&e, r).await.is_ok());
    let r = get(
        &e,
        GetObjectInput {
            if_unmodified_since: Some(at(-3600)),
            ..get_input("c/obj")
        },
    )
    .await;
    assert_eq!(code(r), S3ErrorCode::PreconditionFailed);
    // If-None-Match: the current ETag is 304; it wins over If-Modified-Since.
    let r = get(
        &e,
        GetObjectInput {
            if_none_match: Some(strong(&etag)),
            ..get_input("c/obj")
        },
    )
    .await;
    assert_eq!(code(r), S3ErrorCode::NotModified);
    let r = GetObjectInput {
        if_none_match: Some(strong("other")),
        if_modified_since: Some(at(3600)),
        ..get_input("c/obj")
    };
    assert!(get(&e, r).await.is_ok());
    let r = get(
        &e,
        GetObjectInput {
            if_modified_since: Some(at(3600)),
            ..get_input("c/obj")
        },
    )
    .await;
    assert_eq!(code(r), S3ErrorCode::NotModified);
    assert!(
        get(
            &e,
            GetObjectInput {
                if_modified_since: Some(at(-3600)),
                ..get_input("c/obj")
            }
        )
        .await
        .is_ok()
    );
    // HEAD evaluates them too.
    let r =
        e.gw.head_object(req(HeadObjectInput {
            bucket: "default".into(),
            key: "c/obj".into(),
            if_match: Some(strong("other")),
            ..Default::default()
        }))
        .await;
    assert_eq!(code(r), S3ErrorCode::PreconditionFailed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_s3_errors() {
    let e = env().await;
    put(&e, "ok/obj", b"x").await;
    // Anonymous, another region, another service.
    let mut r = req(get_input("ok/obj"));
    r.credentials = None;
    assert_eq!(code(e.gw.get_object(r).await), S3ErrorCode::AccessDenied);
    let mut r = req(get_input("ok/obj"));
    r.region = Some("eu-west-1".parse().unwrap());
    assert_eq!(
        code(e.gw.get_object(r).await),
        S3ErrorCode::SignatureDoesNotMatch
    );
    let mut r = req(get_input("ok/obj"));
    r.credentials = Some(Credentials {
        access_key: "nosuchkey".into(),
        secret_key: SECRET.into(),
    });
    assert_eq!(
        code(e.gw.get_object(r).await),
        S3ErrorCode::InvalidAccessKeyId
    );
    // Keys that are not plain paths are keys like any other (S3 allows them; a local directory escapes
    // them), a key S3 refuses, a bucket that is not configured, a key that is not there.
    for odd in ["a/../b", "a//b", "/abs"] {
        assert_eq!(
            code(get(&e, get_input(odd)).await),
            S3ErrorCode::NoSuchKey,
            "{odd}"
        );
    }
    let long = "k".repeat(1100);
    assert_eq!(
        code(get(&e, get_input(&long)).await),
        S3ErrorCode::KeyTooLongError
    );
    let r = get(
        &e,
        GetObjectInput {
            bucket: "nosuchbucket".into(),
            ..get_input("ok/obj")
        },
    )
    .await;
    assert_eq!(code(r), S3ErrorCode::NoSuchBucket);
    assert_eq!(
        code(get(&e, get_input("ok/missing")).await),
        S3ErrorCode::NoSuchKey
    );
    // A body that does not match its Content-MD5 is refused and nothing is stored.
    let body = StreamingBlob::wrap(futures::stream::once(async {
        Ok::<_, std::io::Error>(Bytes::from_static(b"payload"))
    }));
    let r =
        e.gw.put_object(req(PutObjectInput {
            bucket: "default".into(),
            key: "ok/md5".into(),
            body: Some(body),
            content_length: Some(7),
            content_md5: Some("1B2M2Y8AsgTpgAmY7PhCfg==".into()),
            ..Default::default()
        }))
        .await;
    assert_eq!(code(r), S3ErrorCode::BadDigest);
    assert_eq!(
        code(get(&e, get_input("ok/md5")).await),
        S3ErrorCode::NoSuchKey
    );
}
