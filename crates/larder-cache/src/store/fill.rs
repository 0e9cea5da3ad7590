//! Fills: a block fetched from home is written outside its shard's lock under a per-block reservation;
//! local changes of the object wait for the fills under way (`await_fills`).

use super::*;

/// A fill's reservation of its block: released (and waiters woken) under the lock when the fill ends,
/// or by `drop` if the fill unwinds.
pub(super) struct Reservation<'a> {
    store: &'a Store,
    key: BlockKey,
    held: bool,
}

impl Reservation<'_> {
    fn release(&mut self, st: &mut ShardState) {
        if std::mem::take(&mut self.held) {
            st.filling.remove(&self.key);
            if st.waiting > 0 {
                self.store.shard(self.key.0).filled.notify_all();
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.held {
            let mut st = self.store.state(self.key.0);
            self.release(&mut st);
        }
    }
}

impl Store {
    /// Wait (on the shard's `filled`, releasing its `state` meanwhile) until no fill nor hole punch holds a
    /// reservation on `blocks` of `object`; `st` is `object`'s shard, locked. Returns with the lock held, so that the caller's change follows the fills in one critical
    /// section. While a thread waits, `object` is marked changing: no new fill reserves a block of it, so
    /// the wait ends once the fills under way when it began have written their bytes, and the punches of
    /// the blocks dropped meanwhile (of those present when it began: none is filled again) are made (no
    /// busy loop, no unbounded wait).
    pub(super) fn await_fills<'a>(
        &'a self,
        mut st: MutexGuard<'a, ShardState>,
        object: u64,
        blocks: RangeInclusive<u32>,
    ) -> MutexGuard<'a, ShardState> {
        if !st.filling_any(object, &blocks) {
            return st;
        }
        st.mark_changing(object);
        st.waiting += 1;
        let filled = &self.shard(object).filled;
        while st.filling_any(object, &blocks) {
            st = filled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiting -= 1;
        st.unmark_changing(object);
        st
    }

    /// Store a clean block fetched from home at change epoch `epoch` of its object. Nothing is stored if
    /// the object changed locally since (a write, truncate or removal: their data wins), is changing now,
    /// or the block is present already. A full cache disk is not an error here: the data still goes to the
    /// reader, the block is simply not kept.
    ///
    /// The bytes are written outside any lock. Under the lock of the object's shard, the fill checks the
    /// epoch and the block's absence and reserves the block (`ShardState::filling`); it writes; then, under
    /// that lock again, it inserts the block only if the epoch is still `epoch`, and releases the
    /// reservation. Every change of an object is made under its shard's lock (the epochs, reservations and
    /// blocks of the object all live there), so the shard lock orders a fill against the object's changes
    /// exactly as one store-wide lock would. Why no local change can be overwritten by the fill's bytes,
    /// caller by caller:
    /// - [`Store::write`], [`Store::remove_object`] (so [`Store::replace_object`] too) and
    ///   [`Store::truncate`] (the block holding the new end and every later one) wait until no fill holds
    ///   a block they touch, then bump the epoch in the same critical section: the fill they waited for
    ///   has written and been inserted (it is ordered before them, as if it had run under the lock), and
    ///   any fill fetched before them fails the epoch check from then on. A truncate keeps its object
    ///   marked changing until its `set_len` is done, so no fill writes into the file while it is cut.
    /// - [`Store::claim`] changes only a present block; a reserved block is absent (nothing inserts a block
    ///   while it is reserved), so a claim of it fails and the caller fetches it first. A claim, like a
    ///   write of another block, bumps the epoch: a reserved fill of another block is then dropped, its
    ///   bytes punched out again before its reservation ends.
    /// - Eviction, and every other drop of a block, takes present blocks only: never a reserved one.
    ///   Eviction chooses its victim under `policy` alone, but drops it only under the victim's shard lock,
    ///   and only if it is still present (so not reserved), clean and evictable. The dropped block's hole
    ///   is punched after that lock is let go, under a reservation of its own taken in the critical
    ///   section that drops it (`Punches`): until the punch is made, this fill waits for it (as for
    ///   another fill), and so does every local change that touches the block, so no punch lands on bytes
    ///   written after the drop. A read that looked at the block before its drop and reads punched bytes
    ///   sees its shard's count of dropped blocks moved, looks again, and finds it absent: a miss. A removal
    ///   and a truncate punch no hole: the file is unlinked, or its `set_len` has cut the blocks off.
    /// - Shared contents: a fill never reserves a block of an object in the content store, and
    ///   [`Store::fill_whole`] never shares (nor writes) an object with a block reserved: it fills block
    ///   by block instead. So no unsharing meets a reservation.
    /// - Another fill of the same block waits for this one, then finds the block present (or the epoch
    ///   moved) as it would have under the lock. A fill of a block being punched waits for the punch, then
    ///   writes its bytes over the hole.
    pub fn fill(&self, key: BlockKey, data: &[u8], epoch: u64) -> CacheResult<()> {
        self.fill_checked(key, data, crc32c::crc32c(data), epoch)
    }

    /// [`Store::fill`] of `data` whose CRC-32C the caller has (it checked the bytes against it as they
    /// came): the store keeps it in its index rather than computing it again.
    pub fn fill_checked(&self, key: BlockKey, data: &[u8], crc: u32, epoch: u64) -> CacheResult<()> {
        debug_assert_eq!(crc, crc32c::crc32c(data), "a fill's checksum is its data's");
        if !self.room_on_disk(data.len() as u64) {
            // The cache disk is full of what cannot be evicted: the block is not kept (the reader has it).
            return Ok(());
        }
        let start = key.1 as u64 * self.cfg.block_size;
        let shard = self.shard(key.0);
        let mut st = lock(&shard.state);
        loop {
            if st.epoch(key.0) != epoch || st.blocks.contains_key(&key) || st.changing.contains_key(&key.0) {
                return Ok(());
            }
            if st.meta(key.0).content.is_some() {
                // Shared contents are whole: a missing block means the object is being dropped.
                return Ok(());
            }
            if !st.filling.contains(&key) {
                break;
            }
            st.waiting += 1;
            st = shard.filled.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting -= 1;
        }
        let file = self.file_locked(&st, key.0)?;
        st.filling.insert(key);
        let mut reservation = Reservation {
            store: self,
            key,
            held: true,
        };
        drop(st);
        #[cfg(test)]
        self.pause(Pause::Fill(key));
        let written = Self::write_block(&file, start, data);
        let mut st = lock(&shard.state);
        let keep = written.is_ok()
            && st.epoch(key.0) == epoch
            && !st.blocks.contains_key(&key)
            && st.meta(key.0).content.is_none();
        if !keep {
            // A local change came first (or the write failed): the bytes written are nobody's. The block
            // is absent and still reserved, so no change of it can run meanwhile: punch them out again,
            // outside the lock, as an evicted block would be.
            let punch =
                !st.blocks.contains_key(&key) && !st.holds.contains_key(&key.0) && st.meta(key.0).content.is_none();
            drop(st);
            if punch {
                punch_hole(&file, start, data.len() as u64);
            }
            let mut st = lock(&shard.state);
            reservation.release(&mut st);
            return written;
        }
        reservation.release(&mut st);
        self.insert_locked(&mut st, key, data.len() as u32, crc, false);
        self.inserted.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.db.submit(vec![Mutation::PutBlock {
            object: key.0,
            index: key.1,
            len: data.len() as u32,
            crc,
        }]);
        drop(st);
        self.evict_if_needed();
        Ok(())
    }

    #[cfg(test)]
    pub(super) fn pause(&self, at: Pause) {
        let hook = lock(&self.hook).clone();
        if let Some(hook) = hook {
            hook(at);
        }
    }

    /// Write a fetched block's bytes at `start`. A block of zeros (a hole at home, read back) stays a hole
    /// here: nothing is allocated for it.
    pub(super) fn write_block(file: &File, start: u64, data: &[u8]) -> CacheResult<()> {
        if data.iter().all(|&b| b == 0) {
            let end = start + data.len() as u64;
            punch_hole(file, start, data.len() as u64);
            if file.metadata().map_err(io_err)?.len() < end {
                // The block is read back in full (checksums): the file reaches its end, one byte stored.
                file.write_all_at(&[0], end - 1).map_err(io_err)?;
            }
        } else {
            file.write_all_at(data, start).map_err(io_err)?;
            // Written back now, in the background, rather than all at once later: a large file filled
            // over a link would otherwise leave its writeback for whoever reads it first, from the
            // kernel's side (passthrough) right after the fill.
            // SAFETY: sync_file_range on an open descriptor with plain integer arguments; it only starts
            // writeback.
            unsafe {
                libc::sync_file_range(
                    file.as_raw_fd(),
                    start as libc::off64_t,
                    data.len() as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                );
            }
        }
        Ok(())
    }
}
