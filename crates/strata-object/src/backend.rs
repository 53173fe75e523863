//! [`Backend`]: one storage system named by URL, on `object_store`, with Strata's errors, retries and events.
//!
//! One room on purpose, though long: every operation here is the same shape (open the store, one retried
//! request, classify the failure, emit the event), and splitting them by operation would put that shape in
//! as many files. The URL parsing and options (the first part) are the candidate to move out next.
//!
//! - **Identity**: [`Backend::id`] is canonical (scheme, bucket, prefix and, for S3, the endpoint; never a
//!   credential) and part of every cache key. A URL's prefix becomes a `PrefixStore`; a `file://` URL a
//!   local directory (created if missing).
//! - **S3 reads and listings** go through [`S3Wire`] (Strata's own signed requests): keys are taken as they
//!   are (`x//y`, `./z`, `dir/`, which `object_store`'s `Path` refuses or rewrites) and headers as they come.
//!   Writes, deletes and copies stay on `object_store`. Every read shares one request shape ([`Fetched`]).
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
use crate::retry::{PartRetry, RetryPolicy};
use crate::s3wire::S3Wire;

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

/// What a GET or HEAD brought: the object's metadata and its bytes as they arrive (failures classified).
struct Fetched {
    meta: ObjectMeta,
    body: futures::stream::BoxStream<'static, Result<Bytes>>,
}

impl Fetched {
    fn empty(meta: ObjectMeta) -> Self {
        Self {
            meta,
            body: futures::stream::empty().boxed(),
        }
    }

