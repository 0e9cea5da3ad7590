//! The namespace mirror: inodes, their home locations and records, the core's shared state (`Fs`), and
//! the checks a change makes before it is taken. Lookups (`lookup`), binding names home reports
//! (`binding`), and opening and closing the core (`open`) are in their own files.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::ops::Range;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use larder_cache::{Mutation, Store};
use larder_home::{FileKind, Health, Home, HomeAttr, HomeError, StatFs, unreachable};

use crate::journal::{Journal, Op, OpKind};

use crate::key::HomeId;
use crate::pipeline::{MetaCounters, Pipeline, ReadCounters};
use crate::readahead::Readahead;
use crate::record::{AttrRecord, InodeRecord};
use crate::tier::{HomeTier, StoreTier, Tier, TierStats, Tiers};
use crate::{Attr, DirItem, Entry, FsConfig, FsError, FsResult, FsStats, OpenReply};

mod binding;
mod handles;
mod lookup;
mod open;
mod reclaim;

pub(crate) use handles::{Handle, Handles};

pub(crate) const ROOT: u64 = 1;
/// Index meta key: 1 while a daemon has the cache open, 0 after a clean shutdown.
const RUNNING: &str = "running";
/// Longest a lookup waits for a rename under way at home to settle here.
const MOVE_WAIT: Duration = Duration::from_secs(2);

/// What one try of a lookup found.
pub(crate) enum Found {
    Ino(u64),
    /// The parent's home path changed while home was asked: ask again.
    Moved,
    /// A rename above it is landing at home: ask again once it has settled.
    Moving,
    /// A rename above it was tried and failed: home's answer cannot be trusted, nor cached.
    Unsure,
    /// The parent is not listed within the validity lag: list it (one home call answers every name in
    /// it), then look again.
    List,
}
const NAME_MAX: usize = 255;

/// One inode as the core knows it.
pub(crate) struct Inode {
    /// The name home operations use: (parent inode, name).
    pub parent: u64,
    pub name: OsString,
    /// Further names of the same object at home (hard links).
    pub aliases: Vec<(u64, OsString)>,
    pub kind: FileKind,
    /// `None` for a placeholder made by a listing: kind known, attributes not yet fetched.
    pub attr: Option<HomeAttr>,
    /// Cache object of the current content version (files only).
    pub object: u64,
    pub symlink: Option<Vec<u8>>,
    /// When `attr` was last confirmed by home.
    pub checked: Option<Instant>,
    /// `checked` is the time of a change of ours (made here, or pushed and adopted), not of an answer
    /// of home's: an answer home gave before it must not undo it (see `Fs::update_attr`), also after
    /// the inode left memory and came back (see `Namespace::own_changes`).
    pub own: bool,
    /// What only a directory has (`None` for other kinds, and for a directory nothing is known of yet):
    /// boxed, so that the many files cost a pointer for it. See [`Inode::d`] and [`Inode::dm`].
    pub(super) dir: Option<Box<DirState>>,
    /// The kernel's references (lookups not yet forgotten) and the handles open on it: counted by hits
    /// under the shared namespace lock, so atomics; a decision that one is zero is taken with `ns` held
    /// alone, when no hit can count meanwhile.
    pub lookups: AtomicU64,
    pub opens: AtomicU32,
    /// Handles open for writing that the kernel serves from the cache file (passthrough): while there are
    /// any, the cache file may hold writes not adopted yet (see `data/passthrough.rs`).
    pub pt_writers: AtomicU32,
    /// How many such writers began, wrapping: a push that sees it move began without knowing of one.
    pub pt_begun: AtomicU32,
    /// The cache file's modification time (ns since the epoch) when such writers' writes were last taken
    /// in: a later one shows writes not taken in yet.
    pub pt_seen: AtomicU64,
    /// Byte ranges written locally and not yet pushed to home.
    pub dirty: Vec<Range<u64>>,
    /// Gone from home; kept while the kernel or a handle refers to it.
    pub removed: bool,
    /// Its cache object is held (never evicted) for the descriptors still open on it, which read it from
    /// the cache alone: home no longer has this version (`flusher/readers.rs`). Let go at the last close.
    pub kept_for_readers: bool,
    /// Its cache file carries the label of a file with changes not yet at home, with its path as it is
    /// now (`larder_cache::unpushed`).
    pub labelled: bool,
    /// Object whose pages the kernel's page cache holds for this inode.
    pub kernel_object: AtomicU64,
    /// Serialises pushes of this file to home. Taken before `write_lock`.
    pub flush_lock: Arc<Mutex<()>>,
    /// Serialises writes of this file, and a push's taking of dirty ranges with them.
    pub write_lock: Arc<Mutex<()>>,
    /// Changes of this file at home under way (pushes, setattr): between the call to home and the adoption
    /// of the version it produces.
    pub pushing: u32,
    /// Where home has this object now (parent inode, name): differs from `parent`/`name` while a rename
    /// made here waits in the journal; `None` while its creation does.
    pub home_loc: Option<(u64, OsString)>,
    /// Size of the home version the cached content is based on; bytes past it exist only here (`None`:
    /// all of it is at home as far as is known).
    pub home_size: Option<u64>,
    /// Home took this name for another object while ours waited to be created there.
    pub conflict: bool,
    /// The push of this file under way (or the last one, if it failed): what it sent. Persisted with the
    /// record, so that a record written meanwhile still names those ranges as not confirmed at home.
    pub attempt: Option<Box<Attempt>>,
    /// A push that was under way when the daemon stopped (from the record): the ranges it sent that were
    /// not written again since, and the size. If home's version moved on, these say whether it was ours.
    pub unconfirmed: Option<Box<Attempt>>,
    /// Its extended attributes, once known (home's, with the changes made here): `None` until something
    /// asks, and again when home's object changed (`Fs::update_attr`).
    pub xattrs: Option<Box<crate::xattr::Xattrs>>,
}

