//! The S3-compatible caching gateway.
//!
//! Built on `s3s` (S3 protocol parsing, SigV4 header and presigned-URL authentication against
//! [`tenancy::CatalogAuth`]: the configured keys, then the catalog's), served by hyper behind `ScopeCheck`,
//! which refuses a request signed for another region or service (403 `SignatureDoesNotMatch`) before s3s
//! parses it. Buckets are the agent's configured backends, by name. Every operation first maps the
//! credentials to an `IoContext` (principal and team from the key, job from `x-strata-job`, else the key's
//! `job`), the bucket to a backend, and validates the key; [`tenancy`] then decides ownership and quota.
//! The user-facing page is `docs/gateway.md`.
//!
//! - **Reads** go through the tiered cache. A GET from byte 0 (or without a range) opens with
//!   [`strata_cache::BlockCache::open_object_reading`], so a cold small object costs one origin request and
//!   the first part of a large one too; a later range opens with `open_object` (HEAD, or the metadata TTL).
//!   Then the conditional headers are checked against that version. A range inside one RAM-held block is
//!   answered at once (`read_cached`); otherwise the range is `prefetch`ed as runs (waiting for budget for the
//!   first run only) and streamed block by block through a one-block channel (`ChannelBody`): the body task
//!   reads the next block only once the connection has taken the last, and each block's budget share is held
//!   until then, so a sender holds at most two blocks and cold bytes on their way out stay inside the
//!   in-flight budget. Access times are recorded once per object version and second.
//! - **Listings** without a delimiter read one page through [`strata_object::Backend::list_page`]; `/`
//!   delimited ones read the whole directory per page (object_store has no delimited listing from an
//!   offset). Continuation tokens are the hex of the last key. Keys under prefixes the caller may not read are
//!   removed from the page afterwards.
//! - **Writes** go through to the backend: bodies up to 8 MiB are buffered and sent with one PUT, larger ones
//!   stream as a backend multipart upload; Content-MD5 and `x-amz-checksum-*` (streaming trailers included)
//!   are verified before the upload completes, and a mismatch aborts it, so nothing is visible. Every write
//!   and delete invalidates the key's cached metadata, whatever happened at the backend: that is what makes
//!   read-after-write hold with a metadata TTL. Multipart uploads are staged on local disk ([`multipart`])
//!   and reach the backend only on complete, as one backend upload.
//! - **Attributes** (Content-Type, Content-Encoding less `aws-chunked`, Content-Disposition,
//!   Content-Language, Cache-Control, `x-amz-meta-*` up to 2 KiB) travel as [`strata_types::ObjectAttrs`]
//!   with the write and back through the metadata cache to GET and HEAD; `response-*` parameters override them
//!   per GET. CopyObject keeps the source's (server-side within a bucket, through the cache across buckets)
//!   or, with `MetadataDirective: REPLACE`, takes the request's.
//!
//! Safety: every key is validated (`..`/`.` segments, empty segments, absolute keys, NUL and backslashes are
//! refused) before any backend call; anonymous requests, unknown keys, bad signatures, clock skew over 15
//! minutes, expired presigned URLs, and a region or service other than ours are refused with the S3 error code
//! a client expects; Content-MD5 and `x-amz-checksum-*` mismatches are refused and nothing is stored.

pub mod auth;
pub mod multipart;
pub mod tenancy;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use s3s::crypto::Checksum as _;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};
use strata_cache::{ByteRange, ETagMatch, GetOptions};
use strata_object::{Backend, PutMode};
use strata_types::{Error, ErrorKind, IoContext, ObjectAttrs, ObjectMeta, validate_key};
use tokio::io::AsyncWriteExt;

use crate::Agent;
use auth::AccessKey;
use multipart::{Staging, UploadInfo};
use strata_catalog::Role;
use tenancy::{Caller, Tenancy};

/// Single PUTs up to this size are buffered and sent in one request; larger bodies stream as a backend
/// multipart upload.
const SINGLE_PUT_MAX: usize = 8 * 1024 * 1024;
/// Part size of backend multipart uploads made by the gateway.
const BACKEND_PART: usize = 8 * 1024 * 1024;
/// Reads of one object version within this many seconds of the last recorded one are not recorded again.
/// One second is the catalog's own resolution (a clean-up skips an object read *after* its plan, compared in
/// whole seconds), so nothing it decides on is lost, and a hot object costs one record a second, not one per
/// read.
const ACCESS_RESOLUTION_SECS: i64 = 1;
/// The S3 minimum size of every part but the last.
const MIN_PART: u64 = 5 * 1024 * 1024;

/// The gateway's S3 implementation.
#[derive(Debug)]
pub struct Gateway {
    agent: Arc<Agent>,
    staging: Staging,
    keys: HashMap<String, AccessKey>,
    region: String,
    tenancy: Tenancy,
}

/// An authenticated request's caller.
struct Who {
    ctx: IoContext,
    caller: Caller,
    access_key: String,
    dataset: Option<String>,
}

/// Map a Strata error to the S3 error a client expects.
fn s3err(e: Error) -> S3Error {
    let code = match e.kind() {
        ErrorKind::NotFound => S3ErrorCode::NoSuchKey,
        ErrorKind::InvalidInput => S3ErrorCode::InvalidArgument,
        ErrorKind::InvalidRange => S3ErrorCode::InvalidRange,
        ErrorKind::PreconditionFailed | ErrorKind::AlreadyExists => S3ErrorCode::PreconditionFailed,
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => S3ErrorCode::AccessDenied,
        ErrorKind::Unavailable | ErrorKind::Timeout => S3ErrorCode::ServiceUnavailable,
        ErrorKind::ResourceExhausted => S3ErrorCode::SlowDown,
        ErrorKind::Unsupported => S3ErrorCode::NotImplemented,
        _ => S3ErrorCode::InternalError,
    };
    if code == S3ErrorCode::InternalError || code == S3ErrorCode::ServiceUnavailable {
        tracing::warn!(error = %e, "gateway request failed");
    }
    S3Error::with_message(code, e.message().to_string())
}

fn etag_of(meta: &ObjectMeta) -> Option<ETag> {
    meta.etag.as_deref().map(plain_etag)
}

/// Backends report ETags with or without quotes; S3 clients get one strong ETag.
fn plain_etag(raw: &str) -> ETag {
    let v = raw.trim_start_matches("W/").trim_matches('"');
    ETag::Strong(v.to_string())
}

