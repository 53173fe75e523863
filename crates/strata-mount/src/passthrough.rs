//! FUSE passthrough (Linux 6.9): opens of a file that has a hot copy ([`crate::hot`]) are answered with the
//! copy as the kernel's backing file, so reads and `mmap` go straight to it, as on a local file.
//!
//! Two kernel rules shape this module:
//!
//! - An inode is open either through the page cache (our usual `FOPEN_KEEP_CACHE`) or passthrough, never both
//!   at once: an open in the other mode fails with `EIO`. So each inode counts its open handles of each kind
//!   and an open takes the mode already in use; passthrough is chosen only when no cached handle is open.
//! - Every passthrough open of an inode must name the same backing file (`EBUSY` otherwise), so the backing
//!   id is kept per inode while any passthrough handle is open, and closed with the last.
//!
//! The counts and backing ids must outlive the server: after a crash the next server answers opens and
//! releases of handles the dead one handed out. They are kept in `handles` in the mount's state directory,
//! twelve bytes per inode (cached opens, passthrough opens, backing id), written before an open is answered
//! and after a release. A crash between the write and the answer leaves a count one too high: that inode then
//! keeps its mode (and its backing file) for the mount's life, which is slower or holds a file, never wrong.
//!
//! The backing-file ioctls need `CAP_SYS_ADMIN`: a user's mount (fusermount3) gets no passthrough and makes
//! no hot copies ([`probe`]).

#![allow(unsafe_code)] // the two backing-file ioctls of /dev/fuse; see the SAFETY notes

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;

/// `FUSE_DEV_IOC_BACKING_OPEN`: `_IOW(229, 1, struct fuse_backing_map)` (16 bytes).
const BACKING_OPEN: libc::c_ulong = 0x4010_e501;
/// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
const BACKING_CLOSE: libc::c_ulong = 0x4004_e502;
/// `FUSE_NOTIFY_INVAL_INODE`: drop an inode's cached pages (and attributes).
const NOTIFY_INVAL_INODE: i32 = 2;
/// Bytes of one inode's record in `handles`.
const RECORD: u64 = 12;
/// `fh` of a passthrough handle (cached handles are 0).
pub const PASSTHROUGH_FH: u64 = 1;

#[repr(C)]
struct BackingMap {
    fd: i32,
    flags: u32,
    padding: u64,
}

