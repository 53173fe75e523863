//! Warm-up of a prefix into the disk tier, and pins (prefixes never evicted, capped, kept across restarts).

/// A warm-up's requests are up to this many times `max_request_size` long (see
/// `BlockCache::warm_run_blocks`).
const WARM_REQUESTS_PER_RUN: u64 = 4;

use crate::PinSpec;
use crate::fill::FillMode;
use crate::state::BlockCache;
use crate::state::ObjState;
use futures::StreamExt;
use std::sync::Arc;
pub use strata_api::cache::{Held, PinReport, WarmProgress};
use strata_object::Backend;
use strata_types::BlockKey;
use strata_types::Error;
use strata_types::ErrorKind;
use strata_types::IoContext;
use strata_types::ObjectMeta;
use strata_types::Result;

impl BlockCache {
    /// Prefetch every object under `prefix` into the cache, `concurrency` blocks at a time (at least 1).
    /// Blocks already cached are skipped. Errors of single objects are counted and reported, not fatal.
    pub async fn warm(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        prefix: &str,
        concurrency: usize,
        progress: impl Fn(&WarmProgress),
    ) -> Result<WarmProgress> {
        let mut objects = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = backend
                .list_page(ctx, prefix, after.as_deref(), 1000)
                .await?;
            objects.extend(page.objects);
            match page.next_start_after {
                Some(s) => after = Some(s),
                None => break,
            }
        }
        self.warm_objects(ctx, backend, objects, concurrency, progress)
            .await
    }

    /// Prefetch these exact object versions into the cache (as [`Self::warm`] does a prefix's): fills are
    /// pinned to each one's ETag, so an object that changed since `objects` were listed fails (and is
    /// counted), never caching another version under this one's name.
    pub async fn warm_objects(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        objects: Vec<ObjectMeta>,
        concurrency: usize,
        progress: impl Fn(&WarmProgress),
    ) -> Result<WarmProgress> {
        self.warm_some(ctx, backend, objects, concurrency, None, progress)
            .await
    }

    /// As [`Self::warm_objects`], but only the blocks of which this agent is among the first `replicas`
    /// owners in its cluster (every block when it is in none): the other members warm theirs. Bytes and
    /// blocks counted are this agent's share. A block this agent holds as a second or later owner is
    /// fetched from the ones before it (one origin read per block), as any fill's.
    pub async fn warm_owned(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        objects: Vec<ObjectMeta>,
        concurrency: usize,
        replicas: usize,
        progress: impl Fn(&WarmProgress),
    ) -> Result<WarmProgress> {
        self.warm_some(ctx, backend, objects, concurrency, Some(replicas), progress)
            .await
    }

    /// Blocks per request of a warm-up of `missing` blocks with `concurrency` requests at a time: enough to
    /// spread them over `concurrency` requests, at least `max_request_size` and at most
    /// [`WARM_REQUESTS_PER_RUN`] times that (and half the in-flight budget, which each run holds whole).
    ///
    /// Fewer, longer requests cost the origin less per byte: an S3 server that reads the whole object for
    /// each range request, as moto does, reads a 64 MiB object once instead of twice, and a claim's staging
    /// went from 0.93-0.98x to 1.28-1.39x `s5cmd cp` (bench/RESULTS.md). The cap bounds how long a reader that joins
    /// one of a run's blocks in flight waits for the bytes before it.
    fn warm_run_blocks(&self, missing: u64, concurrency: usize) -> u64 {
        let one = self.run_blocks();
        let most = (one * WARM_REQUESTS_PER_RUN)
            .min(self.max_run_blocks())
            .max(one);
        missing.div_ceil(concurrency.max(1) as u64).clamp(one, most)
    }

    /// Whether `key` is this agent's to hold as one of its first `replicas` owners, or it is in no cluster.
    fn owns(&self, key: &BlockKey, replicas: usize) -> bool {
        self.peers().is_none_or(|p| p.owns_within(key, replicas))
    }

    async fn warm_some(
        &self,
        ctx: &IoContext,
        backend: &Backend,
        objects: Vec<ObjectMeta>,
        concurrency: usize,
        owned_only: Option<usize>,
        progress: impl Fn(&WarmProgress),
    ) -> Result<WarmProgress> {
        let bs = self.inner.cfg.block_size.bytes();
        let mut p = WarmProgress {
            objects: objects.len() as u64,
            ..Default::default()
        };
        // Work items are runs of consecutive blocks not yet on disk (of this agent's, with `owned_only`; one
        // another fill is writing too: fetched again, from RAM as a rule, and its write waited for), each
        // fetched with one request.
        let mut missing = Vec::new();
        for meta in objects {
            let obj = Arc::new(ObjState::new(backend, meta));
            let nblocks = obj.meta.size.div_ceil(bs);
            let mut run_start: Option<u64> = None;
            for i in 0..=nblocks {
                let mine = i < nblocks
                    && owned_only.is_none_or(|r| self.owns(&BlockKey::new(obj.id.clone(), i), r));
                if mine {
                    p.total_bytes += (obj.meta.size - i * bs).min(bs);
                }
                let held = mine && self.holds_ready(&obj.digest(i));
                if held {
                    p.cached_blocks += 1;
                    p.done_bytes += (obj.meta.size - i * bs).min(bs);
                }
                if (!mine || held)
                    && let Some(s) = run_start.take()
                {
                    missing.push((obj.clone(), s, i - s));
                }
                if mine && !held && run_start.is_none() {
                    run_start = Some(i);
                }
            }
        }
        let run_max = self.warm_run_blocks(missing.iter().map(|m| m.2).sum(), concurrency);
        let mut work = Vec::new();
        for (obj, first, count) in missing {
            for s in (first..first + count).step_by(run_max as usize) {
                work.push((obj.clone(), s, run_max.min(first + count - s)));
            }
        }
        p.cached_bytes = p.done_bytes;
        progress(&p);
        let cancel = self.inner.cancel.clone();
        let mut stream = futures::stream::iter(work)
            .map(|(obj, first, count)| async move {
                let len = ((first + count) * bs).min(obj.meta.size) - first * bs;
                let runs = self.fetch_run(ctx, &obj, first, count, FillMode::Warm, None, None);
                // Each block as it comes (on disk by then as a rule, its run still streaming). Blocks that
                // were only in RAM (or joined another reader's fill) still go to disk; a block another fill is
                // writing counts once that write is done (the verdict counts files in place).
                let mut r = Ok(());
                for (i, f) in (first..).zip(runs) {
                    let b = match f.await {
                        Ok(b) => b,
                        Err(e) => {
                            r = Err(e);
                            break;
                        }
                    };
                    let key = BlockKey::new(obj.id.clone(), i);
                    let d = key.digest();
                    if !self.warm_settled(&d).await
                        && let Some(done) = self.store_disk(&key, d, &b, FillMode::Warm).await
                    {
                        let _ = done.await;
                    }
                }
                (obj, count, len, r)
            })
            .buffer_unordered(concurrency.max(1));
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                _ = cancel.cancelled() => return Err(Error::new(ErrorKind::Cancelled, "cache is shutting down")),
            };
            let Some((obj, count, len, r)) = next else {
                break;
            };
            match r {
                Ok(()) => {
                    p.fetched_blocks += count;
                    p.done_bytes += len;
                }
                Err(e) => {
                    p.failed_blocks += count;
                    if p.errors.len() < 10 {
                        p.errors.push(format!("{}: {e}", obj.meta.key));
                    }
                }
            }
            progress(&p);
        }
        Ok(p)
    }

    /// How much of these object versions the cache holds in its last tier (disk, else RAM), counted block by
    /// block with no side effects: what a claim's `ready` verdict is made of.
    pub fn held(&self, backend: &Backend, objects: &[ObjectMeta]) -> Held {
        self.held_some(backend, objects, None, |_| {})
    }

    /// As [`Self::held`], counting only the blocks of which this agent is among the first `replicas` owners
    /// in its cluster (every block when it is in none); an object counts as held when every such block is.
    pub fn held_owned(&self, backend: &Backend, objects: &[ObjectMeta], replicas: usize) -> Held {
        self.held_some(backend, objects, Some(replicas), |_| {})
    }

    /// As [`Self::held_owned`], also calling `each` with whether each object (in order) counts as held.
    pub fn held_owned_each(
        &self,
        backend: &Backend,
        objects: &[ObjectMeta],
        replicas: usize,
        each: impl FnMut(bool),
    ) -> Held {
        self.held_some(backend, objects, Some(replicas), each)
    }

    fn held_some(
        &self,
        backend: &Backend,
        objects: &[ObjectMeta],
        owned_only: Option<usize>,
        mut each: impl FnMut(bool),
    ) -> Held {
        let bs = self.inner.cfg.block_size.bytes();
        let mut h = Held::default();
        for meta in objects {
            let obj = ObjState::new(backend, meta.clone());
            let nblocks = meta.size.div_ceil(bs);
            let mut all = true;
            for i in 0..nblocks {
                if owned_only.is_some_and(|r| !self.owns(&BlockKey::new(obj.id.clone(), i), r)) {
                    continue;
                }
                h.blocks_total += 1;
                let len = (meta.size - i * bs).min(bs);
                h.bytes_total += len;
                if self.holds_ready(&obj.digest(i)) {
                    h.blocks_held += 1;
                    h.bytes_held += len;
                } else {
                    all = false;
                }
            }
            h.objects_total += 1;
            if all {
                h.objects_held += 1;
            }
            each(all);
        }
        h
    }

    /// Pin `prefix` of `backend` (a canonical backend id): its cached blocks are not evicted, and blocks cached
    /// later are pinned as they arrive, up to the pinned-bytes cap. Persisted across restarts.
    pub fn pin(&self, backend: &str, prefix: &str) -> Result<PinReport> {
        let spec = PinSpec {
            backend: backend.to_string(),
            prefix: prefix.to_string(),
            from: None,
        };
        let tiers = &self.inner.tiers;
        tiers.pins().add(&spec)?;
        let (pinned, refused) = tiers.pin_blocks(&spec);
        Ok(PinReport {
            pinned_blocks: pinned,
            refused_blocks: refused,
        })
    }

    /// Remove a pin. Returns whether it existed. Blocks still covered by another pin stay pinned.
    pub fn unpin(&self, backend: &str, prefix: &str) -> Result<bool> {
        let spec = PinSpec {
            backend: backend.to_string(),
            prefix: prefix.to_string(),
            from: None,
        };
        let tiers = &self.inner.tiers;
        let existed = tiers.pins().remove(&spec)?;
        tiers.unpin_blocks(&[spec]);
        Ok(existed)
    }

    /// This agent's own pins (not those kept for other members).
    pub fn own_pins(&self) -> Vec<PinSpec> {
        self.inner.tiers.pins().own()
    }

    /// The members whose pins are kept here.
    pub fn pinning_members(&self) -> Vec<String> {
        self.inner.tiers.pins().members()
    }

    /// Make `pins` (backend, prefix) the pins member `member` holds, here: in a cluster a pin is kept by
    /// every member, since the blocks of a pinned prefix are spread over their owners. Pins of the member
    /// not in `pins` are removed (an empty list removes all of them); blocks another pin covers stay pinned.
    /// Kept across restarts like this agent's own pins.
    pub fn set_member_pins(&self, member: &str, pins: &[(String, String)]) -> Result<PinReport> {
        let want: Vec<PinSpec> = pins
            .iter()
            .map(|(backend, prefix)| PinSpec {
                backend: backend.clone(),
                prefix: prefix.clone(),
                from: Some(member.to_string()),
            })
            .collect();
        let tiers = &self.inner.tiers;
        let Some(change) = tiers.pins().set_member(member, &want)? else {
            return Ok(PinReport::default());
        };
        tiers.unpin_blocks(&change.removed);
        let mut report = PinReport::default();
        for spec in &change.added {
            let (ok, refused) = tiers.pin_blocks(spec);
            report.pinned_blocks += ok;
            report.refused_blocks += refused;
        }
        Ok(report)
    }
}
