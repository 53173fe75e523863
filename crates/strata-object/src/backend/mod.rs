//! [`Backend`]: one storage system named by URL, on `object_store`, with Strata's errors, retries and events.
//!
//! Rooms: this one opens backends and writes; [`read`] (GET/HEAD), [`list`] (listings), [`local`] (a local
//! directory's keys, attributes and ETags), [`s3`] (reaching S3, its own requests, incomplete uploads) and
//! [`multipart`] (uploads in parts). Every operation has the same shape (one retried request, the failure
//! classified, one event emitted: [`Backend::observe`]).
//!
//! - **Identity**: [`Backend::id`] is canonical (scheme, bucket, prefix and, for S3, the endpoint; never a
//!   credential) and part of every cache key. A URL's prefix becomes a `PrefixStore`; a `file://` URL a
//!   local directory (created if missing).
//! - **S3 reads and listings** go through [`S3Wire`] (Strata's own signed requests): keys are taken as they
//!   are (`x//y`, `./z`, `dir/`, which `object_store`'s `Path` refuses or rewrites) and headers as they come.
//!   Writes, deletes and copies stay on `object_store`, but for keys it cannot name (single requests through
//!   [`S3Wire`]). Every read shares one request shape (`read::Fetched`).
//! - **Reads**: [`Backend::head`] asks with `get_opts(head: true)` elsewhere, since `object_store`'s own
//!   `head` drops the attributes. Ranged reads ([`Backend::get_range`], [`Backend::get_range_stream`]) are one retried
//!   request, pinned to an ETag when asked; [`Backend::get_head_stream`] returns the metadata as soon as the
//!   response headers are in and the bytes as they arrive (how the cache opens an object it has not seen
//!   without a HEAD). The caller of a stream checks it got every byte and decides whether to retry a stream
//!   that failed midway.
//! - **Listings**: [`Backend::list_page`] (the gateway's pages) and [`Backend::list_span`] (a key range with a
//!   limit: the cache's metadata refresh) stop once they have what they need on backends that list in key
//!   order (object stores and the in-memory store; local directories are read to the end, sorted, then cut),
//!   so paging through a prefix costs one listing of it in all, not one per page.
//!   [`Backend::list_range`] lists disjoint key ranges in parallel (reconciliation). A listing offset is the
//!   key itself, never percent-encoded: `Path::from` encodes `#`, `%`, `~` and control characters, which
//!   moved the offset past keys sorting between a key and its encoding.
//! - **Writes**: [`Backend::put_with`] and [`Backend::put_multipart_with`] (parts uploaded as data arrives, at
//!   most 8 in flight, retried through the same policy; nothing visible until
//!   [`MultipartUpload::complete`]). [`PutMode`] gives create-only and `If-Match` puts.
//! - **Keys on a local directory**: every key S3 allows, a plain file where it can be one, else escaped
//!   under `.strata-keys/` ([`crate::localkeys`]); reads, writes, deletes and listings go through that
//!   mapping.
//! - **Attributes on a local directory**: `object_store`'s file store refuses attributes, so they are kept as
//!   JSON in the file's [`ATTRS_XATTR`] extended attribute, set once the write has completed. Files are
//!   replaced, never rewritten, so an overwrite without attributes has none, and a server-side copy (a hard
//!   link) shares them. A file system without user xattrs loses them, with one warning per process.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use strata_telemetry::Telemetry;
use strata_types::{
    Error, ErrorKind, IoContext, IoEvent, ObjectAttrs, ObjectMeta, Op, Outcome, Result, Tier,
    validate_key,
};

use crate::classify::classify;

mod list;
mod local;
mod multipart;
mod read;
mod s3;
mod stream_put;

use crate::retry::{PartRetry, RetryPolicy};
use crate::s3wire::S3Wire;
use local::local_dir_walkable;
pub use multipart::MultipartUpload;
pub(crate) use s3::s3_endpoint;
use s3::{build_s3, host_of, wire_headers, wire_list};
pub use stream_put::StreamPut;

