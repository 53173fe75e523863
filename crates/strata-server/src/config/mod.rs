//! `strata serve` configuration: a TOML file, then environment/flags on top, then validation into a
//! [`Resolved`] configuration with every default filled in and every path absolute.

mod keys;
mod sharing;

pub use keys::AccessKey;
pub use sharing::Sharing;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_cache::{CacheConfig, DiskConfig, PolicyKind};
use strata_object::{BackendOptions, RetryPolicy};
use strata_types::{ByteSize, Error, Result};

/// The configuration file, as written by an operator. Every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Where Strata keeps its state: the disk cache, the default local backend, the API address file.
    /// Default `./.strata`.
    pub data_dir: Option<PathBuf>,
    /// The control API.
    pub api: ApiSection,
    /// The tiered cache.
    pub cache: CacheSection,
    /// Retries of backend operations.
    pub retry: RetryPolicy,
    /// Options for `s3://` URLs that match no configured backend (ad-hoc warm-ups and reads).
    pub s3_defaults: BackendOptions,
    /// Named backends. Default: one backend `default`, a local directory `<data_dir>/objects`.
    pub backends: Vec<BackendSection>,
    /// The S3-compatible gateway.
    pub gateway: GatewaySection,
    /// The catalog (teams, quotas, usage, lifecycle) and its background work.
    pub catalog: CatalogSection,
    /// The agents of this cluster and how they authenticate to each other.
    pub cluster: ClusterSection,
    /// Claims.
    pub claims: ClaimsSection,
    /// Access analytics: rollups, heat, jobs.
    pub analytics: AnalyticsSection,
}

/// `[analytics]`: how operations are rolled up, how heat decays, when a job's metadata rate is a runaway.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalyticsSection {
    /// Record operations at all. Default true.
    pub enabled: bool,
    /// Where the rollups are written as hive-partitioned Parquet. Default `<data-dir>/analytics`.
    pub dir: Option<PathBuf>,
    /// Seconds between writes (the minute in progress is rewritten until it closes: a kill loses at most
    /// this much). Default 60, 1 to 3600.
    pub flush_secs: u64,
    /// Key segments a prefix keeps in rollups and heat (`bucket/a/b/` for 2). Default 2, at most 16.
    pub prefix_depth: usize,
    /// Heat halves over this many seconds. Default 3600.
    pub heat_half_life_secs: u64,
    /// A job whose metadata operations stay over this rate (per second) for `runaway_window_secs` is flagged
    /// a runaway. Default 500.
    pub runaway_ops_per_sec: f64,
    /// See `runaway_ops_per_sec`. Default 60, at least 10, at most 300.
    pub runaway_window_secs: u64,
    /// Jobs tracked at most (the least recently seen go first). Default 10,000.
    pub max_jobs: usize,
    /// Heat entries (datasets and prefixes) at most (the coldest go first). Default 50,000.
    pub max_heat: usize,
    /// Rollup rows per minute at most (past it, a team's `(other)` row). Default 20,000.
    pub max_rollup_keys: usize,
    /// A prefix nothing has read or written for this many days is cold (`strata heat --cold`). Default 30,
    /// 1 to 3650.
    pub cold_after_days: u64,
    /// Days the rollups are kept in the catalog for the fleet view (`/v1/analytics/fleet`); 0: this agent's
    /// rollups are not shared. Default 7, at most 366.
    pub fleet_retention_days: u64,
}

impl Default for AnalyticsSection {
    fn default() -> Self {
        let d = strata_analytics::AnalyticsConfig::default();
        Self {
            enabled: d.enabled,
            dir: None,
            flush_secs: 60,
            prefix_depth: d.prefix_depth,
            heat_half_life_secs: d.heat_half_life.as_secs(),
            runaway_ops_per_sec: d.runaway_ops_per_sec,
            runaway_window_secs: d.runaway_window.as_secs(),
            max_jobs: d.max_jobs,
            max_heat: d.max_heat,
            max_rollup_keys: d.max_rollup_keys,
            cold_after_days: d.cold_after.as_secs() / 86_400,
            fleet_retention_days: 7,
        }
    }
}

