//! The deterministic global order of an epoch and its partition over consumers.
//!
//! An epoch's order is a pure function of `(seed, epoch, shard sample counts, window)`:
//!
//! 1. the shards are permuted (Fisher–Yates driven by SplitMix64 seeded from `seed` and `epoch`);
//! 2. their samples are concatenated in that order into one *stream* of `N` samples;
//! 3. the stream is cut into windows of `window` consecutive samples and each window is permuted on its own.
//!
//! Global position `p` therefore maps to a sample in O(log shards + window) time with no state: resuming at any
//! position costs the same, and the order does not depend on how many nodes, ranks or workers consume it.
//! The random generator is written out here (not taken from a crate) so the order stays bit-for-bit stable
//! across dependency upgrades.
//!
//! Partition: ranks take positions round-robin (`start + rank + k * ranks`); inside a rank, consecutive chunks
//! of `batch_size` of the rank's stream go to the dataloader workers round-robin, which is the order in which
//! PyTorch's `DataLoader` takes batches from its workers. A rank that has consumed `k` samples has therefore
//! consumed exactly the first `k` of its stream, whatever its number of workers, and after every rank consumed
//! `k`, the first `start + k * ranks` global positions are consumed: the resume point.

use serde::{Deserialize, Serialize};
use strata_types::{Error, Result};

/// SplitMix64: tiny, fast, and fixed forever (the order must never change under a user's feet).
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64, stream: u64, index: u64) -> Self {
        let mut s = Self(seed ^ 0x9E37_79B9_7F4A_7C15);
        let a = s.next() ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03);
        let mut s = Self(a);
        let b = s.next() ^ index.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7);
        Self(b)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift with rejection), `n > 0`.
    fn below(&mut self, n: u64) -> u64 {
        loop {
            let m = (self.next() as u128) * (n as u128);
            let low = m as u64;
            if low >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }
}

/// A seeded permutation of `0..n`.
fn permutation(n: usize, seed: u64, stream: u64, index: u64) -> Vec<u32> {
    let mut p: Vec<u32> = (0..n as u32).collect();
    let mut rng = SplitMix64::new(seed, stream, index);
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

const STREAM_SHARDS: u64 = 1;
const STREAM_WINDOW: u64 = 2;

/// How samples are shuffled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shuffle {
    /// Seed of every permutation.
    pub seed: u64,
    /// Samples permuted together inside the shard-ordered stream (1 = shard-level shuffle only).
    pub window: u32,
}

/// Bytes a default shuffle window spans.
pub const AUTO_WINDOW_SPAN: u64 = 384 << 20;

/// The default shuffle window for samples of `avg_sample_bytes`: as many samples as fit in
/// [`AUTO_WINDOW_SPAN`], between 64 and 16,384. A window's bytes are read at random while it is consumed, so
/// they must fit the cache; this keeps them bounded whatever the sample size. It depends only on the dataset,
/// so the order is still the same for every partition.
pub fn auto_window(avg_sample_bytes: u64) -> u32 {
    (AUTO_WINDOW_SPAN / avg_sample_bytes.max(1)).clamp(64, 16_384) as u32
}

/// The default RAM for a rank's cache: the shuffle window's bytes with a quarter to spare plus a few blocks,
/// between 256 MiB and 4 GiB.
pub fn auto_cache_bytes(window: u32, avg_sample_bytes: u64, block_size: u64) -> u64 {
    (u64::from(window) * avg_sample_bytes * 5 / 4 + 4 * block_size).clamp(256 << 20, 4 << 30)
}

/// What to do with the tail of an epoch that does not divide evenly over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TailPolicy {
    /// Every rank gets `floor(remaining / ranks)` samples; up to `ranks - 1` samples are skipped this epoch.
    #[default]
    Drop,
    /// Every rank gets `ceil(remaining / ranks)` samples; the missing ones repeat samples from the start of
    /// this epoch's order.
    Pad,
}

impl std::str::FromStr for TailPolicy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "drop" => Ok(Self::Drop),
            "pad" => Ok(Self::Pad),
            _ => Err(Error::invalid_input(format!(
                "tail policy {s:?}: expected \"drop\" or \"pad\""
            ))),
        }
    }
}

/// One epoch's global order over a dataset whose shards have the given sample counts.
#[derive(Debug, Clone)]
pub struct EpochOrder {
    /// Shard index (in dataset order) at each slot of the shuffled shard order.
    shard_order: Vec<u32>,
    /// `starts[i]` = first stream index of the `i`-th shard in shuffled order; one extra entry = total.
    starts: Vec<u64>,
    shuffle: Option<Shuffle>,
    epoch: u64,
}

