//! Access analytics: who reads what, how hot it is, how much metadata each job asks for and how long jobs
//! wait on I/O.
//!
//! Every front door (the S3 gateway, the data-plane API, and through them the mount, the loader and
//! checkpoints) records one [`Access`] per operation: its class ([`OpClass`]: data read or write, metadata read
//! or write), bytes, latency, the tier that served it and its outcome, attributed to the caller's team,
//! principal, job and dataset ([`strata_types::IoContext`]) and to a prefix of the key. [`Analytics::record`]
//! offers it to a bounded channel and never waits: a full channel drops it and counts it. One task folds the
//! accesses into three views, each bounded whatever the number of jobs and keys:
//!
//! - **Per-minute rollups** ([`rollup`]) per (team, job, dataset, prefix to `prefix_depth`, class): counts,
//!   errors, bytes, a latency sketch ([`sketch`]: p50/p99 within 25%), bytes by tier. At most
//!   `max_rollup_keys` rows a minute; past it an access folds into its team's `(other)` row (counted). Closed
//!   minutes wait in a bounded queue for the writer that persists them ([`Analytics::take_minutes`]).
//! - **Heat** ([`heat`]) per dataset and per prefix: a score that each successful data read raises by one and that halves every
//!   `heat_half_life`, with the last access and bytes read; at most `max_heat` entries (the coldest tenth goes
//!   when full).
//! - **Jobs** ([`jobs`]): the last five minutes in 10-second slots (operations and bytes by class, time spent
//!   in data reads, bytes by tier), latency by class, and the **runaway** flag: a metadata rate over
//!   `runaway_ops_per_sec` in every slot for `runaway_window`. At most `max_jobs` jobs (the least recently
//!   seen tenth goes when full).
//!
//! The rollups are written as hive-partitioned Parquet ([`files`], [`Analytics::start_writer`]).
//!
//! Time is the accesses' own (`Access::at`) and the `now` each view is asked for, so tests drive it.

pub mod access;
pub mod files;
pub mod heat;
pub mod jobs;
pub mod rollup;
pub mod sketch;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use access::{Access, OpClass, Served};
pub use heat::{Heat, HeatKey, HeatKind, HeatView};
pub use jobs::{JobKey, JobView, Jobs, Moments, Runaway, Slot};
pub use rollup::{Minute, OTHER, RollupKey, RollupRow, minute_of, prefix_of};

/// How often the folding tasks drain their queues.
pub const DRAIN_EVERY: Duration = Duration::from_millis(100);

/// Drain `rx` every [`DRAIN_EVERY`] into `fold`, in batches, until `cancel` (then once more) or the senders
/// are gone.
async fn drain<T: Send + 'static>(
    mut rx: mpsc::Receiver<T>,
    cancel: CancellationToken,
    mut fold: impl FnMut(&[T]) + Send + 'static,
) {
    let mut tick = tokio::time::interval(DRAIN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut batch = Vec::with_capacity(1024);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = cancel.cancelled() => true,
        };
        loop {
            match rx.try_recv() {
                Ok(v) => {
                    batch.push(v);
                    if batch.len() == 1024 {
                        fold(&batch);
                        batch.clear();
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    fold(&batch);
                    return;
                }
            }
        }
        if !batch.is_empty() {
            fold(&batch);
            batch.clear();
        }
        if last {
            return;
        }
    }
}

/// Where the writer also sends the minutes it writes: the rollups shared by the agents of a fleet (the
/// catalog). Called with the agent's name (unique per process start) and minutes that may be sent again as
/// they grow (the minute in progress): a sink replaces what it holds for the same agent, minute and key.
pub trait MinuteSink: Send + Sync + 'static {
    fn put<'a>(
        &'a self,
        agent: &'a str,
        minutes: &'a [Minute],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = strata_types::Result<()>> + Send + 'a>>;
}

