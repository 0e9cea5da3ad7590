//! The push of a file's content to home: its dirty ranges and size, conditional on the home version
//! they were made on, with what it sends on record first; what is written meanwhile stays dirty.

use std::collections::BTreeSet;
use std::path::Path;

use larder_home::{Content, HomeAttr, HomeError, NewFile, Owner};

use crate::data::DataPath;
use crate::namespace::lock;
use crate::ranges::{add_range, blocks_of, bytes_of, subtract, whole};
use crate::{FsError, FsResult};

/// Most bytes compared with home to tell whether a repeated push had already landed.
pub(crate) const COMPARE_MAX: u64 = 256 << 20;

impl DataPath {
    /// What a push sends must be what was written: the dirty blocks of `ino` not checked against their
    /// checksums since the start are checked now, and a damaged one keeps the file from home
    /// (`integrity.rs`). (Blocks written since are the daemon's own bytes, checked by nothing.)
    fn check_before_push(&self, ino: u64) -> FsResult<()> {
        let bs = self.core.store.block_size();
        let (object, blocks): (u64, Vec<std::ops::Range<u32>>) = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            (node.object, crate::ranges::block_runs(&node.dirty, bs))
        };
        for b in blocks {
            let found = self.core.store.verify_range(object, b.start..=b.end - 1)?;
            if let Some(&block) = found.damaged.first() {
                let e = larder_cache::CacheError::Damaged { object, block };
                self.damaged_found(ino, &e);
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Push the local content of `ino` (dirty ranges, and size) to `at` (default: where home has it now).
    /// With `force`, home's version is overwritten whatever it is; otherwise a version other than the one
    /// the changes were made on is a [`HomeError::Conflict`]. The caller holds the inode's flush lock.
    pub(crate) fn push_data(&self, ino: u64, at: Option<std::path::PathBuf>, force: bool) -> FsResult<()> {
        self.push(ino, at, force, None)
    }

    /// Push `ino`, which home does not have yet, as a new file at `at` with `mode` and `owner`: made with
    /// its content and time in one home call ([`larder_home::Home::create_file`]), on record as any push.
    /// [`HomeError::Exists`] when the name is taken at home; nothing of ours went then. The caller holds
    /// the inode's flush lock.
    pub(crate) fn push_new(&self, ino: u64, at: std::path::PathBuf, mode: u32, owner: Owner) -> FsResult<()> {
        self.push(ino, Some(at), false, Some((mode, owner)))
    }

    fn push(
        &self,
        ino: u64,
        at: Option<std::path::PathBuf>,
        force: bool,
        create: Option<(u32, Owner)>,
    ) -> FsResult<()> {
        // What writers the kernel serves from the cache file wrote so far goes too.
        self.adopt_all_direct_writes(ino);
        self.check_before_push(ino)?;
        let write_lock = self.names.read().inode(ino)?.write_lock.clone();
        let (ranges, size, object, path, base, file, mtime, direct, begun) = {
            // Under the write lock: every range taken has all its bytes in the cache file.
            let _w = lock(&write_lock);
            let mut ns = self.names.write();
            let node = ns.inode_mut(ino)?;
            if node.removed {
                // Unlinked: its data has nowhere to go.
                node.dirty.clear();
                return Ok(());
            }
            if node.dirty.is_empty() && node.home_size.is_none() && create.is_none() {
                return Ok(());
            }
            if node.conflict && !force {
                return Err(FsError::Home(HomeError::Conflict));
            }
            let size = node.attr.as_ref().map_or(0, |a| a.size);
            // The time the mount shows (a write's, or one set since) is the time home ends with.
            let mtime = node.attr.as_ref().map(|a| a.mtime);
            // The version these changes were made on: home must still be at it, or the push is a conflict.
            let base = node
                .attr
                .as_ref()
                .map(|a| a.version.clone())
                .filter(|v| !v.0.is_empty() && !force && create.is_none());
            let mut ranges = std::mem::take(&mut node.dirty);
            let object = node.object;
            if let Some(h) = node.home_size
                && h < size
            {
                // Home's bytes past the local truncation point are gone here: the tail is ours (zeros
                // where nothing was written since).
                add_range(&mut ranges, h..size);
            }
            // A small file the cache holds all of goes whole: home cuts it to nothing and writes it from
            // the start, so a push cut short (the daemon killed, home gone) leaves a prefix of our
            // bytes, which the repeat recognises, never a mix of ours and home's bytes before, which
            // could not be told from someone else's change at home.
            // Its blocks are claimed (dirty) like the written ones, so that none is evicted before the push
            // reads it; a block eviction took meanwhile is simply not sent (its bytes are home's).
            if size > 0
                && size <= self.core.small_file_threshold
                && !whole(&ranges, size)
                && self.core.store.whole_in_file(object, size)
            {
                let bs = self.core.store.block_size();
                for index in 0..size.div_ceil(bs) as u32 {
                    if self.core.store.claim((object, index)).unwrap_or(false) {
                        add_range(&mut ranges, bytes_of(index, bs, size));
                    }
                }
            }
            let path = match at {
                Some(p) => Ok(p),
                None => ns.home_path(ino).and_then(|p| p.ok_or(FsError::NotFound)),
            };
            // The cache file holds `size` bytes at least (a file extended by truncation may end in a hole
            // the file system does not store); extended here, under the write lock, so that no write can
            // land between the length check and the extension.
            // (A file cached whole from home since, kept once for every file of the same bytes by dedup,
            // is read-only: its own copy is made first.)
            let file = self.core.store.file(object).map_err(FsError::from).and_then(|file| {
                if file.metadata().map(|m| m.len()).unwrap_or(0) < size {
                    let file = self.core.store.writable_file(object)?;
                    file.set_len(size)
                        .map_err(|e| FsError::Cache(larder_cache::CacheError::Io(e)))?;
                    return Ok(file);
                }
                Ok(file)
            });
            match path.and_then(|p| file.map(|f| (p, f))) {
                Ok((path, file)) => {
                    let node = ns.inode_mut(ino)?;
                    node.pushing += 1;
                    node.attempt = Some(Box::new(crate::namespace::Attempt::sent(ranges.clone(), size)));
                    // Where changes are journaled, what this push sends is on record before home sees any
                    // of it, with the flusher's record of the attempt (one sync for both): after a crash,
                    // home holding it is recognised as ours.
                    // Submitted under the namespace's lock, as every record (`Changes::queue`).
                    if node.keeps_record() {
                        self.core
                            .store
                            .db()
                            .submit(vec![larder_cache::Mutation::PutInode(ino, node.record().encode())]);
                    }
                    // With writers the kernel serves, the cache file can change under the push: its stamp
                    // now tells afterwards whether it did. A writer beginning during the push is told by
                    // the count of writers begun.
                    let direct = (node.pt_writers.load(std::sync::atomic::Ordering::Relaxed) > 0)
                        .then(|| crate::stamp::stamp(&file, self.core.fine_times()));
                    let begun = node.pt_begun.load(std::sync::atomic::Ordering::Relaxed);
                    (ranges, size, object, path, base, file, mtime, direct, begun)
                }
                Err(e) => {
                    ns.inode_mut(ino)?.dirty = ranges;
                    return Err(e);
                }
            }
        };
        {
            let db = self.core.store.db();
            // Write-through pushes without the sync: its op counts as a repeat after a crash (`Changes::land`).
            let through = self.cfg.write_mode.acknowledges_from_home();
            if let Err(e) = if through { Ok(()) } else { db.sync() } {
                let mut ns = self.names.write();
                let node = ns.inode_mut(ino)?;
                node.pushing -= 1;
                node.attempt = None;
                for r in ranges {
                    add_range(&mut node.dirty, r);
                }
                return Err(e.into());
            }
        }
        let result = match create {
            Some((mode, owner)) => {
                let content = Content {
                    source: &file,
                    ranges: &ranges,
                    size,
                };
                let new = NewFile {
                    mode,
                    owner,
                    mtime,
                    content: Some(content),
                };
                self.core.home.create_file(&path, &new)
            }
            None => self.core.home.write(&path, &file, &ranges, size, base.as_ref(), mtime),
        }
        .map_err(FsError::from);
        let mut ns = self.names.write();
        ns.inode_mut(ino)?.pushing -= 1;
        match result {
            Ok(attr) => {
                // With a writer the kernel serves still open, written by the kernel meanwhile (or too
                // recently to tell), or a writer began meanwhile: home may hold a mix of the bytes before
                // and after, so all of it stays dirty and goes again, after the writers' next adoption (a
                // close queues it). Home's new version is ours all the same. (Marked clean, the blocks
                // would be indexed with the cache file's bytes now, the writer's among them, which its
                // adoption would then find unchanged.) Writers closed since have adopted all they wrote:
                // those blocks are dirty again already, and the rest are as pushed.
                let unchanged = |before: &Option<crate::stamp::Stamp>| {
                    before.is_some() && crate::stamp::stamp(&file, self.core.fine_times()) == *before
                };
                let node = ns.inode(ino)?;
                let writing = node.pt_writers.load(std::sync::atomic::Ordering::Relaxed) > 0;
                let began = node.pt_begun.load(std::sync::atomic::Ordering::Relaxed) != begun;
                if writing && (began || direct.as_ref().is_some_and(|before| !unchanged(before))) {
                    let node = ns.inode_mut(ino)?;
                    for r in &ranges {
                        add_range(&mut node.dirty, r.clone());
                    }
                    node.conflict = false;
                    node.attempt = None;
                    node.unconfirmed = None;
                    node.home_size = Some(size);
                    self.changes().settle_attr(&mut ns, ino, attr);
                    return Ok(());
                }
                // Blocks written again since the ranges were taken stay dirty.
                let bs = self.core.store.block_size();
                let node = ns.inode(ino)?;
                let still_dirty: BTreeSet<u32> = node.dirty.iter().flat_map(|r| blocks_of(r, bs)).collect();
                let clean: BTreeSet<u32> = ranges
                    .iter()
                    .flat_map(|r| blocks_of(r, bs))
                    .filter(|b| !still_dirty.contains(b))
                    .collect();
                let cur_size = node.attr.as_ref().map_or(size, |a| a.size);
                let settled = node.dirty.is_empty() && cur_size == size;
                // Home holds `size` bytes of these blocks now. (A write extending the file may be under way:
                // the file's size is ahead of its cache file then, but the blocks it writes are dirty again.)
                // Home has the data whatever happens here: a block that cannot be indexed is dropped.
                self.core.store.mark_clean(object, clean.iter().copied(), size);
                let node = ns.inode_mut(ino)?;
                if writing
                    && let Some(before) = &direct
                    && !unchanged(before)
                {
                    // Written by the kernel while the blocks were indexed: indexed again as dirty (the
                    // writer's open handle holds the object, so none was evicted meanwhile), and they go
                    // again.
                    for &b in &clean {
                        add_range(&mut node.dirty, bytes_of(b, bs, size));
                    }
                    if let Err(e) = self.core.store.commit(object, clean.iter().copied(), size) {
                        tracing::warn!(ino, error = %e, "indexing blocks the kernel wrote during a push failed");
                    }
                }
                node.conflict = false;
                node.attempt = None;
                node.unconfirmed = None;
                // Truncations take the flush lock, so none happened during the push: home has `size` bytes
                // of ours now.
                node.home_size = if settled && node.dirty.is_empty() {
                    None
                } else {
                    Some(size)
                };
                if node.home_size.is_none() {
                    // Home has all of it: its cache file no longer holds changes not yet at home.
                    node.labelled = false;
                    self.unlabel(ino, object);
                }
                // (Changes of it queued after this push, a chmod say, stand until theirs.)
                self.changes().settle_attr(&mut ns, ino, attr);
                Ok(())
            }
            Err(e) => {
                let node = ns.inode_mut(ino)?;
                node.attempt = None;
                // A name taken at home: this attempt sent nothing.
                let sent = !(create.is_some() && matches!(e, FsError::Home(HomeError::Exists)));
                if sent && node.unconfirmed.is_none() {
                    // It may have reached home in part or whole: what it sent tells, if asked.
                    node.unconfirmed = Some(Box::new(crate::namespace::Attempt {
                        whole: whole(&ranges, size),
                        ranges: subtract(&ranges, &node.dirty),
                        size,
                    }));
                }
                for r in ranges {
                    add_range(&mut node.dirty, r);
                }
                Err(e)
            }
        }
    }

    /// Whether home's object at `path` is what an earlier push of `ino` made it: the bytes that push sent
    /// (those not written again since) and its size, or, for a push of the whole content cut short, a
    /// prefix of them (home cut the file to nothing before writing it from the start). Without a record of
    /// that push, the cache's pending content and size.
    /// Home's attributes if so.
    pub(crate) fn home_has_ours(&self, ino: u64, path: &Path) -> Option<HomeAttr> {
        let (ranges, size, whole, object) = {
            let ns = self.names.read();
            let Ok(node) = ns.inode(ino) else { return None };
            match &node.unconfirmed {
                Some(a) => (a.ranges.clone(), a.size, a.whole, node.object),
                None => (
                    node.dirty.clone(),
                    node.attr.as_ref().map_or(0, |a| a.size),
                    false,
                    node.object,
                ),
            }
        };
        let attr = self.core.home.stat(path).ok()?;
        // Where home's copy of what was sent ends.
        let end = if whole && attr.size < size { attr.size } else { size };
        if attr.size != end || ranges.iter().map(|r| r.end - r.start).sum::<u64>() > COMPARE_MAX {
            tracing::info!(path = %path.display(), home_size = attr.size, size, whole, "home's file is not what an interrupted push of ours left there: its size differs");
            return None;
        }
        let file = self.core.store.file(object).ok()?;
        let ours = ranges.iter().all(|r| {
            let stop = r.end.min(end);
            if r.start >= stop {
                return true;
            }
            let len = (stop - r.start) as usize;
            let mut mine = vec![0u8; len];
            let got = std::os::unix::fs::FileExt::read_at(file.as_ref(), &mut mine, r.start).unwrap_or(0);
            mine[got..].fill(0);
            let same = self
                .core
                .home
                .read(path, &attr.version, r.start, len)
                .is_ok_and(|theirs| theirs == mine);
            if !same {
                tracing::info!(path = %path.display(), range = ?(r.start..stop), whole, "home's file is not what an interrupted push of ours left there: its bytes differ");
            }
            same
        });
        ours.then_some(attr)
    }
}