/// S3's limit on user metadata: names and values together, in bytes.
const USER_METADATA_MAX: usize = 2048;

/// The attributes a write asks to keep (PutObject, CreateMultipartUpload, CopyObject with `REPLACE`). The
/// `aws-chunked` content coding of a streaming upload describes the request, not the object, and is dropped, as
/// S3 does; user metadata names are kept in lower case.
fn attrs_in(
    content_type: Option<String>,
    content_encoding: Option<String>,
    content_disposition: Option<String>,
    content_language: Option<String>,
    cache_control: Option<String>,
    metadata: Option<Metadata>,
) -> S3Result<ObjectAttrs> {
    let content_encoding = content_encoding.and_then(|e| {
        let kept: Vec<&str> = e
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
            .collect();
        (!kept.is_empty()).then(|| kept.join(", "))
    });
    let user: std::collections::BTreeMap<String, String> = metadata
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let size: usize = user.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > USER_METADATA_MAX {
        return Err(s3_error!(
            MetadataTooLarge,
            "user metadata is {size} bytes; at most {USER_METADATA_MAX} are allowed"
        ));
    }
    Ok(ObjectAttrs {
        content_type,
        content_encoding,
        content_disposition,
        content_language,
        cache_control,
        user,
    })
}

/// An object's attributes (none when it has none), for the response fields.
fn attrs_out(attrs: &Option<Arc<ObjectAttrs>>) -> ObjectAttrs {
    attrs.as_deref().cloned().unwrap_or_default()
}

/// User metadata as the `x-amz-meta-*` response headers (none when empty).
fn metadata_out(user: std::collections::BTreeMap<String, String>) -> Option<Metadata> {
    (!user.is_empty()).then(|| user.into_iter().collect())
}

/// [`attrs_in`] from a request input with the usual fields (PutObject, CreateMultipartUpload, CopyObject).
macro_rules! attrs_of_input {
    ($input:expr) => {
        attrs_in(
            $input.content_type,
            $input.content_encoding,
            $input.content_disposition,
            $input.content_language,
            $input.cache_control,
            $input.metadata,
        )
    };
}

fn timestamp(unix: i64) -> Timestamp {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(unix.max(0) as u64);
    Timestamp::from(t)
}

