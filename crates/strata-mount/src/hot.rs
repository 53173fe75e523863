//! Hot copies: large files a mount has read whole, kept as plain local files so that later opens are handed
//! to the kernel with FUSE passthrough ([`crate::passthrough`]) and read at local-disk speed, without the
//! server, the relay or FUSE's own read path.
//!
//! A copy is made from the chunks a sequential reader fetched anyway ([`crate::reader`]): each chunk is queued
//! once (a bounded queue, [`QUEUED`] chunks) for one writer thread, which writes it at its offset into `tmp/`;
//! a chunk offered while the queue is full is not taken (the reader offers it again with its next read of
//! it, and fills what is still missing once it reaches the file's end, [`Hot::claim_missing`]). Once every
//! chunk of the file is there the copy is renamed into place, so a copy is either complete or absent (a crash leaves only `tmp/` files, removed by the next server after
//! [`STALE_TMP`]). It is never synced (a forced write-back of every copy halved the speed of the cold read
//! that makes it, bench/RESULTS.md): its name carries this boot's id (`<digest>.b<boot>`), since until the
//! machine restarts the page cache is the truth, and copies of an earlier boot (a power loss may have torn
//! them) are removed at start. Only where the boot id cannot be read is a copy synced before it is used
//! (named `<digest>`). Bytes come only from the agent, which verified them and pinned them
//! to the listed ETag; a copy's name is a digest of the agent, the location, the key, the ETag and the size,
//! so a copy is only ever found for exactly the version it holds, by mounts of that location through that
//! agent (whose reads were authorised by the same listing). The directory is made `0700`.
//!
//! Bounded: at most [`Hot::new`]'s `budget` bytes of copies, those in progress included (room is made before a
//! copy starts: the least recently opened go first; a copy is touched on each open), never a copy that would
//! leave its file system less than a tenth free, at most [`IN_PROGRESS`] files copied at once (the oldest is
//! abandoned), files larger than [`crate::reader::WHOLE`] only (small files are one request each and hot in
//! the page cache already).
//! Copy I/O errors are logged and the copy dropped: copies are advisory, reads never fail because of them.
//!
//! Once a copy is in place, [`Hot::on_placed`]'s hook runs (the server drops the file's page cache there, if
//! no handle reads through it: the kernel would otherwise do it in the next open, one page at a time).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::reader::{CHUNK, WHOLE};
use crate::snapshot::Object;

/// Files copied at once; a further file abandons the oldest copy in progress.
pub const IN_PROGRESS: usize = 16;
/// Chunks queued for the writer at most (each keeps its chunk's buffer until it is written).
pub const QUEUED: usize = 4;
/// `tmp/` files untouched this long belong to a dead server and are removed.
pub const STALE_TMP: Duration = Duration::from_secs(600);

/// One copy being written.
#[derive(Debug)]
struct Writing {
    file: Arc<File>,
    tmp: PathBuf,
    name: String,
    size: u64,
    /// Chunks queued for the writer (or written): never queued twice.
    taken: Vec<bool>,
    /// Chunks written.
    have: Vec<bool>,
    /// Chunks not written yet.
    left: usize,
}

/// A chunk for the writer thread.
struct Job {
    ino: u64,
    file: Arc<File>,
    idx: u64,
    bytes: Bytes,
}

/// What runs once a copy is in place: the inode it is a copy of.
type Placed = Box<dyn Fn(u64) + Send + Sync>;

