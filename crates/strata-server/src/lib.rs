//! The Strata node agent (`strata serve`): the composition root of its capabilities.
//!
//! - [`config`]: the TOML configuration, overrides from flags and environment, validation, machine-sized
//!   defaults. A leaf: it imports none of the capabilities (they import their settings from it).
//! - [`Agent`]: owns the telemetry hub, the backends, the tiered cache and the catalog; resolves locations
//!   ([`access`]: the one access decision), and tracks the work requests leave running ([`Agent::spawn`]).
//! - The capabilities, each a module tree that registers its routes in [`routes`] and its background work in
//!   [`serve`]: [`gateway`] (S3, s3s), [`api`] (the data plane), [`cluster`] (shared cache, coherence, pins),
//!   [`claims`], [`replicas`] (checkpoint replicas, handed-over saves), [`control`] (teams, quotas, usage,
//!   lifecycle, forecasts, scratch).
//! - [`routes`]: a handler per endpoint of the contract (`strata_api`): the router; [`http`]: the plumbing
//!   every handler shares (errors, typed answers, query parsing, request context).
//! - [`serve`]: runs the agent until SIGTERM/SIGINT, then shuts down: requests drained, then every task the
//!   agent tracks, within the grace period.
//!
//! This is an edge crate: it is the only one that knows about HTTP.

pub mod access;
pub mod api;
pub mod background;
pub mod claims;
pub mod cluster;
pub mod config;
pub mod control;
mod drain;
pub mod gateway;
pub mod http;
mod locate;
mod metrics;
pub mod outage;
pub mod replicas;
pub mod routes;
mod sys;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_cache::BlockCache;
use strata_object::Backend;
use strata_telemetry::Telemetry;
use strata_types::{Error, ErrorKind, Result};

pub use config::{Config, Overrides, Resolved};

/// One configured backend.
#[derive(Debug, Clone)]
pub struct NamedBackend {
    /// Configured name.
    pub name: String,
    /// Configured URL (normalised, without a trailing slash).
    pub url: String,
    /// The open backend.
    pub backend: Backend,
}

/// The running agent's state, shared by every request handler.
#[derive(Debug)]
pub struct Agent {
    config: Resolved,
    telemetry: Arc<Telemetry>,
    cache: BlockCache,
    backends: Vec<NamedBackend>,
    adhoc: Mutex<HashMap<String, (Option<String>, Backend)>>,
    /// Configured S3 backends and an S3 bucket root, as stores ([`locate`]).
    s3_roots: Vec<locate::S3Root>,
    handoffs: replicas::Handoffs,
    catalog: strata_catalog::Catalog,
    access: control::AccessLog,
    ownership: Arc<access::Ownership>,
    cluster: Option<Arc<cluster::Cluster>>,
    catalog_members: Option<Arc<cluster::members::CatalogMembers>>,
    peer_principals: PrincipalCache,
    /// This agent's stable id (`<data-dir>/agent-id`).
    id: String,
    /// Claims being staged here, each with its cancellation (a child of `claim_stop`).
    pub(crate) claim_tasks: Mutex<HashMap<String, tokio_util::sync::CancellationToken>>,
    /// Cancelled when the agent stops: every staging task ends.
    pub(crate) claim_stop: tokio_util::sync::CancellationToken,
    /// Work a request or a resumed claim started and that outlives it (claim staging, handed-over saves,
    /// warm-ups streaming their progress, a member's share of a staging): `serve` waits for it at shutdown.
    tasks: tokio_util::task::TaskTracker,
    /// The API's address once bound (`http://host:port`).
    pub(crate) api_url: std::sync::OnceLock<String>,
    /// Every operation at the front doors, attributed and rolled up ([`strata_analytics`]).
    analytics: Arc<strata_analytics::Analytics>,
    _lock: std::fs::File,
}

/// Principals looked up for peer reads, with when.
type PrincipalCache = Mutex<HashMap<String, (std::time::Instant, strata_catalog::Principal)>>;