/// The state of a directory beside its attributes.
#[derive(Default)]
pub(crate) struct DirState {
    /// Known children by name.
    pub children: HashMap<OsString, u64>,
    /// When the children were last listed completely (or, for a directory made here, when it was made).
    pub listed: Option<Instant>,
    /// Names home said do not exist, and when.
    pub negatives: HashMap<OsString, Instant>,
    /// Every child of this directory is bound in memory: it was made in this daemon's life (its children
    /// were all made through it), or all its persisted entries were loaded. A name not bound is then not
    /// in the index either, and looking it up there is skipped.
    pub complete: bool,
    /// When a listing of it was last opened by a user (`opendir`), in ticks of [`Fs::dir_clock`]: a walk
    /// of its parent revalidates it ahead only if it was, since the parent's previous listing.
    pub opened: AtomicU64,
    /// The tick of [`Fs::dir_clock`] at its last listing at home.
    pub listed_tick: u64,
}

/// A rename home may have made without the cache knowing yet ([`Namespace::renames`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unsettled {
    /// The home path it renames.
    pub from: Vec<u8>,
    /// The home path it renames to; `None` for an exchange (both paths move).
    pub to: Option<Vec<u8>>,
    /// Its push is under way; `false`: tried, cut short or failed, waiting for a retry.
    pub under_way: bool,
}

impl Unsettled {
    pub(crate) fn of(op: &crate::journal::Op, under_way: bool) -> Unsettled {
        let to = match &op.kind {
            crate::journal::OpKind::Rename {
                to, exchange: false, ..
            } => Some(to.clone()),
            _ => None,
        };
        Unsettled {
            from: op.path.clone(),
            to,
            under_way,
        }
    }
}

/// Whether `path` is `from` or below it (by component); an empty `from` (the root) covers every path.
fn covers(from: &[u8], path: &[u8]) -> bool {
    path == from || (path.len() > from.len() && path.starts_with(from) && path[from.len()] == b'/') || from.is_empty()
}

/// The state of a directory nothing is known of: what [`Inode::d`] shows of any other inode.
static NO_DIR: std::sync::LazyLock<DirState> = std::sync::LazyLock::new(DirState::default);

/// What one push of a file's data sent to home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub ranges: Vec<Range<u64>>,
    pub size: u64,
    /// It sent the whole content (`0..size`): home cuts the file to nothing first, so a push cut short
    /// leaves a prefix of our bytes there, never a mix with the bytes before.
    pub whole: bool,
}

impl Attempt {
    /// What a push of `ranges` to a file of `size` bytes sent.
    pub(crate) fn sent(ranges: Vec<Range<u64>>, size: u64) -> Attempt {
        let whole = crate::ranges::whole(&ranges, size);
        Attempt { ranges, size, whole }
    }
}

impl Inode {
    /// Its directory state (empty for anything else).
    pub(crate) fn d(&self) -> &DirState {
        self.dir.as_deref().unwrap_or(&NO_DIR)
    }

    /// Its directory state, to change.
    pub(crate) fn dm(&mut self) -> &mut DirState {
        self.dir.get_or_insert_with(Box::default)
    }

    /// Forget when its children were listed: the next look lists them again.
    pub(crate) fn unlist(&mut self) {
        if let Some(d) = self.dir.as_mut() {
            d.listed = None;
        }
    }

    fn new(parent: u64, name: OsString, kind: FileKind, object: u64) -> Inode {
        Inode {
            parent,
            name: name.clone(),
            aliases: Vec::new(),
            kind,
            attr: None,
            object,
            symlink: None,
            checked: None,
            own: false,
            dir: None,
            lookups: AtomicU64::new(0),
            opens: AtomicU32::new(0),
            pt_writers: AtomicU32::new(0),
            pt_begun: AtomicU32::new(0),
            pt_seen: AtomicU64::new(0),
            dirty: Vec::new(),
            removed: false,
            kept_for_readers: false,
            labelled: false,
            kernel_object: AtomicU64::new(0),
            flush_lock: Arc::new(Mutex::new(())),
            write_lock: Arc::new(Mutex::new(())),
            pushing: 0,
            home_loc: Some((parent, name)),
            home_size: None,
            conflict: false,
            attempt: None,
            unconfirmed: None,
            xattrs: None,
        }
    }

    /// Whether the index keeps a record of it: not once it is removed (its record went with its last
    /// name, or goes at its last close), except a directory removed here only, whose record stays for the
    /// home paths through it until its removal reaches home. A record written again for a removed file
    /// would outlive it: an inode no name leads to, or, once its directory goes too, one cut off from the
    /// root.
    pub(crate) fn keeps_record(&self) -> bool {
        !self.removed || self.kind == FileKind::Dir
    }

