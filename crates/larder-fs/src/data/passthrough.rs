//! Writers the kernel serves from the cache file (FUSE passthrough): their writes land in the cache file
//! without a request to the daemon, and are adopted as written at `flush`, `fsync` and `release` (and
//! before a push of the file).
//!
//! What changed is found by comparing each block of the cache file with the checksum its index records
//! (docs/design/009): no request per write to track ranges, one read of the file (from the page cache,
//! where the writer just put it) per adoption. An adoption is skipped when the cache file's size and
//! times are what they were at the last one, unless those times were too recent to tell a later write by
//! (a write within the same tick of the clock the file system stamps times with leaves them unchanged).

use std::fs::{File, Metadata};
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use crate::data::DataPath;
use crate::namespace::lock;
use crate::ranges::{add_range, bytes_of, subtract};
use crate::stamp::{nanos, stamp_of};
use crate::{FsError, FsResult};

impl DataPath {
    /// Note the cache file's modification time, from its metadata `m`, as taken in (see
    /// [`Inode::pt_seen`]).
    fn seen(&self, ino: u64, m: &Metadata) {
        if let (Ok(node), Ok(t)) = (self.names.read().inode(ino), m.modified()) {
            node.pt_seen.store(nanos(t), Relaxed);
        }
    }

    /// Handle `fh`, open for writing, is to be served from the cache file of `object` by the kernel from
    /// now on. The store marks the object first, durably at the index's level (see
    /// [`larder_cache::Store::unseen_writer_began`]), so that a crash before the writer's writes are taken
    /// in leaves a trace; false if that mark cannot be made (the handle is then served by the daemon).
    pub(crate) fn begin_direct_writer(&self, fh: u64, object: u64, file: &File) -> bool {
        let Ok(m) = file.metadata() else { return false };
        if self.core.store.unseen_writer_began(object)
            && let Err(e) = self.core.store.db().settle()
        {
            tracing::warn!(error = %e, "cannot record a writer the kernel serves; the daemon serves it");
            self.core.store.unseen_writer_ended(object);
            return false;
        }
        let Some(ino) = self.names.handles().with(fh, |h| {
            h.pt_writer = Some(stamp_of(&m, self.core.fine_times()));
            h.ino
        }) else {
            self.core.store.unseen_writer_ended(object);
            return false;
        };
        let first = self.names.read().inode(ino).is_ok_and(|node| {
            node.pt_begun.fetch_add(1, Relaxed);
            node.pt_writers.fetch_add(1, Relaxed) == 0
        });
        if first {
            self.seen(ino, &m);
        }
        // Attributes the kernel holds from before (kept for the validity lag) would hide this writer's
        // writes from `stat`: dropped, and answers are not kept while it is open (`Names::entry`).
        self.names.invalidate(crate::Invalidation::Attr(ino));
        true
    }

    /// Handle `fh` is no longer served from the cache file (closed, or the kernel refused the file).
    pub(crate) fn end_direct_writer(&self, ino: u64) {
        if let Ok(node) = self.names.read().inode(ino) {
            let _ = node
                .pt_writers
                .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
        }
    }

