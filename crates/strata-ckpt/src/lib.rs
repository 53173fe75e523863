//! Strata's checkpoint manager.
//!
//! A checkpoint is a run id and a step; every rank saves one shard (a safetensors file of named tensors and
//! blobs, [`format`]); a [`Manifest`] lists every shard with its size and blake3 and is written last and
//! atomically, so a checkpoint exists exactly when its manifest does ([`tier`]).
//!
//! [`Checkpointer::save`] takes tensors already copied into memory the caller no longer touches (the only part
//! that blocks training) and returns a [`SaveHandle`]; a background task writes the shard to the local tier
//! (fsync, rename), records it, and rank 0 commits the local manifest once every rank's record is there; then,
//! on the upload schedule, the same to the object store (multipart, manifest put-if-absent). Retention runs
//! after each commit. Failures go to the handle, the log and the metrics: they never reach the training loop.
//!
//! Restore ([`Checkpointer::load`], [`Checkpointer::load_latest`]) takes the newest step committed in any tier,
//! reads this rank's shard from the local tier, else the object store, verifies its blake3, and on a mismatch
//! tries the next tier; `load_latest` falls back to older checkpoints when every copy of the newest is bad.
//!
//! One room, though long: save, commit, retention, finishing a previous process's uploads and restore all
//! work on the same `Checkpointer` state and ordering (what is durable where); the tiers, formats, manifests,
//! handoff and quota each have their own module already. Restore is the candidate to move out next.

pub mod format;
pub mod handoff;
mod journal;
pub mod manifest;
pub mod ops;
pub mod quota;
pub mod tier;
mod unsent;
pub mod verify;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use strata_types::{Error, ErrorKind, IoContext, Result};
use tokio::sync::{Semaphore, watch};

pub use format::Tensor;
pub use manifest::{Manifest, ShardRecord};
pub use tier::Tier;

/// How long a restore waits for a tier other than the local one (peers, the object store) to list its
/// checkpoints before going on without what it has not said.
pub const TIER_WAIT: Duration = Duration::from_secs(10);

/// The refusal of a save of a step `tier` has committed.
fn already_committed(run: &str, step: u64, tier: &Tier) -> Error {
    Error::new(
        ErrorKind::AlreadyExists,
        format!(
            "step {step} of run {run} is already committed in {}: a committed checkpoint is never overwritten (save another step, or delete this one first)",
            tier.describe()
        ),
    )
}

/// Where a streamed save's tensors go, in the order of its specs (see [`Checkpointer::save_stream`]).
#[derive(Debug)]
pub struct TensorSink {
    tx: Option<std::sync::mpsc::Sender<Bytes>>,
    lens: Vec<u64>,
    next: usize,
}

impl TensorSink {
    fn discard(lens: Vec<u64>) -> Self {
        Self {
            tx: None,
            lens,
            next: 0,
        }
    }

    /// Whether the save takes the tensors (false when it was skipped: pushing is then a no-op).
    pub fn wanted(&self) -> bool {
        self.tx.is_some()
    }

    /// Hand over the next tensor's bytes.
    pub fn push(&mut self, data: Bytes) -> Result<()> {
        let want = self
            .lens
            .get(self.next)
            .copied()
            .ok_or_else(|| Error::invalid_input("more tensors than the save described"))?;
        if data.len() as u64 != want {
            self.tx = None; // abandon: a wrong tensor must not be written
            return Err(Error::invalid_input(format!(
                "tensor {}: {} bytes, its dtype and shape need {want}",
                self.next,
                data.len()
            )));
        }
        self.next += 1;
        if let Some(tx) = &self.tx {
            // The writer stops receiving only after failing; the save reports that failure.
            let _ = tx.send(data);
        }
        Ok(())
    }
}

/// Receives a save's tensors back when it is done with them (see [`Checkpointer::save_with`]).
pub type Recycle = Box<dyn FnOnce(Vec<Tensor>) + Send>;

/// Which checkpoints a tier keeps. The newest committed checkpoint is always kept, and an older one is only
/// deleted once a newer one is committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// Keep the newest N committed checkpoints (0: keep all).
    pub keep_last: usize,
    /// Also keep every checkpoint whose step is a multiple of K.
    pub keep_every: Option<u64>,
}

impl Retention {
    /// The committed steps (ascending) this policy deletes.
    pub fn victims(&self, committed: &[u64]) -> Vec<u64> {
        if self.keep_last == 0 || committed.len() <= 1 {
            return Vec::new();
        }
        let keep_from = committed.len().saturating_sub(self.keep_last.max(1));
        committed[..keep_from]
            .iter()
            .copied()
            .filter(|s| {
                !self
                    .keep_every
                    .is_some_and(|k| k > 0 && s.is_multiple_of(k))
            })
            .collect()
    }
}

/// What to do when `save` is called while the previous save is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    /// Block the caller until the previous save is done.
    #[default]
    Wait,
    /// Skip this save (its handle says so).
    Skip,
}