/// Connection options for a backend. Anything left unset falls back to the standard AWS environment variables
/// (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, ...)
/// for S3, then to built-in defaults (region `us-east-1`, path-style addressing when an endpoint is given).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackendOptions {
    /// S3 endpoint, e.g. `http://127.0.0.1:9000`. Unset: AWS.
    pub endpoint: Option<String>,
    /// S3 region.
    pub region: Option<String>,
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<String>,
    /// Session token for temporary credentials.
    pub session_token: Option<String>,
    /// Use virtual-hosted-style requests (`bucket.host`). Default: path-style (`host/bucket`), which every
    /// S3-compatible server accepts.
    pub virtual_hosted_style: Option<bool>,
    /// Send unsigned requests (public buckets).
    pub skip_signature: Option<bool>,
    /// Per-request timeout in seconds (default 60).
    pub request_timeout_secs: Option<u64>,
}

impl fmt::Debug for BackendOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendOptions")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<redacted>"),
            )
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("virtual_hosted_style", &self.virtual_hosted_style)
            .field("skip_signature", &self.skip_signature)
            .field("request_timeout_secs", &self.request_timeout_secs)
            .finish()
    }
}

/// How a put treats an existing object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutMode {
    /// Replace whatever is there.
    Overwrite,
    /// Fail with [`ErrorKind::AlreadyExists`] if the object exists.
    Create,
    /// Replace only if the current ETag is this one, else [`ErrorKind::PreconditionFailed`].
    IfMatch(String),
}

/// What a successful put returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutOutcome {
    /// New ETag, when the backend reports one.
    pub etag: Option<String>,
    /// New version id, when the backend versions objects.
    pub version: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListPage {
    /// Objects in key order.
    pub objects: Vec<ObjectMeta>,
    /// With a delimiter: the common prefixes ("directories"), each ending in `/`.
    pub common_prefixes: Vec<String>,
    /// Pass as `start_after` to get the next page; `None` on the last page.
    pub next_start_after: Option<String>,
}

/// Objects of a key range, from [`Backend::list_span`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListSpan {
    /// Objects in key order.
    pub objects: Vec<ObjectMeta>,
    /// Whether the listing reached the end of the range (else it stopped at its limit).
    pub complete: bool,
}

/// A storage backend named by URL. Cheap to clone.
#[derive(Clone)]
pub struct Backend {
    inner: Arc<Inner>,
}

struct Inner {
    id: Arc<str>,
    scheme: &'static str,
    store: Arc<dyn ObjectStore>,
    /// The same store when it is a local directory: object attributes then live in an extended attribute of
    /// each file ([`ATTRS_XATTR`]), as the file store has no place for them.
    local: Option<Arc<object_store::local::LocalFileSystem>>,
    /// The local directory's root (with `local`): where keys map to files ([`crate::localkeys`]).
    local_root: Option<std::path::PathBuf>,
    /// S3 spoken directly, for S3 backends: every read and listing goes through it (keys and headers as they
    /// are, see [`crate::s3wire`]); writes stay on `object_store`.
    wire: Option<S3Wire>,
    retry: RetryPolicy,
    telemetry: Arc<Telemetry>,
}

/// The extended attribute in which a local-directory backend keeps an object's [`ObjectAttrs`] (JSON).
pub const ATTRS_XATTR: &str = "user.strata.attrs";

/// Warned once per process that a file system refuses extended attributes.
static XATTR_WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backend")
            .field("id", &self.inner.id)
            .finish()
    }
}