    /// Adopt what the kernel wrote to the cache file through handle `fh` (if it is such a writer): the
    /// blocks whose bytes differ from their indexed checksum become dirty, the file takes the cache file's
    /// size if that is larger, and its times move. Returns whether anything was adopted.
    pub(crate) fn adopt_direct_writes(&self, fh: u64) -> FsResult<bool> {
        let Some((ino, last)) = self
            .names
            .handles()
            .with(fh, |h| h.pt_writer.map(|s| (h.ino, s)))
            .flatten()
        else {
            return Ok(false);
        };
        let write_lock = self.names.read().inode(ino)?.write_lock.clone();
        let _w = lock(&write_lock);
        let (object, removed) = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            (node.object, node.removed)
        };
        let file = self.core.store.file(object)?;
        // Taken before the blocks are read: a write landing after it moves it.
        let m = file
            .metadata()
            .map_err(|e| FsError::Cache(larder_cache::CacheError::Io(e)))?;
        let now = stamp_of(&m, self.core.fine_times());
        if last.is_some() && last == now {
            return Ok(false);
        }
        self.seen(ino, &m);
        self.names.handles().with(fh, |h| h.pt_writer = Some(now));
        if removed {
            return Ok(false);
        }
        // The time of the last write, as the kernel stamped the cache file when it was written (an `mmap`
        // write: at its page fault), not the time it is taken in.
        let written = m.modified().unwrap_or_else(|_| SystemTime::now());
        let taken = self.take_in(ino, object, &m, written)?;
        if taken {
            // The kernel may hold attributes from before, given while no writer was open.
            self.names.invalidate(crate::Invalidation::Attr(ino));
        }
        Ok(taken)
    }

    /// Compare the cache file of `ino` (`object`, whose metadata is `m`) with the index and take in what
    /// a writer the store did not see wrote there: blocks whose bytes differ from their recorded checksum
    /// become dirty (indexed with the checksums [`larder_cache::Store::changed_blocks`] found), the file
    /// takes the cache file's length if that is larger, and its times become `mtime`. Whether anything
    /// was taken in.
    fn take_in(&self, ino: u64, object: u64, m: &Metadata, mtime: SystemTime) -> FsResult<bool> {
        let len = m.len();
        let known_size = self.names.read().inode(ino)?.attr.as_ref().map_or(0, |a| a.size);
        let changed = self.core.store.changed_blocks(object, len)?;
        if changed.is_empty() && len <= known_size {
            return Ok(false);
        }
        self.core.store.adopt_written(object, &changed, len);
        let bs = self.core.store.block_size();
        let mut ns = self.names.write();
        let node = ns.inode_mut(ino)?;
        let size = len.max(known_size);
        let ranges: Vec<std::ops::Range<u64>> = changed.iter().map(|&(i, _)| bytes_of(i, bs, size)).collect();
        for r in &ranges {
            add_range(&mut node.dirty, r.clone());
        }
        if let Some(u) = node.unconfirmed.as_mut() {
            // Bytes written again no longer show what an earlier push sent.
            u.ranges = subtract(&u.ranges, &ranges);
        }
        if let Some(a) = node.attr.as_mut() {
            a.size = size;
            a.mtime = mtime;
            a.ctime = mtime;
        }
        Ok(true)
    }

    /// At start: take in what writers the kernel served wrote to cache files before a crash cut them
    /// short (the daemon was killed with such writers open): every object the store found marked
    /// ([`larder_cache::Store::unseen_writes`]) has its blocks compared with the index, and those that
    /// differ become dirty and queued for home, as their writers' close would have made them: a write the
    /// kernel acknowledged is kept, as a local file system keeps it when a process dies. `owners` maps
    /// each live object to its inode. Returns how many files had writes taken in.
    pub(crate) fn take_in_unseen_writes(&self, owners: &std::collections::HashMap<u64, u64>) -> usize {
        let mut taken = 0;
        for object in self.core.store.unseen_writes() {
            let Some(&ino) = owners.get(&object) else {
                self.core.store.unseen_writes_settled(object);
                continue;
            };
            match self.take_in_after_crash(ino, object) {
                Ok(changed) => {
                    taken += changed as usize;
                    self.core.store.unseen_writes_settled(object);
                }
                Err(e) => tracing::error!(
                    ino,
                    error = %e,
                    "cannot take in what the kernel wrote to a cache file before the crash; looked for again at the next start"
                ),
            }
        }
        taken
    }

    fn take_in_after_crash(&self, ino: u64, object: u64) -> FsResult<bool> {
        {
            let mut ns = self.names.write();
            self.names.load_inode(&mut ns, ino)?;
        }
        let io = |e| FsError::Cache(larder_cache::CacheError::Io(e));
        let m = self.core.store.file(object)?.metadata().map_err(io)?;
        let taken = self.take_in(ino, object, &m, m.modified().map_err(io)?)?;
        if taken {
            self.changes().commit_data(ino, false)?;
        }
        Ok(taken)
    }

    /// Before a push of `ino`: adopt what every writer the kernel serves wrote so far.
    pub(crate) fn adopt_all_direct_writes(&self, ino: u64) {
        if self
            .names
            .read()
            .inodes
            .get(&ino)
            .is_none_or(|n| n.pt_writers.load(Relaxed) == 0)
        {
            return;
        }
        for fh in self.names.handles().of_inode(ino) {
            if let Err(e) = self.adopt_direct_writes(fh) {
                tracing::warn!(ino, error = %e, "adopting what the kernel wrote to a cache file failed");
            }
        }
    }
}