    pub(crate) fn record(&self) -> InodeRecord {
        InodeRecord {
            parent: self.parent,
            name: self.name.as_bytes().to_vec(),
            kind: self.kind,
            attr: self.attr.as_ref().map(AttrRecord::from_attr),
            object: self.object,
            symlink: self.symlink.clone(),
            aliases: self.aliases.iter().map(|(p, n)| (*p, n.as_bytes().to_vec())).collect(),
            home_loc: self.home_loc.as_ref().map(|(p, n)| (*p, n.as_bytes().to_vec())),
            home_size: self.home_size,
            dirty: self.dirty.iter().map(|r| (r.start, r.end)).collect(),
            conflict: self.conflict,
            attempt: self
                .attempt
                .as_ref()
                .or(self.unconfirmed.as_ref())
                .map(|a| (a.ranges.iter().map(|r| (r.start, r.end)).collect(), a.size)),
            // Said apart from the ranges: those of a push cut short are only what is still comparable of
            // what it sent (none, once written again), and cannot tell whether it was of the whole file.
            attempt_whole: self
                .attempt
                .as_ref()
                .or(self.unconfirmed.as_ref())
                .is_some_and(|a| a.whole),
            xattrs: self
                .xattrs
                .as_ref()
                .map(|x| x.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        }
    }

    /// An inode made here, not at home yet.
    pub(crate) fn new_local(parent: u64, name: &OsStr, kind: FileKind, object: u64) -> Inode {
        let mut node = Inode::new(parent, name.to_os_string(), kind, object);
        node.home_loc = None;
        node.home_size = (kind == FileKind::File).then_some(0);
        if kind == FileKind::Dir {
            node.dm().complete = true;
        }
        node
    }

    /// An inode from its persisted record.
    pub(crate) fn from_record(rec: InodeRecord) -> Inode {
        let mut node = Inode::new(rec.parent, OsString::from_vec(rec.name), rec.kind, rec.object);
        node.attr = rec.attr.map(|a| a.to_attr());
        node.symlink = rec.symlink;
        node.aliases = rec
            .aliases
            .into_iter()
            .map(|(p, n)| (p, OsString::from_vec(n)))
            .collect();
        node.home_loc = rec.home_loc.map(|(p, n)| (p, OsString::from_vec(n)));
        node.home_size = rec.home_size;
        node.dirty = rec.dirty.into_iter().map(|(a, b)| a..b).collect();
        node.conflict = rec.conflict;
        node.xattrs = rec.xattrs.map(|x| Box::new(x.into_iter().collect()));
        if let Some((ranges, size)) = rec.attempt {
            let sent: Vec<Range<u64>> = ranges.into_iter().map(|(a, b)| a..b).collect();
            // Whether it reached home or not, its ranges are pushed again; only the bytes not written
            // since can tell whether it did.
            let unchanged = crate::ranges::subtract(&sent, &node.dirty);
            for r in sent {
                crate::ranges::add_range(&mut node.dirty, r);
            }
            node.unconfirmed = Some(Box::new(Attempt {
                whole: rec.attempt_whole,
                ranges: unchanged,
                size,
            }));
        }
        node
    }

    /// Where home's part of the content ends: the file's size, or less after a local truncation not yet
    /// pushed (bytes past it exist only here).
    pub(crate) fn home_end(&self) -> u64 {
        let size = self.attr.as_ref().map_or(0, |a| a.size);
        self.home_size.map_or(size, |h| h.min(size))
    }

    /// The kernel's references to it (see `lookups`).
    pub(crate) fn lookups(&self) -> u64 {
        self.lookups.load(Relaxed)
    }

    /// The handles open on it (see `opens`).
    pub(crate) fn opens(&self) -> u32 {
        self.opens.load(Relaxed)
    }

    pub(crate) fn has_name(&self, parent: u64, name: &OsStr) -> bool {
        (self.parent == parent && self.name == name) || self.aliases.iter().any(|(p, n)| *p == parent && n == name)
    }

    /// Rename one of this inode's names.
    pub(crate) fn rename_name(&mut self, from: (u64, &OsStr), to: (u64, &OsStr)) {
        if self.parent == from.0 && self.name == from.1 {
            self.parent = to.0;
            self.name = to.1.to_os_string();
        } else if let Some(a) = self.aliases.iter_mut().find(|(p, n)| *p == from.0 && n == from.1) {
            *a = (to.0, to.1.to_os_string());
        }
    }
}

#[derive(Default)]
pub(crate) struct Namespace {
    /// Boxed: an inode is over 500 bytes, and the map's spare slots and its growth would cost as much
    /// per slot.
    pub inodes: HashMap<u64, Box<Inode>>,
    /// Home identity -> inode, for objects with several names (hard links).
    pub by_id: HashMap<u64, u64>,
    pub next_ino: u64,
    pub next_object: u64,
    /// Renames home may have made without the cache knowing yet, per renamed inode. Kept beside the home
    /// locations, under the same lock, and changed together with them when a rename lands
    /// (`Fs::settle_namespace`): one look tells where home has a name and whether that may be changing.
    pub renames: HashMap<u64, Unsettled>,
    /// Inodes loaded by listings that nothing else refers to, oldest first: past [`IDLE_MAX`] of them,
    /// the oldest leave memory (see `reclaim.rs`). May name inodes gone or referred to since.
    pub idle: std::collections::VecDeque<u64>,
    /// Inodes that could have left memory while a namespace change was being made (see `Fs::reclaim`):
    /// the next reclaim lets them go.
    pub deferred: Vec<u64>,
    /// While a removal gathers its changes to the index into one submission: the cache objects of what it
    /// removed (and whether a push reads them still), removed once that submission is made, so that a
    /// stop before it finds the removed file whole (see `Fs::remove`).
    pub retire_later: Option<Vec<(u64, bool)>>,
    /// Listings of directories the last run took within the validity lag of its clean stop, by when
    /// (see `Fs::restore_listing`).
    pub restored: HashMap<u64, Instant>,
    /// Inodes that left memory within [`OWN_CHANGE_WINDOW`] of a change of ours: when that change was
    /// made, restored as their `checked` when they come back, so that an answer home gave before it and
    /// that arrives after still cannot undo it. Pruned of old entries as it grows.
    pub own_changes: HashMap<u64, Instant>,
    pub own_changes_pruned: usize,
}

/// How long after a change of ours an answer home gave before it may still arrive (home calls are
/// bounded well within it).
pub(crate) const OWN_CHANGE_WINDOW: Duration = Duration::from_secs(600);

pub(crate) use crate::data::Core;

/// The caching file system, without FUSE: three components and what joins them (design note 012).
/// - The **namespace**: names, inodes, home locations and renames in flight (`ns`, shared by hits, taken
///   alone by changes), open handles (`handles`, sharded), and the lock that serialises changes of it
///   (`mutate`); `namespace/`, `changes.rs`, `dirs.rs`.
/// - The **data path**: home, the store and the tiers between, readahead (`core`, `readahead`,
///   `read_counters`); `data/`, `residency.rs`, `tier/`.
/// - The **write-back pipeline**: the journal, its pushers, conflicts (`pipeline`); `flusher/`.
pub struct Fs {
    pub(crate) cfg: FsConfig,
    pub(crate) core: Arc<Core>,
    pub(crate) ns: RwLock<Namespace>,
    /// Open handles, sharded: a leaf under `ns`.
    pub(crate) handles: Handles,
    pub(crate) mutate: Mutex<()>,
    pub(crate) readahead: Readahead,
    pub(crate) read_counters: ReadCounters,
    pub(crate) meta_counters: MetaCounters,
    pub(crate) pipeline: Pipeline,
    pub(crate) health: Arc<Health>,
    /// Where invalidations for the kernel go (the FUSE adapter's notifier); unset without a kernel.
    pub(crate) invalidator: std::sync::OnceLock<Box<dyn Fn(crate::Invalidation) + Send + Sync>>,
    pub(crate) kernel_barrier: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Writes across a cluster: publishing this node's changes, applying the others' (design note 016).
    pub(crate) coherence: std::sync::OnceLock<Arc<dyn crate::coherence::Coherence>>,
    /// When another node's change last dropped what this node cached: an answer asked for before then
    /// may predate that change, and is not counted fresh.
    pub(crate) invalidated: std::sync::Mutex<Option<Instant>>,
    /// Listings of directories at home under way, one per directory (see [`Fs::listing`]).
    pub(crate) listing_flight: larder_util::SingleFlight<u64, ()>,
    /// Ticks for directories' listings and opens, to tell which came first (see `DirState::opened`).
    pub(crate) dir_clock: AtomicU64,
    /// Directories to revalidate ahead of a walk (see `Fs::walk_ahead`).
    pub(crate) walk_ahead: Arc<crate::dirs::WalkAhead>,
    /// Home has given a directory's own attributes with its listing ([`Home::list_with_own`]): the root,
    /// which no parent's listing carries, is then revalidated by its own listing.
    pub(crate) listings_carry_own: std::sync::atomic::AtomicBool,
    /// Files found damaged in the cache, and the background check of cache files (`integrity.rs`).
    pub(crate) integrity: crate::integrity::Integrity,
}

pub(crate) use larder_util::contention::{lock, read, write};

pub(crate) fn check_name(name: &OsStr) -> FsResult<()> {
    if name.len() > NAME_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == "." || name == ".." || name.as_bytes().iter().any(|b| *b == b'/' || *b == 0) {
        return Err(FsError::Invalid);
    }
    Ok(())
}

/// Most entries below a directory being moved whose path lengths are checked against home's limits (the
/// cached ones; a larger subtree is checked that far).
const MOVED_SUBTREE_MAX: usize = 100_000;

impl Namespace {
    /// Put `node`, loaded from its record, in memory as `ino`, with the time of a change of ours it
    /// carried when it left memory.
    pub(crate) fn insert_loaded(&mut self, ino: u64, mut node: Inode) {
        if let Some(at) = self.own_changes.remove(&ino) {
            node.checked = Some(at);
            node.own = true;
        }
        self.inodes.insert(ino, Box::new(node));
    }

