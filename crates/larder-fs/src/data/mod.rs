//! The data path: open, read, write, and pushing written data to home.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::ops::Range;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::SystemTime;

use larder_home::{FileKind, HomeError, SetAttr};

use crate::FileVersion;
use crate::namespace::{Names, Namespace, lock};
use crate::ranges::{add_range, subtract};
use crate::readahead::Job;
use crate::{Entry, FsError, FsResult, OpenReply};

/// The data path component (design note 012): home, the store and the tiers between ([`Core`]), the
/// prefetch that reads ahead of readers, open and read and write of file contents, passthrough, the
/// checks of cache files, residency (prefetch, pin, evict) and what this node serves its peers. It asks
/// the namespace for the version of a file it reads or writes, and hands written data to the change
/// pipeline.
pub(crate) struct DataPath {
    cfg: crate::FsConfig,
    core: Arc<Core>,
    names: Arc<Names>,
    readahead: Arc<crate::readahead::Readahead>,
    read_counters: crate::pipeline::ReadCounters,
    /// Files found damaged in the cache, and the background check of cache files (`integrity.rs`).
    integrity: Integrity,
    /// The change pipeline, which written data and changes made by the data path go to.
    changes: std::sync::OnceLock<std::sync::Weak<dyn Intake>>,
    /// The cluster's locks, if the mount shares them (`locks.rs`).
    locks: std::sync::OnceLock<Arc<dyn crate::locks::LockTable>>,
    /// The lock key of each file this node holds locks on, as it was when locked.
    lock_keys: std::sync::Mutex<std::collections::HashMap<u64, Vec<u8>>>,
}

/// What the data path hands up to the change pipeline (implemented by `Changes`, wired by the façade):
/// written data to queue, room to make for writers, the changes of names and attributes a create or an
/// allocation makes, and attributes home gave a push of a file's content.
pub(crate) trait Intake: Send + Sync {
    /// Make `ino`'s written data safe (see `Changes::commit_data`).
    fn commit_data(&self, ino: u64, durable: bool) -> FsResult<()>;
    /// Hold a writer of `bytes` back while the cache is near full of dirty data.
    fn make_room(&self, bytes: u64) -> FsResult<()>;
    /// Whether `bytes` more dirty data fit now, with no wait.
    fn room_now(&self, bytes: u64) -> bool;
    /// Create a file, as a change of names.
    fn create_file(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry>;
    /// Make and open a file with no name (`O_TMPFILE`).
    fn tmpfile(&self, parent: u64, mode: u32, uid: u32, gid: u32) -> FsResult<(Entry, OpenReply)>;
    /// Change `ino`'s attributes, as a change.
    fn setattr(&self, ino: u64, changes: &SetAttr) -> FsResult<Entry>;
    /// Take the attributes home gave a push of `ino`'s content.
    fn settle_attr(&self, ns: &mut Namespace, ino: u64, attr: larder_home::HomeAttr);
}

impl DataPath {
    pub(crate) fn new(
        cfg: crate::FsConfig,
        core: Arc<Core>,
        names: Arc<Names>,
        readahead: Arc<crate::readahead::Readahead>,
    ) -> DataPath {
        DataPath {
            cfg,
            core,
            names,
            readahead,
            read_counters: Default::default(),
            integrity: Default::default(),
            changes: std::sync::OnceLock::new(),
            locks: std::sync::OnceLock::new(),
            lock_keys: Default::default(),
        }
    }

    /// Hand written data and changes to `changes` from now on.
    pub(crate) fn wire(&self, changes: std::sync::Weak<dyn Intake>) {
        let _ = self.changes.set(changes);
    }

    /// The change pipeline: it lives as long as the file system does, and so as long as any caller here.
    fn changes(&self) -> Arc<dyn Intake> {
        self.changes
            .get()
            .and_then(std::sync::Weak::upgrade)
            .expect("the change pipeline lives as long as the data path's callers")
    }

    pub(crate) fn read_counters(&self) -> &crate::pipeline::ReadCounters {
        &self.read_counters
    }