fn unix_of(t: &Timestamp) -> i64 {
    let odt: time::OffsetDateTime = t.clone().into();
    odt.unix_timestamp()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn check_key(key: &str) -> S3Result<()> {
    validate_key(key).map(|_| ()).map_err(|e| {
        let code = if key.len() > 1024 {
            S3ErrorCode::KeyTooLongError
        } else {
            S3ErrorCode::InvalidArgument
        };
        S3Error::with_message(code, e.message().to_string())
    })
}

/// A GET's or HEAD's range and preconditions as the cache's read call takes them (the cache evaluates them,
/// in RFC 9110 order, as S3 does).
fn get_options(
    range: Option<&s3s::dto::Range>,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
    if_modified_since: Option<&Timestamp>,
    if_unmodified_since: Option<&Timestamp>,
) -> GetOptions {
    let tag = |c: &ETagCondition| match c {
        ETagCondition::Any => ETagMatch::Any,
        ETagCondition::ETag(ETag::Strong(v)) => ETagMatch::Strong(v.clone()),
        ETagCondition::ETag(ETag::Weak(v)) => ETagMatch::Weak(v.clone()),
    };
    let mut o = GetOptions::default();
    o.range = range.map(|r| match *r {
        s3s::dto::Range::Int {
            first,
            last: Some(last),
        } => ByteRange::Bounded { first, last },
        s3s::dto::Range::Int { first, last: None } => ByteRange::From { first },
        s3s::dto::Range::Suffix { length } => ByteRange::Suffix { len: length },
    });
    o.if_match = if_match.map(tag);
    o.if_none_match = if_none_match.map(tag);
    o.if_modified_since = if_modified_since.map(unix_of);
    o.if_unmodified_since = if_unmodified_since.map(unix_of);
    o
}

/// Checksums a request body must match: Content-MD5 and any `x-amz-checksum-*` the client sent.
struct BodyCheck {
    md5: s3s::crypto::Md5,
    checksum: s3s::checksum::ChecksumHasher,
    content_md5: Option<String>,
    expected: s3s::dto::Checksum,
    /// Verified trailing headers of a streaming (aws-chunked) upload, read once the body is consumed.
    trailers: Option<s3s::TrailingHeaders>,
}

impl BodyCheck {
    #[allow(clippy::too_many_arguments)]
    fn new(
        content_md5: Option<String>,
        algorithm: Option<&ChecksumAlgorithm>,
        crc32: Option<String>,
        crc32c: Option<String>,
        sha1: Option<String>,
        sha256: Option<String>,
        crc64nvme: Option<String>,
    ) -> S3Result<Self> {
        let mut checksum = s3s::checksum::ChecksumHasher::default();
        if crc32.is_some() {
            checksum.crc32 = Some(Default::default());
        }
        if crc32c.is_some() {
            checksum.crc32c = Some(Default::default());
        }
        if sha1.is_some() {
            checksum.sha1 = Some(Default::default());
        }
        if sha256.is_some() {
            checksum.sha256 = Some(Default::default());
        }
        if crc64nvme.is_some() {
            checksum.crc64nvme = Some(Default::default());
        }
        if let Some(alg) = algorithm {
            match alg.as_str() {
                ChecksumAlgorithm::CRC32 => checksum.crc32 = Some(Default::default()),
                ChecksumAlgorithm::CRC32C => checksum.crc32c = Some(Default::default()),
                ChecksumAlgorithm::SHA1 => checksum.sha1 = Some(Default::default()),
                ChecksumAlgorithm::SHA256 => checksum.sha256 = Some(Default::default()),
                ChecksumAlgorithm::CRC64NVME => checksum.crc64nvme = Some(Default::default()),
                other => {
                    return Err(s3_error!(
                        NotImplemented,
                        "unsupported checksum algorithm {other}"
                    ));
                }
            }
        }
        Ok(Self {
            md5: s3s::crypto::Md5::new(),
            checksum,
            content_md5,
            expected: s3s::dto::Checksum {
                checksum_crc32: crc32,
                checksum_crc32c: crc32c,
                checksum_sha1: sha1,
                checksum_sha256: sha256,
                checksum_crc64nvme: crc64nvme,
                ..Default::default()
            },
            trailers: None,
        })
    }

    fn with_trailers(mut self, t: Option<s3s::TrailingHeaders>) -> Self {
        self.trailers = t;
        self
    }

    fn update(&mut self, b: &[u8]) {
        self.md5.update(b);
        self.checksum.update(b);
    }

    /// Verify; returns the body's hex MD5. `trailers` are the verified trailing headers of a streaming upload.
    fn finish(mut self) -> S3Result<String> {
        let trailers = self.trailers.take().and_then(|t| t.take());
        let trailers = trailers.as_ref();
        let md5 = self.md5.finalize();
        if let Some(want) = &self.content_md5 {
            let want = base64_decode(want)
                .ok_or_else(|| s3_error!(InvalidDigest, "Content-MD5 is not valid base64"))?;
            if want != md5 {
                return Err(s3_error!(
                    BadDigest,
                    "the Content-MD5 you specified did not match what we received"
                ));
            }
        }
        if let Some(t) = trailers {
            let get = |name: &str| {
                t.get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            };
            let e = &mut self.expected;
            e.checksum_crc32 = get("x-amz-checksum-crc32").or(e.checksum_crc32.take());
            e.checksum_crc32c = get("x-amz-checksum-crc32c").or(e.checksum_crc32c.take());
            e.checksum_sha1 = get("x-amz-checksum-sha1").or(e.checksum_sha1.take());
            e.checksum_sha256 = get("x-amz-checksum-sha256").or(e.checksum_sha256.take());
            e.checksum_crc64nvme = get("x-amz-checksum-crc64nvme").or(e.checksum_crc64nvme.take());
        }
        let got = self.checksum.finalize();
        let pairs = [
            ("crc32", &got.checksum_crc32, &self.expected.checksum_crc32),
            (
                "crc32c",
                &got.checksum_crc32c,
                &self.expected.checksum_crc32c,
            ),
            ("sha1", &got.checksum_sha1, &self.expected.checksum_sha1),
            (
                "sha256",
                &got.checksum_sha256,
                &self.expected.checksum_sha256,
            ),
            (
                "crc64nvme",
                &got.checksum_crc64nvme,
                &self.expected.checksum_crc64nvme,
            ),
        ];
        for (name, got, want) in pairs {
            if let Some(want) = want
                && got.as_deref() != Some(want.as_str())
            {
                return Err(s3_error!(
                    BadDigest,
                    "x-amz-checksum-{name} did not match what we received"
                ));
            }
        }
        Ok(hex(&md5))
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let s = s.trim().trim_end_matches('=');
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes() {
        let v = T.iter().position(|&t| t == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

impl Gateway {
    /// A gateway over the agent's backends, with these access keys.
    pub fn new(
        agent: Arc<Agent>,
        keys: Vec<AccessKey>,
        region: String,
    ) -> strata_types::Result<Self> {
        let staging = Staging::open(&agent.config().data_dir.join("uploads"))?;
        let tenancy = Tenancy::new(
            agent.catalog().clone(),
            agent.config().catalog.reservation_ttl_secs,
        );
        Ok(Self {
            tenancy,
            agent,
            staging,
            keys: keys
                .into_iter()
                .map(|k| (k.access_key.clone(), k))
                .collect(),
            region,
        })
    }

    /// The `s3s` authenticator: the configured keys, then the catalog's S3 keys.
    pub fn auth(&self) -> tenancy::CatalogAuth {
        self.tenancy.auth(
            self.keys
                .values()
                .map(|k| (k.access_key.clone(), k.secret_key.clone()))
                .collect(),
        )
    }

    /// The caller of an authenticated request: its I/O context (principal, team, job) and who it is.
    async fn who<T>(&self, req: &S3Request<T>) -> S3Result<Who> {
        let mut ctx = self.ctx(req)?;
        let access_key = req
            .credentials
            .as_ref()
            .map(|c| c.access_key.clone())
            .unwrap_or_default();
        let caller = match self.keys.get(&access_key) {
            Some(k) => Caller::Root {
                team: k.team.clone(),
            },
            None => match self.tenancy.principal(&access_key).await? {
                Some(p) => {
                    ctx.principal = Some(Arc::from(p.id.as_str()));
                    ctx.team = p.team.as_deref().map(Arc::from);
                    Caller::Principal(p)
                }
                None => return Err(s3_error!(InvalidAccessKeyId)),
            },
        };
        let dataset = req
            .headers
            .get("x-strata-dataset")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 256)
            .map(str::to_string);
        Ok(Who {
            ctx,
            caller,
            access_key,
            dataset,
        })
    }

    /// Authenticated caller → I/O context. Refuses anonymous requests and a signing scope (region, service)
    /// that is not ours.
    fn ctx<T>(&self, req: &S3Request<T>) -> S3Result<IoContext> {
        let Some(creds) = &req.credentials else {
            return Err(s3_error!(
                AccessDenied,
                "anonymous requests are not allowed; sign with an access key"
            ));
        };
        if let Some(region) = &req.region
            && region.as_str() != self.region
        {
            return Err(s3_error!(
                SignatureDoesNotMatch,
                "the request is signed for region {region}, this gateway is {}",
                self.region
            ));
        }
        if let Some(service) = &req.service
            && service != "s3"
        {
            return Err(s3_error!(
                SignatureDoesNotMatch,
                "the request is signed for service {service}, not s3"
            ));
        }
        let key = self.keys.get(&creds.access_key);
        // The job: the request's `x-strata-job` header, else the access key's job tag.
        let job = req
            .headers
            .get("x-strata-job")
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 256)
            .or_else(|| key.and_then(|k| k.job.as_deref()))
            .map(Arc::from);
        Ok(IoContext {
            principal: Some(Arc::from(
                key.and_then(|k| k.principal.clone())
                    .unwrap_or_else(|| creds.access_key.clone()),
            )),
            team: key.and_then(|k| k.team.clone()).map(Arc::from),
            job,
        })
    }

    /// The I/O context and the access key of an authenticated request.
    fn caller<T>(&self, req: &S3Request<T>) -> S3Result<(IoContext, String)> {
        let ctx = self.ctx(req)?;
        let key = req
            .credentials
            .as_ref()
            .map(|c| c.access_key.clone())
            .unwrap_or_default();
        Ok((ctx, key))
    }

    fn backend(&self, bucket: &str) -> S3Result<Backend> {
        self.agent
            .backends()
            .iter()
            .find(|b| b.name == bucket)
            .map(|b| b.backend.clone())
            .ok_or_else(|| {
                s3_error!(
                    NoSuchBucket,
                    "no bucket {bucket:?}: buckets are the configured backends"
                )
            })
    }

    fn owner_check(
        &self,
        upload_id: &str,
        bucket: &str,
        key: &str,
        access_key: &str,
    ) -> S3Result<UploadInfo> {
        let info = self
            .staging
            .info(upload_id)
            .map_err(|_| s3_error!(NoSuchUpload))?;
        if info.bucket != bucket || info.key != key {
            return Err(s3_error!(
                NoSuchUpload,
                "the upload belongs to another object"
            ));
        }
        if info.owner != access_key {
            return Err(s3_error!(
                AccessDenied,
                "the upload belongs to another access key"
            ));
        }
        Ok(info)
    }

    /// Store a body at `bucket/key`: buffered for small bodies, streamed as a backend multipart upload for
    /// large ones; checksums are verified before anything becomes visible.
    #[allow(clippy::too_many_arguments)]
    async fn store(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        body: StreamingBlob,
        mut check: BodyCheck,
        mode: PutMode,
        attrs: &ObjectAttrs,
    ) -> S3Result<(Option<String>, u64)> {
        let mut body = body;
        let mut buf: Vec<Bytes> = Vec::new();
        let mut buffered = 0usize;
        let mut received = 0u64;
        let mut upload = None;
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| s3_error!(IncompleteBody, "reading the request body: {e}"))?;
            check.update(&chunk);
            received += chunk.len() as u64;
            match upload.as_mut() {
                None if buffered + chunk.len() <= SINGLE_PUT_MAX => {
                    buffered += chunk.len();
                    buf.push(chunk);
                }
                None => {
                    if mode != PutMode::Overwrite {
                        return Err(s3_error!(
                            NotImplemented,
                            "conditional writes are limited to 8 MiB bodies"
                        ));
                    }
                    let mut up = backend
                        .put_multipart_with(ctx, key, BACKEND_PART, attrs)
                        .await
                        .map_err(s3err)?;
                    for b in buf.drain(..) {
                        up.write(b).await.map_err(s3err)?;
                    }
                    up.write(chunk).await.map_err(s3err)?;
                    upload = Some(up);
                }
                Some(up) => up.write(chunk).await.map_err(s3err)?,
            }
        }
        let verified = check.finish();
        match upload {
            Some(up) => {
                if let Err(e) = verified {
                    let _ = up.abort().await;
                    return Err(e);
                }
                Ok((up.complete().await.map_err(s3err)?.etag, received))
            }
            None => {
                verified?;
                let mut all = Vec::with_capacity(buffered);
                for b in &buf {
                    all.extend_from_slice(b);
                }
                Ok((
                    backend
                        .put_with(ctx, key, Bytes::from(all), mode, attrs)
                        .await
                        .map_err(s3err)?
                        .etag,
                    received,
                ))
            }
        }
    }

    fn object_entry(meta: &ObjectMeta) -> Object {
        Object {
            key: Some(meta.key.clone()),
            size: Some(meta.size as i64),
            e_tag: etag_of(meta),
            last_modified: Some(timestamp(meta.last_modified_unix)),
            storage_class: Some(ObjectStorageClass::from_static(
                ObjectStorageClass::STANDARD,
            )),
            ..Default::default()
        }
    }

    /// The listing core shared by ListObjects and ListObjectsV2: entries after `after`, at most `max`.
    async fn list(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max: usize,
    ) -> S3Result<(Vec<Object>, Vec<CommonPrefix>, Option<String>)> {
        if !prefix.is_empty() && (prefix.contains('\0') || prefix.split('/').any(|s| s == "..")) {
            return Err(s3_error!(InvalidArgument, "invalid prefix"));
        }
        match delimiter {
            None | Some("") => {
                let page = backend
                    .list_page(ctx, prefix, after, max.max(1))
                    .await
                    .map_err(s3err)?;
                let objects = if max == 0 {
                    Vec::new()
                } else {
                    page.objects.iter().map(Self::object_entry).collect()
                };
                Ok((
                    objects,
                    Vec::new(),
                    if max == 0 {
                        None
                    } else {
                        page.next_start_after
                    },
                ))
            }
            Some("/") => {
                let page = backend.list_delimited(ctx, prefix).await.map_err(s3err)?;
                // Merge objects and prefixes in key order, then page.
                let mut entries: Vec<(String, Option<ObjectMeta>)> = page
                    .objects
                    .into_iter()
                    .map(|o| (o.key.clone(), Some(o)))
                    .chain(page.common_prefixes.into_iter().map(|p| (p, None)))
                    .filter(|(k, _)| after.is_none_or(|a| k.as_str() > a))
                    .collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                let truncated = entries.len() > max;
                entries.truncate(max);
                let next = if truncated {
                    entries.last().map(|e| e.0.clone())
                } else {
                    None
                };
                let mut objects = Vec::new();
                let mut prefixes = Vec::new();
                for (k, m) in entries {
                    match m {
                        Some(m) => objects.push(Self::object_entry(&m)),
                        None => prefixes.push(CommonPrefix { prefix: Some(k) }),
                    }
                }
                Ok((objects, prefixes, next))
            }
            Some(d) => Err(s3_error!(
                NotImplemented,
                "only '/' is supported as a delimiter, not {d:?}"
            )),
        }
    }
}

fn token_encode(key: &str) -> String {
    hex(key.as_bytes())
}

fn token_decode(t: &str) -> S3Result<String> {
    let bad = || s3_error!(InvalidArgument, "the continuation token is not valid");
    if !t.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Option<Vec<u8>> = (0..t.len())
        .step_by(2)
        .map(|i| t.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes.ok_or_else(bad)?).map_err(|_| bad())
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        self.ctx(&req)?;
        let buckets = self
            .agent
            .backends()
            .iter()
            .map(|b| Bucket {
                name: Some(b.name.clone()),
                creation_date: Some(timestamp(0)),
                bucket_region: Some(self.region.clone()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            ..Default::default()
        }))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.ctx(&req)?;
        self.backend(&req.input.bucket)?;
        Ok(S3Response::new(HeadBucketOutput {
            bucket_region: Some(self.region.clone()),
            ..Default::default()
        }))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.ctx(&req)?;
        self.backend(&req.input.bucket)?;
        Ok(S3Response::new(GetBucketLocationOutput {
            location_constraint: (self.region != "us-east-1")
                .then(|| BucketLocationConstraint::from(self.region.clone())),
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx;
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        check_key(&input.key)?;
        self.tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Reader)
            .await?;
        let res = self
            .agent
            .cache()
            .get(
                &ctx,
                &backend,
                &input.key,
                get_options(
                    input.range.as_ref(),
                    input.if_match.as_ref(),
                    input.if_none_match.as_ref(),
                    input.if_modified_since.as_ref(),
                    input.if_unmodified_since.as_ref(),
                ),
            )
            .await
            .map_err(s3err)?;
        if res.not_modified {
            return Err(s3_error!(NotModified));
        }
        let now = self.agent.catalog().now();
        // One access-time record per object version and second: a hot object read thousands of times a
        // second takes the access log's lock once.
        if res.mark_read(now, ACCESS_RESOLUTION_SECS) {
            self.agent
                .access_log()
                .record(&input.bucket, &input.key, now);
        }
        let (e_tag, last_modified) = (etag_of(&res.meta), timestamp(res.meta.last_modified_unix));
        let content_range = res.content_range();
        let len = res.range.end - res.range.start;
        let meta_attrs = res.meta.attrs.clone();
        let body = StreamingBlob::wrap(res.body.map_err(|e| std::io::Error::other(e.to_string())));
        let a = attrs_out(&meta_attrs);
        Ok(S3Response::new(GetObjectOutput {
            body: Some(body),
            content_length: Some(len as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag,
            last_modified: Some(last_modified),
            // A signed request may override the stored headers (`response-content-type=` and the like).
            content_type: input.response_content_type.or(a.content_type),
            content_encoding: input.response_content_encoding.or(a.content_encoding),
            content_disposition: input.response_content_disposition.or(a.content_disposition),
            content_language: input.response_content_language.or(a.content_language),
            cache_control: input.response_cache_control.or(a.cache_control),
            metadata: metadata_out(a.user),
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx;
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        check_key(&input.key)?;
        self.tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Reader)
            .await?;
        let res = self
            .agent
            .cache()
            .get(
                &ctx,
                &backend,
                &input.key,
                get_options(
                    input.range.as_ref(),
                    input.if_match.as_ref(),
                    input.if_none_match.as_ref(),
                    input.if_modified_since.as_ref(),
                    input.if_unmodified_since.as_ref(),
                )
                .head(),
            )
            .await
            .map_err(s3err)?;
        if res.not_modified {
            return Err(s3_error!(NotModified));
        }
        let content_range = res.content_range();
        let len = res.range.end - res.range.start;
        let meta = res.meta;
        let a = attrs_out(&meta.attrs);
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(len as i64),
            content_range,
            accept_ranges: Some("bytes".into()),
            e_tag: etag_of(&meta),
            last_modified: Some(timestamp(meta.last_modified_unix)),
            content_type: a.content_type,
            content_encoding: a.content_encoding,
            content_disposition: a.content_disposition,
            content_language: a.content_language,
            cache_control: a.cache_control,
            metadata: metadata_out(a.user),
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let token = input
            .continuation_token
            .as_deref()
            .map(token_decode)
            .transpose()?;
        let after = match (token, input.start_after.clone()) {
            (Some(t), Some(s)) => Some(t.max(s)),
            (t, s) => t.or(s),
        };
        let (objects, prefixes, next) = self
            .list(
                &ctx,
                &backend,
                &prefix,
                input.delimiter.as_deref(),
                after.as_deref(),
                max,
            )
            .await?;
        // Keys under a prefix owned by a team the caller may not read are not shown.
        let (objects, prefixes) = self
            .tenancy
            .visible(&input.bucket, &who.caller, objects, prefixes)
            .await?;
        let key_count = (objects.len() + prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            is_truncated: Some(next.is_some()),
            next_continuation_token: next.as_deref().map(token_encode),
            continuation_token: input.continuation_token,
            start_after: input.start_after,
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.unwrap_or(1000).clamp(0, 1000) as usize;
        let (objects, prefixes, next) = self
            .list(
                &ctx,
                &backend,
                &prefix,
                input.delimiter.as_deref(),
                input.marker.as_deref(),
                max,
            )
            .await?;
        // Keys under a prefix owned by a team the caller may not read are not shown.
        let (objects, prefixes) = self
            .tenancy
            .visible(&input.bucket, &who.caller, objects, prefixes)
            .await?;
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: input.prefix,
            delimiter: input.delimiter,
            marker: input.marker,
            max_keys: Some(max as i32),
            is_truncated: Some(next.is_some()),
            next_marker: next,
            contents: Some(objects),
            common_prefixes: Some(prefixes),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let decoded_len = req
            .headers
            .get("x-amz-decoded-content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i64>().ok());
        let trailers = req.trailing_headers;
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        check_key(&input.key)?;
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        let size = match decoded_len.or(input.content_length) {
            Some(n) => n,
            None if team.is_some() => {
                return Err(s3_error!(
                    MissingContentLength,
                    "a write charged to a quota needs its Content-Length"
                ));
            }
            None => 0,
        };
        // Quota before bytes: admitted (reserved) before the body is read.
        let res = self
            .tenancy
            .admit(team.as_deref(), &input.bucket, size, 1)
            .await?;
        let mode = match (&input.if_none_match, &input.if_match) {
            (Some(c), _) if c.is_any() => PutMode::Create,
            (_, Some(ETagCondition::ETag(e))) => PutMode::IfMatch(format!("\"{}\"", e.value())),
            (None, None) => PutMode::Overwrite,
            _ => return Err(s3_error!(NotImplemented, "unsupported conditional write")),
        };
        let check = BodyCheck::new(
            input.content_md5,
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32,
            input.checksum_crc32c,
            input.checksum_sha1,
            input.checksum_sha256,
            input.checksum_crc64nvme,
        )?
        .with_trailers(trailers);
        let attrs = attrs_of_input!(input);
        let attrs = match attrs {
            Ok(a) => a,
            Err(e) => {
                self.tenancy.release(res).await;
                return Err(e);
            }
        };
        let body = input.body.unwrap_or_else(|| {
            StreamingBlob::wrap(futures::stream::empty::<Result<Bytes, std::io::Error>>())
        });
        let etag = self
            .store(&ctx, &backend, &input.key, body, check, mode, &attrs)
            .await;
        // Whatever happened at the backend, the next read asks it again.
        self.agent.cache().invalidate(&backend, &input.key);
        let (etag, received) = match etag {
            Ok(e) => e,
            Err(e) => {
                self.tenancy.release(res).await;
                return Err(e);
            }
        };
        // Charged what was stored (a streaming upload's Content-Length counts its chunk framing too).
        self.tenancy
            .written(
                res.into_iter().collect(),
                &input.bucket,
                &input.key,
                received as i64,
                etag.clone(),
                team,
                &who.caller,
                ctx.job.as_deref().map(str::to_string),
                who.dataset.clone(),
            )
            .await;
        Ok(S3Response::new(PutObjectOutput {
            e_tag: etag.as_deref().map(plain_etag),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx;
        let backend = self.backend(&req.input.bucket)?;
        check_key(&req.input.key)?;
        self.tenancy
            .attribute(&req.input.bucket, &req.input.key, &who.caller, Role::Member)
            .await?;
        let r = backend.delete(&ctx, &req.input.key).await;
        self.agent.cache().invalidate(&backend, &req.input.key);
        r.map_err(s3err)?;
        self.tenancy
            .deleted(&req.input.bucket, &req.input.key)
            .await;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx;
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        if input.delete.objects.len() > 1000 {
            return Err(s3_error!(
                MalformedXML,
                "at most 1000 keys per DeleteObjects request"
            ));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let (mut deleted, mut errors) = (Vec::new(), Vec::new());
        for o in input.delete.objects {
            let r = match validate_key(&o.key) {
                Ok(_) => {
                    match self
                        .tenancy
                        .attribute(&input.bucket, &o.key, &who.caller, Role::Member)
                        .await
                    {
                        Ok(_) => {
                            let r = backend.delete(&ctx, &o.key).await;
                            self.agent.cache().invalidate(&backend, &o.key);
                            if r.is_ok() {
                                self.tenancy.deleted(&input.bucket, &o.key).await;
                            }
                            r
                        }
                        Err(e) => Err(Error::new(
                            ErrorKind::PermissionDenied,
                            e.message().unwrap_or("access denied").to_string(),
                        )),
                    }
                }
                Err(e) => Err(e),
            };
            match r {
                Ok(()) if !quiet => deleted.push(DeletedObject {
                    key: Some(o.key),
                    ..Default::default()
                }),
                Ok(()) => {}
                Err(e) => {
                    let s3 = s3err(e);
                    errors.push(s3s::dto::Error {
                        key: Some(o.key),
                        code: Some(s3.code().as_str().to_string()),
                        message: s3.message().map(str::to_string),
                        ..Default::default()
                    });
                }
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: Some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let who = self.who(&req).await?;
        let ctx = who.ctx.clone();
        let input = req.input;
        let (src_bucket, src_key) = match &input.copy_source {
            CopySource::Bucket { bucket, key, .. } => (bucket.to_string(), key.to_string()),
            _ => return Err(s3_error!(NotImplemented, "copy sources must be bucket/key")),
        };
        check_key(&src_key)?;
        check_key(&input.key)?;
        let src = self.backend(&src_bucket)?;
        let dst = self.backend(&input.bucket)?;
        self.tenancy
            .attribute(&src_bucket, &src_key, &who.caller, Role::Reader)
            .await?;
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        let meta = src.head(&ctx, &src_key).await.map_err(s3err)?;
        // `REPLACE` gives the copy the request's attributes; `COPY` (the default) keeps the source's.
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str().eq_ignore_ascii_case(MetadataDirective::REPLACE));
        let new_attrs = if replace {
            Some(attrs_of_input!(input)?)
        } else {
            None
        };
        if src_bucket == input.bucket && src_key == input.key && !replace {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself without changing \
                 the object's metadata, storage class, website redirect location or encryption attributes."
            ));
        }
        let matches = |c: &ETagCondition| match c {
            ETagCondition::Any => true,
            ETagCondition::ETag(e) => etag_of(&meta).is_some_and(|cur| cur.strong_cmp(e)),
        };
        if input
            .copy_source_if_match
            .as_ref()
            .is_some_and(|c| !matches(c))
            || input
                .copy_source_if_none_match
                .as_ref()
                .is_some_and(matches)
        {
            return Err(s3_error!(PreconditionFailed));
        }
        let res = self
            .tenancy
            .admit(team.as_deref(), &input.bucket, meta.size as i64, 1)
            .await?;
        let copied = self
            .copy_bytes(
                &ctx,
                &src,
                &dst,
                &src_bucket,
                &src_key,
                &input.bucket,
                &input.key,
                &meta,
                new_attrs.as_ref(),
            )
            .await;
        if let Err(e) = copied {
            self.tenancy.release(res).await;
            return Err(e);
        }
        self.agent.cache().invalidate(&dst, &input.key);
        let new = dst.head(&ctx, &input.key).await.map_err(s3err)?;
        self.tenancy
            .written(
                res.into_iter().collect(),
                &input.bucket,
                &input.key,
                new.size as i64,
                new.etag.clone(),
                team,
                &who.caller,
                ctx.job.as_deref().map(str::to_string),
                who.dataset.clone(),
            )
            .await;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: etag_of(&new),
                last_modified: Some(timestamp(new.last_modified_unix)),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let who = self.who(&req).await?;
        let owner = who.access_key.clone();
        let input = req.input;
        self.backend(&input.bucket)?;
        check_key(&input.key)?;
        self.tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        let id = self
            .staging
            .create(&UploadInfo {
                bucket: input.bucket.clone(),
                key: input.key.clone(),
                owner,
                attrs: attrs_of_input!(input)?,
            })
            .map_err(s3err)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let who = self.who(&req).await?;
        let owner = who.access_key.clone();
        let trailers = req.trailing_headers;
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1..=10000"));
        }
        self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        if team.is_some() {
            let Some(len) = input.content_length else {
                return Err(s3_error!(
                    MissingContentLength,
                    "a part charged to a quota needs its Content-Length"
                ));
            };
            // Quota before bytes: each part is admitted before it is read.
            self.tenancy
                .admit_part(
                    team.as_deref(),
                    &input.bucket,
                    &input.upload_id,
                    input.part_number,
                    len,
                )
                .await?;
        }
        let mut check = BodyCheck::new(
            input.content_md5,
            input.checksum_algorithm.as_ref(),
            input.checksum_crc32,
            input.checksum_crc32c,
            input.checksum_sha1,
            input.checksum_sha256,
            input.checksum_crc64nvme,
        )?
        .with_trailers(trailers);
        let tmp = self
            .staging
            .temp_part_path(&input.upload_id, input.part_number)
            .map_err(s3err)?;
        let result = async {
            let mut f = tokio::fs::File::create(&tmp)
                .await
                .map_err(|e| s3err(Error::from_io(e, "staging a part")))?;
            if let Some(mut body) = input.body {
                while let Some(chunk) = body.next().await {
                    let chunk =
                        chunk.map_err(|e| s3_error!(IncompleteBody, "reading the part: {e}"))?;
                    check.update(&chunk);
                    f.write_all(&chunk)
                        .await
                        .map_err(|e| s3err(Error::from_io(e, "staging a part")))?;
                }
            }
            f.flush()
                .await
                .map_err(|e| s3err(Error::from_io(e, "staging a part")))?;
            let md5 = check.finish()?;
            self.staging
                .commit_part(&input.upload_id, input.part_number, &tmp, &md5)
                .map_err(s3err)?;
            Ok::<_, S3Error>(md5)
        }
        .await;
        // A failed part gives its admission back, and so does one whose upload was aborted meanwhile.
        if result.is_err() || self.staging.info(&input.upload_id).is_err() {
            self.tenancy
                .release_part(&input.upload_id, input.part_number)
                .await;
        }
        match result {
            Ok(md5) => Ok(S3Response::new(UploadPartOutput {
                e_tag: Some(ETag::Strong(md5)),
                ..Default::default()
            })),
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                Err(e)
            }
        }
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let (_, owner) = self.caller(&req)?;
        let input = req.input;
        self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        let marker = input.part_number_marker.unwrap_or(0);
        let max = input.max_parts.unwrap_or(1000).clamp(1, 1000) as usize;
        let mut parts: Vec<_> = self
            .staging
            .parts(&input.upload_id)
            .map_err(s3err)?
            .into_iter()
            .filter(|p| p.number > marker)
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = if truncated {
            parts.last().map(|p| p.number)
        } else {
            None
        };
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            is_truncated: Some(truncated),
            next_part_number_marker: next,
            max_parts: Some(max as i32),
            parts: Some(
                parts
                    .into_iter()
                    .map(|p| Part {
                        part_number: Some(p.number),
                        e_tag: Some(ETag::Strong(p.md5)),
                        size: Some(p.size as i64),
                        last_modified: Some(Timestamp::from(p.modified)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let who = self.who(&req).await?;
        let (ctx, owner) = (who.ctx.clone(), who.access_key.clone());
        let input = req.input;
        let backend = self.backend(&input.bucket)?;
        let info = self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        let team = self
            .tenancy
            .attribute(&input.bucket, &input.key, &who.caller, Role::Member)
            .await?;
        let requested = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default();
        if requested.is_empty() {
            return Err(s3_error!(
                InvalidRequest,
                "you must specify at least one part"
            ));
        }
        let staged: HashMap<i32, multipart::StagedPart> = self
            .staging
            .parts(&input.upload_id)
            .map_err(s3err)?
            .into_iter()
            .map(|p| (p.number, p))
            .collect();
        let mut chosen = Vec::with_capacity(requested.len());
        let mut last = 0;
        for (i, p) in requested.iter().enumerate() {
            let n = p
                .part_number
                .ok_or_else(|| s3_error!(InvalidPart, "a part has no number"))?;
            if n <= last {
                return Err(s3_error!(
                    InvalidPartOrder,
                    "parts must be listed in ascending order"
                ));
            }
            last = n;
            let staged = staged
                .get(&n)
                .ok_or_else(|| s3_error!(InvalidPart, "part {n} was not uploaded"))?;
            if let Some(e) = &p.e_tag
                && !e.strong_cmp(&ETag::Strong(staged.md5.clone()))
            {
                return Err(s3_error!(
                    InvalidPart,
                    "part {n}: the ETag does not match the uploaded part"
                ));
            }
            if i + 1 < requested.len() && staged.size < MIN_PART {
                return Err(s3_error!(
                    EntityTooSmall,
                    "part {n} is smaller than 5 MiB and is not the last part"
                ));
            }
            chosen.push(staged.clone());
        }
        // md5 of the part md5s, as S3 computes multipart ETags (returned when the backend gives none).
        let mut md5 = s3s::crypto::Md5::new();
        for p in &chosen {
            let raw: Vec<u8> = (0..p.md5.len())
                .step_by(2)
                .filter_map(|i| {
                    p.md5
                        .get(i..i + 2)
                        .and_then(|h| u8::from_str_radix(h, 16).ok())
                })
                .collect();
            md5.update(&raw);
        }
        let s3_etag = format!("{}-{}", hex(&md5.finalize()), chosen.len());
        let total: u64 = chosen.iter().map(|p| p.size).sum();
        // The parts' bytes were admitted as they arrived; the object itself (and any bytes not admitted, after
        // a restart) is admitted now, before anything is written to the backend.
        let mut reservations = self.tenancy.take_parts(&input.upload_id);
        let admitted: i64 = reservations.iter().map(|r| r.bytes).sum();
        match self
            .tenancy
            .admit(
                team.as_deref(),
                &input.bucket,
                (total as i64 - admitted).max(0),
                1,
            )
            .await
        {
            Ok(r) => reservations.extend(r),
            Err(e) => {
                for r in reservations {
                    self.tenancy.release(Some(r)).await;
                }
                return Err(e);
            }
        }
        let written = self
            .assemble(&ctx, &backend, &input.key, &chosen, total, &info.attrs)
            .await;
        let etag = match written {
            Ok(e) => e,
            Err(e) => {
                for r in reservations {
                    self.tenancy.release(Some(r)).await;
                }
                return Err(e);
            }
        };
        self.agent.cache().invalidate(&backend, &input.key);
        let _ = self.staging.remove(&input.upload_id);
        self.tenancy
            .written(
                reservations,
                &input.bucket,
                &input.key,
                total as i64,
                etag.clone(),
                team,
                &who.caller,
                ctx.job.as_deref().map(str::to_string),
                who.dataset.clone(),
            )
            .await;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(
                etag.as_deref()
                    .map(plain_etag)
                    .unwrap_or(ETag::Strong(s3_etag)),
            ),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let who = self.who(&req).await?;
        let owner = who.access_key;
        let input = req.input;
        self.owner_check(&input.upload_id, &input.bucket, &input.key, &owner)?;
        self.staging
            .remove(&input.upload_id)
            .map_err(|_| s3_error!(NoSuchUpload))?;
        self.tenancy.release_parts(&input.upload_id).await;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }
}

/// Serve the gateway on `listener` until `stop` is cancelled, then let in-flight requests finish (up to
/// `grace`).
pub async fn run(
    gateway: Gateway,
    listener: tokio::net::TcpListener,
    stop: tokio_util::sync::CancellationToken,
    grace: std::time::Duration,
) {
    let auth = gateway.auth();
    let region = gateway.region.clone();
    let mut builder = s3s::service::S3ServiceBuilder::new(gateway);
    builder.set_auth(auth);
    let service = ScopeCheck {
        inner: builder.build(),
        region: Arc::from(region.as_str()),
    };
    let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let socket = tokio::select! {
            r = listener.accept() => match r {
                Ok((socket, _)) => socket,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway: accepting a connection failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => break,
        };
        let _ = socket.set_nodelay(true);
        let conn = http.serve_connection(hyper_util::rt::TokioIo::new(socket), service.clone());
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("gateway: requests still running after the grace period were cut off");
    }
}

/// Refuses, before s3s parses anything, requests signed for another region or service: `403
/// SignatureDoesNotMatch`, as for any signature that does not verify here. (s3s itself would answer 501 for an
/// unknown service.)
#[derive(Clone)]
struct ScopeCheck {
    inner: s3s::service::S3Service,
    region: Arc<str>,
}

impl ScopeCheck {
    /// `(region, service)` from `Authorization: AWS4-HMAC-SHA256 Credential=AK/DATE/REGION/SERVICE/aws4_request`
    /// or from a presigned URL's `X-Amz-Credential`.
    fn scope(req: &http::Request<hyper::body::Incoming>) -> Option<(String, String)> {
        let from_cred = |c: &str| {
            let mut parts = c.split('/');
            let (_ak, _date) = (parts.next()?, parts.next()?);
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        };
        if let Some(auth) = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            && let Some(idx) = auth.find("Credential=")
        {
            let rest = &auth[idx + "Credential=".len()..];
            return from_cred(rest.split([',', ' ']).next().unwrap_or_default());
        }
        let query = req.uri().query()?;
        for pair in query.split('&') {
            if let Some(v) = pair.strip_prefix("X-Amz-Credential=") {
                let decoded = v.replace("%2F", "/").replace("%2f", "/");
                return from_cred(&decoded);
            }
        }
        None
    }
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for ScopeCheck {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn call(&self, req: http::Request<hyper::body::Incoming>) -> Self::Future {
        if let Some((region, service)) = Self::scope(&req)
            && (region != *self.region || service != "s3")
        {
            let body = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SignatureDoesNotMatch</Code><Message>the request \
                 is signed for region {region:?} and service {service:?}; this gateway is {:?}, service \"s3\"</Message></Error>",
                self.region
            );
            let resp = http::Response::builder()
                .status(http::StatusCode::FORBIDDEN)
                .header(http::header::CONTENT_TYPE, "application/xml")
                .body(s3s::Body::from(body))
                .unwrap_or_default();
            return Box::pin(futures::future::ready(Ok(resp)));
        }
        hyper::service::Service::call(&self.inner, req)
    }
}

impl Gateway {
    /// The byte-moving half of CopyObject.
    #[allow(clippy::too_many_arguments)]
    async fn copy_bytes(
        &self,
        ctx: &IoContext,
        src: &Backend,
        dst: &Backend,
        src_bucket: &str,
        src_key: &str,
        dst_bucket: &str,
        dst_key: &str,
        meta: &ObjectMeta,
        new_attrs: Option<&ObjectAttrs>,
    ) -> S3Result<()> {
        let (input_bucket, input_key) = (dst_bucket, dst_key);
        let ctx = ctx.clone();
        if src_bucket == input_bucket && new_attrs.is_none() {
            // Server-side: the backend keeps the source's attributes with the copy.
            src.copy(&ctx, src_key, input_key).await.map_err(s3err)?;
        } else {
            // Through the cache: to another backend, or with new attributes (which a server-side copy cannot
            // set); a copy onto itself is safe, as nothing is visible before `complete`.
            let keep = meta.attrs.as_deref().cloned().unwrap_or_default();
            let attrs = new_attrs.unwrap_or(&keep);
            let obj = self.agent.cache().object_from_meta(&ctx, src, meta.clone());
            let mut up = dst
                .put_multipart_with(&ctx, input_key, BACKEND_PART, attrs)
                .await
                .map_err(s3err)?;
            let bs = self.agent.cache().config().block_size.bytes();
            let mut off = 0;
            while off < meta.size {
                let next = (off + bs).min(meta.size);
                match obj.read(off..next).await {
                    Ok(b) => up.write(b).await.map_err(s3err)?,
                    Err(e) => {
                        let _ = up.abort().await;
                        return Err(s3err(e));
                    }
                }
                off = next;
            }
            up.complete().await.map_err(s3err)?;
        }
        Ok(())
    }
}

impl Gateway {
    /// Write an upload's chosen parts to the backend as one object.
    async fn assemble(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        key: &str,
        chosen: &[multipart::StagedPart],
        total: u64,
        attrs: &ObjectAttrs,
    ) -> S3Result<Option<String>> {
        let input_key = key;
        let ctx = ctx.clone();
        let etag = if total as usize <= SINGLE_PUT_MAX {
            let mut all = Vec::with_capacity(total as usize);
            for p in chosen {
                all.extend_from_slice(
                    &tokio::fs::read(&p.path)
                        .await
                        .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?,
                );
            }
            backend
                .put_with(&ctx, input_key, Bytes::from(all), PutMode::Overwrite, attrs)
                .await
                .map_err(s3err)?
                .etag
        } else {
            let mut up = backend
                .put_multipart_with(&ctx, input_key, BACKEND_PART, attrs)
                .await
                .map_err(s3err)?;
            for p in chosen {
                let mut f = tokio::fs::File::open(&p.path)
                    .await
                    .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?;
                loop {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0u8; BACKEND_PART];
                    let mut filled = 0;
                    while filled < buf.len() {
                        let n = f
                            .read(&mut buf[filled..])
                            .await
                            .map_err(|e| s3err(Error::from_io(e, "reading a staged part")))?;
                        if n == 0 {
                            break;
                        }
                        filled += n;
                    }
                    if filled == 0 {
                        break;
                    }
                    buf.truncate(filled);
                    up.write(Bytes::from(buf)).await.map_err(s3err)?;
                }
            }
            up.complete().await.map_err(s3err)?.etag
        };
        Ok(etag)
    }
}
