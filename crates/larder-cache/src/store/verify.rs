//! Checking cached blocks against their checksums, and what a failed check leaves.
//!
//! A block's CRC-32C is recorded when it is filled or indexed. After a start every block is unverified
//! until its bytes are read and found to match: the first read of it does so ([`Store::read`]), and so
//! does [`Store::verify`], which checks a whole object before its cache file is handed to someone who
//! reads it without the store: the kernel (FUSE passthrough) or a push to home. Once verified, a block is
//! trusted for the rest of the daemon's life (the daemon wrote or read every byte of it since).
//!
//! A **clean** block that fails is dropped (its bytes are home's: the next read fetches them again) and
//! counted (`corrupt_blocks`). A **dirty** block that fails holds the only copy of data not yet at home:
//! it is marked damaged (the shard's `damaged` set), its reads fail with [`CacheError::Damaged`], no
//! indexing takes its bytes for good ones, and it stays so until it is written whole again, cut off or
//! removed.
//!
//! A dirty block may also differ from its checksum because it was written after it was last indexed: a
//! write through the store, or by the kernel through passthrough, whose commit a crash cut short. Such
//! objects are marked in the index while it may be so (`ObjectMeta::written_unseen`): from the first
//! write through the store until a commit has indexed its blocks again ([`Store::indexed_since`]), and
//! while writers the store does not see are open. After a crash a marked object's blocks are compared
//! with the index and what differs is taken in as written ([`Store::unseen_writes`]); a difference in an
//! object not marked is damage.

use super::*;

/// What [`Store::verify`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Verification {
    /// Blocks checked and found as recorded.
    pub verified: u64,
    /// Clean blocks that failed: dropped, to be fetched again.
    pub dropped: Vec<u32>,
    /// Dirty blocks that failed (now, or before): damaged, never served.
    pub damaged: Vec<u32>,
}

impl Store {
    /// Block `key` (its shard's state `st`, locked, and passed in) failed its checksum: a clean block is
    /// dropped (a miss: fetched again), a dirty one marked damaged ([`CacheError::Damaged`]).
    pub(super) fn failed_check(
        &self,
        mut st: MutexGuard<'_, ShardState>,
        key: BlockKey,
        dirty: bool,
    ) -> CacheResult<()> {
        let mut punches = Punches::new(self);
        let result = self.fail_locked(&mut st, key, dirty, &mut punches);
        drop(st);
        punches.run();
        result
    }

    /// [`Store::failed_check`] under the lock the caller holds; the hole of a dropped block is punched by
    /// the caller's `punches` once it lets the lock go.
    pub(super) fn fail_locked(
        &self,
        st: &mut ShardState,
        key: BlockKey,
        dirty: bool,
        punches: &mut Punches<'_>,
    ) -> CacheResult<()> {
        self.corrupt.fetch_add(1, Ordering::Relaxed);
        if dirty {
            if st.damaged.insert(key) {
                self.damaged.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    object = key.0,
                    block = key.1,
                    "a cached block holding data not yet at home failed its checksum: the cache file was damaged; \
                     it is never served nor pushed"
                );
            }
            return Err(CacheError::Damaged {
                object: key.0,
                block: key.1,
            });
        }
        tracing::warn!(
            object = key.0,
            block = key.1,
            "cached block failed its checksum; dropped, to be fetched again"
        );
        self.remove_locked(st, key, punches);
        // Out of the index too: the next start must not find it again.
        self.db.submit(vec![Mutation::DelBlock {
            object: key.0,
            index: key.1,
        }]);
        self.misses.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Bytes of `object`'s present blocks not checked against their checksums since the start.
    pub fn unverified_bytes(&self, object: u64) -> u64 {
        self.state(object)
            .blocks_of(object)
            .filter(|(_, e)| !e.verified)
            .map(|(_, e)| e.len as u64)
            .sum()
    }

    /// The damaged blocks of `object` (see the module doc).
    pub fn damaged_blocks(&self, object: u64) -> Vec<u32> {
        self.state(object)
            .damaged
            .range((object, 0)..=(object, u32::MAX))
            .map(|k| k.1)
            .collect()
    }

    /// Check every unverified block of `object` against its checksum. The blocks are read outside the lock
    /// and judged under it, only if they were not changed meanwhile (same generation and stamp): a block
    /// written, refilled or dropped in between is left to whoever changed it. Clean blocks that fail are
    /// dropped, dirty ones marked damaged (see the module doc).
    pub fn verify(&self, object: u64) -> CacheResult<Verification> {
        self.verify_range(object, 0..=u32::MAX)
    }

