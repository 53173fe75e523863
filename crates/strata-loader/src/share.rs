//! Sharing one process's cache with its DataLoader workers.
//!
//! PyTorch's DataLoader forks worker processes, and starts new ones every epoch. A cache inside each worker
//! would fetch every block once per worker and be lost at the end of each epoch. Instead the process that
//! opened the dataset (the rank) serves its [`LocalSource`](crate::LocalSource) on a Unix socket and the
//! workers read through it: one cache per rank, warm across epochs, each block fetched from the origin once.
//!
//! The protocol is deliberately tiny (no HTTP): a request is `u8 op | u32 key_len | key | u64 start | u64 end`
//! (op 0 reads `start..end`, 1 asks for the object's size, 2 starts a prefetch of `start..end` and answers once
//! it is started, 3 reads `start..end` into the worker's memory: the request ends with `u64 address`); the
//! reply is
//! `u8 status | u32 error kind | u64 len | payload`, the payload being the bytes (status 0; the size as a u64;
//! nothing for a prefetch) or the error message (status 1). Status 2 answers op 3 when the bytes were written
//! straight into the worker's buffer at `address` with `process_vm_writev(2)` (no payload follows).
//!
//! Op 3 is the fast path: one copy from the rank's cache into the worker's buffer, where a socket costs two
//! copies through the kernel, a zeroed receive buffer and a wake-up per chunk (a profile of two DataLoader
//! workers put most of the serving CPU there). The server writes only into the process on the other end of
//! the connection (its pid from `SO_PEERCRED`, never one named in the request), and the worker keeps the
//! buffer alive until the reply has arrived (a cancelled read leaks it rather than free memory the server may
//! still write). Where the kernel refuses the call (Yama `ptrace_scope` 2 or 3, a seccomp profile without it,
//! a worker that is not a descendant under scope 1) the server answers with the bytes on the socket (status 0)
//! and stops trying.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use strata_types::{Error, ErrorKind, IoContext, Result};

use crate::dataset::DatasetIndex;
use crate::shm::{SharedRegion, SlotMut};
use crate::source::Source;

const OP_READ: u8 = 0;
const OP_SIZE: u8 = 1;
const OP_PREFETCH: u8 = 2;
const OP_READ_INTO: u8 = 3;
const STATUS_OK: u8 = 0;
const STATUS_ERR: u8 = 1;
const STATUS_WRITTEN: u8 = 2;
const MAX_KEY: u32 = 64 * 1024;
/// Most worker connections served at once.
const MAX_CONNECTIONS: usize = 1024;

/// An error's kind and retryable flag on the wire: the kind's index in [`ErrorKind::ALL`], the flag in the top
/// bit. Both ends are the same build (a rank and its DataLoader workers), so every kind crosses intact.
fn error_code(e: &Error) -> u32 {
    let index = ErrorKind::ALL
        .iter()
        .position(|&k| k == e.kind())
        .or_else(|| {
            ErrorKind::ALL
                .iter()
                .position(|&k| k == ErrorKind::Internal)
        })
        .unwrap_or(0) as u32;
    index | if e.is_retryable() { RETRYABLE_BIT } else { 0 }
}

const RETRYABLE_BIT: u32 = 1 << 31;

/// The error [`error_code`] encoded, with its message.
fn error_of(code: u32, message: String) -> Error {
    let kind = ErrorKind::ALL
        .get((code & !RETRYABLE_BIT) as usize)
        .copied()
        .unwrap_or(ErrorKind::Internal);
    Error::new(kind, message).with_retryable(code & RETRYABLE_BIT != 0)
}

fn io_err(e: std::io::Error, what: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("shared loader cache: {what}: {e}"),
    )
}

/// Serves a dataset's source to worker processes until dropped.
#[derive(Debug)]
pub struct ShareServer {
    path: PathBuf,
    cancel: CancellationToken,
    /// The process that listens: a forked child inherits this value and must not tear the server down.
    pid: u32,
    direct: Arc<AtomicBool>,
    direct_writes: Arc<AtomicU64>,
}

