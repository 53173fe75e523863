//! `strata`: run the Strata node agent and operate its cache.

mod admin;
mod cache;
mod cluster;
mod doctor;
mod mount;
mod operator;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use strata_server::config::{Config, Overrides};

/// Strata: the data layer between object storage and GPU workloads.
///
/// `strata serve` runs the node agent: a tiered block cache (RAM + local disk) in front of object storage and
/// file systems, a control API and Prometheus metrics. The other commands talk to a running agent's control
/// API.
#[derive(Debug, Parser)]
#[command(
    name = "strata",
    version,
    propagate_version = true,
    max_term_width = 110
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the node agent until SIGTERM or SIGINT.
    ///
    /// With no configuration at all it runs on embedded defaults: data dir ./.strata, a local-directory backend
    /// named `default` (<data-dir>/objects), a RAM tier of 1/8 of memory, a disk tier of 1/4 of the free space
    /// under <data-dir>/cache, and the control API on 127.0.0.1:7070. Precedence: flags, then environment, then
    /// the config file, then defaults.
    Serve(ServeArgs),
    /// Inspect and steer a running agent's cache.
    #[command(subcommand)]
    Cache(CacheCommand),
    /// The shared cache of a cluster of agents: its members, their state and share of blocks.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Check configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Check a site's setup for an integration and say what is wrong.
    #[command(subcommand)]
    Doctor(DoctorCommand),
    /// Mount a dataset version read-only as a file system (FUSE), read through the agent's cache.
    ///
    /// The location is listed once; the mount serves that version (every read pinned to the listed ETag: a
    /// changed object reads as ESTALE, never as other bytes). Returns once mounted; a holder process keeps the
    /// mount and restarts its server if it dies, without readers noticing. `umount DIR` (a user's mount:
    /// `fusermount3 -u DIR`), or SIGTERM to the holder, unmounts. Root mounts with mount(2); other users
    /// through the setuid fusermount3 (Debian's fuse3), on a directory they may write.
    Mount(mount::MountArgs),
    /// Wait until each DIR is a Strata mount (what a pod's strata-mounts init container runs).
    WaitMounts(mount::WaitArgs),
    /// Make claims' mounts for an agent, so that they outlive the agent's process and container.
    ///
    /// An agent with `[claims] mounter = SOCKET` asks this process, on that Unix socket, to run the `strata
    /// mount` of each claim's dataset: the mount's holder is then this process's, not the agent's, and a
    /// restart of the agent (on Kubernetes, of its container: the mounter is a container of its own in the
    /// agents' pod) leaves the node's mounts in place. Runs only `strata mount` of a claim's dataset; the
    /// socket is mode 0600 in a directory of mode 0700. Runs until SIGTERM or SIGINT; mounts stay after it.
    Mounter(mount::MounterArgs),
    /// One server of a mount (started by the mount's holder).
    #[command(name = "__mount-serve", hide = true)]
    MountServe {
        /// The mount's state directory.
        state: PathBuf,
    },
    /// Datasets for the streaming loader (the `strata` Python package).
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// Checkpoints written by `strata.Checkpointer`: list, inspect, verify, restore into the local tier, push
    /// to the object store, delete.
    #[command(subcommand)]
    Ckpt(CkptCommand),
    /// Claims: a job declares its datasets, checkpoint and scratch; the agent admits them against quota,
    /// pins their versions, stages them and says when they are ready; release frees them.
    Claim {
        #[command(subcommand)]
        cmd: admin::claim::ClaimCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// The Kubernetes operator: DataClaim resources reconciled into claims on the agents; the CRDs.
    #[command(subcommand)]
    Operator(operator::OperatorCommand),
    /// Teams and their members.
    Team {
        #[command(subcommand)]
        cmd: admin::team::TeamCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// API tokens and S3 access keys (principals).
    Token {
        #[command(subcommand)]
        cmd: admin::token::TokenCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Quotas per team and scope: soft limit with a grace period, hard limit, on bytes and objects.
    Quota {
        #[command(subcommand)]
        cmd: admin::quota::QuotaCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Usage by team, owned prefix, job or dataset; reconciliation of a backend; scans of POSIX trees.
    #[command(args_conflicts_with_subcommands = true)]
    Usage {
        /// Group by team, prefix, job or dataset.
        #[arg(long, default_value = "team")]
        by: String,
        #[command(subcommand)]
        sub: Option<admin::usage::UsageCommand>,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Prefix ownership: which team a prefix of a backend belongs to.
    Prefix {
        #[command(subcommand)]
        cmd: admin::prefix::PrefixCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Retention policies: ttl, stale (not read for), keep_last checkpoints.
    Policy {
        #[command(subcommand)]
        cmd: admin::policy::PolicyCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Pins and claims: data the clean-up never touches.
    Protect {
        #[command(subcommand)]
        cmd: admin::protect::ProtectCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Clean-up: plan (dry run), run (through a trash), restore, purge.
    Cleanup {
        #[command(subcommand)]
        cmd: admin::cleanup::CleanupCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Capacity forecasts: days until each volume and team quota fills, with a 95% interval.
    Forecast {
        #[command(flatten)]
        out: admin::Out,
    },
    /// The audit log of every change.
    Audit {
        /// Only this team.
        #[arg(long)]
        team: Option<String>,
        /// Most records.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[command(flatten)]
        out: admin::Out,
    },
    /// The jobs this agent serves now, refreshed like `top`: data throughput, metadata operations a second,
    /// the share of time spent waiting in reads, the cache hit ratio and the metadata-runaway flag.
    Top {
        #[command(flatten)]
        args: admin::analytics::TopArgs,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Datasets and prefixes by heat (reads, decayed with the configured half-life), hottest first, with
    /// reads, bytes read and the last read; with --cold, the prefixes nothing has used for the cold window,
    /// largest first, with their sizes: the data worth moving to a colder tier.
    Heat {
        /// Only this team's.
        #[arg(long)]
        team: Option<String>,
        /// Only `dataset` or only `prefix` entries.
        #[arg(long, conflicts_with = "cold")]
        kind: Option<String>,
        /// Most entries.
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Cold prefixes instead (from the inventory: sizes, objects, last use).
        #[arg(long)]
        cold: bool,
        /// With --cold: unused for this many seconds (default: the agent's `cold_after_days`).
        #[arg(long, value_name = "SECS", requires = "cold")]
        idle_secs: Option<u64>,
        /// With --cold: key segments a prefix keeps (default: the agent's `prefix_depth`).
        #[arg(long, value_name = "N", requires = "cold")]
        depth: Option<u32>,
        #[command(flatten)]
        out: admin::Out,
    },
    /// The fleet view: every agent's operations over the last minutes (shared through the catalog) by job,
    /// team, dataset or prefix, with bytes by the tier that served them.
    Fleet {
        #[command(flatten)]
        args: admin::analytics::FleetArgs,
        #[command(flatten)]
        out: admin::Out,
    },
    /// One job's analytics.
    Job {
        #[command(subcommand)]
        cmd: admin::analytics::JobCommand,
        #[command(flatten)]
        out: admin::Out,
    },
    /// Scratch space allocations, charged to a team's quota until released or expired.
    Scratch {
        #[command(subcommand)]
        cmd: admin::scratch::ScratchCommand,
        #[command(flatten)]
        out: admin::Out,
    },
}

#[derive(Debug, Args)]
struct TierArgs {
    /// The local tier (the directory given to the Checkpointer as local_dir).
    #[arg(long, value_name = "DIR")]
    local: Option<PathBuf>,
    /// The object store tier (`s3://bucket/prefix`; endpoint and credentials from the AWS_* environment).
    #[arg(long, value_name = "URL")]
    remote: Option<String>,
}

#[derive(Debug, Subcommand)]
enum CkptCommand {
    /// List a run's complete checkpoints (newest first) and the tiers that hold each.
    Ls {
        /// The run id.
        run: String,
        #[command(flatten)]
        tiers: TierArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a checkpoint's manifest: every rank's shard, its size and blake3.
    Show {
        /// The run id.
        run: String,
        /// The step.
        step: u64,
        #[command(flatten)]
        tiers: TierArgs,
    },
    /// Check every copy of every shard against the manifest; exits 1 if some rank has no verified copy.
    Verify {
        /// The run id.
        run: String,
        /// The step (default: every complete checkpoint).
        step: Option<u64>,
        #[command(flatten)]
        tiers: TierArgs,
    },
    /// Copy a checkpoint into the local tier from the object store (verified), so a job restores locally.
    Restore {
        /// The run id.
        run: String,
        /// The step.
        step: u64,
        #[command(flatten)]
        tiers: TierArgs,
    },
    /// Upload checkpoints committed in the local tier that the object store lacks (verified copies, manifest
    /// last): finishes the durability work of a training process that was killed before its uploads ended,
    /// e.g. from a Slurm epilog.
    Push {
        /// The run id.
        run: String,
        /// The step (default: every checkpoint committed locally and missing remotely).
        step: Option<u64>,
        #[command(flatten)]
        tiers: TierArgs,
    },
    /// Delete a checkpoint from every given tier (its manifest first).
    Rm {
        /// The run id.
        run: String,
        /// The step.
        step: u64,
        #[command(flatten)]
        tiers: TierArgs,
    },
}

#[derive(Debug, Subcommand)]
enum DatasetCommand {
    /// Write `strata-manifest.json` at a dataset's root: every shard's key, size, ETag and sample offsets.
    ///
    /// A job then starts from the manifest instead of listing (and, for WebDataset tars, reading) every shard,
    /// and a shard that changed afterwards is detected by its ETag. DATASET is `s3://bucket/prefix` (endpoint
    /// and credentials from the AWS_* environment), `file:///dir` or a local directory holding `.tar` shards
    /// or an MDS `index.json`. Rebuild the manifest whenever shards change.
    Index {
        /// The dataset root.
        dataset: String,
        /// Shards read concurrently while scanning.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
        parallelism: u16,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// TOML configuration file (see `strata config check`).
    #[arg(long, short = 'c', env = "STRATA_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Data directory: disk cache, default backend, API address file.
    #[arg(long, env = "STRATA_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Control API listen address (use port 0 to pick a free port; the address is written to
    /// <data-dir>/api.addr).
    #[arg(long, env = "STRATA_API_LISTEN", value_name = "ADDR")]
    api_listen: Option<String>,
    /// S3 gateway listen address (port 0 picks a free port, written to <data-dir>/s3.addr).
    #[arg(long, env = "STRATA_S3_LISTEN", value_name = "ADDR")]
    s3_listen: Option<String>,
    /// Catalog: `sqlite:///path/catalog.db` (default: <data-dir>/catalog.db) or `postgres://user@host/db`
    /// (shared by the agents of a cluster).
    #[arg(long, env = "STRATA_CATALOG", value_name = "URL")]
    catalog: Option<String>,
    /// The administrator's API token, shared by the agents of a cluster (from the environment; default: one
    /// generated on first start and written to <data-dir>/admin-token).
    #[arg(long, env = "STRATA_ADMIN_TOKEN", hide = true, hide_env_values = true)]
    admin_token: Option<String>,
    /// The secret the agents of a cluster authenticate to each other with (from the environment; else
    /// `[cluster] secret_file`).
    #[arg(
        long,
        env = "STRATA_CLUSTER_SECRET",
        hide = true,
        hide_env_values = true
    )]
    cluster_secret: Option<String>,
    /// The key the catalog's S3 secrets are sealed with: 64 hex digits (from the environment; default:
    /// <data-dir>/catalog.key, made on first start). Agents sharing a PostgreSQL catalog set the same one.
    #[arg(long, env = "STRATA_CATALOG_KEY", hide = true, hide_env_values = true)]
    catalog_key: Option<String>,
    /// A gateway access key of the `root` principal (with STRATA_SECRET_KEY), added to the configured keys.
    #[arg(long, env = "STRATA_ACCESS_KEY", hide = true, hide_env_values = true)]
    access_key: Option<String>,
    /// The secret of STRATA_ACCESS_KEY.
    #[arg(long, env = "STRATA_SECRET_KEY", hide = true, hide_env_values = true)]
    secret_key: Option<String>,
    /// Seconds to let in-flight requests finish after SIGTERM before cancelling them.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    shutdown_grace: u64,
}

#[derive(Debug, Args, Clone)]
struct ApiArgs {
    /// API bearer token. Default: <data-dir>/admin-token of the local agent, if readable.
    #[arg(
        long,
        env = "STRATA_TOKEN",
        value_name = "TOKEN",
        global = true,
        hide_env_values = true
    )]
    token: Option<String>,
    /// Control API of the agent. Default: the address in <data-dir>/api.addr, else http://127.0.0.1:7070.
    #[arg(long, env = "STRATA_API", value_name = "URL", global = true)]
    api: Option<String>,
    /// Data directory of the local agent (to find its API address).
    #[arg(long, env = "STRATA_DATA_DIR", value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum DoctorCommand {
    /// Slurm: the burst-buffer plugin (burst_buffer/lua) and Strata's burst_buffer.lua next to slurm.conf,
    /// the backfill scheduler stage-in needs, the script's strata binary, the agent and its token, and that
    /// jobs are submitted by users (Slurm refuses burst buffers to root). Exit 1 when a check fails.
    Slurm {
        /// Print the checks as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Members of the shared cache as the local agent sees them (address, weight, share of blocks, up or
    /// suspect), and its peer counters: origin bytes, bytes from and to peers, peer errors.
    Status {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// Show cache statistics: capacity, usage, hits and misses per tier, faults.
    Stats {
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Prefetch every object under a prefix into the cache, with a progress bar.
    ///
    /// LOCATION is `NAME/prefix` for a configured backend, a URL under one, or `s3://bucket/prefix`.
    Warm {
        /// What to prefetch.
        location: String,
        /// Blocks fetched concurrently.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
        concurrency: u16,
        /// No progress bar; print the final summary as JSON.
        #[arg(long)]
        quiet: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Pin a prefix: its cached blocks are never evicted (pinned bytes are capped). Survives restarts.
    Pin {
        /// The prefix location.
        location: String,
        /// Also prefetch the prefix now, so all of it is cached and pinned.
        #[arg(long)]
        warm: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// How much of a location's current version the cache cluster holds, per agent (counted; nothing is
    /// read but the location's listing).
    ///
    /// The version is a digest of the listing (keys, sizes, ETags): equal digests, equal data. An agent of
    /// the cluster that does not answer is named, and its share counted as not held.
    Coverage {
        /// A prefix (ending with `/`) or one object.
        location: String,
        /// Read the location as a reader of this team (what a claim of the team would read).
        #[arg(long)]
        team: Option<String>,
        /// Print the raw JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// Remove a pin.
    Unpin {
        /// The prefix location.
        location: String,
        #[command(flatten)]
        api: ApiArgs,
    },
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Validate a configuration file and print it fully resolved (defaults filled in).
    Check {
        /// The TOML file.
        file: PathBuf,
    },
}

#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc options baked into the binary. `oversize_threshold:0` keeps 8 MiB+ allocations (cache blocks, fill
/// buffers) in the normal arenas, which recycle freed memory, instead of the oversize arena, which returns it to
/// the kernel at once so that the next fill pays a page fault per 4 KiB again; freed memory goes back to the
/// kernel after a second (`dirty_decay_ms:1000`) so the agent's RSS follows its working set.
/// `cache_oblivious:false` keeps large allocations page-aligned (jemalloc otherwise offsets them by a random
/// cache line), so a cache block assembled in its own buffer is written to its block file with `O_DIRECT`
/// straight from that memory, without a copy through an aligned staging buffer. `narenas:1`: one arena, so a
/// block buffer freed on one thread is reused by the next allocation on any other; with jemalloc's default of
/// four arenas per CPU, blocks read from the disk tier on blocking threads and freed on the runtime's threads
/// left each arena holding freed 8 MiB extents until they decayed: 600-700 MiB over the RAM tier and in-flight
/// budget while serving large hot objects (peak RSS 1,806-1,863 MiB against a 1,686 MiB bound; one arena:
/// 1,466-1,511 MiB). Overrides work through the `_RJEM_MALLOC_CONF` environment variable.
#[cfg(all(target_os = "linux", not(target_env = "musl")))]
#[allow(unsafe_code)] // the symbol name is jemalloc's documented configuration hook
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8; 90] =
    b"oversize_threshold:0,dirty_decay_ms:1000,muzzy_decay_ms:0,cache_oblivious:false,narenas:1\0";

fn main() {
    let cli = Cli::parse();
    if let Command::MountServe { state } = &cli.command {
        // fuser logs each request it has no answer for; the file system answers what it serves.
        init_logging("info,fuser=error");
        mount::serve(state);
    }
    init_logging("info");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run(cli)) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}

/// Logs on stderr at `STRATA_LOG` (an `EnvFilter`), else at `default`.
fn init_logging(default: &str) {
    let level = std::env::var("STRATA_LOG").unwrap_or_else(|_| default.into());
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(level).unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Serve(a) => serve(a).await,
        Command::Config(ConfigCommand::Check { file }) => {
            let resolved = Config::load(&file)?.resolve(&Overrides::default())?;
            println!("{} is valid. Resolved:", file.display());
            println!("  data_dir        {}", resolved.data_dir.display());
            println!("  api.listen      {}", resolved.api_listen);
            println!("  catalog         {}", redact_url(&resolved.catalog_url));
            let c = &resolved.cache;
            println!("  cache.block     {}", c.block_size);
            println!("  cache.ram       {}", c.ram_capacity);
            match &c.disk {
                Some(d) => println!("  cache.disk      {} at {}", d.capacity, d.dir.display()),
                None => println!("  cache.disk      off"),
            }
            println!("  cache.policy    {:?}", c.policy);
            for b in &resolved.backends {
                println!("  backend {:<8} {}", b.name, b.url);
            }
            Ok(())
        }
        Command::Cache(c) => cache::run(c).await,
        Command::Mount(a) => mount::run(a).await,
        Command::WaitMounts(a) => mount::wait(a).await,
        Command::Mounter(a) => mount::mounter(a, shutdown_signal()).await,
        Command::MountServe { .. } => unreachable!("served before the runtime starts"),
        Command::Cluster(ClusterCommand::Status { json, api }) => cluster::status(&api, json).await,
        Command::Doctor(DoctorCommand::Slurm { json, api }) => doctor::slurm(&api, json).await,
        Command::Operator(c) => operator::run(c).await,
        Command::Team { cmd: c, out } => admin::team::run(c, out).await,
        Command::Token { cmd: c, out } => admin::token::run(c, out).await,
        Command::Quota { cmd: c, out } => admin::quota::run(c, out).await,
        Command::Usage { by, sub, out } => {
            admin::usage::sanity(&by)?;
            admin::usage::run(by, sub, out).await
        }
        Command::Prefix { cmd: c, out } => admin::prefix::run(c, out).await,
        Command::Policy { cmd: c, out } => admin::policy::run(c, out).await,
        Command::Protect { cmd: c, out } => admin::protect::run(c, out).await,
        Command::Cleanup { cmd: c, out } => admin::cleanup::run(c, out).await,
        Command::Forecast { out } => admin::forecast::run(out).await,
        Command::Audit { team, limit, out } => admin::audit::run(team, limit, out).await,
        Command::Top { args, out } => admin::analytics::top(args, out).await,
        Command::Heat {
            team,
            limit,
            cold: true,
            idle_secs,
            depth,
            out,
            ..
        } => admin::analytics::cold(team, idle_secs, depth, limit, out).await,
        Command::Heat {
            team,
            kind,
            limit,
            out,
            ..
        } => admin::analytics::heat(team, kind, limit, out).await,
        Command::Job { cmd, out } => admin::analytics::job(cmd, out).await,
        Command::Fleet { args, out } => admin::analytics::fleet(args, out).await,
        Command::Scratch { cmd: c, out } => admin::scratch::run(c, out).await,
        Command::Claim { cmd: c, out } => admin::claim::run(c, out).await,
        Command::Ckpt(c) => ckpt(c).await,
        Command::Dataset(DatasetCommand::Index {
            dataset,
            parallelism,
        }) => {
            let url = strata_loader::source::dataset_url(&dataset)?;
            let src = strata_loader::LocalSource::open(
                &url,
                &strata_loader::source::LocalCacheOptions::default(),
                strata_telemetry::Telemetry::new(),
            )?;
            let m = strata_loader::dataset::write_manifest(
                &src,
                &strata_types::IoContext::default(),
                usize::from(parallelism),
            )
            .await?;
            let samples: u64 = m.shards.iter().map(|s| s.samples).sum();
            let bytes: u64 = m.shards.iter().map(|s| s.size).sum();
            println!(
                "{url}/{}: {} shards ({:?}), {samples} samples, {bytes} bytes",
                strata_loader::MANIFEST_NAME,
                m.shards.len(),
                m.shard_format
            );
            Ok(())
        }
    }
}

async fn serve(a: ServeArgs) -> Result<()> {
    let config = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    let resolved = config.resolve(&Overrides {
        data_dir: a.data_dir,
        api_listen: a.api_listen,
        s3_listen: a.s3_listen,
        catalog: a.catalog,
        admin_token: a.admin_token,
        root_key: a.access_key.zip(a.secret_key),
        cluster_secret: a.cluster_secret,
        catalog_key: a.catalog_key,
    })?;
    let mut resolved = resolved;
    if let Some(m) = operator::kube_membership(resolved.sharing.as_ref()).await? {
        resolved.membership = Some(m);
    }
    strata_server::serve(
        resolved,
        shutdown_signal(),
        Duration::from_secs(a.shutdown_grace),
    )
    .await?;
    Ok(())
}

/// Resolves at SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
    }
}

/// A client of the agent that presents the API token: `--token`/`STRATA_TOKEN`, else the local agent's
/// `<data-dir>/admin-token`.
fn api_client(a: &ApiArgs) -> Result<strata_client::AgentClient> {
    let dir = a
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("./.strata"));
    let opts = strata_client::ClientOptions {
        token: strata_client::token::discover(a.token.clone(), Some(&dir)),
        ..Default::default()
    };
    Ok(strata_client::AgentClient::new(&api_base(a), &opts)?)
}

/// An error of the agent's wire as the CLI reports it: when the agent could not be reached at all, a hint.
fn reached(e: strata_types::Error, base: &str) -> anyhow::Error {
    if e.kind() == strata_types::ErrorKind::Unavailable && !e.message().contains("(HTTP ") {
        anyhow::anyhow!("is `strata serve` running? could not reach {base}: {e}")
    } else {
        anyhow::Error::new(e)
    }
}

/// A URL with its password replaced by `***`.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].find(':') {
            Some(c) => format!("{}***{}", &url[..s + 3 + c + 1], &url[at..]),
            None => url.to_string(),
        },
        _ => url.to_string(),
    }
}

fn api_base(a: &ApiArgs) -> String {
    if let Some(api) = &a.api {
        return api.trim_end_matches('/').to_string();
    }
    let dir = a
        .data_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from("./.strata"));
    std::fs::read_to_string(strata_server::api_addr_file(&dir))
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "http://127.0.0.1:7070".into())
}

fn human(b: u64) -> String {
    indicatif::HumanBytes(b).to_string()
}

fn ckpt_tiers(t: &TierArgs) -> Result<(Option<strata_ckpt::Tier>, Option<strata_ckpt::Tier>)> {
    let local = t.local.clone().map(strata_ckpt::Tier::Local);
    let remote = match &t.remote {
        Some(url) => Some(strata_ckpt::Tier::Remote(strata_object::Backend::open(
            url,
            &strata_object::BackendOptions::default(),
            strata_object::RetryPolicy::default(),
            strata_telemetry::Telemetry::new(),
        )?)),
        None => None,
    };
    if local.is_none() && remote.is_none() {
        anyhow::bail!("give at least one tier: --local DIR and/or --remote URL");
    }
    Ok((local, remote))
}

async fn ckpt(c: CkptCommand) -> Result<()> {
    use strata_ckpt::ops;
    let ctx = strata_types::IoContext::default();
    match c {
        CkptCommand::Ls { run, tiers, json } => {
            let (l, r) = ckpt_tiers(&tiers)?;
            let all: Vec<_> = l.into_iter().chain(r).collect();
            let listed = ops::list(&ctx, &all, &run).await?;
            if json {
                let v: Vec<_> = listed
                    .iter()
                    .map(|l| {
                        serde_json::json!({
                            "step": l.step, "world_size": l.manifest.world_size, "bytes": l.manifest.bytes(),
                            "committed_unix": l.manifest.committed_unix, "tiers": l.committed_in,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            if listed.is_empty() {
                println!("run {run}: no complete checkpoint");
                return Ok(());
            }
            println!("{:>12}  {:>5}  {:>12}  tiers", "step", "ranks", "bytes");
            for l in &listed {
                println!(
                    "{:>12}  {:>5}  {:>12}  {}",
                    l.step,
                    l.manifest.world_size,
                    l.manifest.bytes(),
                    l.committed_in.join(", ")
                );
            }
            Ok(())
        }
        CkptCommand::Show { run, step, tiers } => {
            let (l, r) = ckpt_tiers(&tiers)?;
            let all: Vec<_> = l.into_iter().chain(r).collect();
            let m = ops::list(&ctx, &all, &run)
                .await?
                .into_iter()
                .find(|l| l.step == step)
                .ok_or_else(|| {
                    anyhow::anyhow!("run {run} has no complete checkpoint at step {step}")
                })?;
            println!("{}", String::from_utf8_lossy(&m.manifest.to_json()));
            Ok(())
        }
        CkptCommand::Verify { run, step, tiers } => {
            let (l, r) = ckpt_tiers(&tiers)?;
            let all: Vec<_> = l.into_iter().chain(r).collect();
            let steps: Vec<u64> = match step {
                Some(s) => vec![s],
                None => ops::list(&ctx, &all, &run)
                    .await?
                    .iter()
                    .map(|l| l.step)
                    .collect(),
            };
            let mut bad = 0;
            for s in steps {
                let (checks, ok) = ops::verify(&ctx, &all, &run, s).await?;
                for c in &checks {
                    println!("step {s} rank {:>5} {:<40} {}", c.rank, c.tier, c.status);
                }
                if !ok {
                    bad += 1;
                    println!("step {s}: NOT restorable (a rank has no verified copy)");
                }
            }
            if bad > 0 {
                std::process::exit(1);
            }
            Ok(())
        }
        CkptCommand::Restore { run, step, tiers } => {
            let (l, r) = ckpt_tiers(&tiers)?;
            let (Some(l), Some(r)) = (l, r) else {
                anyhow::bail!("restore copies from --remote into --local: give both");
            };
            let m = ops::restore_into(&ctx, &l, &[r], &run, step).await?;
            println!(
                "run {run} step {step}: {} shards, {} bytes verified in {}",
                m.shards.len(),
                m.bytes(),
                l.describe()
            );
            Ok(())
        }
        CkptCommand::Push { run, step, tiers } => {
            let (l, r) = ckpt_tiers(&tiers)?;
            let (Some(l), Some(r)) = (l, r) else {
                anyhow::bail!("push copies from --local to --remote: give both");
            };
            strata_ckpt::manifest::validate_run_id(&run)?;
            let remote_has = r.committed(&ctx, &run).await?;
            let steps: Vec<u64> = match step {
                Some(s) => vec![s],
                None => l
                    .committed(&ctx, &run)
                    .await?
                    .into_iter()
                    .filter(|s| !remote_has.contains(s))
                    .collect(),
            };
            for s in steps {
                let m = ops::restore_into(&ctx, &r, std::slice::from_ref(&l), &run, s).await?;
                println!(
                    "run {run} step {s}: {} bytes verified in {}",
                    m.bytes(),
                    r.describe()
                );
            }
            Ok(())
        }
        CkptCommand::Rm { run, step, tiers } => {
            let (l, r) = ckpt_tiers(&tiers)?;
            strata_ckpt::manifest::validate_run_id(&run)?;
            for t in l.iter().chain(r.iter()) {
                t.delete_step(&ctx, &run, step).await?;
                println!("deleted run {run} step {step} from {}", t.describe());
            }
            Ok(())
        }
    }
}