impl AnalyticsSection {
    fn resolve(&self) -> Result<strata_analytics::AnalyticsConfig> {
        let bad = |what: &str| Err(Error::config(format!("[analytics] {what}")));
        if self.prefix_depth > 16 {
            return bad("prefix_depth: at most 16");
        }
        if self.heat_half_life_secs == 0 {
            return bad("heat_half_life_secs: must be positive");
        }
        if !(self.runaway_ops_per_sec.is_finite() && self.runaway_ops_per_sec > 0.0) {
            return bad("runaway_ops_per_sec: must be a positive number");
        }
        if !(1..=3600).contains(&self.flush_secs) {
            return bad("flush_secs: 1 to 3600");
        }
        if !(10..=300).contains(&self.runaway_window_secs) {
            return bad("runaway_window_secs: 10 to 300");
        }
        if self.fleet_retention_days > 366 {
            return bad("fleet_retention_days: at most 366");
        }
        if !(1..=3650).contains(&self.cold_after_days) {
            return bad("cold_after_days: 1 to 3650");
        }
        if self.max_jobs < 10 || self.max_heat < 10 || self.max_rollup_keys < 10 {
            return bad("max_jobs, max_heat and max_rollup_keys: at least 10");
        }
        Ok(strata_analytics::AnalyticsConfig {
            enabled: self.enabled,
            prefix_depth: self.prefix_depth,
            heat_half_life: std::time::Duration::from_secs(self.heat_half_life_secs),
            runaway_ops_per_sec: self.runaway_ops_per_sec,
            runaway_window: std::time::Duration::from_secs(self.runaway_window_secs),
            max_jobs: self.max_jobs,
            max_heat: self.max_heat,
            max_rollup_keys: self.max_rollup_keys,
            cold_after: std::time::Duration::from_secs(self.cold_after_days * 86_400),
            ..strata_analytics::AnalyticsConfig::default()
        })
    }
}

/// `[claims]`: how claims' mounts are made.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClaimsSection {
    /// The Unix socket of a `strata mounter` that makes claims' mounts on the agent's behalf, so that they
    /// outlive the agent's process, cgroup or container (on Kubernetes: the mounter container of the agents'
    /// pod). Unset: the agent runs `strata mount` itself, and its mounts end with its cgroup.
    pub mounter: Option<PathBuf>,
}

/// `[cluster]`: the other agents this one may push replicas to, and the secret agents authenticate to each
/// other with (never a user's token, which no agent ever sends on).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterSection {
    /// Every agent of the cluster (control API addresses, `host:port` or URLs), this one included. A
    /// handed-over save pushes replicas only to these; a request naming another address is refused.
    pub peers: Vec<String>,
    /// A file holding the cluster secret (`STRATA_CLUSTER_SECRET` wins). Without one, agents do not accept
    /// one another's calls and handed-over saves cannot replicate to peers.
    pub secret_file: Option<PathBuf>,
    /// Share the block cache with the other agents ([`crate::cluster`]): who the members are. Default `off`.
    pub cache: CacheSharing,
    /// This agent's address as the other agents reach it (`host:port` or `http://host:port`). Default:
    /// `http://<api listen>` (with `cache = "slurm"`: `http://<host name>:<slurm_port>`).
    pub advertise: Option<String>,
    /// `cache = "slurm"`: the port of the agent on every node of the job. Default: this agent's API port.
    pub slurm_port: Option<u16>,
    /// `cache = "catalog"`: seconds between heartbeats. Default 2.
    pub heartbeat_secs: Option<u64>,
    /// `cache = "catalog"`: an agent is a member while its last heartbeat is younger than this. Default 10.
    pub member_ttl_secs: Option<u64>,
    /// Longest a peer may take to answer a block request before the next owner or the origin is tried, in
    /// milliseconds (connecting: at most 1 s of it). Default 10000.
    pub peer_timeout_ms: Option<u64>,
    /// `cache = "kubernetes"`: the headless Service of the agents; its EndpointSlices' ready endpoints are
    /// the members. Default `strata-agents`.
    pub kube_service: Option<String>,
    /// `cache = "kubernetes"`: the Service's namespace. Default: `POD_NAMESPACE`, else `strata-system`.
    pub kube_namespace: Option<String>,
    /// Read-after-write across the agents (`docs/consistency.md`): an agent out of contact with some member
    /// for this long stops trusting its metadata cache, and a write waits at most about this long for a
    /// member that does not answer. Milliseconds, default 5000.
    pub metadata_lease_ms: Option<u64>,
}

/// Where the members of a shared cache come from (`[cluster] cache`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheSharing {
    /// Every agent caches for itself.
    #[default]
    Off,
    /// The agents of `[cluster] peers`, with equal weights.
    Static,
    /// The agents registered in the shared catalog (PostgreSQL), live while they heartbeat, weighted by their
    /// cache capacity.
    Catalog,
    /// The nodes of this process's Slurm job (`SLURM_JOB_NODELIST`), with equal weights.
    Slurm,
    /// The ready endpoints of the agents' headless Service on Kubernetes (its EndpointSlices, watched), with
    /// equal weights.
    Kubernetes,
}