impl Agent {
    /// Create the data directory, take its lock, open backends, the cache and the catalog (running its
    /// migrations), and make sure an administrator exists. Must run inside Tokio.
    pub async fn start(config: Resolved) -> Result<Arc<Self>> {
        Self::start_with_clock(config, Arc::new(strata_catalog::SystemClock)).await
    }

    /// [`Agent::start`] with the clock the catalog reads (expiries, grace periods, samples): tests move a
    /// `strata_catalog::ManualClock` instead of sleeping through a TTL.
    pub async fn start_with_clock(
        config: Resolved,
        clock: Arc<dyn strata_catalog::Clock>,
    ) -> Result<Arc<Self>> {
        // Everything the agent writes (catalog, tokens, cache blocks, objects of local backends, staged
        // uploads) is its owner's alone, whatever umask it was started with: other users of a shared node
        // must not read a team's data or the catalog's secrets.
        nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
        std::fs::create_dir_all(&config.data_dir).map_err(|e| {
            Error::from_io(
                e,
                format!("creating data dir {}", config.data_dir.display()),
            )
        })?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&config.data_dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| {
                    Error::from_io(
                        e,
                        format!("making data dir {} private", config.data_dir.display()),
                    )
                })?;
        }
        let lock_path = config.data_dir.join("agent.lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| Error::from_io(e, format!("opening {}", lock_path.display())))?;
        lock.try_lock().map_err(|_| {
            Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "another strata agent is using data dir {} (lock {} is held)",
                    config.data_dir.display(),
                    lock_path.display()
                ),
            )
        })?;
        let telemetry = Telemetry::new();
        let mut backends = Vec::new();
        for b in &config.backends {
            let backend = Backend::open(&b.url, &b.options, config.retry, telemetry.clone())
                .map_err(|e| e.context(format!("backend {:?}", b.name)))?;
            backends.push(NamedBackend {
                name: b.name.clone(),
                url: b.url.trim_end_matches('/').to_string(),
                backend,
            });
        }
        let cache = BlockCache::open(config.cache.clone(), telemetry.clone())?;
        let id = agent_id(&config.data_dir)?;
        let catalog = strata_catalog::Catalog::open_with_clock(&config.catalog_url, clock)
            .await
            .map_err(|e| e.context("opening the catalog"))?
            .with_holder(&id)
            .with_key(catalog_key(&config)?)
            .await
            .map_err(|e| e.context("the catalog key"))?;
        // Writes admitted by this agent's previous run died with it: their reservations go back now, not when
        // they expire.
        let released = catalog.release_held().await?;
        if released > 0 {
            tracing::info!(
                released,
                "released the reservations of this agent's previous run"
            );
        }
        control::bootstrap_admin(&catalog, &config.data_dir, config.admin_token.as_deref()).await?;
        let (cluster, catalog_members) = match (&config.sharing, &config.cluster_secret) {
            (Some(sharing), Some(secret)) => {
                let c = &config.cache;
                let capacity = c
                    .disk
                    .as_ref()
                    .map_or(c.ram_capacity.bytes(), |d| d.capacity.bytes());
                let (membership, beats) =
                    cluster::members::source(sharing, capacity, config.membership.as_ref())?;
                if let Some(b) = &beats {
                    // Registered before serving: the others see this agent within a heartbeat.
                    if let Err(e) = b.beat(&catalog, sharing.member_ttl).await {
                        tracing::warn!(error = %e, "first cluster heartbeat failed");
                    }
                }
                let cl = Arc::new(cluster::Cluster::new(
                    sharing.clone(),
                    membership,
                    secret.clone(),
                    catalog.identity().await?,
                )?);
                cl.refresh();
                if cl.view().member(cl.me()).is_none() {
                    tracing::warn!(
                        me = cl.me(),
                        "this agent is not a member of its own cluster view; it fills no block for others"
                    );
                }
                cache.set_peers(cl.clone())?;
                // Metadata is trusted once every member has been in contact ([`cluster::coherence`]).
                cache.set_metadata_lease(Some(std::time::Instant::now()));
                tracing::info!(
                    me = cl.me(),
                    membership = ?sharing.kind,
                    members = cl.view().members().len(),
                    "sharing the cache with the cluster"
                );
                (Some(cl), beats)
            }
            _ => (None, None),
        };
        let s3_roots = locate::s3_roots(&config);
        let tasks = tokio_util::task::TaskTracker::new();
        let claim_stop = tokio_util::sync::CancellationToken::new();
        let analytics = strata_analytics::Analytics::new(config.analytics.clone());
        analytics.start(&tasks, claim_stop.clone());
        if config.analytics.enabled {
            // The jobs' bytes by tier: the cache's block lookups and the origin's reads, each with its job.
            let events = telemetry.subscribe_ops(
                65_536,
                &[strata_types::Op::CacheLookup, strata_types::Op::Get],
            );
            let names = backends
                .iter()
                .map(|b| (b.backend.id().to_string(), b.name.clone()))
                .collect();
            analytics.start_tiers(events, names, &tasks, claim_stop.clone());
            let sink = config.analytics_fleet.map(|retention| {
                Arc::new(control::CatalogSink {
                    catalog: catalog.clone(),
                    retention,
                    pruned_at: std::sync::atomic::AtomicI64::new(0),
                }) as Arc<dyn strata_analytics::MinuteSink>
            });
            analytics.start_writer(
                config.analytics_dir.clone(),
                id.clone(),
                config.analytics_flush,
                sink,
                &tasks,
                claim_stop.clone(),
            );
        }
        Ok(Arc::new(Self {
            cluster,
            catalog_members,
            peer_principals: Mutex::new(HashMap::new()),
            id,
            claim_tasks: Mutex::new(HashMap::new()),
            claim_stop,
            tasks,
            api_url: std::sync::OnceLock::new(),
            analytics,
            config,
            telemetry,
            cache,
            backends,
            adhoc: Mutex::new(HashMap::new()),
            s3_roots,
            handoffs: replicas::Handoffs::default(),
            ownership: Arc::new(access::Ownership::new(catalog.clone())),
            catalog,
            access: control::AccessLog::default(),
            _lock: lock,
        }))
    }

    /// The access analytics: every front door's operations, attributed and rolled up.
    pub fn analytics(&self) -> &Arc<strata_analytics::Analytics> {
        &self.analytics
    }

    /// The catalog: teams, principals, quotas, inventory, lifecycle.
    pub fn catalog(&self) -> &strata_catalog::Catalog {
        &self.catalog
    }

    /// Reads seen by the gateway, waiting to be written to the catalog as access times.
    pub fn access_log(&self) -> &control::AccessLog {
        &self.access
    }

    /// Configured backends by name (what the catalog, quotas and clean-up call a backend).
    pub fn backend_map(&self) -> std::collections::BTreeMap<String, Backend> {
        self.backends
            .iter()
            .map(|b| (b.name.clone(), b.backend.clone()))
            .collect()
    }

    /// This agent's stable id (`<data-dir>/agent-id`): what its reservations and claims are held by.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The resolved configuration.
    pub fn config(&self) -> &Resolved {
        &self.config
    }
    /// The cache.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }
    /// The telemetry hub.
    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.telemetry
    }
    /// Configured backends.
    pub fn backends(&self) -> &[NamedBackend] {
        &self.backends
    }

    /// Run `fut` as work of this agent that outlives the request that started it; `serve` waits for it (up to
    /// the grace period) before it stops.
    pub(crate) fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(fut)
    }

    /// Checkpoint saves handed over by training processes on this node.
    pub fn handoffs(&self) -> &replicas::Handoffs {
        &self.handoffs
    }

    /// [`Self::resolve`] `location` for `caller` and check that it holds `need` on the key (or, with `prefix`,
    /// on every key under it) as [`access`] decides: the backend, the key and the team that owns it.
    pub async fn authorize(
        &self,
        caller: &access::Caller,
        location: &str,
        need: strata_catalog::Role,
        prefix: bool,
    ) -> Result<(Backend, String, Option<String>)> {
        self.authorize_named(caller, location, need, prefix)
            .await
            .map(|(_, b, k, o)| (b, k, o))
    }

    /// [`Self::authorize`], also returning the backend's name in the catalog (its configured name, or the URL
    /// of an ad-hoc bucket): the inventory backend and quota scope of what is written there.
    pub async fn authorize_named(
        &self,
        caller: &access::Caller,
        location: &str,
        need: strata_catalog::Role,
        prefix: bool,
    ) -> Result<(String, Backend, String, Option<String>)> {
        let (name, backend, key) = self.locate(location)?;
        // A created bucket reached by URL exists only while the catalog records it: what a deleted one left
        // behind belongs to nobody and is nobody's to read.
        if let Some(n) = &name
            && !self.backends.iter().any(|b| &b.name == n)
            && !self.ownership.is_created_bucket(n).await?
        {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("{location:?} is in bucket {n:?} of the bucket root, which does not exist"),
            ));
        }
        // Ad-hoc buckets are named by their URL, which no owned prefix names.
        let name = name.unwrap_or_else(|| backend.id().to_string());
        let owner = if prefix {
            self.ownership
                .check_prefix(caller, &name, &key, need)
                .await?
        } else {
            self.ownership.check_key(caller, &name, &key, need).await?
        };
        Ok((name, backend, key, owner))
    }

    /// A directory of the agent's host as a location of a configured local-directory backend
    /// (`NAME/relative/path`, no trailing slash) and the directory's canonical path. Links are resolved first,
    /// so no link leads out of the backend. The error is the same whether the directory is outside every
    /// backend or does not exist: it tells nothing of the host's files.
    pub fn local_location(&self, dir: &std::path::Path) -> Result<(String, PathBuf)> {
        let outside = || {
            Error::new(
                ErrorKind::PermissionDenied,
                format!(
                    "{} is not a directory under a configured local-directory backend",
                    dir.display()
                ),
            )
        };
        let canon = std::fs::canonicalize(dir).map_err(|_| outside())?;
        if !canon.is_dir() {
            return Err(outside());
        }
        for b in &self.config.backends {
            let Some(root) = b.url.strip_prefix("file://") else {
                continue;
            };
            let Ok(root) = std::fs::canonicalize(root) else {
                continue;
            };
            if let Ok(rel) = canon.strip_prefix(&root) {
                let rel = rel.to_str().ok_or_else(outside)?;
                let loc = if rel.is_empty() {
                    b.name.clone()
                } else {
                    format!("{}/{rel}", b.name)
                };
                return Ok((loc, canon));
            }
        }
        Err(outside())
    }

    /// Who owns which prefix (the access decision of the gateway and the data plane).
    pub fn ownership(&self) -> &Arc<access::Ownership> {
        &self.ownership
    }

    /// The shared cache this agent is a member of, if any.
    pub fn cluster(&self) -> Option<&Arc<cluster::Cluster>> {
        self.cluster.as_ref()
    }

    /// Forget `changes` (keys or prefixes written or deleted through this agent) in its metadata cache and
    /// announce them to every member of the cluster ([`cluster::coherence`]); returns once each member has
    /// applied them, or its lease of contact has surely run out. Call before acknowledging the write.
    pub async fn announce(&self, changes: Vec<cluster::coherence::Change>) {
        for c in &changes {
            self.cache.invalidate_in(&c.backend, c.what.clone());
        }
        if let Some(cl) = &self.cluster {
            cl.coherence.announce(cl, changes).await;
        }
    }

    /// This agent's pins changed: send them to the other members at once ([`cluster::pins`]).
    pub fn pins_changed(&self) {
        if let Some(cl) = &self.cluster {
            cl.pins.changed();
        }
    }

    /// Principals looked up for peer reads.
    pub(crate) fn peer_principals(&self) -> &PrincipalCache {
        &self.peer_principals
    }
}