impl EpochOrder {
    /// Build the order of `epoch`. `counts[s]` is the number of samples of shard `s`.
    pub fn new(counts: &[u64], shuffle: Option<Shuffle>, epoch: u64) -> Self {
        let shard_order: Vec<u32> = match shuffle {
            Some(s) => permutation(counts.len(), s.seed, STREAM_SHARDS, epoch),
            None => (0..counts.len() as u32).collect(),
        };
        let mut starts = Vec::with_capacity(counts.len() + 1);
        let mut acc = 0u64;
        for &s in &shard_order {
            starts.push(acc);
            acc += counts[s as usize];
        }
        starts.push(acc);
        Self {
            shard_order,
            starts,
            shuffle,
            epoch,
        }
    }

    /// Samples in the epoch.
    pub fn len(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }

    /// Whether the epoch has no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The window permutation containing stream position `p`, with the window's first position.
    pub fn window_of(&self, p: u64) -> Option<(u64, Vec<u32>)> {
        let s = self.shuffle?;
        let w = u64::from(s.window.max(1));
        let first = p / w * w;
        let len = w.min(self.len() - first) as usize;
        Some((
            first,
            permutation(len, s.seed, STREAM_WINDOW, (self.epoch << 40) ^ (p / w)),
        ))
    }

    /// The `(shard, sample in shard)` at stream index `q` (after window shuffling).
    pub fn locate_stream(&self, q: u64) -> (usize, u64) {
        let slot = self.starts.partition_point(|&s| s <= q) - 1;
        (self.shard_order[slot] as usize, q - self.starts[slot])
    }

    /// The shards and sample ranges that stream indices `range` cover, in stream order.
    pub fn stream_spans(&self, range: std::ops::Range<u64>) -> Vec<(usize, std::ops::Range<u64>)> {
        let mut out = Vec::new();
        let end = range.end.min(self.len());
        let mut q = range.start;
        while q < end {
            let slot = self.starts.partition_point(|&s| s <= q) - 1;
            let slot_end = self.starts[slot + 1].min(end);
            out.push((
                self.shard_order[slot] as usize,
                (q - self.starts[slot])..(slot_end - self.starts[slot]),
            ));
            q = slot_end;
        }
        out
    }

    /// The `(shard, sample in shard)` at global position `p < len()`. Positions are usually visited in order;
    /// use a [`Cursor`] for that, which computes each window's permutation once.
    pub fn locate(&self, p: u64) -> (usize, u64) {
        let q = match self.window_of(p) {
            Some((first, perm)) => first + u64::from(perm[(p - first) as usize]),
            None => p,
        };
        self.locate_stream(q)
    }
}

/// A consumer's place in the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    /// Global rank (`node * ranks_per_node + local_rank`).
    pub rank: u32,
    /// Ranks in the job.
    pub world: u32,
    /// Dataloader worker in the rank.
    pub worker: u32,
    /// Dataloader workers per rank.
    pub workers: u32,
    /// Samples per batch: workers take turns chunk by chunk, as the DataLoader does.
    pub batch_size: u32,
}

impl Partition {
    /// Check the fields.
    pub fn validate(&self) -> Result<()> {
        if self.world == 0 || self.rank >= self.world {
            return Err(Error::invalid_input(format!(
                "rank {} is not in a world of {} ranks",
                self.rank, self.world
            )));
        }
        if self.workers == 0 || self.worker >= self.workers {
            return Err(Error::invalid_input(format!(
                "worker {} is not among {} workers",
                self.worker, self.workers
            )));
        }
        if self.batch_size == 0 {
            return Err(Error::invalid_input("batch_size must be at least 1"));
        }
        Ok(())
    }

    /// Samples each rank gets when `remaining` global positions are left.
    pub fn per_rank(&self, remaining: u64, tail: TailPolicy) -> u64 {
        let w = u64::from(self.world);
        match tail {
            TailPolicy::Drop => remaining / w,
            TailPolicy::Pad => remaining.div_ceil(w),
        }
    }