/// `[catalog]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CatalogSection {
    /// `sqlite:///path/catalog.db` or `postgres://user@host:port/db`. Default: SQLite at
    /// `<data_dir>/catalog.db`. Agents of one cluster share a PostgreSQL catalog.
    pub url: Option<String>,
    /// Seconds between usage samples (the history forecasts are made from). Default 3600.
    pub sample_interval_secs: u64,
    /// Alert (metric, log line, API field) when a forecast says a volume or quota fills within this many days.
    /// Default 14.
    pub forecast_alert_days: f64,
    /// Days of history a forecast uses. Default 30.
    pub forecast_window_days: u64,
    /// Seconds an admitted write may stay uncommitted before its reservation is released. Default 86400.
    pub reservation_ttl_secs: i64,
    /// Seconds trashed data is kept before `strata cleanup purge` deletes it. Default 7 days.
    pub trash_grace_secs: i64,
    /// Incomplete multipart uploads under a configured S3 backend are aborted once they are this many seconds
    /// old, both by the server's date and since this agent first saw them (checked at start, then every
    /// quarter of it, at least every second and at most hourly): a killed writer's parts are not kept and
    /// billed forever. 0 turns it off. Default 86400 (a day: longer than any live upload).
    pub abort_uploads_after_secs: u64,
}

impl Default for CatalogSection {
    fn default() -> Self {
        Self {
            url: None,
            sample_interval_secs: 3600,
            forecast_alert_days: 14.0,
            forecast_window_days: 30,
            reservation_ttl_secs: 86_400,
            trash_grace_secs: 7 * 86_400,
            abort_uploads_after_secs: 86_400,
        }
    }
}

/// `[gateway]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewaySection {
    /// Serve the S3 gateway. Default true.
    pub enabled: bool,
    /// Listen address. Default `127.0.0.1:9000` (loopback only).
    pub listen: Option<String>,
    /// The region clients must sign for. Default `us-east-1`.
    pub region: String,
    /// Access keys. `STRATA_ACCESS_KEY`/`STRATA_SECRET_KEY` add one; with none at all a key pair is generated
    /// into `<data_dir>/credentials.json`.
    pub keys: Vec<AccessKey>,
    /// Where CreateBucket makes buckets: `file:///dir` (a directory per bucket) or `s3://bucket/prefix` (a
    /// prefix per bucket). Unset: `<data_dir>/buckets` on embedded defaults (no backend configured), else
    /// CreateBucket is refused and the buckets are the configured backends; `""`: refused always.
    pub bucket_root: Option<String>,
    /// Connection options for `bucket_root` (as `[backends.options]`).
    pub bucket_root_options: BackendOptions,
}

impl Default for GatewaySection {
    fn default() -> Self {
        Self {
            enabled: true,
            listen: None,
            region: "us-east-1".into(),
            keys: Vec::new(),
            bucket_root: None,
            bucket_root_options: BackendOptions::default(),
        }
    }
}

/// `[api]`
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ApiSection {
    /// Listen address of the control API. Default `127.0.0.1:7070` (loopback only).
    pub listen: Option<String>,
}

/// A size that may be `"auto"` (sized for this machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoSize {
    /// Sized from the machine's memory or free disk space.
    #[default]
    Auto,
    /// A fixed size.
    Fixed(ByteSize),
}

impl Serialize for AutoSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            AutoSize::Auto => s.serialize_str("auto"),
            AutoSize::Fixed(b) => b.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for AutoSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(AutoSize::Fixed(ByteSize(n))),
            Raw::S(s) if s.eq_ignore_ascii_case("auto") => Ok(AutoSize::Auto),
            Raw::S(s) => s
                .parse()
                .map(AutoSize::Fixed)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// `[cache]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheSection {
    /// Block size. Default 8MiB.
    pub block_size: ByteSize,
    /// RAM tier capacity, or "auto" (1/8 of memory, 64MiB..8GiB).
    pub ram_capacity: AutoSize,
    /// Whether to use a disk tier. Default true.
    pub disk_enabled: bool,
    /// Disk tier directory. Default `<data_dir>/cache`.
    pub disk_dir: Option<PathBuf>,
    /// Disk tier capacity, or "auto" (1/4 of the free space, 256MiB..1TiB).
    pub disk_capacity: AutoSize,
    /// `tinylfu` (scan resistant, default) or `lru`.
    pub policy: PolicyKind,
    /// Most of the disk tier (percent) that pinned data may use. Default 50.
    pub pinned_max_percent: u8,
    /// Largest readahead window in blocks. Default 4.
    pub readahead_blocks: u32,
    /// Budget for bytes in flight from backends. Default 512MiB.
    pub inflight_budget: ByteSize,
    /// Largest backend request when filling consecutive blocks (warm-up). Default 32MiB.
    pub max_request_size: ByteSize,
    /// Accepted (1 to 256) for older configuration files, and without effect: reads stream their blocks in
    /// order, and cold blocks are fetched as runs (`max_request_size`). Default 8.
    pub read_parallelism: usize,
    /// Disk write queue length in blocks. Default 32.
    pub disk_write_queue: usize,
    /// How long object metadata is trusted before an object-store backend is asked again, in ms. Default
    /// 60000 (as mountpoint-s3 with a cache): a hot small object then costs no HEAD at the origin per GET.
    /// Local-directory backends are asked again after at most 1000 (a `stat`). 0 asks on every open. Writes
    /// and deletes through Strata invalidate it at once; changes made at the origin by others are seen
    /// within this time.
    pub metadata_ttl_ms: u64,
    /// How long a block fetched for a prefetch hint (`POST /v1/prefetch`) waits for its read, holding its
    /// share of the in-flight budget, in ms. Default 30000; at most 600000.
    pub prefetch_hold_ms: u64,
}

