//! Weighted rendezvous hashing of block keys over a [`View`]'s members.
//!
//! Each member `m` of weight `w` scores a key `k` as `w / -ln(u)`, where `u` in (0, 1) is the member's and the
//! key's hash (blake3 of both, so every agent, on every platform, computes the same value). The owners of a
//! key are the members by descending score. This is the weighted form of HRW (Schindelhauer and Schomaker,
//! "Weighted distributed hash tables", 2005): a member's expected share of keys is its weight over the sum of
//! weights, and when a member leaves, only the keys it owned move (each to its next owner); when one joins,
//! only the keys it now scores highest on move to it.

use crate::membership::{Member, View};

/// A member's score for `key` (higher wins).
pub fn score(member: &Member, key: &[u8]) -> f64 {
    let mut h = blake3::Hasher::new();
    h.update(&(member.id.len() as u64).to_le_bytes());
    h.update(member.id.as_bytes());
    h.update(key);
    let bytes = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&bytes.as_bytes()[..8]);
    // 53 bits of the hash as a uniform value strictly inside (0, 1).
    let u = ((u64::from_le_bytes(first) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    member.weight / -u.ln()
}

/// The members of `view` in owner order for `key`: the first owns it, the next is asked when the first
/// cannot answer. Ties (equal scores, practically never) go to the smaller id, so the order is total.
pub fn owners<'a>(view: &'a View, key: &[u8]) -> Vec<&'a Member> {
    let mut scored: Vec<(f64, &Member)> = view
        .members()
        .iter()
        .filter(|m| m.weight > 0.0)
        .map(|m| (score(m, key), m))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    scored.into_iter().map(|(_, m)| m).collect()
}

/// The first owner of `key`, if the view has any member.
pub fn owner<'a>(view: &'a View, key: &[u8]) -> Option<&'a Member> {
    view.members()
        .iter()
        .filter(|m| m.weight > 0.0)
        .map(|m| (score(m, key), m))
        .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.id.cmp(&a.1.id)))
        .map(|(_, m)| m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(weights: &[f64]) -> View {
        View::new(
            weights
                .iter()
                .enumerate()
                .map(|(i, &w)| Member::new(format!("http://10.0.0.{i}:7070"), w))
                .collect(),
        )
    }

    fn shares(v: &View, keys: usize) -> Vec<usize> {
        let mut n = vec![0usize; v.members().len()];
        for k in 0..keys {
            let o = owner(v, format!("block-{k}").as_bytes()).unwrap();
            n[v.members().iter().position(|m| m.id == o.id).unwrap()] += 1;
        }
        n
    }

    #[test]
    fn equal_members_share_evenly() {
        // The balance figure: 100,000 blocks over 4 equal agents, max/mean <= 1.05.
        let n = shares(&view(&[1.0; 4]), 100_000);
        let mean = 100_000.0 / 4.0;
        let max = *n.iter().max().unwrap() as f64;
        assert!(max / mean <= 1.05, "{n:?}");
    }

    #[test]
    fn weighted_members_share_by_weight() {
        // Capacities 1:2:3:4: each share within 5% of its weight.
        let n = shares(&view(&[1.0, 2.0, 3.0, 4.0]), 100_000);
        for (i, &got) in n.iter().enumerate() {
            let want = 100_000.0 * (i + 1) as f64 / 10.0;
            assert!(
                ((got as f64) - want).abs() / want <= 0.05,
                "{i}: {got} vs {want} ({n:?})"
            );
        }
    }

    #[test]
    fn a_member_leaving_moves_only_its_own_blocks() {
        let all = view(&[1.0; 5]);
        let without = View::new(all.members()[..4].to_vec());
        let gone = &all.members()[4].id;
        for k in 0..20_000 {
            let key = format!("b{k}");
            let before = owner(&all, key.as_bytes()).unwrap();
            let after = owner(&without, key.as_bytes()).unwrap();
            if before.id != *gone {
                assert_eq!(before.id, after.id, "{key} moved though its owner stayed");
            } else {
                // It moves to the one that was second.
                assert_eq!(owners(&all, key.as_bytes())[1].id, after.id);
            }
        }
    }

    #[test]
    fn the_order_of_the_members_changes_no_owner() {
        let v = view(&[1.0, 2.0, 1.0]);
        let mut reversed = v.members().to_vec();
        reversed.reverse();
        let r = View::new(reversed);
        for k in 0..5_000 {
            let key = format!("x{k}");
            let a: Vec<_> = owners(&v, key.as_bytes()).iter().map(|m| &m.id).collect();
            let b: Vec<_> = owners(&r, key.as_bytes()).iter().map(|m| &m.id).collect();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn scores_are_the_same_everywhere() {
        // Pinned: a change here moves every block of every running cluster.
        let m = Member::new("http://node1:7070", 1.0);
        let s = score(&m, b"e:abc/0");
        assert!((s - score(&m, b"e:abc/0")).abs() == 0.0);
        assert_eq!(format!("{s:.6}"), PINNED_SCORE);
    }

    const PINNED_SCORE: &str = "0.910020";

    #[test]
    fn members_of_no_weight_own_nothing() {
        let v = view(&[0.0, 1.0]);
        assert_eq!(owners(&v, b"k").len(), 1);
        assert_eq!(owner(&View::new(Vec::new()), b"k"), None);
    }
}
