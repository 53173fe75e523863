//! The file system the kernel sees: a read-only [`Tree`] answered by the `fuser` crate.
//!
//! Metadata is answered at once from the tree (long TTLs: nothing in a version changes); reads are handed to
//! the tokio runtime ([`Reader`]), so a slow read never holds up `ls` or `stat`. Files are opened with
//! `FOPEN_KEEP_CACHE` and directories with `FOPEN_CACHE_DIR`: the page cache stays valid across opens, which
//! makes a second pass over a dataset a page-cache read. Handles are stateless (inode numbers only), so a server
//! started after a crash answers requests about handles the old one opened.

use std::ffi::OsStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLseek,
    ReplyOpen, ReplyStatfs, ReplyXattr, Request,
};
use strata_types::ErrorKind;

use crate::hot::Hot;
use crate::passthrough::{Handles, Mode, PASSTHROUGH_FH};
use crate::reader::Reader;
use crate::report::Counts;
use crate::snapshot::{Kind, Tree};

/// How long the kernel may keep names and attributes (they never change).
const TTL: Duration = Duration::from_secs(3600);

/// Who owns the files and what their mode is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ownership {
    /// Owner of every file and directory.
    pub uid: u32,
    /// Group of every file and directory.
    pub gid: u32,
    /// Permission bits of files (directories get the same bits plus `x` where `r` is set).
    pub file_mode: u16,
}

/// The file system of one mount.
#[derive(Debug)]
pub struct StrataFs {
    tree: Arc<Tree>,
    reader: Arc<Reader>,
    rt: tokio::runtime::Handle,
    own: Ownership,
    /// Largest read and write the kernel is told to send (bounded by the relay's message size).
    max_io: u32,
    /// Open handles by mode, kept across servers ([`crate::passthrough`]); `None` when the table could not be made.
    handles: Option<Arc<Handles>>,
    /// The hot copies, once the server knows passthrough works.
    hot: Arc<OnceLock<Arc<Hot>>>,
    /// Metadata operations answered, for the agent's analytics ([`crate::report`]).
    counts: Arc<Counts>,
}

impl StrataFs {
    /// `tree` read through `reader` on `rt`, owned as `own`; requests of at most `max_io` bytes.
    pub fn new(
        tree: Arc<Tree>,
        reader: Arc<Reader>,
        rt: tokio::runtime::Handle,
        own: Ownership,
        max_io: u32,
    ) -> Self {
        Self {
            tree,
            reader,
            rt,
            own,
            max_io,
            handles: None,
            hot: Arc::default(),
            counts: Arc::default(),
        }
    }

    /// The metadata operations this file system answers, counted.
    pub fn counts(&self) -> Arc<Counts> {
        self.counts.clone()
    }

    /// Open files through their hot copies (once `hot` is filled), counting handles in `handles`.
    pub fn with_passthrough(mut self, handles: Arc<Handles>, hot: Arc<OnceLock<Arc<Hot>>>) -> Self {
        self.handles = Some(handles);
        self.hot = hot;
        self
    }

    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.tree.node(ino)?;
        let time = |secs: i64| UNIX_EPOCH + Duration::from_secs(u64::try_from(secs).unwrap_or(0));
        let dir_mode = self.own.file_mode | ((self.own.file_mode & 0o444) >> 2);
        let (kind, size, mtime, perm, nlink) = match &node.kind {
            Kind::Dir(children) => {
                let subdirs = children
                    .iter()
                    .filter(|c| matches!(self.tree.nodes[**c as usize].kind, Kind::Dir(_)))
                    .count() as u32;
                (
                    FileType::Directory,
                    4096,
                    time(self.tree.snapshot.taken_unix),
                    dir_mode,
                    2 + subdirs,
                )
            }
            Kind::File(i) => {
                let o = &self.tree.snapshot.objects[*i];
                (
                    FileType::RegularFile,
                    o.size,
                    time(o.mtime),
                    self.own.file_mode,
                    1,
                )
            }
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: mtime,
            mtime,
            ctime: mtime,
            crtime: mtime,
            kind,
            perm,
            nlink,
            uid: self.own.uid,
            gid: self.own.gid,
            rdev: 0,
            blksize: 1 << 20,
            flags: 0,
        })
    }

    fn kind(&self, ino: u64) -> FileType {
        match self.tree.node(ino).map(|n| &n.kind) {
            Some(Kind::Dir(_)) => FileType::Directory,
            _ => FileType::RegularFile,
        }
    }

    /// `(inode, name)` of every entry of directory `ino`: `.`, `..`, then the children.
    fn entries(&self, ino: u64) -> Option<Vec<(u64, &OsStr)>> {
        let node = self.tree.node(ino)?;
        let Kind::Dir(children) = &node.kind else {
            return None;
        };
        let mut v = Vec::with_capacity(children.len() + 2);
        v.push((ino, OsStr::new(".")));
        v.push((u64::from(node.parent) + 1, OsStr::new("..")));
        for c in children {
            v.push((
                u64::from(*c) + 1,
                self.tree.nodes[*c as usize].name.as_os_str(),
            ));
        }
        Some(v)
    }
}

/// The errno a reader sees for a failed read.
fn errno(kind: ErrorKind) -> Errno {
    match kind {
        ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => Errno::EACCES,
        // The listed version is gone or changed: the file handle is stale, as NFS says.
        ErrorKind::NotFound | ErrorKind::PreconditionFailed => Errno::ESTALE,
        ErrorKind::Timeout => Errno::ETIMEDOUT,
        _ => Errno::EIO,
    }
}

