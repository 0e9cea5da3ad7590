//! The store's index in memory, in shards by object: each shard's blocks with their checksums and
//! state, its objects' state beside them, the epochs that tell a fill it came too late, and the open
//! cache files of its objects.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::ops::RangeInclusive;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Condvar, Mutex};

use super::BlockKey;
use crate::db::Mutation;

/// Content-store key: length and crc32c of a whole small file. Equal keys are compared byte for byte before
/// a file shares a content; a collision is simply not shared.
/// (32 bits of length: only files of at most 4 GiB share contents, so that the key, and an object's state
/// beside its blocks, stay small.)
pub(super) type ContentKey = (u32, u32);

pub(super) const WHOLE: u32 = 1;
pub(super) const PINNED: u32 = 2;
pub(super) const SHARED: u32 = 4;
pub(super) const WRITTEN_UNSEEN: u32 = 8;

/// Per-object state beside the blocks.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ObjectMeta {
    /// Fetched, kept and evicted as one unit (a small file over several blocks).
    pub(super) whole: bool,
    /// Never evicted.
    pub(super) pinned: bool,
    /// Stored in the content store (no file of its own).
    pub(super) content: Option<ContentKey>,
    /// Its cache file may hold bytes the index has not taken in: set while writers the store does not see
    /// (the kernel, through passthrough) are open, and from a write through the store until the index has
    /// its blocks again (a commit), so that after a crash what they wrote is looked for
    /// ([`Store::unseen_writes`]) rather than taken for damage: a block whose bytes differ from their
    /// checksum in an object not so marked was damaged after it was written (`verify.rs`).
    pub(super) written_unseen: bool,
}

impl ObjectMeta {
    /// Nothing beside the blocks: no need to keep it.
    pub(super) fn plain(&self) -> bool {
        !self.whole && !self.pinned && self.content.is_none() && !self.written_unseen
    }

    pub(super) fn mutation(&self, object: u64) -> Mutation {
        if self.plain() {
            return Mutation::DelObjectMeta(object);
        }
        let flags = (self.whole as u32 * WHOLE)
            | (self.pinned as u32 * PINNED)
            | (self.content.is_some() as u32 * SHARED)
            | (self.written_unseen as u32 * WRITTEN_UNSEEN);
        let (len, crc) = self.content.unwrap_or((0, 0));
        Mutation::PutObject {
            object,
            flags,
            len: len as u64,
            crc,
        }
    }
}

/// One present block: 20 bytes, since a cache holds millions.
pub(super) struct BlockEntry {
    pub(super) len: u32,
    pub(super) crc: u32,
    /// Set when the entry is inserted, never changed: a read that finds the same generation after its
    /// unlocked `pread` read bytes that were not evicted or replaced meanwhile. (Ticks of the shard, which
    /// wrap: only a reader stalled for 2^32 of its shard's changes could mistake one for another.)
    pub(super) generation: u32,
    /// Set each time the entry is written (inserted, rewritten in place, re-indexed): indexing records a
    /// block's checksum only if no other record of it came between its look and its record.
    pub(super) stamp: u32,
    pub(super) verified: bool,
    pub(super) dirty: bool,
    /// A dirty block whose checksum was taken by an adoption of what a writer the store does not see
    /// wrote ([`Store::adopt_written`]): those bytes were in the file when it was read, so a commit need not
    /// read them again. Cleared by every other record of the block, a write's included (a commit racing a
    /// write through the store may record the bytes from before the write's `pwrite` lands).
    pub(super) adopted: bool,
    /// Block 0 of an object whose only state beside its blocks is that it shares a content, and whose
    /// one block is that content (its length and checksum are the content's key): the object has no
    /// entry in `objects` then, which saves most of a small file's memory with dedup on. Set and cleared
    /// by `ShardState::set_meta` only; any change of the object's blocks first moves it back to
    /// `objects` (`ShardState::materialize`).
    pub(super) shared: bool,
}

impl BlockEntry {
    /// The state a [`BlockEntry::shared`] mark stands for: a whole unit sharing the content this block is.
    pub(super) fn shared_meta(&self) -> ObjectMeta {
        ObjectMeta {
            whole: true,
            content: Some((self.len, self.crc)),
            ..ObjectMeta::default()
        }
    }
}

/// Shards of the store's state. A power of two: [`shard_of`] takes the top bits of a hash.
pub(super) const SHARD_BITS: u32 = 4;
pub(super) const SHARDS: usize = 1 << SHARD_BITS;

/// The shard of `object`: a multiplicative (Fibonacci) hash, so that sequential ids spread over all shards.
pub(super) fn shard_of(object: u64) -> usize {
    (object.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SHARD_BITS)) as usize
}

/// Hits a shard buffers before the one that fills the buffer passes them to the policy.
pub(super) const TOUCH_BATCH: usize = 64;

