//! Where shard bytes come from: the node agent's shared cache, or an in-process cache over the backend.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_api::{Endpoint, data};
use strata_cache::{BlockCache, CacheConfig, DiskConfig, GetOptions};
use strata_object::Backend;
use strata_object::{BackendOptions, RetryPolicy};
use strata_telemetry::Telemetry;
use strata_types::ByteSize;
use strata_types::{Error, ErrorKind, IoContext, ObjectMeta, Result};

use crate::format::mds;
use crate::shard::Shard;

/// Shard bytes through the node agent (`strata serve`): every rank of the node shares its cache, so each block is
/// fetched from the origin once per node.
#[derive(Debug, Clone)]
pub struct AgentSource {
    /// The agent's API.
    client: strata_client::AgentClient,
    /// Dataset URL as the agent resolves it (`s3://bucket/prefix`, or a configured backend's URL or name).
    root: String,
    /// The backend itself, for listing a dataset that has no index (the agent has no listing API).
    lister: Option<Backend>,
    /// Reads land in slots of this region when it has room (samples that cross DataLoader workers).
    region: Option<Arc<crate::shm::SharedRegion>>,
}

/// Shard bytes through a cache in this process.
#[derive(Debug, Clone)]
pub struct LocalSource {
    backend: Backend,
    cache: BlockCache,
    /// The version of each shard seen first, read all epoch ([`GetOptions::version`]: a shard that changes
    /// fails its reads instead of mixing versions).
    versions: Arc<Mutex<HashMap<String, ObjectMeta>>>,
    root: String,
    /// Exclusive lock on the disk tier's directory, held while this source lives.
    _dir_lock: Option<Arc<std::fs::File>>,
}

/// A source of shard bytes.
#[derive(Debug, Clone)]
pub enum Source {
    /// Through the node agent.
    Agent(AgentSource),
    /// Through an in-process cache.
    Local(LocalSource),
    /// Through the cache of the process that opened the dataset (DataLoader workers).
    Shared(crate::share::client::ShareClient),
}

fn join(root: &str, key: &str) -> String {
    format!("{}/{key}", root.trim_end_matches('/'))
}

fn check_version(shard: &Shard, meta: &ObjectMeta) -> Result<()> {
    let size_ok = shard.size.is_none_or(|s| s == meta.size);
    let etag_ok = match (&shard.etag, &meta.etag) {
        (Some(a), Some(b)) => a.trim_matches('"') == b.trim_matches('"'),
        _ => true,
    };
    if size_ok && etag_ok {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::PreconditionFailed,
        format!(
            "shard {}: the index says {} bytes (etag {}), the object has {} bytes (etag {}); the object changed after \
             the index was built: rebuild it (strata dataset index)",
            shard.key,
            shard.size.map_or("?".to_string(), |s| s.to_string()),
            shard.etag.as_deref().unwrap_or("-"),
            meta.size,
            meta.etag.as_deref().unwrap_or("-"),
        ),
    ))
}

impl AgentSource {
    /// A source reading `root` through the agent whose API listens at `api` (`http://127.0.0.1:7070`), with
    /// the token from the environment.
    pub fn new(api: &str, root: &str, lister: Option<Backend>) -> Result<Self> {
        Ok(Self {
            client: strata_client::AgentClient::new(
                api,
                &strata_client::ClientOptions::from_env(),
            )?,
            root: root.to_string(),
            lister,
            region: None,
        })
    }

    /// This source (sharing its connections) with reads landing in slots of `region` while it has room.
    pub fn with_region(&self, region: Option<Arc<crate::shm::SharedRegion>>) -> Self {
        Self {
            region,
            ..self.clone()
        }
    }

    fn url(&self, route: &str, key: &str) -> Result<url::Url> {
        let location = join(&self.root, key);
        self.client
            .url_with(route, &[("location", location.as_str())])
    }

    /// Ask the agent to start fetching `range` of `key` into its cache (`POST /v1/prefetch`).
    async fn prefetch(&self, ctx: &IoContext, key: &str, range: Range<u64>) -> Result<()> {
        if range.end <= range.start {
            return Ok(());
        }
        let mut req = self
            .client
            .request(
                strata_client::Method::POST,
                self.url(data::Prefetch::PATH, key)?,
            )
            .header("range", format!("bytes={}-{}", range.start, range.end - 1));
        if let Some(job) = &ctx.job {
            req = req.header("x-strata-job", job.as_ref());
        }
        self.client
            .send(req, &format!("prefetch of {key}"))
            .await
            .map(|_| ())
    }

