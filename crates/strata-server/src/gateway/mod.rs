//! The S3-compatible caching gateway.
//!
//! Built on `s3s` (S3 protocol parsing, SigV4 header and presigned-URL authentication against
//! [`tenancy::CatalogAuth`]: the configured keys, then the catalog's), served by hyper behind `ScopeCheck`,
//! which refuses a request signed for another region or service (403 `SignatureDoesNotMatch`) before s3s
//! parses it. Buckets are the agent's configured backends, by name, and those made by CreateBucket under
//! `[gateway] bucket_root` ([`buckets`]). Every operation first maps the
//! credentials to an `IoContext` (principal and team from the key, job from `x-strata-job`, else the key's
//! `job`), the bucket to a backend, and validates the key; [`tenancy`] then decides ownership and quota.
//! The user-facing page is `docs/gateway.md`.
//!
//! The `S3` implementation below is a table: each operation delegates to its room, one file per concern:
//! [`read`] (GetObject, HeadObject), [`list`] (ListObjects V1 and V2), [`write`] (PutObject, CopyObject,
//! deletes, and the store every write goes through), [`multipart_ops`] (the multipart operations; staging in
//! [`multipart`]), [`service`] (ListBuckets and bucket HEAD/location), with [`attributes`], [`checksums`] and
//! [`serve`] (the accept loop and the scope check) beside them; [`part_copy`] (UploadPartCopy) and
//! [`buckets`] (CreateBucket, DeleteBucket, which bucket is which backend).
//!
//! - **Reads** go through the cache's one read call, [`strata_cache::BlockCache::get`]: the request's range
//!   and conditions become its `GetOptions`, and how to open, when to prefetch and which budget shares the
//!   body holds are decided there. Access times are recorded once per object version and second.
//! - **Listings** without a delimiter read one page through [`strata_object::Backend::list_page`]; `/`
//!   delimited ones read the whole directory per page (object_store has no delimited listing from an
//!   offset). Continuation tokens are the hex of the last key. Keys under prefixes the caller may not read are
//!   removed from the page afterwards.
//! - **Writes** go through to the backend: bodies up to 8 MiB are buffered and sent with one PUT, larger ones
//!   stream as one PUT to S3 ([`strata_object::StreamPut`]: the ETag stays the MD5) or as a backend multipart
//!   upload elsewhere; Content-MD5 and `x-amz-checksum-*` (streaming trailers included)
//!   are verified before the upload completes, and a mismatch aborts it, so nothing is visible. Every write
//!   and delete invalidates the key's cached metadata, whatever happened at the backend: that is what makes
//!   read-after-write hold with a metadata TTL. Multipart uploads are staged on local disk ([`multipart`])
//!   and reach the backend only on complete, as one backend upload.
//! - **Attributes** (Content-Type, Content-Encoding less `aws-chunked`, Content-Disposition,
//!   Content-Language, Cache-Control, `x-amz-meta-*` up to 2 KiB) travel as [`strata_types::ObjectAttrs`]
//!   with the write and back through the metadata cache to GET and HEAD; `response-*` parameters override them
//!   per GET. CopyObject keeps the source's (server-side within a bucket, through the cache across buckets)
//!   or, with `MetadataDirective: REPLACE`, takes the request's. What S3 keeps beyond them (`Expires`, the
//!   checksum sent or asked for, a multipart object's part sizes: [`strata_types::extras`]) travels the same
//!   way and answers checksum mode, `partNumber` and GetObjectAttributes.
//!
//! Safety: every key is validated (`..`/`.` segments, empty segments, absolute keys, NUL and backslashes are
//! refused) before any backend call; anonymous requests, unknown keys, bad signatures, clock skew over 15
//! minutes, expired presigned URLs, and a region or service other than ours are refused with the S3 error code
//! a client expects; Content-MD5 and `x-amz-checksum-*` mismatches are refused and nothing is stored.

mod attributes;
pub mod auth;
mod buckets;
mod checksums;
mod list;
pub mod multipart;
mod multipart_ops;
mod part_copy;
mod read;
mod record;
pub mod serve;
mod service;
pub mod tenancy;
mod write;

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
use strata_types::{Error, ErrorKind, IoContext, ObjectAttrs, ObjectMeta};
use tokio::io::AsyncWriteExt;

use crate::Agent;
use auth::AccessKey;
use multipart::{Staging, UploadInfo};
use strata_analytics::OpClass;
use strata_catalog::Role;
use tenancy::{Caller, Tenancy};