/// Where the agent writes the address its API actually listens on (useful with port 0).
pub fn api_addr_file(data_dir: &std::path::Path) -> PathBuf {
    data_dir.join("api.addr")
}

/// Run the agent: bind the API, serve until `shutdown` resolves, then finish in-flight requests (up to
/// `grace`), stop background work and flush the disk tier's write queue.
pub async fn serve(
    config: Resolved,
    shutdown: impl Future<Output = ()> + Send + 'static,
    grace: Duration,
) -> Result<()> {
    let agent = Agent::start(config).await?;
    let listener = tokio::net::TcpListener::bind(agent.config.api_listen)
        .await
        .map_err(|e| {
            Error::from_io(
                e,
                format!("binding the control API to {}", agent.config.api_listen),
            )
        })?;
    let addr: SocketAddr = listener
        .local_addr()
        .map_err(|e| Error::from_io(e, "reading the API address"))?;
    let _ = agent.api_url.set(format!("http://{addr}"));
    let addr_file = api_addr_file(&agent.config.data_dir);
    std::fs::write(&addr_file, format!("http://{addr}\n"))
        .map_err(|e| Error::from_io(e, format!("writing {}", addr_file.display())))?;
    let c = &agent.config.cache;
    tracing::info!(
        api = %format!("http://{addr}"),
        data_dir = %agent.config.data_dir.display(),
        ram = %c.ram_capacity,
        disk = %c.disk.as_ref().map(|d| format!("{} at {}", d.capacity, d.dir.display())).unwrap_or_else(|| "off".into()),
        block_size = %c.block_size,
        backends = %agent.backends.iter().map(|b| format!("{}={}", b.name, b.url)).collect::<Vec<_>>().join(","),
        "strata agent ready"
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let s3_addr_file = agent.config.data_dir.join("s3.addr");
    let mut gateway_task = None;
    if let Some(s3_listen) = agent.config.s3_listen {
        let (keys, source) =
            gateway::auth::resolve_keys(&agent.config.s3_keys, &agent.config.data_dir)?;
        let gw = gateway::Gateway::new(agent.clone(), keys, agent.config.s3_region.clone())?;
        let s3_listener = tokio::net::TcpListener::bind(s3_listen)
            .await
            .map_err(|e| Error::from_io(e, format!("binding the S3 gateway to {s3_listen}")))?;
        let s3_addr = s3_listener
            .local_addr()
            .map_err(|e| Error::from_io(e, "reading the gateway address"))?;
        std::fs::write(&s3_addr_file, format!("http://{s3_addr}\n"))
            .map_err(|e| Error::from_io(e, format!("writing {}", s3_addr_file.display())))?;
        match source {
            gateway::auth::KeySource::Generated(path) => tracing::info!(
                s3 = %format!("http://{s3_addr}"),
                credentials = %path.display(),
                "S3 gateway ready; access key and secret are in the credentials file"
            ),
            gateway::auth::KeySource::Configured => {
                tracing::info!(s3 = %format!("http://{s3_addr}"), "S3 gateway ready")
            }
        }
        gateway_task = Some(tokio::spawn(gateway::serve::run(
            gw,
            s3_listener,
            stop.clone(),
            grace,
        )));
    }
    let background = background::spawn_background(agent.clone(), stop.clone());
    match claims::resume(&agent).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(
            claims = n,
            "staging again the claims this agent was staging"
        ),
        Err(e) => tracing::warn!(error = %e, "resuming the staging of claims"),
    }
    let mut cluster_tasks = Vec::new();
    if let Some(c) = &agent.cluster {
        cluster_tasks.push(tokio::spawn(c.clone().watch(stop.clone())));
        cluster_tasks.push(tokio::spawn(c.coherence.clone().run(
            c.clone(),
            agent.cache().clone(),
            stop.clone(),
        )));
        cluster_tasks.push(tokio::spawn(c.pins.clone().run(
            c.clone(),
            agent.cache().clone(),
            stop.clone(),
        )));
        if let Some(m) = &agent.catalog_members {
            let s = c.sharing();
            cluster_tasks.push(tokio::spawn(m.clone().run(
                agent.catalog().clone(),
                s.heartbeat,
                s.member_ttl,
                stop.clone(),
            )));
        }
    }
    let app = routes::router(agent.clone());
    // No Nagle delay on the API's responses: a small body written after its headers (a streamed one) would
    // otherwise wait for the client's delayed ACK (measured: loader samples through `/v1/read` at 0.65x).
    // Stopping: the connections already queued are served before the listener closes ([`drain`]).
    let drained = tokio_util::sync::CancellationToken::new();
    let listener = drain::Draining {
        inner: listener,
        stop: stop.clone(),
        drained: drained.clone(),
        since: None,
    };
    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY on an API connection");
        }
    });
    let server = axum::serve(listener, app).with_graceful_shutdown(drained.cancelled_owned());
    let mut handle = tokio::spawn(async move { server.await });
    tokio::select! {
        _ = shutdown => {}
        r = &mut handle => {
            agent.cache.shutdown().await;
            return r.map_err(|e| Error::internal(format!("API server task: {e}")))?
                .map_err(|e| Error::from_io(e, "serving the control API"));
        }
    }
    tracing::info!("shutting down: finishing in-flight requests");
    stop.cancel();
    agent.claim_stop.cancel();
    if tokio::time::timeout(grace, &mut handle).await.is_err() {
        tracing::warn!(
            ?grace,
            "requests still running after the grace period; cancelling them"
        );
        agent.cache.shutdown().await;
        let _ = handle.await;
    }
    if let Some(t) = gateway_task {
        let _ = t.await;
    }
    // Staging stops at its cancellation; handed-over saves finish their durability work if they can.
    agent.tasks.close();
    if tokio::time::timeout(grace, agent.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            tasks = agent.tasks.len(),
            "work still running after the grace period (handed-over saves, staging); stopping it"
        );
    }
    let _ = background.await;
    for t in cluster_tasks {
        let _ = t.await;
    }
    agent.catalog().close().await;
    agent.cache.shutdown().await;
    let _ = std::fs::remove_file(&addr_file);
    let _ = std::fs::remove_file(&s3_addr_file);
    tracing::info!("strata agent stopped");
    Ok(())
}