/// Limits and rules.
#[derive(Debug, Clone)]
pub struct AnalyticsConfig {
    /// Record at all. Default true; off, [`Analytics::record`] does nothing and front doors skip attribution
    /// (the baseline of the overhead benchmark).
    pub enabled: bool,
    /// Key segments a prefix keeps (`bucket/a/b/` for 2). Default 2.
    pub prefix_depth: usize,
    /// Rollup rows per minute, at most. Default 20,000.
    pub max_rollup_keys: usize,
    /// Closed minutes kept for the writer, at most (older ones are dropped, counted). Default 30.
    pub max_pending_minutes: usize,
    /// Heat halves over this. Default one hour.
    pub heat_half_life: Duration,
    /// Heat entries, at most. Default 50,000.
    pub max_heat: usize,
    /// Jobs tracked, at most. Default 10,000.
    pub max_jobs: usize,
    /// The metadata rate (operations a second) over which a job may be a runaway. Default 500.
    pub runaway_ops_per_sec: f64,
    /// How long the rate must stay over it. Default 60 s.
    pub runaway_window: Duration,
    /// Accesses waiting to be folded, at most (past it they are dropped, counted). Default 65,536.
    pub queue: usize,
    /// Data nothing has used for this long is cold (the agent's cold report, from its inventory). Default
    /// 30 days.
    pub cold_after: Duration,
}

impl Default for AnalyticsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            prefix_depth: 2,
            max_rollup_keys: 20_000,
            max_pending_minutes: 30,
            heat_half_life: Duration::from_secs(3600),
            max_heat: 50_000,
            max_jobs: 10_000,
            runaway_ops_per_sec: 500.0,
            runaway_window: Duration::from_secs(60),
            queue: 65_536,
            cold_after: Duration::from_secs(30 * 86_400),
        }
    }
}

/// Counters of the analytics themselves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AnalyticsStats {
    /// Accesses folded into the views.
    pub recorded: u64,
    /// Accesses dropped because the queue was full.
    pub dropped: u64,
    /// Accesses folded into an `(other)` rollup row by the key bound.
    pub folded: u64,
    /// Closed minutes dropped before the writer took them.
    pub minutes_dropped: u64,
    pub heat_entries: u64,
    pub heat_evicted: u64,
    pub jobs: u64,
    pub jobs_evicted: u64,
    /// Parquet files written, and minutes whose write failed.
    pub files_written: u64,
    pub files_failed: u64,
    /// Minutes sent to the fleet's sink, and minutes it did not take.
    pub fleet_written: u64,
    pub fleet_failed: u64,
}

/// Teams tracked in the per-team totals, at most (past it, `(other)`).
const MAX_TEAMS: usize = 10_000;

/// Operations and bytes of one team since the agent started, by class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TeamTotals {
    pub ops: [u64; 4],
    pub bytes: [u64; 4],
}

struct State {
    current: Minute,
    teams: std::collections::HashMap<Arc<str>, TeamTotals>,
    pending: VecDeque<Minute>,
    heat: Heat,
    jobs: Jobs,
    folded: u64,
    minutes_dropped: u64,
}

/// The analytics of one agent.
pub struct Analytics {
    cfg: AnalyticsConfig,
    tx: mpsc::Sender<Access>,
    rx: Mutex<Option<mpsc::Receiver<Access>>>,
    state: Mutex<State>,
    recorded: AtomicU64,
    dropped: AtomicU64,
    files_written: AtomicU64,
    files_failed: AtomicU64,
    fleet_written: AtomicU64,
    fleet_failed: AtomicU64,
}

impl std::fmt::Debug for Analytics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Analytics").field("cfg", &self.cfg).finish()
    }
}