/// The hot copies of one mount (the directory may be shared by several mounts).
pub struct Hot {
    dir: PathBuf,
    budget: u64,
    /// The agent and location the mount reads: part of every copy's name.
    salt: String,
    writing: Mutex<VecDeque<(u64, Writing)>>,
    /// Inodes known to have a complete copy (forgotten whenever copies are evicted): offers of their
    /// chunks return at once.
    complete: Mutex<std::collections::HashSet<u64>>,
    /// The first characters of this boot's id (`/proc/sys/kernel/random/boot_id`); none: copies are synced
    /// before they are used.
    boot: Option<String>,
    /// Numbers the `tmp/` files of this server.
    seq: std::sync::atomic::AtomicU64,
    /// Bytes of copies in the directory (recounted after each new copy).
    used: Mutex<u64>,
    /// The writer thread's queue, made with the first copy; the thread ends when this is dropped.
    queue: std::sync::OnceLock<tokio::sync::mpsc::Sender<Job>>,
    placed: std::sync::OnceLock<Placed>,
    /// Bytes the writer has written into copies.
    written: std::sync::atomic::AtomicU64,
    /// When a copy was last refused for a nearly full file system in the log (at most once a minute).
    full_logged: Mutex<Option<std::time::Instant>>,
}

impl std::fmt::Debug for Hot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hot")
            .field("dir", &self.dir)
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

