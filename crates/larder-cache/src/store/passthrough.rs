//! Objects the kernel writes directly (FUSE passthrough): their cache file changes without a call here,
//! and what changed is found by comparing each block with its recorded checksum, then adopted as written.

use super::*;

impl Store {
    /// The blocks of the first `size` bytes of `object`'s cache file whose bytes are not the ones its index
    /// records: changed by a writer the store did not see (the kernel, through passthrough), written past
    /// the blocks it knows, or written here and not yet indexed. Reads the whole file, outside the lock.
    pub fn changed_blocks(&self, object: u64, size: u64) -> CacheResult<Vec<(u32, u32)>> {
        let bs = self.cfg.block_size;
        let (file, known) = {
            let st = self.state(object);
            let known: HashMap<u32, (u32, u32, bool)> = st
                .blocks_of(object)
                .map(|(k, e)| (k.1, (e.len, e.crc, e.dirty)))
                .collect();
            (self.file_locked(&st, object)?, known)
        };
        let mut changed = Vec::new();
        let mut buf = vec![0u8; bs as usize];
        for index in 0..size.div_ceil(bs) {
            let start = index * bs;
            let len = (size - start).min(bs) as usize;
            read_block(&file, &mut buf[..len], start).map_err(io_err)?;
            let crc = self.checksum_read(&buf[..len]);
            match known.get(&(index as u32)) {
                Some(&(l, c, dirty)) if l as usize == len && c == crc && !(dirty && c == 0) => {}
                _ => changed.push((index as u32, crc)),
            }
        }
        Ok(changed)
    }

    /// Take blocks of `object` as written (present and dirty), each with the checksum [`Store::changed_blocks`]
    /// found, `size` being the object's size: the kernel wrote them to the cache file. Indexed now; a
    /// write the kernel makes after the checksum was taken is found by the next comparison.
    pub fn adopt_written(&self, object: u64, blocks: &[(u32, u32)], size: u64) {
        if blocks.is_empty() {
            return;
        }
        let bs = self.cfg.block_size;
        {
            let mut st = self.state(object);
            Self::bump_epoch(&mut st, object);
            let mut mutations = Vec::with_capacity(blocks.len());
            for &(index, crc) in blocks {
                let len = size.saturating_sub(index as u64 * bs).min(bs) as u32;
                if len == 0 {
                    continue;
                }
                self.insert_locked(&mut st, (object, index), len, crc, true);
                if let Some(e) = st.blocks.get_mut(&(object, index)) {
                    e.adopted = true;
                }
                mutations.push(Mutation::PutBlock {
                    object,
                    index,
                    len,
                    crc,
                });
            }
            // Submitted under the lock, so that they reach the index before any later change of these
            // blocks does.
            self.db.submit(mutations);
        }
        self.evict_if_needed();
    }

    /// A writer the store does not see (the kernel, through passthrough) begins writing `object`'s cache
    /// file. From the first such writer until the last one ends ([`Store::unseen_writer_ended`]), the
    /// object is marked in the index, so that after a crash in between, what they wrote is looked for
    /// ([`Store::unseen_writes`]). Returns whether this writer marked it (the caller settles the mark
    /// before the writer may write).
    pub fn unseen_writer_began(&self, object: u64) -> bool {
        let mut st = self.state(object);
        st.written_by_kernel.insert(object);
        let n = st.unseen_writers.entry(object).or_insert(0);
        *n += 1;
        *n == 1 && Self::mark_unseen(&mut st, &self.db, object, true)
    }

    /// One writer [`Store::unseen_writer_began`] counted has ended, and what it wrote is taken in (adopted
    /// and recorded): the last one clears the object's mark.
    pub fn unseen_writer_ended(&self, object: u64) {
        let mut st = self.state(object);
        let Some(n) = st.unseen_writers.get_mut(&object) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            st.unseen_writers.remove(&object);
            // Writes through the store not indexed yet keep the mark (`verify.rs`).
            if !st.unindexed.contains_key(&object) {
                Self::mark_unseen(&mut st, &self.db, object, false);
            }
        }
    }

    /// Objects marked as written by writers the store did not see (or through it, and not indexed since),
    /// none of which is open now: found so when the store opens, they are what a crash cut short. Their blocks are to be compared with the
    /// index ([`Store::changed_blocks`]), then the mark cleared ([`Store::unseen_writes_settled`]).
    pub fn unseen_writes(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let st = lock(&shard.state);
            out.extend(
                st.objects
                    .iter()
                    .filter(|(o, m)| m.written_unseen && !st.unseen_writers.contains_key(o))
                    .map(|(o, _)| *o),
            );
        }
        out.sort_unstable();
        out
    }

    /// What a crash left of `object`'s unseen writers is taken in: clear its mark (unless a writer is open).
    pub fn unseen_writes_settled(&self, object: u64) {
        let mut st = self.state(object);
        if !st.unseen_writers.contains_key(&object) && !st.unindexed.contains_key(&object) {
            Self::mark_unseen(&mut st, &self.db, object, false);
        }
    }

    /// Set or clear `object`'s mark; whether it changed.
    pub(super) fn mark_unseen(st: &mut ShardState, db: &Db, object: u64, on: bool) -> bool {
        let mut meta = st.meta(object);
        if meta.written_unseen == on {
            return false;
        }
        meta.written_unseen = on;
        db.submit(vec![meta.mutation(object)]);
        st.set_meta(object, meta);
        true
    }
}