    /// The longest path below `ino` that the cache knows, in bytes counted from `ino`'s own path (each
    /// entry "/name", a directory with `dir_suffix` more).
    fn longest_below(&self, ino: u64, dir_suffix: usize) -> usize {
        let mut longest = 0;
        let mut stack = vec![(ino, 0usize)];
        let mut seen = 0;
        while let Some((dir, len)) = stack.pop() {
            let Some(node) = self.inodes.get(&dir) else { continue };
            for (name, child) in &node.d().children {
                seen += 1;
                if seen > MOVED_SUBTREE_MAX {
                    return longest;
                }
                let child_len = len + 1 + name.len();
                let is_dir = self.inodes.get(child).is_some_and(|c| c.kind == FileKind::Dir);
                longest = longest.max(child_len + if is_dir { dir_suffix } else { 0 });
                if is_dir {
                    stack.push((*child, child_len));
                }
            }
        }
        longest
    }

    /// The inode `name` in `dir` is bound to in the cache, if any.
    pub fn bound(&self, dir: u64, name: &OsStr) -> Option<u64> {
        self.inodes.get(&dir).and_then(|d| d.d().children.get(name).copied())
    }

    /// Whether home may have moved `path` (or a directory above it) already, without the cache knowing
    /// yet: `Some(true)` while a rename of it is being pushed (its answer and settling are moments away),
    /// `Some(false)` if one was tried and failed and waits for a retry.
    pub fn moving(&self, path: &[u8]) -> Option<bool> {
        let mut found = None;
        for r in self.renames.values() {
            if covers(&r.from, path) {
                if r.under_way {
                    return Some(true);
                }
                found = Some(false);
            }
        }
        found
    }

    /// Where home has `path` if a rename of it (or of a directory above it) that is tried and waiting for
    /// a retry did land: after a stop that cut its push short, or an answer lost, home may have made it.
    pub fn moved_path(&self, path: &[u8]) -> Option<Vec<u8>> {
        self.renames.values().find_map(|r| {
            let to = r.to.as_ref()?;
            (!r.under_way && !r.from.is_empty() && covers(&r.from, path)).then(|| {
                let mut moved = to.clone();
                moved.extend_from_slice(&path[r.from.len()..]);
                moved
            })
        })
    }

    pub fn inode(&self, ino: u64) -> FsResult<&Inode> {
        self.inodes.get(&ino).map(|n| &**n).ok_or(FsError::BadHandle)
    }

    pub fn inode_mut(&mut self, ino: u64) -> FsResult<&mut Inode> {
        self.inodes.get_mut(&ino).map(|n| &mut **n).ok_or(FsError::BadHandle)
    }

