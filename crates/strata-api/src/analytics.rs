//! Access analytics: the jobs running now (throughput, metadata rate, stall share, hit ratio, the runaway
//! flag), one job's profile, and heat by dataset and prefix. A principal sees the teams it may read; an
//! administrator every team.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Access, Empty, Json, NoQuery, Role, endpoint, endpoint_list};

/// How to order jobs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobSort {
    /// Data bytes a second over the last minute.
    #[default]
    Bytes,
    /// Metadata operations a second over the last minute.
    Meta,
    /// Share of the last minute spent waiting in data reads.
    Stall,
}

/// Query of `GET /v1/analytics/jobs`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobsQuery {
    /// Only this team's jobs.
    pub team: Option<String>,
    /// Order (default `bytes`, highest first).
    pub sort: Option<JobSort>,
    /// At most this many (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// Counts by operation class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ByClass {
    /// Object bytes read (GET, ranged reads).
    pub data_read: u64,
    /// Object bytes written (PUT, parts).
    pub data_write: u64,
    /// HEAD, LIST, stat, readdir, manifest reads.
    pub meta_read: u64,
    /// DELETE, copy, multipart steps, creates.
    pub meta_write: u64,
}

/// Read bytes by the tier that served them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ByTier {
    pub ram: u64,
    pub disk: u64,
    pub peer: u64,
    pub origin: u64,
}

/// A job as this agent sees it now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobSummary {
    pub team: String,
    pub job: String,
    /// First and last operation seen (unix seconds).
    pub first_seen_unix: u64,
    pub last_seen_unix: u64,
    /// Over the last minute, per second.
    pub data_bytes_per_sec: f64,
    pub meta_ops_per_sec: f64,
    pub ops_per_sec: f64,
    /// Share of the last minute the job's readers spent waiting in data reads (summed over readers).
    pub stall_share: f64,
    /// Share of read bytes over the last minute that a cache tier served, when known.
    pub hit_ratio: Option<f64>,
    /// The metadata rate has stayed over the configured rate for the configured window.
    pub runaway: bool,
    /// Since when the metadata rate has been over the rate (unix seconds), if it is.
    pub over_rate_since_unix: Option<u64>,
    /// Operations since first seen, by class.
    pub ops: ByClass,
    /// Bytes since first seen, by class.
    pub bytes: ByClass,
}

/// Latency of one class since the job was first seen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ClassLatency {
    /// `data_read`, `data_write`, `meta_read` or `meta_write`.
    pub class: String,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Ten seconds of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TimelineSlot {
    /// The slot's start (unix seconds).
    pub start_unix: u64,
    pub ops: ByClass,
    pub bytes: ByClass,
    /// Time spent waiting in data reads, seconds (summed over readers).
    pub read_seconds: f64,
    pub tiers: ByTier,
}

/// One reader's I/O stall (a rank's process), as its loader reported it to the job's claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ReaderStall {
    pub claim: String,
    /// Who reported (`host:pid`).
    pub reporter: String,
    /// Its running total of time waiting for samples, seconds.
    pub stall_secs: f64,
    /// When it last reported (unix seconds).
    pub reported_at_unix: i64,
}

/// `GET /v1/analytics/jobs/{team}/{job}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobProfile {
    pub summary: JobSummary,
    pub latency: Vec<ClassLatency>,
    /// The last five minutes in 10-second slots, oldest first (slots with nothing left out).
    pub timeline: Vec<TimelineSlot>,
    /// Stall by reader (rank), from the job's claims, most stalled first (none without a claim).
    #[serde(default)]
    pub readers: Vec<ReaderStall>,
}

/// What a heat entry is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HeatKind {
    /// A dataset (as the client named it: a claim, `x-strata-dataset`).
    Dataset,
    /// A prefix: the backend (bucket) and the key's first segments.
    Prefix,
}

/// Query of `GET /v1/analytics/heat`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeatQuery {
    /// Only this team's.
    pub team: Option<String>,
    /// Only datasets or only prefixes.
    pub kind: Option<HeatKind>,
    /// At most this many, hottest first (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// One dataset's or prefix's heat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HeatEntry {
    pub team: String,
    pub kind: HeatKind,
    pub name: String,
    /// Data reads, each worth 1 when it happened and halving every configured half-life since.
    pub score: f64,
    /// The last read (unix seconds).
    pub last_access_unix: u64,
    /// Reads and bytes read since this agent started tracking it.
    pub reads: u64,
    pub bytes: u64,
}

endpoint! {
    /// The jobs this agent serves now: throughput, metadata rate, stall share, hit ratio, runaway flag
    ListJobs = GET "/v1/analytics/jobs", Control, Access::Any, "any principal (only the teams it may read)";
    query: JobsQuery, request: Empty, response: Json<Vec<JobSummary>>
}
endpoint! {
    /// One job's profile: classes, latency, the last five minutes
    GetJobProfile = GET "/v1/analytics/jobs/{team}/{job}", Control, Access::Team(Role::Reader), "reader of the team";
    query: NoQuery, request: Empty, response: Json<JobProfile>
}
endpoint! {
    /// Datasets and prefixes by heat, hottest first
    ListHeat = GET "/v1/analytics/heat", Control, Access::Any, "any principal (only the teams it may read)";
    query: HeatQuery, request: Empty, response: Json<Vec<HeatEntry>>
}