impl StrataFs {
    /// The last handle of `ino` reading through the page cache was released: if its hot copy is in place, the
    /// next open is passthrough, which makes the kernel drop the file's pages first, one by one, in that
    /// open. They are dropped now instead, off the reader's path ([`Handles::drop_pages`]).
    fn drop_pages_if_copied(&self, ino: u64, handles: &Arc<Handles>) {
        let (Some(hot), Some(Kind::File(i))) =
            (self.hot.get(), self.tree.node(ino).map(|n| &n.kind))
        else {
            return;
        };
        let obj = &self.tree.snapshot.objects[*i];
        if !hot.wanted(obj) || !hot.exists(obj) {
            return;
        }
        let handles = handles.clone();
        self.rt.spawn_blocking(move || {
            if !handles.cached_open(ino) {
                handles.drop_pages(ino);
            }
        });
    }
}

/// The kernel's read-ahead window for the mount.
const READAHEAD: u32 = 1 << 20;

impl Filesystem for StrataFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The same answer on every start: a server started after a crash answers the INIT the first one saw.
        let wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_HAS_RESEND
            | InitFlags::FUSE_PASSTHROUGH;
        let _ = config.add_capabilities(wanted & config.capabilities());
        // Backing files may be on a stacked file system (overlayfs) themselves; this mount then cannot be
        // the lower layer of an overlay.
        let _ = config.set_max_stack_depth(2);
        // Requests of at most `max_io` (the relay's reliable message size), but the kernel reads ahead up to
        // 1 MiB: a window goes as several requests in flight at once, not one small window at a time.
        let _ = config.set_max_write(self.max_io);
        let _ = config.set_max_readahead(READAHEAD.max(self.max_io));
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut op = self.counts.op();
        match self
            .tree
            .lookup(parent.0, name)
            .and_then(|ino| self.attr(ino))
        {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => {
                op.fail();
                reply.error(Errno::ENOENT)
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut op = self.counts.op();
        match self.attr(ino.0) {
            Some(a) => reply.attr(&TTL, &a),
            None => {
                op.fail();
                reply.error(Errno::ENOENT)
            }
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _op = self.counts.op();
        if flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0 {
            return reply.error(Errno::EROFS);
        }
        match self.tree.node(ino.0).map(|n| &n.kind) {
            Some(Kind::File(i)) => {
                let Some(handles) = &self.handles else {
                    return reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE);
                };
                let obj = &self.tree.snapshot.objects[*i];
                let copy = || self.hot.get().and_then(|h| h.open(obj));
                match handles.open_inode(ino.0, copy) {
                    Mode::Passthrough(id) => {
                        // SAFETY: `id` is registered on this mount's connection and stays registered while
                        // `handles` counts a passthrough handle of this inode; the wrapper is forgotten
                        // (`into_raw`), never dropped, so fuser closes nothing.
                        #[allow(unsafe_code)]
                        let backing = unsafe { reply.wrap_backing(id) };
                        reply.opened_passthrough(
                            FileHandle(PASSTHROUGH_FH),
                            FopenFlags::empty(),
                            &backing,
                        );
                        let _ = backing.into_raw();
                    }
                    Mode::Cached => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
                }
            }
            Some(Kind::Dir(_)) => reply.error(Errno::EISDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(obj) = self.tree.object(ino.0).cloned() else {
            return reply.error(Errno::EISDIR);
        };
        let next = self
            .tree
            .next_file(ino.0)
            .map(|(ino, obj)| (ino, obj.clone()));
        let reader = self.reader.clone();
        self.rt.spawn(async move {
            match reader.read(ino.0, &obj, offset, size, next).await {
                Ok(b) => reply.data(&b),
                Err(e) => {
                    tracing::warn!(file = %obj.name, offset, size, error = %e, "a read failed");
                    reply.error(errno(e.kind()));
                }
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(handles) = &self.handles
            && handles.release(ino.0, fh.0)
        {
            self.drop_pages_if_copied(ino.0, handles);
        }
        reply.ok();
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // ENOSYS: nothing to flush on a read-only file, and the kernel then sends no flush again. A close
        // never waits for the server (it might be restarting, or stopped), which passthrough files rely on.
        reply.error(Errno::ENOSYS);
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: ReplyXattr,
    ) {
        // ENOSYS: the kernel remembers that there are none and asks no more.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        // Python's open() asks every file whether it is a terminal (TCGETS).
        reply.error(Errno::ENOTTY);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // default_permissions: the kernel checks the mode bits itself.
        reply.ok();
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        // SEEK_DATA/SEEK_HOLE: no holes; ENOSYS makes the kernel answer them itself from now on.
        reply.error(Errno::ENOSYS);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _op = self.counts.op();
        match self.tree.node(ino.0).map(|n| &n.kind) {
            Some(Kind::Dir(_)) => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_CACHE_DIR,
            ),
            Some(Kind::File(_)) => reply.error(Errno::ENOTDIR),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _op = self.counts.op();
        let Some(entries) = self.entries(ino.0) else {
            return reply.error(Errno::ENOTDIR);
        };
        for (i, (child, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*child), i as u64 + 1, self.kind(*child), name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _op = self.counts.op();
        let Some(entries) = self.entries(ino.0) else {
            return reply.error(Errno::ENOTDIR);
        };
        for (i, (child, name)) in entries.iter().enumerate().skip(offset as usize) {
            let Some(a) = self.attr(*child) else { continue };
            if reply.add(INodeNo(*child), i as u64 + 1, name, &TTL, &a, Generation(0)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _op = self.counts.op();
        let bsize = 4096u64;
        reply.statfs(
            self.tree.total_bytes.div_ceil(bsize),
            0,
            0,
            self.tree.nodes.len() as u64,
            0,
            bsize as u32,
            255,
            bsize as u32,
        );
    }
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
