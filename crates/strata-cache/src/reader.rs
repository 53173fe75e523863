//! Readers of one object version: [`CachedObject`] (ranged reads, readahead, prefetch runs held with their
//! budget shares, the hot path of one RAM-held block).
//!
//! A block handed out with a [`Share`] of the in-flight budget (fetched ahead for its reader, staged by a
//! hint, or read from the disk tier: [`CachedObject::read_block`]) keeps it until the bytes have left (a
//! response body drops it when the connection asks for the next chunk), so that bytes on their way out stay
//! inside the budget.

use crate::budget::Share;
use crate::fill::{FillMode, SharedFetch};
use crate::state::BlockCache;
use crate::state::ObjState;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use strata_types::Error;
use strata_types::ErrorKind;
use strata_types::IoContext;
use strata_types::ObjectMeta;
use strata_types::Result;

#[derive(Default)]
pub(crate) struct Readahead {
    /// The block a sequential reader would read next.
    pub(crate) next: Option<u64>,
    pub(crate) window: u32,
    /// Blocks fetched ahead for this reader. Readahead holds budget with them; runs started by
    /// [`CachedObject::prefetch`] took theirs while fetching.
    pub(crate) prefetched: HashMap<u64, (SharedFetch, Option<Share>)>,
}

/// A reader of one version of one object through the cache. Reads are verified against that version: if the
/// object changes at the backend, uncached blocks fail with [`ErrorKind::PreconditionFailed`] instead of mixing
/// versions.
pub(crate) struct CachedObject {
    pub(crate) cache: BlockCache,
    pub(crate) obj: Arc<ObjState>,
    pub(crate) ctx: IoContext,
    pub(crate) ra: Mutex<Readahead>,
}

impl std::fmt::Debug for CachedObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedObject")
            .field("id", &self.obj.id)
            .finish()
    }
}

impl CachedObject {
    /// The object's metadata as of opening.
    pub(crate) fn meta(&self) -> &ObjectMeta {
        &self.obj.meta
    }

    /// The whole object.
    #[cfg(test)]
    pub(crate) async fn read_all(&self) -> Result<Bytes> {
        self.read(0..self.obj.meta.size).await
    }

