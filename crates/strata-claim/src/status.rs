//! What the agent says about a claim.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ClaimSpec;

/// Where a claim is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ClaimState {
    /// Admitted, versions pinned; staging has not started.
    Pending,
    /// Blocks are being brought into the cache.
    Staging,
    /// Every block of every staged dataset version is held; the job may start.
    Ready,
    /// Staging cannot finish; `reason` says why. Still holds its quota until released.
    Failed,
    /// Pins and scratch freed; accounting final. Nothing more happens to it.
    Released,
}

impl ClaimState {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Staging => "staging",
            Self::Ready => "ready",
            Self::Failed => "failed",
            Self::Released => "released",
        }
    }

    /// Parse a stored name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => Self::Pending,
            "staging" => Self::Staging,
            "ready" => Self::Ready,
            "failed" => Self::Failed,
            "released" => Self::Released,
            _ => return None,
        })
    }

    /// Whether the claim will not change state again by itself (only a release moves it on).
    pub fn settled(self) -> bool {
        matches!(self, Self::Ready | Self::Failed | Self::Released)
    }
}

/// Staging progress: counts of the claim's snapshot.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Progress {
    /// Objects in the staged datasets' snapshot.
    pub objects_total: u64,
    /// Objects every block of which is held.
    pub objects_done: u64,
    /// Bytes of the staged snapshot.
    pub bytes_total: u64,
    /// Bytes held.
    pub bytes_done: u64,
    /// Blocks of the staged snapshot.
    pub blocks_total: u64,
    /// Blocks found held by the last count (`ready` needs this to equal `blocks_total`).
    pub blocks_held: u64,
    /// Staging rate over the last interval, bytes per second.
    pub rate_bytes_per_sec: f64,
    /// Seconds to go at that rate, when there is one.
    pub eta_secs: Option<u64>,
    /// Of `bytes_done`, the bytes staging found already cached (shared with other claims and jobs).
    #[serde(default)]
    pub cached_bytes: u64,
}

impl Progress {
    /// `done/total (pct%)` of bytes, with the rate and ETA: what a person waiting on it reads.
    pub fn summary(&self) -> String {
        let pct = if self.bytes_total == 0 {
            100.0
        } else {
            self.bytes_done as f64 * 100.0 / self.bytes_total as f64
        };
        let mut s = format!(
            "{}/{} objects, {}/{} bytes ({pct:.1}%), {}/{} blocks",
            self.objects_done,
            self.objects_total,
            self.bytes_done,
            self.bytes_total,
            self.blocks_held,
            self.blocks_total
        );
        if self.rate_bytes_per_sec > 0.0 {
            s.push_str(&format!(
                ", {:.1} MiB/s",
                self.rate_bytes_per_sec / 1048576.0
            ));
        }
        if let Some(eta) = self.eta_secs {
            s.push_str(&format!(", ETA {eta} s"));
        }
        s
    }
}

/// One dataset of a claim, as admitted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DatasetStatus {
    /// Its name in the claim.
    pub name: String,
    /// The location as declared.
    pub location: String,
    /// How it is had: `stage`, `pin` or `stream`.
    pub mode: String,
    /// Objects in the pinned snapshot.
    pub objects: u64,
    /// Bytes in the pinned snapshot.
    pub bytes: u64,
    /// Where the job finds it as files, if declared.
    pub mount: Option<String>,
}

/// What a job did with its data, charged to its team.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct JobUsage {
    /// Bytes brought into the cache by staging.
    pub staged_bytes: u64,
    /// Bytes staging found already cached (shared with other claims and jobs).
    pub staged_cached_bytes: u64,
    /// Bytes the job's reads (its requests carrying its job id) took from the origin.
    pub origin_bytes: u64,
    /// Bytes the job's reads took from peers' caches.
    pub peer_bytes: u64,
    /// Seconds the job's loaders reported waiting for data.
    pub stall_secs: f64,
    /// Highest scratch use seen, bytes.
    pub scratch_peak_bytes: u64,
    /// Bytes under the checkpoint location written by the job.
    pub checkpoint_bytes: u64,
}

/// A claim as the agent reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ClaimStatus {
    /// The claim's id (`clm_...`).
    pub id: String,
    /// The job.
    pub job: String,
    /// The team charged.
    pub team: String,
    /// Who submitted it.
    pub principal: String,
    /// Where it is.
    pub state: ClaimState,
    /// Why it failed or was released (empty otherwise): what a person can act on.
    pub reason: String,
    /// Staging progress.
    pub progress: Progress,
    /// The datasets as admitted.
    pub datasets: Vec<DatasetStatus>,
    /// The scratch directory, when the claim has scratch.
    pub scratch_path: Option<String>,
    /// What the job's environment gets (`STRATA_CLAIM`, `STRATA_DATASET_<NAME>`, `STRATA_SCRATCH`, ...).
    pub env: BTreeMap<String, String>,
    /// The group the claim's mounts are readable by (the gid of the Unix group named like its team on the
    /// agent's node), when it has mounts: a job's processes need it among their groups to read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_gid: Option<u32>,
    /// Accounting so far (final once released).
    pub usage: JobUsage,
    /// The claim as submitted.
    pub spec: ClaimSpec,
    /// Submitted at (Unix seconds).
    pub created_at: i64,
    /// Staging must be done by (Unix seconds).
    pub deadline_at: i64,
    /// Became ready at.
    pub ready_at: Option<i64>,
    /// Last heartbeat.
    pub heartbeat_at: i64,
    /// Released at.
    pub released_at: Option<i64>,
}

/// How much of a location's current version the cache cluster holds (`GET /v1/coverage`): what a Dataset's
/// status and `strata coverage` show. Counted, never fetched: nothing is read from the origin but its listing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Coverage {
    /// The location as asked.
    pub location: String,
    /// The version listed now: the first 16 hex digits of a BLAKE3 digest of every object's key, size, ETag
    /// and version id, in key order. Equal digests, equal data.
    pub version: String,
    /// Objects in it.
    pub objects: u64,
    /// Objects every block of which is held (0 when not `complete`: a silent member may lack a block of any).
    pub objects_held: u64,
    /// Its bytes.
    pub bytes_total: u64,
    /// Bytes of the blocks held.
    pub bytes_held: u64,
    /// Its blocks (at the cache's block size).
    pub blocks_total: u64,
    /// Blocks held.
    pub blocks_held: u64,
    /// Each agent's share (the blocks it owns; everything for an agent in no cluster), this agent first.
    pub members: Vec<MemberCoverage>,
    /// Whether every member answered and their shares add up to every block: when false, the held counts are
    /// at least what is held (the silent members' shares are counted as not held).
    pub complete: bool,
}

impl Coverage {
    /// The share of the bytes held, in whole percent rounded down (100 only when every byte is held).
    pub fn percent(&self) -> u64 {
        if self.bytes_total == 0 {
            return if self.complete { 100 } else { 0 };
        }
        self.bytes_held.saturating_mul(100) / self.bytes_total
    }
}

/// One agent's share of a [`Coverage`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemberCoverage {
    /// The agent (its member id, `http://address:port`).
    pub member: String,
    /// Blocks of its share.
    pub blocks_total: u64,
    /// Of them, held.
    pub blocks_held: u64,
    /// Bytes of its share.
    pub bytes_total: u64,
    /// Of them, held.
    pub bytes_held: u64,
    /// Why it could not be counted (it did not answer, or refused), when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