impl Default for CacheSection {
    fn default() -> Self {
        let d = CacheConfig::new(ByteSize(0), None);
        Self {
            block_size: d.block_size,
            ram_capacity: AutoSize::Auto,
            disk_enabled: true,
            disk_dir: None,
            disk_capacity: AutoSize::Auto,
            policy: d.policy,
            pinned_max_percent: d.pinned_max_percent,
            readahead_blocks: d.readahead_blocks,
            inflight_budget: d.inflight_budget,
            max_request_size: d.max_request_size,
            read_parallelism: d.read_parallelism,
            disk_write_queue: d.disk_write_queue,
            metadata_ttl_ms: d.metadata_ttl_ms,
            prefetch_hold_ms: d.prefetch_hold_ms,
        }
    }
}

/// `[[backends]]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendSection {
    /// Short name (`[a-z0-9-]`, 1..=63), used in `NAME/key` shorthands and, later, as the S3 bucket name.
    pub name: String,
    /// Backend URL: `s3://bucket/prefix`, `file:///path`, `memory://`.
    pub url: String,
    /// Connection options (S3 endpoint, region, credentials).
    #[serde(default)]
    pub options: BackendOptions,
}

/// A peer's control API address as `http://host:port`, the one form membership is compared in.
pub fn normalize_peer(p: &str) -> Result<String> {
    let p = p.trim().trim_end_matches('/');
    let (scheme, rest) = match p.split_once("://") {
        Some((s, r)) => (s, r),
        None => ("http", p),
    };
    let valid = matches!(scheme, "http" | "https")
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', '@', ' '])
        && rest
            .rsplit_once(':')
            .is_some_and(|(h, port)| !h.is_empty() && port.parse::<u16>().is_ok());
    if !valid {
        return Err(Error::invalid_input(format!(
            "peer {p:?}: expected host:port or http://host:port"
        )));
    }
    Ok(format!("{scheme}://{}", rest.to_ascii_lowercase()))
}

/// Values from flags and environment that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--data-dir` / `STRATA_DATA_DIR`.
    pub data_dir: Option<PathBuf>,
    /// `--api-listen` / `STRATA_API_LISTEN`.
    pub api_listen: Option<String>,
    /// `--s3-listen` / `STRATA_S3_LISTEN`.
    pub s3_listen: Option<String>,
    /// `--catalog` / `STRATA_CATALOG`.
    pub catalog: Option<String>,
    /// `STRATA_ADMIN_TOKEN`: the administrator's API token, shared by the agents of a cluster (else one is
    /// generated on first start and written to `<data_dir>/admin-token`).
    pub admin_token: Option<String>,
    /// `STRATA_ACCESS_KEY` + `STRATA_SECRET_KEY`: a gateway key of the `root` principal, added to the
    /// configured ones.
    pub root_key: Option<(String, String)>,
    /// `STRATA_CLUSTER_SECRET`: the secret agents of a cluster authenticate to each other with.
    pub cluster_secret: Option<String>,
    /// `STRATA_CATALOG_KEY`: the key the catalog's S3 secrets are sealed with (64 hex digits).
    pub catalog_key: Option<String>,
}