impl Backend {
    /// Open the backend named by `url`:
    ///
    /// | URL | backend |
    /// | --- | --- |
    /// | `s3://bucket` or `s3://bucket/prefix` | any S3-compatible service ([`BackendOptions`]) |
    /// | `file:///abs/path` | a local or POSIX file system directory (created if missing) |
    /// | `memory://` or `memory://name` | a new, empty in-process store |
    /// | `gs://bucket/prefix` | Google Cloud Storage (feature `gcp`) |
    /// | `az://container/prefix` | Azure Blob Storage (feature `azure`) |
    pub fn open(
        url: &str,
        options: &BackendOptions,
        retry: RetryPolicy,
        telemetry: Arc<Telemetry>,
    ) -> Result<Self> {
        let parsed = url::Url::parse(url)
            .map_err(|e| Error::invalid_input(format!("invalid backend URL {url:?}: {e}")))?;
        let prefix = parsed.path().trim_matches('/').to_string();
        let mut wire = None;
        let (scheme, store, id): (&'static str, Arc<dyn ObjectStore>, String) = match parsed
            .scheme()
        {
            "s3" | "s3a" => {
                let bucket = host_of(&parsed, url)?;
                let (store, target) = build_s3(&bucket, options, url)?;
                let credentials =
                    (!options.skip_signature.unwrap_or(false)).then(|| store.credentials().clone());
                wire = Some(S3Wire::new(
                    crate::s3wire::Target {
                        bucket: &bucket,
                        prefix: &prefix,
                        endpoint: target.endpoint.as_deref(),
                        region: &target.region,
                        virtual_hosted: target.virtual_hosted,
                        timeout: target.timeout,
                    },
                    credentials,
                )?);
                let endpoint = s3_endpoint(options).unwrap_or_else(|| "aws".into());
                let id = format!("s3://{bucket}/{prefix}@{}", endpoint.trim_end_matches('/'));
                ("s3", Arc::new(store), id)
            }
            "file" => {
                if parsed
                    .host_str()
                    .is_some_and(|h| !h.is_empty() && h != "localhost")
                {
                    return Err(Error::invalid_input(format!(
                        "invalid file URL {url:?}: use file:///absolute/path (three slashes)"
                    )));
                }
                let path = parsed
                    .to_file_path()
                    .map_err(|_| Error::invalid_input(format!("invalid file URL {url:?}")))?;
                std::fs::create_dir_all(&path).map_err(|e| {
                    Error::from_io(e, format!("creating backend directory {}", path.display()))
                })?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(&path)
                    .map_err(|e| classify(e, &format!("opening {url}")))?
                    .with_automatic_cleanup(true);
                let fs = Arc::new(fs);
                let id = format!("file://{}", path.display());
                // The prefix is already part of the directory.
                return Ok(Self {
                    inner: Arc::new(Inner {
                        id: id.into(),
                        scheme: "file",
                        store: fs.clone(),
                        local: Some(fs),
                        local_root: Some(path.clone()),
                        wire: None,
                        retry,
                        telemetry,
                    }),
                });
            }
            "memory" => {
                let name = parsed.host_str().unwrap_or_default();
                let id = format!("memory://{name}/{prefix}");
                (
                    "memory",
                    Arc::new(object_store::memory::InMemory::new()),
                    id,
                )
            }
            #[cfg(feature = "gcp")]
            "gs" => {
                let bucket = host_of(&parsed, url)?;
                let store = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(&bucket)
                    .with_retry(object_store::RetryConfig {
                        max_retries: 0,
                        ..Default::default()
                    })
                    .build()
                    .map_err(|e| classify(e, &format!("configuring {url}")))?;
                ("gs", Arc::new(store), format!("gs://{bucket}/{prefix}"))
            }
            #[cfg(feature = "azure")]
            "az" | "azure" => {
                let container = host_of(&parsed, url)?;
                let store = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(&container)
                    .with_retry(object_store::RetryConfig {
                        max_retries: 0,
                        ..Default::default()
                    })
                    .build()
                    .map_err(|e| classify(e, &format!("configuring {url}")))?;
                ("az", Arc::new(store), format!("az://{container}/{prefix}"))
            }
            other => {
                // Reached for gs:// and az:// only when their feature is off.
                if let Some(feature) = match other {
                    "gs" => Some("gcp"),
                    "az" | "azure" => Some("azure"),
                    _ => None,
                } {
                    return Err(Error::new(
                        ErrorKind::Unsupported,
                        format!(
                            "backend scheme {other}:// is not compiled in: build Strata with the `{feature}` feature"
                        ),
                    ));
                }
                return Err(Error::invalid_input(format!(
                    "unknown backend URL scheme {other:?} in {url:?}: expected s3://, file://, memory://, gs:// or az://"
                )));
            }
        };
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            store
        } else {
            validate_key(&prefix)?;
            Arc::new(object_store::prefix::PrefixStore::new(
                store,
                prefix.as_str(),
            ))
        };
        let mut backend = Self::from_store(id, scheme, store, retry, telemetry);
        if let Some(w) = wire {
            // Only just made: no clone of it exists yet.
            if let Some(inner) = Arc::get_mut(&mut backend.inner) {
                inner.wire = Some(w);
            }
        }
        Ok(backend)
    }

