//! The in-flight budget: the one owner of every reservation of memory for bytes on their way in.
//!
//! Bytes being fetched from a backend, blocks fetched ahead for a reader or staged for a hint, blocks read
//! from the disk tier for a sender, and blocks queued for the disk writers past the lossy queue's free slots
//! all hold a [`Share`] of one [`Budget`] (`cache.inflight_budget`, counted in KiB units). A share is the only
//! way to hold budget and it gives its units back when dropped, so what is in flight is exactly what live
//! shares say, whoever holds them.
//!
//! The rules, each one method:
//!
//! - **Strict reservations never wait** ([`Budget::try_take`]): readahead, hint runs, a reader's own miss.
//!   A reader's own miss proceeds without a share when the budget is short, so demand reads exceed the
//!   budget by at most the one block each reader is reading (a reader may hold shares for blocks it fetched
//!   ahead, and readers waiting on each other's budget would deadlock).
//! - **Waiting reservations** ([`Budget::take`]) are for callers that hold none: warm-up runs, an open that
//!   reads the object's start, a reader holding nothing. While the budget is short, the caller's `reclaim`
//!   gives back shares that only hold memory for a hint (staged blocks that have landed), so hints never make
//!   a read wait for them.
//! - **Spill** ([`Budget::try_spill`]): blocks queued for the disk writers beyond the free slots hold their
//!   size of the budget *and* of a spill bound of half the budget, so queued writes never take more than half
//!   of what reads may use.
//!
//! The block buffer pool reads [`Budget::free_bytes`] to keep no more spare buffers than the budget not in use.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Bytes per budget unit (semaphore permit).
pub(crate) const UNIT: u64 = 1024;

/// How often a reservation waiting on hints that are still arriving looks again.
const RECLAIM_POLL: Duration = Duration::from_millis(10);

/// The budget. Cheap to clone: clones share it.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    sem: Arc<Semaphore>,
    spill: Arc<Semaphore>,
    total: u64,
}

/// A reservation of budget, given back when dropped. Split it to hand each block of a run its own share.
#[must_use = "a share gives its budget back when dropped"]
#[derive(Debug)]
pub(crate) struct Share(OwnedSemaphorePermit);

/// A queued disk write's reservation: its size of the budget and of the spill bound.
#[must_use = "a spill share gives its budget back when dropped"]
#[derive(Debug)]
pub(crate) struct Spill {
    _spill: OwnedSemaphorePermit,
    _share: Share,
}

/// Budget units for `bytes` (at least one, so every reservation holds something).
fn units(bytes: u64) -> u32 {
    bytes.div_ceil(UNIT).max(1).min(u32::MAX as u64) as u32
}

impl Budget {
    /// A budget of `bytes` (rounded down to whole units).
    pub(crate) fn new(bytes: u64) -> Self {
        let total = bytes / UNIT;
        Self {
            sem: Arc::new(Semaphore::new(total as usize)),
            spill: Arc::new(Semaphore::new((total / 2) as usize)),
            total,
        }
    }

    /// A share of `bytes` if that much is free now; never waits.
    pub(crate) fn try_take(&self, bytes: u64) -> Option<Share> {
        self.sem
            .clone()
            .try_acquire_many_owned(units(bytes))
            .ok()
            .map(Share)
    }

    /// A share of `bytes`, waiting for it. While it is short, `reclaim(bytes)` is asked to give back shares
    /// held for hints until `bytes` are free; it answers whether more such shares are still arriving (then
    /// this looks again shortly, else it waits for budget to be given back). `None` once the budget is
    /// closed.
    pub(crate) async fn take(
        &self,
        bytes: u64,
        mut reclaim: impl FnMut(u64) -> bool,
    ) -> Option<Share> {
        let n = units(bytes);
        loop {
            if let Some(s) = self.try_take(bytes) {
                return Some(s);
            }
            let arriving = reclaim(bytes);
            if let Some(s) = self.try_take(bytes) {
                return Some(s);
            }
            if !arriving {
                return self.sem.clone().acquire_many_owned(n).await.ok().map(Share);
            }
            tokio::select! {
                p = self.sem.clone().acquire_many_owned(n) => return p.ok().map(Share),
                _ = tokio::time::sleep(RECLAIM_POLL) => {}
            }
        }
    }

    /// A spill share of `bytes` for a queued disk write, if both the budget and the spill bound have room.
    pub(crate) fn try_spill(&self, bytes: u64) -> Option<Spill> {
        let spill = self
            .spill
            .clone()
            .try_acquire_many_owned(units(bytes))
            .ok()?;
        Some(Spill {
            _share: self.try_take(bytes)?,
            _spill: spill,
        })
    }

