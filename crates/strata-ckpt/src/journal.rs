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
//!
//! The same start sweeps the run's step directories of temporary files (`.<name>.tmp-<pid>`) a killed
//! writer left: those untouched for [`STALE_TMP`] (a live writer keeps writing; a process id says nothing
//! across the pid namespaces of containers that share a node's disk).

use std::path::{Path, PathBuf};

use strata_types::{Error, Result};

use crate::manifest::step_dir;

/// How long a temporary file of a checkpoint write may go unmodified before it counts as a dead writer's.
pub(crate) const STALE_TMP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Remove the temporary files killed writers left in `run`'s step directories under `root` (untouched for
/// [`STALE_TMP`]); how many.
pub(crate) fn sweep_stale_tmp(root: &Path, run: &str) -> usize {
    let Ok(steps) = std::fs::read_dir(root.join(run)) else {
        return 0;
    };
    let mut removed = 0;
    for step in steps.filter_map(|e| e.ok()) {
        let is_step = step
            .file_name()
            .to_str()
            .and_then(crate::manifest::parse_step_dir)
            .is_some();
        if !is_step {
            continue;
        }
        let Ok(files) = std::fs::read_dir(step.path()) else {
            continue;
        };
        for f in files.filter_map(|e| e.ok()) {
            let name = f.file_name();
            let Some(name) = name.to_str() else { continue };
            if !(name.starts_with('.') && name.contains(".tmp-")) {
                continue;
            }
            let stale = f
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= STALE_TMP);
            if stale && std::fs::remove_file(f.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

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
    fn temporary_files_untouched_for_an_hour_are_swept_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let step = dir.path().join("run").join(step_dir(4));
        std::fs::create_dir_all(&step).unwrap();
        let old = step.join(".rank-00000.safetensors.tmp-4242");
        let fresh = step.join(".manifest.json.tmp-4343");
        let shard = step.join("rank-00000.safetensors");
        for p in [&old, &fresh, &shard] {
            std::fs::write(p, b"x").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - STALE_TMP - std::time::Duration::from_secs(5);
        for p in [&old, &shard] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        assert_eq!(sweep_stale_tmp(dir.path(), "run"), 1);
        assert!(!old.exists() && fresh.exists() && shard.exists());
    }

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