/// A validated configuration with every default resolved.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Absolute data directory.
    pub data_dir: PathBuf,
    /// Control API address.
    pub api_listen: SocketAddr,
    /// Cache configuration.
    pub cache: CacheConfig,
    /// Retry policy.
    pub retry: RetryPolicy,
    /// Options for ad-hoc `s3://` URLs.
    pub s3_defaults: BackendOptions,
    /// Backends, by name.
    pub backends: Vec<BackendSection>,
    /// The gateway's listen address, or `None` when it is disabled.
    pub s3_listen: Option<SocketAddr>,
    /// The gateway's region.
    pub s3_region: String,
    /// Where created buckets live (`[gateway] bucket_root`, without a trailing `/`) and its options.
    pub bucket_root: Option<(String, BackendOptions)>,
    /// Configured gateway keys (the root key of [`Overrides::root_key`] included).
    pub s3_keys: Vec<AccessKey>,
    /// The administrator token from [`Overrides::admin_token`].
    pub admin_token: Option<String>,
    /// Catalog URL (resolved: SQLite in the data dir by default).
    pub catalog_url: String,
    /// Catalog background work and lifecycle settings.
    pub catalog: CatalogSection,
    /// The cluster's agents (normalized `http://host:port`), for handed-over saves.
    pub peers: Vec<String>,
    /// The cluster secret ([`Overrides::cluster_secret`], else `[cluster] secret_file`), if any.
    pub cluster_secret: Option<String>,
    /// The catalog key from [`Overrides::catalog_key`]; `None`: `<data_dir>/catalog.key`.
    pub catalog_key: Option<String>,
    /// The shared cache, when `[cluster] cache` is not `off`.
    pub sharing: Option<Sharing>,
    /// The mounter's socket (`[claims] mounter`), absolute.
    pub mounter: Option<PathBuf>,
    /// Access analytics ([`AnalyticsSection`]).
    pub analytics: strata_analytics::AnalyticsConfig,
    /// Where the analytics' rollups are written, and how often.
    pub analytics_dir: PathBuf,
    pub analytics_flush: std::time::Duration,
    /// How long the fleet's rollups are kept in the catalog; `None`: not shared.
    pub analytics_fleet: Option<std::time::Duration>,
    /// A membership source built outside the agent, which `cache = "kubernetes"` needs (`strata serve`
    /// starts the EndpointSlice watch and puts it here). `None` from [`Config::resolve`].
    pub membership: Option<std::sync::Arc<dyn strata_cluster::Membership>>,
}

