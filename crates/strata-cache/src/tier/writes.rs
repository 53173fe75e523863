//! The disk tier's `put`: blocks queued for two writer tasks, and the blocks still in that queue (a lookup
//! finds them there, so a block the RAM tier did not keep is not read from the backend again while its
//! write waits).
//!
//! Ordinary fills queue each whole block (its buffer is page-aligned, so it reaches its file with `O_DIRECT`
//! without a copy). The queue is lossy: [`LOSSY_QUEUE_MAX`] blocks queue freely; past them a block holds a
//! [`Spill`] of the in-flight budget until written (at most half the budget in all: a queued block the RAM
//! tier did not keep is memory outside the tier), and with no budget or the queue full it is dropped. Warm-ups
//! wait for room in the whole queue instead, and for their write.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use strata_types::BlockKey;
use tokio::sync::{mpsc, oneshot};
use tokio_util::task::TaskTracker;

use crate::budget::{Budget, Spill};
use crate::disk::DiskTier;
use crate::policy::Digest;

/// Blocks an ordinary (lossy) fill may leave queued for the disk writers without holding budget.
pub(crate) const LOSSY_QUEUE_MAX: usize = 8;

/// Disk writer tasks.
const WRITERS: usize = 2;

/// The disk tier with its write queue.
pub(crate) struct DiskStore {
    tier: Arc<DiskTier>,
    tx: Mutex<Option<mpsc::Sender<DiskJob>>>,
    queued: Arc<Mutex<HashMap<Digest, Bytes>>>,
    /// What queued blocks past the free slots hold ([`Budget::try_spill`]).
    budget: Budget,
}

struct DiskJob {
    key: BlockKey,
    digest: Digest,
    data: Bytes,
    done: Option<oneshot::Sender<()>>,
    /// Written with `O_DIRECT` (an ordinary fill's page-aligned block: no copy, no page cache).
    direct: bool,
    /// A queued block beyond the free slots holds its size of the budget until written.
    _held: Option<Spill>,
}

/// How a block is written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// Lossy: dropped when the queue or the budget is short.
    Lossy,
    /// A warm-up's: waits for room in the queue, and the returned receiver fires once it is on disk.
    Wait,
}

/// What a [`DiskStore::put`] did.
pub(crate) enum Written {
    /// The policy did not admit the block, or the writers have stopped.
    Refused,
    /// Admitted but dropped: the lossy queue or the budget was short.
    Dropped,
    /// Queued.
    Queued,
    /// Queued; fires once the block is on disk.
    Waiting(oneshot::Receiver<()>),
}

impl DiskStore {
    /// The tier with `queue` slots for writes, written by writer tasks tracked by `tasks` that end once
    /// [`Self::stop`] is called (or the store is dropped) and the queue is drained.
    pub(crate) fn start(
        tier: Arc<DiskTier>,
        queue: usize,
        budget: Budget,
        tasks: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<DiskJob>(queue);
        let queued: Arc<Mutex<HashMap<Digest, Bytes>>> = Arc::default();
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..WRITERS {
            let (rx, disk, queued) = (rx.clone(), tier.clone(), queued.clone());
            tasks.spawn(async move {
                loop {
                    let job = rx.lock().await.recv().await;
                    let Some(job) = job else { break };
                    let disk = disk.clone();
                    let d = job.digest;
                    let _ = tokio::task::spawn_blocking(move || {
                        let _ = disk.write(&job.key, &job.digest, &job.data, job.direct);
                        if let Some(done) = job.done {
                            let _ = done.send(());
                        }
                    })
                    .await;
                    queued.lock().remove(&d);
                }
            });
        }
        Self {
            tier,
            tx: Mutex::new(Some(tx)),
            queued,
            budget,
        }
    }

    pub(crate) fn tier(&self) -> &Arc<DiskTier> {
        &self.tier
    }

    /// A block queued and not written yet.
    pub(crate) fn queued(&self, d: &Digest) -> Option<Bytes> {
        self.queued.lock().get(d).cloned()
    }

    /// Queue a block admitted by the tier's policy (`pin`: counted as pinned; `force`: admitted whatever the
    /// frequency filter says).
    pub(crate) async fn put(
        &self,
        key: &BlockKey,
        d: Digest,
        data: &Bytes,
        pin: bool,
        force: bool,
        mode: WriteMode,
    ) -> Written {
        let disk = &self.tier;
        if !disk.reserve(key, d, data.len() as u64, pin, force).admitted {
            return Written::Refused;
        }
        let tx = self.tx.lock().clone();
        let Some(tx) = tx else {
            disk.drop_entry(&d);
            return Written::Refused;
        };
        let wait = mode == WriteMode::Wait;
        let (done_tx, done_rx) = oneshot::channel();
        let mut job = DiskJob {
            key: key.clone(),
            digest: d,
            data: data.clone(),
            done: wait.then_some(done_tx),
            direct: !wait,
            _held: None,
        };
        // In the queued map before the writer can take it (it removes the entry once written).
        if wait {
            self.queued.lock().insert(d, data.clone());
            if tx.send(job).await.is_err() {
                self.queued.lock().remove(&d);
                disk.drop_entry(&d);
                return Written::Refused;
            }
            return Written::Waiting(done_rx);
        }
        // A queued block the RAM tier did not admit, or has evicted since, is memory outside the RAM tier: a
        // few may queue freely, more only with budget to hold (a fill faster than the disk writes is still
        // cached whole, within the memory bound, until the budget is needed for reading).
        let queued = tx.max_capacity() - tx.capacity();
        if queued >= LOSSY_QUEUE_MAX {
            job._held = self.budget.try_spill(data.len() as u64);
        }
        let queued_ok = queued < LOSSY_QUEUE_MAX || job._held.is_some();
        self.queued.lock().insert(d, data.clone());
        if !queued_ok || tx.try_send(job).is_err() {
            self.queued.lock().remove(&d);
            disk.drop_entry(&d);
            return Written::Dropped;
        }
        Written::Queued
    }

    /// Stop taking writes: the writers finish what is queued, then end.
    pub(crate) fn stop(&self) {
        self.tx.lock().take();
    }
}
