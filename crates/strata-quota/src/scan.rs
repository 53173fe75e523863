//! Parallel usage scan of a POSIX directory tree: totals, per owner (uid) and per project (a directory a fixed
//! number of levels below the root), the way a parallel file system's quota accounting reports them.
//!
//! The byte count matches `du -s -B1`: allocated blocks (`st_blocks * 512`) of every entry, directories and the
//! root included, symlinks counted as themselves and never followed, and files with several hard links counted
//! once (deduplicated by `(st_dev, st_ino)` when `st_nlink > 1`).
//!
//! # How it walks
//!
//! Worker threads share one stack of directories still to read, guarded by a mutex and a condition variable.
//! A worker pops a directory, reads it (`read_dir`, then one `fstatat(2)` per entry relative to the open
//! directory, through [`DirEntry::metadata`](std::fs::DirEntry::metadata), which does not follow symlinks),
//! accumulates into its own counters, and pushes the subdirectories it found in one lock acquisition. The walk
//! ends when the stack is empty and every worker waits for work. Counters are merged once at the end, so the
//! lock is taken per directory, never per file. Memory holds only the directories waiting to be read (not every
//! path) plus the `(dev, ino)` of hard-linked files, so it stays small for millions of files.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{self, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use serde::Serialize;
use strata_types::{Error, Result};

/// How many error messages a report keeps; the rest are only counted in [`ScanReport::errors_total`].
pub const MAX_ERRORS: usize = 100;

/// The project key for entries that are not inside any project directory (the root itself, and entries less
/// than [`ScanOptions::project_depth`] levels below it or not under a directory at that depth).
pub const NO_PROJECT: &str = ".";

/// Number of shards of the hard-link set (a power of two).
const LINK_SHARDS: usize = 16;

/// Options of [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanOptions {
    /// Worker threads; 0 uses [`std::thread::available_parallelism`].
    pub threads: usize,
    /// Stay on the root's file system (like `du -x`): entries on another device are neither counted nor
    /// descended into.
    pub one_file_system: bool,
    /// How many path components below the root name a project: 1 makes every top-level directory a project,
    /// 2 every directory two levels down (keyed `"a/b"`). With 0, everything is under [`NO_PROJECT`].
    pub project_depth: usize,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            one_file_system: true,
            project_depth: 1,
        }
    }
}

/// Usage counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UsageTotals {
    /// Allocated bytes (`st_blocks * 512`), as `du` counts them.
    pub bytes: u64,
    /// Apparent size (`st_size`), as `du --apparent-size` counts it.
    pub apparent_bytes: u64,
    /// Apparent size of the non-directory entries only: what an object store would count.
    pub file_bytes: u64,
    /// Non-directory entries: regular files, symlinks, sockets, devices, FIFOs.
    pub files: u64,
    /// Directories, the root included.
    pub dirs: u64,
}

impl UsageTotals {
    fn add_entry(&mut self, md: &Metadata) {
        self.bytes += md.blocks() * 512;
        self.apparent_bytes += md.size();
        if md.is_dir() {
            self.dirs += 1;
        } else {
            self.files += 1;
            self.file_bytes += md.size();
        }
    }

    fn merge(&mut self, other: &UsageTotals) {
        self.bytes += other.bytes;
        self.apparent_bytes += other.apparent_bytes;
        self.file_bytes += other.file_bytes;
        self.files += other.files;
        self.dirs += other.dirs;
    }
}

/// The result of [`scan`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScanReport {
    /// Everything under the root, the root included.
    pub total: UsageTotals,
    /// Per owner (`st_uid`).
    pub by_owner: BTreeMap<u32, UsageTotals>,
    /// Per project (see [`ScanOptions::project_depth`]); entries outside any project are under
    /// [`NO_PROJECT`]. The values add up to `total`. A file hard-linked from several projects is counted once,
    /// in whichever project the walk reached first.
    pub by_project: BTreeMap<String, UsageTotals>,
    /// The first [`MAX_ERRORS`] errors (unreadable directories, entries that vanished), as `"path: message"`.
    pub errors: Vec<String>,
    /// How many errors there were in all.
    pub errors_total: u64,
}

/// Scan the tree under `root` with `opts.threads` workers. Never follows symlinks (a symlink root is counted
/// as the link itself). Unreadable directories and entries are recorded in [`ScanReport::errors`] and skipped.
///
/// # Errors
///
/// An [`Error`] from [`Error::from_io`] (kind `NotFound`, `PermissionDenied`, `Io`, ...) when the root itself
/// cannot be stat'ed.
pub fn scan(root: &Path, opts: &ScanOptions) -> Result<ScanReport> {
    let root_md = fs::symlink_metadata(root)
        .map_err(|e| Error::from_io(e, format_args!("scanning {}", root.display())))?;
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let walk = Walk {
        root,
        root_dev: root_md.dev(),
        opts,
        links: (0..LINK_SHARDS)
            .map(|_| Mutex::new(HashSet::new()))
            .collect(),
        queue: Mutex::new(Queue {
            stack: Vec::new(),
            idle: 0,
            done: false,
        }),
        wake: Condvar::new(),
        threads,
    };

    let no_project: Arc<str> = Arc::from(NO_PROJECT);
    let mut acc = Acc::default();
    {
        let mut here = UsageTotals::default();
        walk.count(&root_md, &mut here, &mut acc);
        acc.add_project(&no_project, &here);
    }
    if !root_md.is_dir() {
        return Ok(acc.into_report());
    }
    lock(&walk.queue).stack.push(Dir {
        path: root.to_path_buf(),
        depth: 0,
        project: no_project.clone(),
    });

    let accs: Vec<Acc> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| s.spawn(|| walk.worker(&no_project)))
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    for other in accs {
        acc.merge(other);
    }
    Ok(acc.into_report())
}

