//! Sharing one process's cache with its DataLoader workers.
//!
//! PyTorch's DataLoader forks worker processes, and starts new ones every epoch. A cache inside each worker
//! would fetch every block once per worker and be lost at the end of each epoch. Instead the process that
//! opened the dataset (the rank) serves its [`LocalSource`](crate::LocalSource) on a Unix socket and the
//! workers read through it: one cache per rank, warm across epochs, each block fetched from the origin once.
//!
//! The protocol is deliberately tiny (no HTTP): a request is `u8 op | u32 key_len | key | u64 start | u64 end`
//! (op 0 reads `start..end`, 1 asks for the object's size, 2 starts a prefetch of `start..end`); the reply is
//! `u8 status | u32 error kind | u64 len | payload`, the payload being the bytes (status 0; the size as a u64;
//! nothing for a prefetch) or the error message (status 1).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use strata_types::{Error, ErrorKind, IoContext, Result};

use crate::dataset::DatasetIndex;
use crate::source::Source;

const OP_READ: u8 = 0;
const OP_SIZE: u8 = 1;
const OP_PREFETCH: u8 = 2;
const MAX_KEY: u32 = 64 * 1024;
/// Most worker connections served at once.
const MAX_CONNECTIONS: usize = 1024;

const KINDS: &[ErrorKind] = &[
    ErrorKind::NotFound,
    ErrorKind::Corrupt,
    ErrorKind::PreconditionFailed,
    ErrorKind::InvalidInput,
    ErrorKind::Unavailable,
    ErrorKind::Timeout,
    ErrorKind::Io,
    ErrorKind::Internal,
];

fn kind_code(k: ErrorKind) -> u32 {
    KINDS
        .iter()
        .position(|&x| x == k)
        .unwrap_or(KINDS.len() - 1) as u32
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
}

impl ShareServer {
    /// Listen on a new socket under the temp directory and serve `src` (the shards of `index`) on `rt`.
    pub fn start(
        rt: &tokio::runtime::Handle,
        index: Arc<DatasetIndex>,
        src: Source,
        ctx: IoContext,
    ) -> Result<Self> {
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
                tokio::spawn(async move {
                    tokio::select! {
                        _ = serve_conn(stream, &index, &by_key, &src, &ctx) => {}
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
        })
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

async fn serve_conn(
    stream: UnixStream,
    index: &Arc<DatasetIndex>,
    by_key: &HashMap<String, usize>,
    src: &Source,
    ctx: &IoContext,
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
            Some(_) if op == OP_PREFETCH => {
                // Answer at once; the prefetch runs on its own.
                let (src, ctx, index) = (src.clone(), ctx.clone(), index.clone());
                let i = by_key.get(key.as_ref()).copied().unwrap_or(0);
                tokio::spawn(async move {
                    let _ = src.prefetch(&ctx, &index.shards[i], start..end).await;
                });
                Ok(Bytes::new())
            }
            Some(shard) if op == OP_READ => src.read(ctx, shard, start..end).await,
            Some(_) => Err(Error::invalid_input(format!("unknown operation {op}"))),
        };
        let ok = match result {
            Ok(b) => {
                let mut head = [0u8; 13];
                head[5..].copy_from_slice(&(b.len() as u64).to_le_bytes());
                w.write_all(&head).await.is_ok() && w.write_all(&b).await.is_ok()
            }
            Err(e) => {
                let msg = e.message().as_bytes().to_vec();
                let mut head = [0u8; 13];
                head[0] = 1;
                head[1..5].copy_from_slice(&kind_code(e.kind()).to_le_bytes());
                head[5..].copy_from_slice(&(msg.len() as u64).to_le_bytes());
                w.write_all(&head).await.is_ok() && w.write_all(&msg).await.is_ok()
            }
        };
        if !ok {
            return;
        }
    }
}

/// A worker's side: reads shard bytes from the rank's [`ShareServer`].
#[derive(Debug, Clone)]
pub struct ShareClient {
    path: PathBuf,
    idle: Arc<Mutex<Vec<UnixStream>>>,
}

impl ShareClient {
    /// A client of the server listening at `path`.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            idle: Arc::new(Mutex::new(Vec::new())),
        }
    }

    async fn call(&self, op: u8, key: &str, start: u64, end: u64) -> Result<Bytes> {
        let pooled = self.idle.lock().pop();
        let mut s = match pooled {
            Some(s) => s,
            None => UnixStream::connect(&self.path)
                .await
                .map_err(|e| io_err(e, &format!("connecting to {}", self.path.display())))?,
        };
        let mut req = Vec::with_capacity(5 + key.len() + 16);
        req.push(op);
        req.extend_from_slice(&(key.len() as u32).to_le_bytes());
        req.extend_from_slice(key.as_bytes());
        req.extend_from_slice(&start.to_le_bytes());
        req.extend_from_slice(&end.to_le_bytes());
        s.write_all(&req).await.map_err(|e| io_err(e, "request"))?;
        let mut head = [0u8; 13];
        s.read_exact(&mut head)
            .await
            .map_err(|e| io_err(e, "reply"))?;
        let len = u64::from_le_bytes(head[5..13].try_into().expect("8 bytes"));
        let mut body =
            vec![0u8; usize::try_from(len).map_err(|_| Error::internal("reply too large"))?];
        s.read_exact(&mut body)
            .await
            .map_err(|e| io_err(e, "reply body"))?;
        self.idle.lock().push(s);
        if head[0] == 0 {
            return Ok(Bytes::from(body));
        }
        let code = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
        let kind = KINDS.get(code).copied().unwrap_or(ErrorKind::Internal);
        Err(Error::new(
            kind,
            String::from_utf8_lossy(&body).into_owned(),
        ))
    }

    /// Bytes `range` of the shard `key`, verified by the serving process.
    pub async fn read(&self, key: &str, range: std::ops::Range<u64>) -> Result<Bytes> {
        self.call(OP_READ, key, range.start, range.end).await
    }

    /// Ask the serving process to start fetching `range` of shard `key` into its cache.
    pub async fn prefetch(&self, key: &str, range: std::ops::Range<u64>) -> Result<()> {
        self.call(OP_PREFETCH, key, range.start, range.end)
            .await
            .map(|_| ())
    }

    /// Size of the shard `key`.
    pub async fn size(&self, key: &str) -> Result<u64> {
        let b = self.call(OP_SIZE, key, 0, 0).await?;
        let a: [u8; 8] = b
            .as_ref()
            .try_into()
            .map_err(|_| Error::internal("bad size reply"))?;
        Ok(u64::from_le_bytes(a))
    }
}
