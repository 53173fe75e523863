//! Uploads in flight, journaled in the local tier: what the next process of a run aborts at the object store
//! when this one was killed mid-upload (or could not abort because the store was away).
//!
//! A multipart upload that is never completed or aborted keeps its parts at the store, billed and invisible,
//! until a lifecycle rule expires them. Before a rank uploads its shard of a step it writes
//! `<local>/<run>/uploads/rank-<rank>.step-<step>` holding the object key (written and synced before the
//! first byte goes out); the entry is removed once the upload completed. A restarted checkpointer
//! ([`crate::Checkpointer::finish_pending`]) aborts every incomplete upload of each key its rank journaled,
//! then removes the entry. Keys name the rank's own shard, so no other rank's upload is ever touched.
//! Uploads no journal knows of (a lost node) are the clean-up's: see `strata_object::Backend::abort_uploads`.

use std::path::{Path, PathBuf};

use strata_types::{Error, Result};

use crate::manifest::step_dir;

/// The journal of one run in one local tier.
#[derive(Debug, Clone)]
pub(crate) struct UploadJournal {
    dir: PathBuf,
}

impl UploadJournal {
    pub(crate) fn new(local_root: &Path, run: &str) -> Self {
        Self {
            dir: local_root.join(run).join("uploads"),
        }
    }

    fn entry(&self, rank: u32, step: u64) -> PathBuf {
        self.dir.join(format!("rank-{rank:05}.{}", step_dir(step)))
    }

    /// Record that `rank` starts uploading `key` for `step` (durably, before the upload starts).
    pub(crate) fn begin(&self, rank: u32, step: u64, key: &str) -> Result<()> {
        let io = |e: std::io::Error, what: &str| {
            Error::from_io(e, format!("{what} {}", self.dir.display()))
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| io(e, "creating the upload journal"))?;
        let path = self.entry(rank, step);
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(key.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| io(e, "writing the upload journal"))
    }

    /// The upload of `step` by `rank` completed (or was aborted): forget it.
    pub(crate) fn end(&self, rank: u32, step: u64) {
        let _ = std::fs::remove_file(self.entry(rank, step));
    }

    /// Every upload `rank` journaled and did not end: (step, key).
    pub(crate) fn pending(&self, rank: u32) -> Vec<(u64, String)> {
        let prefix = format!("rank-{rank:05}.");
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<(u64, String)> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let step = crate::manifest::parse_step_dir(name.strip_prefix(&prefix)?)?;
                let key = std::fs::read_to_string(e.path()).ok()?;
                Some((step, key))
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_per_rank_and_step_and_end() {
        let dir = tempfile::tempdir().unwrap();
        let j = UploadJournal::new(dir.path(), "run");
        j.begin(0, 7, "run/step-7/rank-00000.safetensors").unwrap();
        j.begin(1, 7, "run/step-7/rank-00001.safetensors").unwrap();
        j.begin(0, 9, "run/step-9/rank-00000.safetensors").unwrap();
        assert_eq!(
            j.pending(0),
            vec![
                (7, "run/step-7/rank-00000.safetensors".to_string()),
                (9, "run/step-9/rank-00000.safetensors".to_string())
            ]
        );
        j.end(0, 7);
        assert_eq!(j.pending(0).len(), 1);
        assert_eq!(j.pending(1).len(), 1);
    }
}
