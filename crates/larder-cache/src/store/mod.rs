//! The block store: sparse object files plus an in-memory view of the persistent block index.
//!
//! Lock order (see docs/design/011-locks-and-the-hit-path.md): `abd` before `state` before `fds`.
//!
//! What runs outside `state`:
//! - a read, and the checksum check of a block's first read: they check afterwards that the block was not
//!   replaced meanwhile (its generation);
//! - a fill's `pwrite` (or hole punch): the block is reserved first (`State::filling`), and every local
//!   change that touches a reserved block waits for the fill to end ([`Store::fill`]);
//! - the re-reading and checksumming of blocks to index them ([`Store::commit`], [`Store::mark_clean`]):
//!   a block is recorded only if neither its object's change epoch nor the block's stamp moved
//!   while it was read.
//!
//! Eviction's and removal's hole punches, and the copy that unshares a shared content, still run under
//! `state`: a punched block is gone from the index in the same critical section.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
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
    pub corrupt_blocks: u64,
    /// Bytes put into the cache (blocks fetched from home, and written here).
    pub inserted_bytes: u64,
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

/// Content-store key: length and crc32c of a whole small file. Equal keys are compared byte for byte before
/// a file shares a content; a collision is simply not shared.
type ContentKey = (u64, u32);

const WHOLE: u32 = 1;
const PINNED: u32 = 2;
const SHARED: u32 = 4;

/// Per-object state beside the blocks.
#[derive(Clone, Copy, Debug, Default)]
struct ObjectMeta {
    /// Fetched, kept and evicted as one unit (a small file over several blocks).
    whole: bool,
    /// Never evicted.
    pinned: bool,
    /// Stored in the content store (no file of its own).
    content: Option<ContentKey>,
}

impl ObjectMeta {
    /// Nothing beside the blocks: no need to keep it.
    fn plain(&self) -> bool {
        !self.whole && !self.pinned && self.content.is_none()
    }

    fn mutation(&self, object: u64) -> Mutation {
        if self.plain() {
            return Mutation::DelObjectMeta(object);
        }
        let flags =
            (self.whole as u32 * WHOLE) | (self.pinned as u32 * PINNED) | (self.content.is_some() as u32 * SHARED);
        let (len, crc) = self.content.unwrap_or((0, 0));
        Mutation::PutObject {
            object,
            flags,
            len,
            crc,
        }
    }
}

struct BlockEntry {
    len: u32,
    crc: u32,
    /// Set when the entry is inserted, never changed: a read that finds the same generation after its
    /// unlocked `pread` read bytes that were not evicted or replaced meanwhile.
    generation: u64,
    /// Set each time the entry is written (inserted, rewritten in place, re-indexed): indexing records a
    /// block's checksum only if no other record of it came between its look and its record.
    stamp: u64,
    verified: bool,
    dirty: bool,
}

struct State {
    /// Ordered by key, so the blocks of one object are one range.
    blocks: BTreeMap<BlockKey, BlockEntry>,
    /// The eviction policy over the clean blocks (dirty ones are not candidates).
    policy: Policy<BlockKey>,
    per_object: HashMap<u64, u32>,
    /// Bumped by every local change of an object (write, truncate, removal): a fill fetched before the
    /// change must not land after it.
    epochs: HashMap<u64, u64>,
    objects: HashMap<u64, ObjectMeta>,
    /// Objects the kernel reads directly (FUSE passthrough), with the number of handles doing so: their
    /// blocks are not evicted, and their files never have holes punched, while held.
    holds: HashMap<u64, u32>,
    /// Files sharing each content of the content store, and their sum.
    contents: HashMap<ContentKey, u32>,
    shares: u64,
    /// Bytes on disk: blocks of objects with a file of their own, plus each content once.
    used: u64,
    /// Bytes of all blocks.
    logical: u64,
    dirty: u64,
    pinned: u64,
    tick: u64,
    /// Blocks a fill is writing outside the lock: absent from `blocks` until the fill ends, and touched
    /// by no local change meanwhile (those wait, on `Store::filled`).
    filling: BTreeSet<BlockKey>,
    /// Objects a local change is waiting on or working through outside the lock (a truncate's `set_len`),
    /// with how many: no fill reserves a block of theirs meanwhile (it would be dropped anyway, its epoch
    /// being about to move), so that a waiter waits only for the fills that were under way.
    changing: HashMap<u64, u32>,
    /// Threads waiting on `Store::filled`: a fill wakes them only if there are any.
    waiting: u32,
}