    async fn get(
        &self,
        ctx: &IoContext,
        key: &str,
        range: Option<Range<u64>>,
        sample: bool,
    ) -> Result<(Option<String>, u64, Bytes)> {
        let location = join(&self.root, key);
        let mut req = self
            .client
            .request(strata_client::Method::GET, self.url(data::Read::PATH, key)?);
        if let Some(job) = &ctx.job {
            req = req.header("x-strata-job", job.as_ref());
        }
        if let Some(r) = &range {
            if r.end <= r.start {
                return Ok((None, 0, Bytes::new()));
            }
            req = req.header("range", format!("bytes={}-{}", r.start, r.end - 1));
        }
        let resp = self
            .client
            .send(req, &format!("read of {location}"))
            .await?;
        let etag = resp
            .headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let total = resp
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit('/').next())
            .and_then(|v| v.parse().ok());
        let failed = |e: strata_client::reqwest::Error| {
            Error::new(
                ErrorKind::Unavailable,
                format!("agent read of {location}: {e}"),
            )
        };
        let expected = resp.content_length().and_then(|n| usize::try_from(n).ok());
        let slot = match (&self.region, expected) {
            (Some(r), Some(n)) if sample && n > 0 => r.alloc(n),
            _ => None,
        };
        let body = match (slot, expected) {
            // Chunk by chunk into the slot (what `bytes()` would do into a fresh buffer).
            (Some(mut slot), Some(n)) => {
                let mut resp = resp;
                let mut at = 0;
                while let Some(chunk) = resp.chunk().await.map_err(failed)? {
                    let Some(dst) = slot
                        .as_mut_slice()
                        .get_mut(at..at + chunk.len())
                        .filter(|_| at + chunk.len() <= n)
                    else {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            format!("agent read of {location}: more than the {n} bytes announced"),
                        ));
                    };
                    dst.copy_from_slice(&chunk);
                    at += chunk.len();
                }
                if at != n {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!("agent read of {location}: {at} of {n} bytes"),
                    ));
                }
                slot.freeze(n)
            }
            _ => resp.bytes().await.map_err(failed)?,
        };
        let total = total.unwrap_or(body.len() as u64);
        Ok((etag, total, body))
    }
}