/// A checkpointer's configuration.
#[derive(Debug, Clone)]
pub struct CheckpointConfig {
    /// The run; only its checkpoints are ever listed or deleted.
    pub run_id: String,
    /// This rank.
    pub rank: u32,
    /// Ranks saving each checkpoint.
    pub world_size: u32,
    /// Whether every rank shares the local tier (one node): then rank 0 commits a local manifest.
    pub local_is_shared: bool,
    /// The local tier (node-local NVMe).
    pub local: Tier,
    /// The object store tier.
    pub remote: Option<Tier>,
    /// Every node's agent (peer tier), in the same order on every rank; may be empty.
    pub peers: Vec<Tier>,
    /// This node's agent in `peers`, if it is one of them (never a replica target).
    pub self_peer: Option<usize>,
    /// Replicas of each shard on other nodes' agents (0: no peer tier).
    pub replicas: usize,
    /// Upload every N-th save to the object store (1: every save).
    pub upload_every: u64,
    /// Retention of the local tier.
    pub keep_local: Retention,
    /// Retention of the object store.
    pub keep_remote: Retention,
    /// Overlapping saves.
    pub overlap: Overlap,
    /// How long rank 0 waits for the other ranks' records before giving up a commit.
    pub commit_timeout: Duration,
    /// The node agent that takes over each save once its shard is durable locally (peers and object store),
    /// so the work survives the training process. `None`: the process does it all.
    pub handoff: Option<handoff::Handoff>,
    /// Admit each save against a team's `ckpt` quota before writing it (through the node agent).
    pub quota: Option<quota::QuotaGate>,
}

/// Where a save stands.
#[derive(Debug, Clone)]
pub enum SaveState {
    /// Running.
    Pending,
    /// Durable in the local tier; the node agent finishes the other tiers (the process may exit).
    HandedOver,
    /// Committed in every tier it was scheduled for.
    Done,
    /// Not taken: the previous save was still running and the policy is [`Overlap::Skip`].
    Skipped,
    /// Failed; earlier checkpoints are untouched.
    Failed(Error),
}

/// The caller's view of one save.
#[derive(Debug, Clone)]
pub struct SaveHandle {
    step: u64,
    rx: watch::Receiver<SaveState>,
}

impl SaveHandle {
    /// The step.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The current state.
    pub fn state(&self) -> SaveState {
        self.rx.borrow().clone()
    }

    /// Whether the save finished (done, skipped or failed).
    pub fn done(&self) -> bool {
        !matches!(
            *self.rx.borrow(),
            SaveState::Pending | SaveState::HandedOver
        )
    }

    /// Wait until it finishes.
    pub async fn wait(&self) -> SaveState {
        self.wait_for(|s| !matches!(s, SaveState::Pending | SaveState::HandedOver))
            .await
    }

    /// Wait until this process's part is over: finished, or handed over to the node agent. What a process
    /// about to exit waits for.
    pub async fn wait_released(&self) -> SaveState {
        self.wait_for(|s| !matches!(s, SaveState::Pending)).await
    }

    async fn wait_for(&self, over: impl Fn(&SaveState) -> bool) -> SaveState {
        let mut rx = self.rx.clone();
        loop {
            let s = rx.borrow_and_update().clone();
            if over(&s) {
                return s;
            }
            if rx.changed().await.is_err() {
                // The save task ended without a verdict: it panicked.
                return match rx.borrow().clone() {
                    SaveState::Pending => {
                        SaveState::Failed(Error::internal("the save task panicked"))
                    }
                    s => s,
                };
            }
        }
    }
}

/// Saves and restores one rank's checkpoints.
#[derive(Debug, Clone)]
pub struct Checkpointer {
    cfg: Arc<CheckpointConfig>,
    ctx: IoContext,
    running: Arc<Semaphore>,
    saves: Arc<std::sync::atomic::AtomicU64>,
    tasks: tokio_tasks::Tracker,
    /// The steps in the local tier when this checkpointer was made: what [`Checkpointer::finish_pending`]
    /// may finish (never a step this process is saving).
    found: Arc<Vec<u64>>,
    /// The local tier's journal of uploads in flight (none when the local tier is not a directory).
    journal: Option<journal::UploadJournal>,
    /// This rank's uploads a previous process journaled and never ended, when this checkpointer was made:
    /// what [`Checkpointer::finish_pending`] aborts at the object store.
    journaled: Arc<Vec<(u64, String)>>,
    /// Steps committed locally whose upload failed, retried in the background ([`unsent`]).
    unsent: Arc<unsent::Unsent>,
}

mod tokio_tasks {
    use std::sync::Arc;

    use parking_lot::Mutex;

    /// Join handles of background saves, so a caller can wait for all of them (process exit).
    #[derive(Debug, Clone, Default)]
    pub struct Tracker(Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>);

    impl Tracker {
        pub fn push(&self, h: tokio::task::JoinHandle<()>) {
            let mut v = self.0.lock();
            v.retain(|h| !h.is_finished());
            v.push(h);
        }

        pub fn take(&self) -> Vec<tokio::task::JoinHandle<()>> {
            std::mem::take(&mut *self.0.lock())
        }
    }
}

