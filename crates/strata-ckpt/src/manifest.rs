//! Shard records and checkpoint manifests.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_types::{Error, ErrorKind, Result};

/// What one rank wrote for one checkpoint: written next to the shard (`rank-NNNNN.json`) once the shard is
/// durable, and copied into the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRecord {
    /// The rank.
    pub rank: u32,
    /// File name inside the checkpoint's directory.
    pub file: String,
    /// Size in bytes.
    pub size: u64,
    /// blake3 of the whole file, hex.
    pub blake3: String,
    /// Tensors in the shard.
    pub tensors: usize,
}

impl ShardRecord {
    /// Whether `bytes` are the shard this records: its size and its blake3.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        bytes.len() as u64 == self.size && blake3::hash(bytes).to_hex().as_str() == self.blake3
    }

    /// Parse a rank's record; its `file` must be the rank's own shard name ([`shard_file`]), so that no record
    /// can point a reader at a path outside the checkpoint.
    pub fn parse(text: &[u8], what: &str) -> Result<Self> {
        let rec: ShardRecord = serde_json::from_slice(text).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{what}: not a shard record: {e}"),
            )
        })?;
        rec.check(what)?;
        Ok(rec)
    }

    fn check(&self, what: &str) -> Result<()> {
        if self.file != shard_file(self.rank) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{what}: rank {}'s shard must be named {}",
                    self.rank,
                    shard_file(self.rank)
                ),
            ));
        }
        Ok(())
    }
}

/// A complete checkpoint: every rank's shard with its checksum. Written last and atomically; a checkpoint
/// exists in a tier exactly when its manifest does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"strata-checkpoint"`.
    pub format: String,
    /// Format version (1).
    pub version: u32,
    /// The run.
    pub run_id: String,
    /// The training step.
    pub step: u64,
    /// Ranks that saved (one shard each).
    pub world_size: u32,
    /// Seconds since the Unix epoch when committed.
    pub committed_unix: u64,
    /// One record per rank, in rank order.
    pub shards: Vec<ShardRecord>,
    /// Free-form metadata from the saver.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

impl Manifest {
    /// Parse and check a manifest read from `what`.
    pub fn parse(text: &[u8], what: &str) -> Result<Self> {
        let m: Manifest = serde_json::from_slice(text).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{what}: not a checkpoint manifest: {e}"),
            )
        })?;
        if m.format != "strata-checkpoint" || m.version != 1 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{what}: format {:?} version {}", m.format, m.version),
            ));
        }
        let ranks_ok = m.shards.len() == m.world_size as usize
            && m.shards
                .iter()
                .enumerate()
                .all(|(i, s)| s.rank as usize == i);
        if !ranks_ok {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!("{what}: shards do not cover ranks 0..{}", m.world_size),
            ));
        }
        for s in &m.shards {
            s.check(what)?;
        }
        Ok(m)
    }

    /// Serialize.
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }

    /// Total bytes of all shards.
    pub fn bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.size).sum()
    }
}

/// Directory name of a step: zero-padded so names sort by step.
pub fn step_dir(step: u64) -> String {
    format!("step-{step:020}")
}

/// The step of a directory name from [`step_dir`].
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.trim_end_matches('/').strip_prefix("step-")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// File name of a rank's shard.
pub fn shard_file(rank: u32) -> String {
    format!("rank-{rank:05}.safetensors")
}

/// File name of a rank's record.
pub fn record_file(rank: u32) -> String {
    format!("rank-{rank:05}.json")
}

/// File name of the manifest.
pub const MANIFEST: &str = "manifest.json";

/// Check a run id: it names directories and object prefixes.
pub fn validate_run_id(run: &str) -> Result<()> {
    let ok = !run.is_empty()
        && run.len() <= 128
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && !run.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid_input(format!(
            "run id {run:?}: use 1-128 letters, digits, '-', '_' or '.', not starting with '.'"
        )))
    }
}