impl ShareServer {
    /// Listen on a new socket under the temp directory and serve `src` (the shards of `index`) on `rt`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        index: Arc<DatasetIndex>,
        src: Source,
        ctx: IoContext,
    ) -> Result<Self> {
        Self::start_with(rt, index, src, ctx, true)
    }

    /// As [`start`](Self::start); `direct: false` always answers reads on the socket (the fallback path, for
    /// tests and for systems where writing into the workers' memory is not wanted).
    pub fn start_with(
        rt: &tokio::runtime::Handle,
        index: Arc<DatasetIndex>,
        src: Source,
        ctx: IoContext,
        direct: bool,
    ) -> Result<Self> {
        let direct = Arc::new(AtomicBool::new(direct));
        let direct_flag = direct.clone();
        let direct_writes = Arc::new(AtomicU64::new(0));
        let writes = direct_writes.clone();
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "strata-loader-{}-{}.sock",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&path);
        let _guard = rt.enter();
        let listener = tokio::net::UnixListener::bind(&path)
            .map_err(|e| Error::from_io(e, format!("binding {}", path.display())))?;
        // Only this user's processes may connect (they could read the dataset's bytes through it).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| Error::from_io(e, format!("restricting {}", path.display())))?;
        }
        let cancel = CancellationToken::new();
        let stop = cancel.clone();
        let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let by_key: Arc<HashMap<String, usize>> = Arc::new(
            index
                .shards
                .iter()
                .enumerate()
                .map(|(i, s)| (s.key.clone(), i))
                .collect(),
        );
        rt.spawn(async move {
            loop {
                let permit = tokio::select! {
                    p = limit.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
                    _ = stop.cancelled() => return,
                };
                let conn = tokio::select! {
                    c = listener.accept() => c,
                    _ = stop.cancelled() => return,
                };
                let Ok((stream, _)) = conn else { continue };
                let (index, by_key, src, ctx, stop) = (
                    index.clone(),
                    by_key.clone(),
                    src.clone(),
                    ctx.clone(),
                    stop.clone(),
                );
                // Where the worker's pid is unknown, reads go over the socket.
                let worker = if direct.load(Ordering::Relaxed) {
                    stream
                        .peer_cred()
                        .ok()
                        .and_then(|c| c.pid())
                        .map(|pid| WorkerProcess {
                            pid,
                            direct: direct.clone(),
                            writes: writes.clone(),
                        })
                } else {
                    None
                };
                tokio::spawn(async move {
                    tokio::select! {
                        _ = serve_conn(stream, &index, &by_key, &src, &ctx, worker) => {}
                        _ = stop.cancelled() => {}
                    }
                    drop(permit);
                });
            }
        });
        Ok(Self {
            path,
            cancel,
            pid: std::process::id(),
            direct: direct_flag,
            direct_writes,
        })
    }

    /// Reads answered by writing straight into a worker's memory so far.
    pub fn direct_writes(&self) -> u64 {
        self.direct_writes.load(Ordering::Relaxed)
    }

    /// Whether reads are still written straight into the workers' memory (false once the kernel refused it).
    pub fn writes_direct(&self) -> bool {
        self.direct.load(Ordering::Relaxed)
    }

    /// The socket workers connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ShareServer {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            return;
        }
        self.cancel.cancel();
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The DataLoader worker process on the other end of a connection, for op 3 (its memory is written directly).
struct WorkerProcess {
    pid: libc::pid_t,
    /// Shared by the server's connections: cleared when the kernel refuses the call.
    direct: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
}

