//! The block store: sparse object files plus an in-memory view of the persistent block index.
//!
//! **Shards.** The in-memory state is split by object into [`SHARDS`] shards ([`shard_of`]). A shard holds
//! everything about its objects (their blocks, change epochs, pins, holds, fill reservations) under its own
//! mutex (`Shard::state`), with its own condition variable (`Shard::filled`) and its own count of dropped
//! blocks (`Shard::removals`). Every store operation is about one object, so **an operation holds at most
//! one shard lock at a time, ever** (`replace_object` removes the old object, then pins the new one: one
//! after the other; eviction and the walks over every shard lock one shard, let it go, then the next).
//! A hit of one object never waits for a lock that the operations of objects in other shards take. The
//! store-wide figures (bytes used, logical, dirty and pinned, blocks and objects) are atomics, adjusted
//! under the shard lock of the block they count: [`Store::stats`] takes no shard lock.
//!
//! Lock order (see docs/design/011-locks-and-the-hit-path.md): `abd` before one shard's `state` before
//! `policy`, `contents` or one shard of `fds`. Those three are leaves: none of them is ever taken while
//! another of them is held (the index committer's queue, `Db::submit`, is a leaf under any of them).
//! - `policy`: the one eviction order over every clean, evictable block of every shard (one order, so that
//!   S3-FIFO's queues are sized for the whole cache). A block enters or leaves it under its shard's lock,
//!   and only then: it holds the present, clean blocks of objects neither pinned nor held (less the
//!   victims eviction has taken out and not yet dropped), so a write of dirty blocks does not take it.
//!   Eviction takes no shard lock on entry: it pops a victim under `policy`, lets `policy` go, then locks
//!   the victim's shard and drops the block only if it is still present, clean and evictable (a popped
//!   block that turned dirty, pinned or held meanwhile simply stays, out of the policy as it should be).
//!   Callers evict after letting their shard lock go.
//! - A hit does not take `policy`: it notes the block in its shard's touch buffer (`ShardState::touched`).
//!   The buffer is applied to the policy under the shard lock: by the hit that fills it to
//!   [`TOUCH_BATCH`], by every other operation of the shard that takes `policy` (before its own change,
//!   so that a buffered touch never reaches a later entry of the same block), and by eviction and the
//!   readers of the eviction order, which apply every shard's buffer first ([`Store::drain_touches`]).
//! - `contents`: the content store's sharing counts, shared by all objects; its files are created and
//!   deleted under it.
//! - `fds`: open cache files, in one LRU per shard.
//!
//! What runs outside any lock:
//! - a read, and the checksum check of a block's first read: they check afterwards that the block was not
//!   replaced meanwhile (its shard's count of dropped blocks, then its generation);
//! - a fill's `pwrite` (or hole punch): the block is reserved first (`ShardState::filling`), and every local
//!   change that touches a reserved block waits for the fill to end ([`Store::fill`]);
//! - the hole punches of dropped blocks (eviction, by the harvester or a filling thread, `evict_object`, a
//!   block failing its checksum, indexing's drops): the block is reserved in the critical section that
//!   drops it and released once its hole is punched (`Punches`), so a refill of it, and every local
//!   change that touches it, waits for the punch as for a fill; a read of it is a miss (it left `blocks`,
//!   and its shard's count of dropped blocks moved, in that critical section). A removal punches no hole
//!   (the file is unlinked), nor does a truncate (its `set_len` has cut off the blocks it drops);
//! - the re-reading and checksumming of blocks to index them ([`Store::commit`], [`Store::mark_clean`]):
//!   a block is recorded only if neither its object's change epoch nor the block's stamp moved
//!   while it was read.
//!
//! Still under the object's shard lock: `fill_whole`'s write of a small file, and the copy that unshares a
//! shared content; a new content's file is written (or compared) under `contents`.

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::db::{Db, Mutation};
use crate::{Eviction, Policy};

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
    /// A block holding data not yet at home failed its checksum: the cache file was damaged (the disk,
    /// or a hand outside larder), and home has no copy to fetch again. Never served.
    #[error("cached data not yet at home is damaged (block {block} of cache object {object})")]
    Damaged { object: u64, block: u32 },
    /// The index cannot be trusted: part of it was lost to damage (not to a crash, which loses only what
    /// was never acknowledged).
    #[error("the cache index is damaged: {0}")]
    IndexDamaged(String),
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
    /// Keep one copy of identical clean small files (those filled whole).
    pub dedup: bool,
    /// The order clean units are evicted in.
    pub eviction: Eviction,
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
    /// Blocks evicted by fills themselves, past the limit, because the harvester fell behind (never shown
    /// to the [`Departing`] hook).
    pub evictions_by_fills: u64,
    pub corrupt_blocks: u64,
    /// Dirty blocks found damaged (failed their checksum) and not yet written again, cut off or removed:
    /// their reads fail, and their files cannot be pushed.
    pub damaged_blocks: u64,
    /// Bytes put into the cache (blocks fetched from home, and written here).
    pub inserted_bytes: u64,
    /// Bytes read back from cache files to be checksummed: indexing at commits and after pushes, taking
    /// in what the kernel wrote through passthrough, and the checks of blocks not verified since the start.
    pub checksummed_bytes: u64,
    /// Bytes of file data the cache holds, counting each file once (`bytes_used` counts each stored
    /// copy once: identical small files share one).
    pub logical_bytes: u64,
    /// Bytes of pinned files (never evicted).
    pub bytes_pinned: u64,
    /// Distinct contents in the content store, and the files sharing them.
    pub dedup_contents: u64,
    pub dedup_files: u64,
    /// The eviction policy in use.
    pub eviction: Eviction,
}