    /// Wrap an existing `object_store` (for embedding and tests).
    pub fn from_store(
        id: impl Into<Arc<str>>,
        scheme: &'static str,
        store: Arc<dyn ObjectStore>,
        retry: RetryPolicy,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                id: id.into(),
                scheme,
                store,
                local: None,
                local_root: None,
                wire: None,
                retry,
                telemetry,
            }),
        }
    }

    /// The canonical backend id (part of every cache key). Credentials never appear in it.
    pub fn id(&self) -> &Arc<str> {
        &self.inner.id
    }

    /// Whether `other` is this very backend (a clone of it), not just one with the same id.
    pub fn same(&self, other: &Backend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The URL scheme (`s3`, `file`, `memory`, ...).
    pub fn scheme(&self) -> &'static str {
        self.inner.scheme
    }

    /// The telemetry hub events go to.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.inner.telemetry
    }

    fn emit(
        &self,
        ctx: &IoContext,
        op: Op,
        key: &str,
        bytes: u64,
        start: Instant,
        outcome: Outcome,
    ) {
        self.inner.telemetry.emit(IoEvent {
            at: SystemTime::now(),
            op,
            backend: self.inner.id.clone(),
            key: key.into(),
            bytes,
            latency: start.elapsed(),
            tier: Tier::Backend,
            outcome,
            ctx: ctx.clone(),
        });
    }

    async fn observe<T>(
        &self,
        ctx: &IoContext,
        op: Op,
        key: &str,
        bytes_of: impl Fn(&T) -> u64,
        fut: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let start = Instant::now();
        let r = fut.await;
        match &r {
            Ok(v) => self.emit(ctx, op, key, bytes_of(v), start, Outcome::Ok),
            Err(e) => self.emit(ctx, op, key, 0, start, Outcome::Err(e.kind())),
        }
        r
    }

    /// Whether `key` may be asked of this backend: on S3 and local directories, any key S3 allows (1 to 1,024
    /// bytes: keys from an origin are taken as they are, `x//y`, `./z` and `dir/` included; a local directory
    /// maps every key to a file, `localkeys`); elsewhere a key Strata could have written (see
    /// [`validate_key`]; a key ending in `/` names no object there).
    pub fn check_read_key(&self, key: &str) -> Result<()> {
        if self.inner.wire.is_some() || self.inner.local_root.is_some() {
            return s3_key(key);
        }
        read_path(key).map(|_| ())
    }

    /// Whether `key` may be written to this backend: on a local directory any key S3 allows (keys that cannot
    /// be plain paths are escaped, `localkeys`); on S3 any key S3 allows (those `object_store` cannot
    /// name go through `s3wire`: single PUTs, multipart uploads and copies alike); elsewhere a key
    /// `object_store` can name as it is ([`validate_key`], and not ending in `/`).
    pub fn check_write_key(&self, key: &str) -> Result<()> {
        match (&self.inner.local_root, &self.inner.wire) {
            (Some(_), _) | (_, Some(_)) => s3_key(key),
            (None, None) => to_path(key).map(|_| ()),
        }
    }

    /// Whether the backend keeps the ETag a writer gives it ([`Self::put_with_etag`], a local directory)
    /// rather than making its own (object stores).
    pub fn takes_etags(&self) -> bool {
        self.inner.local.is_some()
    }

    /// The retry policy this backend applies.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.inner.retry
    }

    /// Write `bytes` to `key` in one request.
    pub async fn put(
        &self,
        ctx: &IoContext,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
    ) -> Result<PutOutcome> {
        self.put_with(ctx, key, bytes, mode, &ObjectAttrs::default())
            .await
    }

    /// The attributes to send with a write: object stores keep them natively; a local directory keeps them in
    /// an extended attribute instead ([`Self::keep_local_attrs`]).
    fn attributes(&self, attrs: &ObjectAttrs) -> object_store::Attributes {
        if self.inner.local.is_none() {
            to_attributes(attrs)
        } else {
            object_store::Attributes::new()
        }
    }

    /// Strata's metadata of an object read or headed at `path`: the attributes the store returned, or, for a
    /// local directory, those in the file's extended attribute.
    fn meta_of(
        &self,
        path: &Path,
        m: object_store::ObjectMeta,
        a: &object_store::Attributes,
    ) -> ObjectMeta {
        let mut meta = convert_meta(m);
        meta.attrs = match self.inner.local.is_some() {
            true => self.local_attrs(path),
            false => attrs_of(a).shared(),
        };
        meta
    }

    /// [`Self::put`] with the attributes to keep with the object.
    pub async fn put_with(
        &self,
        ctx: &IoContext,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        attrs: &ObjectAttrs,
    ) -> Result<PutOutcome> {
        self.put_with_etag(ctx, key, bytes, mode, attrs, None).await
    }

    /// [`Self::put_with`], giving the object `etag` where the backend takes one from the writer (a local
    /// directory: the gateway gives an object assembled from parts S3's multipart form); without it, the
    /// content's MD5 there.
    pub async fn put_with_etag(
        &self,
        ctx: &IoContext,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        attrs: &ObjectAttrs,
        etag: Option<String>,
    ) -> Result<PutOutcome> {
        let PutMode::IfMatch(want) = &mode else {
            return self.put_once(ctx, key, bytes, mode, attrs, etag).await;
        };
        let missing = |e: Error| match e.kind() {
            ErrorKind::NotFound => Error::new(
                ErrorKind::NotFound,
                format!(
                    "PUT {}/{key}: If-Match names an object that does not exist",
                    self.inner.id
                ),
            ),
            _ => e,
        };
        if self.inner.local.is_some() {
            // The file store has no conditional update: compared here, under this process's lock of the
            // key (atomic against other conditional writes through this agent), then written.
            let _held = local_cas_lock(&self.inner.id, key).lock().await;
            let current = self.head(ctx, key).await.map_err(missing)?;
            let bare = |e: &str| e.trim_start_matches("W/").trim_matches('"').to_string();
            if current.etag.as_deref().map(bare) != Some(bare(want)) {
                return Err(Error::new(
                    ErrorKind::PreconditionFailed,
                    format!(
                        "PUT {}/{key}: the object's ETag is not the one If-Match names",
                        self.inner.id
                    ),
                ));
            }
            return self
                .put_once(ctx, key, bytes, PutMode::Overwrite, attrs, etag)
                .await;
        }
        match self
            .put_once(ctx, key, bytes, mode.clone(), attrs, etag)
            .await
        {
            // As S3: If-Match on a key that does not exist is NoSuchKey, not a failed precondition.
            Err(e) if e.kind() == ErrorKind::PreconditionFailed => {
                match self.head(ctx, key).await {
                    Err(h) if h.kind() == ErrorKind::NotFound => Err(missing(h)),
                    _ => Err(e),
                }
            }
            r => r,
        }
    }

    /// One write of `bytes` to `key` in `mode` (see [`Self::put_with_etag`]).
    async fn put_once(
        &self,
        ctx: &IoContext,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        attrs: &ObjectAttrs,
        etag: Option<String>,
    ) -> Result<PutOutcome> {
        if let Some(w) = self.wire_key(key) {
            s3_key(key)?;
            return self.wire_put(ctx, w, key, bytes, mode, attrs).await;
        }
        let path = self.write_path(key)?;
        if matches!(mode, PutMode::Create) && self.local_holds(key) {
            // Create-only: the key may be in its other place (escaped while a conflict lasted).
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("PUT {}/{key}: the object exists", self.inner.id),
            ));
        }
        if matches!(mode, PutMode::IfMatch(_)) && self.inner.scheme == "gs" {
            // object_store updates a GCS object only by generation, which an ETag does not name.
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "PUT {}/{key}: a write conditional on an ETag is not implemented for GCS",
                    self.inner.id
                ),
            ));
        }
        let attributes = self.attributes(attrs);
        let what = format!("PUT {}/{key}", self.inner.id);
        let len = bytes.len() as u64;
        let mode = match mode {
            PutMode::Overwrite => object_store::PutMode::Overwrite,
            PutMode::Create => object_store::PutMode::Create,
            PutMode::IfMatch(etag) => object_store::PutMode::Update(object_store::UpdateVersion {
                e_tag: Some(etag),
                version: None,
            }),
        };
        self.observe(ctx, Op::Put, key, |_| len, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Put, || async {
                    let opts = object_store::PutOptions {
                        mode: mode.clone(),
                        attributes: attributes.clone(),
                        ..Default::default()
                    };
                    let r = self
                        .inner
                        .store
                        .put_opts(&path, bytes.clone().into(), opts)
                        .await
                        .map_err(|e| classify(e, &what))?;
                    self.keep_local_attrs(&path, attrs);
                    self.forget_other_place(key, &path);
                    let etag = match (self.inner.local.is_some(), &etag) {
                        (true, Some(given)) => {
                            self.record_local_etag(&path, given.clone(), r.e_tag)
                        }
                        (true, None) => {
                            let mut md5 = crate::localetag::Md5::default();
                            md5.update(&bytes);
                            self.record_local_etag(&path, md5.hex(), r.e_tag)
                        }
                        (false, _) => r.e_tag,
                    };
                    Ok(PutOutcome {
                        etag,
                        version: r.version,
                    })
                })
                .await
        })
        .await
    }

    /// Start a multipart upload to `key`. Nothing is visible at `key` until [`MultipartUpload::complete`].
    /// `part_size` is clamped to at least 5 MiB (the S3 minimum).
    pub async fn put_multipart(
        &self,
        ctx: &IoContext,
        key: &str,
        part_size: usize,
    ) -> Result<MultipartUpload> {
        self.put_multipart_with(ctx, key, part_size, &ObjectAttrs::default())
            .await
    }

    /// [`Self::put_multipart`] with the attributes to keep with the object (see [`Self::put_with`]).
    pub async fn put_multipart_with(
        &self,
        ctx: &IoContext,
        key: &str,
        part_size: usize,
        attrs: &ObjectAttrs,
    ) -> Result<MultipartUpload> {
        if let Some(w) = self.wire_key(key) {
            s3_key(key)?;
            let what = format!("multipart PUT {}/{key}", self.inner.id);
            let headers = wire_headers(attrs, None, &what)?;
            let id = self
                .inner
                .retry
                .run(&self.inner.telemetry, Op::Put, || {
                    w.create_upload(key, headers.clone(), &what)
                })
                .await?;
            return Ok(MultipartUpload {
                backend: self.clone(),
                ctx: ctx.clone(),
                key: key.to_string(),
                writer: None,
                bytes: 0,
                start: Instant::now(),
                local: None,
                md5: None,
                etag: None,
                part_size: part_size.max(5 * 1024 * 1024),
                wire: Some(multipart::WireUpload {
                    id,
                    part_size: part_size.max(5 * 1024 * 1024),
                    buf: Vec::new(),
                    etags: Vec::new(),
                }),
            });
        }
        let path = self.write_path(key)?;
        let what = format!("multipart PUT {}/{key}", self.inner.id);
        let policy = Arc::new(PartRetry {
            policy: self.inner.retry,
            telemetry: self.inner.telemetry.clone(),
        });
        let opts = object_store::PutMultipartOptions {
            attributes: self.attributes(attrs),
            ..Default::default()
        }
        .with_retry_policy(policy);
        let upload = self
            .inner
            .retry
            .run(&self.inner.telemetry, Op::Put, || async {
                self.inner
                    .store
                    .put_multipart_opts(&path, opts.clone())
                    .await
                    .map_err(|e| classify(e, &what))
            })
            .await?;
        Ok(MultipartUpload {
            backend: self.clone(),
            ctx: ctx.clone(),
            key: key.to_string(),
            writer: Some(object_store::WriteMultipart::new_with_chunk_size(
                upload,
                part_size.max(5 * 1024 * 1024),
            )),
            bytes: 0,
            start: Instant::now(),
            local: self
                .inner
                .local
                .is_some()
                .then(|| (path, (!attrs.is_empty()).then(|| attrs.clone()))),
            md5: self
                .inner
                .local
                .is_some()
                .then(crate::localetag::Md5::default),
            etag: None,
            part_size: part_size.max(5 * 1024 * 1024),
            wire: None,
        })
    }

    /// Delete `key`. Deleting a missing key succeeds (S3 semantics).
    pub async fn delete(&self, ctx: &IoContext, key: &str) -> Result<()> {
        // On a local directory a key may be in either of its places: both are removed.
        let paths: Vec<Path> = match &self.inner.local_root {
            Some(root) => {
                s3_key(key)?;
                let mut p = Vec::new();
                if crate::localkeys::plain_shape(key) && root.join(key).is_file() {
                    p.push(Path::parse(key).map_err(|e| Error::invalid_input(e.to_string()))?);
                }
                p.push(
                    Path::parse(crate::localkeys::escaped(key))
                        .map_err(|e| Error::invalid_input(e.to_string()))?,
                );
                p
            }
            None if self.wire_key(key).is_some() => {
                s3_key(key)?;
                let Some(w) = self.wire_key(key) else {
                    return Ok(());
                };
                let what = format!("DELETE {}/{key}", self.inner.id);
                return self
                    .observe(ctx, Op::Delete, key, |_| 0, async {
                        self.inner
                            .retry
                            .run(&self.inner.telemetry, Op::Delete, || w.delete(key, &what))
                            .await
                    })
                    .await;
            }
            None if key.ends_with('/') && validate_key(key).is_ok() => {
                // No object can exist there: deleting it deletes nothing (and never `P` for `P/`).
                return Ok(());
            }
            None => vec![to_path(key)?],
        };
        let what = format!("DELETE {}/{key}", self.inner.id);
        self.observe(ctx, Op::Delete, key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Delete, || async {
                    for path in &paths {
                        match self.inner.store.delete(path).await {
                            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                            Err(e) => return Err(classify(e, &what)),
                        }
                    }
                    Ok(())
                })
                .await
        })
        .await
    }

    /// Server-side copy of `from` to `to` on S3 with `attrs` as the copy's attributes (`REPLACE`), keeping
    /// S3's own ETag of a copy; `None` on other backends, whose server-side copies keep the source's
    /// attributes ([`Self::copy`]), so a copy with others is the caller's (bytes through the cache).
    /// `if_match` holds the source to the version the caller saw.
    pub async fn copy_with(
        &self,
        ctx: &IoContext,
        from: &str,
        to: &str,
        attrs: &ObjectAttrs,
        if_match: Option<&str>,
    ) -> Result<Option<PutOutcome>> {
        let Some(w) = &self.inner.wire else {
            return Ok(None);
        };
        s3_key(from)?;
        s3_key(to)?;
        let what = format!("COPY {}/{from} -> {to}", self.inner.id);
        let mut headers = wire_headers(attrs, None, &what)?;
        headers.insert(
            "x-amz-metadata-directive",
            http::HeaderValue::from_static("REPLACE"),
        );
        if let Some(e) = if_match {
            let v = http::HeaderValue::from_str(e)
                .map_err(|e| Error::invalid_input(format!("{what}: {e}")))?;
            headers.insert("x-amz-copy-source-if-match", v);
        }
        self.observe(ctx, Op::Copy, to, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Copy, || {
                    w.copy(from, to, headers.clone(), &what)
                })
                .await
                .map(|(etag, version)| Some(PutOutcome { etag, version }))
        })
        .await
    }

    /// Server-side copy of `from` to `to` inside this backend.
    pub async fn copy(&self, ctx: &IoContext, from: &str, to: &str) -> Result<()> {
        let src = match &self.inner.local_root {
            Some(root) => {
                s3_key(from)?;
                self.local_read_path(root, from)?
            }
            None => read_path(from)?,
        };
        let dst = self.write_path(to)?;
        let what = format!("COPY {}/{from} -> {to}", self.inner.id);
        self.observe(ctx, Op::Copy, to, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Copy, || async {
                    self.inner
                        .store
                        .copy(&src, &dst)
                        .await
                        .map_err(|e| classify(e, &what))?;
                    self.forget_other_place(to, &dst);
                    Ok(())
                })
                .await
        })
        .await
    }
}

