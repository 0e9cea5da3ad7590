//! Hole punches of dropped blocks, made outside the shard lock: the block stays reserved
//! (`ShardState::filling`) from its drop until its bytes are punched out, as a fill's block does while it
//! is written.

use super::*;

/// A dropped block whose bytes are still to be punched out of its object's file.
struct Punch {
    file: Arc<File>,
    offset: u64,
    len: u64,
    key: BlockKey,
}

/// The hole punches of blocks dropped under one shard's lock, made by [`Punches::run`] once that lock is let
/// go. Each block stays reserved until its hole is punched, and is released then under the lock again:
/// a fill of it, and every local change that touches it, waits for the punch exactly as for a fill
/// (see [`Store::fill`]), so no punch ever lands on bytes written after the drop. Dropped with punches
/// pending (the caller unwinds, or returns early), the guard still punches them and releases their blocks.
///
/// The caller declares the guard before taking the shard lock, so that on an early return the lock is let
/// go first.
pub(super) struct Punches<'a> {
    store: &'a Store,
    pending: Vec<Punch>,
}

impl<'a> Punches<'a> {
    pub(super) fn new(store: &'a Store) -> Punches<'a> {
        Punches {
            store,
            pending: Vec::new(),
        }
    }

    /// Punch `len` bytes at `offset` out of `file` for dropped block `key`, which the caller has just
    /// reserved under its shard's lock. Every punch of one guard is of one shard.
    fn push(&mut self, file: Arc<File>, offset: u64, len: u64, key: BlockKey) {
        debug_assert!(self.pending.iter().all(|p| shard_of(p.key.0) == shard_of(key.0)));
        self.pending.push(Punch { file, offset, len, key });
    }

    /// Punch the pending holes, then release their blocks under their shard's lock (waking the threads
    /// waiting for them). Called with no shard lock held.
    pub(super) fn run(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        for p in &self.pending {
            #[cfg(test)]
            self.store.pause(Pause::Punch(p.key));
            punch_hole(&p.file, p.offset, p.len);
        }
        self.release();
    }

    fn release(&mut self) {
        let Some(first) = self.pending.first() else { return };
        let shard = self.store.shard(first.key.0);
        let mut st = lock(&shard.state);
        for p in self.pending.drain(..) {
            st.filling.remove(&p.key);
        }
        if st.waiting > 0 {
            shard.filled.notify_all();
        }
    }
}

impl Drop for Punches<'_> {
    fn drop(&mut self) {
        for p in &self.pending {
            punch_hole(&p.file, p.offset, p.len);
        }
        self.release();
    }
}

impl Store {
    /// Drop present block `key`; its bytes are punched out of its file by `punches` once the caller has
    /// let the shard lock go, if they are in a file of the object's own that no reader holds (a shared
    /// content keeps its bytes for the other sharers; a held file keeps its bytes for the kernel's reader).
    /// Until then the block is reserved. A block a fill (or another punch) has reserved is not present:
    /// nothing is ever dropped, nor punched, under a reservation.
    pub(super) fn remove_locked(&self, st: &mut ShardState, key: BlockKey, punches: &mut Punches<'_>) {
        self.drop_locked(st, key, Some(punches));
    }

    /// Drop present block `key` and leave its bytes where they are: for callers whose file loses them
    /// anyway (a removal unlinks it; a truncate's `set_len` has cut them off already).
    pub(super) fn forget_locked(&self, st: &mut ShardState, key: BlockKey) {
        self.drop_locked(st, key, None);
    }

    fn drop_locked(&self, st: &mut ShardState, key: BlockKey, punches: Option<&mut Punches<'_>>) {
        st.materialize(key.0);
        let Some(old) = st.blocks.remove(&key) else { return };
        if st.damaged.remove(&key) {
            self.damaged.fetch_sub(1, Ordering::Relaxed);
        }
        // Counted under the lock, before the punch: see `Shard::removals`.
        self.shard(key.0).removals.fetch_add(1, Ordering::SeqCst);
        if !old.dirty && st.evictable(key.0) {
            self.policy_under(st).remove(&key);
        }
        let meta = st.meta(key.0);
        self.account(&meta, old.len, old.dirty, false);
        self.block_count.fetch_sub(1, Ordering::Relaxed);
        if let Some(punches) = punches
            && meta.content.is_none()
            && !st.holds.contains_key(&key.0)
            && let Ok(file) = self.file_locked(st, key.0)
        {
            // Absent, so not reserved by anyone else: reserved until its hole is punched.
            st.filling.insert(key);
            punches.push(file, key.1 as u64 * self.cfg.block_size, old.len as u64, key);
        }
        if !st.has_blocks(key.0) {
            self.object_count.fetch_sub(1, Ordering::Relaxed);
            self.emptied_locked(st, key.0);
        }
    }
}
