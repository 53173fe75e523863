//! Replacement policy shared by the RAM and disk tiers: CLOCK (LRU approximated) plus a TinyLFU admission filter,
//! with pinning.
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
//! Recency is kept the CLOCK way (second chance), not by moving an entry to the back of the order on every
//! hit: a hit only marks its entry referenced, and victim selection, scanning from the oldest, sends a
//! referenced entry to the back once (clearing the mark) instead of evicting it. A hit, the hot path of every
//! cached read, is then a hash lookup and a flag, with no reordering; the order work is paid once per entry
//! per pass of the clock, and only when something must be evicted. Victims are the entries a true LRU would
//! choose up to the resolution of one pass.
//!
//! Pinned entries are outside the order and are never chosen as victims; pinned bytes are capped.
//!
//! An explicit warm-up forces admission (`force`: the operator asked for the data), bypassing the filter.
//! Pinned bytes are capped at `pinned_max_percent` of the pinning tier (the disk tier when there is one, else
//! RAM); a block of a pinned prefix past the cap is admitted unpinned.
//!
//! Entries are kept in a [`DigestMap`]: the keys are blake3 digests already, so they are hashed with a seeded
//! multiply-fold of their words instead of SipHash (the per-process seed keeps clients that choose object keys
//! from aiming entries at one bucket).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A cache index key: the blake3 digest of a [`strata_types::BlockKey`].
pub type Digest = [u8; 32];

/// A map keyed by [`Digest`]s. Digests are already uniformly random, so hashing one needs no SipHash: the
/// words are mixed into a per-process random seed (a 64 x 64 -> 128-bit multiply, folded, per word), which
/// costs a few nanoseconds on every cache hit instead of a SipHash of 32 bytes, and still leaves a client that
/// chooses object keys no way to aim entries at one bucket without knowing the seed.
pub type DigestMap<V> = std::collections::HashMap<Digest, V, DigestState>;

/// The [`std::hash::BuildHasher`] of [`DigestMap`].
#[derive(Debug, Clone, Copy)]
pub struct DigestState(u64);

impl Default for DigestState {
    fn default() -> Self {
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        Self(*SEED.get_or_init(|| rand::random::<u64>() | 1))
    }
}

impl std::hash::BuildHasher for DigestState {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher(self.0)
    }
}

/// Hasher of [`DigestMap`]: see there.
#[derive(Debug, Clone, Copy)]
pub struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            self.mix(u64::from_le_bytes(b));
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }
}

impl DigestHasher {
    fn mix(&mut self, x: u64) {
        let m = u128::from(self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15_u128 | 1);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }
}

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
    /// Requested since it was last placed in `order` (its second chance).
    referenced: bool,
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
    entries: DigestMap<Entry>,
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
            entries: DigestMap::default(),
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

    /// Record a request for `d` (hit or miss); on a hit also mark it recently used.
    pub fn record_request(&mut self, d: &Digest) {
        self.sketch.increment(d);
        if let Some(e) = self.entries.get_mut(d) {
            e.referenced = true;
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
        // Victims: the oldest unpinned entries until the candidate fits, giving a referenced entry its second
        // chance (to the back of the order, unmarked) before any of them is taken.
        let mut victims = Vec::new();
        let mut freed = 0u64;
        let need = (self.used + size).saturating_sub(self.capacity);
        if need > 0 {
            let mut second = Vec::new();
            for (&s, v) in self.order.iter() {
                if freed >= need {
                    break;
                }
                let Some(e) = self.entries.get(v) else {
                    continue;
                };
                if e.referenced {
                    second.push((s, *v));
                } else {
                    victims.push(*v);
                    freed += e.size;
                }
            }
            // A whole pass found too little: the clock comes round to the entries it just passed, oldest first.
            let mut taken = 0;
            for (_, v) in &second {
                if freed >= need {
                    break;
                }
                victims.push(*v);
                freed += self.entries.get(v).map_or(0, |e| e.size);
                taken += 1;
            }
            // The hand moved whether or not the candidate gets in.
            for &(s, v) in &second[taken..] {
                self.order.remove(&s);
                let n = self.next_seq;
                self.next_seq += 1;
                self.order.insert(n, v);
                if let Some(e) = self.entries.get_mut(&v) {
                    e.seq = Some(n);
                    e.referenced = false;
                }
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
        self.entries.insert(
            d,
            Entry {
                size,
                seq,
                referenced: false,
            },
        );
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
        self.entries.insert(
            d,
            Entry {
                size,
                seq: Some(s),
                referenced: false,
            },
        );
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
            e.referenced = false;
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

    #[test]
    fn digest_hashes_use_every_byte() {
        use std::hash::BuildHasher;
        let st = DigestState::default();
        let mut seen = std::collections::HashSet::new();
        for pos in 0..32 {
            for v in 1..=255u8 {
                let mut d = [0u8; 32];
                d[pos] = v;
                assert_eq!(st.hash_one(d), st.hash_one(d));
                seen.insert(st.hash_one(d));
            }
        }
        // 32 x 255 digests that differ in one byte, wherever it is, and none of them collide.
        assert_eq!(seen.len(), 32 * 255);
        let mut m = DigestMap::default();
        m.insert([1u8; 32], 1);
        assert_eq!(m.get(&[1u8; 32]), Some(&1));
        assert_eq!(m.get(&[2u8; 32]), None);
    }

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
    fn requested_entries_get_a_second_chance() {
        let mut p = Policy::new(PolicyKind::Lru, 3, 0, 3);
        let add = |p: &mut Policy, i: u64| {
            p.record_request(&d(i));
            p.admit(d(i), 1, false, false).evicted
        };
        for i in 0..3 {
            assert!(add(&mut p, i).is_empty());
        }
        p.record_request(&d(0)); // a hit
        assert_eq!(
            add(&mut p, 3),
            vec![d(1)],
            "the oldest unrequested entry goes"
        );
        assert_eq!(add(&mut p, 4), vec![d(2)]);
        assert_eq!(add(&mut p, 5), vec![d(0)], "a second chance is spent");
        // Every entry requested: a whole pass spares them all, then the oldest goes after all.
        for i in [3, 4, 5] {
            p.record_request(&d(i));
        }
        assert_eq!(add(&mut p, 6), vec![d(3)]);
        assert_eq!(
            add(&mut p, 7),
            vec![d(4)],
            "the others lost their mark in that pass"
        );
        assert_eq!(p.used(), 3);
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
