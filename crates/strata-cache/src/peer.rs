//! The peer tier: a block this agent's tiers miss is asked of the agent of the cluster that owns it before the
//! origin, so a block is read from the origin once per cluster however many agents want it.
//!
//! The cache knows the cluster only through a [`PeerSource`] (placement, membership, the peer API and its
//! failure handling live in the server): for each block of a fill it asks whether the block is this agent's
//! own ([`PeerSource::is_local`]: fill it from the origin here, with the single-flight every fill has) or
//! another's ([`PeerSource::fetch`]: the owner's bytes, verified, or nothing when every owner ahead of this
//! agent failed). A fill's run is split accordingly: the blocks asked of peers and the runs of this agent's own
//! blocks go at once, each block handed to its readers as it arrives; a block no peer served is read from the
//! origin at once, on its own: a block never waits on another block's owner (see
//! `BlockCache::fill_from_peers`). A block this agent owns, filled from the origin, is admitted whatever the
//! policy says ([`BlockCache::admit_forced`]): the owner's copy must outlive the first asker. A block served
//! by a peer is kept in RAM only, by the policy (its owner's disk holds the cluster's copy), unless it is
//! pinned; a warm-up's is forced onto disk and reported once written.
//!
//! An agent serving a peer ([`BlockCache::serve_peer`]) answers from its tiers, else fills the block from the
//! origin itself (joining a fill in flight), and never asks a peer in turn: a block request makes at most one
//! hop, so agents whose views of the cluster differ for a moment cannot send a request around in a loop.
//!
//! With a peer source an object this agent has not seen is opened by its metadata alone instead of a GET of its
//! first blocks (those blocks may be another agent's to read from the origin), and that metadata is asked of
//! the agent that owns the key's metadata ([`PeerSource::head`]), which answers from its metadata cache or
//! one HEAD joined by every asker ([`BlockCache::serve_peer_head`]): an object is HEADed at the origin once
//! per cluster and TTL, not once per agent. An entry learned so keeps the owner's age (it expires when the
//! owner's does); writes reach every member's metadata cache before they are acknowledged (the server's
//! `cluster::coherence`), the owner's included.

use crate::fill::FillMode;
use crate::policy::Digest;
use crate::state::BlockCache;
use crate::state::ObjState;
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use std::time::SystemTime;
use strata_object::Backend;
use strata_types::BlockKey;
use strata_types::Error;
use strata_types::IoContext;
use strata_types::IoEvent;
use strata_types::ObjectMeta;
use strata_types::Op;
use strata_types::Outcome;
use strata_types::Result;
use strata_types::Tier;
use tokio::sync::oneshot;

/// A block of one object version asked of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct PeerBlock<'a> {
    /// Who the read is for (its principal, team and job travel with the request).
    pub ctx: &'a IoContext,
    /// The backend the object is in.
    pub backend: &'a Backend,
    /// The object version, as this agent opened it.
    pub meta: &'a ObjectMeta,
    /// The block (its object id names the version).
    pub key: &'a BlockKey,
    /// The block's length in bytes (the last block of an object is shorter).
    pub len: u64,
    /// The cache's block size (every agent of a cluster must have the same).
    pub block_size: u64,
}