    /// The body in one piece, which must be exactly `want` bytes.
    async fn collect(mut self, want: u64, what: &str) -> Result<Bytes> {
        let mut buf = Vec::with_capacity(want.min(1 << 30) as usize);
        while let Some(c) = self.body.next().await {
            let c = c?;
            if (buf.len() + c.len()) as u64 > want {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("{what}: more than the {want} bytes asked"),
                ));
            }
            buf.extend_from_slice(&c);
        }
        if buf.len() as u64 != want {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("{what}: short read, got {} of {want} bytes", buf.len()),
            ));
        }
        Ok(Bytes::from(buf))
    }
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
    /// maps every key to a file, [`crate::localkeys`]); elsewhere a key Strata could have written (see
    /// [`validate_key`]; a key ending in `/` names no object there).
    pub fn check_read_key(&self, key: &str) -> Result<()> {
        if self.inner.wire.is_some() || self.inner.local_root.is_some() {
            return match key.len() {
                0 => Err(Error::invalid_input("empty object key")),
                1..=1024 => Ok(()),
                _ => Err(Error::invalid_input(format!(
                    "invalid object key {:?}...: longer than 1024 bytes",
                    key.chars().take(32).collect::<String>()
                ))),
            };
        }
        read_path(key).map(|_| ())
    }

    /// Whether `key` may be written to this backend: on a local directory any key S3 allows (keys that cannot
    /// be plain paths are escaped, [`crate::localkeys`]); on S3 any key S3 allows (those `object_store` cannot
    /// name go through [`S3Wire`], in one request: no multipart upload or copy of them); elsewhere a key
    /// `object_store` can name as it is ([`validate_key`], and not ending in `/`).
    pub fn check_write_key(&self, key: &str) -> Result<()> {
        match (&self.inner.local_root, &self.inner.wire) {
            (Some(_), _) | (_, Some(_)) => s3_key(key),
            (None, None) => to_path(key).map(|_| ()),
        }
    }

    /// On S3: whether `key` must be written through [`S3Wire`] because `object_store` cannot name it (an
    /// empty, `.` or `..` segment, a trailing `/`, ...).
    fn wire_key(&self, key: &str) -> Option<&S3Wire> {
        let named = Path::parse(key).is_ok_and(|p| p.as_ref() == key) && !key.ends_with('/');
        self.inner.wire.as_ref().filter(|_| !named)
    }

    /// The store path `key` is written to: on a local directory its plain path when it can be one now, else
    /// its escaped one; elsewhere the key itself.
    fn write_path(&self, key: &str) -> Result<Path> {
        let Some(root) = &self.inner.local_root else {
            return to_path(key);
        };
        s3_key(key)?;
        let p = match crate::localkeys::plain_now(root, key) {
            true => key.to_string(),
            false => crate::localkeys::escaped(key),
        };
        Path::parse(&p)
            .map_err(|e| Error::invalid_input(format!("invalid object key {key:?}: {e}")))
    }

    /// After `key` was written to `written` on a local directory: the key's other place (escaped, when it was
    /// written plain) no longer holds it.
    fn forget_other_place(&self, key: &str, written: &Path) {
        if let Some(root) = &self.inner.local_root
            && written.as_ref() == key
        {
            let _ = std::fs::remove_file(root.join(crate::localkeys::escaped(key)));
        }
    }

    /// The store path `key` is read from on a local directory: its plain file when there is one, else its
    /// escaped one.
    fn local_read_path(&self, root: &std::path::Path, key: &str) -> Result<Path> {
        let p = match crate::localkeys::plain_shape(key) && root.join(key).is_file() {
            true => key.to_string(),
            false => crate::localkeys::escaped(key),
        };
        Path::parse(&p)
            .map_err(|e| Error::invalid_input(format!("invalid object key {key:?}: {e}")))
    }

    /// One GET (or HEAD) of `key`, `range` of it when given, pinned to `if_match`: the server checks
    /// `If-Match`, and so do we, on the response's ETag (some S3-compatible servers ignore the header). S3
    /// backends ask through [`S3Wire`]; the others through `object_store`.
    async fn fetch(
        &self,
        key: &str,
        range: Option<&Range<u64>>,
        if_match: Option<&str>,
        head: bool,
        what: &str,
    ) -> Result<Fetched> {
        self.check_read_key(key)?;
        if let Some(w) = &self.inner.wire {
            let (meta, body) = w.get(key, range, if_match, head, what).await?;
            return Ok(Fetched { meta, body });
        }
        let path = match &self.inner.local_root {
            Some(root) => self.local_read_path(root, key)?,
            None => read_path(key)?,
        };
        if head && self.inner.local.is_some() {
            let m = self
                .inner
                .store
                .head(&path)
                .await
                .map_err(|e| classify(e, what))?;
            let mut meta = self.meta_of(&path, m, &object_store::Attributes::new());
            meta.key = key.to_string();
            self.show_local_etag(&path, &mut meta);
            return Ok(Fetched::empty(meta));
        }
        // A local file pinned to the public ETag it was shown is pinned to the file store's ETag recorded with
        // it, which the file store checks against the file it opens (`localetag`).
        let file = self.local_file(&path);
        let pinned = match (&file, if_match) {
            (Some(f), Some(want)) => Some(crate::localetag::pin(f, want)),
            (None, Some(want)) => Some(want.to_string()),
            (_, None) => None,
        };
        let if_match = pinned.as_deref();
        // With `head`, a HEAD that keeps the object's attributes (`ObjectStore::head` drops them).
        let opts = object_store::GetOptions {
            head,
            range: range.map(|r| r.clone().into()),
            if_match: if_match.map(str::to_string),
            ..Default::default()
        };
        let r = self
            .inner
            .store
            .get_opts(&path, opts)
            .await
            .map_err(|e| classify(e, what))?;
        if let (Some(expect), Some(got)) = (if_match, r.meta.e_tag.as_deref())
            && expect != got
        {
            return Err(crate::classify::changed(what, got, expect));
        }
        let mut meta = self.meta_of(&path, r.meta.clone(), &r.attributes);
        meta.key = key.to_string();
        self.show_local_etag(&path, &mut meta);
        if head {
            return Ok(Fetched::empty(meta));
        }
        let what = what.to_string();
        let body = r
            .into_stream()
            .map(move |c| c.map_err(|e| classify(e, &what)))
            .boxed();
        Ok(Fetched { meta, body })
    }

    /// Metadata of `key`.
    pub async fn head(&self, ctx: &IoContext, key: &str) -> Result<ObjectMeta> {
        self.check_read_key(key)?;
        let what = format!("HEAD {}/{key}", self.inner.id);
        self.observe(ctx, Op::Head, key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Head, || async {
                    Ok(self.fetch(key, None, None, true, &what).await?.meta)
                })
                .await
        })
        .await
    }

    /// The whole object.
    pub async fn get(&self, ctx: &IoContext, key: &str) -> Result<(ObjectMeta, Bytes)> {
        self.check_read_key(key)?;
        let what = format!("GET {}/{key}", self.inner.id);
        self.observe(
            ctx,
            Op::Get,
            key,
            |(_, b): &(ObjectMeta, Bytes)| b.len() as u64,
            async {
                self.inner
                    .retry
                    .run(&self.inner.telemetry, Op::Get, || async {
                        let f = self.fetch(key, None, None, false, &what).await?;
                        let want = f.meta.size;
                        let meta = f.meta.clone();
                        let bytes = f.collect(want, &what).await?;
                        Ok((meta, bytes))
                    })
                    .await
            },
        )
        .await
    }

    /// Bytes `range` of `key`. With `if_match`, the read fails with [`ErrorKind::PreconditionFailed`] unless the
    /// object's ETag is still that one, so the bytes of two versions are never mixed. Short reads (a
    /// truncated body) are errors, never silently returned.
    pub async fn get_range(
        &self,
        ctx: &IoContext,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<Bytes> {
        self.check_read_key(key)?;
        if range.end <= range.start {
            return Ok(Bytes::new());
        }
        let what = format!(
            "GET {}/{key} bytes {}-{}",
            self.inner.id,
            range.start,
            range.end - 1
        );
        let want = range.end - range.start;
        self.observe(ctx, Op::Get, key, |b: &Bytes| b.len() as u64, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Get, || async {
                    let f = self
                        .fetch(key, Some(&range), if_match, false, &what)
                        .await?;
                    f.collect(want, &what).await
                })
                .await
        })
        .await
    }

    /// Bytes `range` of `key` as chunks, as they arrive from the backend, for callers that process data while
    /// it streams (the cache writes blocks to disk while the rest of a run is still arriving). The request
    /// itself is retried like [`Self::get_range`]; a failure mid-stream ends the stream with a classified error
    /// item and the caller decides whether to retry. The caller must check that it received `range.len()`
    /// bytes. One I/O event is emitted when the stream ends.
    pub async fn get_range_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        range: Range<u64>,
        if_match: Option<&str>,
    ) -> Result<futures::stream::BoxStream<'static, Result<Bytes>>> {
        self.check_read_key(key)?;
        let what = format!(
            "GET {}/{key} bytes {}-{}",
            self.inner.id,
            range.start,
            range.end.saturating_sub(1)
        );
        let start = Instant::now();
        let f = self
            .request_retried(ctx, key, &range, if_match, &what, start)
            .await?;
        Ok(self.body_stream(ctx, key, start, f.body))
    }

    /// [`Self::fetch`] of a range under the retry policy; a final failure is an I/O event.
    async fn request_retried(
        &self,
        ctx: &IoContext,
        key: &str,
        range: &Range<u64>,
        if_match: Option<&str>,
        what: &str,
        start: Instant,
    ) -> Result<Fetched> {
        let r = self
            .inner
            .retry
            .run(&self.inner.telemetry, Op::Get, || {
                self.fetch(key, Some(range), if_match, false, what)
            })
            .await;
        if let Err(e) = &r {
            self.emit(ctx, Op::Get, key, 0, start, Outcome::Err(e.kind()));
        }
        r
    }

    /// Metadata of `key` and a stream of its first `len` bytes (the whole object when it is shorter), from one
    /// request: the metadata as soon as the response headers are in, the bytes as they arrive. How a cache
    /// opens an object it has not seen, without a separate HEAD. Fails with [`ErrorKind::InvalidInput`] for an
    /// empty object (no range of it is satisfiable); callers fall back to [`Self::head`]. The request is
    /// retried; a stream that fails midway is the caller's to retry ([`Self::get_range_stream`], pinned to
    /// the ETag it learned here).
    pub async fn get_head_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        len: u64,
    ) -> Result<(
        ObjectMeta,
        futures::stream::BoxStream<'static, Result<Bytes>>,
    )> {
        self.check_read_key(key)?;
        let what = format!("GET {}/{key} bytes 0-{}", self.inner.id, len.max(1) - 1);
        let start = Instant::now();
        let f = self
            .request_retried(ctx, key, &(0..len.max(1)), None, &what, start)
            .await?;
        Ok((f.meta, self.body_stream(ctx, key, start, f.body)))
    }

    /// A response body as a stream of `Bytes`, with an I/O event when it ends (bytes, duration, outcome).
    fn body_stream(
        &self,
        ctx: &IoContext,
        key: &str,
        start: Instant,
        body: futures::stream::BoxStream<'static, Result<Bytes>>,
    ) -> futures::stream::BoxStream<'static, Result<Bytes>> {
        struct State {
            inner: futures::stream::BoxStream<'static, Result<Bytes>>,
            backend: Backend,
            ctx: IoContext,
            key: String,
            start: Instant,
            bytes: u64,
            done: bool,
        }
        let state = State {
            inner: body,
            backend: self.clone(),
            ctx: ctx.clone(),
            key: key.to_string(),
            start,
            bytes: 0,
            done: false,
        };
        futures::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            match st.inner.next().await {
                Some(Ok(b)) => {
                    st.bytes += b.len() as u64;
                    Some((Ok(b), st))
                }
                Some(Err(e)) => {
                    st.backend.emit(
                        &st.ctx,
                        Op::Get,
                        &st.key,
                        st.bytes,
                        st.start,
                        Outcome::Err(e.kind()),
                    );
                    st.done = true;
                    Some((Err(e), st))
                }
                None => {
                    st.backend
                        .emit(&st.ctx, Op::Get, &st.key, st.bytes, st.start, Outcome::Ok);
                    None
                }
            }
        })
        .boxed()
    }

    /// Metadata and the first `len` bytes of `key` in one request (the whole object when it is shorter), the
    /// bytes collected: [`Self::get_head_stream`] for callers that want them in one piece. Fails with
    /// [`ErrorKind::InvalidInput`] for an empty object; a short or long body is an error.
    pub async fn get_head(
        &self,
        ctx: &IoContext,
        key: &str,
        len: u64,
    ) -> Result<(ObjectMeta, Bytes)> {
        let (meta, mut chunks) = self.get_head_stream(ctx, key, len).await?;
        let want = len.min(meta.size);
        // Into a buffer mapped in one call, not faulted in page by page.
        let mut buf = strata_types::mem::prefaulted(want as usize);
        while let Some(c) = chunks.next().await {
            let c = c?;
            if (buf.len() + c.len()) as u64 > want {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "GET {}/{key}: more than the {want} bytes asked",
                        self.inner.id
                    ),
                ));
            }
            buf.extend_from_slice(&c);
        }
        if buf.len() as u64 != want {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "GET {}/{key}: short read, got {} of {want} bytes",
                    self.inner.id,
                    buf.len()
                ),
            ));
        }
        Ok((meta, buf.freeze()))
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

    /// Keep `attrs` with the local file just written at `path` (nothing for object stores, which got them
    /// with the write). The file is new (writes replace files, never rewrite them), so there is nothing to
    /// clear when `attrs` is empty. A file system that refuses user extended attributes loses them, with one
    /// warning per process; the write itself stands.
    fn keep_local_attrs(&self, path: &Path, attrs: &ObjectAttrs) {
        let Some(fs) = &self.inner.local else { return };
        if attrs.is_empty() {
            return;
        }
        let (Ok(file), Ok(json)) = (fs.path_to_filesystem(path), serde_json::to_vec(attrs)) else {
            return;
        };
        if let Err(e) =
            rustix::fs::setxattr(&file, ATTRS_XATTR, &json, rustix::fs::XattrFlags::empty())
            && !XATTR_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            tracing::warn!(backend = %self.inner.id, error = %e,
                "this file system refuses extended attributes: object attributes (Content-Type, user metadata) are not kept");
        }
    }

    /// The file of a store path on a local directory.
    fn local_file(&self, path: &Path) -> Option<std::path::PathBuf> {
        self.inner.local.as_ref()?.path_to_filesystem(path).ok()
    }

    /// On a local directory: the ETag shown for the file at `path` is the one recorded when Strata wrote it
    /// (its content's MD5), while it is still that file ([`crate::localetag`]).
    fn show_local_etag(&self, path: &Path, meta: &mut ObjectMeta) {
        if let (Some(file), Some(store)) = (self.local_file(path), meta.etag.as_deref()) {
            meta.etag = Some(crate::localetag::public(&file, store));
        }
    }

    /// On a local directory: record `public` as the ETag of the file just written at `path`, whose file store
    /// ETag is `store`; returns the ETag to report for the write.
    fn record_local_etag(
        &self,
        path: &Path,
        public: String,
        store: Option<String>,
    ) -> Option<String> {
        match (self.local_file(path), store) {
            (Some(file), Some(store)) => {
                crate::localetag::record(&file, &public, &store);
                Some(public)
            }
            (_, store) => store,
        }
    }

    /// A PUT through [`S3Wire`] of a key `object_store` cannot name: the attributes as headers, the mode as
    /// conditions.
    async fn wire_put(
        &self,
        ctx: &IoContext,
        w: &S3Wire,
        key: &str,
        bytes: Bytes,
        mode: PutMode,
        attrs: &ObjectAttrs,
    ) -> Result<PutOutcome> {
        let what = format!("PUT {}/{key}", self.inner.id);
        let mut h = http::HeaderMap::new();
        let mut set = |name: &str, v: &str| -> Result<()> {
            let name = http::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| Error::invalid_input(format!("{what}: header {name:?}: {e}")))?;
            let v = http::HeaderValue::from_str(v)
                .map_err(|e| Error::invalid_input(format!("{what}: header value {v:?}: {e}")))?;
            h.insert(name, v);
            Ok(())
        };
        for (name, v) in [
            ("content-type", &attrs.content_type),
            ("content-encoding", &attrs.content_encoding),
            ("content-disposition", &attrs.content_disposition),
            ("content-language", &attrs.content_language),
            ("cache-control", &attrs.cache_control),
        ] {
            if let Some(v) = v {
                set(name, v)?;
            }
        }
        for (k, v) in &attrs.user {
            set(&format!("x-amz-meta-{k}"), v)?;
        }
        match &mode {
            PutMode::Overwrite => {}
            PutMode::Create => set("if-none-match", "*")?,
            PutMode::IfMatch(e) => set("if-match", e)?,
        }
        let len = bytes.len() as u64;
        self.observe(ctx, Op::Put, key, |_| len, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Put, || {
                    w.put(key, bytes.clone(), h.clone(), &what)
                })
                .await
                .map(|(etag, version)| PutOutcome { etag, version })
        })
        .await
    }

    /// The attributes kept with a local file, if any.
    fn local_attrs(&self, path: &Path) -> Option<Arc<ObjectAttrs>> {
        let file = self.inner.local.as_ref()?.path_to_filesystem(path).ok()?;
        let mut buf = [0u8; 8192];
        let json = match rustix::fs::getxattr(&file, ATTRS_XATTR, &mut buf[..]) {
            Ok(n) => buf.get(..n)?.to_vec(),
            Err(rustix::io::Errno::RANGE) => {
                let n = rustix::fs::getxattr_query(&file, ATTRS_XATTR).ok()?;
                let mut big = vec![0u8; n];
                let n = rustix::fs::getxattr(&file, ATTRS_XATTR, &mut big[..]).ok()?;
                big.truncate(n);
                big
            }
            Err(_) => return None,
        };
        serde_json::from_slice::<ObjectAttrs>(&json).ok()?.shared()
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
        if self.wire_key(key).is_some() {
            return Err(Error::invalid_input(format!(
                "{key:?} is not a plain path: such keys are written to S3 in one request, not as a multipart upload (keep the object under the single-request size)"
            )));
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
        })
    }

    /// A listing as every listing runs: one I/O event for it, the whole of it retried under the policy.
    async fn listing<T, Fut>(
        &self,
        ctx: &IoContext,
        key: &str,
        list: impl FnMut() -> Fut,
    ) -> Result<T>
    where
        Fut: Future<Output = Result<T>>,
    {
        self.observe(ctx, Op::List, key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, list)
                .await
        })
        .await
    }

    /// One page of at most `max_keys` objects under `prefix` (a key prefix, not necessarily ending in `/`),
    /// starting after `start_after`. Without a delimiter the listing is recursive. On backends that list in
    /// key order ([`Backend::lists_in_order`]) it reads only as far as the page needs (one or two backend
    /// pages), so paging through a large prefix costs one listing of it in all, not one per page; the others
    /// are read to the end, sorted, then paged.
    pub async fn list_page(
        &self,
        ctx: &IoContext,
        prefix: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        let what = format!("LIST {}/{prefix}", self.inner.id);
        let max_keys = max_keys.max(1);
        if let Some(w) = &self.inner.wire {
            return self
                .listing(ctx, prefix, || async {
                    // One more than the page shows whether another page follows.
                    let (objects, _, _) = wire_list(
                        w,
                        prefix,
                        None,
                        start_after,
                        |_| false,
                        max_keys.saturating_add(1),
                        &what,
                    )
                    .await?;
                    Ok(page_of(objects, max_keys))
                })
                .await;
        }
        if self.inner.local_root.is_some() {
            return self
                .observe(ctx, Op::List, prefix, |_| 0, async {
                    let mut objects = self.local_list(prefix, &what).await?;
                    if let Some(s) = start_after {
                        objects.retain(|o| o.key.as_str() > s);
                    }
                    Ok(page_of(objects, max_keys))
                })
                .await;
        }
        let (dir, name_prefix) = split_prefix(prefix)?;
        let ordered = self.lists_in_order();
        self.observe(ctx, Op::List, prefix, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || async {
                    let stream = match start_after.and_then(offset_path) {
                        Some(s) => self.inner.store.list_with_offset(dir.as_ref(), &s),
                        None => self.inner.store.list(dir.as_ref()),
                    };
                    let mut stream = stream.map_err(|e| classify(e, &what));
                    let mut objects = Vec::new();
                    while let Some(m) = stream.next().await {
                        let m = m?;
                        let key = m.location.as_ref();
                        if !key.starts_with(&*name_prefix) {
                            // Keys with a prefix are contiguous in key order: past them, none follow.
                            if ordered && key > &*name_prefix {
                                break;
                            }
                            continue;
                        }
                        if ordered && start_after.is_some_and(|s| key <= s) {
                            continue;
                        }
                        objects.push(convert_meta(m));
                        // One more than the page shows whether another page follows.
                        if ordered && objects.len() > max_keys {
                            break;
                        }
                    }
                    // Backends list in arbitrary order (local directories do): sort, then page.
                    objects.sort_by(|a, b| a.key.cmp(&b.key));
                    if let Some(s) = start_after {
                        objects.retain(|o| o.key.as_str() > s);
                    }
                    Ok(page_of(objects, max_keys))
                })
                .await
        })
        .await
    }

    /// Every object whose key is greater than `start_after` and less than `end_before` (the end of the key
    /// space when `None`), in key order, recursively. On S3 this is one paged listing from `start_after`
    /// (`StartAfter`) that stops at `end_before`, so disjoint ranges can be listed in parallel with no more
    /// requests in all than one listing of everything.
    pub async fn list_range(
        &self,
        ctx: &IoContext,
        start_after: &str,
        end_before: Option<&str>,
    ) -> Result<Vec<ObjectMeta>> {
        Ok(self
            .list_span(ctx, start_after, end_before, usize::MAX)
            .await?
            .objects)
    }

    /// Like [`Backend::list_range`], but stops once `limit` objects are listed: `complete` says whether the
    /// listing reached `end_before`. Only backends that list in key order ([`Backend::lists_in_order`]) stop
    /// early; the others are read to the end and the first `limit` keys kept.
    pub async fn list_span(
        &self,
        ctx: &IoContext,
        start_after: &str,
        end_before: Option<&str>,
        limit: usize,
    ) -> Result<ListSpan> {
        let what = format!("LIST {} after {start_after:?}", self.inner.id);
        if start_after.contains('\0') || end_before.is_some_and(|e| e.contains('\0')) {
            return Err(Error::invalid_input("listing bounds contain a NUL byte"));
        }
        if let Some(w) = &self.inner.wire {
            return self
                .listing(ctx, start_after, || async {
                    let past_end = |m: &ObjectMeta| end_before.is_some_and(|e| m.key.as_str() >= e);
                    let (objects, _, complete) =
                        wire_list(w, "", None, Some(start_after), past_end, limit, &what).await?;
                    Ok(ListSpan { objects, complete })
                })
                .await;
        }
        if self.inner.local_root.is_some() {
            return self
                .observe(ctx, Op::List, start_after, |_| 0, async {
                    let mut objects = self.local_list("", &what).await?;
                    objects.retain(|m| {
                        m.key.as_str() > start_after
                            && end_before.is_none_or(|e| m.key.as_str() < e)
                    });
                    let complete = objects.len() <= limit;
                    objects.truncate(limit);
                    Ok(ListSpan { objects, complete })
                })
                .await;
        }
        let ordered = self.lists_in_order();
        self.observe(ctx, Op::List, start_after, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || async {
                    let mut stream = match offset_path(start_after) {
                        Some(s) => self.inner.store.list_with_offset(None, &s),
                        None => self.inner.store.list(None),
                    }
                    .map_err(|e| classify(e, &what));
                    let mut objects = Vec::new();
                    let mut complete = true;
                    while let Some(m) = stream.next().await {
                        let m = convert_meta(m?);
                        if m.key.as_str() <= start_after {
                            continue;
                        }
                        // Backends that do not list in key order (local directories) are read to the end.
                        if end_before.is_some_and(|e| m.key.as_str() >= e) {
                            if ordered {
                                break;
                            }
                            continue;
                        }
                        if ordered && objects.len() == limit {
                            complete = false;
                            break;
                        }
                        objects.push(m);
                    }
                    objects.sort_by(|a, b| a.key.cmp(&b.key));
                    if objects.len() > limit {
                        objects.truncate(limit);
                        complete = false;
                    }
                    Ok(ListSpan { objects, complete })
                })
                .await
        })
        .await
    }

    /// Whether listings of this backend come in key order, so that a listing of a key range can stop at its
    /// end (object stores and the in-memory store do; local directories do not).
    pub fn lists_in_order(&self) -> bool {
        matches!(self.inner.scheme, "s3" | "gs" | "az" | "memory")
    }

    /// Everything under `prefix` grouped by `delimiter` as S3 groups it: keys with no `delimiter` after the
    /// prefix are objects; the others roll up into common prefixes (the prefix, up to and including the
    /// first `delimiter` after it), in key order. S3 groups natively; other backends group a recursive
    /// listing of the prefix (`/` on a local directory reads only its level, [`Self::list_delimited`]).
    pub async fn list_grouped(
        &self,
        ctx: &IoContext,
        prefix: &str,
        delimiter: &str,
    ) -> Result<ListPage> {
        if delimiter.is_empty() {
            return Err(Error::invalid_input("an empty delimiter groups nothing"));
        }
        if delimiter == "/" && self.inner.wire.is_none() {
            return self.list_delimited(ctx, prefix).await;
        }
        if let Some(w) = &self.inner.wire {
            let what = format!("LIST {}/{prefix} (delimiter {delimiter:?})", self.inner.id);
            return self
                .listing(ctx, prefix, || async {
                    let (objects, common_prefixes, _) = wire_list(
                        w,
                        prefix,
                        Some(delimiter),
                        None,
                        |_| false,
                        usize::MAX,
                        &what,
                    )
                    .await?;
                    Ok(ListPage {
                        objects,
                        common_prefixes,
                        next_start_after: None,
                    })
                })
                .await;
        }
        let all = self.list_page(ctx, prefix, None, usize::MAX).await?;
        let mut objects = Vec::new();
        let mut common_prefixes: Vec<String> = Vec::new();
        for o in all.objects {
            match o.key[prefix.len()..].find(delimiter) {
                None => objects.push(o),
                Some(i) => {
                    let p = &o.key[..prefix.len() + i + delimiter.len()];
                    // Keys come in order, so a prefix's keys are contiguous.
                    if common_prefixes.last().map(String::as_str) != Some(p) {
                        common_prefixes.push(p.to_string());
                    }
                }
            }
        }
        Ok(ListPage {
            objects,
            common_prefixes,
            next_start_after: None,
        })
    }

    /// Everything directly under `prefix` with `/` as the delimiter: objects plus common prefixes.
    pub async fn list_delimited(&self, ctx: &IoContext, prefix: &str) -> Result<ListPage> {
        let what = format!("LIST {}/{prefix} (delimited)", self.inner.id);
        if let Some(w) = &self.inner.wire {
            return self
                .listing(ctx, prefix, || async {
                    let (objects, common_prefixes, _) =
                        wire_list(w, prefix, Some("/"), None, |_| false, usize::MAX, &what).await?;
                    Ok(ListPage {
                        objects,
                        common_prefixes,
                        next_start_after: None,
                    })
                })
                .await;
        }
        if self.inner.local_root.is_some() && !local_dir_walkable(prefix) {
            // No plain directory can hold this prefix: only escaped keys can be under it.
            return self
                .observe(ctx, Op::List, prefix, |_| 0, async {
                    let mut page = ListPage {
                        objects: Vec::new(),
                        common_prefixes: Vec::new(),
                        next_start_after: None,
                    };
                    for m in self.local_escaped(prefix, &what).await? {
                        match m.key[prefix.len()..].find('/') {
                            Some(i) => page
                                .common_prefixes
                                .push(m.key[..prefix.len() + i + 1].to_string()),
                            None => page.objects.push(m),
                        }
                    }
                    page.common_prefixes.dedup();
                    Ok(page)
                })
                .await;
        }
        let (dir, name_prefix) = split_prefix(prefix)?;
        self.observe(ctx, Op::List, prefix, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || async {
                    let r = self
                        .inner
                        .store
                        .list_with_delimiter(dir.as_ref())
                        .await
                        .map_err(|e| classify(e, &what))?;
                    let mut objects: Vec<ObjectMeta> = r
                        .objects
                        .into_iter()
                        .filter(|m| m.location.as_ref().starts_with(&*name_prefix))
                        .map(|m| {
                            let location = m.location.clone();
                            let mut meta = convert_meta(m);
                            self.show_local_etag(&location, &mut meta);
                            meta
                        })
                        .collect();
                    let mut common_prefixes: Vec<String> = r
                        .common_prefixes
                        .into_iter()
                        .map(|p| format!("{p}/"))
                        .filter(|p| p.starts_with(&*name_prefix))
                        .filter(|p| p.as_str() != format!("{}/", crate::localkeys::ESCAPE_DIR))
                        .collect();
                    // A local directory's escaped keys, grouped as the level's plain entries are.
                    for m in self.local_escaped(&name_prefix, &what).await? {
                        match m.key[name_prefix.len()..].find('/') {
                            Some(i) => {
                                common_prefixes.push(m.key[..name_prefix.len() + i + 1].to_string())
                            }
                            None => objects.push(m),
                        }
                    }
                    objects.sort_by(|a, b| a.key.cmp(&b.key));
                    objects.dedup_by(|a, b| a.key == b.key);
                    common_prefixes.sort();
                    common_prefixes.dedup();
                    Ok(ListPage {
                        objects,
                        common_prefixes,
                        next_start_after: None,
                    })
                })
                .await
        })
        .await
    }

    /// The incomplete multipart uploads of keys under `prefix`: on S3, what ListMultipartUploads says; other
    /// backends keep no upload beyond the process that wrote it, so none.
    pub async fn incomplete_uploads(
        &self,
        ctx: &IoContext,
        prefix: &str,
    ) -> Result<Vec<crate::IncompleteUpload>> {
        let Some(w) = &self.inner.wire else {
            return Ok(Vec::new());
        };
        let what = format!("LIST uploads {}/{prefix}", self.inner.id);
        self.observe(ctx, Op::List, prefix, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::List, || w.uploads(prefix, &what))
                .await
        })
        .await
    }

    /// Abort the incomplete multipart uploads under `prefix` that `which` selects (a killed writer's, or ones
    /// older than a threshold), freeing their parts; how many were aborted. Every one is tried; the first
    /// failure is returned after.
    pub async fn abort_uploads(
        &self,
        ctx: &IoContext,
        prefix: &str,
        which: impl Fn(&crate::IncompleteUpload) -> bool,
    ) -> Result<usize> {
        if self.inner.wire.is_none() {
            return Ok(0);
        }
        let mut aborted = 0;
        let mut first_err = None;
        for u in self.incomplete_uploads(ctx, prefix).await? {
            if !which(&u) {
                continue;
            }
            match self.abort_upload(ctx, &u).await {
                Ok(()) => aborted += 1,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(aborted),
        }
    }

    /// Abort one incomplete multipart upload (one already gone counts as aborted).
    pub async fn abort_upload(&self, ctx: &IoContext, u: &crate::IncompleteUpload) -> Result<()> {
        let Some(w) = &self.inner.wire else {
            return Ok(());
        };
        let what = format!(
            "abort multipart {}/{} (upload {})",
            self.inner.id, u.key, u.upload_id
        );
        self.observe(ctx, Op::Delete, &u.key, |_| 0, async {
            self.inner
                .retry
                .run(&self.inner.telemetry, Op::Delete, || {
                    w.abort(&u.key, &u.upload_id, &what)
                })
                .await
        })
        .await
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

    /// Every object of a local directory whose key starts with `prefix`, in key order: the plain files under
    /// the prefix's directory (when it can be a plain path) and the escaped keys ([`crate::localkeys`]); a key
    /// found in both places is shown once.
    async fn local_list(&self, prefix: &str, what: &str) -> Result<Vec<ObjectMeta>> {
        let mut out: std::collections::BTreeMap<String, ObjectMeta> = Default::default();
        if local_dir_walkable(prefix) {
            let dir = match prefix.rfind('/') {
                Some(i) if i > 0 => Some(
                    Path::parse(&prefix[..i]).map_err(|e| Error::invalid_input(e.to_string()))?,
                ),
                _ => None,
            };
            let mut stream = self.inner.store.list(dir.as_ref());
            let escape = format!("{}/", crate::localkeys::ESCAPE_DIR);
            while let Some(m) = stream.next().await {
                let m = m.map_err(|e| classify(e, what))?;
                let loc = m.location.as_ref();
                if loc.starts_with(&escape) || !loc.starts_with(prefix) {
                    continue;
                }
                let location = m.location.clone();
                let mut meta = convert_meta(m);
                self.show_local_etag(&location, &mut meta);
                out.insert(meta.key.clone(), meta);
            }
        }
        for m in self.local_escaped(prefix, what).await? {
            out.entry(m.key.clone()).or_insert(m);
        }
        Ok(out.into_values().collect())
    }

    /// The escaped keys of a local directory that start with `prefix` (none, at no cost, while there are none).
    async fn local_escaped(&self, prefix: &str, what: &str) -> Result<Vec<ObjectMeta>> {
        let Some(root) = &self.inner.local_root else {
            return Ok(Vec::new());
        };
        if !root.join(crate::localkeys::ESCAPE_DIR).is_dir() {
            return Ok(Vec::new());
        }
        let dir = Path::from(crate::localkeys::ESCAPE_DIR);
        let mut stream = self.inner.store.list(Some(&dir));
        let mut out = Vec::new();
        while let Some(m) = stream.next().await {
            let m = m.map_err(|e| classify(e, what))?;
            let Some(key) = crate::localkeys::key_of(m.location.as_ref()) else {
                continue;
            };
            if key.starts_with(prefix) {
                let location = m.location.clone();
                let mut meta = convert_meta(m);
                self.show_local_etag(&location, &mut meta);
                meta.key = key;
                out.push(meta);
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Whether a local directory holds `key` (in either of its places).
    fn local_holds(&self, key: &str) -> bool {
        let Some(root) = &self.inner.local_root else {
            return false;
        };
        (crate::localkeys::plain_shape(key) && root.join(key).is_file())
            || root.join(crate::localkeys::escaped(key)).is_file()
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

/// A multipart upload in progress. Parts are uploaded as data arrives (up to 8 in flight); nothing is visible
/// until [`Self::complete`]. Dropping it without completing leaves no object (call [`Self::abort`] to also free
/// the parts at the backend promptly).
pub struct MultipartUpload {
    backend: Backend,
    ctx: IoContext,
    key: String,
    writer: Option<object_store::WriteMultipart>,
    bytes: u64,
    start: Instant,
    /// For a local directory: where and what to keep as the object's attributes once complete.
    /// On a local directory: the file written, and the attributes to keep with it.
    local: Option<(Path, Option<ObjectAttrs>)>,
    /// On a local directory: the MD5 of the bytes written so far (the object's ETag), unless
    /// [`Self::set_etag`] named another.
    md5: Option<crate::localetag::Md5>,
    etag: Option<String>,
}

impl fmt::Debug for MultipartUpload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultipartUpload")
            .field("backend", &self.backend.inner.id)
            .field("key", &self.key)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl MultipartUpload {
    const MAX_PARTS_IN_FLIGHT: usize = 8;

    /// Append bytes; waits while too many parts are in flight (bounded memory).
    pub async fn write(&mut self, bytes: Bytes) -> Result<()> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        let w = self
            .writer
            .as_mut()
            .ok_or_else(|| Error::internal(format!("{what}: upload already finished")))?;
        w.wait_for_capacity(Self::MAX_PARTS_IN_FLIGHT)
            .await
            .map_err(|e| classify(e, &what))?;
        self.bytes += bytes.len() as u64;
        if let Some(h) = &mut self.md5 {
            h.update(&bytes);
        }
        w.put(bytes);
        Ok(())
    }

    /// The ETag the object gets where the backend takes one from the writer (a local directory, whose own is
    /// no hash): the gateway gives S3's multipart form. Without it, the content's MD5.
    pub fn set_etag(&mut self, etag: impl Into<String>) {
        self.etag = Some(etag.into());
    }

    /// Upload the last part and make the object visible.
    pub async fn complete(mut self) -> Result<PutOutcome> {
        let what = format!("multipart PUT {}/{}", self.backend.inner.id, self.key);
        let mut w = self
            .writer
            .take()
            .ok_or_else(|| Error::internal(format!("{what}: upload already finished")))?;
        // The parts first: when one failed, that failure is what the caller reads. (object_store's `finish`
        // aborts the upload then and returns the abort's error instead, a DELETE failure when the store is
        // down.)
        let r = match w.wait_for_capacity(0).await {
            Ok(()) => w.finish().await.map_err(|e| classify(e, &what)),
            Err(e) => {
                let cause = classify(e, &what);
                if let Err(a) = w.abort().await {
                    tracing::warn!(error = %a, key = %self.key, "aborting a failed multipart upload (the store keeps its parts until it expires them)");
                }
                Err(cause)
            }
        };
        let outcome = match &r {
            Ok(_) => Outcome::Ok,
            Err(e) => Outcome::Err(e.kind()),
        };
        self.backend.emit(
            &self.ctx,
            Op::Put,
            &self.key,
            self.bytes,
            self.start,
            outcome,
        );
        let r = r?;
        let mut etag = r.e_tag;
        if let Some((path, attrs)) = &self.local {
            if let Some(attrs) = attrs {
                self.backend.keep_local_attrs(path, attrs);
            }
            self.backend.forget_other_place(&self.key, path);
            let public = match (self.etag.take(), self.md5.take()) {
                (Some(e), _) => Some(e),
                (None, Some(h)) => Some(h.hex()),
                (None, None) => None,
            };
            if let Some(public) = public {
                etag = self.backend.record_local_etag(path, public, etag);
            }
        }
        Ok(PutOutcome {
            etag,
            version: r.version,
        })
    }

    /// Abandon the upload and free its parts at the backend.
    pub async fn abort(mut self) -> Result<()> {
        let what = format!("abort multipart {}/{}", self.backend.inner.id, self.key);
        match self.writer.take() {
            Some(w) => w.abort().await.map_err(|e| classify(e, &what)),
            None => Ok(()),
        }
    }
}

fn host_of(url: &url::Url, raw: &str) -> Result<String> {
    match url.host_str() {
        Some(h) if !h.is_empty() => Ok(h.to_string()),
        _ => Err(Error::invalid_input(format!(
            "backend URL {raw:?} has no bucket name"
        ))),
    }
}

/// The S3 endpoint: the options', else the standard AWS environment's (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT`).
/// The rest of the AWS environment (credentials chain, web identity, container credentials, region) is read
/// by object_store's builder ([`object_store::aws::AmazonS3Builder::from_env`]), as every AWS client does; these
/// and the region below are the only variables Strata's own code reads here.
fn s3_endpoint(o: &BackendOptions) -> Option<String> {
    o.endpoint
        .clone()
        .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
        .or_else(|| std::env::var("AWS_ENDPOINT").ok())
}

/// How an S3 backend is reached, for [`S3Wire`] (the same answers `object_store`'s builder was given).
struct S3Target {
    endpoint: Option<String>,
    region: String,
    virtual_hosted: bool,
    timeout: Duration,
}

fn build_s3(
    bucket: &str,
    o: &BackendOptions,
    url: &str,
) -> Result<(object_store::aws::AmazonS3, S3Target)> {
    use object_store::aws::AmazonS3Builder;
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    let endpoint = s3_endpoint(o);
    if let Some(ep) = &endpoint {
        b = b
            .with_endpoint(ep)
            .with_allow_http(ep.starts_with("http://"));
    }
    let region = o
        .region
        .clone()
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .unwrap_or_else(|| "us-east-1".into());
    b = b.with_region(&region);
    if let Some(k) = &o.access_key_id {
        b = b.with_access_key_id(k);
    }
    if let Some(s) = &o.secret_access_key {
        b = b.with_secret_access_key(s);
    }
    if let Some(t) = &o.session_token {
        b = b.with_token(t);
    }
    let virtual_hosted = o.virtual_hosted_style.unwrap_or(endpoint.is_none());
    b = b.with_virtual_hosted_style_request(virtual_hosted);
    if o.skip_signature.unwrap_or(false) {
        b = b.with_skip_signature(true);
    }
    let timeout = Duration::from_secs(o.request_timeout_secs.unwrap_or(60).max(1));
    let client = object_store::ClientOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(Duration::from_secs(5))
        .with_pool_max_idle_per_host(64)
        .with_allow_http(
            endpoint
                .as_deref()
                .is_some_and(|e| e.starts_with("http://")),
        );
    let store = b
        .with_client_options(client)
        // Strata retries in one place (RetryPolicy), so object_store's own loop is off.
        .with_retry(object_store::RetryConfig {
            max_retries: 0,
            ..Default::default()
        })
        .build()
        .map_err(|e| classify(e, &format!("configuring {url}")).with_retryable(false))?;
    let target = S3Target {
        endpoint,
        region,
        virtual_hosted,
        timeout,
    };
    Ok((store, target))
}

/// The first `max_keys` of `objects` (in key order) as a page; `next_start_after` when more follow.
fn page_of(mut objects: Vec<ObjectMeta>, max_keys: usize) -> ListPage {
    let next = if objects.len() > max_keys {
        objects.truncate(max_keys);
        objects.last().map(|o| o.key.clone())
    } else {
        None
    };
    ListPage {
        objects,
        common_prefixes: Vec::new(),
        next_start_after: next,
    }
}

/// A listing through [`S3Wire`], page after page: objects (in key order, after `start_after`) until `limit` of
/// them or the first for which `past_end` holds, and the common prefixes. `complete`: the listing reached its
/// end (or `past_end`) rather than the limit.
async fn wire_list(
    w: &S3Wire,
    prefix: &str,
    delimiter: Option<&str>,
    start_after: Option<&str>,
    past_end: impl Fn(&ObjectMeta) -> bool,
    limit: usize,
    what: &str,
) -> Result<(Vec<ObjectMeta>, Vec<String>, bool)> {
    let mut objects = Vec::new();
    let mut prefixes = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let want = limit.saturating_sub(objects.len()).max(1);
        let page = w
            .list(prefix, delimiter, start_after, token.as_deref(), want, what)
            .await?;
        prefixes.extend(page.common_prefixes);
        for m in page.objects {
            if past_end(&m) {
                return Ok((objects, prefixes, true));
            }
            if objects.len() == limit {
                return Ok((objects, prefixes, false));
            }
            objects.push(m);
        }
        match page.next_token {
            Some(t) if objects.len() < limit => token = Some(t),
            // Full: complete only if nothing follows.
            Some(_) => return Ok((objects, prefixes, false)),
            None => return Ok((objects, prefixes, true)),
        }
    }
}

/// A listing offset as the backend compares it: the key itself, never percent-encoded (`Path::from` encodes
/// `#`, `%`, `~`, control characters and the like, which moved the offset past keys that sort between the key and
/// its encoding: paging lost them). `None` (list from the start; the caller filters) for a string that is
/// not a valid path.
fn offset_path(s: &str) -> Option<Path> {
    if s.is_empty() {
        return None;
    }
    Path::parse(s).ok().filter(|p| p.as_ref() == s)
}

/// A key S3 allows: 1 to 1,024 bytes.
fn s3_key(key: &str) -> Result<()> {
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

/// Whether the directory part of a listing prefix (up to its last `/`) can be a plain path on a local
/// directory, so that plain files can be under it.
fn local_dir_walkable(prefix: &str) -> bool {
    match prefix.rfind('/') {
        Some(i) if i > 0 => crate::localkeys::plain_shape(&prefix[..i]),
        Some(_) => false,
        None => true,
    }
}

/// Split a listing prefix into the directory to list and the name prefix to filter by.
fn split_prefix(prefix: &str) -> Result<(Option<Path>, String)> {
    if prefix.is_empty() {
        return Ok((None, String::new()));
    }
    if prefix.contains('\0') || prefix.split('/').any(|s| s == "..") || prefix.starts_with('/') {
        return Err(Error::invalid_input(format!(
            "invalid listing prefix {prefix:?}"
        )));
    }
    let dir = match prefix.rfind('/') {
        Some(i) if i > 0 => Some(to_path(&prefix[..i])?),
        _ => None,
    };
    Ok((dir, prefix.to_string()))
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
    out
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
    out
}