    pub(crate) fn readahead(&self) -> &crate::readahead::Readahead {
        &self.readahead
    }
}

/// Longest a fetch waits for a push of the same file to finish before calling a version change foreign.
const PUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What a write puts in a file: bytes, or as many zeros (a hole where the file systems can keep one), or as
/// many zeros set aside on the cache disk (`fallocate` past the end: the cache file system allocates them,
/// and home gets a hole).
#[derive(Clone, Copy)]
enum Payload<'a> {
    Bytes(&'a [u8]),
    Zeros(u64),
    Allocated(u64),
}

impl DataPath {
    /// Open a file. Its attributes are revalidated first once the validity lag has passed (always, with a
    /// lag of 0), so a version changed at home is never served from the cache after the open.
    ///
    /// In a cluster, the changes other nodes published before the open are applied first: what another
    /// node closed is what this open sees.
    pub(crate) fn open(&self, ino: u64, flags: i32) -> FsResult<OpenReply> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.names.take_token_of(ino)?;
        }
        self.names.sync_cluster();
        let reply = self.open_as_is(ino, flags)?;
        if self.names.coherence().is_some() {
            // The kernel's cached size and pages of a version another node replaced go before the first
            // read of this open.
            self.names.kernel_barrier();
        }
        if flags & libc::O_APPEND != 0 {
            self.names.handles().with(reply.fh, |h| h.append = true);
        }
        Ok(reply)
    }

    /// A read-only open as this node knows the file now (for a peer reading what this node holds).
    pub(crate) fn open_here(&self, ino: u64) -> FsResult<u64> {
        self.open_as_is(ino, libc::O_RDONLY).map(|r| r.fh)
    }

    fn open_as_is(&self, ino: u64, flags: i32) -> FsResult<OpenReply> {
        if (flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0) && self.names.read_only() {
            return Err(FsError::ReadOnly);
        }
        let path = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            if node.kind == FileKind::Dir && flags & libc::O_ACCMODE != libc::O_RDONLY {
                return Err(FsError::IsDir);
            }
            self.names.revalidation_path(&ns, ino)?
        };
        if let Some(path) = path {
            self.names.revalidate(ino, &path)?;
        }
        // An open of a file whose attributes are fresh is a hit: the namespace is shared.
        let ns = self.names.read();
        let mut reply = self.names.open_handle(&ns, ino)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable {
            self.names.handles().with(reply.fh, |h| h.writable = true);
        }
        reply.passthrough = self.passthrough_open(&ns, ino)?;
        Ok(reply)
    }

    /// Whether an open of `ino` may be served by the kernel from the cache file (FUSE passthrough), for
    /// reading and writing: a file whole in a cache file of its own (clean or dirty), not on a writable
    /// mount in a cluster (where every write takes the file's token through the daemon).
    pub(crate) fn passthrough_open(&self, ns: &Namespace, ino: u64) -> FsResult<bool> {
        if !self.cfg.passthrough || (self.names.coherence().is_some() && !self.names.read_only()) {
            return Ok(false);
        }
        let node = ns.inode(ino)?;
        Ok(node.kind == FileKind::File
            && !node.removed
            && node
                .attr
                .as_ref()
                .is_some_and(|a| self.core.store.whole_in_file(node.object, a.size)))
    }

    /// Whether passthrough was asked for in the configuration.
    pub(crate) fn passthrough_wanted(&self) -> bool {
        self.cfg.passthrough
    }

    /// The object (content version) handle `fh` reads.
    pub(crate) fn handle_object(&self, fh: u64) -> Option<u64> {
        self.names.handles().with(fh, |h| h.object)
    }

    /// End the hold [`crate::Fs::passthrough`] took for `fh` when the kernel did not take the file after all.
    pub(crate) fn unhold(&self, fh: u64) {
        if let Some((held, writer, ino, object)) = self.names.handles().with(fh, |h| {
            (
                std::mem::take(&mut h.held),
                h.pt_writer.take().is_some(),
                h.ino,
                h.object,
            )
        }) {
            if held {
                self.core.store.unhold(object);
            }
            if writer {
                self.end_direct_writer(ino);
                // The kernel never served it: nothing was written unseen.
                self.core.store.unseen_writer_ended(object);
            }
        }
    }

    /// The cache file the kernel may read and write handle `fh`'s data in directly (FUSE passthrough), for
    /// a handle whose open said `passthrough`, or any open of an inode the kernel already serves from that
    /// file (`backed`: the kernel requires every open of it to be served so, and what its writers wrote
    /// is not taken in yet). From then until the handle is released, the store holds its object: no
    /// eviction, and no hole punched under the reader. `None` if the file is no longer whole.
    pub(crate) fn passthrough(&self, fh: u64, backed: bool) -> Option<Arc<std::fs::File>> {
        let (ino, object, writable) = self.names.handles().with(fh, |h| (h.ino, h.object, h.writable))?;
        // The kernel serves what it reads from the cache file as is: every block of it is checked against
        // its checksum first, and the file holds no bytes past the file's end (`integrity.rs`). (An inode
        // the kernel serves so already was checked at its first such open.)
        let checked = backed || self.verified_for_kernel(ino, object) && self.cache_file_fits(ino, object);
        if !checked {
            return None;
        }
        let ns = self.names.read();
        let node = ns.inode(ino).ok()?;
        let size = node.attr.as_ref()?.size;
        if node.object != object {
            return None;
        }
        self.core.store.hold(object);
        // The cache file must hold the whole file: one shorter (a file extended by truncation) would end
        // the kernel's reads early.
        let file = self.core.store.file(object).ok().filter(|f| {
            backed || (self.core.store.whole_in_file(object, size) && f.metadata().is_ok_and(|m| m.len() >= size))
        });
        match file {
            Some(file) => {
                self.names.handles().with(fh, |h| h.held = true);
                drop(ns);
                if writable && !self.begin_direct_writer(fh, object, &file) {
                    self.names.handles().with(fh, |h| h.held = false);
                    self.core.store.unhold(object);
                    return None;
                }
                Some(file)
            }
            None => {
                self.core.store.unhold(object);
                None
            }
        }
    }

    /// Create and open a regular file. An existing file is opened instead unless `O_EXCL` is given.
    pub(crate) fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        uid: u32,
        gid: u32,
    ) -> FsResult<(Entry, OpenReply)> {
        match self.changes().create_file(parent, name, mode, uid, gid) {
            Ok(entry) => {
                // A new file is written through the daemon (no passthrough): serving it from a cache file
                // of its own from the start would make every create create a file in the cache directory
                // too (an inode allocation there), which made creates of empty files 4 to 7 times slower.
                // Its next open, once it is whole in the cache, is served by the kernel.
                let reply = self.names.open_handle(&self.names.read(), entry.attr.ino)?;
                self.opened_as(reply.fh, flags);
                Ok((entry, reply))
            }
            Err(FsError::Home(HomeError::Exists)) if flags & libc::O_EXCL == 0 => {
                let mut entry = self.names.lookup(parent, name)?;
                if entry.attr.kind == FileKind::Dir {
                    return Err(FsError::IsDir);
                }
                if flags & libc::O_TRUNC != 0 {
                    entry = self.changes().setattr(
                        entry.attr.ino,
                        &SetAttr {
                            size: Some(0),
                            ..SetAttr::default()
                        },
                    )?;
                }
                let reply = self.open(entry.attr.ino, flags)?;
                Ok((entry, reply))
            }
            Err(FsError::Home(HomeError::Exists)) => Err(FsError::Exists),
            Err(e) => Err(e),
        }
    }

    /// Make and open a file with no name in `parent` (`O_TMPFILE`), written through the daemon as a new
    /// file is (see [`DataPath::create`]); see `Changes::tmpfile`.
    pub(crate) fn tmpfile(
        &self,
        parent: u64,
        mode: u32,
        flags: i32,
        uid: u32,
        gid: u32,
    ) -> FsResult<(Entry, OpenReply)> {
        let (entry, reply) = self.changes().tmpfile(parent, mode, uid, gid)?;
        self.opened_as(reply.fh, flags);
        Ok((entry, reply))
    }

    /// Note on handle `fh` of a file just made what its open's `flags` say: appending, writable.
    fn opened_as(&self, fh: u64, flags: i32) {
        let append = flags & libc::O_APPEND != 0;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.names.handles().with(fh, |h| {
            h.append = append;
            h.writable = writable;
        });
    }

    /// Write `data` at `offset` into the cached copy; it reaches home on flush, fsync or close.
    pub(crate) fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        self.write_payload(fh, offset, Payload::Bytes(data)).map(|n| n as u32)
    }

    /// Make `len` bytes from `offset` read as zeros, as a write of zeros would, keeping them a hole in the
    /// cache file and at home where their file systems can (`fallocate`'s punch and zero modes).
    pub(crate) fn write_zeros(&self, fh: u64, offset: u64, len: u64) -> FsResult<()> {
        self.write_payload(fh, offset, Payload::Zeros(len)).map(|_| ())
    }

    /// Make `len` bytes from `offset`, all past the file's end, read as zeros and take room on the cache
    /// disk, so that writes there find it (`fallocate`'s allocation past the end).
    pub(crate) fn write_allocated(&self, fh: u64, offset: u64, len: u64) -> FsResult<()> {
        self.write_payload(fh, offset, Payload::Allocated(len)).map(|_| ())
    }

    fn write_payload(&self, fh: u64, offset: u64, payload: Payload) -> FsResult<u64> {
        if self.names.read_only() {
            return Err(FsError::ReadOnly);
        }
        let len = match payload {
            Payload::Bytes(d) => d.len() as u64,
            Payload::Zeros(n) | Payload::Allocated(n) => n,
        };
        if len == 0 {
            return Ok(0);
        }
        let ino = self.names.handles().ino(fh).ok_or(FsError::BadHandle)?;
        let bs = self.core.store.block_size();
        let write_lock = self.names.read().inode(ino)?.write_lock.clone();
        // Zeros take no room: a hole, but for their unaligned edges.
        self.changes().make_room(match payload {
            Payload::Bytes(_) | Payload::Allocated(_) => len,
            Payload::Zeros(_) => 0,
        })?;
        // One write of a file at a time: two writers completing the same partial block from home must not
        // undo each other, and a push must see each write whole. In a cluster, the write token may have
        // gone to another node since the open: taken back first, and still this node's once the write
        // lock is (a node giving the token up takes that lock before it pushes).
        let _w = loop {
            self.names.take_token_of(ino)?;
            let w = lock(&write_lock);
            if self.names.token_still_held(ino) {
                break w;
            }
        };
        // An append goes at the end as this node knows it: the kernel's cached size, which gave `offset`,
        // may predate a change made at home or on another node. The kernel then learns the size anew.
        let append = self.names.handles().with(fh, |h| h.append).unwrap_or(false);
        let offset = match self.names.read().inode(ino)?.attr.as_ref().map(|a| a.size) {
            Some(size) if append && size != offset => {
                self.names.invalidate(crate::Invalidation::Inode(ino));
                size
            }
            _ => offset,
        };
        let end = offset + len;
        // One critical section takes the file's state and records the range as dirty: from then on the
        // object cannot change under this write (a new version is never taken while writes are pending),
        // and a push finishing meanwhile will not mark these blocks clean.
        let (ino, object, size, file, before) = {
            let mut ns = self.names.write();
            let path = ns.home_path(ino)?;
            let node = ns.inode_mut(ino)?;
            let attr = node.attr.as_ref().ok_or(FsError::BadHandle)?;
            // Past home's part of the content there is nothing to fetch.
            let size = if path.is_some() { node.home_end() } else { 0 };
            let file = path.map(|path| FileVersion {
                object: node.object,
                epoch: self.core.store.epoch(node.object),
                path,
                version: attr.version.clone(),
                home_end: size,
            });
            let before = (node.dirty.clone(), node.attr.clone());
            add_range(&mut node.dirty, offset..end);
            if let Some(u) = node.unconfirmed.as_mut() {
                // Bytes written again no longer show what an earlier push sent.
                u.ranges = subtract(&u.ranges, std::slice::from_ref(&(offset..end)));
            }
            if let Some(a) = node.attr.as_mut() {
                a.size = a.size.max(end);
                let now = SystemTime::now();
                a.mtime = now;
                a.ctime = now;
            }
            (ino, node.object, size, file, before)
        };
        let restore = |before: (Vec<std::ops::Range<u64>>, Option<larder_home::HomeAttr>)| -> FsResult<()> {
            let mut ns = self.names.write();
            let node = ns.inode_mut(ino)?;
            (node.dirty, node.attr) = before;
            Ok(())
        };
        let edges: BTreeSet<u64> = [offset / bs, (end - 1) / bs].into_iter().collect();
        let mut completions = Vec::new();
        for index in edges {
            let start = index * bs;
            let existing_end = (start + bs).min(size);
            // A partly written block that holds home data must be whole in the cache: claim it if present
            // (eviction can no longer take it), else bring its home bytes in with the new ones.
            let claimed = || -> FsResult<bool> {
                self.core.store.claim((object, index as u32)).map_err(|e| {
                    self.damaged_found(ino, &e);
                    FsError::from(e)
                })
            };
            if start >= size || (offset <= start && end >= existing_end) {
                continue;
            }
            match claimed() {
                Ok(true) => continue,
                Ok(false) => {}
                Err(e) => {
                    restore(before)?;
                    return Err(e);
                }
            }
            let Some(file) = &file else { continue };
            match self.fetch_block(ino, file, index as u32) {
                Ok(block) => completions.push((start, block)),
                Err(e) => {
                    restore(before)?;
                    return Err(e);
                }
            }
        }
        if !completions.is_empty() {
            let mut ns = self.names.write();
            let node = ns.inode_mut(ino)?;
            for (start, block) in &completions {
                add_range(&mut node.dirty, *start..*start + block.len() as u64);
            }
        }
        let landed = completions
            .iter()
            .try_for_each(|(start, block)| self.core.store.write(object, *start, block))
            .and_then(|()| match payload {
                Payload::Bytes(data) => self.core.store.write(object, offset, data),
                Payload::Zeros(n) => self.core.store.write_zeros(object, offset, n),
                Payload::Allocated(n) => self.core.store.write_allocated(object, offset, n),
            });
        if let Err(e) = landed {
            self.write_cut_short(ino, object, before, offset..end)?;
            return Err(e.into());
        }
        Ok(len)
    }

    /// A write of `range` to `ino`'s cache `object` failed part way (a full cache disk): the file keeps
    /// the size and times it had (`before`, with its dirty ranges), and the cache file is cut back to that
    /// size, so that no reader (the kernel, reading the cache file to its end through passthrough,
    /// included) reads the bytes that did land past it. Those it overwrote below that size may have landed:
    /// the blocks it touched there stay dirty, so that what the cache file holds there goes home.
    fn write_cut_short(
        &self,
        ino: u64,
        object: u64,
        before: (Vec<Range<u64>>, Option<larder_home::HomeAttr>),
        range: Range<u64>,
    ) -> FsResult<()> {
        let bs = self.core.store.block_size();
        let old_size = before.1.as_ref().map_or(0, |a| a.size);
        {
            let mut ns = self.names.write();
            let node = ns.inode_mut(ino)?;
            (node.dirty, node.attr) = before;
            let touched = range.start / bs * bs..(range.end.div_ceil(bs) * bs).min(old_size);
            if touched.start < touched.end {
                add_range(&mut node.dirty, touched);
            }
        }
        if range.end > old_size {
            self.core.store.truncate(object, old_size)?;
        }
        Ok(())
    }

    /// Make pending writes of the file behind `fh` safe (close and fsync): pushed to home (write-through)
    /// or durable in the cache and queued (write-back).
    pub(crate) fn flush(&self, fh: u64) -> FsResult<()> {
        self.commit_handle(fh, false)
    }

    /// Make the file behind `fh` durable against power loss: its data and every change made so far
    /// (write-back: in the cache; write-through: at home).
    pub(crate) fn fsync(&self, fh: u64) -> FsResult<()> {
        self.commit_handle(fh, true)?;
        self.sync_changes()
    }

    /// What was written through `fh` (by the daemon, or by the kernel in the cache file) committed as
    /// [`Changes::commit_data`] does.
    fn commit_handle(&self, fh: u64, durable: bool) -> FsResult<()> {
        let ino = self.names.handles().ino(fh).ok_or(FsError::BadHandle)?;
        self.adopt_direct_writes(fh)?;
        self.changes().commit_data(ino, durable)
    }

    /// Make every change made so far durable against power loss (`fsync` of a directory, `syncfs`).
    pub(crate) fn sync_changes(&self) -> FsResult<()> {
        if self.names.read_only() {
            return Ok(());
        }
        self.core.store.db().sync().map_err(FsError::from)
    }

    /// Close a handle: push what is pending, and drop an unlinked file's data once nothing uses it.
    pub(crate) fn release(&self, fh: u64) -> FsResult<()> {
        // What the kernel wrote through this handle (mmap'ed pages written after the last close, too).
        let adopted = self.adopt_direct_writes(fh);
        let Some(h) = self.names.handles().remove(fh) else {
            return Err(FsError::BadHandle);
        };
        if h.pt_writer.is_some() {
            self.end_direct_writer(h.ino);
        }
        if let Err(e) = &adopted {
            tracing::error!(error = %e, ino = h.ino, "adopting what the kernel wrote to a cache file failed");
        }
        if h.held {
            self.core.store.unhold(h.object);
        }
        let result = if h.entries.is_none() {
            self.changes().commit_data(h.ino, false)
        } else {
            Ok(())
        };
        if let Err(e) = &result {
            tracing::error!(error = %e, ino = h.ino, "pushing a closed file to home failed; its changes stay cached");
        }
        if h.pt_writer.is_some() && adopted.is_ok() && result.is_ok() {
            // What it wrote is taken in and recorded; on a failure the mark stays, for the next start.
            self.core.store.unseen_writer_ended(h.object);
        }
        // The count of opens drops with the namespace shared; only the last close of a removed file, which
        // drops its data, takes it alone.
        let last_of_removed = {
            let ns = self.names.read();
            ns.inodes.get(&h.ino).is_some_and(|node| {
                let was = node
                    .opens
                    .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)))
                    .unwrap_or(0);
                node.removed && was <= 1
            })
        };
        if !last_of_removed {
            return result;
        }
        let mut ns = self.names.write();
        if let Some(node) = ns.inodes.get_mut(&h.ino)
            && node.removed
            && node.opens() == 0
        {
            let (object, lookups, pushing) = (node.object, node.lookups(), node.pushing);
            node.dirty.clear();
            if std::mem::take(&mut node.kept_for_readers) {
                self.core.store.unhold(object);
            }
            if object != 0 {
                // A push of it under way reads its cache file still: unlinked, not made a spare.
                self.core.store.remove_object_with(object, pushing > 0);
            }
            self.core
                .store
                .db()
                .submit(vec![larder_cache::Mutation::DelInode(h.ino)]);
            if lookups == 0 {
                ns.inodes.remove(&h.ino);
            }
        }
        result
    }
}