    /// The global positions this worker yields, in order, for an epoch of `len` positions resumed at `start`
    /// (positions past `len`, only with [`TailPolicy::Pad`], wrap to the start of the order).
    pub fn positions(
        &self,
        len: u64,
        start: u64,
        tail: TailPolicy,
    ) -> impl Iterator<Item = u64> + Send + 'static {
        let per_rank = self.per_rank(len.saturating_sub(start), tail);
        let me = *self;
        let bs = u64::from(me.batch_size);
        let nw = u64::from(me.workers);
        // Rank-stream indices k with (k / bs) % nw == worker.
        let first_chunk = u64::from(me.worker);
        (0..)
            .map(move |i: u64| first_chunk + i * nw)
            .take_while(move |chunk| chunk * bs < per_rank)
            .flat_map(move |chunk| (chunk * bs)..((chunk + 1) * bs).min(per_rank))
            .map(move |k| {
                let p = start + u64::from(me.rank) + k * u64::from(me.world);
                if p >= len && len > 0 { p % len } else { p }
            })
    }
}

/// Walks positions in increasing order inside windows, caching the current window's permutation.
#[derive(Debug)]
pub struct Cursor<'a> {
    order: &'a EpochOrder,
    window: Option<(u64, Vec<u32>)>,
}

impl<'a> Cursor<'a> {
    /// A cursor over `order`.
    pub fn new(order: &'a EpochOrder) -> Self {
        Self {
            order,
            window: None,
        }
    }

    /// `(shard, sample in shard)` at global position `p`.
    pub fn locate(&mut self, p: u64) -> (usize, u64) {
        let Some(s) = self.order.shuffle else {
            return self.order.locate_stream(p);
        };
        let w = u64::from(s.window.max(1));
        let fresh = match &self.window {
            Some((first, _)) => *first != p / w * w,
            None => true,
        };
        if fresh {
            self.window = self.order.window_of(p);
        }
        let (first, perm) = self.window.as_ref().expect("window set above");
        self.order
            .locate_stream(first + u64::from(perm[(p - first) as usize]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn permutation_is_a_permutation_and_stable() {
        let p = permutation(1000, 42, 1, 0);
        let set: HashSet<u32> = p.iter().copied().collect();
        assert_eq!(set.len(), 1000);
        assert_eq!(p, permutation(1000, 42, 1, 0));
        assert_ne!(p, permutation(1000, 43, 1, 0));
        // Pinned values: changing the generator silently would reorder every user's epochs.
        assert_eq!(&permutation(10, 7, 1, 3), &[2, 8, 1, 6, 5, 3, 4, 0, 7, 9]);
    }

    #[test]
    fn every_sample_once_per_epoch_whatever_the_partition() {
        let counts = [5u64, 17, 1, 0, 33, 9];
        let order = EpochOrder::new(&counts, Some(Shuffle { seed: 9, window: 7 }), 2);
        let n = order.len();
        assert_eq!(n, 65);
        let all: HashSet<(usize, u64)> = (0..n).map(|p| order.locate(p)).collect();
        assert_eq!(all.len() as u64, n);
        for (world, workers, bs) in [(1, 1, 1), (5, 1, 1), (5, 3, 2), (13, 2, 4)] {
            let mut seen = Vec::new();
            for rank in 0..world {
                for worker in 0..workers {
                    let part = Partition {
                        rank,
                        world,
                        worker,
                        workers,
                        batch_size: bs,
                    };
                    seen.extend(part.positions(n, 0, TailPolicy::Pad));
                }
            }
            let distinct: HashSet<u64> = seen.iter().copied().collect();
            assert_eq!(distinct.len() as u64, n, "world {world} workers {workers}");
            assert_eq!(
                seen.len() as u64,
                n.div_ceil(u64::from(world)) * u64::from(world)
            );
        }
    }

    #[test]
    fn stream_spans_cover_a_range_once() {
        let counts = [5u64, 0, 7, 3];
        let order = EpochOrder::new(&counts, Some(Shuffle { seed: 4, window: 4 }), 1);
        let spans = order.stream_spans(3..14);
        let n: u64 = spans.iter().map(|(_, r)| r.end - r.start).sum();
        assert_eq!(n, 11);
        let mut from_locate: Vec<(usize, u64)> = (3..14).map(|q| order.locate_stream(q)).collect();
        let mut from_spans: Vec<(usize, u64)> = spans
            .iter()
            .flat_map(|(s, r)| r.clone().map(move |i| (*s, i)))
            .collect();
        from_locate.sort();
        from_spans.sort();
        assert_eq!(from_locate, from_spans);
    }

    #[test]
    fn cursor_matches_locate() {
        let counts = [100u64, 3, 250];
        let order = EpochOrder::new(
            &counts,
            Some(Shuffle {
                seed: 1,
                window: 64,
            }),
            0,
        );
        let mut c = Cursor::new(&order);
        for p in 0..order.len() {
            assert_eq!(c.locate(p), order.locate(p));
        }
    }
}
