//! Block-sized buffers reused across threads.
//!
//! Every cold block is assembled in a block-sized buffer and every block read from the disk tier is read into
//! one; the RAM tier keeps some, the rest are dropped once sent. Left to the allocator, the 8 MiB buffers
//! cost twice: fresh memory is faulted in (and zeroed by the kernel) before it is written, and buffers freed
//! on one thread and allocated on another sit in per-thread arenas until they decay, hundreds of MiB over the
//! RAM tier in the hot phases we measured. The pool keeps freed block buffers (every full-size block, whoever
//! drops the last `Bytes` of it) and hands them to the next fill or disk read, already mapped.
//!
//! Bounded by the in-flight budget: a buffer coming back is kept only while the pool's buffers fit in the
//! budget not in use and in half the whole budget, so pooled memory never stands in for bytes the budget
//! would let in flight, and RSS stays within RAM tier + budget.
//!
//! A buffer goes back when the last `Bytes` of it is dropped (`Bytes::from_owner`), on whatever thread. Counted
//! in `strata_cache_block_buffers_total{event="reused"|"allocated"|"released"}` and the gauge
//! `strata_cache_block_pool_bytes`.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::budget::Budget;

/// Reusable buffers of exactly one block size.
#[derive(Debug)]
pub(crate) struct BlockPool {
    len: usize,
    free: Mutex<Vec<Vec<u8>>>,
    budget: Budget,
    /// Most buffers kept, whatever the budget: half of it.
    max_kept: usize,
    pub(crate) reused: AtomicU64,
    pub(crate) allocated: AtomicU64,
    pub(crate) released: AtomicU64,
}

impl BlockPool {
    /// A pool of `len`-byte buffers bounded by `budget`.
    pub(crate) fn new(len: usize, budget: Budget) -> Arc<Self> {
        let max_kept = (budget.total_bytes() / 2 / len.max(1) as u64) as usize;
        Arc::new(Self {
            len,
            free: Mutex::new(Vec::new()),
            budget,
            max_kept,
            reused: AtomicU64::new(0),
            allocated: AtomicU64::new(0),
            released: AtomicU64::new(0),
        })
    }

    /// An empty buffer for `len` bytes: a pooled one when `len` is the block size, else a fresh one that is
    /// freed as usual (the last block of an object, small objects).
    pub(crate) fn take(self: &Arc<Self>, len: usize) -> BlockBuf {
        if len != self.len {
            return BlockBuf {
                buf: strata_types::mem::prefaulted_vec(len),
                filled: 0,
                pool: None,
            };
        }
        let buf = match self.free.lock().pop() {
            Some(b) => {
                self.reused.fetch_add(1, Ordering::Relaxed);
                b
            }
            None => {
                self.allocated.fetch_add(1, Ordering::Relaxed);
                strata_types::mem::prefaulted_vec(len)
            }
        };
        BlockBuf {
            buf,
            filled: 0,
            pool: Some(self.clone()),
        }
    }

