//! The RAM tier: a map of `Bytes` under the replacement policy, whose `put` is admission.

use bytes::Bytes;
use parking_lot::Mutex;
use strata_types::BlockKey;

use crate::policy::{Digest, DigestMap, Policy};

/// The RAM tier. Its lock is held only for a map or policy step, never across an await.
pub(crate) struct Ram(Mutex<RamState>);

struct RamState {
    policy: Policy,
    map: DigestMap<(BlockKey, Bytes)>,
}

/// What a [`Ram::put`] did.
pub(crate) struct Admitted {
    /// The block is in the tier.
    pub(crate) kept: bool,
    /// Blocks evicted to make room.
    pub(crate) evicted: u64,
}

impl Ram {
    pub(crate) fn new(policy: Policy) -> Self {
        Self(Mutex::new(RamState {
            policy,
            map: DigestMap::default(),
        }))
    }

    /// The block, recorded as a request in the policy; on a miss nothing is recorded.
    pub(crate) fn hit(&self, d: &Digest) -> Option<Bytes> {
        let mut s = self.0.lock();
        let b = s.map.get(d)?.1.clone();
        s.policy.record_request(d);
        Some(b)
    }

    /// The block, with no policy side effects.
    pub(crate) fn get(&self, d: &Digest) -> Option<Bytes> {
        self.0.lock().map.get(d).map(|(_, b)| b.clone())
    }

    /// Whether the tier holds the block (no policy side effects).
    pub(crate) fn contains(&self, d: &Digest) -> bool {
        self.0.lock().map.contains_key(d)
    }

    /// Whether the tier holds any of `ds`.
    pub(crate) fn contains_any<'a>(&self, mut ds: impl Iterator<Item = &'a Digest>) -> bool {
        let s = self.0.lock();
        ds.any(|d| s.map.contains_key(d))
    }

    pub(crate) fn record_request(&self, d: &Digest) {
        self.0.lock().policy.record_request(d);
    }

    /// Admit a block as the policy says (`pin`: it counts against the pinned cap and is not evicted; `force`:
    /// admitted whatever the frequency filter says), evicting what it chooses.
    pub(crate) fn put(
        &self,
        key: &BlockKey,
        d: Digest,
        b: &Bytes,
        pin: bool,
        force: bool,
    ) -> Admitted {
        let mut s = self.0.lock();
        let a = s.policy.admit(d, b.len() as u64, pin, force);
        for v in &a.evicted {
            s.map.remove(v);
        }
        if a.admitted {
            s.map.insert(d, (key.clone(), b.clone()));
        }
        Admitted {
            kept: a.admitted,
            evicted: a.evicted.len() as u64,
        }
    }

    /// Pin the blocks held whose key `covers`: (pinned, refused by the pinned-bytes cap).
    pub(crate) fn pin_matching(&self, covers: impl Fn(&BlockKey) -> bool) -> (u64, u64) {
        let mut s = self.0.lock();
        let s = &mut *s;
        let (mut ok, mut refused) = (0, 0);
        for (d, (k, _)) in s.map.iter() {
            if covers(k) {
                if s.policy.pin(d) {
                    ok += 1;
                } else {
                    refused += 1;
                }
            }
        }
        (ok, refused)
    }

    /// Unpin the blocks held whose key `release` says.
    pub(crate) fn unpin_matching(&self, release: impl Fn(&BlockKey) -> bool) {
        let mut s = self.0.lock();
        let s = &mut *s;
        for (d, (k, _)) in s.map.iter() {
            if release(k) {
                s.policy.unpin(d);
            }
        }
    }

    /// (capacity, used, pinned bytes, blocks).
    pub(crate) fn usage(&self) -> (u64, u64, u64, u64) {
        let s = self.0.lock();
        (
            s.policy.capacity(),
            s.policy.used(),
            s.policy.pinned_bytes(),
            s.policy.len() as u64,
        )
    }
}