/// Register `file` as a backing file on the FUSE connection `dev`: its backing id.
pub fn backing_open(dev: BorrowedFd<'_>, file: &File) -> std::io::Result<u32> {
    let map = BackingMap {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the ioctl reads one fuse_backing_map from a pointer to a live, properly laid out value.
    let id = unsafe {
        libc::ioctl(
            dev.as_raw_fd(),
            BACKING_OPEN as _,
            &map as *const BackingMap,
        )
    };
    if id < 0 {
        return Err(std::io::Error::last_os_error());
    }
    u32::try_from(id).map_err(|_| std::io::Error::other("a negative backing id"))
}

/// Unregister backing id `id` on `dev` (files opened with it keep their backing file).
pub fn backing_close(dev: BorrowedFd<'_>, id: u32) -> std::io::Result<()> {
    // SAFETY: the ioctl reads one u32 from a pointer to a live value.
    let rc = unsafe { libc::ioctl(dev.as_raw_fd(), BACKING_CLOSE as _, &id as *const u32) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether passthrough works on `dev`: registers and unregisters `sample` (any regular file).
pub fn probe(dev: BorrowedFd<'_>, sample: &Path) -> std::io::Result<()> {
    let file = File::open(sample)?;
    let id = backing_open(dev, &file)?;
    backing_close(dev, id)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Record {
    cached: u32,
    passthrough: u32,
    backing: u32,
}

/// How an open is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Mode {
    /// Through the page cache (fh 0).
    Cached,
    /// Passthrough to the backing file with this id (fh [`PASSTHROUGH_FH`]).
    Passthrough(u32),
}

/// The open handles of a mount's inodes, by mode, kept across servers.
#[derive(Debug)]
pub struct Handles {
    dev: Arc<OwnedFd>,
    table: File,
    records: Mutex<HashMap<u64, Record>>,
}

impl Handles {
    /// The table in `state/handles`: emptied for the first server of a mount (`resuming` false), read back
    /// for a later one. `dev` is the mount's `/dev/fuse` descriptor.
    pub fn open(state: &Path, resuming: bool, dev: Arc<OwnedFd>) -> std::io::Result<Self> {
        let path = state.join("handles");
        let table = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(!resuming)
            .open(&path)?;
        let mut records = HashMap::new();
        let bytes = std::fs::read(&path)?;
        for (i, r) in bytes.chunks_exact(RECORD as usize).enumerate() {
            let word = |k: usize| u32::from_le_bytes([r[k], r[k + 1], r[k + 2], r[k + 3]]);
            let rec = Record {
                cached: word(0),
                passthrough: word(4),
                backing: word(8),
            };
            if rec != Record::default() {
                records.insert(i as u64, rec);
            }
        }
        Ok(Self {
            dev,
            table,
            records: Mutex::new(records),
        })
    }

    fn save(&self, ino: u64, r: Record) {
        let mut b = [0u8; RECORD as usize];
        b[0..4].copy_from_slice(&r.cached.to_le_bytes());
        b[4..8].copy_from_slice(&r.passthrough.to_le_bytes());
        b[8..12].copy_from_slice(&r.backing.to_le_bytes());
        if let Err(e) = self.table.write_all_at(&b, ino * RECORD) {
            tracing::warn!(error = %e, "the mount's handle table could not be written");
        }
    }

    /// Open inode `ino`: passthrough when a handle of it already is (same backing file), or when none is
    /// open through the page cache and `copy` gives a hot copy to register; through the page cache otherwise.
    pub fn open_inode(&self, ino: u64, copy: impl FnOnce() -> Option<File>) -> Mode {
        let mut records = self.records.lock();
        let mut r = records.get(&ino).copied().unwrap_or_default();
        let mode = if r.passthrough > 0 && r.backing != 0 {
            Mode::Passthrough(r.backing)
        } else if r.cached == 0 {
            match copy().map(|f| backing_open(self.dev.as_fd(), &f)) {
                Some(Ok(id)) => Mode::Passthrough(id),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "a hot copy could not be a backing file");
                    Mode::Cached
                }
                None => Mode::Cached,
            }
        } else {
            Mode::Cached
        };
        match mode {
            Mode::Passthrough(id) => {
                r.passthrough += 1;
                r.backing = id;
            }
            Mode::Cached => r.cached += 1,
        }
        records.insert(ino, r);
        self.save(ino, r);
        mode
    }

    /// Whether a handle of `ino` is open through the page cache.
    pub fn cached_open(&self, ino: u64) -> bool {
        self.records.lock().get(&ino).is_some_and(|r| r.cached > 0)
    }

    /// Drop the pages of `ino` from the page cache (`FUSE_NOTIFY_INVAL_INODE`), as the kernel does in the next
    /// passthrough open of an inode that has some; here, off any reader's path. Synchronous: the kernel drops
    /// them in this call (milliseconds for a large file), so call it from a thread that answers no request.
    pub fn drop_pages(&self, ino: u64) {
        let mut msg = [0u8; 40];
        msg[0..4].copy_from_slice(&40u32.to_ne_bytes());
        msg[4..8].copy_from_slice(&NOTIFY_INVAL_INODE.to_ne_bytes());
        // unique 0 (a notification); then the inode, offset 0 and length 0 (to the end).
        msg[16..24].copy_from_slice(&ino.to_ne_bytes());
        if let Err(e) = rustix::io::write(&*self.dev, &msg) {
            // ENOENT: the kernel has forgotten the inode, and its pages with it.
            tracing::debug!(ino, error = %e, "dropping a file's pages");
        }
    }

    /// A handle of `ino` (`fh` as its open answered) was released: whether it was the last handle of it open
    /// through the page cache.
    pub fn release(&self, ino: u64, fh: u64) -> bool {
        let mut records = self.records.lock();
        let Some(mut r) = records.get(&ino).copied() else {
            return false;
        };
        let cached_before = r.cached;
        if fh == PASSTHROUGH_FH {
            r.passthrough = r.passthrough.saturating_sub(1);
            if r.passthrough == 0 && r.backing != 0 {
                if let Err(e) = backing_close(self.dev.as_fd(), r.backing) {
                    tracing::debug!(error = %e, "closing a backing id");
                }
                r.backing = 0;
            }
        } else {
            r.cached = r.cached.saturating_sub(1);
        }
        if r == Record::default() {
            records.remove(&ino);
        } else {
            records.insert(ino, r);
        }
        self.save(ino, r);
        fh != PASSTHROUGH_FH && cached_before == 1 && r.cached == 0
    }
}
