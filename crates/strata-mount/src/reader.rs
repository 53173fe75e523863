//! A mount's reads: ranges of the snapshot's objects through the agent (`GET /v1/read`, pinned to the listed
//! ETag with `If-Match`, so a changed object is an error, never other bytes).
//!
//! Sequential readers are served from chunks of [`CHUNK`] bytes (one agent request each, the cache's block
//! size), fetched single-flight and one chunk ahead, while the agent is asked to fetch up to
//! [`PREFETCH_WINDOW`] ahead (`POST /v1/prefetch`, so the origin is read in the agent's large requests), and kept in a small LRU ([`CHUNKS_KEPT`]); the kernel's
//! page cache keeps what was read (files are opened with `FOPEN_KEEP_CACHE`: a version never changes), so a
//! chunk is rarely wanted twice. Files up to [`WHOLE`] are read whole by their first read (many small files:
//! one request each). A read that does not follow on from the chunks already fetched (random access) asks the
//! agent for exactly its range. Fetched chunks of large files are also offered to the mount's hot copies
//! ([`crate::hot`]), which later opens read through passthrough.
//!
//! A chunk's bytes land in a buffer of a small pool ([`BUFFERS_KEPT`] free at most) rather than in fresh
//! memory: a freshly allocated 8 MiB buffer costs a page fault and a zeroed page per 4 KiB, which was a fifth
//! of the server's CPU on a cold sequential read (bench/RESULTS.md). A chunk's buffer goes back to the pool
//! when the last `Bytes` of it (the chunk LRU's, a hot copy's, a reply's) is dropped.
//!
//! An agent that is away (restarting) is waited for, up to [`Reader::new`]'s `wait`, retrying with backoff:
//! a reader sees a slow read, not an error.

use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use strata_api::{Endpoint, data};
use strata_client::{AgentClient, Method};
use strata_types::{Error, ErrorKind, Result};
use tokio::sync::OnceCell;

use crate::hot::Hot;
use crate::snapshot::Object;

/// Bytes of one chunk (the agent's default block size).
pub const CHUNK: u64 = 8 << 20;
/// Chunks kept after they are read (at most this many chunks' bytes in memory).
pub const CHUNKS_KEPT: usize = 8;
/// Files at most this large are fetched whole on their first read.
pub const WHOLE: u64 = 1 << 20;
/// How far ahead of a sequential reader the agent is asked to fetch (`POST /v1/prefetch`): the agent then
/// reads the origin in its own large requests (`max_request_size`) instead of one per chunk.
pub const PREFETCH_WINDOW: u64 = 128 << 20;
/// Files tracked for prefetching at once (the oldest is forgotten first).
const PREFETCH_TRACKED: usize = 1024;
/// Free chunk buffers kept for the next fetches (at most this many chunks' bytes held idle).
pub const BUFFERS_KEPT: usize = 4;
/// Fetches at least this large land in a pooled chunk buffer; smaller ones (random reads, small files) in
/// memory of their own.
const POOLED_MIN: u64 = CHUNK / 2;

/// Chunk buffers free for reuse, their pages already mapped (new ones are mapped in one call:
/// [`strata_types::mem::prefaulted_vec`]). The agent's cache has a pool of its own (`strata-cache`'s
/// `BlockPool`), bounded by its in-flight budget; the mount has no budget, so a fixed bound.
#[derive(Debug, Default)]
struct Pool(Mutex<Vec<Vec<u8>>>);

impl Pool {
    /// An empty buffer of [`CHUNK`] bytes' capacity: a kept one if there is one.
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .pop()
            .unwrap_or_else(|| strata_types::mem::prefaulted_vec(CHUNK as usize))
    }

    fn give_back(&self, mut buf: Vec<u8>) {
        if buf.capacity() != CHUNK as usize {
            return;
        }
        let mut free = self.0.lock();
        if free.len() < BUFFERS_KEPT {
            buf.clear();
            free.push(buf);
        }
    }
}