/// The lock a conditional write to `key` of the local directory `id` holds while it compares and writes
/// (striped: 64 locks for every key of every local backend of the process).
fn local_cas_lock(id: &str, key: &str) -> &'static tokio::sync::Mutex<()> {
    static LOCKS: [tokio::sync::Mutex<()>; 64] = [const { tokio::sync::Mutex::const_new(()) }; 64];
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (id, key).hash(&mut h);
    &LOCKS[h.finish() as usize % LOCKS.len()]
}

/// A key S3 allows: 1 to 1,024 bytes, without a line break (S3 answers 400 for those).
fn s3_key(key: &str) -> Result<()> {
    if key.contains(['\n', '\r']) {
        return Err(Error::invalid_input(format!(
            "invalid object key {:?}: S3 keys cannot hold a line break",
            key.chars().take(32).collect::<String>()
        )));
    }
    match key.len() {
        0 => Err(Error::invalid_input("empty object key")),
        1..=1024 => Ok(()),
        _ => Err(Error::invalid_input(format!(
            "invalid object key {:?}...: longer than 1024 bytes",
            key.chars().take(32).collect::<String>()
        ))),
    }
}

/// The store's path of a key written or copied to. A key ending in `/` is refused: the stores' paths cannot
/// tell `P/` from `P`, and writing one must never change the other.
fn to_path(key: &str) -> Result<Path> {
    validate_key(key)?;
    if key.ends_with('/') {
        return Err(Error::invalid_input(format!(
            "the key {key:?} ends in '/': this backend cannot keep it apart from {:?}, so it is refused",
            key.trim_end_matches('/')
        )));
    }
    Path::parse(key).map_err(|e| Error::invalid_input(format!("invalid object key {key:?}: {e}")))
}

