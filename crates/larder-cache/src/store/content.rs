//! The content store: one copy of identical clean small files, shared until one of them changes.

use super::*;

impl Store {
    pub(super) fn content_path(&self, key: ContentKey) -> PathBuf {
        self.cfg.dir.join("cas").join(format!("{:x}-{:08x}", key.0, key.1))
    }

    /// One file fewer shares `key`; the last one out deletes the content.
    /// Taken under the sharer's shard lock; `contents` is a leaf under it.
    pub(super) fn release_content(&self, key: ContentKey) {
        let mut guard = lock(&self.contents);
        let contents = &mut *guard;
        let Some(refs) = contents.refs.get_mut(&key) else {
            return;
        };
        *refs -= 1;
        contents.shares -= 1;
        if *refs == 0 {
            contents.refs.remove(&key);
            self.used.fetch_sub(key.0 as u64, Ordering::Relaxed);
            let _ = std::fs::remove_file(self.content_path(key));
        }
    }

    /// Give `object` a file of its own if it shares a content, before it is changed.
    /// The content cannot go meanwhile: `object` holds a share of it until the end.
    pub(super) fn unshare_locked(&self, st: &mut ShardState, object: u64) -> CacheResult<()> {
        let meta = st.meta(object);
        let Some(key) = meta.content else { return Ok(()) };
        let mut data = vec![0u8; key.0 as usize];
        let shared = self.file_locked(st, object)?;
        read_full(&shared, &mut data, 0).map_err(io_err)?;
        let path = self.path_of(object);
        larder_util::private::create_dir_all(path.parent().unwrap_or(&self.cfg.dir)).map_err(io_err)?;
        let own = larder_util::private::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_err)?;
        own.write_all_at(&data, 0).map_err(io_err)?;
        self.fds_of(object).files.remove(&object);
        let logical: u64 = st.blocks_of(object).map(|(_, e)| e.len as u64).sum();
        self.used.fetch_add(logical, Ordering::Relaxed);
        let meta = ObjectMeta { content: None, ..meta };
        st.set_meta(object, meta);
        self.release_content(key);
        self.db.submit(vec![meta.mutation(object)]);
        Ok(())
    }

    /// Store a clean small file fetched whole from home at change epoch `epoch`: every block of it, kept
    /// and evicted as one unit. With dedup on, a file whose bytes the content store holds already shares
    /// them, and a new content is stored there for the next one. Nothing is stored if the object changed
    /// locally since the fetch began or has blocks already (those fill one by one).
    ///
    /// The data is written under the object's shard lock. An object with a block reserved by a fill (being written outside
    /// the lock, [`Store::fill`]), or being changed, is filled block by block instead: it is never shared
    /// (nor its file written here) under a fill's feet.
    pub fn fill_whole(&self, object: u64, data: &[u8], epoch: u64) -> CacheResult<()> {
        let bs = self.cfg.block_size;
        if !self.room_on_disk(data.len() as u64) {
            // The cache disk is full of what cannot be evicted: the file is not kept (the reader has it).
            return Ok(());
        }
        let mut st = self.state(object);
        if st.epoch(object) != epoch
            || st.has_blocks(object)
            || st.filling_any(object, &(0..=u32::MAX))
            || st.changing.contains_key(&object)
            || data.is_empty()
        {
            drop(st);
            for (index, block) in data.chunks(bs as usize).enumerate() {
                self.fill((object, index as u32), block, epoch)?;
            }
            return Ok(());
        }
        let mut meta = st.meta(object);
        meta.whole = data.len() as u64 > bs;
        if self.cfg.dedup
            && let Ok(len) = u32::try_from(data.len())
        {
            let key = (len, crc32c::crc32c(data));
            match self.share(key, data) {
                Ok(true) => {
                    meta.whole = true;
                    meta.content = Some(key);
                }
                Ok(false) => {}
                Err(e) => tracing::debug!(error = %e, "could not store a file in the content store"),
            }
        }
        st.objects.insert(object, meta);
        self.fds_of(object).files.remove(&object);
        if meta.content.is_none() {
            let file = self.file_locked(&st, object)?;
            file.write_all_at(data, 0).map_err(io_err)?;
        }
        let mut mutations = vec![meta.mutation(object)];
        for (index, block) in data.chunks(bs as usize).enumerate() {
            let (index, len, crc) = (index as u32, block.len() as u32, crc32c::crc32c(block));
            self.insert_locked(&mut st, (object, index), len, crc, false);
            mutations.push(Mutation::PutBlock {
                object,
                index,
                len,
                crc,
            });
        }
        st.compact_meta(object);
        self.inserted.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.db.submit(mutations);
        drop(st);
        self.evict_if_needed();
        Ok(())
    }

    /// Take a share of content `key` holding `data`, storing it if it is new; `false` if another content
    /// has the same key (the caller keeps its own copy). Taken under the sharer's shard lock; the content's
    /// file is compared or created under `contents`, so that two sharers of one key in different shards
    /// neither both create it nor see it half written, and no last sharer deletes it meanwhile.
    pub(super) fn share(&self, key: ContentKey, data: &[u8]) -> CacheResult<bool> {
        let path = self.content_path(key);
        let mut contents = lock(&self.contents);
        if contents.refs.contains_key(&key) {
            let mut have = vec![0u8; data.len()];
            let same = File::open(&path)
                .and_then(|f| read_full(&f, &mut have, 0))
                .is_ok_and(|()| have == data);
            if !same {
                return Ok(false);
            }
        } else {
            larder_util::private::create_dir_all(path.parent().unwrap_or(&self.cfg.dir)).map_err(io_err)?;
            let tmp = path.with_extension("new");
            larder_util::private::write(&tmp, data).map_err(io_err)?;
            std::fs::rename(&tmp, &path).map_err(io_err)?;
            self.used.fetch_add(key.0 as u64, Ordering::Relaxed);
        }
        *contents.refs.entry(key).or_insert(0) += 1;
        contents.shares += 1;
        Ok(true)
    }
}