impl WorkerProcess {
    /// Write `data` at `addr` in the worker's memory; false (and nothing written that the worker will read) when
    /// the kernel refuses or writes less.
    fn write(&self, addr: u64, data: &[u8]) -> bool {
        if !self.direct.load(Ordering::Relaxed) || data.is_empty() {
            return false;
        }
        let local = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as usize as *mut libc::c_void,
            iov_len: data.len(),
        };
        // SAFETY: `local` describes `data`, which the kernel only reads; `remote` is memory of another process
        // (the worker, by its credentials), which the kernel checks and writes; nothing in this process is written.
        #[allow(unsafe_code)]
        let n = unsafe { libc::process_vm_writev(self.pid, &local, 1, &remote, 1, 0) };
        if n == data.len() as isize {
            self.writes.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let err = std::io::Error::last_os_error();
        if n < 0
            && matches!(
                err.raw_os_error(),
                Some(libc::EPERM | libc::ENOSYS | libc::EACCES)
            )
        {
            tracing::debug!(error = %err, "process_vm_writev refused; shared loader cache reads go over the socket");
            self.direct.store(false, Ordering::Relaxed);
        }
        false
    }
}

async fn serve_conn(
    stream: UnixStream,
    index: &Arc<DatasetIndex>,
    by_key: &HashMap<String, usize>,
    src: &Source,
    ctx: &IoContext,
    worker: Option<WorkerProcess>,
) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    loop {
        let Ok(op) = r.read_u8().await else {
            return;
        };
        let Ok(klen) = r.read_u32_le().await else {
            return;
        };
        if klen > MAX_KEY {
            return;
        }
        let mut key = vec![0u8; klen as usize];
        if r.read_exact(&mut key).await.is_err() {
            return;
        }
        let (Ok(start), Ok(end)) = (r.read_u64_le().await, r.read_u64_le().await) else {
            return;
        };
        let dest = if op == OP_READ_INTO {
            let Ok(a) = r.read_u64_le().await else {
                return;
            };
            Some(a)
        } else {
            None
        };
        let key = String::from_utf8_lossy(&key);
        let result = match by_key.get(key.as_ref()).map(|&i| &index.shards[i]) {
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!("shard {key} is not in the dataset"),
            )),
            Some(shard) if op == OP_SIZE => src
                .size(ctx, shard)
                .await
                .map(|n| Bytes::copy_from_slice(&n.to_le_bytes())),
            Some(_) if end < start => {
                Err(Error::invalid_input(format!("bad range {start}..{end}")))
            }
            // Answered once the fetches are started (not done), so that the worker's next reads find them.
            Some(shard) if op == OP_PREFETCH => src
                .prefetch(ctx, shard, start..end)
                .await
                .map(|()| Bytes::new()),
            Some(shard) if op == OP_READ || op == OP_READ_INTO => {
                src.read(ctx, shard, start..end).await
            }
            Some(_) => Err(Error::invalid_input(format!("unknown operation {op}"))),
        };
        let ok = match result {
            Ok(b) => {
                let mut head = [0u8; 13];
                head[5..].copy_from_slice(&(b.len() as u64).to_le_bytes());
                let written = match (dest, &worker) {
                    (Some(addr), Some(p)) if b.len() as u64 == end - start => p.write(addr, &b),
                    _ => false,
                };
                if written {
                    head[0] = STATUS_WRITTEN;
                    w.write_all(&head).await.is_ok()
                } else {
                    head[0] = STATUS_OK;
                    w.write_all(&head).await.is_ok() && w.write_all(&b).await.is_ok()
                }
            }
            Err(e) => {
                let msg = e.message().as_bytes().to_vec();
                let mut head = [0u8; 13];
                head[0] = STATUS_ERR;
                head[1..5].copy_from_slice(&error_code(&e).to_le_bytes());
                head[5..].copy_from_slice(&(msg.len() as u64).to_le_bytes());
                w.write_all(&head).await.is_ok() && w.write_all(&msg).await.is_ok()
            }
        };
        if !ok {
            return;
        }
    }
}

/// Where a read's bytes land: private memory, or a slot of the shared sample region.
enum Buf {
    Vec(Vec<u8>),
    Slot(SlotMut),
}

/// A read's receive buffer, which the server may be writing into (op 3) until its reply arrives. Dropped
/// before that (the read was cancelled), it is leaked rather than freed under the server's write.
struct Landing(Option<Buf>);