impl Analytics {
    pub fn new(cfg: AnalyticsConfig) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let state = State {
            current: Minute::default(),
            teams: std::collections::HashMap::new(),
            pending: VecDeque::new(),
            heat: Heat::new(cfg.heat_half_life, cfg.max_heat),
            jobs: Jobs::new(
                cfg.max_jobs,
                Runaway {
                    ops_per_sec: cfg.runaway_ops_per_sec,
                    window: cfg.runaway_window,
                },
            ),
            folded: 0,
            minutes_dropped: 0,
        };
        Arc::new(Self {
            cfg,
            tx,
            rx: Mutex::new(Some(rx)),
            state: Mutex::new(state),
            recorded: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            files_written: AtomicU64::new(0),
            files_failed: AtomicU64::new(0),
            fleet_written: AtomicU64::new(0),
            fleet_failed: AtomicU64::new(0),
        })
    }

    pub fn config(&self) -> &AnalyticsConfig {
        &self.cfg
    }

    /// Whether accesses are recorded ([`AnalyticsConfig::enabled`]): a front door asks before it spends
    /// anything on attribution.
    pub fn enabled(&self) -> bool {
        self.cfg.enabled
    }

    /// Offer one access; never waits (a full queue drops it, counted).
    pub fn record(&self, a: Access) {
        if !self.cfg.enabled {
            return;
        }
        if self.tx.try_send(a).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Fold the queued accesses every [`DRAIN_EVERY`], until `cancel`; a task of `tasks`. Once only.
    ///
    /// The task drains the queue on a timer instead of waiting on it: a sender then only pushes into the
    /// queue and never wakes a task, which on a hot path costs more than the push (measured: a waiting
    /// consumer added 13 µs to a hot 16 KiB GET's 52 µs).
    pub fn start(self: &Arc<Self>, tasks: &TaskTracker, cancel: CancellationToken) {
        let Some(rx) = self.rx.lock().take() else {
            return;
        };
        let me = self.clone();
        tasks.spawn(drain(rx, cancel, move |batch| me.apply_all(batch)));
    }

    /// Fold the I/O events of `rx` into the jobs' bytes by tier until `cancel`: block lookups served by RAM,
    /// disk or a peer, and reads from the origin, each attributed to the job of the read that caused it
    /// (readahead and fills carry their trigger's context). Events without a job are not kept. A task of
    /// `tasks`.
    ///
    /// The bytes go to the jobs' timelines and to the rollups' tier mix (a data-read row with no operations
    /// of its own), under the backend's configured name from `names` (events name a backend by its id).
    pub fn start_tiers(
        self: &Arc<Self>,
        rx: mpsc::Receiver<strata_types::IoEvent>,
        names: std::collections::HashMap<String, String>,
        tasks: &TaskTracker,
        cancel: CancellationToken,
    ) {
        let me = self.clone();
        tasks.spawn(drain(rx, cancel, move |batch| {
            me.apply_events(batch, &names)
        }));
    }

    /// Fold I/O events into the jobs' tiers now ([`Self::start_tiers`]'s step).
    pub fn apply_events(
        &self,
        events: &[strata_types::IoEvent],
        names: &std::collections::HashMap<String, String>,
    ) {
        use strata_types::{Op, Outcome, Tier};
        let mut st = self.state.lock();
        for e in events {
            let Some(job) = &e.ctx.job else { continue };
            let served = match (e.op, e.tier) {
                (Op::CacheLookup, Tier::Ram) => Served::Ram,
                (Op::CacheLookup, Tier::Disk) => Served::Disk,
                // A block fetched from its owner in a cluster is a read from a peer.
                (Op::CacheLookup | Op::Get, Tier::Peer) => Served::Peer,
                (Op::Get, Tier::Backend) => Served::Origin,
                _ => continue,
            };
            if e.bytes == 0 || e.outcome != Outcome::Ok {
                continue;
            }
            let key = JobKey {
                team: e.ctx.team.clone().unwrap_or_else(|| Arc::from("")),
                job: job.clone(),
            };
            st.jobs.add_tier(key, e.at, served, e.bytes);
            self.roll(&mut st, e.at);
            let backend = names
                .get(e.backend.as_ref())
                .map_or(&*e.backend, String::as_str);
            st.current.add_tier(
                &e.ctx,
                prefix_of(backend, &e.key, self.cfg.prefix_depth),
                served,
                e.bytes,
                self.cfg.max_rollup_keys.max(1),
            );
        }
    }

    /// Fold accesses now (the task's step; tests call it directly).
    pub fn apply_all(&self, accesses: &[Access]) {
        let mut st = self.state.lock();
        for a in accesses {
            self.apply(&mut st, a);
        }
        let ops: u64 = accesses.iter().map(Access::ops).sum();
        self.recorded.fetch_add(ops, Ordering::Relaxed);
    }

    /// Close the minute in progress if `at` is past it.
    fn roll(&self, st: &mut State, at: SystemTime) {
        let minute = minute_of(at);
        if minute > st.current.start {
            let closed = std::mem::replace(
                &mut st.current,
                Minute {
                    start: minute,
                    ..Minute::default()
                },
            );
            if !closed.rows.is_empty() {
                st.folded += closed.folded;
                st.pending.push_back(closed);
                while st.pending.len() > self.cfg.max_pending_minutes.max(1) {
                    st.pending.pop_front();
                    st.minutes_dropped += 1;
                }
            }
        }
    }

    fn apply(&self, st: &mut State, a: &Access) {
        self.roll(st, a.at);
        st.current
            .add(a, self.cfg.prefix_depth, self.cfg.max_rollup_keys.max(1));
        let team: Arc<str> = a.ctx.team.clone().unwrap_or_else(|| Arc::from(""));
        let slot = if st.teams.contains_key(&team) || st.teams.len() < MAX_TEAMS {
            team.clone()
        } else {
            Arc::from(OTHER)
        };
        let t = st.teams.entry(slot).or_default();
        t.ops[a.class.index()] += a.ops();
        t.bytes[a.class.index()] += a.bytes;
        // Heat is data read: a refused or failed read names a location, not data anyone read, and metadata
        // pressure is the jobs' view (a prefix listed in a loop is not data anyone wants closer).
        if a.ok && a.class == OpClass::DataRead {
            if let Some(ds) = &a.ctx.dataset {
                st.heat.touch(
                    HeatKey {
                        team: team.clone(),
                        kind: HeatKind::Dataset,
                        name: ds.clone(),
                    },
                    a.at,
                    a.ops(),
                    a.bytes,
                );
            }
            st.heat.touch(
                HeatKey {
                    team: team.clone(),
                    kind: HeatKind::Prefix,
                    name: Arc::from(prefix_of(&a.backend, &a.key, self.cfg.prefix_depth)),
                },
                a.at,
                a.ops(),
                a.bytes,
            );
        }
        if let Some(job) = &a.ctx.job {
            st.jobs.add(
                JobKey {
                    team,
                    job: job.clone(),
                },
                a,
            );
        }
    }

    /// The closed minutes not taken yet, oldest first, and with `current` the minute in progress too (a
    /// writer's last flush before the agent stops).
    pub fn take_minutes(&self, current: bool) -> Vec<Minute> {
        let mut st = self.state.lock();
        let mut out: Vec<Minute> = st.pending.drain(..).collect();
        if current && !st.current.rows.is_empty() {
            let start = st.current.start;
            let m = std::mem::replace(
                &mut st.current,
                Minute {
                    start,
                    ..Minute::default()
                },
            );
            st.folded += m.folded;
            out.push(m);
        }
        out
    }

    /// The minute in progress as it stands (a copy; it goes on), if it holds anything.
    pub fn current_minute(&self) -> Option<Minute> {
        let st = self.state.lock();
        (!st.current.rows.is_empty()).then(|| st.current.clone())
    }

    /// Write the rollups under `dir` every `every` ([`files`]): the minutes closed since the last write, and
    /// the minute in progress as it stands (rewritten in place until it closes), so a kill loses at most
    /// `every`; a last write when `cancel` fires. Files are named by `agent` and this process's start, so a
    /// restarted agent never overwrites what the last one wrote. The same minutes go to `sink` after the
    /// files, if there is one (a sink that fails loses those minutes for the fleet view only; counted). A
    /// task of `tasks`.
    pub fn start_writer(
        self: &Arc<Self>,
        dir: std::path::PathBuf,
        agent: String,
        every: Duration,
        sink: Option<Arc<dyn MinuteSink>>,
        tasks: &TaskTracker,
        cancel: CancellationToken,
    ) {
        let me = self.clone();
        let boot = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let name = format!("{agent}-{boot}");
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                let last = tokio::select! {
                    _ = tick.tick() => false,
                    _ = cancel.cancelled() => true,
                };
                let mut minutes = me.take_minutes(last);
                if !last {
                    minutes.extend(me.current_minute());
                }
                if !minutes.is_empty() {
                    let minutes = Arc::new(minutes);
                    let (dir, file, n, m) = (dir.clone(), name.clone(), minutes.len(), minutes.clone());
                    match tokio::task::spawn_blocking(move || {
                        files::write_minutes(&dir, &file, &m)
                    })
                    .await
                    {
                        Ok(Ok(paths)) => {
                            me.files_written
                                .fetch_add(paths.len() as u64, Ordering::Relaxed);
                        }
                        Ok(Err(e)) => {
                            me.files_failed.fetch_add(n as u64, Ordering::Relaxed);
                            tracing::warn!(error = %e, "analytics rollups not written");
                        }
                        Err(e) => {
                            me.files_failed.fetch_add(n as u64, Ordering::Relaxed);
                            tracing::warn!(error = %e, "analytics writer task failed");
                        }
                    }
                    if let Some(sink) = &sink {
                        match sink.put(&name, &minutes).await {
                            Ok(()) => me.fleet_written.fetch_add(n as u64, Ordering::Relaxed),
                            Err(e) => {
                                tracing::warn!(error = %e, "analytics rollups not shared with the fleet");
                                me.fleet_failed.fetch_add(n as u64, Ordering::Relaxed)
                            }
                        };
                    }
                }
                if last {
                    break;
                }
            }
        });
    }

    /// Per-team totals since the agent started (`""`: no team).
    pub fn teams(&self) -> Vec<(Arc<str>, TeamTotals)> {
        let st = self.state.lock();
        let mut v: Vec<(Arc<str>, TeamTotals)> =
            st.teams.iter().map(|(k, t)| (k.clone(), *t)).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// Jobs `keep` admits, as of `now`.
    pub fn jobs(&self, now: SystemTime, keep: impl Fn(&JobKey) -> bool) -> Vec<JobView> {
        self.state.lock().jobs.views(now, keep)
    }

    /// Heat entries `keep` admits, hottest first, as of `now`.
    pub fn heat(&self, now: SystemTime, keep: impl Fn(&HeatKey) -> bool) -> Vec<HeatView> {
        self.state.lock().heat.ranked(now, keep)
    }

    pub fn stats(&self) -> AnalyticsStats {
        let st = self.state.lock();
        AnalyticsStats {
            recorded: self.recorded.load(Ordering::Relaxed),
            dropped: self.dropped.load(Ordering::Relaxed),
            folded: st.folded + st.current.folded,
            minutes_dropped: st.minutes_dropped,
            heat_entries: st.heat.len() as u64,
            heat_evicted: st.heat.evicted,
            jobs: st.jobs.len() as u64,
            jobs_evicted: st.jobs.evicted,
            files_written: self.files_written.load(Ordering::Relaxed),
            files_failed: self.files_failed.load(Ordering::Relaxed),
            fleet_written: self.fleet_written.load(Ordering::Relaxed),
            fleet_failed: self.fleet_failed.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests;