/// The owner of a chunk's `Bytes`: its buffer goes back to the pool with the last of them.
struct Pooled {
    buf: Vec<u8>,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

type Cell = Arc<OnceCell<Bytes>>;

/// Reads of one mount's objects.
#[derive(Debug)]
pub struct Reader {
    client: AgentClient,
    location: String,
    wait: Duration,
    chunks: Mutex<VecDeque<((u64, u64), Cell)>>,
    /// Per inode: how far the agent was asked to prefetch.
    prefetched: Mutex<VecDeque<(u64, u64)>>,
    /// Where fetched chunks of large files are copied (set once the server knows passthrough works).
    hot: Arc<OnceLock<Arc<Hot>>>,
    /// Buffers that fetched chunks land in.
    pool: Arc<Pool>,
}

impl Reader {
    /// Reads of objects under `location` (ending with `/`) through `client`; an unreachable agent is waited
    /// for up to `wait` per read.
    pub fn new(client: AgentClient, location: String, wait: Duration) -> Self {
        Self {
            client,
            location,
            wait,
            chunks: Mutex::new(VecDeque::new()),
            prefetched: Mutex::new(VecDeque::new()),
            hot: Arc::default(),
            pool: Arc::default(),
        }
    }

    /// The slot for the mount's hot copies: fetched chunks are offered to them once it is filled.
    pub fn hot_slot(&self) -> Arc<OnceLock<Arc<Hot>>> {
        self.hot.clone()
    }

