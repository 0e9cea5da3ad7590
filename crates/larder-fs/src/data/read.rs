//! Reads: a hit from the store, a miss through the tiers (the version of the file taken from the
//! namespace once a block is missing), readahead queued past the reader, and the fetch of one block
//! that follows a version moved by this node's own push or rename.

use super::*;

/// Times a read in a cluster whose version is gone asks for the newest one.
const CLUSTER_RETRIES: u32 = 5;

impl DataPath {
    /// Read up to `size` bytes at `offset`.
    pub(crate) fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        use std::sync::atomic::Ordering::Relaxed;
        let started = std::time::Instant::now();
        let mut result = self.read_range(fh, offset, size);
        // In a cluster the version read is gone from where it was (its holder pushed it and forgot it, or
        // published a newer one): the newest is taken in and read instead, as a lock would. The holder's
        // word of the version it pushed may still be on its way: asked again a few times, a little later
        // each time (about a second in all).
        for attempt in 0..CLUSTER_RETRIES {
            if !matches!(result, Err(FsError::Home(HomeError::Stale))) || self.names.coherence().is_none() {
                break;
            }
            let Some(ino) = self.names.handles().ino(fh) else { break };
            if attempt > 0 {
                std::thread::sleep(std::time::Duration::from_millis(100 * attempt as u64));
            }
            self.names.sync_cluster();
            if let Ok(node) = self.names.write().inode_mut(ino) {
                node.checked = None;
            }
            if self.names.getattr(ino).is_err() {
                break;
            }
            self.names.follow_newest(ino);
            result = self.read_range(fh, offset, size);
        }
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
            .names
            .handles()
            .with(fh, |h| {
                let window = crate::readahead::window(
                    self.cfg.prefetch,
                    self.cfg.readahead_max,
                    bs,
                    (h.window, h.next_offset),
                    offset,
                );
                h.window = window;
                // Where the reader got: a read arriving behind it (the kernel's reads out of order) does
                // not move it back.
                h.next_offset = if window > 0 {
                    h.next_offset.max(offset + size as u64)
                } else {
                    offset + size as u64
                };
                (h.ino, h.object, window, h.ra_end)
            })
            .ok_or(FsError::BadHandle)?;
        let (object, file_size) = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            if node.object != opened {
                if self.names.coherence().is_none() {
                    // Home has another version now: this handle's version is gone, and mixing is not
                    // allowed.
                    return Err(FsError::Home(HomeError::Stale));
                }
                // In a cluster, an open file reads the newest version the nodes made, as NFS's clients do
                // (design note 017): another node's change is taken in under the token or a lock.
                self.names.handles().with(fh, |h| h.object = node.object);
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
        if let Some((first, last)) = crate::readahead::due(window, ra_end, end, file_size, bs) {
            let f = match fetching {
                Some(f) => f,
                None => self.fetch_state(ino, object)?,
            };
            if let Some(file) = f
                && last.min(file.home_end.div_ceil(bs)) > first
            {
                let last = last.min(file.home_end.div_ceil(bs));
                self.names.handles().with(fh, |h| h.ra_end = last * bs);
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
        let ns = self.names.read();
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
                        let mut ns = self.names.write();
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
                                let mut ns = self.names.write();
                                let node = ns.inode_mut(ino)?;
                                if node.object != object || node.pushing > 0 {
                                    return Err(FsError::Home(HomeError::Stale));
                                }
                                node.unconfirmed = None;
                                if let Some(a) = node.attr.as_mut() {
                                    a.version = attr.version.clone();
                                    a.id = attr.id;
                                }
                                self.names.persist(&ns, ino);
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
}
