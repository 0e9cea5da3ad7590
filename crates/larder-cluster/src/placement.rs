//! Where a unit lives: weighted rendezvous (highest random weight) hashing over the live members.
//!
//! Every member scores every unit; the highest score owns it, and the rest, in score order, are the
//! candidates a read tries next. A member's score for a unit is `weight / -ln(u)`, where `u` in (0, 1) is
//! a stable hash of the unit's key digest and the member's id: the minimum of independent exponential
//! variables of rates `weight`, so a member owns each unit with probability `weight / sum of weights`,
//! exactly. Nothing is stored but the member list: no ring, no virtual nodes, no table to rebuild.
//!
//! What follows from the construction, and is tested below:
//! - A member joining takes units only for itself, each from its previous owner; a member leaving gives
//!   away only its own units, each to its second candidate. Nothing else moves: a change of one member
//!   moves its share of the units (`weight / total`), about 1/N for N equal members.
//! - Every node computes the same owner from the same member list, in every build and process: the hash
//!   is xxh3 with the member id as seed, over the unit's 16-byte key digest (part 7's portable keys).
//!
//! The cost is one hash per member per lookup: the `placement` benchmark measures it for 10 to 1,000
//! members.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// A member's identity as placement knows it: the node id kept in its cache directory.
pub type MemberId = u64;

/// A live member and its weight (its cache size, in any unit shared by all members).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: MemberId,
    pub weight: u64,
}

/// The placement of units over a set of members. Built once per membership view, then shared.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Placement {
    /// Sorted by id, weights above zero, no id twice.
    members: Vec<(MemberId, f64)>,
}

/// A 16-byte unit key digest as a hash input.
pub type UnitDigest = [u8; 16];

impl Placement {
    /// The placement over `members`. Members of weight zero own nothing and are left out; a member named
    /// twice counts once, with the larger weight.
    pub fn new(members: impl IntoIterator<Item = Member>) -> Placement {
        let mut list: Vec<Member> = members.into_iter().filter(|m| m.weight > 0).collect();
        list.sort_by_key(|m| (m.id, std::cmp::Reverse(m.weight)));
        list.dedup_by_key(|m| m.id);
        Placement {
            members: list.into_iter().map(|m| (m.id, m.weight as f64)).collect(),
        }
    }

    /// How many members own units.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The members, by id.
    pub fn members(&self) -> impl Iterator<Item = Member> + '_ {
        self.members.iter().map(|&(id, w)| Member { id, weight: w as u64 })
    }

    /// The owner of `unit`: the member with the highest score. `None` with no members.
    pub fn owner(&self, unit: &UnitDigest) -> Option<MemberId> {
        let mut best: Option<(f64, MemberId)> = None;
        for &(id, weight) in &self.members {
            let s = score(unit, id, weight);
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, id));
            }
        }
        best.map(|(_, id)| id)
    }

    /// The first `n` candidates for `unit`, owner first, in the order a read tries them.
    pub fn candidates(&self, unit: &UnitDigest, n: usize) -> Vec<MemberId> {
        let mut scored: Vec<(f64, MemberId)> = self
            .members
            .iter()
            .map(|&(id, weight)| (score(unit, id, weight), id))
            .collect();
        let n = n.min(scored.len());
        if n == 0 {
            return Vec::new();
        }
        // Highest first; ties (practically impossible) go to the lower id, so every node agrees.
        let order = |a: &(f64, MemberId), b: &(f64, MemberId)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        scored.select_nth_unstable_by(n - 1, order);
        scored.truncate(n);
        scored.sort_by(order);
        scored.into_iter().map(|(_, id)| id).collect()
    }
}