    /// Whether `bytes` are free now.
    pub(crate) fn has_free(&self, bytes: u64) -> bool {
        self.sem.available_permits() as u64 >= u64::from(units(bytes))
    }

    /// Bytes free now.
    pub(crate) fn free_bytes(&self) -> u64 {
        self.sem.available_permits() as u64 * UNIT
    }

    /// The whole budget in bytes.
    pub(crate) fn total_bytes(&self) -> u64 {
        self.total * UNIT
    }

    /// Refuse every reservation from now on; waiting ones end with `None` (the cache shuts down).
    pub(crate) fn close(&self) {
        self.sem.close();
        self.spill.close();
    }
}

impl Share {
    /// Bytes this share holds (whole units).
    pub(crate) fn bytes(&self) -> u64 {
        self.0.num_permits() as u64 * UNIT
    }

    /// Split a share of `bytes` off this one (`None` if this one holds no more than that: it stays whole).
    pub(crate) fn split_off(&mut self, bytes: u64) -> Option<Share> {
        let n = units(bytes) as usize;
        if n >= self.0.num_permits() {
            return None;
        }
        self.0.split(n).map(Share)
    }

    /// One share per block of a run, in order, from a share taken for the whole run: each block gets its
    /// length's worth, the last whatever is left (a share too small for every block leaves the last ones
    /// without).
    pub(crate) fn into_blocks(self, lens: impl IntoIterator<Item = u64>) -> Vec<Option<Share>> {
        let lens: Vec<u64> = lens.into_iter().collect();
        let count = lens.len();
        let mut rest = Some(self);
        lens.into_iter()
            .enumerate()
            .map(|(k, len)| {
                if k + 1 == count {
                    rest.take()
                } else {
                    rest.as_mut().and_then(|s| s.split_off(len))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KIB: u64 = 1024;

    #[test]
    fn a_share_gives_its_budget_back_when_dropped() {
        let b = Budget::new(64 * KIB);
        let s = b.try_take(40 * KIB).expect("free");
        assert_eq!(b.free_bytes(), 24 * KIB);
        assert!(
            b.try_take(32 * KIB).is_none(),
            "a strict reservation never goes over"
        );
        drop(s);
        assert_eq!(b.free_bytes(), 64 * KIB);
    }

    #[test]
    fn a_run_share_splits_into_one_share_per_block_and_the_last_takes_the_rest() {
        let b = Budget::new(64 * KIB);
        let run = b.try_take(20 * KIB).expect("free");
        let shares = run.into_blocks([8 * KIB, 8 * KIB, 4 * KIB]);
        let held: Vec<u64> = shares
            .iter()
            .map(|s| s.as_ref().map_or(0, Share::bytes))
            .collect();
        assert_eq!(held, [8 * KIB, 8 * KIB, 4 * KIB]);
        drop(shares);
        assert_eq!(b.free_bytes(), 64 * KIB);
    }

    #[test]
    fn spill_takes_both_the_budget_and_at_most_half_of_it() {
        let b = Budget::new(64 * KIB);
        let s1 = b.try_spill(32 * KIB).expect("half fits");
        assert!(
            b.try_spill(1).is_none(),
            "the spill bound is half the budget"
        );
        assert_eq!(b.free_bytes(), 32 * KIB, "a spill holds budget too");
        drop(s1);
        let _reads = b.try_take(60 * KIB).expect("free");
        assert!(b.try_spill(8 * KIB).is_none(), "no spill without budget");
        assert_eq!(
            b.free_bytes(),
            4 * KIB,
            "a refused spill gives back what it took"
        );
    }

    #[tokio::test]
    async fn a_waiting_reservation_reclaims_hints_then_waits_and_ends_when_closed() {
        let b = Budget::new(16 * KIB);
        let hint = std::sync::Arc::new(parking_lot::Mutex::new(b.try_take(16 * KIB)));
        let h = hint.clone();
        let got = b
            .take(8 * KIB, move |_| {
                h.lock().take();
                false
            })
            .await;
        assert_eq!(
            got.map(|s| s.bytes()),
            Some(8 * KIB),
            "the hint's share was given back"
        );
        assert!(hint.lock().is_none());
        let _all = b.try_take(16 * KIB).expect("free again");
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.take(KIB, |_| false).await.is_some() }
        });
        tokio::task::yield_now().await;
        b.close();
        assert!(!waiter.await.expect("joined"), "a closed budget answers no");
    }
}