    /// The home path of `ino`, from its chain of parents.
    pub fn path_of(&self, ino: u64) -> FsResult<PathBuf> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let node = self.inode(cur)?;
            parts.push(node.name.clone());
            cur = node.parent;
            if parts.len() > 4096 {
                return Err(FsError::Invalid);
            }
        }
        Ok(parts.iter().rev().collect())
    }

    /// Where home has `ino` now, following each ancestor's home location; `None` if it (or an ancestor) is
    /// not at home yet.
    pub fn home_path(&self, ino: u64) -> FsResult<Option<PathBuf>> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let node = self.inode(cur)?;
            let Some((p, n)) = &node.home_loc else {
                return Ok(None);
            };
            parts.push(n.clone());
            cur = *p;
            if parts.len() > 4096 {
                return Err(FsError::Invalid);
            }
        }
        Ok(Some(parts.iter().rev().collect()))
    }

    /// Whether home has `ino` (and every directory above it): [`Namespace::home_path`] without building it.
    pub(crate) fn at_home(&self, ino: u64) -> FsResult<bool> {
        let mut cur = ino;
        let mut depth = 0;
        while cur != ROOT {
            let Some((p, _)) = &self.inode(cur)?.home_loc else {
                return Ok(false);
            };
            cur = *p;
            depth += 1;
            if depth > 4096 {
                return Err(FsError::Invalid);
            }
        }
        Ok(true)
    }

    /// Home path of `name` in `parent`, if `parent` is at home.
    pub(crate) fn home_child_path(&self, parent: u64, name: &OsStr) -> FsResult<Option<PathBuf>> {
        Ok(self.home_path(parent)?.map(|p| p.join(name)))
    }

    pub(crate) fn child_path(&self, parent: u64, name: &OsStr) -> FsResult<PathBuf> {
        Ok(self.path_of(parent)?.join(name))
    }
}

impl Fs {
    /// Count an open of `ino` and give it a file handle. The kernel may keep its page cache for the file
    /// when the pages it holds are of the version cached now. Takes `ns` shared: an open of a cached file
    /// is a hit, and waits for no other.
    pub(crate) fn open_handle(&self, ns: &Namespace, ino: u64) -> FsResult<OpenReply> {
        let node = ns.inode(ino)?;
        node.opens.fetch_add(1, Relaxed);
        let keep_cache = node.kernel_object.swap(node.object, Relaxed) == node.object && node.object != 0;
        let fh = self.handles.insert(Handle::new(ino, node.object, None));
        Ok(OpenReply {
            fh,
            keep_cache,
            passthrough: false,
        })
    }

    /// A new handle of `ino`; directory handles carry the listing they were opened with.
    pub(crate) fn new_handle(&self, ns: &Namespace, ino: u64, entries: Option<Arc<Vec<DirItem>>>) -> u64 {
        let object = ns.inodes.get(&ino).map_or(0, |n| n.object);
        self.handles.insert(Handle::new(ino, object, entries))
    }

    /// Counts of the read path's tiers, nearest first (the store, ..., home).
    pub fn tier_stats(&self) -> Vec<TierStats> {
        self.core.tiers.stats()
    }

    /// Whether home is believed reachable.
    pub fn home_online(&self) -> bool {
        self.health.online()
    }

    /// How changes reach home.
    pub fn write_mode(&self) -> crate::WriteMode {
        self.cfg.write_mode
    }

    /// How durable a change made in the cache is when its call returns.
    pub fn durability(&self) -> larder_cache::Durability {
        self.core.store.db().durability()
    }

    /// Wake the flushers (home came back).
    pub fn wake(&self) {
        self.pipeline.notify();
    }

    /// Mark the blocks of a reloaded inode's unpushed ranges dirty in the store, so eviction spares them,
    /// and keep of an interrupted push only what the cache file still shows of it
    /// ([`Fs::unconfirmed_as_pushed`]).
    pub(crate) fn reclaim_dirty(&self, node: &mut Inode) {
        claim_ranges(&self.core.store, node.object, node.dirty.iter().cloned());
        self.unconfirmed_as_pushed(node);
    }

    /// A push cut short by a stop left `node.unconfirmed`: the ranges it sent that the record does not
    /// show written since, whose bytes in the cache file tell whether home has them. A write that reached
    /// the cache file and whose close never came (the daemon was killed first) changed bytes the record
    /// does not know of: blocks whose bytes are not those the index recorded at the last commit are no
    /// longer what the push sent, and are not compared.
    fn unconfirmed_as_pushed(&self, node: &mut Inode) {
        let Some(u) = node.unconfirmed.as_mut() else { return };
        if u.ranges.is_empty() || node.object == 0 {
            return;
        }
        let bs = self.core.store.block_size();
        // Up to the end of what it sent, the cache file's bytes with zeros past its end, as the index
        // took them (a cache file may end in a hole it does not store): a block is "written since" only if
        // those bytes differ from the index, not because the cache file is shorter.
        let end = u.ranges.iter().map(|r| r.end).max().unwrap_or(0);
        let len = node.attr.as_ref().map_or(end, |a| a.size.min(end));
        let changed: Vec<Range<u64>> = match self.core.store.changed_blocks(node.object, len) {
            Ok(blocks) => blocks
                .iter()
                .map(|&(i, _)| i as u64 * bs..(i as u64 + 1) * bs)
                .collect(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a cache file to check an interrupted push");
                return;
            }
        };
        if !changed.is_empty() {
            u.ranges = crate::ranges::subtract(&u.ranges, &changed);
        }
    }

    /// `ino`, reloaded from its record if it is not in memory (the flusher after a restart).
    pub(crate) fn load_inode(&self, ns: &mut Namespace, ino: u64) -> FsResult<()> {
        if ns.inodes.contains_key(&ino) {
            return Ok(());
        }
        let rec = self
            .core
            .store
            .db()
            .inode(ino)?
            .and_then(|b| InodeRecord::decode(&b))
            .ok_or(FsError::BadHandle)?;
        let mut node = Inode::from_record(rec);
        self.reclaim_dirty(&mut node);
        ns.insert_loaded(ino, node);
        self.load_home_ancestors(ns, ino);
        Ok(())
    }

