//! S3-FIFO eviction (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023) over units
//! of any size: a whole small file or one block of a large one.
//!
//! Three FIFO queues. A new unit enters the small queue `S` (a tenth of the capacity). When `S` is over its
//! share, its oldest unit leaves: to the main queue `M` if it was used again while in `S`, else out of the
//! cache, its key remembered in the ghost queue `G`. A unit whose key is in `G` when it comes back enters
//! `M` directly. `M` evicts its oldest unit unless it was used since it last passed the tail, in which case
//! it goes round again with one use less (at most three are counted). A hit only bumps a counter: no list
//! is reordered, so a hit costs one map lookup, and a one-pass scan moves through `S` without pushing the
//! working set in `M` out.
//!
//! Only evictable units are tracked: the store takes a unit out while it is dirty or pinned and puts it
//! back once it is clean and unpinned.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, Hash};

/// Most uses counted per unit.
const MAX_FREQ: u8 = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// 16 bytes: a cache tracks millions of units.
struct Entry {
    /// The queue slot that is this entry's current one; older slots of the same key are stale.
    slot: u64,
    /// Units are blocks, at most 64 MiB; a larger size is counted as 4 GiB (the totals stay consistent:
    /// what is added is what is taken off).
    size: u32,
    freq: u8,
    queue: Queue,
}

fn unit_size(size: u64) -> u32 {
    u32::try_from(size).unwrap_or(u32::MAX)
}

/// The policy's state for units keyed by `K`.
pub struct S3Fifo<K: Hash + Eq + Clone> {
    capacity: u64,
    entries: HashMap<K, Entry>,
    small: VecDeque<(K, u64)>,
    main: VecDeque<(K, u64)>,
    small_bytes: u64,
    main_bytes: u64,
    /// Live units in each queue (units may have size 0: empty files).
    small_units: usize,
    main_units: usize,
    /// Hashes of keys evicted from `S` without a second use, oldest first, with a count per hash.
    ghost: VecDeque<u64>,
    ghost_set: HashMap<u64, u32>,
    hasher: std::collections::hash_map::RandomState,
    next_slot: u64,
}

/// Figures for status output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats {
    pub units: u64,
    pub small_bytes: u64,
    pub main_bytes: u64,
    pub ghosts: u64,
}

impl<K: Hash + Eq + Clone> S3Fifo<K> {
    /// A policy for `capacity` bytes of evictable units (the eviction target, not a hard limit: the store
    /// decides when to evict).
    pub fn new(capacity: u64) -> S3Fifo<K> {
        S3Fifo {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            small: VecDeque::new(),
            main: VecDeque::new(),
            small_bytes: 0,
            main_bytes: 0,
            small_units: 0,
            main_units: 0,
            ghost: VecDeque::new(),
            ghost_set: HashMap::new(),
            hasher: std::collections::hash_map::RandomState::new(),
            next_slot: 0,
        }
    }

    /// Bytes of the units tracked.
    pub fn bytes(&self) -> u64 {
        self.small_bytes + self.main_bytes
    }

