//! Blocks fetched for a prefetch hint ([`BlockCache::prefetch`]), held until a read takes them.
//!
//! A loader entering a shuffle window says which bytes it will read soon, then reads them sample by sample,
//! in another order, from this process or through the node agent. Once fetched, a block only waits in the
//! tiers if their admission lets it in, and a full RAM tier's frequency filter keeps one-off newcomers out: a
//! hint whose blocks were dropped on arrival is a second origin read per block (measured: a loader whose
//! hints went straight to a full RAM tier cost the origin 5x the CPU and ran at a third of the speed).
//!
//! So a hinted block is *staged*: its fill and its share of the in-flight budget are held here, whatever the
//! tiers admit, until the first read of the block takes them ([`BlockCache::take_staged`], from every read
//! path) or `prefetch_hold_ms` passes ([`crate::CacheConfig::prefetch_hold_ms`]). Bounds: each staged block
//! holds its own share of the in-flight budget, taken only if free (a hint never waits), and a block is staged
//! once. Hints yield to demand: a reader that must wait for budget takes it back from staged blocks that
//! have landed, oldest first ([`BlockCache::acquire_budget`]), so hints never make a read wait for them.
//! Expired entries are dropped by a sweeper task once a second (a scan of at most half the budget's worth of
//! entries; it stops with the cache) and by the next hint.

use crate::budget::Share;
use crate::fill::{FillMode, SharedFetch};
use crate::policy::Digest;
use crate::policy::DigestMap;
use crate::state::BlockCache;
use crate::state::ObjState;
use futures::FutureExt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use strata_types::IoContext;

/// The staged blocks.
#[derive(Default)]
pub(crate) struct Staged {
    map: DigestMap<StagedBlock>,
    /// Budget bytes held by staged blocks.
    held: u64,
    last_sweep: Option<Instant>,
}

struct StagedBlock {
    fill: SharedFetch,
    share: Option<Share>,
    at: Instant,
}

impl Staged {
    fn remove(&mut self, d: &Digest) -> Option<StagedBlock> {
        let b = self.map.remove(d)?;
        self.held -= b.held();
        Some(b)
    }

    fn sweep(&mut self, now: Instant, hold: std::time::Duration) {
        let every = hold.min(std::time::Duration::from_secs(1));
        if self
            .last_sweep
            .is_some_and(|t| now.duration_since(t) < every)
        {
            return;
        }
        self.last_sweep = Some(now);
        let mut freed = 0;
        self.map.retain(|_, b| {
            let keep = now.duration_since(b.at) < hold;
            if !keep {
                freed += b.held();
            }
            keep
        });
        self.held -= freed;
    }
}

impl StagedBlock {
    fn held(&self) -> u64 {
        self.share.as_ref().map_or(0, Share::bytes)
    }
}

impl BlockCache {
    /// Stage the cold blocks of `range` of `obj`: runs of consecutive blocks (one backend request each, up to
    /// half the in-flight budget), as far as free budget and the staging bound allow now. Returns once the
    /// runs are started.
    pub(crate) fn stage(&self, ctx: &IoContext, obj: &Arc<ObjState>, range: Range<u64>) {
        let size = obj.meta.size;
        let end = range.end.min(size);
        if range.start >= end {
            return;
        }
        let cfg = &self.inner.cfg;
        let bs = cfg.block_size.bytes();
        let cap = self.max_run_blocks();
        let (first, last) = (range.start / bs, (end - 1) / bs);
        let runs = {
            let mut st = self.inner.staged.lock();
            st.sweep(Instant::now(), self.stage_hold());
            cold_runs(first, last, cap, |i| {
                let d = obj.digest(i);
                !st.map.contains_key(&d) && !self.holds(&d)
            })
        };
        let block_len = |i: u64| ((i + 1) * bs).min(size) - i * bs;
        for (start, count) in runs {
            let len: u64 = (start..start + count).map(block_len).sum();
            let Some(share) = self.inner.budget.try_take(len) else {
                self.skipped_readahead();
                return;
            };
            let fills = self.fetch_run(ctx, obj, start, count, FillMode::Readahead, None, None);
            let shares = share.into_blocks((start..start + count).map(block_len));
            let now = Instant::now();
            let mut st = self.inner.staged.lock();
            for ((i, fill), share) in (start..).zip(fills).zip(shares) {
                let b = StagedBlock {
                    fill,
                    share,
                    at: now,
                };
                st.held += b.held();
                if let Some(old) = st.map.insert(obj.digest(i), b) {
                    st.held -= old.held();
                }
            }
        }
    }