/// The other agents of the cluster, as the cache sees them.
pub trait PeerSource: Send + Sync + std::fmt::Debug {
    /// Whether the block is this agent's to fill from the origin (no I/O: placement over the current view).
    fn is_local(&self, key: &BlockKey) -> bool;
    /// Whether this agent is the block's owner in the current view (no I/O), even while it would first ask
    /// a previous owner for it ([`Self::is_local`] is false then): whose share of a staging the block is.
    fn owns(&self, key: &BlockKey) -> bool {
        self.is_local(key)
    }
    /// Whether this agent is among the block's first `replicas` owners in the current view (no I/O): whose
    /// share of a staging that keeps `replicas` copies of each block the block is. `1` is [`Self::owns`].
    fn owns_within(&self, key: &BlockKey, replicas: usize) -> bool {
        replicas >= 1 && self.owns(key)
    }
    /// The block from the agents that own it, in order, verified and exactly `block.len` bytes; `None` when
    /// this agent should read it from the origin (it comes first among the owners still trusted, or every
    /// owner ahead of it failed). Never fails a read: errors are the source's to count and remember.
    fn fetch<'a>(&'a self, block: PeerBlock<'a>) -> BoxFuture<'a, Option<Bytes>>;
    /// The current version of `key` from the agent that owns its metadata, and how long ago that agent
    /// confirmed it (`Err` of kind `NotFound`: the backend has no such object); `None` when this agent
    /// should send the HEAD itself (it owns the key's metadata, or the owner failed). Never fails an open:
    /// the owner's errors are the source's to count and remember. By default, `None`.
    fn head<'a>(
        &'a self,
        ctx: &'a IoContext,
        backend: &'a Backend,
        key: &'a str,
    ) -> BoxFuture<'a, Option<Result<(ObjectMeta, std::time::Duration)>>> {
        let _ = (ctx, backend, key);
        Box::pin(async { None })
    }
}

impl BlockCache {
    /// Join the cache to a cluster: from now on fills ask `peers` for the blocks other agents own. Once per
    /// cache; a second call is refused.
    pub fn set_peers(&self, peers: Arc<dyn PeerSource>) -> Result<()> {
        self.inner
            .peers
            .set(peers)
            .map_err(|_| Error::internal("the cache already has a peer source"))
    }

    pub(crate) fn peers(&self) -> Option<&Arc<dyn PeerSource>> {
        self.inner.peers.get()
    }

    /// Whether a block this agent filled from the origin is admitted whatever the policy says (evicting the
    /// oldest unpinned blocks): a warm-up's, and in a cluster a block this agent owns (a fill for a peer, or
    /// its own read of its share). The owner's copy is the cluster's one copy: were it refused (TinyLFU
    /// refuses a new block over a full tier of hotter ones, as a standing cluster's always are), the next
    /// member to ask would send the owner to the origin again, and a full cluster would read a new data set
    /// from the origin once per member instead of once.
    pub(crate) fn admit_forced(&self, key: &BlockKey, mode: FillMode) -> bool {
        match mode {
            FillMode::Warm | FillMode::Peer => true,
            FillMode::Readahead => self.peers().is_some_and(|p| p.owns(key)),
        }
    }

    /// A block of `meta`'s version for another agent: from a tier, else (with `fill`) read from the origin
    /// here, joining a fill already in flight; never asked of a peer. `Ok(None)`: not held and `fill` is
    /// false (a new owner asking the one before it whether it still holds the block). The version is the one
    /// asked for: the origin read carries `If-Match` of its ETag, so a changed object fails with
    /// `PreconditionFailed` instead of serving other bytes.
    pub async fn serve_peer(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        meta: ObjectMeta,
        index: u64,
        fill: bool,
    ) -> Result<Option<Bytes>> {
        let bs = self.inner.cfg.block_size.bytes();
        if index.saturating_mul(bs) >= meta.size {
            return Err(Error::invalid_input(format!(
                "block {index} is past the end of {} ({} bytes)",
                meta.key, meta.size
            )));
        }
        let obj = Arc::new(ObjState::new(backend, meta));
        let key = BlockKey::new(obj.id.clone(), index);
        let d = key.digest();
        let b = match self.lookup(ctx, &key, &d).await {
            Some(b) => b,
            None if !fill => return Ok(None),
            None => self.fill_missed(ctx, &obj, index, FillMode::Peer).await?,
        };
        let c = &self.inner.counters;
        c.peer_served.fetch_add(1, Ordering::Relaxed);
        c.peer_served_bytes
            .fetch_add(b.len() as u64, Ordering::Relaxed);
        self.note_job(ctx, crate::stats::JobBytes::Served, b.len() as u64);
        Ok(Some(b))
    }