/// A directory waiting to be read.
struct Dir {
    path: PathBuf,
    /// Components below the root (the root is 0).
    depth: usize,
    /// The project its entries belong to (when deeper than the project depth).
    project: Arc<str>,
}

struct Queue {
    stack: Vec<Dir>,
    /// Workers waiting for work.
    idle: usize,
    done: bool,
}

struct Walk<'a> {
    root: &'a Path,
    root_dev: u64,
    opts: &'a ScanOptions,
    links: Vec<Mutex<HashSet<(u64, u64)>>>,
    queue: Mutex<Queue>,
    wake: Condvar,
    threads: usize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking worker re-raises its panic when joined; the data is counters and a stack, still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One worker's counters.
#[derive(Default)]
struct Acc {
    total: UsageTotals,
    by_owner: HashMap<u32, UsageTotals>,
    by_project: HashMap<Arc<str>, UsageTotals>,
    errors: Vec<String>,
    errors_total: u64,
}

impl Acc {
    fn error(&mut self, path: &Path, e: &std::io::Error) {
        self.errors_total += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(format!("{}: {e}", path.display()));
        }
    }

    fn add_project(&mut self, project: &Arc<str>, t: &UsageTotals) {
        if *t != UsageTotals::default() {
            self.by_project.entry(project.clone()).or_default().merge(t);
        }
    }

    fn merge(&mut self, other: Acc) {
        self.total.merge(&other.total);
        for (uid, t) in other.by_owner {
            self.by_owner.entry(uid).or_default().merge(&t);
        }
        for (p, t) in other.by_project {
            self.by_project.entry(p).or_default().merge(&t);
        }
        self.errors_total += other.errors_total;
        let room = MAX_ERRORS.saturating_sub(self.errors.len());
        self.errors.extend(other.errors.into_iter().take(room));
    }

    fn into_report(self) -> ScanReport {
        ScanReport {
            total: self.total,
            by_owner: self.by_owner.into_iter().collect(),
            by_project: self
                .by_project
                .into_iter()
                .map(|(p, t)| (p.to_string(), t))
                .collect(),
            errors: self.errors,
            errors_total: self.errors_total,
        }
    }
}

impl Walk<'_> {
    /// Count one entry into `project_totals` (the caller's running total for the entry's project), the owner
    /// and the grand total. Returns false when it was a hard link already counted.
    fn count(&self, md: &Metadata, project_totals: &mut UsageTotals, acc: &mut Acc) -> bool {
        if !md.is_dir() && md.nlink() > 1 {
            let key = (md.dev(), md.ino());
            let shard = (md.ino() as usize) & (LINK_SHARDS - 1);
            if !lock(&self.links[shard]).insert(key) {
                return false;
            }
        }
        project_totals.add_entry(md);
        acc.total.add_entry(md);
        acc.by_owner.entry(md.uid()).or_default().add_entry(md);
        true
    }

    fn worker(&self, no_project: &Arc<str>) -> Acc {
        let mut acc = Acc::default();
        let mut found = Vec::new();
        let mut q = lock(&self.queue);
        loop {
            if let Some(dir) = q.stack.pop() {
                drop(q);
                self.read(&dir, no_project, &mut found, &mut acc);
                q = lock(&self.queue);
                // This worker takes one of the new directories itself; wake idle workers for the rest.
                let spare = found.len().saturating_sub(1);
                q.stack.append(&mut found);
                let wake = spare.min(q.idle);
                if wake > 0 && wake == q.idle {
                    self.wake.notify_all();
                } else {
                    (0..wake).for_each(|_| self.wake.notify_one());
                }
                continue;
            }
            if q.done {
                return acc;
            }
            q.idle += 1;
            if q.idle == self.threads {
                q.done = true;
                self.wake.notify_all();
                return acc;
            }
            q = self.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
            q.idle -= 1;
        }
    }

    /// Read one directory: count its entries and collect its subdirectories into `found`.
    fn read(&self, dir: &Dir, no_project: &Arc<str>, found: &mut Vec<Dir>, acc: &mut Acc) {
        let entries = match fs::read_dir(&dir.path) {
            Ok(entries) => entries,
            Err(e) => return acc.error(&dir.path, &e),
        };
        let depth = dir.depth + 1;
        let project_depth = self.opts.project_depth;
        // Entries of this directory all go to the directory's project, except a directory exactly at the
        // project depth, which starts its own.
        let inherited = if project_depth > 0 && depth > project_depth {
            dir.project.clone()
        } else {
            no_project.clone()
        };
        let mut here = UsageTotals::default();
        for entry in entries {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => {
                    acc.error(&dir.path, &e);
                    continue;
                }
            };
            let md = match entry.metadata() {
                Ok(md) => md,
                Err(e) => {
                    acc.error(&entry.path(), &e);
                    continue;
                }
            };
            if self.opts.one_file_system && md.dev() != self.root_dev {
                continue;
            }
            if md.is_dir() {
                let path = entry.path();
                let project = if project_depth > 0 && depth == project_depth {
                    let name = path
                        .strip_prefix(self.root)
                        .unwrap_or(&path)
                        .to_string_lossy();
                    let project: Arc<str> = Arc::from(name.as_ref());
                    let mut own = UsageTotals::default();
                    self.count(&md, &mut own, acc);
                    acc.add_project(&project, &own);
                    project
                } else {
                    self.count(&md, &mut here, acc);
                    inherited.clone()
                };
                found.push(Dir {
                    path,
                    depth,
                    project,
                });
            } else {
                self.count(&md, &mut here, acc);
            }
        }
        acc.add_project(&inherited, &here);
    }
}