impl Config {
    /// Parse TOML text; errors name the line and the field.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::config(format!("{origin}: {e}")))
    }

    /// Read and parse a file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::from_io(e, format!("reading config file {}", path.display())).context("config")
        })?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Apply overrides, fill in defaults, and validate everything.
    pub fn resolve(mut self, o: &Overrides) -> Result<Resolved> {
        if let Some(d) = &o.data_dir {
            self.data_dir = Some(d.clone());
        }
        if let Some(l) = &o.api_listen {
            self.api.listen = Some(l.clone());
        }
        if let Some(l) = &o.s3_listen {
            self.gateway.listen = Some(l.clone());
        }
        if let Some(c) = &o.catalog {
            self.catalog.url = Some(c.clone());
        }
        let data_dir = absolute(
            self.data_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("./.strata")),
        )?;
        let listen = self
            .api
            .listen
            .clone()
            .unwrap_or_else(|| "127.0.0.1:7070".into());
        let api_listen: SocketAddr = listen.parse().map_err(|_| {
            Error::config(format!(
                "api.listen = {listen:?}: expected an address like 127.0.0.1:7070"
            ))
        })?;

        let c = &self.cache;
        let bs = c.block_size.bytes().max(1);
        let ram = match c.ram_capacity {
            AutoSize::Fixed(b) => b,
            AutoSize::Auto => {
                let total = total_memory().unwrap_or(8 << 30);
                ByteSize(round_down((total / 8).clamp(64 << 20, 8 << 30), bs).max(bs))
            }
        };
        let disk = if c.disk_enabled {
            let dir = absolute(c.disk_dir.clone().unwrap_or_else(|| data_dir.join("cache")))?;
            let fs = fs_space(&dir);
            let capacity = match c.disk_capacity {
                AutoSize::Fixed(b) => {
                    if let Some(total) = fs.map(|f| f.size)
                        && b.bytes() > total
                    {
                        return Err(Error::config(format!(
                            "cache.disk_capacity = {b} is larger than the file system holding {} ({})",
                            dir.display(),
                            ByteSize(total)
                        )));
                    }
                    b
                }
                AutoSize::Auto => {
                    let free = fs.map_or(1 << 30, |f| f.available);
                    ByteSize(round_down((free / 4).clamp(256 << 20, 1 << 40), bs).max(bs))
                }
            };
            Some(DiskConfig { dir, capacity })
        } else {
            None
        };
        let cache = CacheConfig {
            block_size: c.block_size,
            ram_capacity: ram,
            disk,
            policy: c.policy,
            pinned_max_percent: c.pinned_max_percent,
            readahead_blocks: c.readahead_blocks,
            inflight_budget: c.inflight_budget,
            max_request_size: c.max_request_size,
            read_parallelism: c.read_parallelism,
            metadata_ttl_ms: c.metadata_ttl_ms,
            disk_write_queue: c.disk_write_queue,
            prefetch_hold_ms: c.prefetch_hold_ms,
        };
        cache.validate()?;
        if self.retry.max_retries > 20 {
            return Err(Error::config(format!(
                "retry.max_retries = {}: at most 20",
                self.retry.max_retries
            )));
        }
        if self.retry.initial_backoff > self.retry.max_backoff {
            return Err(Error::config(
                "retry.initial_backoff must not exceed retry.max_backoff",
            ));
        }

        let mut backends = self.backends;
        // Embedded defaults: no backend configured means a local-directory backend and, unless
        // `bucket_root` says otherwise (`""`: none), a directory for the buckets CreateBucket makes.
        let embedded = backends.is_empty();
        if backends.is_empty() {
            let objects = data_dir.join("objects");
            backends.push(BackendSection {
                name: "default".into(),
                url: format!("file://{}", objects.display()),
                options: BackendOptions::default(),
            });
        }
        let mut names = std::collections::HashSet::new();
        for b in &backends {
            let valid = !b.name.is_empty()
                && b.name.len() <= 63
                && b.name
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-');
            if !valid {
                return Err(Error::config(format!(
                    "backends: name {:?} must be 1-63 characters of a-z, 0-9 and '-'",
                    b.name
                )));
            }
            if !names.insert(b.name.clone()) {
                return Err(Error::config(format!(
                    "backends: the name {:?} is used twice",
                    b.name
                )));
            }
            let scheme = b.url.split("://").next().unwrap_or_default();
            if !b.url.contains("://")
                || !["s3", "s3a", "file", "memory", "gs", "az", "azure"].contains(&scheme)
            {
                return Err(Error::config(format!(
                    "backends.{}: url {:?} must start with s3://, file://, memory://, gs:// or az://",
                    b.name, b.url
                )));
            }
        }
        let bucket_root = match self.gateway.bucket_root.as_deref().map(str::trim) {
            None if embedded => Some((
                format!("file://{}", data_dir.join("buckets").display()),
                BackendOptions::default(),
            )),
            None | Some("") => None,
            Some(u) => {
                let scheme = u.split("://").next().unwrap_or_default();
                if !u.contains("://")
                    || !["s3", "s3a", "file", "gs", "az", "azure"].contains(&scheme)
                {
                    return Err(Error::config(format!(
                        "gateway.bucket_root = {u:?}: must start with file://, s3://, gs:// or az://"
                    )));
                }
                Some((
                    u.trim_end_matches('/').to_string(),
                    self.gateway.bucket_root_options.clone(),
                ))
            }
        };
        if let Some((root, root_options)) = &bucket_root {
            for b in &backends {
                if stores_overlap(root, root_options, &b.url, &b.options) {
                    return Err(Error::config(format!(
                        "gateway.bucket_root = {root:?} overlaps backend {:?} ({}): created buckets would \
                         be reachable by that backend's name and outside their owners' rule",
                        b.name, b.url
                    )));
                }
            }
        }
        let s3_listen = if self.gateway.enabled {
            let l = self
                .gateway
                .listen
                .clone()
                .unwrap_or_else(|| "127.0.0.1:9000".into());
            Some(l.parse::<SocketAddr>().map_err(|_| {
                Error::config(format!(
                    "gateway.listen = {l:?}: expected an address like 127.0.0.1:9000"
                ))
            })?)
        } else {
            None
        };
        if self.gateway.region.is_empty()
            || !self
                .gateway
                .region
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err(Error::config(format!(
                "gateway.region = {:?}: expected a region name like us-east-1",
                self.gateway.region
            )));
        }
        let c = &self.catalog;
        if c.sample_interval_secs == 0
            || !(c.forecast_alert_days.is_finite() && c.forecast_alert_days >= 0.0)
            || c.forecast_window_days == 0
            || c.reservation_ttl_secs <= 0
            || c.trash_grace_secs < 0
        {
            return Err(Error::config(
                "[catalog]: sample_interval_secs, forecast_window_days and reservation_ttl_secs must be positive, \
                 forecast_alert_days and trash_grace_secs not negative",
            ));
        }
        let catalog_url = match &c.url {
            Some(u) if !u.trim().is_empty() => u.trim().to_string(),
            _ => format!("sqlite://{}", data_dir.join("catalog.db").display()),
        };
        let cluster_secret = match (&o.cluster_secret, &self.cluster.secret_file) {
            (Some(s), _) if !s.is_empty() => Some(s.clone()),
            (_, Some(f)) => {
                let text = std::fs::read_to_string(f).map_err(|e| {
                    Error::from_io(e, format!("cluster.secret_file {}", f.display()))
                        .context("config")
                })?;
                Some(text.trim().to_string())
            }
            _ => None,
        };
        if cluster_secret.as_ref().is_some_and(|s| s.len() < 16) {
            return Err(Error::config(
                "the cluster secret must be at least 16 characters",
            ));
        }
        let peers = self
            .cluster
            .peers
            .iter()
            .map(|p| normalize_peer(p))
            .collect::<Result<Vec<_>>>()?;
        let sharing = Sharing::resolve(
            &self.cluster,
            &peers,
            api_listen,
            cluster_secret.is_some(),
            &catalog_url,
        )?;
        let mut s3_keys = self.gateway.keys.clone();
        if let Some((ak, sk)) = &o.root_key {
            if ak.is_empty() || sk.is_empty() {
                return Err(Error::config(
                    "STRATA_ACCESS_KEY and STRATA_SECRET_KEY must not be empty",
                ));
            }
            s3_keys.push(AccessKey {
                access_key: ak.clone(),
                secret_key: sk.clone(),
                principal: Some("root".into()),
                team: None,
                job: None,
            });
        }
        if let Some(m) = self.claims.mounter.as_ref().filter(|m| !m.is_absolute()) {
            return Err(Error::config(format!(
                "[claims] mounter: {}: the mounter's socket must be an absolute path",
                m.display()
            )));
        }
        let analytics = self.analytics.resolve()?;
        let analytics_dir = match &self.analytics.dir {
            Some(d) if d.is_absolute() => d.clone(),
            Some(d) => data_dir.join(d),
            None => data_dir.join("analytics"),
        };
        Ok(Resolved {
            analytics,
            analytics_dir,
            analytics_flush: std::time::Duration::from_secs(self.analytics.flush_secs),
            analytics_fleet: (self.analytics.fleet_retention_days > 0).then(|| {
                std::time::Duration::from_secs(self.analytics.fleet_retention_days * 86_400)
            }),
            mounter: self.claims.mounter.clone(),
            catalog_key: o.catalog_key.clone().filter(|k| !k.trim().is_empty()),
            peers,
            cluster_secret,
            sharing,
            membership: None,
            catalog_url,
            catalog: self.catalog.clone(),
            s3_listen,
            s3_region: self.gateway.region.clone(),
            bucket_root,
            s3_keys,
            admin_token: o.admin_token.clone().filter(|t| !t.is_empty()),
            data_dir,
            api_listen,
            cache,
            retry: self.retry,
            s3_defaults: self.s3_defaults,
            backends,
        })
    }
}