/// The score of member `id` of `weight` for `unit`: `weight / -ln(u)`, `u` uniform in (0, 1) from the
/// unit and the member alone.
pub fn score(unit: &UnitDigest, id: MemberId, weight: f64) -> f64 {
    let h = xxh3_64_with_seed(unit, id);
    // The top 53 bits, as a double strictly between 0 and 1.
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    weight / -u.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(i: u64) -> UnitDigest {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&xxh3_64_with_seed(&i.to_le_bytes(), 1).to_le_bytes());
        d[8..].copy_from_slice(&xxh3_64_with_seed(&i.to_le_bytes(), 2).to_le_bytes());
        d
    }

    fn members(weights: &[u64]) -> Vec<Member> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| Member {
                id: 0x1000 + i as u64 * 7919,
                weight,
            })
            .collect()
    }

    #[test]
    fn each_member_owns_its_weights_share() {
        let weights = [1, 2, 3, 4, 10];
        let p = Placement::new(members(&weights));
        let total: u64 = weights.iter().sum();
        let units = 200_000u64;
        let mut owned = std::collections::HashMap::new();
        for i in 0..units {
            *owned.entry(p.owner(&unit(i)).unwrap()).or_insert(0u64) += 1;
        }
        for m in p.members() {
            let want = units as f64 * m.weight as f64 / total as f64;
            let got = *owned.get(&m.id).unwrap_or(&0) as f64;
            assert!(
                (got / want - 1.0).abs() < 0.03,
                "member of weight {} owns {got} units, its share is {want}",
                m.weight
            );
        }
    }

    #[test]
    fn a_join_moves_units_only_to_the_new_member_and_a_leave_only_its_own() {
        let before = Placement::new(members(&[5, 5, 5, 5, 5, 5, 5, 5]));
        let mut with_new = members(&[5, 5, 5, 5, 5, 5, 5, 5]);
        let newcomer = Member { id: 42, weight: 5 };
        with_new.push(newcomer);
        let after = Placement::new(with_new);
        let units = 50_000u64;
        let mut moved = 0;
        for i in 0..units {
            let (a, b) = (before.owner(&unit(i)).unwrap(), after.owner(&unit(i)).unwrap());
            if a != b {
                assert_eq!(b, 42, "unit {i} moved from {a} to {b}, not to the newcomer");
                moved += 1;
            }
        }
        // One member in nine: about 5,556 units.
        let share = moved as f64 / units as f64;
        assert!((share - 1.0 / 9.0).abs() < 0.01, "{share} of the units moved on a join");
        // The newcomer leaves again: exactly its units move back, each to its second candidate.
        for i in 0..units {
            let u = unit(i);
            let c = after.candidates(&u, 2);
            assert_eq!(c[0], after.owner(&u).unwrap());
            if c[0] == 42 {
                assert_eq!(
                    before.owner(&u),
                    Some(c[1]),
                    "a leaver's unit goes to its second candidate"
                );
            } else {
                assert_eq!(before.owner(&u), Some(c[0]), "a unit the leaver did not own moved");
            }
        }
    }

    #[test]
    fn candidates_are_every_member_once_in_score_order() {
        let p = Placement::new(members(&[3, 1, 4, 1, 5, 9, 2, 6]));
        for i in 0..1000 {
            let u = unit(i);
            let all = p.candidates(&u, 100);
            assert_eq!(all.len(), 8);
            let mut sorted = all.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), 8, "a member named twice");
            let scores: Vec<f64> = all
                .iter()
                .map(|id| {
                    let w = p.members().find(|m| m.id == *id).unwrap().weight;
                    score(&u, *id, w as f64)
                })
                .collect();
            assert!(scores.windows(2).all(|w| w[0] >= w[1]), "not in score order");
            assert_eq!(p.candidates(&u, 3), all[..3].to_vec());
            assert_eq!(p.owner(&u), Some(all[0]));
        }
    }

    #[test]
    fn the_member_list_order_weightless_and_repeated_members_change_nothing() {
        let list = members(&[2, 3, 5, 7]);
        let a = Placement::new(list.clone());
        let mut shuffled = list.clone();
        shuffled.reverse();
        shuffled.push(Member { id: 99, weight: 0 });
        shuffled.push(Member {
            id: list[1].id,
            weight: 1,
        });
        let b = Placement::new(shuffled);
        assert_eq!(b.len(), 4);
        for i in 0..2000 {
            assert_eq!(a.candidates(&unit(i), 4), b.candidates(&unit(i), 4));
        }
        assert_eq!(Placement::new([]).owner(&unit(1)), None);
        assert!(Placement::new([]).candidates(&unit(1), 3).is_empty());
    }

    #[test]
    fn owners_are_stable_across_builds() {
        // Golden values, computed apart from this code (Python's xxhash package and the formula in the
        // module doc): every node of a cluster must agree, whatever build it runs. A change here moves
        // every unit of every cluster on upgrade: do not change the score function.
        assert_eq!(xxh3_64_with_seed(&[0u8; 16], 0), 0xd0a6_6a65_c752_8968);
        let p = Placement::new(members(&[1, 1, 1]));
        let owners: Vec<MemberId> = (0..8).map(|i| p.owner(&unit(i)).unwrap()).collect();
        assert_eq!(owners, GOLDEN_OWNERS);
    }

    const GOLDEN_OWNERS: [MemberId; 8] = [0x4dde, 0x1000, 0x4dde, 0x4dde, 0x4dde, 0x1000, 0x1000, 0x1000];
}