impl Landing {
    fn new(len: usize, region: Option<&Arc<SharedRegion>>) -> Self {
        match region.and_then(|r| r.alloc(len)) {
            Some(slot) => Self(Some(Buf::Slot(slot))),
            None => Self(Some(Buf::Vec(Vec::with_capacity(len)))),
        }
    }

    fn address(&mut self) -> u64 {
        match self.0.as_mut() {
            Some(Buf::Vec(v)) => v.as_mut_ptr() as usize as u64,
            Some(Buf::Slot(s)) => s.address(),
            None => 0,
        }
    }

    /// The reply has arrived: the buffer is no longer written from outside.
    fn replied(mut self) -> Option<Buf> {
        self.0.take()
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        match self.0.take() {
            Some(Buf::Vec(v)) => std::mem::forget(v),
            Some(Buf::Slot(s)) => s.leak(),
            None => {}
        }
    }
}

/// A worker's side: reads shard bytes from the rank's [`ShareServer`].
#[derive(Debug, Clone)]
pub struct ShareClient {
    path: PathBuf,
    idle: Arc<Mutex<Vec<UnixStream>>>,
    /// Reads land in slots of this region when it has room (samples that cross DataLoader workers).
    region: Option<Arc<SharedRegion>>,
}

impl ShareClient {
    /// A client of the server listening at `path`.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            idle: Arc::new(Mutex::new(Vec::new())),
            region: None,
        }
    }

    /// This client (sharing its connections) with reads landing in slots of `region` while it has room, in
    /// private memory otherwise.
    pub fn with_region(&self, region: Option<Arc<SharedRegion>>) -> Self {
        Self {
            region,
            ..self.clone()
        }
    }

    /// One request; a read lands in a slot of `region` when given and it has room.
    async fn call(
        &self,
        op: u8,
        key: &str,
        start: u64,
        end: u64,
        region: Option<&Arc<SharedRegion>>,
    ) -> Result<Bytes> {
        let pooled = self.idle.lock().pop();
        let mut s = match pooled {
            Some(s) => s,
            None => UnixStream::connect(&self.path)
                .await
                .map_err(|e| io_err(e, &format!("connecting to {}", self.path.display())))?,
        };
        // A read lands in a buffer the server may write straight into (op 3).
        let mut landing = if op == OP_READ && end > start {
            let len = usize::try_from(end - start)
                .map_err(|_| Error::invalid_input(format!("range {start}..{end} too large")))?;
            Some(Landing::new(len, region))
        } else {
            None
        };
        let mut req = Vec::with_capacity(5 + key.len() + 24);
        req.push(if landing.is_some() { OP_READ_INTO } else { op });
        req.extend_from_slice(&(key.len() as u32).to_le_bytes());
        req.extend_from_slice(key.as_bytes());
        req.extend_from_slice(&start.to_le_bytes());
        req.extend_from_slice(&end.to_le_bytes());
        if let Some(l) = &mut landing {
            req.extend_from_slice(&l.address().to_le_bytes());
        }
        s.write_all(&req).await.map_err(|e| io_err(e, "request"))?;
        let mut head = [0u8; 13];
        s.read_exact(&mut head)
            .await
            .map_err(|e| io_err(e, "reply"))?;
        // The server writes into the landing buffer only before it replies: from here on it is ours again.
        let buf = landing.and_then(Landing::replied);
        let len = u64::from_le_bytes(head[5..13].try_into().expect("8 bytes"));
        if head[0] == STATUS_WRITTEN {
            self.idle.lock().push(s);
            if len != end - start {
                return Err(Error::internal(format!(
                    "shared loader cache: {len} bytes written for {start}..{end}"
                )));
            }
            return match buf {
                Some(Buf::Slot(slot)) => Ok(slot.freeze(len as usize)),
                Some(Buf::Vec(mut v)) => {
                    // SAFETY: the server wrote all `len` bytes of the buffer's spare capacity (it replies
                    // with STATUS_WRITTEN only after process_vm_writev returned that many), and `len` is its
                    // capacity.
                    #[allow(unsafe_code)]
                    unsafe {
                        v.set_len(len as usize);
                    }
                    Ok(Bytes::from(v))
                }
                None => Err(Error::internal("shared loader cache: unexpected reply")),
            };
        }
        let len = usize::try_from(len).map_err(|_| Error::internal("reply too large"))?;
        let buf = match buf {
            Some(Buf::Slot(mut slot)) if head[0] == STATUS_OK && slot.capacity() >= len => {
                s.read_exact(&mut slot.as_mut_slice()[..len])
                    .await
                    .map_err(|e| io_err(e, "reply body"))?;
                self.idle.lock().push(s);
                return Ok(slot.freeze(len));
            }
            other => other,
        };
        let mut body = match buf {
            Some(Buf::Vec(mut b)) if b.capacity() >= len => {
                b.clear();
                b
            }
            _ => Vec::with_capacity(len),
        };
        // Into spare capacity: no zeroing of a buffer about to be overwritten.
        let got = (&mut s)
            .take(len as u64)
            .read_to_end(&mut body)
            .await
            .map_err(|e| io_err(e, "reply body"))?;
        if got != len {
            return Err(io_err(
                std::io::ErrorKind::UnexpectedEof.into(),
                "reply body",
            ));
        }
        self.idle.lock().push(s);
        if head[0] == STATUS_OK {
            return Ok(Bytes::from(body));
        }
        let code = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes"));
        Err(error_of(code, String::from_utf8_lossy(&body).into_owned()))
    }

    /// Bytes `range` of the shard `key`, verified by the serving process, in private memory.
    pub async fn read(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.call(OP_READ, key, range.start, range.end, None).await
    }

    /// As [`read`](Self::read), landing in the client's shared region when it has one with room: for sample
    /// bytes handed to the training process (metadata kept by the worker stays in private memory).
    pub async fn read_sample(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.call(OP_READ, key, range.start, range.end, self.region.as_ref())
            .await
    }

    /// Ask the serving process to start fetching `range` of shard `key` into its cache.
    pub async fn prefetch(&self, key: &str, range: std::ops::Range<u64>) -> Result<()> {
        self.call(OP_PREFETCH, key, range.start, range.end, None)
            .await
            .map(|_| ())
    }

    /// Size of the shard `key`.
    pub async fn size(&self, key: &str) -> Result<u64> {
        let b = self.call(OP_SIZE, key, 0, 0, None).await?;
        let a: [u8; 8] = b
            .as_ref()
            .try_into()
            .map_err(|_| Error::internal("bad size reply"))?;
        Ok(u64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_error_kind_and_its_retryable_flag_cross_to_the_worker() {
        for kind in ErrorKind::ALL {
            for retryable in [false, true] {
                let e = Error::new(kind, "m").with_retryable(retryable);
                let back = super::error_of(super::error_code(&e), "m".into());
                assert_eq!((back.kind(), back.is_retryable()), (kind, retryable));
            }
        }
    }

    use super::*;
    use crate::source::{LocalCacheOptions, LocalSource};

    /// A dataset of one tar shard, opened through an in-process cache, and the shard's bytes.
    async fn dataset(dir: &Path) -> (Arc<DatasetIndex>, Source, Vec<u8>) {
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let shard = crate::format::tar::tests::tar(&[
            ("s/000.bin", b"tiny".as_slice()),
            ("s/001.bin", &big),
            ("s/002.bin", &big[..70_000]),
        ]);
        std::fs::write(dir.join("shard-0.tar"), &shard).unwrap();
        let url = format!("file://{}", dir.display());
        let src = Source::Local(
            LocalSource::open(
                &url,
                &LocalCacheOptions::default(),
                strata_telemetry::Telemetry::new(),
            )
            .unwrap(),
        );
        let index = DatasetIndex::open(&src, &IoContext::anonymous(), 2)
            .await
            .unwrap();
        (Arc::new(index), src, shard)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_are_byte_exact_written_directly_or_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (index, src, shard) = dataset(dir.path()).await;
        let rt = tokio::runtime::Handle::current();
        let region = SharedRegion::create(4 << 20).unwrap();
        for (direct, shared) in [(true, false), (false, false), (true, true), (false, true)] {
            let server = ShareServer::start_with(
                &rt,
                index.clone(),
                src.clone(),
                IoContext::anonymous(),
                direct,
            )
            .unwrap();
            let client =
                ShareClient::new(server.path()).with_region(shared.then(|| region.clone()));
            let n = shard.len() as u64;
            assert_eq!(client.size("shard-0.tar").await.unwrap(), n);
            // Whole shard, a range across cache blocks' worth of data, a small one, one byte, an empty one.
            for (a, b) in [(0, n), (512, 300_512), (1000, 1004), (n - 1, n), (7, 7)] {
                let got = client.read_sample("shard-0.tar", a..b).await.unwrap();
                assert_eq!(
                    got.as_ref(),
                    &shard[a as usize..b as usize],
                    "{a}..{b} direct={direct}"
                );
                // Metadata reads stay in private memory.
                let meta = client.read("shard-0.tar", a..b).await.unwrap();
                assert_eq!(meta, got);
                assert!(SharedRegion::share(&meta).is_none());
                // With a region, every non-empty read lands in one of its slots.
                assert_eq!(
                    SharedRegion::share(&got).map(|h| SharedRegion::adopt(h).unwrap().len()),
                    (shared && b > a).then_some((b - a) as usize)
                );
            }
            // Many at once on pooled connections.
            let reads = (0..32u64).map(|i| {
                let c = client.clone();
                async move {
                    (
                        i,
                        c.read_sample("shard-0.tar", i * 1000..i * 1000 + 70_000)
                            .await,
                    )
                }
            });
            for (i, r) in futures::future::join_all(reads).await {
                let (a, b) = (i as usize * 1000, i as usize * 1000 + 70_000);
                assert_eq!(r.unwrap().as_ref(), &shard[a..b]);
            }
            // Errors keep their kind; the connection stays usable.
            let e = client.read("nope.tar", 0..10).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
            let e = client.read("shard-0.tar", n..n + 10).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
            assert_eq!(
                client.read("shard-0.tar", 0..4).await.unwrap().as_ref(),
                &shard[..4]
            );
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(server.path()).unwrap().permissions(),
            );
            assert_eq!(mode & 0o777, 0o600, "only this user may connect");
            // In this process the kernel allows writing into our own memory: the direct path stayed on and
            // answered every non-empty read.
            assert_eq!(server.writes_direct(), direct);
            assert_eq!(
                server.direct_writes() > 35,
                direct,
                "{}",
                server.direct_writes()
            );
        }
        assert_eq!(region.in_use(), 0, "every slot freed with its bytes");
        // A region without room: reads land in private memory, as before.
        let full = SharedRegion::create(crate::shm::GRANULE as u64).unwrap();
        let hog = full.alloc(1).unwrap();
        let server = ShareServer::start(&rt, index, src, IoContext::anonymous()).unwrap();
        let client = ShareClient::new(server.path()).with_region(Some(full.clone()));
        let got = client.read_sample("shard-0.tar", 10..5000).await.unwrap();
        assert_eq!(got.as_ref(), &shard[10..5000]);
        assert!(SharedRegion::share(&got).is_none());
        drop(hog);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_read_leaves_the_client_and_server_working() {
        let dir = tempfile::tempdir().unwrap();
        let (index, src, shard) = dataset(dir.path()).await;
        let rt = tokio::runtime::Handle::current();
        let server = ShareServer::start(&rt, index, src, IoContext::anonymous()).unwrap();
        let client = ShareClient::new(server.path());
        let n = shard.len() as u64;
        for i in 0..50u64 {
            // Dropped at whatever point it reached (its buffer is leaked, never freed under a write).
            let c = client.clone();
            let _ = tokio::time::timeout(std::time::Duration::from_micros(i * 20), async move {
                c.read("shard-0.tar", 0..n).await
            })
            .await;
        }
        let got = client.read("shard-0.tar", 100..200_100).await.unwrap();
        assert_eq!(got.as_ref(), &shard[100..200_100]);
    }
}