    /// Bytes `range`, which must lie inside one block, with the block's share of the in-flight budget when it
    /// was fetched ahead for this reader or read from the disk tier (see the module's docs). For senders that
    /// stream block by block.
    pub(crate) async fn read_block(&self, range: Range<u64>) -> Result<(Bytes, Option<Share>)> {
        let size = self.obj.meta.size;
        let bs = self.cache.inner.cfg.block_size.bytes();
        let end = range.end.min(size);
        if range.start > size || range.start > range.end {
            return Err(Error::invalid_input(format!(
                "range {}..{} is outside {} ({} bytes)",
                range.start, range.end, self.obj.meta.key, size
            )));
        }
        if range.start == end {
            return Ok((Bytes::new(), None));
        }
        let i = range.start / bs;
        if (end - 1) / bs != i {
            return Err(Error::invalid_input(format!(
                "range {}..{} spans more than one block",
                range.start, range.end
            )));
        }
        // Taken before readahead bookkeeping, which forgets prefetched entries at or before the read.
        let pre = self.ra.lock().prefetched.remove(&i);
        self.schedule_readahead(i, i, end);
        let filled = |b: &Bytes| {
            self.cache
                .count_filled_read(&self.ctx, &self.obj.id, b.len() as u64)
        };
        let (b, share) = match pre {
            Some((fut, permit)) => match fut.await {
                Ok(b) => {
                    filled(&b);
                    (b, permit)
                }
                Err(_) => (self.cache.block(&self.ctx, &self.obj, i).await?, None),
            },
            None => match self.cache.take_staged(&self.obj.digest(i)) {
                // Staged by a hint: the fill's share goes out with the bytes.
                Some((fill, permit)) => match fill.await {
                    Ok(b) => {
                        filled(&b);
                        (b, permit)
                    }
                    Err(_) => (self.cache.block(&self.ctx, &self.obj, i).await?, None),
                },
                None => {
                    let share = self.disk_read_share(i).await;
                    (self.cache.block(&self.ctx, &self.obj, i).await?, share)
                }
            },
        };
        let (lo, hi) = (range.start - i * bs, end - i * bs);
        if hi > b.len() as u64 {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "block {i} of {} is shorter than expected",
                    self.obj.meta.key
                ),
            ));
        }
        Ok((b.slice(lo as usize..hi as usize), share))
    }

    /// A share of the in-flight budget for block `i` when reading it makes fresh memory because only the disk
    /// tier holds it: a sender's blocks read from disk are then inside the budget until sent, as fetched ones
    /// are, however many large hot reads run at once. Waited for when this reader holds no budget of its own
    /// (as in [`Self::prefetch`]: a reader never waits while holding some), else taken only if free.
    pub(crate) async fn disk_read_share(&self, i: u64) -> Option<Share> {
        if !self.cache.disk_only(&self.obj.digest(i)) {
            return None;
        }
        let bs = self.cache.inner.cfg.block_size.bytes();
        let len = ((i + 1) * bs).min(self.obj.meta.size) - i * bs;
        let holds_budget = self.ra.lock().prefetched.values().any(|(_, p)| p.is_some());
        if holds_budget {
            self.cache.inner.budget.try_take(len)
        } else {
            self.cache.acquire_budget(len).await
        }
    }

    /// Note a read of this version at `at` (seconds): true if none was noted in the `resolution` seconds
    /// before, so the caller should record it. The mark is shared by every reader of the version while its
    /// metadata is cached; for a hot object, at most one reader per `resolution` sees true.
    #[cfg(test)]
    pub(crate) fn mark_read(&self, at: i64, resolution: i64) -> bool {
        self.obj.mark_read(at, resolution)
    }

    /// Bytes `range` if they lie in one block the RAM tier holds now and that was not fetched for this reader,
    /// else `None` (read them with [`Self::read_block`] then). The hot path of a small read: one lookup, none of the readahead
    /// bookkeeping; the request is recorded and the lookup emitted as for any read. An invalid range is
    /// `None` too, and [`Self::read_block`] then says what is wrong with it.
    pub(crate) fn read_cached(&self, range: Range<u64>) -> Option<Bytes> {
        let bs = self.cache.inner.cfg.block_size.bytes();
        let end = range.end.min(self.obj.meta.size);
        if range.start >= end {
            return None;
        }
        let i = range.start / bs;
        if (end - 1) / bs != i {
            return None;
        }
        // Fetched for this reader (a cold open that read the start of the object): `read_block` takes it with
        // its budget share, and the fill is not counted as a hit.
        if self.ra.lock().prefetched.contains_key(&i) {
            return None;
        }
        let d = self.obj.digest(i);
        let b = self
            .cache
            .ram_hit(&self.ctx, &self.obj.id, &d, Instant::now())?;
        // The RAM tier kept a block a hint staged: its read is here, so the staged copy goes back.
        self.cache.forget_staged(&d);
        let (lo, hi) = ((range.start - i * bs) as usize, (end - i * bs) as usize);
        (hi <= b.len()).then(|| b.slice(lo..hi))
    }

    /// Bytes `range`; the end is clamped to the object's size. A start past the end is an error.
    #[cfg(test)]
    pub(crate) async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let size = self.obj.meta.size;
        if range.start > size || range.start > range.end {
            return Err(Error::invalid_input(format!(
                "range {}..{} is outside {} ({} bytes)",
                range.start, range.end, self.obj.meta.key, size
            )));
        }
        let end = range.end.min(size);
        if range.start == end {
            return Ok(Bytes::new());
        }
        let bs = self.cache.inner.cfg.block_size.bytes();
        let (first, last) = (range.start / bs, (end - 1) / bs);
        if last > first {
            self.prefetch(range.start..end, false).await;
        }
        self.schedule_readahead(first, last, end);
        // The tests' whole-range read awaits a few blocks at a time (the cold ones are already started).
        let par = 8;
        use futures::{StreamExt, TryStreamExt};
        let blocks: Vec<Bytes> = futures::stream::iter(first..=last)
            .map(|i| self.block(i))
            .buffered(par)
            .try_collect()
            .await?;
        let slice_of = |i: u64, b: &Bytes| -> Result<Bytes> {
            let bstart = i * bs;
            let lo = range.start.max(bstart) - bstart;
            let hi = end.min(bstart + b.len() as u64) - bstart;
            if hi < lo || hi > b.len() as u64 {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "block {i} of {} is shorter than expected",
                        self.obj.meta.key
                    ),
                ));
            }
            Ok(b.slice(lo as usize..hi as usize))
        };
        if blocks.len() == 1 {
            return slice_of(first, &blocks[0]);
        }
        let mut out = bytes::BytesMut::with_capacity((end - range.start) as usize);
        for (n, b) in blocks.iter().enumerate() {
            out.extend_from_slice(&slice_of(first + n as u64, b)?);
        }
        Ok(out.freeze())
    }

    /// Start fetching the uncached blocks of `range` now, consecutive ones together: one backend request per
    /// run of up to half the in-flight budget. A reader that knows it will read a whole range (a ranged GET of
    /// the gateway) calls this first, so a cold 50 MiB range costs one backend request, not one per block.
    ///
    /// The fetched blocks are held for this reader, and their share of the in-flight budget with them, until
    /// read. With `wait`, the first run waits for budget; later runs (and every run without `wait`) start only
    /// if budget is free now, so a reader never waits for budget while holding some (no deadlock); blocks not
    /// started here are fetched when read.
    pub(crate) async fn prefetch(&self, range: Range<u64>, wait: bool) {
        let size = self.obj.meta.size;
        let end = range.end.min(size);
        if range.start >= end {
            return;
        }
        let cfg = &self.cache.inner.cfg;
        let bs = cfg.block_size.bytes();
        let cap = self.cache.max_run_blocks();
        let (first, last) = (range.start / bs, (end - 1) / bs);
        let runs = {
            let ra = self.ra.lock();
            crate::stage::cold_runs(first, last, cap, |i| {
                let d = self.obj.digest(i);
                !ra.prefetched.contains_key(&i)
                    && !self.cache.holds(&d)
                    && !self.cache.is_staged(&d)
            })
        };
        let block_len = |i: u64| ((i + 1) * bs).min(size) - i * bs;
        for (n, (start, count)) in runs.into_iter().enumerate() {
            let len: u64 = (start..start + count).map(block_len).sum();
            // Wait only while holding no budget: a reader that holds some never waits for more.
            let holds_budget = self.ra.lock().prefetched.values().any(|(_, p)| p.is_some());
            let permit = if wait && n == 0 && !holds_budget {
                self.cache.acquire_budget(len).await
            } else {
                self.cache.inner.budget.try_take(len)
            };
            let Some(permit) = permit else {
                self.cache
                    .inner
                    .counters
                    .readahead_skipped
                    .fetch_add(1, Ordering::Relaxed);
                return;
            };
            let futs = self.cache.fetch_run(
                &self.ctx,
                &self.obj,
                start,
                count,
                FillMode::Readahead,
                None,
                None,
            );
            // Each block carries its share of the budget until it is read.
            let shares = permit.into_blocks((start..start + count).map(block_len));
            let mut ra = self.ra.lock();
            for ((i, f), share) in (start..).zip(futs).zip(shares) {
                ra.prefetched.insert(i, (f, share));
            }
        }
    }

    #[cfg(test)]
    pub(crate) async fn block(&self, i: u64) -> Result<Bytes> {
        let pre = self.ra.lock().prefetched.remove(&i);
        if let Some((fut, permit)) = pre {
            let r = fut.await;
            drop(permit);
            if let Ok(b) = &r {
                self.cache
                    .count_filled_read(&self.ctx, &self.obj.id, b.len() as u64);
                return r;
            }
        }
        self.cache.block(&self.ctx, &self.obj, i).await
    }

    pub(crate) fn schedule_readahead(&self, first: u64, last: u64, end: u64) {
        let cfg = &self.cache.inner.cfg;
        if cfg.readahead_blocks == 0 {
            return;
        }
        let bs = cfg.block_size.bytes();
        let nblocks = self.obj.meta.size.div_ceil(bs);
        let mut ra = self.ra.lock();
        let sequential = match ra.next {
            None => first == 0,
            Some(n) => first == n || first + 1 == n,
        };
        ra.next = Some(end / bs);
        if !sequential {
            // A jump: readahead of the old position is useless (runs for the current read stay).
            ra.window = 0;
            ra.prefetched.retain(|&i, _| i >= first && i <= last);
            return;
        }
        ra.window = (ra.window * 2).clamp(1, cfg.readahead_blocks);
        ra.prefetched.retain(|&i, _| i > last);
        let upto = (last + ra.window as u64).min(nblocks.saturating_sub(1));
        for i in last + 1..=upto {
            if ra.prefetched.contains_key(&i) {
                continue;
            }
            let d = self.obj.digest(i);
            if self.cache.holds(&d) || self.cache.is_staged(&d) {
                continue;
            }
            let len = (self.obj.meta.size - i * bs).min(bs);
            let Some(permit) = self.cache.inner.budget.try_take(len) else {
                self.cache
                    .inner
                    .counters
                    .readahead_skipped
                    .fetch_add(1, Ordering::Relaxed);
                break;
            };
            let fut = self
                .cache
                .fetch(&self.ctx, &self.obj, i, FillMode::Readahead, None);
            self.cache
                .inner
                .counters
                .readahead
                .fetch_add(1, Ordering::Relaxed);
            ra.prefetched.insert(i, (fut, Some(permit)));
        }
    }
}