    /// Buffers kept now.
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().len()
    }

    fn give_back(&self, buf: Vec<u8>) {
        let spare = self.budget.free_bytes() / self.len.max(1) as u64;
        let room = (spare as usize).min(self.max_kept);
        let mut free = self.free.lock();
        if free.len() < room {
            free.push(buf);
        } else {
            drop(free);
            self.released.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A buffer being filled; [`Self::freeze`] makes it a `Bytes` that goes back to its pool when the last clone
/// is dropped.
///
/// `buf.len()` is how much of it was ever written (so a reused buffer needs no zeroing); `filled` is how much
/// holds this block.
#[derive(Debug, Default)]
pub(crate) struct BlockBuf {
    buf: Vec<u8>,
    filled: usize,
    pool: Option<Arc<BlockPool>>,
}

impl BlockBuf {
    pub(crate) fn len(&self) -> usize {
        self.filled
    }

    /// The filled bytes.
    pub(crate) fn filled(&self) -> &[u8] {
        &self.buf[..self.filled]
    }

    /// Append `s`; grows past the capacity like a `Vec` (a caller that asked for the right size never does).
    pub(crate) fn extend_from_slice(&mut self, s: &[u8]) {
        let end = self.filled + s.len();
        let overlap = self.buf.len().min(end).saturating_sub(self.filled);
        self.buf[self.filled..self.filled + overlap].copy_from_slice(&s[..overlap]);
        self.buf.extend_from_slice(&s[overlap..]);
        self.filled = end;
    }

    /// Read exactly `n` bytes from `r` into the buffer (replacing what it held).
    pub(crate) fn read_exact_from(&mut self, r: &mut impl Read, n: usize) -> std::io::Result<()> {
        if self.buf.len() < n {
            self.buf.resize(n, 0);
        }
        self.filled = 0;
        r.read_exact(&mut self.buf[..n])?;
        self.filled = n;
        Ok(())
    }

    /// The filled bytes as `Bytes`, without a copy.
    pub(crate) fn freeze(self) -> Bytes {
        Bytes::from_owner(Pooled {
            buf: self.buf,
            filled: self.filled,
            pool: self.pool,
        })
    }
}

/// The owner behind a frozen [`BlockBuf`].
struct Pooled {
    buf: Vec<u8>,
    filled: usize,
    pool: Option<Arc<BlockPool>>,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.filled]
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(std::mem::take(&mut self.buf));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(len: usize, budget_bytes: u64) -> (Arc<BlockPool>, Budget) {
        let budget = Budget::new(budget_bytes);
        (BlockPool::new(len, budget.clone()), budget)
    }

    #[test]
    fn a_dropped_block_goes_back_and_is_reused_without_its_old_bytes_showing() {
        let (p, _sem) = pool(64 * 1024, 1 << 20);
        let mut b = p.take(64 * 1024);
        b.extend_from_slice(&[1u8; 64 * 1024]);
        let frozen = b.freeze();
        let clone = frozen.slice(10..20);
        drop(frozen);
        assert_eq!(p.kept(), 0, "a clone still holds it");
        drop(clone);
        assert_eq!(p.kept(), 1);
        let mut b = p.take(64 * 1024);
        assert_eq!(p.reused.load(Ordering::Relaxed), 1);
        assert_eq!(b.len(), 0);
        b.extend_from_slice(&[2u8; 100]);
        b.extend_from_slice(&[3u8; 100]);
        let f = b.freeze();
        assert_eq!(f.len(), 200);
        assert!(f[..100].iter().all(|&x| x == 2) && f[100..].iter().all(|&x| x == 3));
        let mut b = p.take(64 * 1024);
        assert_eq!(
            p.allocated.load(Ordering::Relaxed),
            2,
            "the first is still held"
        );
        b.read_exact_from(&mut &[9u8; 5000][..], 5000).unwrap();
        assert_eq!(b.freeze(), Bytes::from(vec![9u8; 5000]));
    }

    #[test]
    fn other_sizes_are_not_pooled() {
        let (p, _sem) = pool(64 * 1024, 1 << 20);
        let mut b = p.take(1000);
        b.extend_from_slice(&[5u8; 1500]);
        assert_eq!(b.freeze(), Bytes::from(vec![5u8; 1500]), "grows like a Vec");
        assert_eq!(p.kept(), 0);
    }

    #[test]
    fn kept_buffers_fit_in_the_unused_budget_and_in_half_of_it() {
        // Budget of 8 blocks: at most 4 kept.
        let (p, sem) = pool(64 * 1024, 8 * 64 * 1024);
        let bufs: Vec<Bytes> = (0..8).map(|_| p.take(64 * 1024).freeze()).collect();
        drop(bufs);
        assert_eq!(p.kept(), 4);
        assert_eq!(p.released.load(Ordering::Relaxed), 4);
        // With 7 of 8 blocks of budget in use, one fits.
        let held = sem.try_take(7 * 64 * 1024).unwrap();
        let bufs: Vec<Bytes> = (0..6).map(|_| p.take(64 * 1024).freeze()).collect();
        assert_eq!(p.kept(), 0);
        drop(bufs);
        assert_eq!(p.kept(), 1);
        drop(held);
    }

    #[test]
    fn a_short_read_is_an_error() {
        let (p, _sem) = pool(64 * 1024, 1 << 20);
        let mut b = p.take(64 * 1024);
        let e = b
            .read_exact_from(&mut &[1u8; 10][..], 64 * 1024)
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