    /// [`Store::verify`] of `object`'s blocks in `blocks`.
    pub fn verify_range(&self, object: u64, blocks: RangeInclusive<u32>) -> CacheResult<Verification> {
        let bs = self.cfg.block_size;
        let (file, plan) = {
            let st = self.state(object);
            let plan: Vec<(u32, u32, u32, u32, u32)> = st
                .blocks
                .range((object, *blocks.start())..=(object, *blocks.end()))
                .filter(|(_, e)| !e.verified)
                .map(|(k, e)| (k.1, e.len, e.crc, e.generation, e.stamp))
                .collect();
            if plan.is_empty() {
                let damaged = st
                    .damaged
                    .range((object, 0)..=(object, u32::MAX))
                    .map(|k| k.1)
                    .collect();
                return Ok(Verification {
                    damaged,
                    ..Verification::default()
                });
            }
            (self.file_locked(&st, object)?, plan)
        };
        let mut buf = vec![0u8; bs as usize];
        let checked: Vec<(u32, u32, u32, u32, bool)> = plan
            .into_iter()
            .map(|(index, len, crc, generation, stamp)| {
                let bytes = &mut buf[..len as usize];
                let ok = read_block(&file, bytes, index as u64 * bs).is_ok() && self.checksum_read(bytes) == crc;
                (index, crc, generation, stamp, ok)
            })
            .collect();
        let mut out = Verification::default();
        let mut punches = Punches::new(self);
        let mut st = self.state(object);
        for (index, crc, generation, stamp, ok) in checked {
            let key = (object, index);
            let Some(e) = st.blocks.get_mut(&key) else { continue };
            if e.verified || e.generation != generation || e.stamp != stamp || e.crc != crc {
                continue;
            }
            if ok {
                e.verified = true;
                out.verified += 1;
                continue;
            }
            let dirty = e.dirty;
            if self.fail_locked(&mut st, key, dirty, &mut punches).is_ok() {
                out.dropped.push(index);
            }
        }
        out.damaged = st
            .damaged
            .range((object, 0)..=(object, u32::MAX))
            .map(|k| k.1)
            .collect();
        drop(st);
        punches.run();
        Ok(out)
    }

    /// A write through the store is about to change `object`'s cache file: until the index has taken its
    /// blocks in again ([`Store::indexed_since`]), the object is marked (see the module doc), so that after
    /// a crash its bytes are compared with the index rather than taken for damage. Under its shard's lock,
    /// before the bytes are written; the mark is in the index's log when this returns.
    pub(super) fn writing_locked(&self, st: &mut ShardState, object: u64) {
        let writes = st.unindexed.entry(object).or_insert(0);
        *writes += 1;
        if *writes == 1 {
            Self::mark_unseen(st, &self.db, object, true);
        }
    }

    /// The writes through the store made to `object` so far since it was marked: taken before indexing,
    /// and given to [`Store::indexed_since`] after it.
    pub(super) fn writes_so_far(&self, object: u64) -> Option<u64> {
        self.state(object).unindexed.get(&object).copied()
    }