    /// Ask the peers for the blocks of a run that other agents own, all at once, handing each to its readers
    /// (and the tiers) as it arrives; a block no peer served is read from the origin at once, on its own.
    ///
    /// Each block waits only on its own owners, never on another block of the run: an owner's fill that a
    /// peer's request joined must not wait for that peer's answer about a different block (two agents taking
    /// over a dead member's blocks would each wait for the other until the peer timeout).
    pub(crate) async fn fill_from_peers(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        keys: &[(BlockKey, Digest)],
        mode: FillMode,
        asked: Vec<(usize, Option<oneshot::Sender<Result<Bytes>>>)>,
        peers: &Arc<dyn PeerSource>,
    ) -> Result<()> {
        let bs = self.inner.cfg.block_size.bytes();
        let mut pending = futures::stream::FuturesUnordered::new();
        for (i, tx) in asked {
            pending.push(self.peer_block(ctx, obj, &keys[i..=i], bs, mode, tx, peers));
        }
        let mut first_err = Ok(());
        while let Some(r) = pending.next().await {
            if let Err(e) = r
                && first_err.is_ok()
            {
                first_err = Err(e);
            }
        }
        first_err
    }

    /// One block of [`Self::fill_from_peers`]: from its owners, else the origin.
    #[allow(clippy::too_many_arguments)]
    async fn peer_block(
        &self,
        ctx: &IoContext,
        obj: &ObjState,
        one: &[(BlockKey, Digest)],
        bs: u64,
        mode: FillMode,
        tx: Option<oneshot::Sender<Result<Bytes>>>,
        peers: &Arc<dyn PeerSource>,
    ) -> Result<()> {
        let (key, d) = &one[0];
        let len = ((key.index + 1) * bs).min(obj.meta.size) - key.index * bs;
        let ask = PeerBlock {
            ctx,
            backend: &obj.backend,
            meta: &obj.meta,
            key,
            len,
            block_size: bs,
        };
        let start = Instant::now();
        let b = match peers.fetch(ask).await {
            Some(b) if b.len() as u64 == len => b,
            _ => {
                let mut done = [tx];
                let r = self.origin_run(ctx, obj, one, mode, &mut done, None).await;
                if let (Err(e), Some(tx)) = (&r, done[0].take()) {
                    let _ = tx.send(Err(e.clone()));
                }
                return r;
            }
        };
        // Another member's block is kept in RAM only (by the policy): its owner's disk holds the cluster's
        // copy, and a second copy on this disk would take the room of this agent's own share (TinyLFU admits a
        // block asked of a peer over the owned blocks the other members have not read yet). A warm-up's, or a
        // block that moved here with a view change (this agent owns it now), is kept as an owned one is; a
        // pinned one goes to disk as any fill's (every member keeps every pin).
        let keep = self.admit_forced(key, mode);
        let to_disk = keep || self.is_pinned(key);
        self.insert_ram(key, *d, &b, keep && !self.inner.tiers.has_disk());
        if to_disk && let Some(written) = self.store_disk(key, *d, &b, mode).await {
            let _ = written.await;
        }
        let c = &self.inner.counters;
        c.peer_blocks.fetch_add(1, Ordering::Relaxed);
        c.peer_bytes.fetch_add(len, Ordering::Relaxed);
        self.note_job(ctx, crate::stats::JobBytes::Peer, len);
        self.inner.telemetry.emit(IoEvent {
            at: SystemTime::now(),
            op: Op::Get,
            backend: obj.id.backend.clone(),
            key: obj.id.key.clone(),
            bytes: len,
            latency: start.elapsed(),
            tier: Tier::Peer,
            outcome: Outcome::Ok,
            ctx: ctx.clone(),
        });
        if let Some(tx) = tx {
            let _ = tx.send(Ok(b));
        }
        Ok(())
    }
}