mod shard;
use shard::*;

/// Shown, by the harvester, each clean unit it is about to evict (an object and the indexes of its blocks
/// going together), with no lock held and the blocks still readable: a cluster node offers the units it
/// owns to a member with room (migration instead of eviction). It must return in bounded time; the
/// blocks are dropped afterwards unless they changed meanwhile. Evictions a fill makes itself (the
/// harvester fell behind) show nothing: they must not wait.
pub type Departing = Arc<dyn Fn(u64, &[u32]) + Send + Sync>;

/// The local block store.
pub struct Store {
    cfg: StoreConfig,
    db: Arc<Db>,
    shards: Box<[Shard]>,
    /// The eviction policy over the clean blocks of every shard (dirty ones are not candidates).
    policy: Mutex<Policy<BlockKey>>,
    contents: Mutex<Contents>,
    /// By shard, as `shards`.
    fds: Box<[Mutex<FdCache>]>,
    /// Bytes on disk: blocks of objects with a file of their own, plus each content once.
    used: AtomicU64,
    /// Bytes of all blocks.
    logical: AtomicU64,
    dirty: AtomicU64,
    pinned: AtomicU64,
    /// Present blocks, and objects with at least one.
    block_count: AtomicU64,
    object_count: AtomicU64,
    /// Set (and the harvester woken) when usage passed the high watermark.
    harvest: Mutex<bool>,
    harvest_cv: Condvar,
    harvesting: AtomicBool,
    /// Shown each unit the harvester is about to evict, while it is still readable (see [`Departing`]).
    departing: std::sync::OnceLock<Departing>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    evictions_by_fills: AtomicU64,
    corrupt: AtomicU64,
    /// Blocks in the shards' `damaged` sets.
    damaged: AtomicU64,
    inserted: AtomicU64,
    /// See [`StoreStats::checksummed_bytes`].
    checksummed: AtomicU64,
    /// The last average block distance: when, over how many units, and its value.
    abd: Mutex<Option<(std::time::Instant, usize, Option<f64>)>>,
    /// Emptied files of removed objects, kept for new ones (see `spare.rs`).
    spares: Mutex<spare::Spares>,
    /// The cache disk's free room, and the headroom kept on it for the index (see `space.rs`).
    space: space::Space,
    /// Called by a fill between its reservation and its write, by indexing between its reads and its
    /// records, by a read between its look and its `pread`, and by eviction between choosing a victim and
    /// locking its shard (tests pause them there).
    #[cfg(test)]
    hook: Mutex<Option<Hook>>,
}

#[cfg(test)]
type Hook = Arc<dyn Fn(Pause) + Send + Sync>;

/// Where a test may pause the store.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pause {
    /// A fill has reserved its block and not yet written it.
    Fill(BlockKey),
    /// Indexing of an object has read its blocks outside the lock and not yet recorded them.
    Index(u64),
    /// A read has found its block and not yet read its bytes.
    Read(BlockKey),
    /// Eviction has taken a victim from the policy and not yet locked its shard.
    Evict(BlockKey),
    /// A block has been dropped (and reserved) under its shard's lock, which is let go, and its hole is not
    /// punched yet.
    Punch(BlockKey),
}

