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
use crate::namespace::{Fs, Namespace, lock, read, write};
use crate::ranges::{add_range, subtract};
use crate::readahead::Job;
use crate::{Entry, FsError, FsResult, OpenReply, Prefetch};

/// Longest a fetch waits for a push of the same file to finish before calling a version change foreign.
const PUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Fs {
    /// Open a file. Its attributes are revalidated first once the validity lag has passed (always, with a
    /// lag of 0), so a version changed at home is never served from the cache after the open.
    ///
    /// In a cluster, the changes other nodes published before the open are applied first: what another
    /// node closed is what this open sees.
    pub fn open(&self, ino: u64, flags: i32) -> FsResult<OpenReply> {
        if flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            self.take_token_of(ino)?;
        }
        self.sync_cluster();
        let reply = self.open_as_is(ino, flags)?;
        if self.coherence.get().is_some() {
            // The kernel's cached size and pages of a version another node replaced go before the first
            // read of this open.
            self.kernel_barrier();
        }
        if flags & libc::O_APPEND != 0 {
            self.handles.with(reply.fh, |h| h.append = true);
        }
        Ok(reply)
    }

    /// A read-only open as this node knows the file now (for a peer reading what this node holds).
    pub(crate) fn open_here(&self, ino: u64) -> FsResult<u64> {
        self.open_as_is(ino, libc::O_RDONLY).map(|r| r.fh)
    }

    fn open_as_is(&self, ino: u64, flags: i32) -> FsResult<OpenReply> {
        if (flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0) && self.read_only() {
            return Err(FsError::ReadOnly);
        }
        let path = {
            let ns = read(&self.ns);
            let node = ns.inode(ino)?;
            if node.kind == FileKind::Dir && flags & libc::O_ACCMODE != libc::O_RDONLY {
                return Err(FsError::IsDir);
            }
            self.revalidation_path(&ns, ino)?
        };
        if let Some(path) = path {
            self.revalidate(ino, &path)?;
        }
        // An open of a file whose attributes are fresh is a hit: the namespace is shared.
        let ns = read(&self.ns);
        let mut reply = self.open_handle(&ns, ino)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable {
            self.handles.with(reply.fh, |h| h.writable = true);
        }
        reply.passthrough = self.passthrough_open(&ns, ino)?;
        Ok(reply)
    }

    /// Whether an open of `ino` may be served by the kernel from the cache file (FUSE passthrough), for
    /// reading and writing: a file whole in a cache file of its own (clean or dirty), not on a writable
    /// mount in a cluster (where every write takes the file's token through the daemon).
    pub(crate) fn passthrough_open(&self, ns: &Namespace, ino: u64) -> FsResult<bool> {
        if !self.cfg.passthrough || (self.coherence.get().is_some() && !self.read_only()) {
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

    /// Where to ask home about `ino` before its cached attributes are trusted again: `None` while they are
    /// fresh, or while the cache's version stands anyway (changes here not yet at home, or removed).
    pub(crate) fn revalidation_path(&self, ns: &Namespace, ino: u64) -> FsResult<Option<std::path::PathBuf>> {
        let node = ns.inode(ino)?;
        let stale = node.attr.is_none() || !self.fresh(node.checked);
        if stale && node.dirty.is_empty() && !node.removed && !self.queued(ino) {
            ns.home_path(ino)
        } else {
            Ok(None)
        }
    }

    /// Whether passthrough was asked for in the configuration.
    pub fn passthrough_wanted(&self) -> bool {
        self.cfg.passthrough
    }

    /// The object (content version) handle `fh` reads.
    pub fn handle_object(&self, fh: u64) -> Option<u64> {
        self.handles.with(fh, |h| h.object)
    }

    /// End the hold [`Fs::passthrough`] took for `fh` when the kernel did not take the file after all.
    pub fn unhold(&self, fh: u64) {
        if let Some((held, writer, ino, object)) = self.handles.with(fh, |h| {
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
    pub fn passthrough(&self, fh: u64, backed: bool) -> Option<Arc<std::fs::File>> {
        let (ino, object, writable) = self.handles.with(fh, |h| (h.ino, h.object, h.writable))?;
        // The kernel serves what it reads from the cache file as is: every block of it is checked against
        // its checksum first, and the file holds no bytes past the file's end (`integrity.rs`). (An inode
        // the kernel serves so already was checked at its first such open.)
        let checked = backed || self.verified_for_kernel(ino, object) && self.cache_file_fits(ino, object);
        if !checked {
            return None;
        }
        let ns = read(&self.ns);
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
                self.handles.with(fh, |h| h.held = true);
                drop(ns);
                if writable && !self.begin_direct_writer(fh, object, &file) {
                    self.handles.with(fh, |h| h.held = false);
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
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        uid: u32,
        gid: u32,
    ) -> FsResult<(Entry, OpenReply)> {
        match self.create_file(parent, name, mode, uid, gid) {
            Ok(entry) => {
                // A new file is written through the daemon (no passthrough): serving it from a cache file
                // of its own from the start would make every create create a file in the cache directory
                // too (an inode allocation there), which made creates of empty files 4 to 7 times slower.
                // Its next open, once it is whole in the cache, is served by the kernel.
                let reply = self.open_handle(&read(&self.ns), entry.attr.ino)?;
                let append = flags & libc::O_APPEND != 0;
                let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
                self.handles.with(reply.fh, |h| {
                    h.append = append;
                    h.writable = writable;
                });
                Ok((entry, reply))
            }
            Err(FsError::Home(HomeError::Exists)) if flags & libc::O_EXCL == 0 => {
                let mut entry = self.lookup(parent, name)?;
                if entry.attr.kind == FileKind::Dir {
                    return Err(FsError::IsDir);
                }
                if flags & libc::O_TRUNC != 0 {
                    entry = self.setattr(
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

    /// Read up to `size` bytes at `offset`.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        use std::sync::atomic::Ordering::Relaxed;
        let started = std::time::Instant::now();
        let result = self.read_range(fh, offset, size);
        if let Ok(data) = &result {
            self.read_counters.reads.fetch_add(1, Relaxed);
            self.read_counters.bytes.fetch_add(data.len() as u64, Relaxed);
            self.read_counters
                .nanos
                .fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        }
        result
    }

    fn read_range(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let bs = self.core.store.block_size();
        // A hit needs the handle and the file's size only: where home has the file, and the rest a fetch
        // needs, are taken when a block is missing (or readahead is due).
        // The handle's own state under its shard's lock, then the file's under the namespace shared: a hit
        // waits for no other reader.
        let (ino, opened, window, ra_end) = self
            .handles
            .with(fh, |h| {
                let window = match self.cfg.prefetch {
                    Prefetch::WholeFile => u64::MAX,
                    // A reader going on where it left off, or a little further: the pages between were read by
                    // the kernel from its page cache (another reader of the file brought them in), which must
                    // not cost this reader its window.
                    Prefetch::Sequential
                        if offset >= h.next_offset && offset - h.next_offset <= self.cfg.readahead_max =>
                    {
                        if h.window == 0 {
                            bs
                        } else {
                            (h.window * 2).min(self.cfg.readahead_max)
                        }
                    }
                    Prefetch::Sequential => 0,
                };
                h.window = window;
                h.next_offset = offset + size as u64;
                (h.ino, h.object, window, h.ra_end)
            })
            .ok_or(FsError::BadHandle)?;
        let (object, file_size) = {
            let ns = read(&self.ns);
            let node = ns.inode(ino)?;
            if node.object != opened {
                // Home has another version now: this handle's version is gone, and mixing is not allowed.
                return Err(FsError::Home(HomeError::Stale));
            }
            let attr = node.attr.as_ref().ok_or(FsError::BadHandle)?;
            (node.object, attr.size)
        };
        if offset >= file_size || size == 0 {
            return Ok(Vec::new());
        }
        // The version to fetch missing blocks of, once one is missing: none if home has no part of it.
        let mut fetching: Option<Option<FileVersion>> = None;
        let end = (offset + size as u64).min(file_size);
        let mut out = Vec::with_capacity((end - offset) as usize);
        let mut pos = offset;
        while pos < end {
            let index = (pos / bs) as u32;
            let within = pos % bs;
            let want = (bs - within).min(end - pos) as usize;
            let cached = match self.core.store.read((object, index), within, want) {
                Ok(c) => c,
                Err(e @ larder_cache::CacheError::Damaged { .. }) => {
                    // Bytes not yet at home, damaged in the cache: never served, never fetched over.
                    self.damaged_found(ino, &e);
                    return Err(e.into());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reading a cached block failed; fetching it again");
                    None
                }
            };
            let chunk = match cached {
                Some(d) => {
                    self.read_counters
                        .cache_bytes
                        .fetch_add(d.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    d
                }
                None => {
                    if fetching.is_none() {
                        fetching = Some(self.fetch_state(ino, object)?);
                    }
                    match fetching.as_ref().expect("just set") {
                        None => Vec::new(),
                        Some(f) if index as u64 * bs >= f.home_end => Vec::new(),
                        Some(f) => {
                            // Caught up with readahead that no stream has taken yet: the run it would have
                            // fetched comes in one request now. (Any failure is the block fetch's to answer.)
                            self.readahead.take_and_ingest(object, index);
                            let block = self.fetch_block(ino, f, index)?;
                            let from = (within as usize).min(block.len());
                            let to = (within as usize + want).min(block.len());
                            self.read_counters
                                .home_bytes
                                .fetch_add((to - from) as u64, std::sync::atomic::Ordering::Relaxed);
                            self.read_counters
                                .home_waits
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            block[from..to].to_vec()
                        }
                    }
                }
            };
            let got = chunk.len();
            out.extend_from_slice(&chunk);
            if got < want {
                // A hole at the end of the cached copy reads as zeros.
                out.resize(out.len() + want - got, 0);
            }
            pos += want as u64;
        }
        // Queue what the window adds past the blocks already queued for this handle (a reader that went
        // back before them is served by its own reads and the blocks still queued).
        let first = ra_end.max(end).div_ceil(bs);
        let last = end.saturating_add(window).min(file_size).div_ceil(bs);
        // Queued in steps of `MIN_JOB`, or half the window if that is less (and at least a block), or up to
        // the end: a window moving on by one read's worth each time would otherwise queue a job of a block
        // or two, each its own home request.
        let step = crate::readahead::MIN_JOB.min(window / 2).max(bs);
        let worth = last.saturating_sub(first) * bs >= step || last * bs >= file_size;
        if window > 0 && last > first && worth {
            let f = match fetching {
                Some(f) => f,
                None => self.fetch_state(ino, object)?,
            };
            if let Some(file) = f
                && last.min(file.home_end.div_ceil(bs)) > first
            {
                let last = last.min(file.home_end.div_ceil(bs));
                self.handles.with(fh, |h| h.ra_end = last * bs);
                self.readahead.submit(Job {
                    blocks: first as u32..last as u32,
                    file,
                });
            }
        }
        Ok(out)
    }

    /// The version of `ino` whose blocks a read of its `object` fetches, taken together (see
    /// [`FileVersion`]); none if home has none of it (a file not at home yet: a gap is a hole). `Stale` if
    /// the file's object is another now.
    fn fetch_state(&self, ino: u64, object: u64) -> FsResult<Option<FileVersion>> {
        let ns = read(&self.ns);
        let path = ns.home_path(ino)?;
        let node = ns.inode(ino)?;
        if node.object != object {
            return Err(FsError::Home(HomeError::Stale));
        }
        let attr = node.attr.as_ref().ok_or(FsError::BadHandle)?;
        Ok(path.map(|path| FileVersion {
            object,
            epoch: self.core.store.epoch(object),
            path,
            version: attr.version.clone(),
            home_end: node.home_end(),
        }))
    }

    /// Write `data` at `offset` into the cached copy; it reaches home on flush, fsync or close.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        if self.read_only() {
            return Err(FsError::ReadOnly);
        }
        if data.is_empty() {
            return Ok(0);
        }
        let ino = self.handles.ino(fh).ok_or(FsError::BadHandle)?;
        // In a cluster, the write token may have gone to another node since the open: take it back.
        self.take_token_of(ino)?;
        let bs = self.core.store.block_size();
        let write_lock = read(&self.ns).inode(ino)?.write_lock.clone();
        // One write of a file at a time: two writers completing the same partial block from home must not
        // undo each other, and a push must see each write whole.
        self.make_room(data.len() as u64)?;
        let _w = lock(&write_lock);
        // An append goes at the end as this node knows it: the kernel's cached size, which gave `offset`,
        // may predate a change made at home or on another node. The kernel then learns the size anew.
        let append = self.handles.with(fh, |h| h.append).unwrap_or(false);
        let offset = match read(&self.ns).inode(ino)?.attr.as_ref().map(|a| a.size) {
            Some(size) if append && size != offset => {
                self.invalidate(crate::Invalidation::Inode(ino));
                size
            }
            _ => offset,
        };
        let end = offset + data.len() as u64;
        // One critical section takes the file's state and records the range as dirty: from then on the
        // object cannot change under this write (a new version is never taken while writes are pending),
        // and a push finishing meanwhile will not mark these blocks clean.
        let (ino, object, size, file, before) = {
            let mut ns = write(&self.ns);
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
            let mut ns = write(&self.ns);
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
            let mut ns = write(&self.ns);
            let node = ns.inode_mut(ino)?;
            for (start, block) in &completions {
                add_range(&mut node.dirty, *start..*start + block.len() as u64);
            }
        }
        let landed = completions
            .iter()
            .try_for_each(|(start, block)| self.core.store.write(object, *start, block))
            .and_then(|()| self.core.store.write(object, offset, data));
        if let Err(e) = landed {
            self.write_cut_short(ino, object, before, offset..end)?;
            return Err(e.into());
        }
        Ok(data.len() as u32)
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
            let mut ns = write(&self.ns);
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

    /// Fetch block `index` of `ino`'s current object. Our own push changes the version at home under a
    /// fetch already in flight (any `close` of any descriptor pushes); the blocks it fetches are not the
    /// ones pushed (those are cached, dirty), so once that push has been adopted the fetch is retried at
    /// the new version. A version that moved behind our back is `ESTALE`; nothing at the file's path, unless
    /// a rename landing meanwhile moved it (the fetch is then asked again at its new place), `ENOENT`.
    /// `file.epoch` is the object's change epoch taken with the file's state that said to fetch: a local
    /// change since keeps the block out of the cache.
    pub(crate) fn fetch_block(&self, ino: u64, file: &FileVersion, index: u32) -> FsResult<Arc<Vec<u8>>> {
        let mut file = file.clone();
        let object = file.object;
        // Where a rename waiting for a retry would have put the file, once asked there.
        let mut asked_moved: Option<PathBuf> = None;
        for _ in 0..4 {
            match self.core.fetch(&file, index) {
                // Not there either (or another version there): the rename did not land, or this is not
                // the copy the cache knows.
                Err(e) if asked_moved.as_ref() == Some(&file.path) => return Err(FsError::Home(e)),
                Err(e @ (HomeError::Stale | HomeError::NotFound)) => {
                    // Wait for a push of this file under way to be adopted, or a rename of it (or above it)
                    // landing to conclude (on an object store a renamed file is a copy, a new version), then
                    // see whether it explains the change. (Polling, not the flush lock: a writer calls this
                    // holding its write lock, which a push takes after the flush lock.) Nothing at the path
                    // is the same question: home may have moved the file already, and the cache not heard.
                    let gone = matches!(e, HomeError::NotFound);
                    let deadline = std::time::Instant::now() + PUSH_WAIT;
                    loop {
                        let mut ns = write(&self.ns);
                        let moving =
                            ns.moving(std::os::unix::ffi::OsStrExt::as_bytes(file.path.as_os_str())) == Some(true);
                        let node = ns.inode(ino)?;
                        if (node.pushing > 0 || moving) && std::time::Instant::now() < deadline {
                            drop(ns);
                            std::thread::sleep(std::time::Duration::from_millis(2));
                            continue;
                        }
                        let now_at = ns.home_path(ino)?;
                        let node = ns.inode(ino)?;
                        // A rename of it (or above it) tried and waiting for a retry may have landed: a
                        // stop cut its push short, or its answer was lost. Home has the file there then.
                        if gone
                            && asked_moved.is_none()
                            && node.object == object
                            && now_at.as_ref() == Some(&file.path)
                            && let Some(moved) =
                                ns.moved_path(std::os::unix::ffi::OsStrExt::as_bytes(file.path.as_os_str()))
                        {
                            file.path = PathBuf::from(std::ffi::OsString::from_vec(moved));
                            asked_moved = Some(file.path.clone());
                            break;
                        }
                        match node.attr.as_ref().map(|a| a.version.clone()) {
                            // Not moved: nothing there is home's answer.
                            _ if gone && (node.object != object || now_at.as_ref().is_none_or(|p| *p == file.path)) => {
                                ns.inode_mut(ino)?.checked = None;
                                return Err(FsError::Home(HomeError::NotFound));
                            }
                            Some(v) if node.object == object && v != file.version => {
                                (file.version, file.home_end) = (v, node.home_end());
                                file.path = now_at.ok_or(FsError::Home(HomeError::Stale))?;
                            }
                            // Moved at home meanwhile (a rename landed), the same version: asked there.
                            _ if node.object == object && now_at.as_ref().is_some_and(|p| *p != file.path) => {
                                file.path = now_at.unwrap_or_default();
                            }
                            _ if node.object == object && node.unconfirmed.is_some() && node.pushing == 0 => {
                                // A push whose answer was lost may have moved home on: if home holds what
                                // it sent, the new version is ours and the base of what is pending.
                                drop(ns);
                                let Some(attr) = self.home_has_ours(ino, &file.path) else {
                                    return Err(FsError::Home(HomeError::Stale));
                                };
                                let mut ns = write(&self.ns);
                                let node = ns.inode_mut(ino)?;
                                if node.object != object || node.pushing > 0 {
                                    return Err(FsError::Home(HomeError::Stale));
                                }
                                node.unconfirmed = None;
                                if let Some(a) = node.attr.as_mut() {
                                    a.version = attr.version.clone();
                                    a.id = attr.id;
                                }
                                self.persist(&ns, ino);
                                file.version = attr.version;
                            }
                            _ => {
                                ns.inode_mut(ino)?.checked = None;
                                return Err(FsError::Home(HomeError::Stale));
                            }
                        }
                        break;
                    }
                }
                Ok(block) => {
                    // A fetch joined under way may have been asked for more: home's bytes past `home_end`
                    // are not this file's any more.
                    let usable = file
                        .home_end
                        .saturating_sub(index as u64 * self.core.store.block_size());
                    if block.len() as u64 > usable {
                        return Ok(Arc::new(block[..usable as usize].to_vec()));
                    }
                    return Ok(block);
                }
                Err(e) => return Err(FsError::Home(e)),
            }
        }
        Err(FsError::Home(HomeError::Stale))
    }

    /// Make pending writes of the file behind `fh` safe (close and fsync): pushed to home (write-through)
    /// or durable in the cache and queued (write-back).
    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.commit_handle(fh, false)
    }

    /// Make the file behind `fh` durable against power loss: its data and every change made so far
    /// (write-back: in the cache; write-through: at home).
    pub fn fsync(&self, fh: u64) -> FsResult<()> {
        self.commit_handle(fh, true)?;
        self.sync_changes()
    }

    /// What was written through `fh` (by the daemon, or by the kernel in the cache file) committed as
    /// [`Fs::commit_data`] does.
    fn commit_handle(&self, fh: u64, durable: bool) -> FsResult<()> {
        let ino = self.handles.ino(fh).ok_or(FsError::BadHandle)?;
        self.adopt_direct_writes(fh)?;
        self.commit_data(ino, durable)
    }

    /// Make every change made so far durable against power loss (`fsync` of a directory, `syncfs`).
    pub fn sync_changes(&self) -> FsResult<()> {
        if self.read_only() {
            return Ok(());
        }
        self.core.store.db().sync().map_err(FsError::from)
    }

    /// Close a handle: push what is pending, and drop an unlinked file's data once nothing uses it.
    pub fn release(&self, fh: u64) -> FsResult<()> {
        // What the kernel wrote through this handle (mmap'ed pages written after the last close, too).
        let adopted = self.adopt_direct_writes(fh);
        let Some(h) = self.handles.remove(fh) else {
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
            self.commit_data(h.ino, false)
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
            let ns = read(&self.ns);
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
        let mut ns = write(&self.ns);
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
mod fetch;
mod integrity;
mod passthrough;
mod push;
mod readers;
mod residency;

pub(crate) use integrity::Integrity;
pub use integrity::{DamagedFile, VERIFY_AT_OPEN};
pub use residency::{PIN_SHARE, Residency, describe as describe_residency_error};

pub(crate) use fetch::Core;

pub(crate) use passthrough::Stamp;

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