/// Single PUTs up to this size are buffered and sent in one request; larger bodies stream as a backend
/// multipart upload.
const SINGLE_PUT_MAX: usize = 8 * 1024 * 1024;
/// Part size of backend multipart uploads made by the gateway.
const BACKEND_PART: usize = 8 * 1024 * 1024;
/// The largest client part a completed upload sends to an object store as one part (bounding what is buffered).
const CLIENT_PART_MAX: u64 = 64 * 1024 * 1024;
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
    /// Seals ListObjectsV2 continuation tokens ([`list`]).
    tokens: strata_catalog::secrets::CatalogKey,
    /// Buckets made by CreateBucket, opened ([`buckets`]).
    created: buckets::Created,
}

/// An authenticated request's caller.
struct Who {
    ctx: IoContext,
    caller: Caller,
    access_key: String,
    dataset: Option<String>,
}

tokio::task_local! {
    /// The id of the S3 request being served (set per request by the accept loop, [`serve`]): carried by
    /// every error body (`<RequestId>`) and the `x-amz-request-id` header, and logged with the failure's
    /// details, which the client's message leaves out.
    pub(super) static REQUEST_ID: String;
}

/// The request id of the request being served, if any.
fn request_id() -> Option<String> {
    REQUEST_ID.try_with(|id| id.clone()).ok()
}

/// An error as the client gets it: with the request's id.
fn tagged(mut e: S3Error) -> S3Error {
    if e.request_id().is_none()
        && let Some(id) = request_id()
    {
        e.set_request_id(id);
    }
    e
}

/// What a client reads of a failure: S3's words for what happened to the request, and for a refusal of
/// its input the refusal itself, never where the data lives (local paths, origin endpoints, an origin's
/// own error text); those are in the agent's log under the request id.
fn public_message(code: &S3ErrorCode, e: &Error) -> String {
    let standard = match code.as_str() {
        "NoSuchKey" => "The specified key does not exist.",
        "PreconditionFailed" => "At least one of the preconditions you specified did not hold.",
        "ServiceUnavailable" => "The storage behind this bucket did not answer; please retry.",
        "SlowDown" => "Please reduce your request rate.",
        "InternalError" => "We encountered an internal error. Please try again.",
        "InvalidRange" => "The requested range is not satisfiable.",
        "AccessDenied" => "Access Denied.",
        "NotImplemented" => {
            "A header or parameter you provided implies functionality that is not implemented."
        }
        _ => "Invalid argument.",
    };
    let m = e.message();
    let says_where =
        m.contains("://") || m.contains(" /") || m.contains("\"/") || m.contains("location");
    match code.as_str() {
        "NoSuchKey" | "PreconditionFailed" | "ServiceUnavailable" | "SlowDown"
        | "InternalError" => standard.to_string(),
        _ if says_where => standard.to_string(),
        _ => m.to_string(),
    }
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
    let id = request_id().unwrap_or_default();
    if code == S3ErrorCode::InternalError || code == S3ErrorCode::ServiceUnavailable {
        tracing::warn!(request_id = %id, error = %e, "gateway request failed");
    } else {
        tracing::debug!(request_id = %id, error = %e, "gateway request refused");
    }
    let mut err = S3Error::with_message(code.clone(), public_message(&code, &e));
    if !id.is_empty() {
        err.set_request_id(id);
    }
    err
}

/// A key read from `backend`: any key its storage can hold (S3 origins: any key S3 allows, taken as it is).
fn check_read_key(backend: &strata_object::Backend, key: &str) -> S3Result<()> {
    backend
        .check_read_key(key)
        .map_err(|e| key_refused(key, &e))
}

/// A key written to `backend`: one its storage can hold (local directories: any key S3 allows).
fn check_write_key(backend: &strata_object::Backend, key: &str) -> S3Result<()> {
    backend
        .check_write_key(key)
        .map_err(|e| key_refused(key, &e))
}