/// Query of `GET /v1/analytics/job_stats`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobStatsQuery {
    /// Only this team's jobs.
    pub team: Option<String>,
}

endpoint! {
    /// Every visible job's counters in Lustre's job_stats form (YAML: read_bytes and write_bytes in bytes per operation, getattr for metadata reads and setattr for metadata writes in microseconds; samples, min, max, sum, sumsq since the job was first seen), for tools that read it
    JobStats = GET "/v1/analytics/job_stats", Control, Access::Any, "any principal (only the teams it may read)";
    query: JobStatsQuery, request: Empty, response: crate::Text
}

/// An operation class, as a client reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    DataRead,
    DataWrite,
    MetaRead,
    MetaWrite,
}

/// Operations of one class a client answered itself since its last report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportedOps {
    pub class: OpClass,
    /// Operations (at least 1, at most 1,000,000,000).
    pub count: u64,
    /// Of them, how many failed (`ENOENT`, ...).
    #[serde(default)]
    pub errors: u64,
    /// Bytes they moved, in all.
    #[serde(default)]
    pub bytes: u64,
    /// Time they took, in all, microseconds.
    #[serde(default)]
    pub latency_us: u64,
}

/// Body of `POST /v1/analytics/report`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpsReport {
    /// The location the operations were on (a mount's location), which the caller must be able to read.
    pub location: String,
    /// At most 16 rows.
    pub ops: Vec<ReportedOps>,
}

/// Most rows in one [`OpsReport`].
pub const MAX_REPORT_ROWS: usize = 16;

endpoint! {
    /// Report operations a client answered itself (a mount's stat, lookup and readdir, which its kernel asks it and it answers from its listing), counted to the caller's team and the `x-strata-job`/`x-strata-dataset` the request names, as the agent counts its own
    ReportOps = POST "/v1/analytics/report", Data, Access::Location(Role::Reader), "reader of the teams owning the location";
    query: NoQuery, request: Json<OpsReport>, response: Empty, status: 204
}

/// Query of `GET /v1/analytics/cold`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ColdQuery {
    /// Only this team's.
    pub team: Option<String>,
    /// Cold: nothing under the prefix used (read, else written) for this many seconds. Default the agent's
    /// `[analytics] cold_after_days`.
    pub idle_secs: Option<u64>,
    /// Key segments a prefix keeps (default the agent's `prefix_depth`, at most 16).
    pub depth: Option<u32>,
    /// At most this many, largest first (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// A prefix nothing has used for the cold window: what moving it to a colder tier would free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ColdPrefix {
    pub team: String,
    /// `backend/first/segments/`.
    pub prefix: String,
    /// Bytes and objects under it, as the inventory knows them.
    pub bytes: u64,
    pub objects: u64,
    /// The last read of anything under it, else the last write (unix seconds).
    pub last_used_unix: i64,
}

endpoint! {
    /// Cold prefixes with their sizes, largest first: nothing under them read or written for the cold window (from the inventory)
    ListCold = GET "/v1/analytics/cold", Control, Access::Any, "any principal (only the teams it may read)";
    query: ColdQuery, request: Empty, response: Json<Vec<ColdPrefix>>
}

/// What the fleet view groups by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FleetBy {
    Team,
    #[default]
    Job,
    Dataset,
    Prefix,
}

/// Query of `GET /v1/analytics/fleet`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetQuery {
    /// Group by team, job (default), dataset or prefix.
    pub by: Option<FleetBy>,
    /// Over the last this many minutes (default 15, at most 10,080: a week).
    pub minutes: Option<u32>,
    /// Only this team's.
    pub team: Option<String>,
    /// At most this many, most bytes first (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// One team's job, dataset or prefix over every agent of the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FleetLine {
    pub team: String,
    /// The job, dataset or prefix (the team when grouped by team).
    pub name: String,
    /// The agents that served it (their names).
    pub agents: Vec<String>,
    pub ops: ByClass,
    pub bytes: ByClass,
    pub errors: u64,
    /// Read bytes by the tier that served them, summed over the agents.
    pub tiers: ByTier,
    /// Time spent in data reads, seconds, summed.
    pub read_seconds: f64,
    /// The first and last minute seen (unix seconds).
    pub first_minute_unix: i64,
    pub last_minute_unix: i64,
}

endpoint! {
    /// The fleet view: every agent's rollups (shared through the catalog) by team, job, dataset or prefix over the last minutes, most bytes first
    GetFleet = GET "/v1/analytics/fleet", Control, Access::Any, "any principal (only the teams it may read)";
    query: FleetQuery, request: Empty, response: Json<Vec<FleetLine>>
}

endpoint_list!(
    ListJobs,
    GetJobProfile,
    ListHeat,
    JobStats,
    ReportOps,
    ListCold,
    GetFleet
);
