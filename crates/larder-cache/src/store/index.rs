//! Indexing blocks with their checksums (commit of dirty blocks, marking pushed blocks clean): read and
//! checksummed outside the object's shard lock, recorded under it only if the block did not change
//! meanwhile.

use super::*;

impl Store {
    /// Mark blocks of `object` clean again after their data reached home; `size` is the size home has. A
    /// block that cannot be read back to be indexed is dropped instead: home has its data.
    pub fn mark_clean(&self, object: u64, indexes: impl IntoIterator<Item = u32>, size: u64) {
        let writes = self.writes_so_far(object);
        match self.index_blocks(object, indexes, size, false) {
            Ok(()) => self.indexed_since(object, writes),
            Err(e) => {
                tracing::warn!(object, error = %e, "could not index blocks pushed to home; dropping them from the cache")
            }
        }
    }

    /// Record dirty blocks of `object` in the persistent index (with their checksums) so that they are
    /// found again after a restart; they stay dirty. Durable once the index is synced and the object file
    /// is.
    /// Dirty blocks whose checksum an adoption of the kernel's writes took, not recorded since, are not
    /// read again.
    pub fn commit(&self, object: u64, indexes: impl IntoIterator<Item = u32>, size: u64) -> CacheResult<()> {
        let bs = self.cfg.block_size;
        let pending: Vec<u32> = {
            let st = self.state(object);
            indexes
                .into_iter()
                .filter(|&i| {
                    let len = size.saturating_sub(i as u64 * bs).min(bs) as u32;
                    !st.blocks
                        .get(&(object, i))
                        .is_some_and(|e| e.dirty && e.adopted && e.len == len)
                })
                .collect()
        };
        let writes = self.writes_so_far(object);
        self.index_blocks(object, pending, size, true)?;
        self.indexed_since(object, writes);
        Ok(())
    }

    /// The checksum of `bytes` read back from a cache file, counted in [`StoreStats::checksummed_bytes`].
    pub(super) fn checksum_read(&self, bytes: &[u8]) -> u32 {
        self.checksummed.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        crc32c::crc32c(bytes)
    }

    /// Re-read blocks `indexes` of `object` (the first `size` bytes of it) from its cache file and record
    /// them, with their checksums, as clean or dirty. A block not present is skipped; one wholly past `size`
    /// is dropped. One that cannot be read is reported, and when marking clean, dropped.
    ///
    /// The reads and checksums run outside the object's shard lock: under it the object's change epoch and each block's
    /// stamp are noted; after reading, a block is recorded only if both are unchanged. The epoch moves with
    /// every local change of the object (write, claim, truncate, removal; unsharing happens only within
    /// those), the stamp with every write of the block's entry: a write or claim of it, its eviction and
    /// refill (a new entry), and another indexing's record of it. Nothing else changes a present block's
    /// bytes, so the bytes read are the block's when it is recorded, as if read under the lock; and of two
    /// indexings of one block the later record holds bytes read later, as when each ran under the lock.
    /// (A write's own `pwrite` runs after its critical section, as it always has: a caller indexing a
    /// block while writing it gets whichever bytes were there.) A block that moved is read again; after
    /// `INDEX_TRIES` rounds outside the lock the last is made under it, as it was always made: a commit
    /// must record every block it was given (one left unrecorded would be found corrupt or missing after
    /// a restart), and under the lock nothing can move.
    pub(super) fn index_blocks(
        &self,
        object: u64,
        indexes: impl IntoIterator<Item = u32>,
        size: u64,
        dirty: bool,
    ) -> CacheResult<()> {
        let bs = self.cfg.block_size;
        let mut pending: Vec<u32> = indexes.into_iter().collect();
        let mut failed = None;
        // Blocks dropped (past `size`, or unreadable): punched once the shard lock is let go.
        let mut punches = Punches::new(self);
        for round in 0..=INDEX_TRIES {
            let mut st = self.state(object);
            let epoch = st.epoch(object);
            let file = self.file_locked(&st, object).map_err(|e| e.to_string());
            // The blocks to read, as they are now.
            let mut plan = Vec::new();
            for index in pending.drain(..) {
                let key = (object, index);
                let Some(entry) = st.blocks.get(&key) else { continue };
                let stamp = entry.stamp;
                let len = size.saturating_sub(index as u64 * bs).min(bs) as usize;
                if len == 0 {
                    self.remove_locked(&mut st, key, &mut punches);
                    continue;
                }
                if st.damaged.contains(&key) {
                    // Its bytes are not the ones written: never taken in as good (see `verify.rs`).
                    continue;
                }
                // A block not verified since the start must still hold the bytes its checksum was taken
                // of, or indexing would take damaged bytes in as good: checked against it as it is read.
                let unverified = (!entry.verified && entry.len as usize == len).then_some(entry.crc);
                plan.push((index, stamp, len, unverified));
            }
            if plan.is_empty() {
                break;
            }
            let read_all = |plan: &[(u32, u32, usize, Option<u32>)]| -> Vec<CacheResult<u32>> {
                plan.iter()
                    .map(|&(index, _, len, _)| {
                        let mut buf = vec![0u8; len];
                        match &file {
                            Ok(f) => read_block(f, &mut buf, index as u64 * bs)
                                .map(|()| self.checksum_read(&buf))
                                .map_err(io_err),
                            Err(e) => Err(CacheError::Index(e.clone())),
                        }
                    })
                    .collect()
            };
            let reads = if round < INDEX_TRIES {
                drop(st);
                punches.run();
                let reads = read_all(&plan);
                #[cfg(test)]
                self.pause(Pause::Index(object));
                st = self.state(object);
                reads
            } else {
                read_all(&plan)
            };
            let unmoved = st.epoch(object) == epoch;
            let mut mutations = Vec::new();
            for ((index, stamp, len, unverified), read) in plan.into_iter().zip(reads) {
                let key = (object, index);
                if !unmoved || st.blocks.get(&key).map(|e| e.stamp) != Some(stamp) {
                    pending.push(index);
                    continue;
                }
                match read {
                    Ok(crc) if unverified.is_some_and(|recorded| recorded != crc) => {
                        // Dropped if clean; if dirty, marked damaged (logged, named by whoever reads or
                        // pushes it) and left out, so that the rest of the commit stands.
                        let dirty = st.blocks.get(&key).is_some_and(|e| e.dirty);
                        let _ = self.fail_locked(&mut st, key, dirty, &mut punches);
                    }
                    Ok(crc) => {
                        self.insert_locked(&mut st, key, len as u32, crc, dirty);
                        mutations.push(Mutation::PutBlock {
                            object,
                            index,
                            len: len as u32,
                            crc,
                        });
                    }
                    Err(e) => {
                        if !dirty {
                            self.remove_locked(&mut st, key, &mut punches);
                            mutations.push(Mutation::DelBlock { object, index });
                        }
                        failed.get_or_insert(e);
                    }
                }
            }
            // Submitted under the lock, so that they reach the index before any later change of these
            // blocks does.
            self.db.submit(mutations);
            drop(st);
            punches.run();
            if pending.is_empty() {
                break;
            }
        }
        punches.run();
        failed.map_or(Ok(()), Err)
    }
}