/// The store's path of a key read: a key ending in `/` names no object (none can be written, see [`to_path`]).
fn read_path(key: &str) -> Result<Path> {
    if key.ends_with('/') && validate_key(key).is_ok() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no object {key:?}"),
        ));
    }
    to_path(key)
}

fn convert_meta(m: object_store::ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        key: m.location.to_string(),
        size: m.size,
        etag: m.e_tag,
        version: m.version,
        last_modified_unix: m.last_modified.timestamp(),
        attrs: None,
    }
}

/// object_store's attributes as Strata's (the kinds S3 keeps; others are dropped).
fn attrs_of(a: &object_store::Attributes) -> ObjectAttrs {
    use object_store::Attribute;
    let mut out = ObjectAttrs::default();
    for (k, v) in a {
        let v = v.as_ref().to_string();
        match k {
            Attribute::ContentType => out.content_type = Some(v),
            Attribute::ContentEncoding => out.content_encoding = Some(v),
            Attribute::ContentDisposition => out.content_disposition = Some(v),
            Attribute::ContentLanguage => out.content_language = Some(v),
            Attribute::CacheControl => out.cache_control = Some(v),
            Attribute::Metadata(name) => {
                out.user.insert(name.to_ascii_lowercase(), v);
            }
            _ => {}
        }
    }
    out.absorb_extras();
    out
}

