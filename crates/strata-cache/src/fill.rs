//! Fills: single-flight reads of blocks and runs of blocks from the backend (each block handed out as it
//! arrives), their admission into the tiers, and the disk writers they feed.

use crate::budget::Share;
use crate::disk::DiskTier;
use crate::policy::Digest;
use crate::policy::DigestMap;
use crate::state::BlockCache;
use crate::state::Inner;
use crate::state::ObjState;
use bytes::Bytes;
use futures::FutureExt;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::future::Shared;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use strata_types::BlockKey;
use strata_types::Error;
use strata_types::ErrorKind;
use strata_types::IoContext;
use strata_types::Op;
use strata_types::Result;
use tokio::sync::oneshot;

pub(crate) type SharedFetch = Shared<BoxFuture<'static, Result<Bytes>>>;

/// A response body from a backend.
pub(crate) type ByteStream = futures::stream::BoxStream<'static, Result<Bytes>>;

/// How a fill treats admission and the disk queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FillMode {
    /// A reader's fill (demand, prefetch, readahead, an open's first bytes): the caller holds the budget, if
    /// any; normal admission; lossy disk write.
    Readahead,
    /// Explicit warm-up: wait for budget; forced disk admission; wait for the disk write.
    Warm,
    /// A block another agent asked for ([`crate::peer`]): as `Readahead`, but read from the origin only,
    /// never asked of a peer in turn.
    Peer,
}

/// A team and a job (`""`: no team).
pub(crate) type TeamJob = (Arc<str>, Arc<str>);

/// Fills in flight: each block's shared fetch (single-flight: a miss of a block in flight joins it), and the
/// count of fills per (team, job). Its fields are this module's alone.
#[derive(Default)]
pub(crate) struct Flights {
    blocks: Mutex<DigestMap<SharedFetch>>,
    jobs: Mutex<HashMap<TeamJob, usize>>,
}

impl BlockCache {
    /// Fetch a block from the backend, or join the fetch already in flight. The fetch runs as its own task, so
    /// a caller that gives up does not cancel it for the others.
    pub(crate) fn fetch(
        &self,
        ctx: &IoContext,
        obj: &Arc<ObjState>,
        index: u64,
        mode: FillMode,
        permit: Option<Share>,
    ) -> SharedFetch {
        let mut v = self.fetch_run(ctx, obj, index, 1, mode, permit, None);
        v.pop().unwrap_or_else(|| {
            futures::future::ready(Err(Error::internal("empty fetch run")))
                .boxed()
                .shared()
        })
    }

