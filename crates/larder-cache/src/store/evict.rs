//! Residency: pins, holds, completeness, eviction between watermarks (the harvester), and the average
//! block distance of the eviction order.

use super::*;

impl Store {
    /// HCCache's average block distance over the files with several evictable blocks among the first
    /// `most` units in eviction order: how far apart in that order the blocks of one file lie, per block
    /// (1.0: together, as a whole file; larger: scattered, so a file is evicted piecemeal). `None` when no
    /// such file is there.
    /// Computed at most once per [`ABD_EVERY`] (status and every metrics scrape ask for it): the shards'
    /// buffered hits are passed on, the order is copied under `policy`, and walked outside it.
    pub fn average_block_distance(&self, most: usize) -> Option<f64> {
        let mut last = lock(&self.abd);
        if let Some((at, n, v)) = *last
            && n == most
            && at.elapsed() < ABD_EVERY
        {
            return v;
        }
        let v = self.block_distance_now(most);
        *last = Some((std::time::Instant::now(), most, v));
        v
    }

    /// [`Store::average_block_distance`], computed now.
    pub(super) fn block_distance_now(&self, most: usize) -> Option<f64> {
        self.drain_touches();
        let order: Vec<BlockKey> = lock(&self.policy).eviction_order(most).copied().collect();
        Self::block_distance(&order)
    }

    pub(super) fn block_distance(order: &[BlockKey]) -> Option<f64> {
        let mut spans: HashMap<u64, (usize, usize, usize)> = HashMap::new();
        for (pos, key) in order.iter().enumerate() {
            let e = spans.entry(key.0).or_insert((pos, pos, 0));
            e.1 = pos;
            e.2 += 1;
        }
        let abds: Vec<f64> = spans
            .values()
            .filter(|(_, _, n)| *n > 1)
            .map(|(first, last, n)| (last - first) as f64 / (*n - 1) as f64)
            .collect();
        (!abds.is_empty()).then(|| abds.iter().sum::<f64>() / abds.len() as f64)
    }

    /// Pin `object` (its blocks are never evicted) or unpin it; the setting is kept with the object.
    pub fn set_pinned(&self, object: u64, pinned: bool) {
        let mut st = self.state(object);
        let mut meta = st.meta(object);
        if meta.pinned == pinned {
            return;
        }
        let bytes: u64 = st.blocks_of(object).map(|(_, e)| e.len as u64).sum();
        if pinned {
            self.pinned.fetch_add(bytes, Ordering::Relaxed);
        } else {
            self.pinned.fetch_sub(bytes, Ordering::Relaxed);
        }
        meta.pinned = pinned;
        self.db.submit(vec![meta.mutation(object)]);
        st.set_meta(object, meta);
        self.repolicy(&mut st, object);
    }

    /// Put `object`'s blocks into the policy, or take them out, after its pin or hold changed; `st` is its
    /// shard, locked.
    fn repolicy(&self, st: &mut ShardState, object: u64) {
        let evictable = st.evictable(object);
        let blocks: Vec<(BlockKey, u32, bool)> = st.blocks_of(object).map(|(k, e)| (*k, e.len, e.dirty)).collect();
        let mut policy = self.policy_under(st);
        for (key, len, dirty) in blocks {
            if evictable && !dirty {
                policy.insert(key, len as u64);
            } else {
                policy.remove(&key);
            }
        }
    }

    /// Hold `object` for a reader the kernel serves from its file directly: until [`Store::unhold`], its
    /// blocks are not evicted and its file keeps its bytes (a removal unlinks it without punching it). A
    /// punch of a block dropped before the hold may still be under way (`Punches`), but that block is
    /// absent until the punch is made and the block filled again: the object is not [`Store::whole_in_file`]
    /// meanwhile, and the kernel is given the file only once it is (after the hold).
    pub fn hold(&self, object: u64) {
        let mut st = self.state(object);
        *st.holds.entry(object).or_insert(0) += 1;
        self.repolicy(&mut st, object);
    }

    /// End one hold of `object`.
    pub fn unhold(&self, object: u64) {
        let mut st = self.state(object);
        let Some(n) = st.holds.get_mut(&object) else { return };
        *n -= 1;
        if *n == 0 {
            st.holds.remove(&object);
            self.repolicy(&mut st, object);
        }
    }