impl LocalSource {
    /// A source reading `backend` (opened at the dataset root) through `cache`.
    pub fn new(backend: Backend, cache: BlockCache, root: &str) -> Self {
        Self {
            backend,
            cache,
            versions: Arc::new(Mutex::new(HashMap::new())),
            root: root.to_string(),
            _dir_lock: None,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The in-process cache.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// The version of `shard` read all epoch, checked against the index the first time.
    async fn version(&self, ctx: &IoContext, shard: &Shard) -> Result<ObjectMeta> {
        if let Some(m) = self.versions.lock().get(&shard.key) {
            return Ok(m.clone());
        }
        let meta = self
            .cache
            .get(ctx, &self.backend, &shard.key, GetOptions::default().head())
            .await?
            .meta;
        check_version(shard, &meta)?;
        Ok(self
            .versions
            .lock()
            .entry(shard.key.clone())
            .or_insert(meta)
            .clone())
    }
}

impl Source {
    /// The dataset root, for messages.
    pub fn root(&self) -> &str {
        match self {
            Source::Agent(a) => &a.root,
            Source::Local(l) => &l.root,
            Source::Shared(_) => "(shared loader cache)",
        }
    }

    /// Bytes `range` of a shard, verified against the shard's recorded size and ETag.
    pub async fn read(&self, ctx: &IoContext, shard: &Shard, range: Range<u64>) -> Result<Bytes> {
        self.read_with(ctx, shard, range, false).await
    }

    /// As [`read`](Self::read), for a sample's bytes: in a DataLoader worker with `zero_copy` they land in the
    /// shared sample region (see [`crate::shm`]) when it has room.
    pub async fn read_sample(
        &self,
        ctx: &IoContext,
        shard: &Shard,
        range: Range<u64>,
    ) -> Result<Bytes> {
        self.read_with(ctx, shard, range, true).await
    }

    async fn read_with(
        &self,
        ctx: &IoContext,
        shard: &Shard,
        range: Range<u64>,
        sample: bool,
    ) -> Result<Bytes> {
        let (start, len) = (range.start, range.end - range.start);
        let bytes = match self {
            Source::Local(l) => {
                let meta = l.version(ctx, shard).await?;
                let size = meta.size;
                if range.end > size {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "shard {}: bytes {range:?} asked, the object has {size} (truncated shard?)",
                            shard.key
                        ),
                    ));
                }
                if range.is_empty() {
                    Bytes::new()
                } else {
                    let opts = GetOptions::default().bytes(range.clone()).version(meta);
                    let got = l.cache.get(ctx, &l.backend, &shard.key, opts).await?;
                    got.body.collect().await?
                }
            }
            Source::Agent(a) => {
                let (etag, total, body) =
                    a.get(ctx, &shard.key, Some(range.clone()), sample).await?;
                check_version(
                    shard,
                    &ObjectMeta {
                        key: shard.key.clone(),
                        size: total,
                        etag,
                        version: None,
                        last_modified_unix: 0,
                        attrs: None,
                    },
                )?;
                body
            }
            Source::Shared(c) if sample => c.read_sample(&shard.key, range).await?,
            Source::Shared(c) => c.read(&shard.key, range).await?,
        };
        if bytes.len() as u64 != len {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "shard {}: {len} bytes asked at {start}, {} read (truncated shard?)",
                    shard.key,
                    bytes.len()
                ),
            ));
        }
        Ok(bytes)
    }

    /// Start fetching bytes `range` of a shard into the cache (large sequential requests) without waiting for
    /// them; a hint: budget limits may skip part of it.
    pub async fn prefetch(&self, ctx: &IoContext, shard: &Shard, range: Range<u64>) -> Result<()> {
        match self {
            Source::Local(l) => {
                let meta = l.version(ctx, shard).await?;
                if range.start >= range.end.min(meta.size) {
                    return Ok(());
                }
                let opts = GetOptions::default().bytes(range).version(meta);
                l.cache.prefetch(ctx, &l.backend, &shard.key, opts).await
            }
            Source::Shared(c) => c.prefetch(&shard.key, range).await,
            Source::Agent(a) => a.prefetch(ctx, &shard.key, range).await,
        }
    }

    /// A shard's sample offsets (`samples + 1`), reading the MDS header on first use (tar offsets come from
    /// a manifest or a scan).
    pub async fn offsets(&self, ctx: &IoContext, shard: &Shard) -> Result<Arc<Vec<u64>>> {
        if let Some(o) = shard.known_offsets() {
            return Ok(o);
        }
        let head_len = 4 * (shard.samples + 2);
        let head = self.read(ctx, shard, 0..head_len).await?;
        let size = self.size(ctx, shard).await?;
        let offs = Arc::new(mds::offsets(&shard.key, &head, shard.samples, size)?);
        shard.set_offsets(offs.clone());
        Ok(offs)
    }

    /// Size of a shard's object.
    pub async fn size(&self, ctx: &IoContext, shard: &Shard) -> Result<u64> {
        match self {
            Source::Shared(c) => c.size(&shard.key).await,
            _ => Ok(self.meta(ctx, shard).await?.size),
        }
    }

    /// Current metadata of a shard's object.
    pub async fn meta(&self, ctx: &IoContext, shard: &Shard) -> Result<ObjectMeta> {
        match self {
            Source::Local(l) => l.version(ctx, shard).await,
            Source::Agent(a) => {
                let (etag, total, _) = a.get(ctx, &shard.key, Some(0..1), false).await?;
                Ok(ObjectMeta {
                    key: shard.key.clone(),
                    size: total,
                    etag,
                    version: None,
                    last_modified_unix: 0,
                    attrs: None,
                })
            }
            Source::Shared(c) => Ok(ObjectMeta {
                key: shard.key.clone(),
                size: c.size(&shard.key).await?,
                etag: shard.etag.clone(),
                version: None,
                last_modified_unix: 0,
                attrs: None,
            }),
        }
    }

    /// A whole small object (an index or manifest), not cached: it is read once per open.
    pub async fn read_whole(&self, ctx: &IoContext, key: &str) -> Result<Bytes> {
        match self {
            Source::Local(l) => Ok(l.backend.get(ctx, key).await?.1),
            Source::Agent(a) => Ok(a.get(ctx, key, None, false).await?.2),
            Source::Shared(_) => Err(Error::new(
                ErrorKind::Unsupported,
                format!("{key}: a worker reads shards only; the dataset is opened by its rank"),
            )),
        }
    }

    /// Every object under the root (for datasets without an index).
    pub async fn list(&self, ctx: &IoContext) -> Result<Vec<ObjectMeta>> {
        let backend = match self {
            Source::Local(l) => &l.backend,
            Source::Agent(AgentSource {
                lister: Some(b), ..
            }) => b,
            Source::Agent(_) | Source::Shared(_) => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "{}: cannot list through the agent; build a manifest (strata dataset index)",
                        self.root()
                    ),
                ));
            }
        };
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = backend.list_page(ctx, "", after.as_deref(), 1000).await?;
            out.extend(page.objects);
            match page.next_start_after {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        Ok(out)
    }
}