    /// Fetch `count` consecutive blocks from `first` with one backend request (fewer, larger requests for
    /// sequential fills), registering each block for single-flight. If any of them is already in flight or in
    /// RAM, falls back to block-by-block fetches that join what is in flight. `given`: the body of a request
    /// already made for exactly these blocks (an open that read the object's start), used for the first
    /// attempt instead of a new request.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn fetch_run(
        &self,
        ctx: &IoContext,
        obj: &Arc<ObjState>,
        first: u64,
        count: u64,
        mode: FillMode,
        permit: Option<Share>,
        given: Option<ByteStream>,
    ) -> Vec<SharedFetch> {
        let keys: Vec<(BlockKey, Digest)> = (first..first + count)
            .map(|i| {
                let k = BlockKey::new(obj.id.clone(), i);
                let d = k.digest();
                (k, d)
            })
            .collect();
        let mut inflight = self.inner.flights.blocks.lock();
        if count > 1 {
            let busy = keys.iter().any(|(_, d)| inflight.contains_key(d))
                || self
                    .inner
                    .tiers
                    .ram()
                    .contains_any(keys.iter().map(|(_, d)| d));
            if busy {
                drop(inflight);
                drop(permit);
                return (first..first + count)
                    .map(|i| self.fetch(ctx, obj, i, mode, None))
                    .collect();
            }
        } else if let Some((_, d)) = keys.first() {
            if let Some(f) = inflight.get(d) {
                self.inner.counters.joins.fetch_add(1, Ordering::Relaxed);
                return vec![f.clone()];
            }
            // The fill may have finished between our lookup and taking this lock.
            let done = self.inner.tiers.in_memory(d);
            if let Some(b) = done {
                return vec![futures::future::ready(Ok(b)).boxed().shared()];
            }
        }
        let this = self.clone();
        let (ctx, obj) = (ctx.clone(), obj.clone());
        let digests: Vec<Digest> = keys.iter().map(|(_, d)| *d).collect();
        let guard_digests = digests.clone();
        // Each block resolves as soon as it is complete, not when the whole run is: a reader of a 50 MiB range
        // sends its first block while the rest is still arriving.
        let (mut done, waits): (Vec<_>, Vec<_>) = (0..keys.len())
            .map(|_| {
                let (tx, rx) = oneshot::channel::<Result<Bytes>>();
                (Some(tx), rx)
            })
            .unzip();
        let job = JobFill::start(&self.inner, &ctx);
        self.inner.tasks.spawn(async move {
            let guard = InflightGuard {
                cache: this.clone(),
                digests: guard_digests,
                _job: job,
            };
            let cancel = this.inner.cancel.clone();
            let mut given = given;
            let r = tokio::select! {
                r = this.fill_run(&ctx, &obj, &keys, mode, permit, &mut done, &mut given) => r,
                _ = cancel.cancelled() => Err(Error::new(ErrorKind::Cancelled, "cache is shutting down")),
            };
            let r = r.and_then(|_| {
                if done.iter().any(Option::is_some) {
                    Err(Error::internal("fill returned too few blocks"))
                } else {
                    Ok(())
                }
            });
            // Out of the in-flight map before the readers hear of a failure: a read that starts once it has
            // seen the error starts a new fill instead of joining the failed one.
            drop(guard);
            if let Err(e) = r {
                for tx in done.iter_mut().filter_map(Option::take) {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        });
        let mut out = Vec::with_capacity(count as usize);
        for (d, rx) in digests.into_iter().zip(waits) {
            let f = rx
                .map(|r| r.unwrap_or_else(|_| Err(Error::internal("block fill task failed"))))
                .boxed()
                .shared();
            inflight.insert(d, f.clone());
            out.push(f);
        }
        out
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn fill_run(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        mode: FillMode,
        permit: Option<Share>,
        done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
        given: &mut Option<ByteStream>,
    ) -> Result<()> {
        let bs = self.inner.cfg.block_size.bytes();
        let (Some((first, _)), Some((last, _))) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        let start = first.index * bs;
        let end = ((last.index + 1) * bs).min(obj.meta.size);
        // Readahead's budget is held by the reader's prefetch buffer until the block is consumed. A warm-up
        // holds its run's: the run's blocks, handed out as they complete, stay in memory with their in-flight
        // entries until the run ends.
        let _permit = match (permit, mode) {
            (Some(p), _) => Some(p),
            (None, FillMode::Readahead | FillMode::Peer) => None,
            (None, FillMode::Warm) => Some(
                self.acquire_budget(end - start)
                    .await
                    .ok_or_else(|| Error::new(ErrorKind::Cancelled, "cache is shutting down"))?,
            ),
        };
        // In a cluster the blocks other agents own are asked of them while this agent's own runs are read from
        // the origin; a block no peer served is read from the origin on its own.
        let peers = match (given.is_none(), mode, self.peers()) {
            (true, FillMode::Readahead | FillMode::Warm, Some(p)) => Some(p),
            _ => None,
        };
        let r = match peers {
            None => {
                self.origin_runs(ctx, obj, keys, mode, done, given.take(), None)
                    .await
            }
            Some(peers) => {
                let local: Vec<bool> = keys.iter().map(|(k, _)| peers.is_local(k)).collect();
                let asked: Vec<_> = (0..keys.len())
                    .filter(|&i| !local[i])
                    .map(|i| (i, done[i].take()))
                    .collect();
                let (from_peers, own) = futures::join!(
                    self.fill_from_peers(ctx, obj, keys, mode, asked, peers),
                    self.origin_runs(ctx, obj, keys, mode, done, None, Some(&local)),
                );
                own.and(from_peers)
            }
        };
        let c = &self.inner.counters;
        match r {
            // Counted by `receive_run` before the last block goes to its readers.
            Ok(()) => Ok(()),
            Err(e) => {
                c.fill_errors.fetch_add(1, Ordering::Relaxed);
                if e.kind() == ErrorKind::PreconditionFailed {
                    c.stale.fetch_add(1, Ordering::Relaxed);
                    // The cached metadata names a version that is gone: the next open asks the backend, so a
                    // changed object is a new version at once, not an error until the TTL runs out.
                    self.invalidate(&obj.backend, &obj.meta.key);
                    return Err(e.context(format!(
                        "{} changed at the backend while being read; reopen it to read the new version",
                        obj.meta.key
                    )));
                }
                Err(e)
            }
        }
    }

    /// Read the blocks of `keys` that `only` selects (all without it) from the origin, one request per run of
    /// consecutive ones; the first failure ends it.
    #[allow(clippy::too_many_arguments)]
    async fn origin_runs(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        mode: FillMode,
        done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
        mut given: Option<ByteStream>,
        only: Option<&[bool]>,
    ) -> Result<()> {
        let pick = |i: usize| only.is_none_or(|o| o[i]);
        let mut i = 0;
        while i < keys.len() {
            if !pick(i) {
                i += 1;
                continue;
            }
            let mut j = i + 1;
            while j < keys.len() && pick(j) {
                j += 1;
            }
            self.origin_run(ctx, obj, &keys[i..j], mode, &mut done[i..j], given.take())
                .await?;
            i = j;
        }
        Ok(())
    }

    /// One backend request for a run of consecutive blocks. A mid-stream failure (a reset connection) is
    /// retried under the backend's retry policy from the first block it had not completed: the blocks before
    /// it are already cached and handed out, and correct (the ETag is pinned), so a long run cut near its end
    /// reads one block again, not the run.
    pub(crate) async fn origin_run(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        mode: FillMode,
        done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
        mut given: Option<ByteStream>,
    ) -> Result<()> {
        let bs = self.inner.cfg.block_size.bytes();
        let (Some((first, _)), Some((last, _))) = (keys.first(), keys.last()) else {
            return Ok(());
        };
        let end = ((last.index + 1) * bs).min(obj.meta.size);
        let policy = obj.backend.retry_policy();
        let mut attempt = 0u32;
        let mut complete = 0usize;
        loop {
            let start = keys.get(complete).map_or(first.index, |k| k.0.index) * bs;
            match self
                .receive_run(
                    ctx,
                    obj,
                    keys,
                    &mut complete,
                    start..end,
                    mode,
                    done,
                    given.take(),
                )
                .await
            {
                Ok(()) => return Ok(()),
                // (Every block complete and still an error: the backend sent more than asked; not retried.)
                Err(e)
                    if e.is_retryable()
                        && attempt < policy.max_retries
                        && complete < keys.len() =>
                {
                    attempt += 1;
                    self.inner.telemetry.record_retry(Op::Get, e.kind());
                    tokio::time::sleep(policy.backoff(attempt)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One attempt at a run: stream `start..end` (from the start of block `*complete`, the first one earlier
    /// attempts did not complete; advanced as blocks complete) and cut it into blocks as the bytes arrive;
    /// each completed block goes to the RAM tier and the disk queue at once, while it is still hot in the CPU
    /// cache, and to its waiters (`done[i]`, taken when sent: a retried run does not send a block twice).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn receive_run(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        complete: &mut usize,
        span: Range<u64>,
        mode: FillMode,
        done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
        given: Option<ByteStream>,
    ) -> Result<()> {
        let bs = self.inner.cfg.block_size.bytes();
        let (start, end) = (span.start, span.end);
        let mut stream = match given {
            Some(s) => s,
            None => {
                obj.backend
                    .get_range_stream(ctx, &obj.meta.key, start..end, obj.meta.etag.as_deref())
                    .await?
            }
        };
        let mut out = *complete;
        let mut got = 0u64;
        let mut written = Vec::new();
        let block_len =
            |i: usize| (((keys[i].0.index + 1) * bs).min(end) - keys[i].0.index * bs) as usize;
        let pool = &self.inner.pool;
        let mut warm_blocks = Vec::new();
        let mut cur = pool.take(keys.get(out).map_or(0, |_| block_len(out)));
        // A warm-up's block goes to its file a piece at a time as it arrives, while the piece is in the CPU's
        // cache (see `HotWrite`).
        let hot_disk = match (self.inner.tiers.disk(), mode) {
            (Some(disk), FillMode::Warm) => Some(disk.clone()),
            _ => None,
        };
        let mut hot: Option<HotWrite> = None;
        // A fill's whole block goes to the disk writers once complete: lossy, `O_DIRECT` straight from the
        // block's page-aligned memory, with no copy. A warm-up's goes to its file as it arrives (`HotWrite`,
        // forced admission, through the page cache); one it could not write that way (another fill had
        // reserved it, the file could not be made) is queued whole for the writers, forced, and waited for
        // below.
        // Blocks completed before a failure are still reported (their queued writes waited for) before it is
        // returned: the retry starts after them.
        let r: Result<()> = async {
            while let Some(chunk) = stream.next().await {
                let mut chunk = chunk?;
                while !chunk.is_empty() {
                    let i = out;
                    if i >= keys.len() {
                        return Err(Error::new(
                            ErrorKind::Unavailable,
                            format!(
                                "{}: the backend sent more bytes than requested",
                                obj.meta.key
                            ),
                        ));
                    }
                    let (key, d) = &keys[i];
                    if cur.len() == 0
                        && let Some(disk) = &hot_disk
                    {
                        hot = HotWrite::start(
                            disk,
                            key,
                            *d,
                            block_len(i) as u64,
                            self.is_pinned(key),
                        );
                    }
                    let take = (block_len(i) - cur.len()).min(chunk.len());
                    cur.extend_from_slice(&chunk.split_to(take));
                    let whole = cur.len() == block_len(i);
                    if let Some(h) = &mut hot
                        && (whole || cur.len() - h.at >= HOT_PIECE)
                    {
                        let piece = &cur.filled()[h.at..];
                        h.at = cur.len();
                        let r = h.file.as_mut().map(|f| f.append_hot(piece));
                        if let Some(Err(e)) = r
                            && let Some(h) = hot.take()
                        {
                            h.fail(&e);
                        }
                    }
                    if whole {
                        let block = std::mem::take(&mut cur).freeze();
                        self.insert_ram(
                            key,
                            *d,
                            &block,
                            // Forced in RAM too while its disk write is queued (a warm-up: only
                            // without a disk tier, which it waits for).
                            self.admit_forced(key, mode)
                                && (mode != FillMode::Warm || !self.inner.tiers.has_disk()),
                        );
                        let on_disk = match hot.take() {
                            Some(h) => h.finish(),
                            None => false,
                        };
                        if !on_disk && let Some(w) = self.store_disk(key, *d, &block, mode).await {
                            written.push(w);
                        }
                        got += block.len() as u64;
                        out += 1;
                        if out == keys.len() {
                            // Counted before the last block is handed out: a reader that has every byte sees
                            // the fill in the stats.
                            let c = &self.inner.counters;
                            c.fill_requests.fetch_add(1, Ordering::Relaxed);
                            c.fills.fetch_add(keys.len() as u64, Ordering::Relaxed);
                            let run = end - keys[0].0.index * bs;
                            c.fill_bytes.fetch_add(run, Ordering::Relaxed);
                            self.note_job(ctx, crate::stats::JobBytes::Origin, run);
                        }
                        *complete = out;
                        // A warm-up reports a block only once it is on disk: at once when written as it
                        // arrived, else once its queued write is done (below).
                        if mode == FillMode::Warm && !on_disk && self.inner.tiers.has_disk() {
                            warm_blocks.push((i, block));
                            if warm_blocks.len() as u64 >= self.run_blocks() {
                                report_written(&mut written, &mut warm_blocks, done).await;
                            }
                        } else if let Some(tx) = done[i].take() {
                            let _ = tx.send(Ok(block));
                        }
                        if i + 1 < keys.len() {
                            cur = pool.take(block_len(i + 1));
                        }
                    }
                }
            }
            if out != keys.len() {
                let got = got + cur.len() as u64;
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "{}: short read, got {got} of {} bytes",
                        obj.meta.key,
                        end - start
                    ),
                ));
            }
            Ok(())
        }
        .await;
        report_written(&mut written, &mut warm_blocks, done).await;
        r
    }

    /// Read one block: tiers first, then the backend.
    ///
    /// A reader's own miss takes in-flight budget when it is free but does not wait for it: the reader may
    /// hold budget for blocks it prefetched, and readers waiting on each other's budget would deadlock. So the
    /// budget bounds prefetch, readahead and warm-ups strictly, and demand reads to one block per reader
    /// beyond it.
    pub(crate) async fn block(
        &self,
        ctx: &IoContext,
        obj: &Arc<ObjState>,
        index: u64,
    ) -> Result<Bytes> {
        let key = BlockKey::new(obj.id.clone(), index);
        let d = obj.digest(index);
        if let Some((fill, share)) = self.take_staged(&d) {
            let r = fill.await;
            drop(share);
            if let Ok(b) = &r {
                self.count_filled_read(ctx, &obj.id, b.len() as u64);
                return r;
            }
        }
        if let Some(b) = self.lookup(ctx, &key, &d).await {
            return Ok(b);
        }
        self.fill_missed(ctx, obj, index, FillMode::Readahead).await
    }

    /// A block whose lookup missed: fetched, or joined in flight, with in-flight budget when it is free (see
    /// [`Self::block`]); its bytes are counted as missed once they are here (the lookup counted the miss).
    pub(crate) async fn fill_missed(
        &self,
        ctx: &IoContext,
        obj: &Arc<ObjState>,
        index: u64,
        mode: FillMode,
    ) -> Result<Bytes> {
        let bs = self.inner.cfg.block_size.bytes();
        let len = ((index + 1) * bs).min(obj.meta.size) - index * bs;
        let permit = self.inner.budget.try_take(len);
        let r = self.fetch(ctx, obj, index, mode, permit).await;
        if let Ok(b) = &r {
            self.inner
                .counters
                .miss_bytes
                .fetch_add(b.len() as u64, Ordering::Relaxed);
        }
        r
    }

    /// Blocks per backend request for sequential fills.
    pub(crate) fn run_blocks(&self) -> u64 {
        let cfg = &self.inner.cfg;
        (cfg.max_request_size.bytes() / cfg.block_size.bytes()).max(1)
    }

    /// The most blocks one request of a prefetch, an open that reads ahead or a warm-up asks for: half the
    /// in-flight budget (at least one block), which such a run holds whole.
    pub(crate) fn max_run_blocks(&self) -> u64 {
        let cfg = &self.inner.cfg;
        (cfg.inflight_budget.bytes() / 2 / cfg.block_size.bytes()).max(1)
    }
}

/// Wait for a warm-up's queued block writes, then hand out the blocks that waited for them.
async fn report_written(
    written: &mut Vec<oneshot::Receiver<()>>,
    blocks: &mut Vec<(usize, Bytes)>,
    done: &mut [Option<oneshot::Sender<Result<Bytes>>>],
) {
    for w in written.drain(..) {
        let _ = w.await;
    }
    for (i, block) in blocks.drain(..) {
        if let Some(tx) = done[i].take() {
            let _ = tx.send(Ok(block));
        }
    }
}

/// Bytes of a warm-up's block written to its file at a time, as they arrive.
const HOT_PIECE: usize = 256 << 10;

/// A warm-up's block being written to its file as it arrives: reserved in the disk tier (forced) at the
/// block's first bytes, each [`HOT_PIECE`] checksummed and written through the page cache right after it is
/// copied into the block's buffer, while it is still in the CPU's cache, and completed with the block.
///
/// Why on the fill's own task and not the disk writers': a block handed to a writer whole is cold by the time
/// it is written, and its checksum and the copy through the staging buffer read it from memory twice more.
/// Writing pieces as they arrive took a claim's staging from 3.4-4.0 s of agent CPU per 2 GiB to 3.0-3.1 s
/// (bench/RESULTS.md); handing each piece to a thread (`block_in_place`) cost that gain back in hand-offs.
/// The price: a warm-up's task blocks for each piece's `pwrite` (256 KiB into the page cache), which the
/// kernel may slow when dirty pages pile up. Only warm-ups do this; readers' fills keep the disk writers.
///
/// Released again (the reservation dropped, the temporary file removed) if it is dropped unfinished: a body
/// cut mid-block, whose run is retried, or a cancelled fill.
struct HotWrite {
    disk: Arc<DiskTier>,
    d: Digest,
    file: Option<crate::disk::BlockFile>,
    /// Bytes of the block handed to the file.
    at: usize,
}

impl HotWrite {
    fn start(disk: &Arc<DiskTier>, key: &BlockKey, d: Digest, len: u64, pin: bool) -> Option<Self> {
        if !disk.reserve(key, d, len, pin, true).admitted {
            return None;
        }
        let mut h = HotWrite {
            disk: disk.clone(),
            d,
            file: None,
            at: 0,
        };
        match disk.begin(key, &d, len, false) {
            Ok(f) => {
                h.file = Some(f);
                Some(h)
            }
            Err(e) => {
                h.fail(&e);
                None
            }
        }
    }

    /// Complete the file; whether the block is on disk.
    fn finish(mut self) -> bool {
        match self.file.take() {
            Some(f) => self.disk.finish(f).is_ok(),
            None => false,
        }
    }

    fn fail(mut self, e: &Error) {
        self.file = None;
        self.disk.fail(&self.d, e);
    }
}

impl Drop for HotWrite {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            self.disk.drop_entry(&self.d);
        }
    }
}

pub(crate) struct InflightGuard {
    pub(crate) cache: BlockCache,
    pub(crate) digests: Vec<Digest>,
    pub(crate) _job: Option<JobFill>,
}

/// A fill in flight for a team's job ([`BlockCache::job_fills`]), counted until dropped.
pub(crate) struct JobFill {
    inner: Arc<Inner>,
    key: TeamJob,
}

impl JobFill {
    /// Count a fill for `ctx`'s job (none when it names no job).
    pub(crate) fn start(inner: &Arc<Inner>, ctx: &IoContext) -> Option<Self> {
        let key = (
            ctx.team.clone().unwrap_or_else(|| Arc::from("")),
            ctx.job.clone()?,
        );
        *inner.flights.jobs.lock().entry(key.clone()).or_default() += 1;
        Some(Self {
            inner: inner.clone(),
            key,
        })
    }
}

impl Drop for JobFill {
    fn drop(&mut self) {
        let mut m = self.inner.flights.jobs.lock();
        if let Some(n) = m.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.key);
            }
        }
    }
}

impl BlockCache {
    /// Fills from the backend in flight for `team`'s job `job`: their bytes reach the job's I/O counters
    /// ([`CacheStats::by_job`]) when they end (a job's final accounting waits for them).
    pub fn job_fills(&self, team: &str, job: &str) -> usize {
        self.inner
            .flights
            .jobs
            .lock()
            .get(&(Arc::from(team), Arc::from(job)))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut inflight = self.cache.inner.flights.blocks.lock();
        for d in &self.digests {
            inflight.remove(d);
        }
    }
}