impl Hot {
    /// Copies in `dir` (made if missing), at most `budget` bytes, of objects under `location` read through
    /// the agent at `api`.
    pub fn new(dir: &Path, budget: u64, api: &str, location: &str) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir.join("tmp"))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let hot = Self {
            dir: dir.to_path_buf(),
            budget,
            salt: format!("{api}\n{location}"),
            writing: Mutex::new(VecDeque::new()),
            complete: Mutex::default(),
            boot: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .ok()
                .map(|b| {
                    b.trim()
                        .replace('-', "")
                        .chars()
                        .take(12)
                        .collect::<String>()
                })
                .filter(|b| b.len() == 12),
            seq: Default::default(),
            used: Mutex::new(0),
            queue: Default::default(),
            placed: Default::default(),
            written: Default::default(),
            full_logged: Mutex::new(None),
        };
        hot.remove_stale_tmp();
        hot.remove_unsynced_of_other_boots();
        hot.recount_and_evict(0);
        Ok(hot)
    }

    /// Run `hook` with the inode of each copy put in place from now on (on the writer thread).
    pub fn on_placed(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.placed.set(Box::new(hook));
    }

    /// Bytes written into copies so far (each chunk is written once).
    pub fn written(&self) -> u64 {
        self.written.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `obj` is a file copies are made of.
    pub fn wanted(&self, obj: &Object) -> bool {
        obj.size > WHOLE && obj.size <= self.budget
    }

    /// The copy's file name: a digest of everything that identifies the bytes.
    fn name(&self, obj: &Object) -> String {
        let mut h = blake3::Hasher::new();
        h.update(self.salt.as_bytes());
        h.update(b"\n");
        h.update(obj.name.as_bytes());
        h.update(b"\n");
        h.update(obj.etag.as_deref().unwrap_or("").as_bytes());
        h.update(b"\n");
        h.update(&obj.size.to_le_bytes());
        h.finalize().to_hex()[..32].to_string()
    }

    /// The complete copy of `obj`, opened for reading (and touched: recently used), if there is one. Objects
    /// without an ETag get no copies (nothing would tell two versions apart).
    pub fn open(&self, obj: &Object) -> Option<File> {
        if obj.etag.is_none() || !self.wanted(obj) {
            return None;
        }
        let name = self.name(obj);
        let (path, file) = self
            .places(&name)
            .into_iter()
            .find_map(|p| File::open(&p).ok().map(|f| (p, f)))?;
        let meta = file.metadata().ok()?;
        if !meta.is_file() || meta.len() != obj.size {
            return None;
        }
        // Least recently opened goes first: the mtime says when.
        let _ = File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(SystemTime::now()));
        Some(file)
    }

    /// Whether a copy of `size` bytes may start beside copies in progress of `pending` bytes: the budget is
    /// made room in (the least recently opened copies go), and the file system keeps a tenth free (the agent's
    /// cache may share it), a tenth as `df` counts it ([`strata_types::FsSpace`]).
    fn room_for(&self, size: u64, pending: u64) -> bool {
        if size.saturating_add(pending) > self.budget {
            return false;
        }
        if let Ok(st) = rustix::fs::statvfs(&self.dir) {
            let space = strata_types::FsSpace::from_blocks(
                st.f_blocks,
                st.f_bfree,
                st.f_bavail,
                st.f_frsize,
            );
            if !space.keeps_a_tenth_free(size.saturating_add(pending)) {
                let mut last = self.full_logged.lock();
                if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    *last = Some(std::time::Instant::now());
                    tracing::info!(
                        dir = %self.dir.display(),
                        available = space.available,
                        size,
                        "no hot copy: it would leave the file system of --hot-dir less than a tenth free \
                         (logged once a minute)"
                    );
                }
                return false;
            }
        }
        if *self.used.lock() + size + pending > self.budget {
            self.recount_and_evict(size + pending);
        }
        true
    }

    /// Whether a complete copy of `obj` is in place (not touched).
    pub fn exists(&self, obj: &Object) -> bool {
        self.places(&self.name(obj))
            .iter()
            .any(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.len() == obj.size))
    }

    /// Where the copy named `name` may be: synced, or placed in this boot and not synced yet.
    fn places(&self, name: &str) -> Vec<PathBuf> {
        let mut v = vec![self.dir.join(name)];
        if let Some(b) = &self.boot {
            v.push(self.dir.join(format!("{name}.b{b}")));
        }
        v
    }

    /// Chunk `idx` of `obj` (inode `ino`), as the agent answered it: queued for the copy in progress (started
    /// here if there is none), unless it was queued before or the queue is full (it is offered again).
    pub fn offer(self: &Arc<Self>, ino: u64, obj: &Object, idx: u64, bytes: Bytes) {
        let Some(file) = self.take(ino, obj, idx, &bytes) else {
            return;
        };
        let job = Job {
            ino,
            file,
            idx,
            bytes,
        };
        if let Err(e) = self.writer().try_send(job) {
            let job = e.into_inner();
            self.untake(ino, &job.file, idx);
        }
    }

    /// Chunk `idx` of `obj`, claimed with [`Hot::claim_missing`] and fetched: queued for the copy in
    /// progress, waiting for room in the queue.
    pub async fn fill(self: &Arc<Self>, ino: u64, obj: &Object, idx: u64, bytes: Bytes) {
        let expected = obj.size.min((idx + 1) * CHUNK).saturating_sub(idx * CHUNK);
        let file = self
            .writing
            .lock()
            .iter()
            .find(|(i, c)| *i == ino && c.size == obj.size)
            .filter(|(_, c)| c.taken.get(idx as usize) == Some(&true))
            .map(|(_, c)| c.file.clone());
        let Some(file) = file.filter(|_| bytes.len() as u64 == expected) else {
            self.unclaim(ino, idx);
            return;
        };
        let job = Job {
            ino,
            file,
            idx,
            bytes,
        };
        if let Err(e) = self.writer().send(job).await {
            self.untake(ino, &e.0.file, idx);
        }
    }

    /// The chunks of the copy of `ino` in progress that nobody offered: claimed (no other caller gets them),
    /// for the caller to fetch and [`Hot::fill`] (or [`Hot::unclaim`]). Empty when there is no copy in progress.
    pub fn claim_missing(&self, ino: u64) -> Vec<u64> {
        let mut w = self.writing.lock();
        let Some((_, c)) = w.iter_mut().find(|(i, _)| *i == ino) else {
            return Vec::new();
        };
        let missing: Vec<u64> = (0..c.taken.len() as u64)
            .filter(|&i| !c.taken[i as usize])
            .collect();
        for &i in &missing {
            c.taken[i as usize] = true;
        }
        missing
    }

    /// Give back chunk `idx` of the copy of `ino` that [`Hot::claim_missing`] gave (it could not be fetched).
    pub fn unclaim(&self, ino: u64, idx: u64) {
        if let Some((_, c)) = self.writing.lock().iter_mut().find(|(i, _)| *i == ino)
            && let Some(t) = c.taken.get_mut(idx as usize)
        {
            *t = false;
        }
    }

    /// Give back chunk `idx` of the copy of `ino` written into `file` (it was not queued after all).
    fn untake(&self, ino: u64, file: &Arc<File>, idx: u64) {
        if let Some((_, c)) = self
            .writing
            .lock()
            .iter_mut()
            .find(|(i, c)| *i == ino && Arc::ptr_eq(&c.file, file))
            && let Some(t) = c.taken.get_mut(idx as usize)
        {
            *t = false;
        }
    }

    /// The writer thread's queue (the thread is started by the first call).
    fn writer(self: &Arc<Self>) -> &tokio::sync::mpsc::Sender<Job> {
        self.queue.get_or_init(|| {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Job>(QUEUED);
            let hot = Arc::downgrade(self);
            let started = std::thread::Builder::new()
                .name("hot-copies".into())
                .spawn(move || {
                    while let Some(job) = rx.blocking_recv() {
                        let wrote = job.file.write_all_at(&job.bytes, job.idx * CHUNK);
                        let len = job.bytes.len() as u64;
                        drop(job.bytes); // the buffer goes back to the reader's pool now
                        let Some(hot) = hot.upgrade() else { break };
                        if wrote.is_ok() {
                            hot.written
                                .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                        }
                        hot.wrote(job.ino, &job.file, job.idx, wrote);
                    }
                });
            if let Err(e) = started {
                // No writer: every send fails and no copy is made.
                tracing::warn!(error = %e, "the hot-copy writer could not be started: no hot copies");
            }
            tx
        })
    }

    /// The file of the copy of `obj` in progress (started here if there is none) with chunk `idx` marked
    /// taken; none when the chunk is not wanted (taken before, the wrong length, a copy complete or not made).
    fn take(&self, ino: u64, obj: &Object, idx: u64, bytes: &Bytes) -> Option<Arc<File>> {
        if obj.etag.is_none() || !self.wanted(obj) {
            return None;
        }
        let chunks = obj.size.div_ceil(CHUNK) as usize;
        let expected = obj.size.min((idx + 1) * CHUNK) - idx * CHUNK;
        if idx as usize >= chunks
            || bytes.len() as u64 != expected
            || self.complete.lock().contains(&ino)
        {
            return None;
        }
        let mut w = self.writing.lock();
        if let Some((_, c)) = w.iter_mut().find(|(i, _)| *i == ino) {
            if c.taken[idx as usize] {
                return None;
            }
            c.taken[idx as usize] = true;
            return Some(c.file.clone());
        }
        let pending: u64 = w.iter().map(|(_, c)| c.size).sum();
        if !self.room_for(obj.size, pending) {
            return None;
        }
        if self.exists(obj) {
            let mut done = self.complete.lock();
            if done.len() >= 65_536 {
                done.clear();
            }
            done.insert(ino);
            return None;
        }
        let name = self.name(obj);
        // A file of its own: a copy never writes into another's, even of the same object.
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("{name}.{}.{seq}", std::process::id()));
        let file = match File::options().write(true).create_new(true).open(&tmp) {
            Ok(f) => Arc::new(f),
            Err(e) => {
                tracing::debug!(error = %e, "a hot copy could not be started");
                return None;
            }
        };
        if w.len() >= IN_PROGRESS
            && let Some((_, old)) = w.pop_front()
        {
            let _ = std::fs::remove_file(&old.tmp);
        }
        let mut taken = vec![false; chunks];
        taken[idx as usize] = true;
        w.push_back((
            ino,
            Writing {
                file: file.clone(),
                tmp,
                name,
                size: obj.size,
                taken,
                have: vec![false; chunks],
                left: chunks,
            },
        ));
        Some(file)
    }

    /// Chunk `idx` of the copy of `ino` was written (or failed): note it, and finish the copy if it was the last.
    fn wrote(&self, ino: u64, file: &Arc<File>, idx: u64, wrote: std::io::Result<()>) {
        let done = {
            let mut w = self.writing.lock();
            let Some(pos) = w
                .iter()
                .position(|(i, c)| *i == ino && Arc::ptr_eq(&c.file, file))
            else {
                return; // abandoned meanwhile
            };
            if let Err(e) = wrote {
                tracing::debug!(error = %e, "writing a hot copy failed; dropped");
                let (_, c) = w.remove(pos).expect("position is in range");
                let _ = std::fs::remove_file(&c.tmp);
                return;
            }
            let c = &mut w[pos].1;
            if !c.have[idx as usize] {
                c.have[idx as usize] = true;
                c.left -= 1;
            }
            if c.left > 0 {
                return;
            }
            // Counted complete before it leaves the list, so no offer starts another copy while this one
            // is put in place.
            self.complete.lock().insert(ino);
            w.remove(pos).expect("position is in range").1
        };
        let synced = self.dir.join(&done.name);
        let place = || -> std::io::Result<PathBuf> {
            if done.file.metadata()?.len() != done.size {
                return Err(std::io::Error::other("the copy has the wrong length"));
            }
            self.recount_and_evict(done.size);
            match &self.boot {
                // Usable now; synced below.
                Some(b) => {
                    let unsynced = self.dir.join(format!("{}.b{b}", done.name));
                    std::fs::rename(&done.tmp, &unsynced)?;
                    Ok(unsynced)
                }
                None => {
                    done.file.sync_data()?;
                    std::fs::rename(&done.tmp, &synced)?;
                    Ok(synced.clone())
                }
            }
        };
        match place() {
            Ok(_) => {
                *self.used.lock() += done.size;
                tracing::debug!(name = %done.name, size = done.size, "a hot copy is in place");
                if let Some(hook) = self.placed.get() {
                    hook(ino);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "a hot copy could not be put in place; dropped");
                let _ = std::fs::remove_file(&done.tmp);
                self.complete.lock().remove(&ino);
            }
        }
    }

    /// Count the copies' bytes and remove the least recently opened until `room` more bytes fit the budget.
    fn recount_and_evict(&self, room: u64) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                m.is_file().then(|| {
                    (
                        m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                        m.len(),
                        e.path(),
                    )
                })
            })
            .collect();
        files.sort();
        let mut used: u64 = files.iter().map(|f| f.1).sum();
        for (_, len, path) in &files {
            if used.saturating_add(room) <= self.budget {
                break;
            }
            // A copy still open (passthrough) stays readable: its inode lives until the last close.
            if std::fs::remove_file(path).is_ok() {
                used -= len;
                self.complete.lock().clear();
            }
        }
        *self.used.lock() = used;
    }

    /// Bytes of complete copies in the directory, as last counted.
    pub fn used(&self) -> u64 {
        *self.used.lock()
    }

    /// Remove copies placed before they were synced in an earlier boot (a power loss may have torn them).
    fn remove_unsynced_of_other_boots(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mine = self.boot.as_ref().map(|b| format!(".b{b}"));
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.contains(".b") && mine.as_ref().is_none_or(|m| !name.ends_with(m.as_str())) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    fn remove_stale_tmp(&self) {
        let Ok(rd) = std::fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        for e in rd.filter_map(|e| e.ok()) {
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > STALE_TMP);
            if stale {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is the failure report

    use super::*;

    fn obj(size: u64) -> Object {
        Object {
            name: "dir/big.bin".into(),
            size,
            etag: Some("\"e1\"".into()),
            mtime: 0,
        }
    }

    fn body(size: u64) -> Vec<u8> {
        (0..size).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn chunk(b: &[u8], idx: u64) -> Bytes {
        let from = (idx * CHUNK) as usize;
        let to = b.len().min(from + CHUNK as usize);
        Bytes::copy_from_slice(&b[from..to])
    }

    /// `f` holds exactly `want`.
    fn assert_holds(f: &File, want: &[u8]) {
        let mut got = vec![0u8; want.len()];
        f.read_exact_at(&mut got, 0).unwrap();
        assert!(got == want, "the copy holds other bytes");
        assert_eq!(f.metadata().unwrap().len(), want.len() as u64);
    }

    async fn complete(hot: &Hot, o: &Object) -> File {
        for _ in 0..500 {
            if let Some(f) = hot.open(o) {
                return f;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no complete copy");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_offered_again_while_a_copy_is_put_in_place_never_spoil_it() {
        let dir = tempfile::tempdir().unwrap();
        let hot = Arc::new(Hot::new(dir.path(), 1 << 30, "http://a", "b/").unwrap());
        let o = obj(2 * CHUNK + 5);
        let b = body(o.size);
        // Every chunk, then the last one again and again (a reader at the end, served from the chunk cache),
        // while the copy is synced and renamed.
        for idx in [0, 1, 2] {
            hot.offer(7, &o, idx, chunk(&b, idx));
        }
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(400) {
            hot.offer(7, &o, 2, chunk(&b, 2));
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let f = complete(&hot, &o).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_holds(&f, &b);
        assert_holds(&hot.open(&o).unwrap(), &b);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_offered_again_before_it_is_written_is_written_once() {
        // A reader offers a chunk with each of its reads (the kernel reads 128 KiB at a time): before, every
        // offer made before the chunk was written wrote it again, 8 MiB each time.
        let dir = tempfile::tempdir().unwrap();
        let hot = Arc::new(Hot::new(dir.path(), 1 << 30, "http://a", "b/").unwrap());
        let o = obj(3 * CHUNK);
        let b = body(o.size);
        for idx in 0..3 {
            for _ in 0..64 {
                hot.offer(3, &o, idx, chunk(&b, idx));
            }
        }
        // Offers the full queue refused are claimed by the reader at the file's end and filled.
        for idx in hot.claim_missing(3) {
            hot.fill(3, &o, idx, chunk(&b, idx)).await;
        }
        let f = complete(&hot, &o).await;
        assert_eq!(hot.written(), o.size, "chunks written more than once");
        assert_holds(&f, &b);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_nobody_offered_are_claimed_once_and_the_copy_is_placed_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let hot = Arc::new(Hot::new(dir.path(), 1 << 30, "http://a", "b/").unwrap());
        let placed = Arc::new(Mutex::new(Vec::new()));
        let p = placed.clone();
        hot.on_placed(move |ino| p.lock().push(ino));
        let o = obj(4 * CHUNK + 9);
        let b = body(o.size);
        assert!(hot.claim_missing(5).is_empty(), "no copy in progress yet");
        hot.offer(5, &o, 0, chunk(&b, 0));
        hot.offer(5, &o, 3, chunk(&b, 3));
        assert_eq!(hot.claim_missing(5), vec![1, 2, 4]);
        assert!(hot.claim_missing(5).is_empty(), "claimed twice");
        // A claim that could not be fetched is given back, and claimed again.
        hot.unclaim(5, 2);
        assert_eq!(hot.claim_missing(5), vec![2]);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(hot.open(&o).is_none(), "placed with chunks missing");
        assert!(placed.lock().is_empty());
        for idx in [4, 2, 1] {
            hot.fill(5, &o, idx, chunk(&b, idx)).await;
        }
        let f = complete(&hot, &o).await;
        assert_holds(&f, &b);
        assert_eq!(
            *placed.lock(),
            vec![5],
            "the hook runs once, with the inode"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_copy_is_made_only_of_the_whole_file_and_found_only_for_its_version() {
        let dir = tempfile::tempdir().unwrap();
        let hot = Arc::new(Hot::new(dir.path(), 1 << 30, "http://a", "b/").unwrap());
        let o = obj(CHUNK + 1);
        let b = body(o.size);
        hot.offer(1, &o, 0, chunk(&b, 0));
        // A short chunk (not what the listing says) is not taken.
        hot.offer(1, &o, 1, Bytes::from_static(b"xx"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(hot.open(&o).is_none(), "a copy with a chunk missing");
        hot.offer(1, &o, 1, chunk(&b, 1));
        complete(&hot, &o).await;
        let mut other = o.clone();
        other.etag = Some("\"e2\"".into());
        assert!(hot.open(&other).is_none(), "found for another version");
        let mut no_etag = o.clone();
        no_etag.etag = None;
        assert!(hot.open(&no_etag).is_none());
        assert!(hot.open(&obj(WHOLE)).is_none(), "small files get none");
        assert_eq!(hot.used(), o.size);
    }
}