/// `Ok` when nothing failed; else one error naming every failure (the first one's kind).
pub(crate) fn all_ok(mut failed: Vec<Error>) -> Result<()> {
    match failed.len() {
        0 => Ok(()),
        1 => Err(failed.remove(0)),
        _ => {
            let kind = failed[0].kind();
            let msg: Vec<String> = failed.iter().map(|e| e.to_string()).collect();
            Err(Error::new(kind, msg.join("; ")))
        }
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Checkpointer {
    /// A checkpointer; checks the run id and the ranks.
    pub fn new(cfg: CheckpointConfig, ctx: IoContext) -> Result<Self> {
        manifest::validate_run_id(&cfg.run_id)?;
        if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
            return Err(Error::invalid_input(format!(
                "rank {} is not in a world of {} ranks",
                cfg.rank, cfg.world_size
            )));
        }
        if cfg.upload_every == 0 {
            return Err(Error::invalid_input("upload_every must be at least 1"));
        }
        let found = match &cfg.local {
            Tier::Local(root) => std::fs::read_dir(root.join(&cfg.run_id))
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .filter_map(|e| e.file_name().to_str().and_then(manifest::parse_step_dir))
                        .collect()
                })
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        let journal = match &cfg.local {
            Tier::Local(root) => {
                let swept = journal::sweep_stale_tmp(root, &cfg.run_id);
                if swept > 0 {
                    tracing::info!(run = %cfg.run_id, swept, "removed temporary files killed writers left");
                }
                Some(journal::UploadJournal::new(root, &cfg.run_id))
            }
            _ => None,
        };
        let journaled = journal
            .as_ref()
            .map(|j| j.pending(cfg.rank))
            .unwrap_or_default();
        let unsent = unsent::Unsent::found(&cfg.local, &cfg.run_id, cfg.rank, &found);
        Ok(Self {
            cfg: Arc::new(cfg),
            ctx,
            running: Arc::new(Semaphore::new(1)),
            saves: Arc::default(),
            tasks: tokio_tasks::Tracker::default(),
            unsent: Arc::new(unsent),
            found: Arc::new(found),
            journal,
            journaled: Arc::new(journaled),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CheckpointConfig {
        &self.cfg
    }

    /// Start saving `tensors` (already copied; the caller may change its own state now) as `step`, on `rt`.
    /// With [`Overlap::Wait`] this waits (async) for the previous save to finish first.
    pub async fn save(
        &self,
        rt: &tokio::runtime::Handle,
        step: u64,
        tensors: Vec<Tensor>,
        metadata: BTreeMap<String, String>,
    ) -> Result<SaveHandle> {
        self.save_with(rt, step, tensors, metadata, None).await
    }

    /// Wait until no save is running (to reuse staging memory before copying the next state).
    pub async fn wait_idle(&self) {
        let _ = self.running.acquire().await;
    }

    /// Like [`Self::save`]; `recycle` gets the tensors back once every tier is done with them (or the save is
    /// skipped), so the caller can reuse their memory for the next save instead of faulting in new pages.
    pub async fn save_with(
        &self,
        rt: &tokio::runtime::Handle,
        step: u64,
        tensors: Vec<Tensor>,
        metadata: BTreeMap<String, String>,
        recycle: Option<Recycle>,
    ) -> Result<SaveHandle> {
        format::encode_header(&tensors, &metadata)?; // bad input fails here, in the caller
        let specs = tensors
            .iter()
            .map(|t| format::Spec {
                name: t.name.clone(),
                dtype: t.dtype.clone(),
                shape: t.shape.clone(),
            })
            .collect();
        let (handle, mut sink) = self.save_stream(rt, step, specs, metadata, recycle).await?;
        if sink.wanted() {
            for t in tensors {
                sink.push(t.data)?;
            }
        }
        Ok(handle)
    }

    /// Start a save whose tensors are described by `specs` and arrive through the returned [`TensorSink`], in
    /// order, while the local tier is already being written: the write overlaps the caller's copy. Dropping
    /// the sink before every tensor was pushed abandons the save (reported on the handle, nothing committed).
    pub async fn save_stream(
        &self,
        rt: &tokio::runtime::Handle,
        step: u64,
        specs: Vec<format::Spec>,
        metadata: BTreeMap<String, String>,
        recycle: Option<Recycle>,
    ) -> Result<(SaveHandle, TensorSink)> {
        let (header, _) = format::encode_header_for(&specs, &metadata)?;
        let lens = specs
            .iter()
            .map(format::Spec::byte_len)
            .collect::<Result<Vec<u64>>>()?;
        // A committed checkpoint is immutable: its shards are never replaced (they would no longer match the
        // manifest). The local tier is checked here, before any byte; the other tiers before their writes.
        if let Tier::Local(root) = &self.cfg.local
            && Tier::local_step(root, &self.cfg.run_id, step)
                .join(manifest::MANIFEST)
                .exists()
        {
            let e = already_committed(&self.cfg.run_id, step, &self.cfg.local);
            tracing::error!(run = %self.cfg.run_id, step, error = %e, "checkpoint save refused");
            let (_tx, rx) = watch::channel(SaveState::Failed(e));
            return Ok((SaveHandle { step, rx }, TensorSink::discard(lens)));
        }
        let permit = match self.cfg.overlap {
            Overlap::Wait => self
                .running
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| Error::new(ErrorKind::Cancelled, "checkpointer closed"))?,
            Overlap::Skip => match self.running.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    tracing::warn!(
                        step,
                        "checkpoint skipped: the previous save is still running"
                    );
                    let (_tx, rx) = watch::channel(SaveState::Skipped);
                    return Ok((SaveHandle { step, rx }, TensorSink::discard(lens)));
                }
            },
        };
        // Quota before bytes: admitted before any byte is written; refused = failed at once, nothing written.
        let shard_bytes = header.len() as u64 + lens.iter().sum::<u64>();
        let reservation = match &self.cfg.quota {
            Some(q) => match q.reserve(shard_bytes).await {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::error!(run = %self.cfg.run_id, step, error = %e, "checkpoint save refused");
                    let (_tx, rx) = watch::channel(SaveState::Failed(e));
                    return Ok((SaveHandle { step, rx }, TensorSink::discard(lens)));
                }
            },
            None => None,
        };
        let n = self
            .saves
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let upload = self.cfg.remote.is_some() && n.is_multiple_of(self.cfg.upload_every);
        let (data_tx, data_rx) = std::sync::mpsc::channel::<Bytes>();
        let (tx, rx) = watch::channel(SaveState::Pending);
        let me = self.clone();
        let count = specs.len();
        let h = rt.spawn(async move {
            let cfg = &me.cfg;
            let (written, datas) = cfg
                .local
                .write_shard_stream(&cfg.run_id, step, cfg.rank, header, count, data_rx)
                .await;
            if let (Some(q), Some(id)) = (&cfg.quota, &reservation) {
                // Charged once the shard is in the local tier; released if it never got there.
                let r = if written.is_ok() {
                    q.commit(id, &cfg.run_id, step, cfg.rank, shard_bytes).await
                } else {
                    q.release(id).await
                };
                if let Err(e) = r {
                    tracing::warn!(step, error = %e, "settling the checkpoint's quota reservation (it expires)");
                }
            }
            let r = if datas.len() != count {
                Err(written.err().unwrap_or_else(|| {
                    Error::new(ErrorKind::Cancelled, "the save was abandoned while its state was being copied")
                }))
            } else {
                let tensors: Vec<Tensor> = specs
                    .into_iter()
                    .zip(datas)
                    .map(|(s, data)| Tensor {
                        name: s.name,
                        dtype: s.dtype,
                        shape: s.shape,
                        data,
                    })
                    .collect();
                let local = match written {
                    Err(e) if e.kind() == ErrorKind::Unsupported => None,
                    other => Some(other),
                };
                let r = me.run_save(step, &tensors, metadata, upload, &tx, local).await;
                if let Some(recycle) = recycle {
                    recycle(tensors);
                }
                r
            };
            match r {
                Ok(()) => {
                    let _ = tx.send(SaveState::Done);
                }
                Err(e) => {
                    tracing::error!(run = %me.cfg.run_id, step, error = %e, "checkpoint save failed");
                    let _ = tx.send(SaveState::Failed(e));
                }
            }
            drop(permit);
        });
        self.tasks.push(h);
        Ok((
            SaveHandle { step, rx },
            TensorSink {
                tx: Some(data_tx),
                lens,
                next: 0,
            },
        ))
    }

    /// Wait for every background save of this checkpointer.
    pub async fn flush(&self) {
        for h in self.tasks.take() {
            let _ = h.await;
        }
    }

    /// The peers that receive this rank's replicas: the next `replicas` agents after this node's, in ring
    /// order (from `rank` when this node's agent is not in the list).
    pub fn replica_targets(&self) -> Vec<&Tier> {
        let n = self.cfg.peers.len();
        if n == 0 || self.cfg.replicas == 0 {
            return Vec::new();
        }
        let start = self
            .cfg
            .self_peer
            .map_or(self.cfg.rank as usize % n, |s| s + 1);
        (0..n)
            .map(|i| (start + i) % n)
            .filter(|&i| Some(i) != self.cfg.self_peer)
            .take(self.cfg.replicas)
            .map(|i| &self.cfg.peers[i])
            .collect()
    }

    /// Write the shard to every tier; a tier that fails does not stop the others. The save is done when
    /// every tier succeeded; otherwise the error lists the tiers that failed (the checkpoint may then be
    /// committed, and loadable, in the others).
    async fn run_save(
        &self,
        step: u64,
        tensors: &[Tensor],
        metadata: BTreeMap<String, String>,
        upload: bool,
        progress: &watch::Sender<SaveState>,
        local_shard: Option<Result<ShardRecord>>,
    ) -> Result<()> {
        let cfg = &self.cfg;
        let (header, _) = format::encode_header(tensors, &metadata)?;
        let mut failed: Vec<Error> = Vec::new();
        let ctx = &self.ctx;
        let run = &cfg.run_id;
        // 1. The local tier (node-local NVMe).
        let local = async {
            let rec = match local_shard {
                Some(r) => r?,
                None => {
                    cfg.local
                        .write_shard(ctx, run, step, cfg.rank, &header, tensors)
                        .await?
                }
            };
            cfg.local.write_record(ctx, run, step, &rec).await?;
            if cfg.rank == 0 && cfg.local_is_shared {
                self.commit_when_complete(&[&cfg.local], step, &metadata, &[&cfg.local])
                    .await?;
                self.retain(&[&cfg.local], cfg.keep_local).await;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = local {
            failed.push(e.context(cfg.local.describe()));
        }
        // 2 and 3: peers and the object store, here or (with an agent) by the node agent.
        if let Some(h) = &cfg.handoff {
            match h.submit(cfg, step, upload).await {
                Ok(()) => {
                    if failed.is_empty() {
                        let _ = progress.send(SaveState::HandedOver);
                    }
                    return h.wait(cfg, step, failed).await;
                }
                Err(e) => tracing::warn!(
                    step,
                    error = %e,
                    "agent did not take the save over; finishing it in this process"
                ),
            }
        }
        failed.extend(
            self.replicate(step, &header, tensors, &metadata, upload)
                .await,
        );
        all_ok(failed)
    }

    /// Whether `step` still has to be written to `tier`: `false` when the tier has it committed with exactly
    /// this rank's shard (a retried upload: nothing to do); an error when it has it committed with other
    /// bytes, which are never replaced.
    async fn uncommitted_in(
        &self,
        tier: &Tier,
        step: u64,
        header: &[u8],
        tensors: &[Tensor],
    ) -> Result<bool> {
        let cfg = &self.cfg;
        let Some(m) = tier.manifest(&self.ctx, &cfg.run_id, step).await? else {
            return Ok(true);
        };
        let mut h = blake3::Hasher::new();
        h.update(header);
        for t in tensors {
            h.update(&t.data);
        }
        let ours = h.finalize().to_hex();
        match m.shards.iter().find(|r| r.rank == cfg.rank) {
            Some(r) if r.blake3 == ours.as_str() => Ok(false),
            _ => Err(already_committed(&cfg.run_id, step, tier)),
        }
    }

    /// The tiers after the local one: replicas on peers, then the object store (when `upload`). Returns the
    /// failures. `header` followed by `tensors` is the shard file (a whole file with no tensors works too).
    async fn replicate(
        &self,
        step: u64,
        header: &[u8],
        tensors: &[Tensor],
        metadata: &BTreeMap<String, String>,
        upload: bool,
    ) -> Vec<Error> {
        let cfg = &self.cfg;
        let ctx = &self.ctx;
        let run = &cfg.run_id;
        let mut failed = Vec::new();
        // 2. Replicas on other nodes' agents.
        let targets = self.replica_targets();
        for peer in &targets {
            let r = async {
                if !self.uncommitted_in(peer, step, header, tensors).await? {
                    return Ok(());
                }
                let rec = peer
                    .write_shard(ctx, run, step, cfg.rank, header, tensors)
                    .await?;
                peer.write_record(ctx, run, step, &rec).await
            }
            .await;
            if let Err(e) = r {
                failed.push(e.context(peer.describe()));
            }
        }
        if cfg.rank == 0 && !targets.is_empty() {
            // Records are spread over the peers: commit once every rank has one somewhere, on every peer.
            let all: Vec<&Tier> = cfg.peers.iter().collect();
            match self.commit_when_complete(&all, step, metadata, &all).await {
                Ok(()) => self.retain(&all, cfg.keep_local).await,
                Err(e) => failed.push(e.context("peer tier")),
            }
        }
        // 3. The object store, on its schedule.
        if let (true, Some(remote)) = (upload, &cfg.remote) {
            let r = async {
                // Journaled first, so a kill mid-upload leaves what the next process needs to abort it.
                if !self.uncommitted_in(remote, step, header, tensors).await? {
                    return Ok(());
                }
                let journal = self
                    .journal
                    .as_ref()
                    .filter(|_| matches!(remote, Tier::Remote(_)));
                if let Some(j) = journal {
                    j.begin(cfg.rank, step, &Tier::shard_key(run, step, cfg.rank))?;
                }
                let rec = remote
                    .write_shard(ctx, run, step, cfg.rank, header, tensors)
                    .await?;
                if let Some(j) = journal {
                    j.end(cfg.rank, step);
                }
                remote.write_record(ctx, run, step, &rec).await?;
                if cfg.rank == 0 {
                    self.commit_when_complete(&[remote], step, metadata, &[remote])
                        .await?;
                    self.retain(&[remote], cfg.keep_remote).await;
                }
                Ok::<_, Error>(())
            }
            .await;
            match r {
                Ok(()) => self.unsent.remove(&cfg.local, run, cfg.rank, step),
                Err(e) => {
                    // Committed locally, not in the store: kept locally and tried again until it lands.
                    if e.is_retryable() && self.unsent.add(&cfg.local, run, cfg.rank, step) {
                        self.retry_unsent_in_background();
                    }
                    failed.push(e.context(remote.describe()));
                }
            }
        }
        failed
    }

    /// Start the task that uploads the unsent steps ([`unsent`]), on the current runtime.
    fn retry_unsent_in_background(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(run = %self.cfg.run_id, "no runtime to retry unsent checkpoint steps on; the next start uploads them");
            return;
        };
        let me = self.clone();
        rt.spawn(async move { me.retry_unsent().await });
    }

    /// Upload the unsent steps, oldest first, until none is left or the checkpointer is closed.
    async fn retry_unsent(self) {
        let cfg = &self.cfg;
        let run = &cfg.run_id;
        let mut wait = unsent::Unsent::first_wait();
        while let Some(step) = self.unsent.next() {
            if self.unsent.pause(wait).await.is_err() {
                return;
            }
            match self.finish_from_local(step, true).await {
                Ok(()) => {
                    self.unsent.remove(&cfg.local, run, cfg.rank, step);
                    wait = unsent::Unsent::first_wait();
                    tracing::info!(run = %run, step, "uploaded a step an outage had left local only");
                    if cfg.rank == 0 && cfg.local_is_shared {
                        self.retain(&[&cfg.local], cfg.keep_local).await;
                    }
                }
                Err(e) if !e.is_retryable() => {
                    // Its local copy is gone or damaged, or the store holds other bytes: nothing to retry.
                    tracing::error!(run = %run, step, error = %e, "an unsent step cannot be uploaded; giving it up");
                    self.unsent.remove(&cfg.local, run, cfg.rank, step);
                }
                Err(e) => {
                    wait = unsent::Unsent::backoff(wait);
                    tracing::warn!(run = %run, step, error = %e, retry_in = ?wait, "uploading an unsent step");
                }
            }
        }
    }

    /// Stop retrying unsent uploads in this process (they stay marked in the local tier: the next process
    /// of the run uploads them).
    pub fn close(&self) {
        self.unsent.stop();
    }

    /// Steps committed locally whose upload has not landed yet (this process's, and those a previous process
    /// of this rank marked).
    pub fn unsent_steps(&self) -> Vec<u64> {
        self.unsent.steps()
    }

    /// Finish what a previous process on this run left undone: this rank's steps durable in the local tier
    /// when this checkpointer was made (its record is there; never a step this process saves) but newer than
    /// anything committed in the object store, because the store was
    /// down or the process was killed before the upload. Each is uploaded (and replicated) as a handed-over
    /// save is, oldest first; returns the steps finished. The first failure stops it (the store is still
    /// away): the steps stay local (retention keeps them) for the next try. Without an object store, nothing.
    pub async fn finish_pending(&self) -> Result<Vec<u64>> {
        let cfg = &self.cfg;
        let Some(remote) = &cfg.remote else {
            return Ok(Vec::new());
        };
        let run = &cfg.run_id;
        self.abort_journaled(remote).await?;
        let newest_remote = remote.committed(&self.ctx, run).await?.into_iter().max();
        // Only steps committed in a tier besides the store: one whose manifest was never written (the process
        // was killed first) was never a checkpoint, and the job, resuming from the one before, saves it again.
        let mut committed: std::collections::BTreeSet<u64> = match cfg.local_is_shared {
            true => cfg
                .local
                .committed(&self.ctx, run)
                .await?
                .into_iter()
                .collect(),
            false => Default::default(),
        };
        for p in &cfg.peers {
            match p.committed(&self.ctx, run).await {
                Ok(c) => committed.extend(c),
                Err(e) => {
                    tracing::warn!(peer = %p.describe(), error = %e, "listing a peer's checkpoints")
                }
            }
        }
        let mut steps: Vec<u64> = self
            .found
            .iter()
            .copied()
            .filter(|s| committed.contains(s))
            .collect();
        steps.sort_unstable();
        let mut done = Vec::new();
        for step in steps {
            // Older than the store's newest: there already, or left unsent by an outage (marked).
            if newest_remote.is_some_and(|n| step <= n) && !self.unsent.contains(step) {
                continue;
            }
            let record = manifest::record_file(cfg.rank);
            if cfg
                .local
                .read_file(&self.ctx, run, step, &record)
                .await
                .is_err()
            {
                continue; // this rank's shard never became durable: nothing to finish
            }
            self.finish_from_local(step, true)
                .await
                .map_err(|e| e.context(format!("finishing the upload of step {step}")))?;
            tracing::info!(run = %run, step, "uploaded a step a previous process left local only");
            done.push(step);
        }
        Ok(done)
    }

    /// Abort at the object store the uploads a previous process of this rank journaled and never ended
    /// (killed mid-upload, or its abort failed): their parts are freed, the entries removed. Returns how many
    /// uploads were aborted; a failure (the store is away) leaves the entries for the next start.
    pub async fn abort_journaled(&self, remote: &Tier) -> Result<usize> {
        let (Some(j), Tier::Remote(b)) = (&self.journal, remote) else {
            return Ok(0);
        };
        let mut aborted = 0;
        for (step, key) in self.journaled.iter() {
            aborted += b
                .abort_uploads(&self.ctx, key, |u| u.key == *key)
                .await
                .map_err(|e| e.context(format!("aborting the unfinished upload of step {step}")))?;
            j.end(self.cfg.rank, *step);
        }
        if aborted > 0 {
            tracing::info!(run = %self.cfg.run_id, aborted, "aborted uploads a previous process left unfinished");
        }
        Ok(aborted)
    }

    /// Finish a save whose shard is already durable in the local tier: read it back (verified against its
    /// record), replicate it to the peers and upload it (when `upload`), committing each tier. This is what
    /// the node agent runs when a training process hands a save over, so the work survives the process.
    pub async fn finish_from_local(&self, step: u64, upload: bool) -> Result<()> {
        let cfg = &self.cfg;
        let run = &cfg.run_id;
        let rec_text = cfg
            .local
            .read_file(&self.ctx, run, step, &manifest::record_file(cfg.rank))
            .await?;
        let rec = ShardRecord::parse(&rec_text, &format!("record of step {step}"))?;
        let file = cfg.local.read_file(&self.ctx, run, step, &rec.file).await?;
        if !rec.matches(&file) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "step {step}: the local shard {} does not match its record",
                    rec.file
                ),
            ));
        }
        let (_, metadata) = format::decode(&rec.file, &file)?;
        let failed = self.replicate(step, &file, &[], &metadata, upload).await;
        all_ok(failed)
    }

    /// Rank 0: wait until every rank's record is in one of `sources`, then write the manifest to `targets`
    /// (an unreachable target is skipped when another one took the manifest).
    async fn commit_when_complete(
        &self,
        sources: &[&Tier],
        step: u64,
        metadata: &BTreeMap<String, String>,
        targets: &[&Tier],
    ) -> Result<()> {
        let cfg = &self.cfg;
        let deadline = tokio::time::Instant::now() + cfg.commit_timeout;
        let shards = loop {
            let mut found: Vec<Option<ShardRecord>> = vec![None; cfg.world_size as usize];
            let mut last_err = None;
            for t in sources {
                match t
                    .records(&self.ctx, &cfg.run_id, step, cfg.world_size)
                    .await
                {
                    Ok(recs) => {
                        for (slot, r) in found.iter_mut().zip(recs) {
                            if slot.is_none() {
                                *slot = r;
                            }
                        }
                    }
                    Err(e) => last_err = Some(e),
                }
            }
            if found.iter().all(Option::is_some) {
                break found.into_iter().flatten().collect::<Vec<_>>();
            }
            if tokio::time::Instant::now() >= deadline {
                let missing: Vec<usize> = found
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.is_none())
                    .map(|(i, _)| i)
                    .collect();
                let extra = last_err
                    .map(|e| format!(" (last error: {e})"))
                    .unwrap_or_default();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "step {step}: ranks {missing:?} did not save within {:?}; not committed{extra}",
                        cfg.commit_timeout
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let m = Manifest {
            format: "strata-checkpoint".into(),
            version: 1,
            run_id: cfg.run_id.clone(),
            step,
            world_size: cfg.world_size,
            committed_unix: now_unix(),
            shards,
            metadata: metadata.clone(),
        };
        let mut committed = 0;
        let mut last_err = None;
        for t in targets {
            match t.commit(&self.ctx, &m).await {
                Ok(()) => committed += 1,
                Err(e) => {
                    tracing::warn!(tier = %t.describe(), step, error = %e, "manifest not written");
                    last_err = Some(e);
                }
            }
        }
        match (committed, last_err) {
            (0, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Apply a retention policy to a tier (one logical tier may span several stores, as the peer tier does)
    /// after a commit. Stops at the first error, which is logged: retention never fails a save.
    async fn retain(&self, stores: &[&Tier], policy: Retention) {
        let run = &self.cfg.run_id;
        let result = async {
            let mut committed = Vec::new();
            for t in stores {
                committed.extend(t.committed(&self.ctx, run).await?);
            }
            committed.sort_unstable();
            committed.dedup();
            let Some(&newest) = committed.last() else {
                return Ok::<_, Error>(());
            };
            let is_local = stores.len() == 1 && std::ptr::eq(stores[0], &self.cfg.local);
            let charged = self.cfg.quota.as_ref().filter(|_| is_local);
            // The local tier gives a step up only once it is durable elsewhere: committed in another tier, or
            // superseded by a newer step that is. (A tier that cannot be listed now holds nothing.) A step
            // whose own upload failed ([`unsent`]) is given up only once it is in the store itself, or the
            // store's retention would drop it anyway: newer steps there do not stand for it.
            let durable = if is_local && (self.cfg.remote.is_some() || !self.cfg.peers.is_empty()) {
                let mut elsewhere = Vec::new();
                let mut in_store = Vec::new();
                for t in self.cfg.remote.iter().chain(self.cfg.peers.iter()) {
                    match t.committed(&self.ctx, run).await {
                        Ok(c) => {
                            if self.cfg.remote.as_ref().is_some_and(|r| std::ptr::eq(r, t)) {
                                in_store = c.clone();
                            }
                            elsewhere.extend(c)
                        }
                        Err(e) => {
                            tracing::warn!(tier = %t.describe(), error = %e, "retention: cannot tell what this tier holds; keeping local steps");
                        }
                    }
                }
                Some((elsewhere, in_store))
            } else {
                None
            };
            let store_drops = |s: u64, in_store: &[u64]| {
                let mut with: Vec<u64> = in_store.to_vec();
                with.push(s);
                with.sort_unstable();
                with.dedup();
                self.cfg.keep_remote.victims(&with).contains(&s)
            };
            let victims: Vec<u64> = policy
                .victims(&committed)
                .into_iter()
                .filter(|&s| {
                    durable.as_ref().is_none_or(|(d, in_store)| {
                        if !d.iter().any(|&o| o >= s) {
                            tracing::info!(step = s, "retention keeps a local step no other tier has yet");
                            return false;
                        }
                        let unsent = self.unsent.contains(s) || unsent::marked(&self.cfg.local, run, s);
                        if unsent && !in_store.contains(&s) && !store_drops(s, in_store) {
                            tracing::info!(step = s, "retention keeps a local step whose upload has not landed");
                            return false;
                        }
                        true
                    })
                })
                .collect();
            for t in stores {
                for &step in &victims {
                    t.delete_step(&self.ctx, run, step).await?;
                    if let Some(q) = charged
                        && let Err(e) = q.deleted(run, step).await
                    {
                        tracing::warn!(step, error = %e, "giving deleted checkpoint bytes back to the quota");
                    }
                }
                // Debris of saves that never committed, older than the newest commit: never complete, never
                // needed. Not a step whose upload is being retried ([`unsent`]: its marker goes only once it
                // is committed), nor one committed since the listing above (checked last).
                for step in t.steps(&self.ctx, run).await? {
                    if step < newest
                        && !committed.contains(&step)
                        && !self.unsent.contains(step)
                        && !unsent::marked(&self.cfg.local, run, step)
                        && t.manifest(&self.ctx, run, step).await?.is_none()
                    {
                        t.delete_step(&self.ctx, run, step).await?;
                    }
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            tracing::warn!(run = %run, error = %e, "checkpoint retention failed; nothing more deleted");
        }
    }

    /// The tiers in restore order: local, the peers, the object store.
    fn tiers(&self) -> Vec<&Tier> {
        std::iter::once(&self.cfg.local)
            .chain(self.cfg.peers.iter())
            .chain(self.cfg.remote.as_ref())
            .collect()
    }

    /// Committed steps in any tier, descending, with the manifest found first (local first).
    ///
    /// The local tier is listed whole (this node's disk); the peers and the object store at once, each for at
    /// most [`TIER_WAIT`], and only for steps the local tier lacks: a store that hangs (accepts connections,
    /// never answers) delays a restore by that bound, never by its request timeouts, and a restore then
    /// proceeds from what answered (the verified local copies).
    pub async fn committed(&self) -> Result<Vec<(u64, Manifest)>> {
        let mut steps = BTreeMap::new();
        let tiers = self.tiers();
        let (local, others) = tiers.split_at(1);
        let found = parking_lot::Mutex::new(Vec::new());
        self.list_manifests(local[0], &Default::default(), &found)
            .await;
        for (s, m) in found.into_inner() {
            steps.insert(s, m);
        }
        let known: std::collections::BTreeSet<u64> = steps.keys().copied().collect();
        let per_tier: Vec<parking_lot::Mutex<Vec<(u64, Manifest)>>> =
            others.iter().map(|_| Default::default()).collect();
        futures::future::join_all(others.iter().zip(&per_tier).map(|(t, found)| {
            let known = &known;
            async move {
                let listed = self.list_manifests(t, known, found);
                if tokio::time::timeout(TIER_WAIT, listed).await.is_err() {
                    tracing::warn!(tier = %t.describe(), wait = ?TIER_WAIT, "the tier did not list its checkpoints in time; going on with what answered");
                }
            }
        }))
        .await;
        // In restore order: what a nearer tier found first is kept.
        for found in per_tier {
            for (s, m) in found.into_inner() {
                steps.entry(s).or_insert(m);
            }
        }
        Ok(steps.into_iter().rev().collect())
    }

    /// The committed steps of `tier` not in `known`, with their manifests, pushed to `found` as they come (a
    /// caller that stops waiting keeps what came).
    async fn list_manifests(
        &self,
        tier: &Tier,
        known: &std::collections::BTreeSet<u64>,
        found: &parking_lot::Mutex<Vec<(u64, Manifest)>>,
    ) {
        let run = &self.cfg.run_id;
        let list = match tier.committed(&self.ctx, run).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(tier = %tier.describe(), error = %e, "cannot list checkpoints");
                return;
            }
        };
        // Newest first: a restore wants those.
        for s in list.into_iter().rev().filter(|s| !known.contains(s)) {
            if let Ok(Some(m)) = tier.manifest(&self.ctx, run, s).await {
                found.lock().push((s, m));
            }
        }
    }

    /// The manifest of `step`, or of the newest committed step (`None` when there is none).
    pub async fn manifest(&self, step: Option<u64>) -> Result<Option<Manifest>> {
        let all = self.committed().await?;
        Ok(match step {
            Some(s) => all.into_iter().find(|(x, _)| *x == s).map(|(_, m)| m),
            None => all.into_iter().next().map(|(_, m)| m),
        })
    }

    /// Where this rank's shard of `m` would be in the local tier, with its expected record; for callers that
    /// read it straight into their own memory (and fall back to [`Self::load`] when it does not verify).
    pub fn local_shard(&self, m: &Manifest) -> Option<(std::path::PathBuf, ShardRecord)> {
        let Tier::Local(root) = &self.cfg.local else {
            return None;
        };
        if m.world_size != self.cfg.world_size {
            return None;
        }
        let rec = m.shards.get(self.cfg.rank as usize)?.clone();
        let path = root
            .join(&m.run_id)
            .join(manifest::step_dir(m.step))
            .join(&rec.file);
        Some((path, rec))
    }

    /// Load this rank's shard of `step`: from the first tier holding a copy whose blake3 matches the manifest.
    pub async fn load(&self, step: u64) -> Result<(Vec<Tensor>, BTreeMap<String, String>)> {
        let m = self
            .committed()
            .await?
            .into_iter()
            .find(|(s, _)| *s == step)
            .map(|(_, m)| m)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "run {} has no complete checkpoint at step {step}",
                        self.cfg.run_id
                    ),
                )
            })?;
        self.load_manifest(&m).await
    }

    /// The newest complete checkpoint this rank can load, or `None` when there is none. Falls back to older
    /// checkpoints (with a warning) when no copy of a newer one verifies.
    pub async fn load_latest(
        &self,
    ) -> Result<Option<(u64, Vec<Tensor>, BTreeMap<String, String>)>> {
        let mut last_err = None;
        for (step, m) in self.committed().await? {
            match self.load_manifest(&m).await {
                Ok((t, md)) => return Ok(Some((step, t, md))),
                Err(e) if e.kind() == ErrorKind::InvalidInput => return Err(e),
                Err(e) => {
                    tracing::warn!(step, error = %e, "checkpoint unusable; trying an older one");
                    last_err = Some(e);
                }
            }
        }
        match last_err {
            Some(e) => Err(e.context("no complete checkpoint could be loaded")),
            None => Ok(None),
        }
    }

    async fn load_manifest(&self, m: &Manifest) -> Result<(Vec<Tensor>, BTreeMap<String, String>)> {
        if m.world_size != self.cfg.world_size {
            return Err(Error::invalid_input(format!(
                "checkpoint {} step {} was saved by {} ranks; this job has {}: resharding is not supported",
                m.run_id, m.step, m.world_size, self.cfg.world_size
            )));
        }
        let rec = &m.shards[self.cfg.rank as usize];
        let mut why = Vec::new();
        for tier in self.tiers() {
            match tier
                .read_file(&self.ctx, &m.run_id, m.step, &rec.file)
                .await
            {
                Ok(bytes) => {
                    if !rec.matches(&bytes) {
                        tracing::warn!(tier = %tier.describe(), step = m.step, file = %rec.file, "checksum mismatch; trying the next tier");
                        why.push(format!("{}: checksum mismatch", tier.describe()));
                        continue;
                    }
                    let (t, md) = format::decode(&rec.file, &bytes)?;
                    return Ok((t, md));
                }
                Err(e) => why.push(format!("{}: {}", tier.describe(), e.message())),
            }
        }
        Err(Error::new(
            ErrorKind::Corrupt,
            format!(
                "step {} rank {}: no tier has a verified copy of {} ({})",
                m.step,
                self.cfg.rank,
                rec.file,
                why.join("; ")
            ),
        ))
    }

    /// Delete a committed step from every tier.
    pub async fn delete(&self, step: u64) -> Result<()> {
        for tier in self.tiers() {
            tier.delete_step(&self.ctx, &self.cfg.run_id, step).await?;
        }
        Ok(())
    }
}

/// Convenience for callers that hold raw bytes.
pub fn blob(name: &str, data: Bytes) -> Tensor {
    Tensor {
        name: name.to_string(),
        dtype: "U8".into(),
        shape: vec![data.len() as u64],
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_keeps_newest_and_every_kth() {
        let r = Retention {
            keep_last: 2,
            keep_every: Some(1000),
        };
        assert_eq!(r.victims(&[500, 1000, 1500, 2000, 2500]), vec![500, 1500]);
        assert!(Retention::default().victims(&[1, 2, 3]).is_empty());
        assert!(
            Retention {
                keep_last: 1,
                keep_every: None
            }
            .victims(&[7])
            .is_empty()
        );
        assert_eq!(
            Retention {
                keep_last: 1,
                keep_every: None
            }
            .victims(&[1, 2, 3]),
            vec![1, 2]
        );
    }
}