/// A shard's block map is built again, its nodes full, once it has grown by an eighth since it was last
/// built (and holds at least this many blocks).
pub(super) const REBUILD_MIN: usize = 4096;

/// The state of the objects of one shard.
pub(super) struct ShardState {
    /// Ordered by key, so the blocks of one object are one range.
    pub(super) blocks: BTreeMap<BlockKey, BlockEntry>,
    /// The size of `blocks` when it was last built in one go ([`ShardState::block_added`]).
    pub(super) blocks_built: usize,
    /// Bumped by every local change of an object (write, truncate, removal): a fill fetched before the
    /// change must not land after it.
    pub(super) epochs: HashMap<u64, u64>,
    pub(super) objects: HashMap<u64, ObjectMeta>,
    /// Objects the kernel reads directly (FUSE passthrough), with the number of handles doing so: their
    /// blocks are not evicted, and no block dropped while they are held has its hole punched.
    pub(super) holds: HashMap<u64, u32>,
    /// Objects with writers the store does not see, with how many (see [`ObjectMeta::written_unseen`]).
    pub(super) unseen_writers: HashMap<u64, u32>,
    /// Objects that ever had such writers: the kernel may have written their cache file with direct I/O,
    /// and a collision of that with buffered I/O leaves an error on the file that the next `fsync` of any
    /// descriptor of it reports. Their file is unlinked when they go, never kept as a spare (`spare.rs`),
    /// so that no later object inherits that error.
    pub(super) written_by_kernel: HashSet<u64>,
    /// Objects written here whose cache file holds bytes the index has not taken in yet, with a count of
    /// the writes made since they were marked (see [`ObjectMeta::written_unseen`], `verify.rs`).
    pub(super) unindexed: HashMap<u64, u64>,
    /// Dirty blocks whose bytes failed their checksum: reads of them fail, and nothing re-indexes them,
    /// until they are written whole again, cut off or removed (`verify.rs`).
    pub(super) damaged: BTreeSet<BlockKey>,
    /// Source of generations and stamps; they are only ever compared for one block, so per shard.
    pub(super) tick: u32,
    /// Blocks reserved while their bytes change outside the lock: a fill's block until the fill ends, a
    /// dropped block until its hole is punched ([`Punches`]). Absent from `blocks` meanwhile, and touched by
    /// no other fill nor local change (those wait, on `Shard::filled`).
    pub(super) filling: BTreeSet<BlockKey>,
    /// Objects a local change is waiting on or working through outside the lock (a truncate's `set_len`),
    /// with how many: no fill reserves a block of theirs meanwhile (it would be dropped anyway, its epoch
    /// being about to move), so that a waiter waits only for the fills that were under way, and for the
    /// punches of blocks that were present (no fill brings a new one in meanwhile).
    pub(super) changing: HashMap<u64, u32>,
    /// Threads waiting on `Shard::filled`: a fill wakes them only if there are any.
    pub(super) waiting: u32,
    /// Hits not yet passed to the policy (see the module doc).
    pub(super) touched: Vec<BlockKey>,
}

impl ShardState {
    pub(super) fn new() -> ShardState {
        ShardState {
            blocks: BTreeMap::new(),
            blocks_built: 0,
            epochs: HashMap::new(),
            objects: HashMap::new(),
            holds: HashMap::new(),
            unseen_writers: HashMap::new(),
            written_by_kernel: HashSet::new(),
            unindexed: HashMap::new(),
            damaged: BTreeSet::new(),
            tick: 0,
            filling: BTreeSet::new(),
            changing: HashMap::new(),
            waiting: 0,
            touched: Vec::with_capacity(TOUCH_BATCH),
        }
    }

    /// A block was added to `blocks`. Blocks come in by ascending key (new objects take higher ids), and a
    /// B-tree filled that way splits each full node in two and never fills the left half again: its nodes
    /// stay a little over half full, nearly twice the memory of a map built in one go (78 against 42 bytes
    /// a block). So once the map has grown by an eighth since it was last built, it is built again from its
    /// own entries in order, which fills every node: a copy of each entry per eight added, and at most an
    /// eighth of the map in half-full nodes. (Under the shard's lock: a few milliseconds at 60,000 blocks a
    /// shard, a million in the store.)
    pub(super) fn block_added(&mut self) {
        let n = self.blocks.len();
        if n >= REBUILD_MIN && n >= self.blocks_built + self.blocks_built / 8 {
            self.blocks = std::mem::take(&mut self.blocks).into_iter().collect();
            self.blocks_built = n;
        }
    }

    /// The change epoch of `object`.
    pub(super) fn epoch(&self, object: u64) -> u64 {
        self.epochs.get(&object).copied().unwrap_or(0)
    }

