//! The prefetching sample stream of one consumer (rank × worker).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use strata_telemetry::Telemetry;
use strata_types::{Error, ErrorKind, IoContext, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::dataset::DatasetIndex;
use crate::order::{Cursor, EpochOrder, Partition, Shuffle, TailPolicy};
use crate::shard::Sample;
use crate::source::Source;

/// How a [`Loader`] orders and prefetches.
#[derive(Debug, Clone)]
pub struct LoaderOptions {
    /// Shuffle seed and window; `None` reads in dataset order.
    pub shuffle: Option<Shuffle>,
    /// What to do with an epoch's uneven tail.
    pub tail: TailPolicy,
    /// Bytes of samples read ahead of the consumer (fetched, decoded, not yet taken). A sample larger than
    /// this is still read, alone. Default 256 MiB.
    pub prefetch_bytes: u64,
    /// Samples fetched concurrently. Default 32.
    pub prefetch_samples: usize,
    /// Skip samples that fail to decode (counted in [`StreamStats::skipped`]) instead of failing.
    pub skip_corrupt: bool,
}

impl Default for LoaderOptions {
    fn default() -> Self {
        Self {
            shuffle: None,
            tail: TailPolicy::Drop,
            prefetch_bytes: 256 << 20,
            prefetch_samples: 32,
            skip_corrupt: false,
        }
    }
}

/// Counters of one stream, readable while it runs.
#[derive(Debug, Default)]
pub struct StreamStats {
    /// Samples handed to the consumer.
    pub samples: AtomicU64,
    /// Bytes of those samples.
    pub bytes: AtomicU64,
    /// Nanoseconds the consumer waited for a sample that was not ready (I/O stall).
    pub stall_ns: AtomicU64,
    /// Corrupt samples skipped (only with `skip_corrupt`).
    pub skipped: AtomicU64,
}

impl StreamStats {
    /// Time the consumer waited.
    pub fn stall(&self) -> Duration {
        Duration::from_nanos(self.stall_ns.load(Ordering::Relaxed))
    }
}

/// A sample handed to the consumer; holds its share of the prefetch window until dropped.
#[derive(Debug)]
pub struct Fetched {
    /// The sample.
    pub sample: Sample,
    /// Its global position in the epoch.
    pub position: u64,
    _permit: OwnedSemaphorePermit,
}

/// A dataset ready to stream: its index, where bytes come from, and how to order them.
#[derive(Debug, Clone)]
pub struct Loader {
    index: Arc<DatasetIndex>,
    source: Source,
    opts: LoaderOptions,
    telemetry: Arc<Telemetry>,
}

const KIB: u64 = 1024;

impl Loader {
    /// A loader over an opened index.
    pub fn new(
        index: Arc<DatasetIndex>,
        source: Source,
        opts: LoaderOptions,
        telemetry: Arc<Telemetry>,
    ) -> Self {
        Self {
            index,
            source,
            opts,
            telemetry,
        }
    }

    /// The dataset index.
    pub fn index(&self) -> &Arc<DatasetIndex> {
        &self.index
    }

    /// The options.
    pub fn options(&self) -> &LoaderOptions {
        &self.opts
    }

    /// The source of bytes.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The order of `epoch`.
    pub fn order(&self, epoch: u64) -> EpochOrder {
        EpochOrder::new(&self.index.counts(), self.opts.shuffle, epoch)
    }

    /// Stream this consumer's samples of `epoch`, resumed at global position `start`, on `rt`.
    pub fn stream(
        &self,
        rt: &tokio::runtime::Handle,
        ctx: IoContext,
        epoch: u64,
        start: u64,
        part: Partition,
    ) -> Result<SampleStream> {
        part.validate()?;
        let order = self.order(epoch);
        if start > order.len() {
            return Err(Error::invalid_input(format!(
                "resume position {start} is past the end of the epoch ({} samples)",
                order.len()
            )));
        }
        let (tx, rx) = mpsc::channel(self.opts.prefetch_samples.max(1));
        let cancel = CancellationToken::new();
        let stats = Arc::new(StreamStats::default());
        let window_units = self
            .opts
            .prefetch_bytes
            .div_ceil(KIB)
            .clamp(1, u64::from(u32::MAX)) as u32;
        let task = Producer {
            loader: self.clone(),
            ctx,
            order,
            start,
            part,
            window: Arc::new(Semaphore::new(window_units as usize)),
            window_units,
            tx,
            cancel: cancel.clone(),
            stats: stats.clone(),
        };
        rt.spawn(task.run());
        Ok(SampleStream {
            rx,
            cancel,
            stats,
            telemetry: self.telemetry.clone(),
            rank: part.rank.to_string(),
        })
    }
}

struct Producer {
    loader: Loader,
    ctx: IoContext,
    order: EpochOrder,
    start: u64,
    part: Partition,
    window: Arc<Semaphore>,
    window_units: u32,
    tx: mpsc::Sender<Result<Fetched>>,
    cancel: CancellationToken,
    stats: Arc<StreamStats>,
}

type Pending = tokio::task::JoinHandle<(u64, Result<Sample>, OwnedSemaphorePermit)>;

impl Producer {
    async fn run(self) {
        let len = self.order.len();
        let mut positions = self.part.positions(len, self.start, self.loader.opts.tail);
        let mut cursor = Cursor::new(&self.order);
        let mut inflight: VecDeque<Pending> = VecDeque::new();
        let conc = self.loader.opts.prefetch_samples.max(1);
        let mut more = true;
        let mut window_seen: Option<u64> = None;
        loop {
            // Admit new fetches while there is room; each takes its bytes from the window first, in order, so
            // the head of the queue always holds its share and the window can never deadlock.
            while more && inflight.len() < conc {
                let Some(p) = positions.next() else {
                    more = false;
                    break;
                };
                // Entering a new window: ask for its bytes as large sequential reads, instead of one block at a
                // time in the window's random order.
                let w = p / self.prefetch_window();
                if window_seen != Some(w) {
                    window_seen = Some(w);
                    self.prefetch_window_bytes(w).await;
                }
                let (shard, idx) = cursor.locate(p);
                let size = match self.sample_len(shard, idx).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = self.tx.send(Err(e)).await;
                        return;
                    }
                };
                let units = (size.div_ceil(KIB).max(1)).min(u64::from(self.window_units)) as u32;
                // Waiting here is fine: permits come back as the consumer drops samples already sent.
                let permit = loop {
                    if let Ok(p) = self.window.clone().try_acquire_many_owned(units) {
                        break p;
                    }
                    // The window is full: hand over the oldest fetch (its bytes are released when the consumer
                    // drops it), or, with nothing in flight, wait for the consumer to drop what it holds.
                    match inflight.pop_front() {
                        Some(head) => {
                            if !self.deliver(head).await {
                                return;
                            }
                        }
                        None => {
                            let r = tokio::select! {
                                p = self.window.clone().acquire_many_owned(units) => p,
                                _ = self.cancel.cancelled() => return,
                            };
                            match r {
                                Ok(p) => break p,
                                Err(_) => return,
                            }
                        }
                    }
                };
                let loader = self.loader.clone();
                let ctx = self.ctx.clone();
                inflight.push_back(tokio::spawn(async move {
                    let r = loader.index.sample(&loader.source, &ctx, shard, idx).await;
                    (p, r, permit)
                }));
            }
            let Some(head) = inflight.pop_front() else {
                return; // done
            };
            if !self.deliver(head).await {
                return;
            }
        }
    }

    /// Samples per prefetch window: the shuffle window, or 1,024 samples when not shuffling.
    fn prefetch_window(&self) -> u64 {
        u64::from(self.loader.opts.shuffle.map_or(1024, |s| s.window.max(1)))
    }

    /// Ask for the window's bytes, shard by shard, as large sequential reads, and return once they are asked
    /// for (not fetched): the window's first demand reads then find their blocks already coming, instead of
    /// racing the hint with one backend request per block.
    async fn prefetch_window_bytes(&self, w: u64) {
        let size = self.prefetch_window();
        let spans = self.order.stream_spans(w * size..(w + 1) * size);
        let (loader, ctx) = (&self.loader, &self.ctx);
        let hints = spans.into_iter().map(|(shard, samples)| async move {
            let s = &loader.index.shards[shard];
            // An MDS shard whose header is still unread and that the window mostly covers: one request for
            // the whole shard, header included, rather than one for the header's block and one for the rest.
            if let Some(size) = s.size
                && !s.offsets_known()
                && 2 * (samples.end - samples.start) >= s.samples
            {
                if let Err(e) = loader.source.prefetch(ctx, s, 0..size).await {
                    tracing::debug!(shard = %s.key, error = %e, "prefetch hint failed");
                }
                return;
            }
            let Ok(offs) = loader.source.offsets(ctx, s).await else {
                return;
            };
            let range = offs[samples.start as usize]..offs[samples.end as usize];
            if let Err(e) = loader.source.prefetch(ctx, s, range).await {
                tracing::debug!(shard = %s.key, error = %e, "prefetch hint failed");
            }
        });
        // A window can span thousands of small shards: at most 16 hints in flight.
        let all = futures::StreamExt::for_each_concurrent(futures::stream::iter(hints), 16, |h| h);
        tokio::select! {
            _ = all => {}
            _ = self.cancel.cancelled() => {}
        }
    }

    async fn sample_len(&self, shard: usize, idx: u64) -> Result<u64> {
        let s = &self.loader.index.shards[shard];
        let offs = self.loader.source.offsets(&self.ctx, s).await?;
        Ok(offs[idx as usize + 1] - offs[idx as usize])
    }

    /// Wait for a fetch and hand it over; false when the stream is over (consumer gone, or an error sent).
    async fn deliver(&self, h: Pending) -> bool {
        let (position, result, permit) = tokio::select! {
            r = h => match r {
                Ok(v) => v,
                Err(e) => {
                    let _ = self.tx.send(Err(Error::internal(format!("sample fetch task failed: {e}")))).await;
                    return false;
                }
            },
            _ = self.cancel.cancelled() => return false,
        };
        let msg = match result {
            Ok(sample) => Ok(Fetched {
                sample,
                position,
                _permit: permit,
            }),
            Err(e) if e.kind() == ErrorKind::Corrupt && self.loader.opts.skip_corrupt => {
                self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                self.loader.telemetry.metrics().record_loader(
                    &self.part.rank.to_string(),
                    0,
                    0.0,
                    1,
                );
                tracing::warn!(position, error = %e, "skipping corrupt sample");
                return true;
            }
            Err(e) => Err(e),
        };
        let failed = msg.is_err();
        tokio::select! {
            r = self.tx.send(msg) => r.is_ok() && !failed,
            _ = self.cancel.cancelled() => false,
        }
    }
}