/// A dataset location as a URL: `s3://`, `file://` and other URLs as they are; a local path becomes `file://`
/// with an absolute path.
pub fn dataset_url(location: &str) -> Result<String> {
    if location.contains("://") {
        return Ok(location.trim_end_matches('/').to_string());
    }
    let p = std::path::Path::new(location);
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| Error::from_io(e, "current directory"))?
            .join(p)
    };
    if !abs.is_dir() {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("dataset directory {} does not exist", abs.display()),
        ));
    }
    Ok(format!("file://{}", abs.display()))
}

/// The in-process cache of a loader with no agent.
#[derive(Debug, Clone)]
pub struct LocalCacheOptions {
    /// RAM tier capacity.
    pub ram_bytes: u64,
    /// Optional disk tier: directory and capacity.
    pub disk: Option<(std::path::PathBuf, u64)>,
    /// Cache block size (the unit fetched from the backend). 4 MiB by default: samples are read at random
    /// inside a shuffle window, so smaller blocks than the agent's read less that is not needed.
    pub block_size: u64,
}

impl Default for LocalCacheOptions {
    fn default() -> Self {
        Self {
            ram_bytes: 512 << 20,
            disk: None,
            block_size: 4 << 20,
        }
    }
}

impl LocalSource {
    /// Open `url`'s backend (credentials and endpoint from the AWS environment for `s3://`) behind a new
    /// in-process cache.
    ///
    /// A disk tier directory is locked for this process (one cache per directory); when another process holds
    /// it, this source runs with the RAM tier only and logs why.
    pub fn open(url: &str, opts: &LocalCacheOptions, telemetry: Arc<Telemetry>) -> Result<Self> {
        let backend = Backend::open(
            url,
            &BackendOptions::default(),
            RetryPolicy::default(),
            telemetry.clone(),
        )?;
        let mut lock = None;
        let mut disk = None;
        if let Some((dir, cap)) = &opts.disk {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::from_io(e, format!("creating {}", dir.display())))?;
            let path = dir.join("loader.lock");
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(|e| Error::from_io(e, format!("opening {}", path.display())))?;
            match f.try_lock() {
                Ok(()) => {
                    lock = Some(Arc::new(f));
                    disk = Some(DiskConfig {
                        dir: dir.join("cache"),
                        capacity: ByteSize(*cap),
                    });
                }
                Err(_) => tracing::warn!(
                    dir = %dir.display(),
                    "loader disk cache is in use by another process; using RAM only"
                ),
            }
        }
        let mut cfg = CacheConfig::new(ByteSize(opts.ram_bytes), disk);
        cfg.block_size = ByteSize(opts.block_size);
        cfg.inflight_budget = ByteSize(opts.ram_bytes.clamp(2 * opts.block_size, 1 << 30));
        cfg.max_request_size = ByteSize(opts.block_size);
        // Shards are opened once per epoch and checked against the index; each open asks the backend, so a
        // changed shard is seen at the next open.
        cfg.metadata_ttl_ms = 0;
        cfg.validate()?;
        let cache = BlockCache::open(cfg, telemetry)?;
        let mut me = Self::new(backend, cache, url);
        me._dir_lock = lock;
        Ok(me)
    }
}
