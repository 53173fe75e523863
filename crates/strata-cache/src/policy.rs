//! Replacement policy shared by the RAM and disk tiers: LRU order plus a TinyLFU admission filter, with pinning.
//!
//! # Why this policy
//!
//! Training reads a data set in epochs: cyclic scans. When the data set is larger than the cache, plain LRU
//! evicts every block just before it is needed again and the hit ratio collapses to zero from the second scan on.
//! A cache that instead *keeps* a fixed resident set serves `cache / dataset` of each scan.
//!
//! The admission filter gives exactly that. A count-min sketch estimates how often each block was requested
//! (hits and misses alike), with all counters halved every `10 × entries` requests so old popularity fades.
//! When the cache is full, a missed block is admitted only if its request history *before this request* is
//! strictly greater than the history of every victim it would evict (the least recently used unpinned blocks).
//! In a cyclic scan every block has the same history, so the newcomer loses the tie and the resident set stays:
//! hit ratio ≈ capacity / dataset. A block that is genuinely hotter than the LRU victims (requested repeatedly
//! while not resident) wins and gets in, so a changed working set still takes over, within a few rounds of
//! halving. An empty or partly filled cache admits everything.
//!
//! [`PolicyKind::Lru`] turns the filter off; benchmarks use it as the baseline.
//!
//! Pinned entries are outside the LRU order and are never chosen as victims; pinned bytes are capped.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// A cache index key: the blake3 digest of a [`strata_types::BlockKey`].
pub type Digest = [u8; 32];

/// Which replacement policy a tier uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// LRU order with TinyLFU admission (scan resistant). The default.
    #[default]
    Tinylfu,
    /// Plain LRU: admit everything, evict the least recently used.
    Lru,
}

/// Outcome of [`Policy::admit`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Admission {
    /// Whether the candidate was admitted.
    pub admitted: bool,
    /// Entries evicted to make room (the caller frees their bytes).
    pub evicted: Vec<Digest>,
    /// Whether the candidate was admitted as pinned.
    pub pinned: bool,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    /// Position in `order`; `None` when pinned.
    seq: Option<u64>,
}

/// Count-min sketch with 8-bit counters and periodic halving.
#[derive(Debug)]
struct Sketch {
    rows: [Vec<u8>; 4],
    mask: usize,
    additions: u64,
    reset_at: u64,
}

impl Sketch {
    fn new(entries_hint: usize) -> Self {
        let width = (entries_hint.max(64) * 4).next_power_of_two();
        Self {
            rows: std::array::from_fn(|_| vec![0u8; width]),
            mask: width - 1,
            additions: 0,
            reset_at: (entries_hint.max(64) as u64) * 10,
        }
    }

    fn index(&self, d: &Digest, row: usize) -> usize {
        let mut b = [0u8; 8];
        b.copy_from_slice(&d[row * 8..row * 8 + 8]);
        (u64::from_le_bytes(b) as usize) & self.mask
    }

    fn estimate(&self, d: &Digest) -> u8 {
        (0..4)
            .map(|r| self.rows[r][self.index(d, r)])
            .min()
            .unwrap_or(0)
    }

    fn increment(&mut self, d: &Digest) {
        let est = self.estimate(d);
        if est < u8::MAX {
            // Conservative update: only raise the counters that equal the minimum.
            for r in 0..4 {
                let i = self.index(d, r);
                if self.rows[r][i] == est {
                    self.rows[r][i] = est + 1;
                }
            }
        }
        self.additions += 1;
        if self.additions >= self.reset_at {
            for row in &mut self.rows {
                for c in row.iter_mut() {
                    *c /= 2;
                }
            }
            self.additions /= 2;
        }
    }
}

/// Bookkeeping of one tier: which entries it holds, their sizes, their order, what is pinned.
/// The tier owns the bytes; the policy only decides.
#[derive(Debug)]
pub struct Policy {
    kind: PolicyKind,
    capacity: u64,
    pinned_cap: u64,
    used: u64,
    pinned_bytes: u64,
    next_seq: u64,
    entries: HashMap<Digest, Entry>,
    order: BTreeMap<u64, Digest>,
    sketch: Sketch,
}