/// Whether two store URLs reach the same data, one inside the other: local directories by path, S3 stores
/// by endpoint, bucket and prefix, whatever their spelling.
fn stores_overlap(a: &str, ao: &BackendOptions, b: &str, bo: &BackendOptions) -> bool {
    use strata_object::{Relation, StoreLocation};
    let under = |x: &str, y: &str| x == y || x.strip_prefix(y).is_some_and(|r| r.starts_with('/'));
    if let (Some(x), Some(y)) = (a.strip_prefix("file://"), b.strip_prefix("file://")) {
        let (x, y) = (x.trim_end_matches('/'), y.trim_end_matches('/'));
        return under(x, y) || under(y, x);
    }
    match (
        StoreLocation::of_s3_url(a, ao),
        StoreLocation::of_s3_url(b, bo),
    ) {
        (Some(x), Some(y)) => x.against(&y) != Relation::Apart || y.against(&x) != Relation::Apart,
        _ => false,
    }
}

fn round_down(v: u64, unit: u64) -> u64 {
    v / unit * unit
}

fn absolute(p: PathBuf) -> Result<PathBuf> {
    if p.as_os_str().is_empty() {
        return Err(Error::config("an empty path is not a valid directory"));
    }
    std::path::absolute(&p).map_err(|e| Error::from_io(e, format!("resolving {}", p.display())))
}