impl State {
    /// The change epoch of `object`.
    fn epoch(&self, object: u64) -> u64 {
        self.epochs.get(&object).copied().unwrap_or(0)
    }

    /// Whether a fill holds a reservation on one of `blocks` of `object`.
    fn filling_any(&self, object: u64, blocks: &RangeInclusive<u32>) -> bool {
        self.filling
            .range((object, *blocks.start())..=(object, *blocks.end()))
            .next()
            .is_some()
    }

    fn mark_changing(&mut self, object: u64) {
        *self.changing.entry(object).or_default() += 1;
    }

    fn unmark_changing(&mut self, object: u64) {
        if let Some(n) = self.changing.get_mut(&object) {
            *n -= 1;
            if *n == 0 {
                self.changing.remove(&object);
            }
        }
    }

    fn meta(&self, object: u64) -> ObjectMeta {
        self.objects.get(&object).copied().unwrap_or_default()
    }

    /// Keep `meta` as `object`'s state (forgetting it if it is plain).
    fn set_meta(&mut self, object: u64, meta: ObjectMeta) {
        if meta.plain() {
            self.objects.remove(&object);
        } else {
            self.objects.insert(object, meta);
        }
    }

    /// The present blocks of `object`, in order.
    fn blocks_of(&self, object: u64) -> std::collections::btree_map::Range<'_, BlockKey, BlockEntry> {
        self.blocks.range((object, 0)..=(object, u32::MAX))
    }

    /// Whether the policy may evict the clean blocks of `object`: not while it is pinned or held.
    fn evictable(&self, object: u64) -> bool {
        !self.meta(object).pinned && !self.holds.contains_key(&object)
    }

    /// Put `object`'s blocks into the policy, or take them out, after its pin or hold changed.
    fn repolicy(&mut self, object: u64) {
        let evictable = self.evictable(object);
        let blocks: Vec<(BlockKey, u32, bool)> = self.blocks_of(object).map(|(k, e)| (*k, e.len, e.dirty)).collect();
        for (key, len, dirty) in blocks {
            if evictable && !dirty {
                self.policy.insert(key, len as u64);
            } else {
                self.policy.remove(&key);
            }
        }
    }
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
    /// Paired with `state`: signalled when a fill a thread waits on releases its reservation.
    filled: Condvar,
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
    /// The last average block distance: when, over how many units, and its value.
    abd: Mutex<Option<(std::time::Instant, usize, Option<f64>)>>,
    /// Called by a fill between its reservation and its write, and by indexing between its reads and its
    /// records (tests pause them there).
    #[cfg(test)]
    hook: Mutex<Option<Hook>>,
}

#[cfg(test)]
type Hook = Arc<dyn Fn(Pause) + Send + Sync>;

/// Where a test may pause the store.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    /// A fill has reserved its block and not yet written it.
    Fill(BlockKey),
    /// Indexing of an object has read its blocks outside the lock and not yet recorded them.
    Index(u64),
}

/// A fill's reservation of its block: released (and waiters woken) under the lock when the fill ends,
/// or by `drop` if the fill unwinds.
struct Reservation<'a> {
    store: &'a Store,
    key: BlockKey,
    held: bool,
}

impl Reservation<'_> {
    fn release(&mut self, st: &mut State) {
        if std::mem::take(&mut self.held) {
            st.filling.remove(&self.key);
            if st.waiting > 0 {
                self.store.filled.notify_all();
            }
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.held {
            let mut st = lock(&self.store.state);
            self.release(&mut st);
        }
    }
}

/// Rounds of reading blocks to index outside the lock before the last one, made under it.
const INDEX_TRIES: usize = 2;

/// How long an average block distance is reused.
const ABD_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

