//! Plain least-recently-used eviction over units of any size: a whole small file or one block of a large
//! one, the same units [`S3Fifo`](crate::S3Fifo) orders.
//!
//! It exists as the baseline the benchmark suite compares larder's hybrid units + S3-FIFO against: a plain
//! per-block LRU run of the same engine (`--eviction lru`), only the order of eviction changed. It is not
//! what larder recommends: a one-pass scan larger than the cache pushes the whole working set out (the test
//! `policy::a_scan_pushes_the_working_set_out_of_lru_not_out_of_s3fifo`).
//!
//! Every use stamps the unit with a new, increasing number; the units ordered by stamp are the LRU list
//! (least recent first), so each operation is a map update and an ordered-map move, O(log n). Like S3-FIFO,
//! only evictable units are tracked: the store takes a unit out while it is dirty or pinned.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

use crate::PolicyStats;

/// A unit's place in the list and its size.
#[derive(Clone, Copy, Debug)]
struct Entry {
    stamp: u64,
    size: u64,
}

/// LRU state for units keyed by `K`, with the method set of [`S3Fifo`](crate::S3Fifo).
pub struct Lru<K: Hash + Eq + Clone> {
    entries: HashMap<K, Entry>,
    /// Keys by stamp: least recently used first.
    order: BTreeMap<u64, K>,
    bytes: u64,
    next_stamp: u64,
}

impl<K: Hash + Eq + Clone> Lru<K> {
    /// An empty LRU. `capacity` is taken for the same constructor as S3-FIFO's; LRU's order does not depend
    /// on it (the store decides when to evict).
    pub fn new(capacity: u64) -> Lru<K> {
        let _ = capacity;
        Lru {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            bytes: 0,
            next_stamp: 0,
        }
    }

    /// Bytes of the units tracked.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// Figures for status output: every byte counts as main, there is no small queue and no ghost.
    pub fn stats(&self) -> PolicyStats {
        PolicyStats {
            units: self.entries.len() as u64,
            small_bytes: 0,
            main_bytes: self.bytes,
            ghosts: 0,
        }
    }

    /// Track a unit of `size` bytes as the most recently used; a tracked one gets its size updated and
    /// counts as used.
    pub fn insert(&mut self, key: K, size: u64) {
        let stamp = self.stamp();
        if let Some(e) = self.entries.get_mut(&key) {
            self.order.remove(&e.stamp);
            self.bytes = self.bytes - e.size + size;
            *e = Entry { stamp, size };
        } else {
            self.bytes += size;
            self.entries.insert(key.clone(), Entry { stamp, size });
        }
        self.order.insert(stamp, key);
    }

    /// A use of `key` (a hit): it becomes the most recently used.
    pub fn touch(&mut self, key: &K) {
        let stamp = self.stamp();
        let Some(e) = self.entries.get_mut(key) else { return };
        if let Some(k) = self.order.remove(&e.stamp) {
            self.order.insert(stamp, k);
        }
        e.stamp = stamp;
    }

    /// Stop tracking `key` (it became dirty or pinned, or was dropped): its size.
    pub fn remove(&mut self, key: &K) -> Option<u64> {
        let e = self.entries.remove(key)?;
        self.order.remove(&e.stamp);
        self.bytes -= e.size;
        Some(e.size)
    }

    /// Up to `most` tracked units in the order they would be evicted: least recently used first.
    pub fn eviction_order(&self, most: usize) -> impl Iterator<Item = &K> {
        self.order.values().take(most)
    }

    /// Stop tracking the least recently used unit and return it; `None` when nothing is tracked.
    pub fn evict(&mut self) -> Option<(K, u64)> {
        let (_, key) = self.order.pop_first()?;
        let e = self.entries.remove(&key)?;
        self.bytes -= e.size;
        Some((key, e.size))
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(p: &mut Lru<u64>) -> Vec<u64> {
        std::iter::from_fn(|| p.evict().map(|(k, _)| k)).collect()
    }

    #[test]
    fn the_least_recently_inserted_leaves_first() {
        let mut p = Lru::new(10);
        for k in 0..5u64 {
            p.insert(k, 1);
        }
        assert_eq!(p.eviction_order(3).copied().collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(drain(&mut p), vec![0, 1, 2, 3, 4]);
        assert_eq!(p.evict(), None);
        assert_eq!(p.bytes(), 0);
    }

    #[test]
    fn a_touch_protects_a_unit() {
        let mut p = Lru::new(10);
        for k in 0..4u64 {
            p.insert(k, 1);
        }
        p.touch(&0);
        p.touch(&2);
        p.touch(&99);
        assert_eq!(p.eviction_order(10).copied().collect::<Vec<_>>(), vec![1, 3, 0, 2]);
        assert_eq!(drain(&mut p), vec![1, 3, 0, 2]);
    }

    #[test]
    fn sizes_are_accounted_through_updates_and_removals() {
        let mut p = Lru::new(1000);
        for k in 0..10u64 {
            p.insert(k, 10 + k);
        }
        let total: u64 = (0..10).map(|k| 10 + k).sum();
        assert_eq!(p.bytes(), total);
        // Re-inserting a tracked unit updates its size and counts as a use.
        p.insert(0, 100);
        assert_eq!(p.bytes(), total - 10 + 100);
        assert_eq!(p.stats().units, 10);
        assert_eq!(p.eviction_order(1).next(), Some(&1));
        let stats = p.stats();
        assert_eq!((stats.small_bytes, stats.main_bytes, stats.ghosts), (0, p.bytes(), 0));
        assert_eq!(p.evict(), Some((1, 11)));
        assert_eq!(p.bytes(), total - 10 + 100 - 11);
    }

    #[test]
    fn removed_units_are_never_chosen() {
        let mut p = Lru::new(100);
        for k in 0..30u64 {
            p.insert(k, 1);
        }
        for k in (0..30).step_by(3) {
            assert_eq!(p.remove(&k), Some(1));
        }
        assert_eq!(p.remove(&0), None);
        assert!(!p.contains(&3));
        let order = drain(&mut p);
        assert_eq!(order.len(), 20);
        assert!(order.iter().all(|k| k % 3 != 0), "{order:?}");
        assert_eq!(p.stats(), PolicyStats::default());
    }

    #[test]
    fn empty_units_are_evicted_too() {
        let mut p = Lru::new(100);
        for k in 0..10u64 {
            p.insert(k, 0);
        }
        assert_eq!(drain(&mut p).len(), 10);
    }
}
