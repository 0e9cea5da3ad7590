//! The block store: sparse object files plus an in-memory view of the persistent block index.
//!
//! Lock order: `state` before `fds`. Syscalls that punch or read block data for eviction and checksum
//! verification run under `state` so that a block can never be refilled while it is being dropped.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::S3Fifo;
use crate::db::{Db, Mutation};

/// (object id, block index)
pub type BlockKey = (u64, u32);

/// Result of a store call.
pub type CacheResult<T> = Result<T, CacheError>;

/// What went wrong in the local store.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache disk is full.
    #[error("cache disk is full")]
    NoSpace,
    /// Reading or writing a cache file failed.
    #[error("cache I/O error: {0}")]
    Io(#[from] io::Error),
    /// The persistent index failed.
    #[error("cache index error: {0}")]
    Index(String),
}

fn io_err(e: io::Error) -> CacheError {
    if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT) {
        CacheError::NoSpace
    } else {
        CacheError::Io(e)
    }
}

/// Where and how much to cache.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Directory of the object files.
    pub dir: PathBuf,
    /// Bytes per block.
    pub block_size: u64,
    /// Most bytes of cached data to keep; eviction starts at `high_watermark` of it and stops at
    /// `low_watermark`.
    pub limit: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
}

/// Figures for status output.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreStats {
    pub bytes_used: u64,
    pub bytes_limit: u64,
    pub bytes_dirty: u64,
    pub blocks: u64,
    pub objects: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub corrupt_blocks: u64,
    /// Bytes put into the cache (blocks fetched from home, and written here).
    pub inserted_bytes: u64,
}

struct BlockEntry {
    len: u32,
    crc: u32,
    /// Set when the entry is inserted, never changed: a read that finds the same generation after its
    /// unlocked `pread` read bytes that were not evicted or replaced meanwhile.
    generation: u64,
    verified: bool,
    dirty: bool,
}

struct State {
    /// Ordered by key, so the blocks of one object are one range.
    blocks: BTreeMap<BlockKey, BlockEntry>,
    /// The eviction policy over the clean blocks (dirty ones are not candidates).
    policy: S3Fifo<BlockKey>,
    per_object: HashMap<u64, u32>,
    /// Bumped by every local change of an object (write, truncate, removal): a fill fetched before the
    /// change must not land after it.
    epochs: HashMap<u64, u64>,
    used: u64,
    dirty: u64,
    tick: u64,
}

const MAX_OPEN_FILES: usize = 256;

#[derive(Default)]
struct FdCache {
    files: HashMap<u64, (Arc<File>, u64)>,
    tick: u64,
}