    /// The staged fill of block `d` with its budget share, if a hint staged it: the first read of a staged
    /// block takes it (and its share: a sender keeps it until the bytes have left).
    pub(crate) fn take_staged(&self, d: &Digest) -> Option<(SharedFetch, Option<Share>)> {
        let mut st = self.inner.staged.lock();
        if st.map.is_empty() {
            return None;
        }
        let b = st.remove(d)?;
        drop(st);
        self.inner
            .counters
            .hints_read
            .fetch_add(1, Ordering::Relaxed);
        Some((b.fill, b.share))
    }

    /// Drop block `d`'s staged copy, if any: a tier served its read.
    pub(crate) fn forget_staged(&self, d: &Digest) {
        let mut st = self.inner.staged.lock();
        if !st.map.is_empty() {
            drop(st.remove(d));
        }
    }

    /// Whether a hint staged block `d` and no read has taken it yet.
    pub(crate) fn is_staged(&self, d: &Digest) -> bool {
        let st = self.inner.staged.lock();
        !st.map.is_empty() && st.map.contains_key(d)
    }

    /// A share of `bytes` of the in-flight budget for a reader that may wait for it (fills that must run, a
    /// sender's disk reads). Hints yield to demand: while the budget is short, staged blocks whose fills have
    /// landed give theirs back, oldest first (the bytes stay in whatever tier admitted them); staged blocks
    /// still arriving are reclaimed once they land. `None` once the cache shuts down.
    pub(crate) async fn acquire_budget(&self, bytes: u64) -> Option<Share> {
        self.inner
            .budget
            .take(bytes, |want| self.reclaim_staged(want))
            .await
    }

    /// Give back the budget of landed staged blocks, oldest first, until `want` bytes are free; whether staged
    /// blocks still arriving remain.
    fn reclaim_staged(&self, want: u64) -> bool {
        let mut st = self.inner.staged.lock();
        let mut landed: Vec<(Instant, Digest)> = st
            .map
            .iter()
            .filter(|(_, b)| b.share.is_some() && landed(&b.fill))
            .map(|(d, b)| (b.at, *d))
            .collect();
        landed.sort_unstable_by_key(|(at, _)| *at);
        for (_, d) in landed {
            if self.inner.budget.has_free(want) {
                break;
            }
            drop(st.remove(&d));
            self.inner
                .counters
                .hints_reclaimed
                .fetch_add(1, Ordering::Relaxed);
        }
        st.map
            .values()
            .any(|b| b.fill.peek().is_none() && b.share.is_some())
    }

    /// Staged blocks and the budget they hold (bytes), for statistics.
    pub(crate) fn staged_stats(&self) -> (u64, u64) {
        let st = self.inner.staged.lock();
        (st.map.len() as u64, st.held)
    }

    /// Drop expired staged blocks every second (or every hold, if shorter) until the cache shuts down.
    pub(crate) fn start_stage_sweeper(&self) {
        let (cache, cancel) = (self.clone(), self.inner.cancel.clone());
        let every = self.stage_hold().clamp(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(1),
        );
        self.inner.tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(every) => {}
                    _ = cancel.cancelled() => return,
                }
                let hold = cache.stage_hold();
                cache.inner.staged.lock().sweep(Instant::now(), hold);
            }
        });
    }

    fn stage_hold(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.inner.cfg.prefetch_hold_ms)
    }

    fn skipped_readahead(&self) {
        self.inner
            .counters
            .readahead_skipped
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether a staged fill has finished (one poll: a shared fill only completes for those who poll it).
fn landed(fill: &SharedFetch) -> bool {
    fill.clone().now_or_never().is_some()
}

/// Runs `(first block, count)` of consecutive blocks in `first..=last` for which `cold` holds, each at most
/// `cap` blocks long.
pub(crate) fn cold_runs(
    first: u64,
    last: u64,
    cap: u64,
    mut cold: impl FnMut(u64) -> bool,
) -> Vec<(u64, u64)> {
    let mut run: Option<(u64, u64)> = None;
    let mut runs = Vec::new();
    for i in first..=last + 1 {
        let missing = i <= last && cold(i);
        match (&mut run, missing) {
            (Some((_, n)), true) if *n < cap => *n += 1,
            (Some(r), _) => {
                runs.push(*r);
                run = missing.then_some((i, 1));
            }
            (None, true) => run = Some((i, 1)),
            (None, false) => {}
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_consecutive_cold_blocks_capped() {
        let cold = |i: u64| ![3, 4].contains(&i);
        assert_eq!(
            cold_runs(0, 9, 2, cold),
            vec![(0, 2), (2, 1), (5, 2), (7, 2), (9, 1)]
        );
        assert_eq!(cold_runs(0, 0, 8, |_| true), vec![(0, 1)]);
        assert!(cold_runs(2, 5, 8, |_| false).is_empty());
    }
}