    /// Whether `key` is tracked.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    pub fn stats(&self) -> PolicyStats {
        PolicyStats {
            units: self.entries.len() as u64,
            small_bytes: self.small_bytes,
            main_bytes: self.main_bytes,
            ghosts: self.ghost.len() as u64,
        }
    }

    /// Track a unit of `size` bytes (or update its size if tracked). A key evicted recently (in the ghost
    /// queue) goes to the main queue at once: it has proven it comes back.
    pub fn insert(&mut self, key: K, size: u64) {
        let size = unit_size(size);
        if let Some(e) = self.entries.get_mut(&key) {
            match e.queue {
                Queue::Small => self.small_bytes = self.small_bytes - e.size as u64 + size as u64,
                Queue::Main => self.main_bytes = self.main_bytes - e.size as u64 + size as u64,
            }
            e.size = size;
            return;
        }
        let h = self.hasher.hash_one(&key);
        let queue = if self.unghost(h) { Queue::Main } else { Queue::Small };
        self.push(key, size as u64, 0, queue);
    }

    /// A use of `key` (a hit); no list moves.
    pub fn touch(&mut self, key: &K) {
        if let Some(e) = self.entries.get_mut(key) {
            e.freq = (e.freq + 1).min(MAX_FREQ);
        }
    }

    /// Stop tracking `key` (it became dirty or pinned, or was dropped); its queue slot goes stale.
    pub fn remove(&mut self, key: &K) -> Option<u64> {
        let e = self.take(key)?;
        self.compact();
        Some(e.size as u64)
    }

    /// Up to `most` tracked units in about the order they would be evicted: the small queue's, then the
    /// main queue's, oldest first.
    pub fn eviction_order(&self, most: usize) -> impl Iterator<Item = &K> {
        self.small
            .iter()
            .chain(self.main.iter())
            .filter(|(k, slot)| self.entries.get(k).is_some_and(|e| e.slot == *slot))
            .map(|(k, _)| k)
            .take(most)
    }

    /// Choose the next unit to evict and stop tracking it; `None` when nothing is tracked.
    pub fn evict(&mut self) -> Option<(K, u64)> {
        // Every unit is looked at a bounded number of times per eviction (a main unit at most MAX_FREQ
        // times round), so this ends.
        while !self.entries.is_empty() {
            let from_small = self.small_units > 0 && (self.small_bytes >= self.capacity / 10 || self.main_units == 0);
            let victim = if from_small {
                self.evict_small()
            } else {
                self.evict_main()
            };
            if victim.is_some() {
                return victim;
            }
        }
        None
    }

    /// The oldest unit of `S` leaves: promoted to `M` if used again, else evicted (and remembered).
    fn evict_small(&mut self) -> Option<(K, u64)> {
        let (key, slot) = self.small.pop_front()?;
        let (size, freq) = self.take_slot(&key, slot)?;
        if freq > 0 {
            self.push(key, size, 0, Queue::Main);
            return None;
        }
        let h = self.hasher.hash_one(&key);
        self.remember(h);
        Some((key, size))
    }

    /// The oldest unit of `M` is evicted, or goes round again with one use less.
    fn evict_main(&mut self) -> Option<(K, u64)> {
        let (key, slot) = self.main.pop_front()?;
        let (size, freq) = self.take_slot(&key, slot)?;
        if freq > 0 {
            self.push(key, size, freq - 1, Queue::Main);
            return None;
        }
        Some((key, size))
    }

    /// Stop tracking the unit in queue slot `slot` if that slot is still its current one: (size, uses).
    fn take_slot(&mut self, key: &K, slot: u64) -> Option<(u64, u8)> {
        if self.entries.get(key)?.slot != slot {
            return None;
        }
        self.take(key).map(|e| (e.size as u64, e.freq))
    }

    fn push(&mut self, key: K, size: u64, freq: u8, queue: Queue) {
        let size = unit_size(size);
        let slot = self.next_slot;
        self.next_slot += 1;
        match queue {
            Queue::Small => {
                self.small.push_back((key.clone(), slot));
                self.small_bytes += size as u64;
                self.small_units += 1;
            }
            Queue::Main => {
                self.main.push_back((key.clone(), slot));
                self.main_bytes += size as u64;
                self.main_units += 1;
            }
        }
        self.entries.insert(
            key,
            Entry {
                size,
                freq,
                queue,
                slot,
            },
        );
    }

    /// Stop tracking `key`, keeping the queue totals; its slot goes stale.
    fn take(&mut self, key: &K) -> Option<Entry> {
        let e = self.entries.remove(key)?;
        match e.queue {
            Queue::Small => {
                self.small_bytes -= e.size as u64;
                self.small_units -= 1;
            }
            Queue::Main => {
                self.main_bytes -= e.size as u64;
                self.main_units -= 1;
            }
        }
        Some(e)
    }

    /// Remember an evicted key; the ghost queue holds about as many keys as the cache holds units.
    fn remember(&mut self, h: u64) {
        self.ghost.push_back(h);
        *self.ghost_set.entry(h).or_default() += 1;
        let limit = self.entries.len().max(64);
        while self.ghost.len() > limit {
            if let Some(old) = self.ghost.pop_front() {
                self.forget_ghost(old);
            }
        }
    }

    /// Whether `h` was a ghost (and is no longer one).
    fn unghost(&mut self, h: u64) -> bool {
        if !self.ghost_set.contains_key(&h) {
            return false;
        }
        // Its slot in the ghost queue stays until it ages out; the count says it is no longer live.
        self.forget_ghost(h);
        true
    }

    fn forget_ghost(&mut self, h: u64) {
        if let Some(n) = self.ghost_set.get_mut(&h) {
            *n -= 1;
            if *n == 0 {
                self.ghost_set.remove(&h);
            }
        }
    }

    /// Drop stale queue slots once they outnumber live ones, so removals cannot grow the queues without
    /// bound.
    fn compact(&mut self) {
        let slots = self.small.len() + self.main.len();
        if slots < 1024 || slots < 2 * self.entries.len() {
            return;
        }
        let entries = &self.entries;
        let live = |(k, s): &(K, u64)| entries.get(k).is_some_and(|e| e.slot == *s);
        self.small.retain(live);
        self.main.retain(live);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_used_once_leaves_before_one_used_twice() {
        let mut p = S3Fifo::new(10);
        p.insert(1u64, 1);
        p.insert(2, 1);
        p.touch(&1);
        // 1 was used again in S: it is promoted, 2 is the victim.
        assert_eq!(p.evict(), Some((2, 1)));
        assert!(p.contains(&1));
        assert_eq!(p.stats().ghosts, 1);
        // 2 comes back: it remembers, and enters M directly.
        p.insert(2, 1);
        assert_eq!(p.stats().main_bytes, 2);
    }

    #[test]
    fn sizes_are_accounted_through_moves_updates_and_removals() {
        let mut p = S3Fifo::new(1000);
        for k in 0..20u64 {
            p.insert(k, 10 + k);
        }
        let total: u64 = (0..20).map(|k| 10 + k).sum();
        assert_eq!(p.bytes(), total);
        p.insert(3, 100);
        assert_eq!(p.bytes(), total - 13 + 100);
        assert_eq!(p.remove(&3), Some(100));
        assert_eq!(p.remove(&3), None);
        for k in 0..10 {
            p.touch(&k);
        }
        let mut evicted = 0;
        let mut order = Vec::new();
        while let Some((k, size)) = p.evict() {
            assert_eq!(size, 10 + k);
            evicted += size;
            order.push(k);
        }
        assert_eq!(order[0], 10, "the oldest unit not used again leaves first: {order:?}");
        assert_eq!(evicted, total - 13);
        assert_eq!(p.bytes(), 0);
        assert_eq!(p.stats().units, 0);
    }

    #[test]
    fn empty_units_are_evicted_too() {
        let mut p = S3Fifo::new(100);
        for k in 0..10u64 {
            p.insert(k, 0);
        }
        p.touch(&4);
        let mut n = 0;
        while p.evict().is_some() {
            n += 1;
        }
        assert_eq!(n, 10);
    }

    #[test]
    fn removed_units_are_never_chosen() {
        let mut p = S3Fifo::new(100);
        for k in 0..5000u64 {
            p.insert(k, 1);
            if k % 3 == 0 {
                p.remove(&k);
            }
        }
        let mut n = 0;
        while let Some((k, _)) = p.evict() {
            assert_ne!(k % 3, 0, "{k} was removed");
            n += 1;
        }
        assert_eq!(n, 5000 - 1667);
        // Stale slots were compacted away as removals went on, not kept all.
        assert!(p.small.len() + p.main.len() < 5000);
    }
}