mod allocate;
mod integrity;
mod locks;
mod passthrough;
mod push;
mod read;
mod readers;
mod residency;
mod serve;

pub use integrity::DamagedFile;
pub(crate) use integrity::Integrity;
pub(crate) use push::COMPARE_MAX;
pub use residency::{PIN_SHARE, Residency, describe as describe_residency_error};

pub(crate) use crate::fetch::Core;

#[cfg(test)]
mod tests {
    #[test]
    fn an_append_goes_at_the_end_this_node_knows_whatever_offset_the_kernel_gave() {
        let tmp = tempfile::tempdir().unwrap();
        let fs = crate::namespace::hit_tests::core(&tmp.path().join("home"), &tmp.path().join("cache"));
        let dir = fs
            .lookup(crate::namespace::ROOT, std::ffi::OsStr::new("dir"))
            .unwrap()
            .attr
            .ino;
        let ino = fs.lookup(dir, std::ffi::OsStr::new("f")).unwrap().attr.ino;
        let fh = fs.open(ino, libc::O_WRONLY | libc::O_APPEND).unwrap().fh;
        // The kernel's cached size says 0: the append still lands after the file's 10 KiB.
        assert_eq!(fs.write(fh, 0, b"tail").unwrap(), 4);
        fs.release(fh).unwrap();
        let fh = fs.open(ino, libc::O_RDONLY).unwrap().fh;
        let data = fs.read(fh, 0, 20 << 10).unwrap();
        assert_eq!(data.len(), (10 << 10) + 4);
        assert!(data[..10 << 10].iter().all(|&b| b == 7));
        assert_eq!(&data[10 << 10..], b"tail");
    }
}
