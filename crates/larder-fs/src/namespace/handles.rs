//! Open handles, in shards of their own: a read's handle state (its readahead window, where it stands)
//! changes at every read, and is found and changed under the lock of its shard alone, never the
//! namespace's. Each shard's lock is a leaf under `ns` (design note 011): the namespace may be held when a
//! handle is added or removed, and the store may be called with a shard held, never the reverse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::DirItem;
use crate::namespace::lock;

/// Shards of the handle table; a power of two.
const SHARDS: usize = 16;

/// An open file or directory.
pub(crate) struct Handle {
    pub ino: u64,
    /// The cache object (content version) the file had when this handle opened it. A handle reads that
    /// version only: once revalidation moves the file to another, its reads fail with `ESTALE`.
    pub object: u64,
    /// Directory handles: the listing as it was at opendir, or at the last rewind.
    pub entries: Option<Arc<Vec<DirItem>>>,
    /// Directory handles: entries were read from it (a read from the start after that is a rewind).
    pub read_from: bool,
    /// Directory handles: the directory's modification and change times when the listing was taken. A
    /// first read finding them moved (names made or removed since the opendir) takes the listing again.
    pub listed_times: Option<(std::time::SystemTime, std::time::SystemTime)>,
    /// Where the next sequential read would start, the readahead window, and where the blocks queued
    /// for this handle end.
    pub next_offset: u64,
    pub window: u64,
    pub ra_end: u64,
    /// The kernel reads this handle's object from its cache file directly: the store holds it.
    pub held: bool,
    /// Opened with `O_APPEND`: every write goes at the end of the file as this node knows it, whatever
    /// offset the kernel's cached size gave it.
    pub append: bool,
    /// Opened for writing.
    pub writable: bool,
    /// A writer the kernel serves from the cache file (passthrough): `Some`, with what the cache file
    /// looked like when its writes were last adopted (`None` in it: look at every block next time).
    pub pt_writer: Option<Option<crate::stamp::Stamp>>,
}

impl Handle {
    pub(crate) fn new(ino: u64, object: u64, entries: Option<Arc<Vec<DirItem>>>) -> Handle {
        Handle {
            ino,
            object,
            entries,
            read_from: false,
            listed_times: None,
            next_offset: 0,
            window: 0,
            ra_end: 0,
            held: false,
            append: false,
            writable: false,
            pt_writer: None,
        }
    }
}

/// The open handles, by file handle number.
pub(crate) struct Handles {
    shards: Box<[Mutex<HashMap<u64, Handle>>]>,
    next: AtomicU64,
}

impl Default for Handles {
    fn default() -> Handles {
        Handles {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            next: AtomicU64::new(1),
        }
    }
}

impl Handles {
    /// The handles open on `ino`.
    pub(crate) fn of_inode(&self, ino: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            out.extend(lock(shard).iter().filter(|(_, h)| h.ino == ino).map(|(fh, _)| *fh));
        }
        out
    }

    fn shard(&self, fh: u64) -> &Mutex<HashMap<u64, Handle>> {
        // Handle numbers are handed out in sequence: consecutive ones land in different shards.
        &self.shards[fh as usize % SHARDS]
    }

    /// Add `handle`; its number.
    pub fn insert(&self, handle: Handle) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed);
        lock(self.shard(fh)).insert(fh, handle);
        fh
    }

    /// Call `f` with handle `fh` under its shard's lock; `None` if there is no such handle.
    pub fn with<R>(&self, fh: u64, f: impl FnOnce(&mut Handle) -> R) -> Option<R> {
        lock(self.shard(fh)).get_mut(&fh).map(f)
    }

    /// The inode handle `fh` is open on.
    pub fn ino(&self, fh: u64) -> Option<u64> {
        self.with(fh, |h| h.ino)
    }

    pub fn remove(&self, fh: u64) -> Option<Handle> {
        lock(self.shard(fh)).remove(&fh)
    }

    /// Handles open now.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).len()).sum()
    }

    /// The numbers of the handles open now.
    pub fn numbers(&self) -> Vec<u64> {
        self.shards
            .iter()
            .flat_map(|s| lock(s).keys().copied().collect::<Vec<_>>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_are_found_changed_and_removed_by_number_across_shards() {
        let handles = Handles::default();
        let fhs: Vec<u64> = (0..40).map(|i| handles.insert(Handle::new(100 + i, i, None))).collect();
        let distinct: std::collections::HashSet<_> = fhs.iter().collect();
        assert_eq!(distinct.len(), 40, "a number was handed out twice");
        assert_eq!(handles.len(), 40);
        for (i, fh) in fhs.iter().enumerate() {
            assert_eq!(handles.ino(*fh), Some(100 + i as u64));
            handles.with(*fh, |h| h.window = i as u64 * 7);
        }
        assert_eq!(handles.with(fhs[9], |h| h.window), Some(63));
        assert_eq!(handles.remove(fhs[3]).map(|h| h.ino), Some(103));
        assert!(handles.remove(fhs[3]).is_none() && handles.ino(fhs[3]).is_none());
        let mut left = handles.numbers();
        left.sort();
        let mut want: Vec<u64> = fhs.iter().copied().filter(|fh| *fh != fhs[3]).collect();
        want.sort();
        assert_eq!(left, want);
    }

    #[test]
    fn a_handle_is_used_while_another_shard_is_held() {
        let handles = Arc::new(Handles::default());
        let a = handles.insert(Handle::new(1, 1, None));
        let b = handles.insert(Handle::new(2, 2, None));
        assert_ne!(a as usize % SHARDS, b as usize % SHARDS);
        let held = lock(handles.shard(a));
        let (tx, rx) = std::sync::mpsc::channel();
        let h2 = handles.clone();
        let t = std::thread::spawn(move || tx.send(h2.with(b, |h| h.ino)).unwrap());
        let got = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(held);
        t.join().unwrap();
        assert_eq!(got, Ok(Some(2)), "a handle waited for another shard's lock");
    }
}