    /// Load the directories on `ino`'s ways to the root, here and at home, that are not in memory: after a
    /// restart, the flusher settles objects nothing looked up, and an object moved here but not yet at home
    /// names a home parent nothing looked up. [`Namespace::home_path`] and [`Namespace::path_of`] follow
    /// them.
    pub(crate) fn load_home_ancestors(&self, ns: &mut Namespace, ino: u64) {
        let parents = |n: &Inode| [Some(n.parent), n.home_loc.as_ref().map(|(p, _)| *p)];
        let mut todo: Vec<u64> = ns
            .inodes
            .get(&ino)
            .map(|n| parents(n))
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        let mut loaded = 0;
        while let Some(dir) = todo.pop() {
            if dir == ROOT || ns.inodes.contains_key(&dir) || loaded > 4096 {
                continue;
            }
            let Ok(Some(rec)) = self
                .core
                .store
                .db()
                .inode(dir)
                .map(|r| r.and_then(|b| InodeRecord::decode(&b)))
            else {
                continue;
            };
            let node = Inode::from_record(rec);
            todo.extend(parents(&node).into_iter().flatten());
            ns.inodes.insert(dir, Box::new(node));
            loaded += 1;
        }
    }

    /// The local store.
    pub fn store(&self) -> &Arc<Store> {
        &self.core.store
    }

    /// The validity lag, which is also the kernel's attribute and entry timeout.
    pub fn validity_lag(&self) -> std::time::Duration {
        self.cfg.validity_lag
    }