    /// Whether a fill holds a reservation on one of `blocks` of `object`.
    pub(super) fn filling_any(&self, object: u64, blocks: &RangeInclusive<u32>) -> bool {
        self.filling
            .range((object, *blocks.start())..=(object, *blocks.end()))
            .next()
            .is_some()
    }

    pub(super) fn mark_changing(&mut self, object: u64) {
        *self.changing.entry(object).or_default() += 1;
    }

    pub(super) fn unmark_changing(&mut self, object: u64) {
        if let Some(n) = self.changing.get_mut(&object) {
            *n -= 1;
            if *n == 0 {
                self.changing.remove(&object);
            }
        }
    }

    pub(super) fn meta(&self, object: u64) -> ObjectMeta {
        if let Some(m) = self.objects.get(&object) {
            return *m;
        }
        match self.blocks.get(&(object, 0)) {
            Some(e) if e.shared => e.shared_meta(),
            _ => ObjectMeta::default(),
        }
    }

    /// Keep `meta` as `object`'s state: nothing if it is plain; the mark on its one block if all it says
    /// is that it is a whole unit sharing the content that block is (see [`BlockEntry::shared`]); else an
    /// entry of `objects`.
    pub(super) fn set_meta(&mut self, object: u64, meta: ObjectMeta) {
        let implicit = meta.whole
            && !meta.pinned
            && !meta.written_unseen
            && meta.content.is_some_and(|(len, crc)| {
                self.blocks
                    .get(&(object, 0))
                    .is_some_and(|e| e.len == len && e.crc == crc)
                    && self.blocks.range((object, 1)..=(object, u32::MAX)).next().is_none()
            });
        if let Some(e) = self.blocks.get_mut(&(object, 0)) {
            e.shared = implicit;
        }
        if meta.plain() || implicit {
            self.objects.remove(&object);
        } else {
            self.objects.insert(object, meta);
        }
    }

    /// Before a block of `object` is added, changed or dropped: a state kept as the mark on its one block
    /// moves to `objects`, where it does not depend on the blocks.
    pub(super) fn materialize(&mut self, object: u64) {
        if let Some(e) = self.blocks.get_mut(&(object, 0))
            && e.shared
        {
            e.shared = false;
            let meta = e.shared_meta();
            self.objects.insert(object, meta);
        }
    }

    /// Keep `object`'s state in its smallest form (after its blocks changed).
    pub(super) fn compact_meta(&mut self, object: u64) {
        let meta = self.meta(object);
        self.set_meta(object, meta);
    }

    /// The objects with a block present, each once, in order.
    pub(super) fn objects_with_blocks(&self) -> impl Iterator<Item = u64> + '_ {
        let mut last = None;
        self.blocks.keys().filter_map(move |&(o, _)| {
            let new = last != Some(o);
            last = Some(o);
            new.then_some(o)
        })
    }

    /// Whether `object` has a block present.
    pub(super) fn has_blocks(&self, object: u64) -> bool {
        self.blocks_of(object).next().is_some()
    }

    /// The present blocks of `object`, in order.
    pub(super) fn blocks_of(&self, object: u64) -> std::collections::btree_map::Range<'_, BlockKey, BlockEntry> {
        self.blocks.range((object, 0)..=(object, u32::MAX))
    }

    /// Whether the policy may evict the clean blocks of `object`: not while it is pinned or held.
    pub(super) fn evictable(&self, object: u64) -> bool {
        !self.meta(object).pinned && !self.holds.contains_key(&object)
    }
}

/// One shard: its state, and what is paired with it.
pub(super) struct Shard {
    pub(super) state: Mutex<ShardState>,
    /// Paired with `state`: signalled when a fill or a hole punch a thread waits on releases its
    /// reservation.
    pub(super) filled: Condvar,
    /// Blocks of this shard dropped so far (each counted under `state`, in the critical section that takes
    /// it out of `blocks`, so before its bytes are punched out, which happens after that lock is let go): a
    /// read that sees the same count before and after its unlocked `pread` read no punched bytes, and needs
    /// no second look under the lock.
    pub(super) removals: AtomicU64,
}

impl Shard {
    pub(super) fn new(state: ShardState) -> Shard {
        Shard {
            state: Mutex::new(state),
            filled: Condvar::new(),
            removals: AtomicU64::new(0),
        }
    }
}

/// The content store's sharing counts.
#[derive(Default)]
pub(super) struct Contents {
    /// Files sharing each content, and their sum.
    pub(super) refs: HashMap<ContentKey, u32>,
    pub(super) shares: u64,
}

pub(super) const MAX_OPEN_FILES: usize = 256;

/// Open cache files of one shard's objects, at most `MAX_OPEN_FILES / SHARDS`.
#[derive(Default)]
pub(super) struct FdCache {
    pub(super) files: HashMap<u64, (Arc<File>, u64)>,
    pub(super) tick: u64,
}