    /// Whether every byte of the first `size` bytes of `object` is present in a file of its own (not the
    /// content store), clean or dirty: the kernel can read and write that file directly.
    pub fn whole_in_file(&self, object: u64, size: u64) -> bool {
        let st = self.state(object);
        st.meta(object).content.is_none() && Self::all_present(&st, object, size, self.cfg.block_size, true)
    }

    /// Whether every block of the first `size` bytes of `object` is present and clean, wherever its bytes
    /// are kept (its own file, or a content it shares): [`Store::read`] serves them all.
    pub fn present(&self, object: u64, size: u64) -> bool {
        Self::all_present(&self.state(object), object, size, self.cfg.block_size, false)
    }

    /// Whether the blocks of `object` hold exactly its first `size` bytes, each present (and clean, unless
    /// `dirty_too`).
    pub(super) fn all_present(st: &ShardState, object: u64, size: u64, block_size: u64, dirty_too: bool) -> bool {
        let (mut n, mut bytes) = (0u64, 0u64);
        for (_, e) in st.blocks_of(object) {
            if e.dirty && !dirty_too {
                return false;
            }
            n += 1;
            bytes += e.len as u64;
        }
        n == size.div_ceil(block_size) && bytes == size
    }

    /// Whether `object` is pinned or held (open for direct reading by the kernel).
    pub fn kept(&self, object: u64) -> bool {
        let st = self.state(object);
        st.meta(object).pinned || st.holds.contains_key(&object)
    }

    /// Whether `object` is pinned.
    pub fn pinned(&self, object: u64) -> bool {
        self.state(object).meta(object).pinned
    }

    /// Bytes of `object` present in the cache.
    pub fn cached_bytes(&self, object: u64) -> u64 {
        self.state(object).blocks_of(object).map(|(_, e)| e.len as u64).sum()
    }

    /// Drop the clean blocks of `object` (dirty ones stay: home does not have them yet); the bytes
    /// dropped. Their holes are punched after the shard lock is let go (`Punches`).
    pub fn evict_object(&self, object: u64) -> u64 {
        let mut punches = Punches::new(self);
        let mut st = self.state(object);
        let keys: Vec<(BlockKey, u32)> = st
            .blocks_of(object)
            .filter(|(_, e)| !e.dirty)
            .map(|(k, e)| (*k, e.len))
            .collect();
        let mut freed = 0;
        let mut mutations = Vec::new();
        for (key, len) in keys {
            self.remove_locked(&mut st, key, &mut punches);
            freed += len as u64;
            mutations.push(Mutation::DelBlock {
                object: key.0,
                index: key.1,
            });
        }
        self.db.submit(mutations);
        drop(st);
        punches.run();
        freed
    }

    pub(super) fn watermarks(&self) -> (u64, u64) {
        let at = |w: f64| (self.cfg.limit as f64 * w) as u64;
        (at(self.cfg.high_watermark), at(self.cfg.low_watermark))
    }

    /// Called after usage grew, with no shard lock held. Past the high watermark the harvester is woken to
    /// evict down to the low one, and the caller goes on; only past the limit itself (the harvester has
    /// fallen behind) does the caller evict, down to the high watermark. Without a harvester the caller
    /// evicts to the low one.
    pub(super) fn evict_if_needed(&self) {
        let (high, low) = self.watermarks();
        let used = self.used.load(Ordering::Relaxed);
        if used <= high {
            return;
        }
        if self.harvesting.load(Ordering::Relaxed) {
            *lock(&self.harvest) = true;
            self.harvest_cv.notify_one();
            if used > self.cfg.limit {
                self.evict_to(high, usize::MAX, false);
            }
            return;
        }
        self.evict_to(low, usize::MAX, false);
    }