    /// The time to count an answer asked for at `asked` and taken in at `now` as checked: `None` (not
    /// fresh) if another node's change dropped cached answers since it was asked.
    pub(crate) fn fresh_from(&self, asked: Instant, now: Instant) -> Option<Instant> {
        let last = *self.invalidated.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t >= asked) {
            None
        } else {
            Some(now)
        }
    }

    pub(crate) fn fresh(&self, at: Option<Instant>) -> bool {
        !self.cfg.validity_lag.is_zero() && at.is_some_and(|t| t.elapsed() < self.cfg.validity_lag)
    }

    /// Check that home can hold an object of `kind` as `name` in `parent` (`moved`: an existing inode
    /// going there, whose cached subtree must fit too). Called at the call, in every write mode, before
    /// home is asked or anything is queued: home's limits come from [`Home::limits`], asked nothing.
    pub(crate) fn check_storable(
        &self,
        ns: &Namespace,
        parent: u64,
        name: &OsStr,
        kind: FileKind,
        moved: Option<u64>,
    ) -> FsResult<()> {
        let limits = self.core.home.limits();
        let path = ns.child_path(parent, name)?;
        let below = match moved {
            Some(ino) if kind == FileKind::Dir => ns.longest_below(ino, limits.dir_suffix),
            _ => 0,
        };
        limits.check(&path, kind, below).map_err(|e| match e {
            HomeError::Unsupported(what) => FsError::HomeCannotHold(what),
            e => FsError::Home(e),
        })
    }

    /// Check that home can hold a hard link to `ino` as `name` in `parent`.
    pub(crate) fn check_link(&self, ns: &Namespace, ino: u64, parent: u64, name: &OsStr) -> FsResult<()> {
        if !self.core.home.limits().hard_links {
            return Err(FsError::HomeCannotHold("hard links"));
        }
        self.check_storable(ns, parent, name, ns.inode(ino)?.kind, None)
    }

    /// Check that home can hold what a rename makes: the moved object (and its cached subtree) at its new
    /// path, and with `exchange` the other one at the old path.
    pub(crate) fn check_rename(
        &self,
        ns: &Namespace,
        from: (u64, &OsStr),
        to: (u64, &OsStr),
        flags: larder_home::RenameFlags,
    ) -> FsResult<()> {
        if flags.exchange && !self.core.home.limits().rename_exchange {
            // As renameat2(2) answers where the file system cannot exchange.
            return Err(FsError::Invalid);
        }
        let moved = |dir: u64, name: &OsStr| -> FsResult<Option<u64>> {
            let node = ns.inode(dir)?;
            Ok(node.d().children.get(name).copied())
        };
        if let Some(src) = moved(from.0, from.1)? {
            self.check_storable(ns, to.0, to.1, ns.inode(src)?.kind, Some(src))?;
        }
        if flags.exchange
            && let Some(dst) = moved(to.0, to.1)?
        {
            self.check_storable(ns, from.0, from.1, ns.inode(dst)?.kind, Some(dst))?;
        }
        Ok(())
    }

    pub(crate) fn read_only(&self) -> bool {
        !self.cfg.write_mode.accepts_changes()
    }

    pub(crate) fn writable(&self) -> FsResult<()> {
        if self.read_only() {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    pub(crate) fn persist(&self, ns: &Namespace, ino: u64) {
        if let Some(node) = ns.inodes.get(&ino).filter(|n| n.keeps_record()) {
            self.core
                .store
                .db()
                .submit(vec![Mutation::PutInode(ino, node.record().encode())]);
        }
    }

    pub(crate) fn attr_of(&self, ns: &Namespace, ino: u64) -> FsResult<Attr> {
        let node = ns.inode(ino)?;
        let a = node.attr.as_ref().ok_or(FsError::NotFound)?;
        // Writers the kernel serves from the cache file: their writes not adopted yet show in its size and
        // times.
        let (size, mtime, ctime) = match self.written_directly(node) {
            Some((len, Some(m))) => (a.size.max(len), a.mtime.max(m), a.ctime.max(m)),
            Some((len, None)) => (a.size.max(len), a.mtime, a.ctime),
            None => (a.size, a.mtime, a.ctime),
        };
        Ok(Attr {
            ino,
            kind: node.kind,
            size,
            // Local changes not yet at home: what the cache copy takes (a sparse file's holes take nothing),
            // or home's figure if larger (parts of the file not cached here).
            blocks: if node.dirty.is_empty() && node.home_size.is_none() {
                a.blocks
            } else if node.home_size == Some(0) {
                // Nothing of it at home: the cache file holds the pages written here and nothing else (no
                // stat of the cache file for every answer about a file being written).
                a.blocks.max(pages_of(&node.dirty))
            } else {
                a.blocks.max(self.core.store.allocated_blocks(node.object))
            },
            perm: a.perm,
            nlink: if node.removed && node.kind != FileKind::Dir {
                0
            } else {
                a.nlink
            },
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            atime: a.atime,
            mtime,
            ctime,
        })
    }

    pub(crate) fn entry(&self, ns: &Namespace, ino: u64) -> FsResult<Entry> {
        Ok(Entry {
            attr: self.attr_of(ns, ino)?,
            ttl: self.cfg.validity_lag,
        })
    }

    pub(crate) fn alloc_object(&self, ns: &mut Namespace) -> u64 {
        let object = ns.next_object;
        ns.next_object += 1;
        self.core
            .store
            .db()
            .submit(vec![Mutation::PutMeta("next_object", ns.next_object)]);
        object
    }

    /// Tell the kernel (if one is attached) to drop what it caches of something.
    pub(crate) fn invalidate(&self, what: crate::Invalidation) {
        if let Some(f) = self.invalidator.get() {
            f(what);
        }
    }

    /// Wait until the invalidations sent so far reached the kernel, if the daemon can tell (bounded).
    pub(crate) fn kernel_barrier(&self) {
        if let Some(f) = self.kernel_barrier.get() {
            f();
        }
    }

    /// How to wait until the invalidations sent so far reached the kernel: see [`Fs::kernel_barrier`].
    pub fn set_kernel_barrier(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.kernel_barrier.set(f);
    }

    /// Send the kernel's invalidations to `f` (it must not block: it is called with locks held).
    pub fn set_invalidator(&self, f: Box<dyn Fn(crate::Invalidation) + Send + Sync>) {
        let _ = self.invalidator.set(f);
    }

    /// Capacity of home.
    pub fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.core.home.statfs()?)
    }

    /// Home calls the namespace made: stats of one name, listings, revalidations by stat (three counters
    /// read, nothing walked: sampled every second for status rates).
    pub fn home_meta_calls(&self) -> [u64; 3] {
        let c = &self.meta_counters;
        [
            c.lookups.load(Relaxed),
            c.listings.load(Relaxed),
            c.revalidations.load(Relaxed),
        ]
    }

    /// Figures for status output.
    pub fn stats(&self) -> FsStats {
        let ns = read(&self.ns);
        FsStats {
            inodes: ns.inodes.len() as u64,
            inodes_reclaimed: self.meta_counters.reclaimed.load(Relaxed),
            inodes_reloaded: self.meta_counters.reloaded.load(Relaxed),
            inodes_trimmed: self.meta_counters.trimmed.load(Relaxed),
            open_handles: self.handles.len() as u64,
            dirty_files: ns.inodes.values().filter(|n| !n.dirty.is_empty()).count() as u64,
            readahead_blocks: self.readahead.submitted(),
            reads: self.read_counters.reads.load(std::sync::atomic::Ordering::Relaxed),
            read_bytes: self.read_counters.bytes.load(std::sync::atomic::Ordering::Relaxed),
            read_seconds: self.read_counters.nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9,
            bytes_from_cache: self
                .read_counters
                .cache_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            bytes_from_home: self.read_counters.home_bytes.load(std::sync::atomic::Ordering::Relaxed),
            home_waits: self.read_counters.home_waits.load(std::sync::atomic::Ordering::Relaxed),
            listings_for_lookups: self
                .meta_counters
                .listings_for_lookups
                .load(std::sync::atomic::Ordering::Relaxed),
            listings_for_revalidation: self
                .meta_counters
                .listings_for_revalidation
                .load(std::sync::atomic::Ordering::Relaxed),
            listings_ahead: self.meta_counters.listings_ahead.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_under_way_covers_the_paths_below_its_source() {
        let mut ns = Namespace::default();
        assert_eq!(ns.moving(b"a/b/c"), None, "nothing renamed");
        let unsettled = |from: &[u8], under_way| Unsettled {
            from: from.to_vec(),
            to: Some(b"x/y".to_vec()),
            under_way,
        };
        ns.renames.insert(7, unsettled(b"a/b", true));
        assert_eq!(ns.moving(b"a/b"), Some(true));
        assert_eq!(ns.moving(b"a/b/c"), Some(true));
        assert_eq!(ns.moving(b"a/bc"), None, "a sibling whose name starts the same");
        assert_eq!(ns.moving(b"a"), None, "the directory above it stays");
        assert_eq!(ns.moved_path(b"a/b/c"), None, "under way: no answer to trust yet");
        ns.renames.insert(7, unsettled(b"a/b", false));
        assert_eq!(ns.moving(b"a/b/c"), Some(false), "tried, failed, waiting");
        assert_eq!(
            ns.moved_path(b"a/b/c").as_deref(),
            Some(&b"x/y/c"[..]),
            "where it is if it landed"
        );
        assert_eq!(ns.moved_path(b"a/b").as_deref(), Some(&b"x/y"[..]));
        assert_eq!(ns.moved_path(b"a/bc"), None);
        ns.renames.insert(8, unsettled(b"a", true));
        assert_eq!(ns.moving(b"a/b/c"), Some(true), "one under way above wins");
        ns.renames.clear();
        assert_eq!(ns.moving(b"a/b/c"), None);
    }
}

#[cfg(test)]
pub(crate) mod hit_tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use larder_cache::{Db, Eviction, StoreConfig};
    use larder_home::PosixHome;

    use super::*;

    /// A core over a POSIX home holding `dir/f` (10 KiB), cached in `cache`.
    pub(crate) fn core(home: &Path, cache: &Path) -> Arc<Fs> {
        std::fs::create_dir_all(home.join("dir")).unwrap();
        std::fs::write(home.join("dir/f"), vec![7u8; 10 << 10]).unwrap();
        std::fs::create_dir_all(cache).unwrap();
        let db = Db::open(&cache.join("index.redb")).unwrap();
        let store = Store::open(
            StoreConfig {
                dir: cache.join("objects"),
                block_size: 4096,
                limit: 64 << 20,
                high_watermark: 0.95,
                low_watermark: 0.9,
                dedup: true,
                eviction: Eviction::S3Fifo,
            },
            db,
        )
        .unwrap();
        let home: Arc<dyn Home> = Arc::new(PosixHome::new(home, Some(Duration::from_secs(10))).unwrap());
        let cfg = FsConfig {
            validity_lag: Duration::from_secs(3600),
            conflicts_dir: cache.join("conflicts"),
            ..FsConfig::default()
        };
        Arc::new(Fs::new(home, Arc::new(store), cfg).unwrap())
    }

    /// A core over the test home (see [`core`]) in a temporary directory, with `dir` and its file `dir/f`
    /// looked up: (the directory, the core, `dir`'s inode, `f`'s inode).
    pub(crate) fn dir_f() -> (tempfile::TempDir, Arc<Fs>, u64, u64) {
        let tmp = tempfile::tempdir().unwrap();
        let fs = core(&tmp.path().join("home"), &tmp.path().join("cache"));
        let dir = fs.lookup(ROOT, OsStr::new("dir")).unwrap().attr.ino;
        let ino = fs.lookup(dir, OsStr::new("f")).unwrap().attr.ino;
        (tmp, fs, dir, ino)
    }

    #[test]
    fn a_page_two_written_ranges_touch_counts_once() {
        assert_eq!(super::pages_of(&[0..10, 20..30]), 8);
        assert_eq!(super::pages_of(&[0..10, 4096..4097]), 16);
        assert_eq!(super::pages_of(&[100..5000, 6000..9000]), 24);
        assert_eq!(super::pages_of(&[]), 0);
    }

    #[test]
    fn hits_proceed_while_another_thread_holds_the_namespace_shared() {
        // Warm: the names, the attributes, the listing and the file's blocks are cached.
        let (_tmp, fs, dir, ino) = dir_f();
        let fh = fs.open(ino, libc::O_RDONLY).unwrap().fh;
        assert_eq!(fs.read(fh, 0, 10 << 10).unwrap(), vec![7u8; 10 << 10]);
        let dh = fs.opendir(dir).unwrap();
        fs.releasedir(dh);
        let hits_before = fs.store().stats().hits;

        // Another reader holds the namespace (as a long hit would): every hit below must still be served.
        let held = read(&fs.ns);
        let (tx, rx) = mpsc::channel();
        let worker = {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let run = || -> FsResult<Vec<u8>> {
                    let found = fs.lookup(dir, OsStr::new("f"))?.attr.ino;
                    assert_eq!(found, ino);
                    fs.lookup(dir, OsStr::new("f"))?;
                    fs.forget(ino, 1);
                    fs.getattr(ino)?;
                    let fh = fs.open(ino, libc::O_RDONLY)?.fh;
                    let data = fs.read(fh, 4096, 100)?;
                    fs.release(fh)?;
                    let dh = fs.opendir(dir)?;
                    assert!(fs.readdir(dh, 0)?.iter().any(|(_, e)| e.name == "f"));
                    fs.releasedir(dh);
                    Ok(data)
                };
                tx.send(run()).unwrap();
            })
        };
        let answer = rx.recv_timeout(Duration::from_secs(10));
        drop(held);
        worker.join().unwrap();
        let data = answer.expect("a hit waited for a reader of the namespace").unwrap();
        assert_eq!(data, vec![7u8; 100]);
        assert!(
            fs.store().stats().hits > hits_before,
            "the read was not served from the cache"
        );
        // The hits counted their kernel references and handles: three lookups of `f` and one forget, the
        // second open released.
        let ns = read(&fs.ns);
        assert_eq!(ns.inode(ino).unwrap().lookups(), 2);
        assert_eq!(ns.inode(ino).unwrap().opens(), 1, "the first handle is still open");
        drop(ns);
        fs.release(fh).unwrap();
        assert_eq!(read(&fs.ns).inode(ino).unwrap().opens(), 0);
    }

    #[test]
    fn an_interrupted_push_keeps_what_it_sent_of_a_cache_file_ending_in_a_hole() {
        let (_tmp, fs, _, ino) = dir_f();
        // `f` (10 KiB of 7s) written in its last block, then extended by truncation to 12,000 bytes.
        let fh = fs.open(ino, libc::O_RDWR).unwrap().fh;
        fs.write(fh, 8192, &[9u8; 100]).unwrap();
        let size = 12_000;
        let grow = larder_home::SetAttr {
            size: Some(size),
            ..Default::default()
        };
        fs.setattr(ino, &grow).unwrap();
        fs.flush(fh).unwrap();
        fs.release(fh).unwrap();
        // The cache file ends where its bytes do: the zeros after them are a hole it does not store.
        let object = read(&fs.ns).inode(ino).unwrap().object;
        fs.core.store.file(object).unwrap().set_len(10 << 10).unwrap();
        // A push sent the whole file and was cut short: nothing in the cache file changed since.
        let mut ns = write(&fs.ns);
        let node = ns.inode_mut(ino).unwrap();
        node.unconfirmed = Some(Box::new(Attempt::sent(std::iter::once(0..size).collect(), size)));
        fs.unconfirmed_as_pushed(node);
        assert_eq!(
            node.unconfirmed.as_ref().unwrap().ranges,
            vec![0..size],
            "what the push sent is still the cache file's bytes"
        );
    }
}

/// 512-byte blocks the 4 KiB pages touched by `ranges` take (ranges in order and apart, as dirty ranges
/// are: two may still touch one page, counted once).
fn pages_of(ranges: &[Range<u64>]) -> u64 {
    const PAGE: u64 = 4096;
    let (mut pages, mut counted_to) = (0, 0);
    for r in ranges {
        let (first, end) = ((r.start / PAGE).max(counted_to), r.end.div_ceil(PAGE));
        if end > first {
            pages += end - first;
            counted_to = end;
        }
    }
    pages * (PAGE / 512)
}

/// Mark the blocks of `object` under `ranges` dirty in the store (those it holds): written here and not
/// confirmed at home, they are the only copy and are not evicted.
pub(crate) fn claim_ranges(store: &Store, object: u64, ranges: impl IntoIterator<Item = Range<u64>>) {
    let bs = store.block_size();
    for r in ranges.into_iter().filter(|r| !r.is_empty()) {
        for index in r.start / bs..=(r.end - 1) / bs {
            store.reclaim((object, index as u32));
        }
    }
}