fn key_refused(key: &str, e: &Error) -> S3Error {
    let code = if key.len() > 1024 {
        S3ErrorCode::KeyTooLongError
    } else {
        S3ErrorCode::InvalidArgument
    };
    S3Error::with_message(code, e.message().to_string())
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
            agent.ownership().clone(),
            agent.config().catalog.reservation_ttl_secs,
        );
        let tokens = agent.catalog().derived_key("listing continuation tokens")?;
        Ok(Self {
            tokens,
            created: Default::default(),
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
            Some(k) => match &k.team {
                Some(team) => Caller::TeamKey { team: team.clone() },
                None => Caller::Root { team: None },
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
            dataset: req
                .headers
                .get("x-strata-dataset")
                .and_then(|v| v.to_str().ok())
                .filter(|v| !v.is_empty() && v.len() <= 256)
                .map(Arc::from),
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
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(""), Arc::from(""));
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_list_buckets(r),
        )
        .await
        .map_err(tagged)
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(req.input.bucket.as_str()), Arc::from(""));
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_create_bucket(r),
        )
        .await
        .map_err(tagged)
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(req.input.bucket.as_str()), Arc::from(""));
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_delete_bucket(r),
        )
        .await
        .map_err(tagged)
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(req.input.bucket.as_str()), Arc::from(""));
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_head_bucket(r),
        )
        .await
        .map_err(tagged)
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(req.input.bucket.as_str()), Arc::from(""));
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_get_bucket_location(r),
        )
        .await
        .map_err(tagged)
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::DataRead,
            req,
            at,
            0,
            |o: &GetObjectOutput| o.content_length.unwrap_or(0).max(0) as u64,
            |r| self.s3_get_object(r),
        )
        .await
        .map_err(tagged)
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_head_object(r),
        )
        .await
        .map_err(tagged)
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_get_object_attributes(r),
        )
        .await
        .map_err(tagged)
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.prefix.as_deref().unwrap_or("")),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_list_objects_v2(r),
        )
        .await
        .map_err(tagged)
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.prefix.as_deref().unwrap_or("")),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_list_objects(r),
        )
        .await
        .map_err(tagged)
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.prefix.as_deref().unwrap_or("")),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_list_object_versions(r),
        )
        .await
        .map_err(tagged)
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(req.input.bucket.as_str()), Arc::from(""));
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_get_bucket_versioning(r),
        )
        .await
        .map_err(tagged)
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        let sent = req.input.content_length.unwrap_or(0).max(0) as u64;
        self.recorded(
            OpClass::DataWrite,
            req,
            at,
            sent,
            |_| 0,
            |r| Box::pin(self.s3_put_object(r)),
        )
        .await
        .map_err(tagged)
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_delete_object(r),
        )
        .await
        .map_err(tagged)
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let at: (Arc<str>, Arc<str>) = (Arc::from(req.input.bucket.as_str()), Arc::from(""));
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_delete_objects(r),
        )
        .await
        .map_err(tagged)
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| Box::pin(self.s3_copy_object(r)),
        )
        .await
        .map_err(tagged)
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_create_multipart_upload(r),
        )
        .await
        .map_err(tagged)
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        let sent = req.input.content_length.unwrap_or(0).max(0) as u64;
        self.recorded(
            OpClass::DataWrite,
            req,
            at,
            sent,
            |_| 0,
            |r| self.s3_upload_part(r),
        )
        .await
        .map_err(tagged)
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_upload_part_copy(r),
        )
        .await
        .map_err(tagged)
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_list_parts(r),
        )
        .await
        .map_err(tagged)
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_complete_multipart_upload(r),
        )
        .await
        .map_err(tagged)
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.prefix.as_deref().unwrap_or("")),
        );
        self.recorded(
            OpClass::MetaRead,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_list_multipart_uploads(r),
        )
        .await
        .map_err(tagged)
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let at: (Arc<str>, Arc<str>) = (
            Arc::from(req.input.bucket.as_str()),
            Arc::from(req.input.key.as_str()),
        );
        self.recorded(
            OpClass::MetaWrite,
            req,
            at,
            0,
            |_| 0,
            |r| self.s3_abort_multipart_upload(r),
        )
        .await
        .map_err(tagged)
    }
}

/// The longest a presigned URL may be valid, as S3 allows: 7 days.
const PRESIGN_MAX_SECS: u64 = 7 * 86_400;

/// A presigned request valid for longer than S3 allows is refused: a URL that works for a year is a credential
/// nobody can revoke short of the key. SigV4 says how long in `X-Amz-Expires`; SigV2 (what boto3 presigns by
/// default) gives the absolute `Expires` time, which must be within 7 days from now.
pub(super) fn presign_expiry_allowed(query: Option<&str>) -> S3Result<()> {
    let Some(q) = query else { return Ok(()) };
    let refuse = || {
        Err(s3_error!(
            AuthorizationQueryParametersError,
            "a presigned URL is valid for at most {PRESIGN_MAX_SECS} seconds (7 days)"
        ))
    };
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(q.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let v2 = pairs.iter().any(|(k, _)| k == "AWSAccessKeyId");
    for (k, v) in &pairs {
        if k.eq_ignore_ascii_case("X-Amz-Expires") {
            match v.parse::<i64>() {
                Ok(n) if (1..=PRESIGN_MAX_SECS as i64).contains(&n) => {}
                // As S3: a URL that expired before it was made is an expired request.
                Ok(n) if n <= 0 => return Err(s3_error!(AccessDenied, "Request has expired")),
                _ => return refuse(),
            }
        } else if v2 && k == "Expires" {
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            match v.parse::<u64>() {
                Ok(t) if t <= now + PRESIGN_MAX_SECS => {}
                _ => return refuse(),
            }
        }
    }
    Ok(())
}