    /// Evict clean blocks in the policy's order until usage is at most `target` or `most` blocks were
    /// taken from the policy; whether usage reached the target (or nothing is left to evict). Called with
    /// no shard lock held.
    ///
    /// The shards' buffered hits are passed to the policy first. Then, victim by victim: the victim is
    /// taken from the policy under `policy` alone; `policy` is let go and the victim's shard locked (never
    /// both the other way round); the block is dropped only if it is still present (so not reserved by a
    /// fill), clean, and of an object neither pinned nor held. Otherwise it changed between the two
    /// critical sections (written, claimed, pinned, held, dropped) and stays as it is: each of those
    /// changes took it out of the policy too, or will put it back when it ends.
    ///
    /// The holes of the blocks dropped under one shard lock are punched once it is let go, before the next
    /// victim is taken ([`Punches`]): a hit of the shard does not wait for them.
    ///
    /// With `show`, each unit is shown to the [`Departing`] hook first, with the shard let go; the checks
    /// are made again after it.
    pub(super) fn evict_to(&self, target: u64, most: usize, show: bool) -> bool {
        self.evict_while(|s| s.used.load(Ordering::Relaxed) > target, most, show);
        self.used.load(Ordering::Relaxed) <= target || lock(&self.policy).stats().units == 0
    }

    /// [`Store::evict_to`], evicting while `more` says so (and at most `most` blocks).
    pub(super) fn evict_while(&self, more: impl Fn(&Store) -> bool, most: usize, show: bool) {
        self.drain_touches();
        let mut taken = 0;
        let mut punches = Punches::new(self);
        while more(self) && taken < most {
            let victim = lock(&self.policy).evict();
            let Some((key, _)) = victim else { break };
            taken += 1;
            #[cfg(test)]
            self.pause(Pause::Evict(key));
            let mut st = self.state(key.0);
            let Some(mut unit) = Self::departing_unit(&st, key) else {
                continue;
            };
            if show && let Some(hook) = self.departing.get() {
                drop(st);
                let indexes: Vec<u32> = unit.iter().map(|k| k.1).collect();
                hook(key.0, &indexes);
                st = self.state(key.0);
                match Self::departing_unit(&st, key) {
                    Some(u) => unit = u,
                    None => continue,
                }
            }
            taken += unit.len() - 1;
            let mut mutations = Vec::with_capacity(unit.len());
            for key in unit {
                self.remove_locked(&mut st, key, &mut punches);
                self.evictions.fetch_add(1, Ordering::Relaxed);
                if !show {
                    self.evictions_by_fills.fetch_add(1, Ordering::Relaxed);
                }
                mutations.push(Mutation::DelBlock {
                    object: key.0,
                    index: key.1,
                });
            }
            // Submitted under the shard lock, so that they reach the index before a refill's records do.
            self.db.submit(mutations);
            drop(st);
            punches.run();
        }
    }

    /// The blocks that leave with victim `key`, if it may leave: it is present, clean, and its object is
    /// neither pinned nor held. A whole unit goes together: its other clean blocks follow the one the
    /// policy chose.
    fn departing_unit(st: &ShardState, key: BlockKey) -> Option<Vec<BlockKey>> {
        let still = st.blocks.get(&key).is_some_and(|e| !e.dirty) && st.evictable(key.0);
        if !still {
            return None;
        }
        let mut unit = vec![key];
        if st.meta(key.0).whole {
            unit.extend(
                st.blocks_of(key.0)
                    .filter(|(k, e)| !e.dirty && **k != key)
                    .map(|(k, _)| *k),
            );
        }
        Some(unit)
    }

    /// Show the harvester's victims to `hook` before they go (see [`Departing`]). Set once.
    pub fn set_departing(&self, hook: super::Departing) {
        let _ = self.departing.set(hook);
    }

    /// Start the harvester: a thread that evicts down to the low watermark once usage passes the high one,
    /// so that a fill does not wait for eviction. It stops when the store is dropped.
    pub fn start_harvester(self: &Arc<Store>) -> io::Result<()> {
        let weak = Arc::downgrade(self);
        self.harvesting.store(true, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("larder-harvest".into())
            .spawn(move || {
                loop {
                    let Some(store) = weak.upgrade() else { return };
                    {
                        let flag = lock(&store.harvest);
                        let (mut flag, _) = store
                            .harvest_cv
                            .wait_timeout_while(flag, std::time::Duration::from_millis(200), |f| !*f)
                            .unwrap_or_else(|p| p.into_inner());
                        *flag = false;
                    }
                    let (high, low) = store.watermarks();
                    if store.used.load(Ordering::Relaxed) <= high {
                        continue;
                    }
                    // In batches, so that the buffered hits of the shards are passed on between them.
                    while !store.evict_to(low, 64, true) {}
                }
            })?;
        Ok(())
    }
}