/// One consumer's samples, in order. Dropping it stops the prefetching.
#[derive(Debug)]
pub struct SampleStream {
    rx: mpsc::Receiver<Result<Fetched>>,
    cancel: CancellationToken,
    stats: Arc<StreamStats>,
    telemetry: Arc<Telemetry>,
    rank: String,
}

impl SampleStream {
    /// The next sample, blocking the calling (non-async) thread; time spent waiting counts as stall.
    pub fn next_blocking(&mut self) -> Option<Result<Fetched>> {
        let r = match self.rx.try_recv() {
            Ok(v) => Some(v),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) => {
                let t = Instant::now();
                let r = self.rx.blocking_recv();
                self.stalled(t.elapsed());
                r
            }
        };
        self.count(&r);
        r
    }

    /// The next sample (async).
    pub async fn next(&mut self) -> Option<Result<Fetched>> {
        let r = match self.rx.try_recv() {
            Ok(v) => Some(v),
            Err(mpsc::error::TryRecvError::Disconnected) => None,
            Err(mpsc::error::TryRecvError::Empty) => {
                let t = Instant::now();
                let r = self.rx.recv().await;
                self.stalled(t.elapsed());
                r
            }
        };
        self.count(&r);
        r
    }

    fn stalled(&self, d: Duration) {
        self.stats
            .stall_ns
            .fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.telemetry
            .metrics()
            .record_loader(&self.rank, 0, d.as_secs_f64(), 0);
    }

    fn count(&self, r: &Option<Result<Fetched>>) {
        if let Some(Ok(f)) = r {
            self.stats.samples.fetch_add(1, Ordering::Relaxed);
            self.stats
                .bytes
                .fetch_add(f.sample.bytes, Ordering::Relaxed);
            self.telemetry
                .metrics()
                .record_loader(&self.rank, 1, 0.0, 0);
        }
    }

    /// Counters of this stream.
    pub fn stats(&self) -> &Arc<StreamStats> {
        &self.stats
    }
}

impl Drop for SampleStream {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