/// This agent's stable id (`<data-dir>/agent-id`, made on first start): what its reservations are held by.
fn agent_id(data_dir: &std::path::Path) -> Result<String> {
    let path = data_dir.join("agent-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            let id = format!(
                "agent-{}",
                &blake3::hash(
                    format!(
                        "{}-{}-{:?}",
                        std::process::id(),
                        data_dir.display(),
                        std::time::SystemTime::now()
                    )
                    .as_bytes()
                )
                .to_hex()[..16]
            );
            std::fs::write(&path, &id)
                .map_err(|e| Error::from_io(e, format!("writing {}", path.display())))?;
            Ok(id)
        }
    }
}

/// The key the catalog's S3 secrets are sealed with: `STRATA_CATALOG_KEY`, else `<data-dir>/catalog.key`
/// (made on first start, mode 0600).
fn catalog_key(config: &config::Resolved) -> Result<strata_catalog::secrets::CatalogKey> {
    use strata_catalog::secrets::CatalogKey;
    if let Some(k) = &config.catalog_key {
        return CatalogKey::from_hex(k).map_err(|e| e.context("STRATA_CATALOG_KEY"));
    }
    let path = config.data_dir.join("catalog.key");
    match std::fs::read_to_string(&path) {
        Ok(text) => CatalogKey::from_hex(&text).map_err(|e| e.context(path.display().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let key = CatalogKey::generate()?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| Error::from_io(e, format!("creating {}", path.display())))?;
            f.write_all(format!("{}\n", key.to_hex()).as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::from_io(e, format!("writing {}", path.display())))?;
            Ok(key)
        }
        Err(e) => Err(Error::from_io(e, format!("reading {}", path.display()))),
    }
}