/// The local block store.
pub struct Store {
    cfg: StoreConfig,
    db: Arc<Db>,
    state: Mutex<State>,
    fds: Mutex<FdCache>,
    /// Set (and the harvester woken) when usage passed the high watermark.
    harvest: Mutex<bool>,
    harvest_cv: Condvar,
    harvesting: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    corrupt: AtomicU64,
    inserted: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Store {
    /// Open the store in `cfg.dir`, loading the block index from `db`.
    pub fn open(cfg: StoreConfig, db: Arc<Db>) -> CacheResult<Store> {
        std::fs::create_dir_all(&cfg.dir).map_err(io_err)?;
        let mut state = State {
            blocks: BTreeMap::new(),
            policy: S3Fifo::new((cfg.limit as f64 * cfg.low_watermark) as u64),
            per_object: HashMap::new(),
            epochs: HashMap::new(),
            used: 0,
            dirty: 0,
            tick: 0,
        };
        db.for_each_block(|object, index, len, crc| {
            state.tick += 1;
            let tick = state.tick;
            state.blocks.insert(
                (object, index),
                BlockEntry {
                    len,
                    crc,
                    generation: tick,
                    verified: false,
                    dirty: false,
                },
            );
            state.policy.insert((object, index), len as u64);
            *state.per_object.entry(object).or_default() += 1;
            state.used += len as u64;
        })?;
        Ok(Store {
            cfg,
            db,
            state: Mutex::new(state),
            fds: Mutex::new(FdCache::default()),
            harvest: Mutex::new(false),
            harvest_cv: Condvar::new(),
            harvesting: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            inserted: AtomicU64::new(0),
        })
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u64 {
        self.cfg.block_size
    }

    /// The index this store persists to.
    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }

    fn path_of(&self, object: u64) -> PathBuf {
        self.cfg
            .dir
            .join(format!("{:02x}", object & 0xff))
            .join(format!("{object:016x}"))
    }

    /// The cache file of `object`, opened (and created) on demand. At most `MAX_OPEN_FILES` stay open.
    pub fn file(&self, object: u64) -> CacheResult<Arc<File>> {
        let mut fds = lock(&self.fds);
        fds.tick += 1;
        let tick = fds.tick;
        if let Some((f, t)) = fds.files.get_mut(&object) {
            *t = tick;
            return Ok(f.clone());
        }
        let path = self.path_of(object);
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(p)
        };
        let file = match open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path.parent().unwrap_or(&self.cfg.dir)).map_err(io_err)?;
                open(&path).map_err(io_err)?
            }
            Err(e) => return Err(io_err(e)),
        };
        if fds.files.len() >= MAX_OPEN_FILES
            && let Some(oldest) = fds.files.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k)
        {
            fds.files.remove(&oldest);
        }
        let file = Arc::new(file);
        fds.files.insert(object, (file.clone(), tick));
        Ok(file)
    }

    /// Whether block `key` is present.
    pub fn contains(&self, key: BlockKey) -> bool {
        lock(&self.state).blocks.contains_key(&key)
    }

    /// Read up to `len` bytes at `offset` within block `key` if it is present (a hit); `None` is a miss. The
    /// result stops at the block's end and may be shorter where the cache file ends in a hole. A block
    /// whose checksum fails is dropped and reported as a miss.
    pub fn read(&self, key: BlockKey, offset: u64, len: usize) -> CacheResult<Option<Vec<u8>>> {
        let file = self.file(key.0)?;
        let start = key.1 as u64 * self.cfg.block_size;
        let len = len.min(self.cfg.block_size.saturating_sub(offset) as usize);
        // The bytes are read without the lock; if the block was evicted (or evicted and filled again)
        // meanwhile, they may be a punched hole: read again, or call it a miss.
        for _ in 0..8 {
            let generation = {
                let mut st = lock(&self.state);
                let Some(entry) = st.blocks.get(&key) else {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                };
                if !entry.verified && !entry.dirty {
                    let (blen, crc) = (entry.len as usize, entry.crc);
                    let mut whole = vec![0u8; blen];
                    let ok = read_full(&file, &mut whole, start).is_ok() && crc32c::crc32c(&whole) == crc;
                    if !ok {
                        tracing::warn!(
                            object = key.0,
                            block = key.1,
                            "cached block failed its checksum; refetching"
                        );
                        self.corrupt.fetch_add(1, Ordering::Relaxed);
                        self.remove_locked(&mut st, key);
                        self.misses.fetch_add(1, Ordering::Relaxed);
                        return Ok(None);
                    }
                    if let Some(e) = st.blocks.get_mut(&key) {
                        e.verified = true;
                    }
                }
                let Some(generation) = st.blocks.get(&key).map(|e| e.generation) else {
                    return Ok(None);
                };
                st.policy.touch(&key);
                generation
            };
            let mut buf = vec![0u8; len];
            let n = read_upto(&file, &mut buf, start + offset).map_err(io_err)?;
            buf.truncate(n);
            if lock(&self.state).blocks.get(&key).map(|e| e.generation) == Some(generation) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(buf));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// Mark block `key` dirty if it is present, so that eviction can no longer take it; the caller is about
    /// to write part of it. `false`: not present (the caller must bring the block in first).
    pub fn claim(&self, key: BlockKey) -> bool {
        let mut st = lock(&self.state);
        let Some(e) = st.blocks.get(&key) else { return false };
        if !e.dirty {
            let (len, crc) = (e.len, e.crc);
            Self::bump_epoch(&mut st, key.0);
            self.insert_locked(&mut st, key, len, crc, true);
        }
        true
    }

    /// The change epoch of `object`; take it before fetching a block to `fill`.
    pub fn epoch(&self, object: u64) -> u64 {
        lock(&self.state).epochs.get(&object).copied().unwrap_or(0)
    }

    fn bump_epoch(st: &mut State, object: u64) {
        let e = st.epochs.entry(object).or_insert(0);
        *e = e.wrapping_add(1);
    }

    /// Store a clean block fetched from home at change epoch `epoch` of its object. Nothing is stored if
    /// the object changed locally since (a write, truncate or removal: their data wins) or the block is
    /// present already. A full cache disk is not an error here: the data still goes to the reader, the
    /// block is simply not kept.
    pub fn fill(&self, key: BlockKey, data: &[u8], epoch: u64) -> CacheResult<()> {
        let start = key.1 as u64 * self.cfg.block_size;
        let crc = crc32c::crc32c(data);
        let mut st = lock(&self.state);
        if st.epochs.get(&key.0).copied().unwrap_or(0) != epoch || st.blocks.contains_key(&key) {
            return Ok(());
        }
        let file = self.file(key.0)?;
        // Written under the lock, so no local change of the object can interleave with it.
        file.write_all_at(data, start).map_err(io_err)?;
        self.insert_locked(&mut st, key, data.len() as u32, crc, false);
        self.inserted.fetch_add(data.len() as u64, Ordering::Relaxed);
        self.db.submit(vec![Mutation::PutBlock {
            object: key.0,
            index: key.1,
            len: data.len() as u32,
            crc,
        }]);
        self.evict_if_needed(&mut st);
        Ok(())
    }

    /// Write new (dirty) data into `object` at `offset`. Blocks touched become present and dirty; the caller
    /// guarantees that a partially written block was present or lies wholly beyond home's data.
    pub fn write(&self, object: u64, offset: u64, data: &[u8]) -> CacheResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        let file = self.file(object)?;
        let bs = self.cfg.block_size;
        let end = offset + data.len() as u64;
        // Mark the blocks dirty first: from then on eviction cannot punch them under the new bytes.
        let mut added = Vec::new();
        {
            let mut st = lock(&self.state);
            Self::bump_epoch(&mut st, object);
            for index in (offset / bs)..=((end - 1) / bs) {
                let key = (object, index as u32);
                let block_end = (end - index * bs).min(bs) as u32;
                let existing = st.blocks.get(&key).map(|e| e.len);
                if existing.is_none() {
                    added.push(key);
                }
                self.insert_locked(&mut st, key, existing.unwrap_or(0).max(block_end), 0, true);
            }
            self.evict_if_needed(&mut st);
        }
        if let Err(e) = file.write_all_at(data, offset) {
            let mut st = lock(&self.state);
            for key in added {
                self.remove_locked(&mut st, key);
            }
            return Err(io_err(e));
        }
        self.inserted.fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Mark blocks of `object` clean again after their data reached home; `size` is the size home has. A
    /// block that cannot be read back to be indexed is dropped instead: home has its data.
    pub fn mark_clean(&self, object: u64, indexes: impl IntoIterator<Item = u32>, size: u64) {
        if let Err(e) = self.index_blocks(object, indexes, size, false) {
            tracing::warn!(object, error = %e, "could not index blocks pushed to home; dropping them from the cache");
        }
    }

    /// Record dirty blocks of `object` in the persistent index (with their checksums) so that they are
    /// found again after a restart; they stay dirty. Durable once the index is synced and the object file
    /// is.
    pub fn commit(&self, object: u64, indexes: impl IntoIterator<Item = u32>, size: u64) -> CacheResult<()> {
        self.index_blocks(object, indexes, size, true)
    }

    fn index_blocks(
        &self,
        object: u64,
        indexes: impl IntoIterator<Item = u32>,
        size: u64,
        dirty: bool,
    ) -> CacheResult<()> {
        let file = self.file(object);
        let bs = self.cfg.block_size;
        let mut mutations = Vec::new();
        let mut failed = None;
        let mut st = lock(&self.state);
        for index in indexes {
            let key = (object, index);
            if !st.blocks.contains_key(&key) {
                continue;
            }
            let start = index as u64 * bs;
            let len = size.saturating_sub(start).min(bs) as usize;
            if len == 0 {
                self.remove_locked(&mut st, key);
                continue;
            }
            // Past the cache file's end the content is a hole: zeros.
            let mut buf = vec![0u8; len];
            let read = match &file {
                Ok(f) => read_upto(f, &mut buf, start).map_err(io_err),
                Err(e) => Err(CacheError::Index(e.to_string())),
            };
            if let Err(e) = read {
                if !dirty {
                    self.remove_locked(&mut st, key);
                    mutations.push(Mutation::DelBlock { object, index });
                }
                failed.get_or_insert(e);
                continue;
            }
            let crc = crc32c::crc32c(&buf);
            self.insert_locked(&mut st, key, len as u32, crc, dirty);
            mutations.push(Mutation::PutBlock {
                object,
                index,
                len: len as u32,
                crc,
            });
        }
        drop(st);
        self.db.submit(mutations);
        failed.map_or(Ok(()), Err)
    }

    /// Cut `object` to `size` bytes: later blocks are dropped, a partial last block keeps its prefix.
    pub fn truncate(&self, object: u64, size: u64) -> CacheResult<()> {
        let file = self.file(object)?;
        // Fills fetched before this point must not write old bytes past the new end.
        Self::bump_epoch(&mut lock(&self.state), object);
        file.set_len(size).map_err(io_err)?;
        let bs = self.cfg.block_size;
        let mut st = lock(&self.state);
        let first_gone = size.div_ceil(bs).min(u32::MAX as u64 + 1);
        let doomed: Vec<BlockKey> = if first_gone > u32::MAX as u64 {
            Vec::new()
        } else {
            st.blocks
                .range((object, first_gone as u32)..=(object, u32::MAX))
                .map(|(k, _)| *k)
                .collect()
        };
        for key in doomed {
            self.remove_locked(&mut st, key);
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
            }
        }
        Ok(())
    }

    /// Forget every block of `object` and delete its file.
    pub fn remove_object(&self, object: u64) {
        {
            let mut st = lock(&self.state);
            // Kept as a tombstone, so that a fill fetched before the removal does not bring the file back.
            Self::bump_epoch(&mut st, object);
            if st.per_object.contains_key(&object) {
                let keys: Vec<BlockKey> = st
                    .blocks
                    .range((object, 0)..=(object, u32::MAX))
                    .map(|(k, _)| *k)
                    .collect();
                for key in keys {
                    self.remove_locked(&mut st, key);
                }
            }
        }
        lock(&self.fds).files.remove(&object);
        self.db.submit(vec![Mutation::DelObject(object)]);
        let _ = std::fs::remove_file(self.path_of(object));
    }

    /// Drop every object not in `live` (left behind by a crash or an old version), files included.
    pub fn retain_objects(&self, live: &HashSet<u64>) {
        let stale: Vec<u64> = lock(&self.state)
            .per_object
            .keys()
            .filter(|o| !live.contains(o))
            .copied()
            .collect();
        for object in stale {
            self.remove_object(object);
        }
        let Ok(dirs) = std::fs::read_dir(&self.cfg.dir) else {
            return;
        };
        for dir in dirs.flatten() {
            let Ok(files) = std::fs::read_dir(dir.path()) else {
                continue;
            };
            for f in files.flatten() {
                let keep = f
                    .file_name()
                    .to_str()
                    .and_then(|n| u64::from_str_radix(n, 16).ok())
                    .is_some_and(|o| live.contains(&o));
                if !keep {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
    }

    /// Current figures.
    pub fn stats(&self) -> StoreStats {
        let st = lock(&self.state);
        StoreStats {
            bytes_used: st.used,
            bytes_limit: self.cfg.limit,
            bytes_dirty: st.dirty,
            blocks: st.blocks.len() as u64,
            objects: st.per_object.len() as u64,
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            corrupt_blocks: self.corrupt.load(Ordering::Relaxed),
            inserted_bytes: self.inserted.load(Ordering::Relaxed),
        }
    }

    fn insert_locked(&self, st: &mut State, key: BlockKey, len: u32, crc: u32, dirty: bool) {
        st.tick += 1;
        let tick = st.tick;
        // Rewriting a present block in place keeps its generation; a new entry gets a new one.
        let generation = st.blocks.get(&key).map_or(tick, |e| e.generation);
        if let Some(old) = st.blocks.insert(
            key,
            BlockEntry {
                len,
                crc,
                generation,
                verified: true,
                dirty,
            },
        ) {
            st.used -= old.len as u64;
            if old.dirty {
                st.dirty -= old.len as u64;
            }
        } else {
            *st.per_object.entry(key.0).or_default() += 1;
        }
        st.used += len as u64;
        if dirty {
            st.dirty += len as u64;
            st.policy.remove(&key);
        } else {
            st.policy.insert(key, len as u64);
        }
    }

    fn remove_locked(&self, st: &mut State, key: BlockKey) {
        let Some(old) = st.blocks.remove(&key) else { return };
        st.policy.remove(&key);
        st.used -= old.len as u64;
        if old.dirty {
            st.dirty -= old.len as u64;
        }
        if let Some(n) = st.per_object.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                st.per_object.remove(&key.0);
            }
        }
        if let Ok(file) = self.file(key.0) {
            punch_hole(&file, key.1 as u64 * self.cfg.block_size, old.len as u64);
        }
    }

    fn watermarks(&self) -> (u64, u64) {
        let at = |w: f64| (self.cfg.limit as f64 * w) as u64;
        (at(self.cfg.high_watermark), at(self.cfg.low_watermark))
    }

    /// Called after usage grew. Past the high watermark the harvester is woken to evict down to the low
    /// one, and the caller goes on; only past the limit itself (the harvester has fallen behind) does the
    /// caller evict, down to the high watermark. Without a harvester the caller evicts to the low one.
    fn evict_if_needed(&self, st: &mut State) {
        let (high, low) = self.watermarks();
        if st.used <= high {
            return;
        }
        if self.harvesting.load(Ordering::Relaxed) {
            *lock(&self.harvest) = true;
            self.harvest_cv.notify_one();
            if st.used > self.cfg.limit {
                self.evict_to(st, high, usize::MAX);
            }
            return;
        }
        self.evict_to(st, low, usize::MAX);
    }

    /// Evict clean blocks in the policy's order until usage is at most `target` or `most` are gone;
    /// whether usage reached the target.
    fn evict_to(&self, st: &mut State, target: u64, most: usize) -> bool {
        let mut mutations = Vec::new();
        while st.used > target && mutations.len() < most {
            let Some((key, _)) = st.policy.evict() else { break };
            self.remove_locked(st, key);
            self.evictions.fetch_add(1, Ordering::Relaxed);
            mutations.push(Mutation::DelBlock {
                object: key.0,
                index: key.1,
            });
        }
        self.db.submit(mutations);
        st.used <= target || st.policy.stats().units == 0
    }

    /// Start the harvester: a thread that evicts down to the low watermark once usage passes the high one,
    /// so that a fill does not wait for eviction. It stops when the store is dropped.
    pub fn start_harvester(self: &Arc<Store>) -> io::Result<()> {
        let weak = Arc::downgrade(self);
        self.harvesting.store(true, Ordering::Relaxed);
        std::thread::Builder::new()
            .name("larder-harvest".into())
            .spawn(move || {
                loop {
                    let Some(store) = weak.upgrade() else { return };
                    {
                        let flag = lock(&store.harvest);
                        let (mut flag, _) = store
                            .harvest_cv
                            .wait_timeout_while(flag, std::time::Duration::from_millis(200), |f| !*f)
                            .unwrap_or_else(|p| p.into_inner());
                        *flag = false;
                    }
                    let (high, low) = store.watermarks();
                    if lock(&store.state).used <= high {
                        continue;
                    }
                    // In batches, so that readers and fills get the lock in between.
                    while !store.evict_to(&mut lock(&store.state), low, 64) {}
                }
            })?;
        Ok(())
    }
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

fn read_upto(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

fn punch_hole(file: &File, offset: u64, len: u64) {
    if len == 0 {
        return;
    }
    // SAFETY: fallocate on a valid open descriptor with plain integer arguments.
    let ret = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if ret != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "punching a hole in a cache file failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path, limit: u64) -> Store {
        let db = Db::open(&dir.join("index.redb")).unwrap();
        let cfg = StoreConfig {
            dir: dir.join("objects"),
            block_size: 4096,
            limit,
            high_watermark: 1.0,
            low_watermark: 0.75,
        };
        Store::open(cfg, db).unwrap()
    }

    #[test]
    fn fill_read_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path(), 1 << 20);
            assert!(s.read((1, 0), 0, 10).unwrap().is_none());
            s.fill((1, 0), &[7u8; 4096], 0).unwrap();
            s.fill((1, 1), &[9u8; 100], 0).unwrap();
            assert_eq!(s.read((1, 1), 10, 200).unwrap().unwrap(), vec![9u8; 90]);
            s.db().sync().unwrap();
        }
        let s = store(dir.path(), 1 << 20);
        assert_eq!(s.stats().bytes_used, 4196);
        assert_eq!(s.read((1, 0), 4090, 100).unwrap().unwrap(), vec![7u8; 6]);
    }

    #[test]
    fn corrupt_block_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = store(dir.path(), 1 << 20);
            s.fill((5, 0), &[1u8; 4096], 0).unwrap();
            s.db().sync().unwrap();
        }
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join("objects/05/0000000000000005"))
            .unwrap();
        f.write_all_at(b"garbage", 100).unwrap();
        let s = store(dir.path(), 1 << 20);
        assert!(s.read((5, 0), 0, 10).unwrap().is_none());
        assert_eq!(s.stats().corrupt_blocks, 1);
        assert_eq!(s.stats().bytes_used, 0);
    }

    #[test]
    fn eviction_keeps_usage_under_limit_and_spares_dirty_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 10 * 4096);
        s.write(99, 0, &[3u8; 4096]).unwrap();
        for i in 0..40 {
            s.fill((1, i), &[i as u8; 4096], 0).unwrap();
            assert!(s.stats().bytes_used <= 10 * 4096);
        }
        assert!(s.contains((99, 0)), "dirty block was evicted");
        assert!(s.contains((1, 39)) && !s.contains((1, 0)));
        assert!(s.stats().evictions >= 30);
    }

    #[test]
    fn the_harvester_evicts_so_that_fills_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("index.redb")).unwrap();
        let cfg = StoreConfig {
            dir: dir.path().join("objects"),
            block_size: 4096,
            limit: 20 * 4096,
            high_watermark: 0.5,
            low_watermark: 0.25,
        };
        let s = Arc::new(Store::open(cfg, db).unwrap());
        s.start_harvester().unwrap();
        for i in 0..100 {
            s.fill((1, i), &[i as u8; 4096], 0).unwrap();
            assert!(s.stats().bytes_used <= 20 * 4096, "over the limit after fill {i}");
        }
        // Past the high watermark (10 blocks) the harvester evicts down to the low one (5 blocks), so usage
        // ends at most at the high watermark, and most blocks were evicted.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while s.stats().bytes_used > 10 * 4096 {
            assert!(
                std::time::Instant::now() < deadline,
                "usage stays at {}",
                s.stats().bytes_used
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(s.stats().evictions >= 90, "{} evictions", s.stats().evictions);
        assert!(s.contains((1, 99)), "the newest block stays");
    }

    #[test]
    fn blocks_read_again_survive_a_scan() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 40 * 4096);
        for i in 0..10 {
            s.fill((1, i), &[1u8; 4096], 0).unwrap();
            assert!(s.read((1, i), 0, 16).unwrap().is_some());
        }
        // One pass over 400 blocks never read again.
        for i in 0..400 {
            s.fill((2, i), &[2u8; 4096], 0).unwrap();
        }
        let kept = (0..10).filter(|i| s.contains((1, *i))).count();
        assert_eq!(kept, 10, "the blocks read again were pushed out by the scan");
    }

    #[test]
    fn a_fill_fetched_before_a_local_change_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20);
        let before = s.epoch(3);
        s.write(3, 0, &[8u8; 100]).unwrap();
        s.fill((3, 0), &[1u8; 4096], before).unwrap();
        assert_eq!(
            s.read((3, 0), 0, 100).unwrap().unwrap(),
            vec![8u8; 100],
            "the local write wins"
        );
        let before = s.epoch(4);
        s.truncate(4, 0).unwrap();
        s.fill((4, 0), &[1u8; 4096], before).unwrap();
        assert!(!s.contains((4, 0)), "no stale block after a truncate");
        let before = s.epoch(6);
        s.remove_object(6);
        s.fill((6, 0), &[1u8; 4096], before).unwrap();
        assert!(
            !dir.path().join("objects/06/0000000000000006").exists(),
            "a removed object stays removed"
        );
    }

    #[test]
    fn truncate_keeps_the_prefix_of_the_last_block() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20);
        s.fill((2, 0), &[1u8; 4096], 0).unwrap();
        s.fill((2, 1), &[2u8; 4096], 0).unwrap();
        s.truncate(2, 5000).unwrap();
        assert_eq!(s.stats().bytes_used, 5000);
        assert_eq!(s.read((2, 1), 0, 4096).unwrap().unwrap(), vec![2u8; 904]);
        s.truncate(2, 100).unwrap();
        assert!(!s.contains((2, 1)));
        s.remove_object(2);
        assert_eq!(s.stats().bytes_used, 0);
    }
}