    /// Bytes `offset..offset + size` of `obj` (inode `ino`), cut at its end. `next` is the file a reader
    /// walking the directory opens after this one: the prefetch window runs on into it.
    pub async fn read(
        self: &Arc<Self>,
        ino: u64,
        obj: &Object,
        offset: u64,
        size: u32,
        next: Option<(u64, Object)>,
    ) -> Result<Bytes> {
        if offset >= obj.size || size == 0 {
            return Ok(Bytes::new());
        }
        let end = obj.size.min(offset + u64::from(size));
        if obj.size <= WHOLE {
            let whole = self.chunk(ino, obj, 0, 0..obj.size).await?;
            return Ok(whole.slice(offset as usize..end as usize));
        }
        let first = offset / CHUNK;
        let last = (end - 1) / CHUNK;
        let sequential = first == 0 || self.cached(ino, first) || self.cached(ino, first - 1);
        if !sequential {
            return self.fetch(obj, offset..end).await;
        }
        self.prefetch_ahead(ino, obj, offset, next);
        let chunks = obj.size.div_ceil(CHUNK);
        if last + 1 < chunks {
            // One chunk ahead, fetched while this one is read.
            let me = self.clone();
            let obj = obj.clone();
            let next = last + 1;
            tokio::spawn(async move {
                let range = next * CHUNK..obj.size.min((next + 1) * CHUNK);
                if let Err(e) = me.chunk(ino, &obj, next, range).await {
                    tracing::debug!(error = %e, "read-ahead of a chunk failed (a read will try again)");
                }
            });
        }
        let mut out = BytesMut::with_capacity((end - offset) as usize);
        for idx in first..=last {
            let base = idx * CHUNK;
            let c = self
                .chunk(ino, obj, idx, base..obj.size.min(base + CHUNK))
                .await?;
            if idx + 1 == chunks {
                // Offered by now (or refused): what the copy still misses is fetched again.
                self.fill_copy(ino, obj);
            }
            let from = offset.max(base) - base;
            let to = end.min(base + c.len() as u64) - base;
            if from >= to {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("{}: the agent answered fewer bytes than listed", obj.name),
                ));
            }
            if first == last {
                return Ok(c.slice(from as usize..to as usize));
            }
            out.extend_from_slice(&c[from as usize..to as usize]);
        }
        Ok(out.freeze())
    }

    /// A sequential reader reached the end of `obj`: the chunks its hot copy still misses (not offered: the
    /// copy's queue was full) are fetched again from the agent, which has them, and written in.
    fn fill_copy(self: &Arc<Self>, ino: u64, obj: &Object) {
        let Some(hot) = self.hot.get().cloned() else {
            return;
        };
        let missing = hot.claim_missing(ino);
        if missing.is_empty() {
            return;
        }
        tracing::debug!(name = %obj.name, chunks = missing.len(), "filling a hot copy");
        let me = self.clone();
        let obj = obj.clone();
        tokio::spawn(async move {
            for idx in missing {
                let range = idx * CHUNK..obj.size.min((idx + 1) * CHUNK);
                match me.fetch(&obj, range).await {
                    Ok(b) => hot.fill(ino, &obj, idx, b).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "a chunk of a hot copy could not be fetched");
                        hot.unclaim(ino, idx);
                    }
                }
            }
        });
    }

    /// Keep the agent fetching up to [`PREFETCH_WINDOW`] ahead of a sequential reader at `offset`: a new
    /// window is asked for once the reader is past half of the last one. Once a window reaches the end of
    /// the file, `next` (a large file) gets its first window, so the origin stays busy across the boundary.
    fn prefetch_ahead(
        self: &Arc<Self>,
        ino: u64,
        obj: &Object,
        offset: u64,
        next: Option<(u64, Object)>,
    ) {
        let (window, spill) = {
            let mut p = self.prefetched.lock();
            let done = p.iter().find(|(i, _)| *i == ino).map_or(0, |(_, to)| *to);
            if done > offset + PREFETCH_WINDOW / 2 {
                return;
            }
            let window = (done < obj.size).then(|| {
                let from = done.max(offset - offset % CHUNK);
                let to = obj.size.min(from + PREFETCH_WINDOW);
                record(&mut p, ino, to);
                from..to
            });
            // Once the window reaches this file's end, the next file's first window, in one request (up to
            // `max_request_size` at the agent): asking only for the rest of this window there would split
            // the next file into two requests where an origin's request may cost the whole object (moto).
            // Ahead of the reader: at most one and a half windows.
            let asked = window.as_ref().map_or(done, |w| w.end);
            let spill = next
                .filter(|(n, o)| {
                    o.size > WHOLE && asked >= obj.size && !p.iter().any(|(i, _)| i == n)
                })
                .map(|(n, o)| {
                    let len = o.size.min(PREFETCH_WINDOW);
                    record(&mut p, n, len);
                    (o, len)
                });
            (window, spill)
        };
        if let Some(w) = window {
            self.hint(obj, w);
        }
        if let Some((o, len)) = spill.filter(|(_, len)| *len > 0) {
            self.hint(&o, 0..len);
        }
    }

    /// Ask the agent, in the background, to fetch `range` of `obj`.
    fn hint(self: &Arc<Self>, obj: &Object, range: std::ops::Range<u64>) {
        let me = self.clone();
        let name = obj.name.clone();
        let etag = obj.etag.clone();
        tokio::spawn(async move {
            if let Err(e) = me.prefetch(&name, etag.as_deref(), range).await {
                tracing::debug!(error = %e, "a prefetch hint failed (reads fetch on demand)");
            }
        });
    }

    /// Ask the agent to start fetching `range` of object `name` into its cache.
    async fn prefetch(
        &self,
        name: &str,
        etag: Option<&str>,
        range: std::ops::Range<u64>,
    ) -> Result<()> {
        let location = format!("{}{name}", self.location);
        let url = self
            .client
            .url_with(data::Prefetch::PATH, &[("location", &location)])?;
        let mut req = self
            .client
            .request(Method::POST, url)
            .header("range", format!("bytes={}-{}", range.start, range.end - 1));
        if let Some(etag) = etag {
            req = req.header("if-match", format!("\"{}\"", etag.trim_matches('"')));
        }
        self.client.send(req, "prefetch").await.map(|_| ())
    }

    fn cached(&self, ino: u64, idx: u64) -> bool {
        self.chunks.lock().iter().any(|(k, _)| *k == (ino, idx))
    }

    /// Chunk `idx` of `obj` (bytes `range`), fetched once however many reads want it.
    async fn chunk(
        &self,
        ino: u64,
        obj: &Object,
        idx: u64,
        range: std::ops::Range<u64>,
    ) -> Result<Bytes> {
        let cell = {
            let mut chunks = self.chunks.lock();
            match chunks.iter().position(|(k, _)| *k == (ino, idx)) {
                Some(i) => {
                    let e = chunks.remove(i).expect("position is in range");
                    let cell = e.1.clone();
                    chunks.push_back(e);
                    cell
                }
                None => {
                    let cell: Cell = Arc::default();
                    chunks.push_back(((ino, idx), cell.clone()));
                    while chunks.len() > CHUNKS_KEPT {
                        chunks.pop_front();
                    }
                    cell
                }
            }
        };
        match cell.get_or_try_init(|| self.fetch(obj, range)).await {
            Ok(b) => {
                // Fetched now or kept from before: a copy made later (evicted, or of a file re-read) still
                // gets every chunk.
                if let Some(hot) = self.hot.get() {
                    hot.offer(ino, obj, idx, b.clone());
                }
                Ok(b.clone())
            }
            Err(e) => {
                // Not kept: the next read tries again.
                self.chunks
                    .lock()
                    .retain(|(k, c)| !(*k == (ino, idx) && Arc::ptr_eq(c, &cell)));
                Err(e)
            }
        }
    }

    /// Bytes `range` of `obj` from the agent, waiting out an agent that is away.
    async fn fetch(&self, obj: &Object, range: std::ops::Range<u64>) -> Result<Bytes> {
        let location = format!("{}{}", self.location, obj.name);
        let url = self
            .client
            .url_with(data::Read::PATH, &[("location", &location)])?;
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            let mut req = self
                .client
                .request(Method::GET, url.clone())
                .header("range", format!("bytes={}-{}", range.start, range.end - 1));
            if let Some(etag) = &obj.etag {
                req = req.header("if-match", format!("\"{}\"", etag.trim_matches('"')));
            }
            let res = match self.client.send(req, "read").await {
                Ok(resp) => self.body(resp, range.end - range.start).await.map_err(|e| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("reading {location} from the agent: {e}"),
                    )
                }),
                Err(e) => Err(e),
            };
            match res {
                Ok(b) if b.len() as u64 == range.end - range.start => return Ok(b),
                Ok(b) => {
                    return Err(Error::new(
                        ErrorKind::Corrupt,
                        format!(
                            "{location}: {} bytes answered for a range of {}",
                            b.len(),
                            range.end - range.start
                        ),
                    ));
                }
                Err(e) if e.is_retryable() && started.elapsed() < self.wait => {
                    tracing::debug!(error = %e, "the agent is away; reading again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A response's body of `len` bytes expected: in a pooled chunk buffer when it is about a chunk's size.
    async fn body(
        &self,
        mut resp: strata_client::Response,
        len: u64,
    ) -> std::result::Result<Bytes, strata_client::reqwest::Error> {
        if !(POOLED_MIN..=CHUNK).contains(&len) {
            return resp.bytes().await;
        }
        let mut buf = self.pool.take();
        while let Some(part) = resp.chunk().await? {
            // More than asked for grows the buffer (and fails the caller's length check), never overflows.
            buf.extend_from_slice(&part);
        }
        Ok(Bytes::from_owner(Pooled {
            buf,
            pool: self.pool.clone(),
        }))
    }
}

/// Note that inode `ino` was asked for up to `to` (the oldest file is forgotten past [`PREFETCH_TRACKED`]).
fn record(p: &mut VecDeque<(u64, u64)>, ino: u64, to: u64) {
    p.retain(|(i, _)| *i != ino);
    p.push_back((ino, to));
    while p.len() > PREFETCH_TRACKED {
        p.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_buffer_returns_to_the_pool_with_its_last_bytes_and_the_pool_is_bounded() {
        let pool = Arc::new(Pool::default());
        let mut held = Vec::new();
        for i in 0..BUFFERS_KEPT + 2 {
            let mut buf = pool.take();
            assert_eq!(buf.capacity(), CHUNK as usize);
            buf.extend_from_slice(&[i as u8; 100]);
            held.push(Bytes::from_owner(Pooled {
                buf,
                pool: pool.clone(),
            }));
        }
        // A slice outlives its parent: the buffer comes back with the last one.
        let part = held[0].slice(10..20);
        drop(held.remove(0));
        assert!(pool.0.lock().is_empty());
        assert_eq!(part.as_ref(), &[0u8; 10]);
        drop(part);
        assert_eq!(pool.0.lock().len(), 1);
        drop(held);
        assert_eq!(
            pool.0.lock().len(),
            BUFFERS_KEPT,
            "no more kept than the bound"
        );
        // Kept buffers come back empty, their memory reused; a buffer of another size is not kept.
        let again = pool.take();
        assert!(again.is_empty() && again.capacity() == CHUNK as usize);
        pool.give_back(Vec::with_capacity(10));
        assert_eq!(pool.0.lock().len(), BUFFERS_KEPT - 1);
    }
}