use crate::contention::lock;

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

    fn path_of(&self, object: u64) -> PathBuf {
        self.cfg
            .dir
            .join(format!("{:02x}", object & 0xff))
            .join(format!("{object:016x}"))
    }

    /// The file holding `object`'s data, opened (and created) on demand. At most `MAX_OPEN_FILES` stay
    /// open. An object in the content store is read from the content's file, opened read-only: it is
    /// copied to a file of its own before any change.
    pub fn file(&self, object: u64) -> CacheResult<Arc<File>> {
        let content = lock(&self.state).meta(object).content;
        self.file_at(object, content)
    }

    fn file_locked(&self, st: &State, object: u64) -> CacheResult<Arc<File>> {
        self.file_at(object, st.meta(object).content)
    }

    fn file_at(&self, object: u64, content: Option<ContentKey>) -> CacheResult<Arc<File>> {
        let mut fds = lock(&self.fds);
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
        let open = |p: &Path| {
            crate::private::options()
                .read(true)
                .write(content.is_none())
                .create(content.is_none())
                .truncate(false)
                .open(p)
        };
        let file = match open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                crate::private::create_dir_all(path.parent().unwrap_or(&self.cfg.dir)).map_err(io_err)?;
                open(&path).map_err(io_err)?
            }
            Err(e) => return Err(io_err(e)),
        };
        if fds.files.len() >= MAX_OPEN_FILES {
            // The least recently used goes (a plain loop: this runs at every open past the limit).
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
        lock(&self.state).blocks.contains_key(&key)
    }

    /// Read up to `len` bytes at `offset` within block `key` if it is present (a hit); `None` is a miss. The
    /// result stops at the block's end and may be shorter where the cache file ends in a hole. A block
    /// whose checksum fails is dropped and reported as a miss.
    pub fn read(&self, key: BlockKey, offset: u64, len: usize) -> CacheResult<Option<Vec<u8>>> {
        let start = key.1 as u64 * self.cfg.block_size;
        let len = len.min(self.cfg.block_size.saturating_sub(offset) as usize);
        // The bytes are read without the lock; if the block was evicted (or evicted and filled again)
        // meanwhile, they may be a punched hole: read again, or call it a miss.
        for _ in 0..8 {
            let (generation, file, check) = {
                let mut st = lock(&self.state);
                let Some(entry) = st.blocks.get(&key) else {
                    self.misses.fetch_add(1, Ordering::Relaxed);
                    return Ok(None);
                };
                let (blen, crc, generation) = (entry.len as usize, entry.crc, entry.generation);
                let check = !(entry.verified || entry.dirty);
                let file = self.file_locked(&st, key.0)?;
                if !check {
                    st.policy.touch(&key);
                }
                (generation, file, check.then_some((blen, crc)))
            };
            if let Some((blen, crc)) = check {
                // The first read of the block since the start: its checksum, checked without the lock, is
                // taken as the block's only if the block is still the one that was looked at.
                let mut whole = vec![0u8; blen];
                let ok = read_full(&file, &mut whole, start).is_ok() && crc32c::crc32c(&whole) == crc;
                let mut st = lock(&self.state);
                match st.blocks.get_mut(&key) {
                    Some(e) if e.generation == generation && e.crc == crc && !e.dirty && !e.verified => {
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
                        e.verified = true;
                        st.policy.touch(&key);
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
    ///
    /// A block a fill is writing is not present (it is inserted when the fill ends), so a claim never
    /// changes a block under a fill: it fails, and the caller's own fetch fills the block after it.
    pub fn claim(&self, key: BlockKey) -> bool {
        let mut st = lock(&self.state);
        let Some(e) = st.blocks.get(&key) else { return false };
        if !e.dirty {
            let (len, crc) = (e.len, e.crc);
            if let Err(e) = self.unshare_locked(&mut st, key.0) {
                tracing::warn!(object = key.0, error = %e, "could not copy a shared file to change it; fetching it again");
                return false;
            }
            Self::bump_epoch(&mut st, key.0);
            self.insert_locked(&mut st, key, len, crc, true);
        }
        true
    }

    /// The change epoch of `object`; take it before fetching a block to `fill`.
    pub fn epoch(&self, object: u64) -> u64 {
        lock(&self.state).epoch(object)
    }

    fn bump_epoch(st: &mut State, object: u64) {
        let e = st.epochs.entry(object).or_insert(0);
        *e = e.wrapping_add(1);
    }

    /// Wait (on `filled`, releasing `state` meanwhile) until no fill holds a reservation on `blocks` of
    /// `object`; returns with the lock held, so that the caller's change follows the fills in one critical
    /// section. While a thread waits, `object` is marked changing: no new fill reserves a block of it, so
    /// the wait ends once the fills under way when it began have written their bytes (no busy loop, no
    /// unbounded wait).
    fn await_fills<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        object: u64,
        blocks: RangeInclusive<u32>,
    ) -> MutexGuard<'a, State> {
        if !st.filling_any(object, &blocks) {
            return st;
        }
        st.mark_changing(object);
        st.waiting += 1;
        while st.filling_any(object, &blocks) {
            st = self.filled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.waiting -= 1;
        st.unmark_changing(object);
        st
    }

    /// Store a clean block fetched from home at change epoch `epoch` of its object. Nothing is stored if
    /// the object changed locally since (a write, truncate or removal: their data wins), is changing now,
    /// or the block is present already. A full cache disk is not an error here: the data still goes to the
    /// reader, the block is simply not kept.
    ///
    /// The bytes are written outside `state`. Under it, the fill checks the epoch and the block's absence
    /// and reserves the block (`State::filling`); it writes; then, under the lock again, it inserts the
    /// block only if the epoch is still `epoch`, and releases the reservation. Why no local change can be
    /// overwritten by the fill's bytes, caller by caller:
    /// - [`Store::write`], [`Store::remove_object`] (so [`Store::replace_object`] too) and
    ///   [`Store::truncate`] (the block holding the new end and every later one) wait until no fill holds
    ///   a block they touch, then bump the epoch in the same critical section: the fill they waited for
    ///   has written and been inserted (it is ordered before them, as if it had run under the lock), and
    ///   any fill fetched before them fails the epoch check from then on. A truncate keeps its object
    ///   marked changing until its `set_len` is done, so no fill writes into the file while it is cut.
    /// - [`Store::claim`] changes only a present block; a reserved block is absent (nothing inserts a block
    ///   while it is reserved), so a claim of it fails and the caller fetches it first. A claim, like a
    ///   write of another block, bumps the epoch: a reserved fill of another block is then dropped, its
    ///   bytes punched out again before its reservation ends.
    /// - Eviction, and every other hole punch, takes present blocks only: never a reserved one.
    /// - Shared contents: a fill never reserves a block of an object in the content store, and
    ///   [`Store::fill_whole`] never shares (nor writes) an object with a block reserved: it fills block
    ///   by block instead. So no unsharing meets a reservation.
    /// - Another fill of the same block waits for this one, then finds the block present (or the epoch
    ///   moved) as it would have under the lock.
    pub fn fill(&self, key: BlockKey, data: &[u8], epoch: u64) -> CacheResult<()> {
        let start = key.1 as u64 * self.cfg.block_size;
        let crc = crc32c::crc32c(data);
        let mut st = lock(&self.state);
        loop {
            if st.epoch(key.0) != epoch || st.blocks.contains_key(&key) || st.changing.contains_key(&key.0) {
                return Ok(());
            }
            if st.meta(key.0).content.is_some() {
                // Shared contents are whole: a missing block means the object is being dropped.
                return Ok(());
            }
            if !st.filling.contains(&key) {
                break;
            }
            st.waiting += 1;
            st = self.filled.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting -= 1;
        }
        let file = self.file_locked(&st, key.0)?;
        st.filling.insert(key);
        let mut reservation = Reservation {
            store: self,
            key,
            held: true,
        };
        drop(st);
        #[cfg(test)]
        self.pause(Pause::Fill(key));
        let written = Self::write_block(&file, start, data);
        let mut st = lock(&self.state);
        let keep = written.is_ok()
            && st.epoch(key.0) == epoch
            && !st.blocks.contains_key(&key)
            && st.meta(key.0).content.is_none();
        if !keep {
            // A local change came first (or the write failed): the bytes written are nobody's. The block
            // is absent and still reserved, so no change of it can run meanwhile: punch them out again,
            // outside the lock, as an evicted block would be.
            let punch =
                !st.blocks.contains_key(&key) && !st.holds.contains_key(&key.0) && st.meta(key.0).content.is_none();
            drop(st);
            if punch {
                punch_hole(&file, start, data.len() as u64);
            }
            let mut st = lock(&self.state);
            reservation.release(&mut st);
            return written;
        }
        reservation.release(&mut st);
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

    #[cfg(test)]
    fn pause(&self, at: Pause) {
        let hook = lock(&self.hook).clone();
        if let Some(hook) = hook {
            hook(at);
        }
    }

    /// Write a fetched block's bytes at `start`. A block of zeros (a hole at home, read back) stays a hole
    /// here: nothing is allocated for it.
    fn write_block(file: &File, start: u64, data: &[u8]) -> CacheResult<()> {
        if data.iter().all(|&b| b == 0) {
            let end = start + data.len() as u64;
            punch_hole(file, start, data.len() as u64);
            if file.metadata().map_err(io_err)?.len() < end {
                // The block is read back in full (checksums): the file reaches its end, one byte stored.
                file.write_all_at(&[0], end - 1).map_err(io_err)?;
            }
        } else {
            file.write_all_at(data, start).map_err(io_err)?;
        }
        Ok(())
    }

    /// Write new (dirty) data into `object` at `offset`. Blocks touched become present and dirty; the caller
    /// guarantees that a partially written block was present or lies wholly beyond home's data.
    ///
    /// A fill writing one of the blocks touched (outside the lock) is waited for first: its bytes land,
    /// and then these, so that these are the file's. Once the blocks are marked, no fill reserves them
    /// again (they are present, and the epoch moved).
    pub fn write(&self, object: u64, offset: u64, data: &[u8]) -> CacheResult<()> {
        if data.is_empty() {
            return Ok(());
        }
        let bs = self.cfg.block_size;
        let end = offset + data.len() as u64;
        // Mark the blocks dirty first: from then on eviction cannot punch them under the new bytes.
        let mut added = Vec::new();
        let file = {
            let touched = (offset / bs).min(u32::MAX as u64) as u32..=((end - 1) / bs).min(u32::MAX as u64) as u32;
            let mut st = self.await_fills(lock(&self.state), object, touched);
            self.unshare_locked(&mut st, object)?;
            let file = self.file_locked(&st, object)?;
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
            file
        };
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

    /// Re-read blocks `indexes` of `object` (the first `size` bytes of it) from its cache file and record
    /// them, with their checksums, as clean or dirty. A block not present is skipped; one wholly past `size`
    /// is dropped. One that cannot be read is reported, and when marking clean, dropped.
    ///
    /// The reads and checksums run outside `state`: under it the object's change epoch and each block's
    /// stamp are noted; after reading, a block is recorded only if both are unchanged. The epoch moves with
    /// every local change of the object (write, claim, truncate, removal; unsharing happens only within
    /// those), the stamp with every write of the block's entry: a write or claim of it, its eviction and
    /// refill (a new entry), and another indexing's record of it. Nothing else changes a present block's
    /// bytes, so the bytes read are the block's when it is recorded, as if read under the lock; and of two
    /// indexings of one block the later record holds bytes read later, as when each ran under the lock.
    /// (A write's own `pwrite` runs after its critical section, as it always has: a caller indexing a
    /// block while writing it gets whichever bytes were there.) A block that moved is read again; after
    /// `INDEX_TRIES` rounds outside the lock the last is made under it, as it was always made: a commit
    /// must record every block it was given (one left unrecorded would be found corrupt or missing after
    /// a restart), and under the lock nothing can move.
    fn index_blocks(
        &self,
        object: u64,
        indexes: impl IntoIterator<Item = u32>,
        size: u64,
        dirty: bool,
    ) -> CacheResult<()> {
        let bs = self.cfg.block_size;
        let mut pending: Vec<u32> = indexes.into_iter().collect();
        let mut failed = None;
        for round in 0..=INDEX_TRIES {
            let mut st = lock(&self.state);
            let epoch = st.epoch(object);
            let file = self.file_locked(&st, object).map_err(|e| e.to_string());
            // The blocks to read, as they are now.
            let mut plan = Vec::new();
            for index in pending.drain(..) {
                let key = (object, index);
                let Some(entry) = st.blocks.get(&key) else { continue };
                let stamp = entry.stamp;
                let len = size.saturating_sub(index as u64 * bs).min(bs) as usize;
                if len == 0 {
                    self.remove_locked(&mut st, key);
                    continue;
                }
                plan.push((index, stamp, len));
            }
            if plan.is_empty() {
                break;
            }
            let read_all = |plan: &[(u32, u64, usize)]| -> Vec<CacheResult<u32>> {
                plan.iter()
                    .map(|&(index, _, len)| {
                        // Past the cache file's end the content is a hole: zeros.
                        let mut buf = vec![0u8; len];
                        match &file {
                            Ok(f) => read_upto(f, &mut buf, index as u64 * bs)
                                .map(|_| crc32c::crc32c(&buf))
                                .map_err(io_err),
                            Err(e) => Err(CacheError::Index(e.clone())),
                        }
                    })
                    .collect()
            };
            let reads = if round < INDEX_TRIES {
                drop(st);
                let reads = read_all(&plan);
                #[cfg(test)]
                self.pause(Pause::Index(object));
                st = lock(&self.state);
                reads
            } else {
                read_all(&plan)
            };
            let unmoved = st.epoch(object) == epoch;
            let mut mutations = Vec::new();
            for ((index, stamp, len), read) in plan.into_iter().zip(reads) {
                let key = (object, index);
                if !unmoved || st.blocks.get(&key).map(|e| e.stamp) != Some(stamp) {
                    pending.push(index);
                    continue;
                }
                match read {
                    Ok(crc) => {
                        self.insert_locked(&mut st, key, len as u32, crc, dirty);
                        mutations.push(Mutation::PutBlock {
                            object,
                            index,
                            len: len as u32,
                            crc,
                        });
                    }
                    Err(e) => {
                        if !dirty {
                            self.remove_locked(&mut st, key);
                            mutations.push(Mutation::DelBlock { object, index });
                        }
                        failed.get_or_insert(e);
                    }
                }
            }
            // Submitted under the lock, so that they reach the index before any later change of these
            // blocks does.
            self.db.submit(mutations);
            drop(st);
            if pending.is_empty() {
                break;
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Cut `object` to `size` bytes: later blocks are dropped, a partial last block keeps its prefix.
    ///
    /// Fills of the block holding the new end and of every later one are waited for before the epoch
    /// moves; the object stays marked changing until the file is cut, so that no fill (even one fetched
    /// after the epoch moved) writes into it while `set_len` runs outside the lock. Fills of earlier blocks
    /// write below the new end, which `set_len` leaves alone; fetched before the epoch moved, they are not
    /// kept.
    pub fn truncate(&self, object: u64, size: u64) -> CacheResult<()> {
        let bs = self.cfg.block_size;
        let file = {
            let mut st = lock(&self.state);
            if let Ok(first) = u32::try_from(size / bs) {
                st = self.await_fills(st, object, first..=u32::MAX);
            }
            self.unshare_locked(&mut st, object)?;
            // Fills fetched before this point must not write old bytes past the new end.
            Self::bump_epoch(&mut st, object);
            let file = self.file_locked(&st, object)?;
            st.mark_changing(object);
            file
        };
        let cut = file.set_len(size).map_err(io_err);
        let mut st = lock(&self.state);
        st.unmark_changing(object);
        cut?;
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

    /// Forget every block of `object` and delete its file. Fills of its blocks under way are waited for
    /// first (their blocks are then dropped with the rest); fills fetched before fail the epoch check.
    /// Until its file is closed and unlinked, the object stays marked changing: a fill fetched after the
    /// epoch moved must not write into the file about to be unlinked (its block would be indexed with its
    /// bytes gone), nor index a block before the object's removal is recorded.
    pub fn remove_object(&self, object: u64) {
        {
            let mut st = self.await_fills(lock(&self.state), object, 0..=u32::MAX);
            // Kept as a tombstone, so that a fill fetched before the removal does not bring the file back.
            Self::bump_epoch(&mut st, object);
            if st.per_object.contains_key(&object) {
                let keys: Vec<BlockKey> = st.blocks_of(object).map(|(k, _)| *k).collect();
                for key in keys {
                    self.remove_locked(&mut st, key);
                }
            }
            st.objects.remove(&object);
            st.mark_changing(object);
        }
        lock(&self.fds).files.remove(&object);
        self.db.submit(vec![Mutation::DelObject(object)]);
        let _ = std::fs::remove_file(self.path_of(object));
        lock(&self.state).unmark_changing(object);
    }

    /// `new` replaces `object` as the same file's content (a new version): the old one is removed, and a
    /// pin, which belongs to the file, moves to the new one. Whether it did. The removal waits for fills
    /// of the old object under way ([`Store::remove_object`]).
    pub fn replace_object(&self, object: u64, new: u64) -> bool {
        let pinned = self.pinned(object);
        self.remove_object(object);
        if pinned {
            self.set_pinned(new, true);
        }
        pinned
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
            logical_bytes: st.logical,
            bytes_pinned: st.pinned,
            dedup_contents: st.contents.len() as u64,
            dedup_files: st.shares,
            eviction: self.cfg.eviction,
        }
    }

    fn insert_locked(&self, st: &mut State, key: BlockKey, len: u32, crc: u32, dirty: bool) {
        st.tick += 1;
        let tick = st.tick;
        // Rewriting a present block in place keeps its generation; a new entry gets a new one.
        let generation = st.blocks.get(&key).map_or(tick, |e| e.generation);
        let meta = st.meta(key.0);
        if let Some(old) = st.blocks.insert(
            key,
            BlockEntry {
                len,
                crc,
                generation,
                stamp: tick,
                verified: true,
                dirty,
            },
        ) {
            Self::account(st, &meta, old.len, old.dirty, false);
        } else {
            *st.per_object.entry(key.0).or_default() += 1;
        }
        Self::account(st, &meta, len, dirty, true);
        if dirty || !st.evictable(key.0) {
            st.policy.remove(&key);
        } else {
            st.policy.insert(key, len as u64);
        }
    }

    /// Count a block of `len` bytes in (or out of) the usage figures.
    fn account(st: &mut State, meta: &ObjectMeta, len: u32, dirty: bool, add: bool) {
        let len = len as u64;
        let adjust = |v: &mut u64| {
            if add { *v += len } else { *v -= len }
        };
        adjust(&mut st.logical);
        if meta.content.is_none() {
            adjust(&mut st.used);
        }
        if dirty {
            adjust(&mut st.dirty);
        }
        if meta.pinned {
            adjust(&mut st.pinned);
        }
    }

    /// Drop present block `key`, punching its bytes out of its file. A block a fill has reserved is not
    /// present (it is inserted when the fill ends): eviction, removal and truncation never punch under one.
    fn remove_locked(&self, st: &mut State, key: BlockKey) {
        let Some(old) = st.blocks.remove(&key) else { return };
        st.policy.remove(&key);
        let meta = st.meta(key.0);
        Self::account(st, &meta, old.len, old.dirty, false);
        if meta.content.is_none()
            && !st.holds.contains_key(&key.0)
            && let Ok(file) = self.file_locked(st, key.0)
        {
            punch_hole(&file, key.1 as u64 * self.cfg.block_size, old.len as u64);
        }
        if let Some(n) = st.per_object.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                st.per_object.remove(&key.0);
                self.emptied_locked(st, key.0);
            }
        }
    }

    /// `object` has no block left: it no longer shares a content, nor is it a whole unit (its next fill
    /// says again). A pin stays.
    fn emptied_locked(&self, st: &mut State, object: u64) {
        let Some(mut meta) = st.objects.get(&object).copied() else {
            return;
        };
        if let Some(key) = meta.content.take() {
            lock(&self.fds).files.remove(&object);
            self.release_content(st, key);
        }
        meta.whole = false;
        self.db.submit(vec![meta.mutation(object)]);
        st.set_meta(object, meta);
    }
}

/// The key of a content file's name, `LEN-CRC` in hex.
fn parse_content_name(name: &str) -> Option<ContentKey> {
    let (len, crc) = name.split_once('-')?;
    Some((u64::from_str_radix(len, 16).ok()?, u32::from_str_radix(crc, 16).ok()?))
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

mod content;
mod evict;
mod open;
#[cfg(test)]
mod tests;
