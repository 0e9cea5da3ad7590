//! The store's eviction policy, chosen at mount time (`--eviction`): S3-FIFO, larder's policy, or plain
//! LRU, kept as a baseline for benchmarks. Both order the same units with the same method set; [`Policy`]
//! forwards to the one chosen.

use std::hash::Hash;

use crate::{Lru, PolicyStats, S3Fifo};

/// Which eviction policy orders the cache's units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Eviction {
    /// S3-FIFO: scan-resistant, cheap hits; the default.
    #[default]
    S3Fifo,
    /// Plain least-recently-used: a baseline for benchmarks, not scan-resistant.
    Lru,
}

impl Eviction {
    /// The policy's name, as `--eviction` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Eviction::S3Fifo => "s3fifo",
            Eviction::Lru => "lru",
        }
    }
}

/// An eviction policy over units keyed by `K`: whichever [`Eviction`] chose.
pub enum Policy<K: Hash + Eq + Clone> {
    /// S3-FIFO ordering.
    S3Fifo(S3Fifo<K>),
    /// Plain LRU ordering.
    Lru(Lru<K>),
}

impl<K: Hash + Eq + Clone> Policy<K> {
    /// A policy of kind `eviction` for `capacity` bytes of evictable units.
    pub fn new(eviction: Eviction, capacity: u64) -> Policy<K> {
        match eviction {
            Eviction::S3Fifo => Policy::S3Fifo(S3Fifo::new(capacity)),
            Eviction::Lru => Policy::Lru(Lru::new(capacity)),
        }
    }

    /// Which policy this is.
    pub fn eviction(&self) -> Eviction {
        match self {
            Policy::S3Fifo(_) => Eviction::S3Fifo,
            Policy::Lru(_) => Eviction::Lru,
        }
    }

    /// Bytes of the units tracked.
    pub fn bytes(&self) -> u64 {
        match self {
            Policy::S3Fifo(p) => p.bytes(),
            Policy::Lru(p) => p.bytes(),
        }
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &K) -> bool {
        match self {
            Policy::S3Fifo(p) => p.contains(key),
            Policy::Lru(p) => p.contains(key),
        }
    }

    /// Figures for status output.
    pub fn stats(&self) -> PolicyStats {
        match self {
            Policy::S3Fifo(p) => p.stats(),
            Policy::Lru(p) => p.stats(),
        }
    }

    /// Track a unit of `size` bytes, or update its size if tracked.
    pub fn insert(&mut self, key: K, size: u64) {
        match self {
            Policy::S3Fifo(p) => p.insert(key, size),
            Policy::Lru(p) => p.insert(key, size),
        }
    }

    /// A use of `key` (a hit).
    pub fn touch(&mut self, key: &K) {
        match self {
            Policy::S3Fifo(p) => p.touch(key),
            Policy::Lru(p) => p.touch(key),
        }
    }

    /// Stop tracking `key`: its size, if it was tracked.
    pub fn remove(&mut self, key: &K) -> Option<u64> {
        match self {
            Policy::S3Fifo(p) => p.remove(key),
            Policy::Lru(p) => p.remove(key),
        }
    }

    /// Up to `most` tracked units in about the order they would be evicted.
    pub fn eviction_order(&self, most: usize) -> Box<dyn Iterator<Item = &K> + '_> {
        match self {
            Policy::S3Fifo(p) => Box::new(p.eviction_order(most)),
            Policy::Lru(p) => Box::new(p.eviction_order(most)),
        }
    }

    /// Choose the next unit to evict and stop tracking it; `None` when nothing is tracked.
    pub fn evict(&mut self) -> Option<(K, u64)> {
        match self {
            Policy::S3Fifo(p) => p.evict(),
            Policy::Lru(p) => p.evict(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of `cap` unit-sized entries driven by the policy: returns whether `k` was a hit.
    fn access(p: &mut Policy<u64>, cap: u64, k: u64) -> bool {
        if p.contains(&k) {
            p.touch(&k);
            return true;
        }
        p.insert(k, 1);
        while p.bytes() > cap {
            p.evict().expect("something to evict");
        }
        false
    }

    /// A working set of 200 units, reused, in a cache of 500; then one pass over 5000 units never seen
    /// again, interleaved with the working set: how many of the 500 working-set accesses during the scan hit.
    fn working_set_hits_through_a_scan(e: Eviction) -> u32 {
        let cap = 500u64;
        let mut p = Policy::new(e, cap);
        for _ in 0..4 {
            for k in 0..200u64 {
                access(&mut p, cap, k);
            }
        }
        assert_eq!(p.stats().units, 200, "{e:?}");
        let mut hits = 0;
        for i in 0..5000u64 {
            access(&mut p, cap, 1_000_000 + i);
            if i % 10 == 0 {
                hits += access(&mut p, cap, (i / 10) % 200) as u32;
            }
        }
        hits
    }

    #[test]
    fn a_scan_pushes_the_working_set_out_of_lru_not_out_of_s3fifo() {
        // S3-FIFO keeps (nearly) every working-set access a hit; LRU loses most of them, as the scan pushes
        // each working-set unit out before it comes round again.
        let s3fifo = working_set_hits_through_a_scan(Eviction::S3Fifo);
        let lru = working_set_hits_through_a_scan(Eviction::Lru);
        eprintln!("working-set hits during the scan: S3-FIFO {s3fifo}, LRU {lru} of 500");
        assert!(s3fifo >= 450, "S3-FIFO kept {s3fifo} of 500 working-set accesses");
        assert!(lru < 100, "LRU kept {lru} of 500 working-set accesses through a scan");
        assert!(lru < s3fifo, "LRU {lru} vs S3-FIFO {s3fifo}");
    }

    #[test]
    fn the_policy_is_the_one_chosen_and_the_default_is_s3fifo() {
        for e in [Eviction::S3Fifo, Eviction::Lru] {
            assert_eq!(Policy::<u64>::new(e, 10).eviction(), e);
        }
        assert_eq!(Eviction::default(), Eviction::S3Fifo);
    }

    #[test]
    fn the_wrapper_forwards_to_the_policy_chosen() {
        // Four units never used again: either policy evicts the oldest first.
        for e in [Eviction::S3Fifo, Eviction::Lru] {
            let mut p = Policy::new(e, 100);
            for k in 0..4u64 {
                p.insert(k, 2);
            }
            p.touch(&9);
            assert_eq!(p.bytes(), 8);
            assert!(p.contains(&3));
            assert_eq!(p.eviction_order(10).count(), 4);
            assert_eq!(p.evict(), Some((0, 2)), "{e:?}");
            assert_eq!(p.remove(&3), Some(2));
            assert_eq!(p.stats().units, 2);
        }
    }
}