/// Rounds of reading blocks to index outside the lock before the last one, made under it.
const INDEX_TRIES: usize = 2;

/// How long an average block distance is reused.
const ABD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

use larder_util::contention::lock;
use punch::Punches;

impl Store {
    /// Bytes per block.
    pub fn block_size(&self) -> u64 {
        self.cfg.block_size
    }

    /// The index this store persists to.
    pub fn db(&self) -> &Arc<Db> {
        &self.db
    }

    /// 512-byte blocks the cache file of `object` takes on disk (holes take none); 0 if it has none.
    pub fn allocated_blocks(&self, object: u64) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.path_of(object)).map_or(0, |m| m.blocks())
    }

    /// The directory the cache files are in.
    pub fn dir(&self) -> &Path {
        &self.cfg.dir
    }

    /// Label `object`'s cache file as holding changes of the file `label` names not yet at home
    /// (`unpushed.rs`).
    pub fn label(&self, object: u64, label: &crate::unpushed::Label) -> CacheResult<()> {
        crate::unpushed::set(self.file(object)?.as_ref(), label).map_err(CacheError::Io)
    }

    /// Home has all of `object`'s data: its cache file's label goes.
    pub fn unlabel(&self, object: u64) -> CacheResult<()> {
        crate::unpushed::clear(self.file(object)?.as_ref()).map_err(CacheError::Io)
    }

    fn path_of(&self, object: u64) -> PathBuf {
        self.cfg
            .dir
            .join(format!("{:02x}", object & 0xff))
            .join(format!("{object:016x}"))
    }

    /// The shard of `object`.
    fn shard(&self, object: u64) -> &Shard {
        &self.shards[shard_of(object)]
    }

    /// The state of `object`'s shard, locked.
    fn state(&self, object: u64) -> MutexGuard<'_, ShardState> {
        lock(&self.shard(object).state)
    }

    /// The open files of `object`'s shard, locked.
    fn fds_of(&self, object: u64) -> MutexGuard<'_, FdCache> {
        lock(&self.fds[shard_of(object)])
    }

    /// The policy, taken under the lock of shard `st` (shard before policy), with the shard's buffered hits
    /// applied first: they came before the caller's change.
    fn policy_under(&self, st: &mut ShardState) -> MutexGuard<'_, Policy<BlockKey>> {
        let mut policy = lock(&self.policy);
        for key in st.touched.drain(..) {
            policy.touch(&key);
        }
        policy
    }

    /// A hit of `key`, under its shard's lock: buffered, and passed to the policy with the shard's others
    /// once there are `TOUCH_BATCH` of them.
    fn touch_locked(&self, st: &mut ShardState, key: BlockKey) {
        st.touched.push(key);
        if st.touched.len() >= TOUCH_BATCH {
            drop(self.policy_under(st));
        }
    }

    /// Pass every shard's buffered hits to the policy: before eviction chooses victims, and before the
    /// eviction order is read. One shard lock at a time (each shard's hits are applied under its lock, so
    /// that none reaches a later entry of its block).
    pub(super) fn drain_touches(&self) {
        for shard in &self.shards {
            let mut st = lock(&shard.state);
            if !st.touched.is_empty() {
                drop(self.policy_under(&mut st));
            }
        }
    }

    /// The file holding `object`'s data, opened (and created) on demand. At most `MAX_OPEN_FILES` stay
    /// open. An object in the content store is read from the content's file, opened read-only: it is
    /// copied to a file of its own before any change.
    pub fn file(&self, object: u64) -> CacheResult<Arc<File>> {
        let content = self.state(object).meta(object).content;
        self.file_at(object, content)
    }

    /// The cache file of `object`, its own (a content it shares is copied out first): for a caller that
    /// changes its length.
    pub fn writable_file(&self, object: u64) -> CacheResult<Arc<File>> {
        let mut st = self.state(object);
        self.unshare_locked(&mut st, object)?;
        self.file_locked(&st, object)
    }

    fn file_locked(&self, st: &ShardState, object: u64) -> CacheResult<Arc<File>> {
        self.file_at(object, st.meta(object).content)
    }

    fn file_at(&self, object: u64, content: Option<ContentKey>) -> CacheResult<Arc<File>> {
        let mut fds = self.fds_of(object);
        fds.tick += 1;
        let tick = fds.tick;
        if let Some((f, t)) = fds.files.get_mut(&object) {
            *t = tick;
            return Ok(f.clone());
        }
        let path = match content {
            Some(key) => self.content_path(key),
            None => self.path_of(object),
        };
        let own = content.is_none();
        let open = |p: &Path, create: bool| {
            larder_util::private::options()
                .read(true)
                .write(own)
                .create(create)
                .truncate(false)
                .open(p)
        };
        // An object without a file yet gets a spare one where there is one (see `spare.rs`).
        let found = if own && lock(&self.spares).has_ready() {
            match open(&path, false) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && self.take_spare(&path) => open(&path, false),
                other => other,
            }
        } else {
            Err(io::ErrorKind::NotFound.into())
        };
        let file = match found.or_else(|_| open(&path, own)) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                larder_util::private::create_dir_all(path.parent().unwrap_or(&self.cfg.dir)).map_err(io_err)?;
                open(&path, own).map_err(io_err)?
            }
            Err(e) => return Err(io_err(e)),
        };
        if fds.files.len() >= MAX_OPEN_FILES / SHARDS {
            // The least recently used of the shard goes (a plain loop: this runs at every open past the
            // limit).
            let mut oldest = None;
            for (&object, &(_, t)) in &fds.files {
                if oldest.is_none_or(|(_, o)| t < o) {
                    oldest = Some((object, t));
                }
            }
            if let Some((object, _)) = oldest {
                fds.files.remove(&object);
            }
        }
        let file = Arc::new(file);
        fds.files.insert(object, (file.clone(), tick));
        Ok(file)
    }

    /// Whether block `key` is present.
    pub fn contains(&self, key: BlockKey) -> bool {
        self.state(key.0).blocks.contains_key(&key)
    }

    /// Read up to `len` bytes at `offset` within block `key` if it is present (a hit); `None` is a miss. The
    /// result stops at the block's end and may be shorter where the cache file ends in a hole. A block
    /// whose checksum fails is dropped and reported as a miss.
    ///
    /// A hit takes the lock of the block's shard once (and, one hit in `TOUCH_BATCH`, `policy` under it to
    /// pass the shard's buffered hits on); nothing any other shard's operations take.
    pub fn read(&self, key: BlockKey, offset: u64, len: usize) -> CacheResult<Option<Vec<u8>>> {
        let start = key.1 as u64 * self.cfg.block_size;
        let len = len.min(self.cfg.block_size.saturating_sub(offset) as usize);
        let shard = self.shard(key.0);
        // The bytes are read without the lock; if the block was evicted (or evicted and filled again)
        // meanwhile, they may be a punched hole: read again, or call it a miss.
        for _ in 0..8 {
            let (generation, removals, file, check) = {
                let mut st = lock(&shard.state);
                let Some(entry) = st.blocks.get(&key) else {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                };
                if st.damaged.contains(&key) {
                    return Err(CacheError::Damaged {
                        object: key.0,
                        block: key.1,
                    });
                }
                let (blen, crc, generation) = (entry.len as usize, entry.crc, entry.generation);
                // Dirty blocks too: their checksum was taken when they were indexed, and their bytes are
                // the only copy, so a damaged one must fail rather than be served.
                let check = !entry.verified;
                let file = self.file_locked(&st, key.0)?;
                if !check {
                    self.touch_locked(&mut st, key);
                }
                let removals = shard.removals.load(Ordering::SeqCst);
                (generation, removals, file, check.then_some((blen, crc)))
            };
            if let Some((blen, crc)) = check {
                // The first read of the block since the start: its checksum, checked without the lock, is
                // taken as the block's only if the block is still the one that was looked at.
                let mut whole = vec![0u8; blen];
                let ok = read_block(&file, &mut whole, start).is_ok() && self.checksum_read(&whole) == crc;
                let mut st = lock(&shard.state);
                match st.blocks.get_mut(&key) {
                    Some(e) if e.generation == generation && e.crc == crc && !e.verified => {
                        if !ok {
                            // A clean block is a miss, fetched again; a dirty one is an error.
                            let dirty = e.dirty;
                            return self.failed_check(st, key, dirty).map(|()| None);
                        }
                        e.verified = true;
                        self.touch_locked(&mut st, key);
                        drop(st);
                        self.hits.fetch_add(1, Ordering::Relaxed);
                        let from = (offset as usize).min(whole.len());
                        let to = (from + len).min(whole.len());
                        whole.truncate(to);
                        whole.drain(..from);
                        return Ok(Some(whole));
                    }
                    // Changed meanwhile (written, refilled, verified by another reader, or gone): look again.
                    _ => continue,
                }
            }
            #[cfg(test)]
            self.pause(Pause::Read(key));
            let mut buf = vec![0u8; len];
            let n = read_upto(&file, &mut buf, start + offset).map_err(io_err)?;
            buf.truncate(n);
            // No block of this shard dropped since the look under its lock: this one was not, so these are
            // its bytes (a block is replaced only by being dropped and filled again, and its drop is counted
            // in its own shard).
            if shard.removals.load(Ordering::SeqCst) == removals {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(buf));
            }
            if lock(&shard.state).blocks.get(&key).map(|e| e.generation) == Some(generation) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Some(buf));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// Mark block `key` dirty if it is present, so that eviction can no longer take it; the caller is about
    /// to write part of it. `false`: not present (the caller must bring the block in first). A block not
    /// verified since the start is checked first (`verify.rs`): a clean one that fails is dropped (not
    /// present), a dirty one is [`CacheError::Damaged`], since the bytes the write keeps of it are wrong.
    ///
    /// A block a fill is writing is not present (it is inserted when the fill ends), so a claim never
    /// changes a block under a fill: it fails, and the caller's own fetch fills the block after it.
    pub fn claim(&self, key: BlockKey) -> CacheResult<bool> {
        if self.state(key.0).blocks.get(&key).is_some_and(|e| !e.verified) {
            self.verify_range(key.0, key.1..=key.1)?;
        }
        let mut st = self.state(key.0);
        if st.damaged.contains(&key) {
            return Err(CacheError::Damaged {
                object: key.0,
                block: key.1,
            });
        }
        let Some(e) = st.blocks.get(&key) else { return Ok(false) };
        if !e.dirty {
            let (len, crc) = (e.len, e.crc);
            if let Err(e) = self.unshare_locked(&mut st, key.0) {
                tracing::warn!(object = key.0, error = %e, "could not copy a shared file to change it; fetching it again");
                return Ok(false);
            }
            Self::bump_epoch(&mut st, key.0);
            self.insert_locked(&mut st, key, len, crc, true);
        }
        Ok(true)
    }

    /// Mark block `key` dirty if it is present, as the index says it is (a file's unpushed ranges, when
    /// its record is loaded), without checking it: whether it was verified stays as it was, so that its
    /// first read or push checks it. Whether it is present.
    pub fn reclaim(&self, key: BlockKey) -> bool {
        let mut st = self.state(key.0);
        let Some(e) = st.blocks.get(&key) else { return false };
        if !e.dirty {
            let (len, crc, verified) = (e.len, e.crc, e.verified);
            if self.unshare_locked(&mut st, key.0).is_err() {
                return false;
            }
            self.insert_locked(&mut st, key, len, crc, true);
            if let Some(e) = st.blocks.get_mut(&key) {
                e.verified = verified;
            }
        }
        true
    }

    /// The change epoch of `object`; take it before fetching a block to `fill`.
    pub fn epoch(&self, object: u64) -> u64 {
        self.state(object).epoch(object)
    }

    fn bump_epoch(st: &mut ShardState, object: u64) {
        let e = st.epochs.entry(object).or_insert(0);
        *e = e.wrapping_add(1);
    }

    /// Current figures. Running totals, read without any shard lock (each figure on its own).
    pub fn stats(&self) -> StoreStats {
        let (dedup_contents, dedup_files) = {
            let c = lock(&self.contents);
            (c.refs.len() as u64, c.shares)
        };
        StoreStats {
            bytes_used: self.used.load(Ordering::Relaxed),
            bytes_limit: self.cfg.limit,
            bytes_dirty: self.dirty.load(Ordering::Relaxed),
            blocks: self.block_count.load(Ordering::Relaxed),
            objects: self.object_count.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            evictions_by_fills: self.evictions_by_fills.load(Ordering::Relaxed),
            corrupt_blocks: self.corrupt.load(Ordering::Relaxed),
            damaged_blocks: self.damaged.load(Ordering::Relaxed),
            inserted_bytes: self.inserted.load(Ordering::Relaxed),
            checksummed_bytes: self.checksummed.load(Ordering::Relaxed),
            logical_bytes: self.logical.load(Ordering::Relaxed),
            bytes_pinned: self.pinned.load(Ordering::Relaxed),
            dedup_contents,
            dedup_files,
            eviction: self.cfg.eviction,
        }
    }

    fn insert_locked(&self, st: &mut ShardState, key: BlockKey, len: u32, crc: u32, dirty: bool) {
        st.materialize(key.0);
        st.tick = st.tick.wrapping_add(1);
        let tick = st.tick;
        // Rewriting a present block in place keeps its generation; a new entry gets a new one.
        let generation = st.blocks.get(&key).map_or(tick, |e| e.generation);
        let meta = st.meta(key.0);
        let evictable = st.evictable(key.0);
        let mut was_candidate = false;
        let new_object = !st.has_blocks(key.0);
        if let Some(old) = st.blocks.insert(
            key,
            BlockEntry {
                len,
                crc,
                generation,
                stamp: tick,
                verified: true,
                dirty,
                adopted: false,
                shared: false,
            },
        ) {
            self.account(&meta, old.len, old.dirty, false);
            was_candidate = !old.dirty && evictable;
        } else {
            if new_object {
                self.object_count.fetch_add(1, Ordering::Relaxed);
            }
            self.block_count.fetch_add(1, Ordering::Relaxed);
            st.block_added();
        }
        self.account(&meta, len, dirty, true);
        // The policy holds present, clean, evictable blocks only: a block that was not one and is not one
        // now (a write's) leaves it alone, and `policy` is not taken.
        let candidate = !dirty && evictable;
        if candidate {
            self.policy_under(st).insert(key, len as u64);
        } else if was_candidate {
            self.policy_under(st).remove(&key);
        }
    }

    /// Count a block of `len` bytes in (or out of) the usage figures. Called under the block's shard lock,
    /// so that a block's bytes are counted out only after they were counted in: no figure goes below zero.
    fn account(&self, meta: &ObjectMeta, len: u32, dirty: bool, add: bool) {
        let len = len as u64;
        let adjust = |v: &AtomicU64| {
            if add {
                v.fetch_add(len, Ordering::Relaxed);
            } else {
                v.fetch_sub(len, Ordering::Relaxed);
            }
        };
        adjust(&self.logical);
        if meta.content.is_none() {
            adjust(&self.used);
        }
        if dirty {
            adjust(&self.dirty);
        }
        if meta.pinned {
            adjust(&self.pinned);
        }
    }

    /// `object` has no block left: it no longer shares a content, nor is it a whole unit (its next fill
    /// says again). A pin stays.
    fn emptied_locked(&self, st: &mut ShardState, object: u64) {
        // (No block left: any state of it is in `objects`.)
        let Some(mut meta) = st.objects.get(&object).copied() else {
            return;
        };
        if let Some(key) = meta.content.take() {
            self.fds_of(object).files.remove(&object);
            self.release_content(key);
        }
        meta.whole = false;
        self.db.submit(vec![meta.mutation(object)]);
        st.set_meta(object, meta);
    }
}

/// The key of a content file's name, `LEN-CRC` in hex.
fn parse_content_name(name: &str) -> Option<ContentKey> {
    let (len, crc) = name.split_once('-')?;
    Some((u32::from_str_radix(len, 16).ok()?, u32::from_str_radix(crc, 16).ok()?))
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

/// Read a block's bytes at `offset` as the index takes them: past the cache file's end the content is a
/// hole, zeros (a cache file may end before its file). Indexing, the checks of cached blocks and the
/// comparison with what the kernel wrote all read blocks through this, so they agree on the bytes.
fn read_block(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let n = read_upto(file, buf, offset)?;
    buf[n..].fill(0);
    Ok(())
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
    if let Err(e) = larder_util::holes::punch_hole(file, offset..offset + len) {
        tracing::debug!(error = %e, "punching a hole in a cache file failed");
    }
}

mod content;
mod evict;
mod fill;
mod index;
mod local;
mod open;
pub use open::Retained;
mod passthrough;
mod punch;
mod space;
mod spare;
#[cfg(test)]
mod tests;
mod verify;
pub use verify::Verification;
