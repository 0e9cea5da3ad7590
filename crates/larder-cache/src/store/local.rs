//! Local changes of an object's content: writes, truncation, removal and replacement.

use super::*;

impl Store {
    /// Write new (dirty) data into `object` at `offset`. Blocks touched become present and dirty; the caller
    /// guarantees that a partially written block was present or lies wholly beyond home's data.
    ///
    /// A fill writing one of the blocks touched (outside the lock) is waited for first: its bytes land,
    /// and then these, so that these are the file's. Once the blocks are marked, no fill reserves them
    /// again (they are present, and the epoch moved).
    pub fn write(&self, object: u64, offset: u64, data: &[u8]) -> CacheResult<()> {
        self.write_with(object, offset, data.len() as u64, |file| {
            file.write_all_at(data, offset)
        })
    }

    /// Make `len` bytes of `object` from `offset` read as zeros, as a write of zeros would, but keeping the
    /// range a hole in the cache file where its file system can punch one (whole pages: zeros are written
    /// at unaligned edges, and everywhere on a file system without hole punching). The cache file grows
    /// to the range's end if it is shorter. What a push then copies of the range is a hole (a directory
    /// home punches one too, `larder-home/src/posix/write.rs`).
    pub fn write_zeros(&self, object: u64, offset: u64, len: u64) -> CacheResult<()> {
        self.write_with(object, offset, len, |file| zero_range(file, offset..offset + len))
    }

    /// Make `len` bytes of `object` from `offset` read as zeros and take room in the cache file, as
    /// `fallocate(2)` sets blocks aside: a later write there finds them. The cache file grows to the range's
    /// end if it is shorter. Its file system's allocated, unwritten blocks read as a hole, so a push copies
    /// the range as one. Where that file system cannot allocate, the file only grows (sparse).
    pub fn write_allocated(&self, object: u64, offset: u64, len: u64) -> CacheResult<()> {
        self.write_with(object, offset, len, |file| allocate_range(file, offset..offset + len))
    }