impl Policy {
    /// A policy for `capacity` bytes, of which at most `pinned_cap` may be pinned. `entries_hint` sizes the
    /// frequency sketch (about capacity / block size).
    pub fn new(kind: PolicyKind, capacity: u64, pinned_cap: u64, entries_hint: usize) -> Self {
        Self {
            kind,
            capacity,
            pinned_cap: pinned_cap.min(capacity),
            used: 0,
            pinned_bytes: 0,
            next_seq: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            sketch: Sketch::new(entries_hint),
        }
    }

    /// Capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    /// Bytes held.
    pub fn used(&self) -> u64 {
        self.used
    }
    /// Bytes held by pinned entries.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes
    }
    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
    /// Whether `d` is held.
    pub fn contains(&self, d: &Digest) -> bool {
        self.entries.contains_key(d)
    }

    /// Record a request for `d` (hit or miss); on a hit also make it most recently used.
    pub fn record_request(&mut self, d: &Digest) {
        self.sketch.increment(d);
        if let Some(e) = self.entries.get_mut(d)
            && let Some(old) = e.seq
        {
            self.order.remove(&old);
            let seq = self.next_seq;
            self.next_seq += 1;
            e.seq = Some(seq);
            self.order.insert(seq, *d);
        }
    }

    /// Try to admit `d` of `size` bytes. `pin` asks for a pinned slot (granted while pinned bytes stay under the
    /// cap, else the entry is admitted unpinned). `force` bypasses the frequency filter (explicit warm-up).
    /// The caller must have called [`Self::record_request`] for this request already.
    pub fn admit(&mut self, d: Digest, size: u64, pin: bool, force: bool) -> Admission {
        let mut out = Admission::default();
        if self.entries.contains_key(&d) {
            out.admitted = true;
            return out;
        }
        if size > self.capacity {
            return out;
        }
        let pinned = pin && self.pinned_bytes + size <= self.pinned_cap;
        // Victims: least recently used unpinned entries until the candidate fits.
        let mut victims = Vec::new();
        let mut freed = 0u64;
        let need = (self.used + size).saturating_sub(self.capacity);
        if need > 0 {
            for (_, v) in self.order.iter() {
                if freed >= need {
                    break;
                }
                victims.push(*v);
                freed += self.entries.get(v).map_or(0, |e| e.size);
            }
            if freed < need {
                return out; // everything left is pinned
            }
            if self.kind == PolicyKind::Tinylfu && !force && !pinned {
                let history = self.sketch.estimate(&d).saturating_sub(1);
                if victims.iter().any(|v| self.sketch.estimate(v) >= history) {
                    return out;
                }
            }
        }
        for v in &victims {
            self.remove(v);
        }
        out.evicted = victims;
        let seq = if pinned {
            self.pinned_bytes += size;
            None
        } else {
            let s = self.next_seq;
            self.next_seq += 1;
            self.order.insert(s, d);
            Some(s)
        };
        self.entries.insert(d, Entry { size, seq });
        self.used += size;
        out.admitted = true;
        out.pinned = pinned;
        out
    }

    /// Insert an entry found on disk at start-up, oldest first, bypassing admission. Returns false (and keeps
    /// nothing) when it does not fit.
    pub fn restore(&mut self, d: Digest, size: u64) -> bool {
        if self.used + size > self.capacity || self.entries.contains_key(&d) {
            return false;
        }
        let s = self.next_seq;
        self.next_seq += 1;
        self.order.insert(s, d);
        self.entries.insert(d, Entry { size, seq: Some(s) });
        self.used += size;
        true
    }

    /// Forget `d`. Returns its size if it was held.
    pub fn remove(&mut self, d: &Digest) -> Option<u64> {
        let e = self.entries.remove(d)?;
        match e.seq {
            Some(s) => {
                self.order.remove(&s);
            }
            None => self.pinned_bytes -= e.size,
        }
        self.used -= e.size;
        Some(e.size)
    }

    /// Pin a held entry (no longer evictable). False if not held or the pinned cap would be exceeded.
    pub fn pin(&mut self, d: &Digest) -> bool {
        let cap = self.pinned_cap;
        let pinned_bytes = self.pinned_bytes;
        let Some(e) = self.entries.get_mut(d) else {
            return false;
        };
        let Some(s) = e.seq else {
            return true;
        };
        if pinned_bytes + e.size > cap {
            return false;
        }
        self.order.remove(&s);
        e.seq = None;
        self.pinned_bytes += e.size;
        true
    }

    /// Unpin a held entry; it becomes the most recently used.
    pub fn unpin(&mut self, d: &Digest) {
        if let Some(e) = self.entries.get_mut(d)
            && e.seq.is_none()
        {
            let s = self.next_seq;
            self.next_seq += 1;
            e.seq = Some(s);
            self.pinned_bytes -= e.size;
            self.order.insert(s, *d);
        }
    }

    /// Whether `d` is held and pinned.
    pub fn is_pinned(&self, d: &Digest) -> bool {
        self.entries.get(d).is_some_and(|e| e.seq.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(i: u64) -> Digest {
        *blake3::hash(&i.to_le_bytes()).as_bytes()
    }

    /// Hit ratio of scans 2.. of `scans` cyclic scans over `dataset` blocks with a cache of `cap` blocks.
    fn cyclic(kind: PolicyKind, cap: u64, dataset: u64, scans: usize) -> f64 {
        let mut p = Policy::new(kind, cap, 0, cap as usize);
        let (mut hits, mut total) = (0u64, 0u64);
        for scan in 0..scans {
            for i in 0..dataset {
                let k = d(i);
                p.record_request(&k);
                let hit = p.contains(&k);
                if !hit {
                    p.admit(k, 1, false, false);
                }
                if scan > 0 {
                    total += 1;
                    hits += hit as u64;
                }
            }
        }
        hits as f64 / total as f64
    }

    #[test]
    fn tinylfu_resists_cyclic_scans_where_lru_collapses() {
        let lfu = cyclic(PolicyKind::Tinylfu, 500, 1000, 6);
        let lru = cyclic(PolicyKind::Lru, 500, 1000, 6);
        assert!(lfu >= 0.4, "tinylfu hit ratio {lfu}");
        assert!(lru < 0.05, "lru hit ratio {lru}");
    }

    #[test]
    fn hot_newcomers_displace_cold_residents() {
        let mut p = Policy::new(PolicyKind::Tinylfu, 10, 0, 10);
        for i in 0..10 {
            p.record_request(&d(i));
            assert!(p.admit(d(i), 1, false, false).admitted);
        }
        let hot = d(100);
        p.record_request(&hot);
        assert!(
            !p.admit(hot, 1, false, false).admitted,
            "a one-off newcomer is not admitted"
        );
        p.record_request(&hot);
        p.record_request(&hot);
        let a = p.admit(hot, 1, false, false);
        assert!(a.admitted, "a repeatedly requested block gets in");
        assert_eq!(a.evicted, vec![d(0)], "the LRU victim goes");
        assert_eq!(p.used(), 10);
    }

    #[test]
    fn pinned_entries_are_never_victims_and_capped() {
        let mut p = Policy::new(PolicyKind::Lru, 4, 2, 4);
        for i in 0..4 {
            p.record_request(&d(i));
            p.admit(d(i), 1, false, false);
        }
        assert!(p.pin(&d(0)));
        assert!(p.pin(&d(1)));
        assert!(!p.pin(&d(2)), "cap of 2 pinned bytes");
        for i in 10..20 {
            p.record_request(&d(i));
            p.admit(d(i), 1, false, false);
        }
        assert!(p.contains(&d(0)) && p.contains(&d(1)));
        assert_eq!(p.pinned_bytes(), 2);
        p.unpin(&d(0));
        assert_eq!(p.pinned_bytes(), 1);
        for i in 20..30 {
            p.record_request(&d(i));
            p.admit(d(i), 1, false, false);
        }
        assert!(!p.contains(&d(0)), "unpinned entries are evictable again");
        assert!(p.contains(&d(1)));
    }

    #[test]
    fn all_pinned_rejects_newcomers() {
        let mut p = Policy::new(PolicyKind::Lru, 2, 2, 2);
        for i in 0..2 {
            p.record_request(&d(i));
            assert!(p.admit(d(i), 1, true, false).pinned);
        }
        p.record_request(&d(9));
        assert!(!p.admit(d(9), 1, false, true).admitted);
        assert_eq!(p.used(), 2);
    }

    #[test]
    fn oversized_entries_are_rejected() {
        let mut p = Policy::new(PolicyKind::Lru, 10, 0, 10);
        assert!(!p.admit(d(1), 11, false, true).admitted);
        assert_eq!(p.used(), 0);
    }
}