    /// Indexing of `object` is done: if no write came since `writes` were counted, no writer the store
    /// does not see is open, and no block is left written and not indexed, its cache file holds nothing
    /// the index does not know, and the mark goes.
    pub(super) fn indexed_since(&self, object: u64, writes: Option<u64>) {
        let Some(writes) = writes else { return };
        let mut st = self.state(object);
        if st.unindexed.get(&object) != Some(&writes) {
            return;
        }
        // A block written and not indexed yet keeps the placeholder checksum of a write (see `write`).
        if st.blocks_of(object).any(|(_, e)| e.dirty && e.crc == 0 && !e.adopted) {
            return;
        }
        st.unindexed.remove(&object);
        if !st.unseen_writers.contains_key(&object) {
            Self::mark_unseen(&mut st, &self.db, object, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    const BS: usize = 4096;

    fn store(dir: &Path) -> Store {
        let db = Db::open(&dir.join("index.redb")).unwrap();
        let cfg = StoreConfig {
            dir: dir.join("objects"),
            block_size: BS as u64,
            limit: 1 << 20,
            high_watermark: 1.0,
            low_watermark: 0.75,
            dedup: false,
            eviction: Eviction::S3Fifo,
        };
        Store::open(cfg, db).unwrap()
    }

    /// Overwrite bytes of `object`'s cache file at `offset`, as a damaged disk (or a hand) would.
    fn damage(dir: &Path, object: u64, offset: u64) {
        let f = OpenOptions::new()
            .write(true)
            .open(dir.join(format!("objects/{:02x}/{object:016x}", object & 0xff)))
            .unwrap();
        f.write_all_at(b"0123456789abcdef", offset).unwrap();
    }

    /// Object 7: block 0 clean (filled), block 1 written here and committed (dirty), both on disk; the
    /// store closed.
    fn one_clean_one_dirty(dir: &Path) {
        let s = store(dir);
        s.fill((7, 0), &[1u8; BS], 0).unwrap();
        s.write(7, BS as u64, &[2u8; BS]).unwrap();
        s.commit(7, [1], 2 * BS as u64).unwrap();
        s.db().sync().unwrap();
    }

    #[test]
    fn a_dirty_block_that_fails_its_checksum_is_damaged_never_served_and_replaced_only_whole() {
        let dir = tempfile::tempdir().unwrap();
        one_clean_one_dirty(dir.path());
        damage(dir.path(), 7, BS as u64 + 100);
        let s = store(dir.path());
        // As the core marks a file's unpushed blocks when it loads its record.
        assert!(s.reclaim((7, 1)));
        match s.read((7, 1), 0, 10) {
            Err(CacheError::Damaged { object: 7, block: 1 }) => {}
            other => panic!("a damaged dirty block was answered with {other:?}"),
        }
        assert_eq!(s.stats().damaged_blocks, 1);
        assert_eq!(s.damaged_blocks(7), vec![1]);
        assert!(
            matches!(s.claim((7, 1)), Err(CacheError::Damaged { .. })),
            "a partial write claims it"
        );
        assert!(
            matches!(s.write(7, BS as u64 + 10, b"part"), Err(CacheError::Damaged { .. })),
            "a write of part of it keeps bytes that are wrong"
        );
        // A commit of the file does not take its bytes in as good.
        s.commit(7, [1], 2 * BS as u64).unwrap();
        assert!(matches!(s.read((7, 1), 0, 10), Err(CacheError::Damaged { .. })));
        // The clean block beside it is served.
        assert_eq!(s.read((7, 0), 0, 4).unwrap().unwrap(), vec![1u8; 4]);
        s.write(7, BS as u64, &[3u8; BS]).unwrap();
        assert_eq!(s.read((7, 1), 0, 4).unwrap().unwrap(), vec![3u8; 4]);
        assert_eq!(s.stats().damaged_blocks, 0);
        assert!(s.damaged_blocks(7).is_empty());
    }

    #[test]
    fn verify_drops_clean_blocks_that_fail_marks_dirty_ones_damaged_and_passes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        one_clean_one_dirty(dir.path());
        damage(dir.path(), 7, 10);
        damage(dir.path(), 7, BS as u64 + 10);
        let s = store(dir.path());
        assert!(s.reclaim((7, 1)));
        assert_eq!(s.unverified_bytes(7), 2 * BS as u64);
        let v = s.verify(7).unwrap();
        assert_eq!(v.dropped, vec![0], "the clean block is dropped, to be fetched again");
        assert_eq!(v.damaged, vec![1]);
        assert!(!s.contains((7, 0)));
        assert_eq!(s.stats().corrupt_blocks, 2);
        drop(s);
        // Out of the index as well: the next start does not find it again.
        let s = store(dir.path());
        assert!(!s.contains((7, 0)));
    }

    #[test]
    fn verify_passes_intact_blocks_once_and_a_claim_checks_before_it_keeps() {
        let dir = tempfile::tempdir().unwrap();
        one_clean_one_dirty(dir.path());
        let s = store(dir.path());
        assert!(s.reclaim((7, 1)));
        let v = s.verify(7).unwrap();
        assert_eq!(v.verified, 2);
        assert!(v.dropped.is_empty() && v.damaged.is_empty());
        assert_eq!(s.unverified_bytes(7), 0);
        assert_eq!(s.verify(7).unwrap().verified, 0, "checked once per start");
        drop(s);
        damage(dir.path(), 7, 10);
        let s = store(dir.path());
        assert!(
            !s.claim((7, 0)).unwrap(),
            "a damaged clean block is not claimed: it is fetched again"
        );
        assert!(!s.contains((7, 0)));
    }

    #[test]
    fn a_block_past_the_end_of_its_cache_file_reads_as_zeros_not_as_damage() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path());
            s.write(7, 0, &[4u8; 100]).unwrap();
            s.commit(7, [0], 100).unwrap();
            // Extended: the block's checksum is of its bytes and the zeros after them.
            s.truncate(7, 300).unwrap();
            s.db().sync().unwrap();
        }
        // The cache file holds the bytes, not the zeros after them (a hole at its end not stored).
        let path = dir.path().join("objects/07/0000000000000007");
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(100)
            .unwrap();
        let s = store(dir.path());
        assert!(s.reclaim((7, 0)));
        let mut want = vec![4u8; 100];
        want.resize(300, 0);
        let got = s.read((7, 0), 0, 300).unwrap().unwrap();
        assert_eq!(&got[..100], &want[..100]);
        assert!(got[100..].iter().all(|b| *b == 0));
        assert_eq!(s.stats().damaged_blocks, 0);
        assert!(s.verify(7).unwrap().damaged.is_empty());
    }

    #[test]
    fn an_object_written_and_not_indexed_is_marked_until_its_commit() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path());
            s.write(9, 0, &[5u8; 100]).unwrap();
            s.commit(9, [0], 100).unwrap();
            s.write(9, 50, &[6u8; 10]).unwrap();
            s.db().sync().unwrap();
        }
        // Written after its commit, then the daemon gone: its bytes are compared, not taken for damage.
        let s = store(dir.path());
        assert_eq!(s.unseen_writes(), vec![9]);
        s.unseen_writes_settled(9);
        s.write(9, 0, &[7u8; 100]).unwrap();
        s.commit(9, [0], 100).unwrap();
        s.db().sync().unwrap();
        drop(s);
        let s = store(dir.path());
        assert!(
            s.unseen_writes().is_empty(),
            "indexed since its last write: nothing to look for"
        );
    }
}