    /// A write of `len` bytes at `offset` whose bytes `land` puts into the cache file (see [`Store::write`]).
    fn write_with(
        &self,
        object: u64,
        offset: u64,
        len: u64,
        land: impl FnOnce(&File) -> std::io::Result<()>,
    ) -> CacheResult<()> {
        if len == 0 {
            return Ok(());
        }
        let bs = self.cfg.block_size;
        let end = offset + len;
        // Mark the blocks dirty first: from then on eviction cannot punch them under the new bytes.
        let mut added = Vec::new();
        let file = {
            let touched = (offset / bs).min(u32::MAX as u64) as u32..=((end - 1) / bs).min(u32::MAX as u64) as u32;
            let mut st = self.await_fills(self.state(object), object, touched.clone());
            // A damaged block (see `verify.rs`) is replaced only by a write of all of it: its other bytes
            // are not the ones written.
            let damaged: Vec<BlockKey> = st
                .damaged
                .range((object, *touched.start())..=(object, *touched.end()))
                .copied()
                .collect();
            for key in damaged {
                let start = key.1 as u64 * bs;
                let len = st.blocks.get(&key).map_or(0, |e| e.len as u64);
                if offset > start || end < start + len {
                    return Err(CacheError::Damaged { object, block: key.1 });
                }
                st.damaged.remove(&key);
                self.damaged.fetch_sub(1, Ordering::Relaxed);
            }
            self.unshare_locked(&mut st, object)?;
            let file = self.file_locked(&st, object)?;
            Self::bump_epoch(&mut st, object);
            self.writing_locked(&mut st, object);
            for index in (offset / bs)..=((end - 1) / bs) {
                let key = (object, index as u32);
                let block_end = (end - index * bs).min(bs) as u32;
                let existing = st.blocks.get(&key).map(|e| e.len);
                if existing.is_none() {
                    added.push(key);
                }
                self.insert_locked(&mut st, key, existing.unwrap_or(0).max(block_end), 0, true);
            }
            file
        };
        self.evict_if_needed();
        if let Err(e) = land(&file) {
            let mut punches = Punches::new(self);
            let mut st = self.state(object);
            for key in added {
                self.remove_locked(&mut st, key, &mut punches);
            }
            drop(st);
            punches.run();
            return Err(io_err(e));
        }
        self.inserted.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Cut `object` to `size` bytes: later blocks are dropped, a partial last block keeps its prefix.
    ///
    /// Fills of the block holding the new end and of every later one are waited for before the epoch
    /// moves; the object stays marked changing until the file is cut, so that no fill (even one fetched
    /// after the epoch moved) writes into it while `set_len` runs outside the lock. Fills of earlier blocks
    /// write below the new end, which `set_len` leaves alone; fetched before the epoch moved, they are not
    /// kept.
    pub fn truncate(&self, object: u64, size: u64) -> CacheResult<()> {
        let bs = self.cfg.block_size;
        if let Ok(kept) = u32::try_from(size / bs)
            && !size.is_multiple_of(bs)
        {
            // The block that keeps a prefix is indexed again after the cut, with the prefix's checksum:
            // its bytes are checked against the checksum they have now first (see `verify.rs`).
            self.verify_range(object, kept..=kept)?;
        }
        let (file, writes) = {
            let mut st = self.state(object);
            if let Ok(first) = u32::try_from(size / bs) {
                st = self.await_fills(st, object, first..=u32::MAX);
            }
            self.unshare_locked(&mut st, object)?;
            // Fills fetched before this point must not write old bytes past the new end.
            Self::bump_epoch(&mut st, object);
            let file = self.file_locked(&st, object)?;
            self.writing_locked(&mut st, object);
            st.mark_changing(object);
            (file, st.unindexed.get(&object).copied())
        };
        let cut = file.set_len(size).map_err(io_err);
        let mut st = self.state(object);
        st.unmark_changing(object);
        cut?;
        let first_gone = size.div_ceil(bs).min(u32::MAX as u64 + 1);
        let doomed: Vec<BlockKey> = if first_gone > u32::MAX as u64 {
            Vec::new()
        } else {
            st.blocks
                .range((object, first_gone as u32)..=(object, u32::MAX))
                .map(|(k, _)| *k)
                .collect()
        };
        // Wholly past the new end: `set_len` has cut their bytes off already, and no fill has written past
        // it since (the object was marked changing until here, so no fill reserved a block of it, and the
        // fills and punches of these blocks under way were waited for): there is no hole to punch.
        for key in doomed {
            self.forget_locked(&mut st, key);
            self.db.submit(vec![Mutation::DelBlock {
                object: key.0,
                index: key.1,
            }]);
        }
        if !size.is_multiple_of(bs) {
            let key = (object, (size / bs) as u32);
            if let Some(e) = st.blocks.get(&key) {
                // The block's index entry (length and checksum, in memory and on disk) follows its prefix,
                // dirty or not: the next start must not find it corrupt.
                let dirty = e.dirty;
                drop(st);
                if dirty {
                    self.commit(object, [key.1], size)?;
                } else {
                    self.mark_clean(object, [key.1], size);
                }
                self.indexed_since(object, writes);
                return Ok(());
            }
        }
        drop(st);
        self.indexed_since(object, writes);
        Ok(())
    }

    /// Forget every block of `object` and delete its file (or keep it, emptied, as a spare: `spare.rs`).
    /// Fills of its blocks under way are waited for first (their blocks are then dropped with the rest);
    /// fills fetched before fail the epoch check. Until its file is emptied or unlinked, the object stays
    /// marked changing: a fill fetched after the epoch moved must not write into the file about to go
    /// (its block would be indexed with its bytes gone), nor index a block before the object's removal is
    /// recorded.
    pub fn remove_object(&self, object: u64) {
        self.remove_object_with(object, false);
    }

    /// [`Store::remove_object`]; with `in_use`, for an object whose file a reader outside the store may
    /// still be reading (a push to home under way): the file is unlinked, never emptied, so that reader
    /// keeps its bytes.
    pub fn remove_object_with(&self, object: u64, in_use: bool) {
        let keep_bytes = {
            let mut st = self.await_fills(self.state(object), object, 0..=u32::MAX);
            // A file the kernel reads keeps its bytes for it (unlinked, not emptied); a shared content's
            // file is not the object's to empty.
            // A file the kernel wrote is not recycled either (see `ShardState::written_by_kernel`).
            let written_by_kernel = st.written_by_kernel.remove(&object);
            let keep_bytes =
                in_use || written_by_kernel || st.holds.contains_key(&object) || st.meta(object).content.is_some();
            // Kept as a tombstone, so that a fill fetched before the removal does not bring the file back.
            Self::bump_epoch(&mut st, object);
            if st.has_blocks(object) {
                let keys: Vec<BlockKey> = st.blocks_of(object).map(|(k, _)| *k).collect();
                // No holes punched: the file is emptied or unlinked below.
                for key in keys {
                    self.forget_locked(&mut st, key);
                }
            }
            st.objects.remove(&object);
            st.unindexed.remove(&object);
            st.mark_changing(object);
            keep_bytes
        };
        let file = self.fds_of(object).files.remove(&object).map(|(f, _)| f);
        self.db.submit(vec![Mutation::DelObject(object)]);
        self.retire_file(object, file, keep_bytes);
        self.state(object).unmark_changing(object);
    }

    /// `new` replaces `object` as the same file's content (a new version): the old one is removed (its file
    /// unlinked, not made a spare, if `in_use`: see [`Store::remove_object_with`]), and a pin, which
    /// belongs to the file, moves to the new one. Whether it did. The removal waits for fills
    /// of the old object under way ([`Store::remove_object`]). The two objects may lie in different shards:
    /// the removal lets its shard lock go before the pin takes the other.
    pub fn replace_object(&self, object: u64, new: u64, in_use: bool) -> bool {
        let pinned = self.pinned(object);
        self.remove_object_with(object, in_use);
        if pinned {
            self.set_pinned(new, true);
        }
        pinned
    }
}

/// Allocate `range` of `file` (`fallocate(2)`'s mode 0: what is there stays, the file grows to the range's
/// end); a file system that cannot (`EOPNOTSUPP`) only has the file grown. `ENOSPC` is the cache disk's.
fn allocate_range(file: &File, range: std::ops::Range<u64>) -> std::io::Result<()> {
    // SAFETY: fallocate on an open descriptor with plain integer arguments.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            0,
            range.start as libc::off_t,
            (range.end - range.start) as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    if file.metadata()?.len() < range.end {
        file.set_len(range.end)?;
    }
    Ok(())
}

/// Make `range` of `file` read as zeros: whole pages punched out (a hole), the edges written as zeros, the
/// file grown to the range's end first if it is shorter (by a write of its last byte, which never
/// shortens it). Zeros are written where the file system cannot punch.
fn zero_range(file: &File, range: std::ops::Range<u64>) -> std::io::Result<()> {
    const PAGE: u64 = 4096;
    if file.metadata()?.len() < range.end {
        file.write_all_at(&[0], range.end - 1)?;
    }
    let inner = range.start.next_multiple_of(PAGE)..range.end / PAGE * PAGE;
    let punched = inner.start < inner.end && larder_util::holes::punch_hole(file, inner.clone()).is_ok();
    let written: Vec<std::ops::Range<u64>> = if punched {
        vec![range.start..inner.start, inner.end..range.end]
    } else {
        vec![range]
    };
    let zeros = vec![0u8; (1 << 20).min(written.iter().map(|r| r.end - r.start).max().unwrap_or(0)) as usize];
    for r in written {
        larder_util::holes::write_zeros(file, r, &zeros)?;
    }
    Ok(())
}
