//! The rank's side of the share: serves its source to its DataLoader workers (see the [parent](super)).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use bytes::Bytes;
use strata_types::{Error, ErrorKind, IoContext, Result};

use super::*;
use crate::dataset::DatasetIndex;
use crate::source::Source;

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
    /// Listen on a new socket in this user's socket directory under the temp directory (dead processes'
    /// sockets swept from it first) and serve `src` (the shards of `index`) on `rt`.
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
        let dir = socket_dir(&std::env::temp_dir())?;
        sweep_dead(&dir);
        let path = dir.join(format!(
            "{}-{}.sock",
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

/// This user's directory of share sockets under `tmp` (`strata-loader-<uid>`, mode 0700): a socket is named
/// `<pid>-<n>.sock` after the process serving it, so the sockets of killed processes can be told and removed.
pub(crate) fn socket_dir(tmp: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    // The process's own user: the owner of its /proc entry.
    let uid = std::fs::metadata("/proc/self")
        .map_err(|e| Error::from_io(e, "reading /proc/self"))?
        .uid();
    let dir = tmp.join(format!("strata-loader-{uid}"));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::from_io(e, format!("creating {}", dir.display()))),
    }
    let m = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::from_io(e, format!("reading {}", dir.display())))?;
    if !m.is_dir() || m.uid() != uid {
        return Err(Error::new(
            ErrorKind::PermissionDenied,
            format!("{} is not a directory of this user", dir.display()),
        ));
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::from_io(e, format!("restricting {}", dir.display())))?;
    Ok(dir)
}

/// Remove the sockets of processes that no longer exist (killed ranks leave theirs behind).
pub(crate) fn sweep_dead(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|n| n.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
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