/// Total memory from /proc/meminfo.
fn total_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The space of the file system holding `dir`, or its nearest existing ancestor.
fn fs_space(dir: &Path) -> Option<strata_types::FsSpace> {
    let mut p = dir.to_path_buf();
    while !p.exists() {
        p = p.parent()?.to_path_buf();
    }
    crate::sys::statvfs(&p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_config_resolves_to_embedded_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let r = Config::default()
            .resolve(&Overrides {
                data_dir: Some(dir.path().join("d")),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(r.api_listen.to_string(), "127.0.0.1:7070");
        assert_eq!(r.backends.len(), 1);
        assert_eq!(r.backends[0].name, "default");
        assert!(r.backends[0].url.starts_with("file:///"));
        assert!(r.cache.ram_capacity.bytes() >= 64 << 20);
        assert!(r.cache.disk.as_ref().unwrap().capacity.bytes() >= 8 << 20);
        assert_eq!(
            r.cache.disk.as_ref().unwrap().dir,
            dir.path().join("d/cache")
        );
        // The agent's cache defaults are the cache crate's: everything but the machine-sized capacities comes
        // from one place.
        let want = CacheConfig {
            ram_capacity: r.cache.ram_capacity,
            disk: r.cache.disk.clone(),
            ..CacheConfig::new(ByteSize(0), None)
        };
        assert_eq!(r.cache, want);
        assert_eq!(
            r.cache.metadata_ttl_ms,
            strata_cache::DEFAULT_METADATA_TTL_MS
        );
    }

    #[test]
    fn the_environment_reaches_the_agent_only_through_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let r = Config::default()
            .resolve(&Overrides {
                data_dir: Some(dir.path().join("d")),
                admin_token: Some("admin-token-from-env".into()),
                root_key: Some(("rootkey".into(), "rootsecret-123".into())),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(r.admin_token.as_deref(), Some("admin-token-from-env"));
        let root = r
            .s3_keys
            .iter()
            .find(|k| k.access_key == "rootkey")
            .unwrap();
        assert_eq!(root.principal.as_deref(), Some("root"));
        let e = Config::default()
            .resolve(&Overrides {
                data_dir: Some(dir.path().join("d")),
                root_key: Some(("rootkey".into(), String::new())),
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.message().contains("STRATA_SECRET_KEY"), "{e}");
    }

    #[test]
    fn bad_configs_are_clear_errors() {
        let cases = [
            ("cache = 3", "invalid type"),
            ("[cache]\nram_capacity = \"lots\"", "invalid byte size"),
            ("[cache]\nram_capacity = 0", "ram_capacity"),
            ("[cache]\ndisk_capacity = 0", "disk_capacity"),
            (
                "[cache]\ndisk_capacity = \"1000000TiB\"",
                "larger than the file system",
            ),
            ("[cache]\nblock_size = \"1KiB\"", "block_size"),
            ("[cache]\npolicy = \"random\"", "unknown variant"),
            ("[api]\nlisten = \"nowhere\"", "api.listen"),
            ("surprise = 1", "unknown field"),
            (
                "[[backends]]\nname = \"Bad Name\"\nurl = \"memory://\"",
                "must be 1-63",
            ),
            (
                "[[backends]]\nname = \"a\"\nurl = \"ftp://x\"",
                "must start with",
            ),
            (
                "[[backends]]\nname = \"a\"\nurl = \"memory://\"\n[[backends]]\nname = \"a\"\nurl = \"memory://\"",
                "used twice",
            ),
            ("[retry]\nmax_retries = 100", "max_retries"),
            ("[gateway]\nlisten = \"everywhere\"", "gateway.listen"),
            ("[gateway]\nregion = \"\"", "gateway.region"),
        ];
        let dir = tempfile::tempdir().unwrap();
        let o = Overrides {
            data_dir: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        for (text, want) in cases {
            let e = Config::from_toml(text, "test.toml")
                .and_then(|c| c.resolve(&o))
                .unwrap_err();
            assert!(e.message().contains(want), "{text:?}: {e}");
            assert_eq!(e.kind(), strata_types::ErrorKind::Config, "{text:?}");
        }
    }

    #[test]
    fn full_config_parses() {
        let text = r#"
            data_dir = "/tmp/strata-x"
            [api]
            listen = "127.0.0.1:0"
            [cache]
            block_size = "4MiB"
            ram_capacity = "256MiB"
            disk_capacity = "1GiB"
            policy = "lru"
            [retry]
            max_retries = 2
            initial_backoff = 10
            max_backoff = 100
            [[backends]]
            name = "datasets"
            url = "s3://bucket/prefix"
            [backends.options]
            endpoint = "http://127.0.0.1:9000"
            region = "us-east-1"
        "#;
        let r = Config::from_toml(text, "t")
            .unwrap()
            .resolve(&Overrides::default())
            .unwrap();
        assert_eq!(r.cache.block_size, ByteSize::mib(4));
        assert_eq!(r.cache.policy, PolicyKind::Lru);
        assert_eq!(
            r.backends[0].options.endpoint.as_deref(),
            Some("http://127.0.0.1:9000")
        );
        assert_eq!(r.retry.max_retries, 2);
    }
}