/// S3's limit on user metadata, names and values together: the extras take what the user's leaves.
const USER_METADATA_MAX: usize = 2048;

/// The extras' reserved entry (`strata_types::extras`), within what `a`'s user metadata leaves.
pub(crate) fn extras_entry(a: &ObjectAttrs) -> Option<(&'static str, String)> {
    let used: usize = a.user.iter().map(|(k, v)| k.len() + v.len()).sum();
    a.extras_value(USER_METADATA_MAX.saturating_sub(used))
        .map(|v| (strata_types::extras::RESERVED_META, v))
}

/// Strata's attributes as object_store's.
fn to_attributes(a: &ObjectAttrs) -> object_store::Attributes {
    use object_store::Attribute;
    let mut out = object_store::Attributes::new();
    let std = [
        (Attribute::ContentType, &a.content_type),
        (Attribute::ContentEncoding, &a.content_encoding),
        (Attribute::ContentDisposition, &a.content_disposition),
        (Attribute::ContentLanguage, &a.content_language),
        (Attribute::CacheControl, &a.cache_control),
    ];
    for (k, v) in std {
        if let Some(v) = v {
            out.insert(k, v.clone().into());
        }
    }
    for (k, v) in &a.user {
        out.insert(Attribute::Metadata(k.clone().into()), v.clone().into());
    }
    if let Some((k, v)) = extras_entry(a) {
        out.insert(Attribute::Metadata(k.into()), v.into());
    }
    out
}
