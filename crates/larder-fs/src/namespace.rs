//! The namespace mirror: inodes, lookups, listings and the calls that change names at home.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::ops::Range;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use larder_cache::{Mutation, Store};
use larder_home::{FileKind, Health, Home, HomeAttr, HomeError, StatFs, Version, unreachable};

use crate::journal::{Journal, Op, OpKind};

use crate::key::HomeId;
use crate::readahead::Readahead;
use crate::record::{AttrRecord, InodeRecord};
use crate::tier::{HomeTier, StoreTier, Tier, TierStats, Tiers};
use crate::{Attr, DirItem, Entry, FsConfig, FsError, FsResult, FsStats, OpenReply};

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
    /// Known children by name (directories).
    pub children: HashMap<OsString, u64>,
    /// When the children were last listed completely, and home's directory version then.
    pub listed: Option<(Instant, Version)>,
    /// Names home said do not exist, and when.
    pub negatives: HashMap<OsString, Instant>,
    pub lookups: u64,
    pub opens: u32,
    /// Byte ranges written locally and not yet pushed to home.
    pub dirty: Vec<Range<u64>>,
    /// Gone from home; kept while the kernel or a handle refers to it.
    pub removed: bool,
    /// Object whose pages the kernel's page cache holds for this inode.
    pub kernel_object: u64,
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
    pub attempt: Option<Attempt>,
    /// A push that was under way when the daemon stopped (from the record): the ranges it sent that were
    /// not written again since, and the size. If home's version moved on, these say whether it was ours.
    pub unconfirmed: Option<Attempt>,
}

/// What one push of a file's data sent to home.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub ranges: Vec<Range<u64>>,
    pub size: u64,
}

impl Inode {
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
            children: HashMap::new(),
            listed: None,
            negatives: HashMap::new(),
            lookups: 0,
            opens: 0,
            dirty: Vec::new(),
            removed: false,
            kernel_object: 0,
            flush_lock: Arc::new(Mutex::new(())),
            write_lock: Arc::new(Mutex::new(())),
            pushing: 0,
            home_loc: Some((parent, name)),
            home_size: None,
            conflict: false,
            attempt: None,
            unconfirmed: None,
        }
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
        }
    }

    /// An inode made here, not at home yet.
    pub(crate) fn new_local(parent: u64, name: &OsStr, kind: FileKind, object: u64) -> Inode {
        let mut node = Inode::new(parent, name.to_os_string(), kind, object);
        node.home_loc = None;
        node.home_size = (kind == FileKind::File).then_some(0);
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
        if let Some((ranges, size)) = rec.attempt {
            let sent: Vec<Range<u64>> = ranges.into_iter().map(|(a, b)| a..b).collect();
            // Whether it reached home or not, its ranges are pushed again; only the bytes not written
            // since can tell whether it did.
            let unchanged = crate::data::subtract(&sent, &node.dirty);
            for r in sent {
                crate::data::add_range(&mut node.dirty, r);
            }
            node.unconfirmed = Some(Attempt {
                ranges: unchanged,
                size,
            });
        }
        node
    }

    fn has_name(&self, parent: u64, name: &OsStr) -> bool {
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

/// An open file or directory.
pub(crate) struct Handle {
    pub ino: u64,
    /// The cache object (content version) the file had when this handle opened it. A handle reads that
    /// version only: once revalidation moves the file to another, its reads fail with `ESTALE`.
    pub object: u64,
    /// Directory handles: the listing as it was at opendir.
    pub entries: Option<Arc<Vec<DirItem>>>,
    /// Where the next sequential read would start, the readahead window, and where the blocks queued
    /// for this handle end.
    pub next_offset: u64,
    pub window: u64,
    pub ra_end: u64,
    /// The kernel reads this handle's object from its cache file directly: the store holds it.
    pub held: bool,
}

#[derive(Default)]
pub(crate) struct Namespace {
    pub inodes: HashMap<u64, Inode>,
    /// Home identity -> inode, for objects with several names (hard links).
    pub by_id: HashMap<u64, u64>,
    pub handles: HashMap<u64, Handle>,
    pub next_ino: u64,
    pub next_object: u64,
    pub next_fh: u64,
}

pub(crate) use crate::tier::FetchResult;

/// Shared by the file system and its readahead workers.
pub(crate) struct Core {
    pub home: Arc<dyn Home>,
    pub store: Arc<Store>,
    /// The read path: the store, any tiers between, home; one fetch per unit at a time.
    pub tiers: Tiers,
    /// The home's name in portable keys.
    pub home_id: HomeId,
    /// Files at most this large are fetched whole.
    pub small_file_threshold: u64,
}

/// The caching file system, without FUSE.
pub struct Fs {
    pub(crate) cfg: FsConfig,
    pub(crate) core: Arc<Core>,
    pub(crate) ns: Mutex<Namespace>,
    pub(crate) mutate: Mutex<()>,
    pub(crate) readahead: Readahead,
    /// Changes not yet at home. Taken after `ns` when both are needed (lock order: design note 011).
    pub(crate) journal: Mutex<Journal>,
    /// Woken when the journal gains work, finishes an op, or home comes back.
    pub(crate) journal_cv: Condvar,
    pub(crate) health: Arc<Health>,
    /// Drain requests under way: push regardless of the sync lag.
    pub(crate) urgent: AtomicU64,
    /// Reads served: count, bytes and nanoseconds spent in them (for the efficiency metrics).
    pub(crate) reads: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) read_nanos: AtomicU64,
    /// Bytes handed to readers per tier (the local cache, home), and blocks readers waited for home.
    pub(crate) cache_bytes: AtomicU64,
    pub(crate) home_bytes: AtomicU64,
    pub(crate) home_waits: AtomicU64,
    pub(crate) stopping: AtomicBool,
    pub(crate) conflicts: Mutex<Vec<crate::Conflict>>,
    pub(crate) flushers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Where invalidations for the kernel go (the FUSE adapter's notifier); unset without a kernel.
    pub(crate) invalidator: std::sync::OnceLock<Box<dyn Fn(crate::Invalidation) + Send + Sync>>,
}

pub(crate) use larder_cache::contention::lock;

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
    /// The longest path below `ino` that the cache knows, in bytes counted from `ino`'s own path (each
    /// entry "/name", a directory with `dir_suffix` more).
    fn longest_below(&self, ino: u64, dir_suffix: usize) -> usize {
        let mut longest = 0;
        let mut stack = vec![(ino, 0usize)];
        let mut seen = 0;
        while let Some((dir, len)) = stack.pop() {
            let Some(node) = self.inodes.get(&dir) else { continue };
            for (name, child) in &node.children {
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

    pub fn inode(&self, ino: u64) -> FsResult<&Inode> {
        self.inodes.get(&ino).ok_or(FsError::BadHandle)
    }

    pub fn inode_mut(&mut self, ino: u64) -> FsResult<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(FsError::BadHandle)
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

    /// Count an open of `ino` and give it a file handle. The kernel may keep its page cache for the file
    /// when the pages it holds are of the version cached now.
    pub fn open_handle(&mut self, ino: u64) -> FsResult<OpenReply> {
        let node = self.inode_mut(ino)?;
        node.opens += 1;
        let keep_cache = node.kernel_object == node.object && node.object != 0;
        node.kernel_object = node.object;
        let fh = self.new_handle(ino, None);
        Ok(OpenReply {
            fh,
            keep_cache,
            passthrough: false,
        })
    }

    /// A new handle of `ino`; directory handles carry the listing they were opened with.
    pub fn new_handle(&mut self, ino: u64, entries: Option<Arc<Vec<DirItem>>>) -> u64 {
        let fh = self.next_fh;
        self.next_fh += 1;
        let object = self.inodes.get(&ino).map_or(0, |n| n.object);
        self.handles.insert(
            fh,
            Handle {
                ino,
                object,
                entries,
                next_offset: 0,
                window: 0,
                ra_end: 0,
                held: false,
            },
        );
        fh
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
    /// A file system over `home`, caching in `store`. Loads the persisted namespace, drops cache objects
    /// nothing refers to, and checks that home's root is reachable.
    pub fn new(home: Arc<dyn Home>, store: Arc<Store>, cfg: FsConfig) -> FsResult<Fs> {
        Fs::with_health(home, store, cfg, Health::new())
    }

    /// As [`Fs::new`], sharing `health` with the home's health layer: while it says home is offline, the
    /// cached namespace is served and changes wait in the journal.
    pub fn with_health(home: Arc<dyn Home>, store: Arc<Store>, cfg: FsConfig, health: Arc<Health>) -> FsResult<Fs> {
        Fs::with_tiers(home, store, cfg, health, Vec::new())
    }

    /// As [`Fs::with_health`], reading through `between` (nearest first) after the store and before home.
    pub fn with_tiers(
        home: Arc<dyn Home>,
        store: Arc<Store>,
        cfg: FsConfig,
        health: Arc<Health>,
        between: Vec<Arc<dyn Tier>>,
    ) -> FsResult<Fs> {
        let db = store.db().clone();
        let mut ns = Namespace {
            next_ino: db.meta("next_ino")?.unwrap_or(ROOT + 1),
            next_object: db.meta("next_object")?.unwrap_or(1),
            next_fh: 1,
            ..Namespace::default()
        };
        // Set while a daemon has the cache open, cleared by `shutdown`: found set, the last one did not
        // stop cleanly (killed, or the machine went down).
        let unclean = db.meta(RUNNING)? == Some(1);
        let (live, dropped_records) = collect_live(&db)?;
        let (orphan_objects, orphan_files) = store.retain_objects(&live);
        let mut ops = Vec::new();
        db.for_each_op(|seq, bytes| match Op::decode(bytes) {
            Some(op) => ops.push((seq, op)),
            None => tracing::error!(seq, "a journal record cannot be read; it is kept and skipped"),
        })?;
        let data_ops = ops.iter().filter(|(_, op)| op.kind == OpKind::Data).count();
        let interrupted = ops.iter().filter(|(_, op)| op.attempted).count();
        let journal = Journal::load(ops);
        let mut root = Inode::new(ROOT, OsString::new(), FileKind::Dir, 0);
        if let Some(rec) = db.inode(ROOT)?.and_then(|b| InodeRecord::decode(&b)) {
            root.attr = rec.attr.map(|a| a.to_attr());
        }
        match home.stat(std::path::Path::new("")) {
            Ok(a) if a.kind != FileKind::Dir => return Err(FsError::NotDir),
            Ok(a) => {
                root.attr = Some(a);
                root.checked = Some(Instant::now());
            }
            // Changes are waiting and the cache knows the root: start offline and serve the cache.
            Err(e) if unreachable(&e) && !journal.is_empty() && root.attr.is_some() => {
                health.set_offline(&e);
            }
            Err(e) => return Err(e.into()),
        }
        let pending = journal.len();
        if unclean {
            tracing::warn!(
                pending_changes = pending,
                files_with_unpushed_data = data_ops,
                pushes_interrupted = interrupted,
                orphan_objects_removed = orphan_objects,
                orphan_files_removed = orphan_files,
                unreachable_records_removed = dropped_records,
                "recovered after an unclean stop (the daemon was killed or the machine went down): {pending} \
                 queued changes kept, to be pushed in order ({data_ops} files with unpushed data; {interrupted} \
                 changes interrupted mid-push are repeated, their 'already done' answers accepted); removed \
                 {orphan_objects} cache objects and {orphan_files} cache files nothing refers to, and \
                 {dropped_records} index records cut off from the root"
            );
        } else if pending > 0 {
            tracing::info!(
                pending_changes = pending,
                "{pending} changes left queued by the last run are kept, to be pushed in order"
            );
        }
        root.lookups = 1;
        db.submit(vec![
            Mutation::PutInode(ROOT, root.record().encode()),
            Mutation::PutMeta(RUNNING, 1),
        ]);
        ns.inodes.insert(ROOT, root);
        let store_limit = store.stats().bytes_limit;
        let mut tiers: Vec<Arc<dyn Tier>> = vec![Arc::new(StoreTier::new(store.clone()))];
        tiers.extend(between);
        tiers.push(Arc::new(HomeTier::new(home.clone())));
        let core = Arc::new(Core {
            home_id: HomeId::new(cfg.home_id.clone().unwrap_or_else(|| home.describe())),
            home,
            store,
            tiers: Tiers::new(tiers),
            // In a cache too small for it, fetching a whole file to use one block of it only churns.
            small_file_threshold: cfg.small_file_threshold.min(store_limit / 8),
        });
        let readahead = Readahead::new(core.clone(), cfg.ingest_streams);
        let conflicts = crate::flusher::load_conflicts(&cfg.conflicts_dir);
        Ok(Fs {
            cfg,
            core,
            ns: Mutex::new(ns),
            mutate: Mutex::new(()),
            readahead,
            journal: Mutex::new(journal),
            journal_cv: Condvar::new(),
            health,
            urgent: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            read_nanos: AtomicU64::new(0),
            cache_bytes: AtomicU64::new(0),
            home_bytes: AtomicU64::new(0),
            home_waits: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            conflicts: Mutex::new(conflicts),
            flushers: Mutex::new(Vec::new()),
            invalidator: std::sync::OnceLock::new(),
        })
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

    /// Wake the flushers (home came back).
    pub fn wake(&self) {
        self.journal_cv.notify_all();
    }

    /// Mark the blocks of a reloaded inode's unpushed ranges dirty in the store, so eviction spares them.
    pub(crate) fn reclaim_dirty(&self, node: &Inode) {
        let bs = self.core.store.block_size();
        for r in &node.dirty {
            if r.is_empty() {
                continue;
            }
            for index in r.start / bs..=(r.end - 1) / bs {
                self.core.store.claim((node.object, index as u32));
            }
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
        let node = Inode::from_record(rec);
        self.reclaim_dirty(&node);
        ns.inodes.insert(ino, node);
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
            .map(parents)
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
            ns.inodes.insert(dir, node);
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
            Ok(node.children.get(name).copied())
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
        self.cfg.write_mode == crate::WriteMode::ReadOnly
    }

    pub(crate) fn writable(&self) -> FsResult<()> {
        if self.read_only() {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    pub(crate) fn persist(&self, ns: &Namespace, ino: u64) {
        if let Some(node) = ns.inodes.get(&ino) {
            self.core
                .store
                .db()
                .submit(vec![Mutation::PutInode(ino, node.record().encode())]);
        }
    }

    pub(crate) fn attr_of(&self, ns: &Namespace, ino: u64) -> FsResult<Attr> {
        let node = ns.inode(ino)?;
        let a = node.attr.as_ref().ok_or(FsError::NotFound)?;
        Ok(Attr {
            ino,
            kind: node.kind,
            size: a.size,
            // Local changes not yet at home: what the cache copy takes (a sparse file's holes take nothing),
            // or home's figure if larger (parts of the file not cached here).
            blocks: if node.dirty.is_empty() && node.home_size.is_none() {
                a.blocks
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
            mtime: a.mtime,
            ctime: a.ctime,
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

    /// Record what home said about `ino` when asked at `asked`. A content version other than the cached one makes the cached
    /// data unreachable (a new object), unless local changes are pending: those are never dropped.
    pub(crate) fn update_attr(&self, ns: &mut Namespace, ino: u64, attr: HomeAttr, asked: Instant) {
        let now = Instant::now();
        let mut new_object = None;
        if self.queued(ino) {
            // Changes of it wait in the journal: the cache's attributes stand until they reached home.
            if let Some(node) = ns.inodes.get_mut(&ino) {
                node.checked = Some(now);
            }
            return;
        }
        {
            let Some(node) = ns.inodes.get(&ino) else { return };
            // An answer home gave before our own latest change of this object must not undo it: the
            // version it carries is older than the one we adopted.
            if node.checked.is_some_and(|c| c > asked) && node.attr.as_ref().is_some_and(|a| a.version != attr.version)
            {
                return;
            }
            if node.kind == FileKind::File
                && node.dirty.is_empty()
                && node.attr.as_ref().is_some_and(|a| a.version != attr.version)
            {
                new_object = Some(node.object);
            }
        }
        let mut refetch = None;
        if let Some(old) = new_object {
            let object = self.alloc_object(ns);
            // A pinned file's new version is pinned too, and fetched now.
            if self.core.store.replace_object(old, object) {
                refetch = Some(object);
            }
            if let Some(node) = ns.inodes.get_mut(&ino) {
                node.object = object;
                node.home_size = None;
            }
            self.invalidate(crate::Invalidation::Inode(ino));
        }
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        node.checked = Some(now);
        if node.attr.as_ref().is_some_and(|a| a.version != attr.version) {
            node.symlink = None;
        }
        let mut attr = attr;
        if !node.dirty.is_empty()
            && let Some(local) = &node.attr
        {
            // Pending local changes keep the local size and mtime, and the version they were made on: a
            // change at home meanwhile is then a conflict when they are pushed, not silently overwritten.
            attr.size = local.size;
            attr.mtime = local.mtime;
            attr.version = local.version.clone();
        }
        if node.attr.as_ref() != Some(&attr) || new_object.is_some() {
            node.attr = Some(attr);
            self.persist(ns, ino);
        }
        note_identity(ns, ino);
        if let Some(object) = refetch
            && let Ok(Some(path)) = ns.home_path(ino)
            && let Some(attr) = ns.inodes.get(&ino).and_then(|n| n.attr.clone())
        {
            self.readahead.submit(crate::readahead::Job {
                object,
                blocks: 0..attr.size.div_ceil(self.core.store.block_size()) as u32,
                path,
                version: attr.version,
                home_end: attr.size,
                epoch: self.core.store.epoch(object),
            });
        }
    }

    /// Record attributes that result from this node's own change at home: the cached data stays valid.
    pub(crate) fn adopt_attr(&self, ns: &mut Namespace, ino: u64, attr: HomeAttr) {
        if let Some(node) = ns.inodes.get_mut(&ino) {
            let mut attr = attr;
            if !node.dirty.is_empty()
                && let Some(local) = &node.attr
            {
                attr.size = local.size;
                attr.mtime = local.mtime;
            }
            node.attr = Some(attr);
            node.checked = Some(Instant::now());
            self.persist(ns, ino);
            note_identity(ns, ino);
        }
    }

    /// The inode for `name` in `parent`, creating it (or reloading its persisted record) if needed.
    pub(crate) fn bind_child(
        &self,
        ns: &mut Namespace,
        parent: u64,
        name: &OsStr,
        kind: FileKind,
        attr: Option<HomeAttr>,
        asked: Instant,
    ) -> FsResult<u64> {
        if let Some(&ino) = ns.inode(parent)?.children.get(name) {
            let node = ns.inode(ino)?;
            // A placeholder from a listing that turns out to be another name of a known object.
            let placeholder_of_link = node.attr.is_none()
                && node.kind == kind
                && attr
                    .as_ref()
                    .and_then(|a| linked_inode(ns, kind, a))
                    .is_some_and(|other| other != ino);
            if node.kind == kind && !placeholder_of_link {
                if let Some(attr) = attr {
                    self.update_attr(ns, ino, attr, asked);
                }
                return Ok(ino);
            }
            self.gone_at_home(ns, parent, name);
        }
        let db = self.core.store.db().clone();
        // Another name of an object already known here (a hard link made at home).
        if let Some(a) = &attr
            && let Some(ino) = linked_inode(ns, kind, a)
        {
            let node = ns.inode_mut(ino)?;
            node.aliases.push((parent, name.to_os_string()));
            let p = ns.inode_mut(parent)?;
            p.children.insert(name.to_os_string(), ino);
            p.negatives.remove(name);
            db.submit(vec![Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino)]);
            self.persist(ns, ino);
            if let Some(attr) = attr {
                self.update_attr(ns, ino, attr, asked);
            }
            return Ok(ino);
        }
        let mut ino = None;
        if let Some(old) = db.dentry(parent, name.as_bytes())? {
            if let Some(node) = ns.inodes.get_mut(&old) {
                if node.kind == kind && !node.removed {
                    if !node.has_name(parent, name) {
                        node.aliases.push((parent, name.to_os_string()));
                    }
                    ino = Some(old);
                }
            } else if let Some(rec) = db.inode(old)?.and_then(|b| InodeRecord::decode(&b))
                && rec.kind == kind
            {
                let node = Inode::from_record(rec);
                self.reclaim_dirty(&node);
                if node.has_name(parent, name) {
                    ns.inodes.insert(old, node);
                    self.load_home_ancestors(ns, old);
                    ino = Some(old);
                }
            }
        }
        let ino = match ino {
            Some(ino) => ino,
            None => {
                let ino = ns.next_ino;
                ns.next_ino += 1;
                let object = if kind == FileKind::File {
                    self.alloc_object(ns)
                } else {
                    0
                };
                ns.inodes
                    .insert(ino, Inode::new(parent, name.to_os_string(), kind, object));
                db.submit(vec![
                    Mutation::PutMeta("next_ino", ns.next_ino),
                    Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino),
                ]);
                self.persist(ns, ino);
                ino
            }
        };
        let p = ns.inode_mut(parent)?;
        p.children.insert(name.to_os_string(), ino);
        p.negatives.remove(name);
        if let Some(attr) = attr {
            self.update_attr(ns, ino, attr, asked);
        }
        Ok(ino)
    }

    /// `name` left `parent` at home: forget it, dropping its data once nothing refers to it.
    pub(crate) fn detach(&self, ns: &mut Namespace, parent: u64, name: &OsStr) {
        self.unbind(ns, parent, name, true);
    }

    /// `name` in `parent` is not what the cache (and so the kernel) had: home no longer has it, or has
    /// another object there. The kernel is told to forget its entry.
    pub(crate) fn gone_at_home(&self, ns: &mut Namespace, parent: u64, name: &OsStr) {
        self.detach(ns, parent, name);
        self.invalidate(crate::Invalidation::Entry(parent, name.to_os_string()));
    }

    /// Tell the kernel (if one is attached) to drop what it caches of something.
    pub(crate) fn invalidate(&self, what: crate::Invalidation) {
        if let Some(f) = self.invalidator.get() {
            f(what);
        }
    }

    /// Send the kernel's invalidations to `f` (it must not block: it is called with locks held).
    pub fn set_invalidator(&self, f: Box<dyn Fn(crate::Invalidation) + Send + Sync>) {
        let _ = self.invalidator.set(f);
    }

    /// `name` left `parent`, at home already (`at_home`) or only here so far (home still has it there until
    /// the change is pushed).
    pub(crate) fn unbind(&self, ns: &mut Namespace, parent: u64, name: &OsStr, at_home: bool) {
        let Some(ino) = ns.inodes.get_mut(&parent).and_then(|p| p.children.remove(name)) else {
            return;
        };
        self.core
            .store
            .db()
            .submit(vec![Mutation::DelDentry(parent, name.as_bytes().to_vec())]);
        self.drop_name(ns, parent, name, ino, at_home);
    }

    /// One name of `ino` is gone: if it has others (hard links), it lives on under them.
    fn drop_name(&self, ns: &mut Namespace, parent: u64, name: &OsStr, ino: u64, at_home: bool) {
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        if !node.aliases.is_empty() {
            if node.parent == parent && node.name == name {
                let (p, n) = node.aliases.remove(0);
                node.parent = p;
                node.name = n;
                if at_home
                    && node
                        .home_loc
                        .as_ref()
                        .is_some_and(|(hp, hn)| *hp == parent && hn == name)
                {
                    // Home reaches the object through its remaining name now.
                    node.home_loc = Some((node.parent, node.name.clone()));
                }
            } else {
                node.aliases.retain(|(p, n)| !(*p == parent && n == name));
            }
            // Its link count and ctime changed at home.
            node.checked = None;
            self.persist(ns, ino);
            return;
        }
        self.forget_subtree(ns, ino, at_home);
    }

    fn forget_subtree(&self, ns: &mut Namespace, ino: u64, at_home: bool) {
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        node.removed = true;
        let children: Vec<(OsString, u64)> = node.children.drain().collect();
        let (opens, lookups, object) = (node.opens, node.lookups, node.object);
        let id = node.attr.as_ref().map_or(0, |a| a.id);
        if ns.by_id.get(&id) == Some(&ino) {
            ns.by_id.remove(&id);
        }
        // A directory removed here only is still on the home path of objects moved out of it whose renames
        // wait in the journal: it stays (in memory and on disk) until its removal reaches home.
        let kept = !at_home && node.kind == FileKind::Dir;
        let db = self.core.store.db().clone();
        for (name, child) in children {
            db.submit(vec![Mutation::DelDentry(ino, name.as_bytes().to_vec())]);
            self.drop_name(ns, ino, &name, child, at_home);
        }
        if opens == 0 && !kept {
            if object != 0 {
                self.core.store.remove_object(object);
            }
            db.submit(vec![Mutation::DelInode(ino)]);
            if lookups == 0 {
                ns.inodes.remove(&ino);
            }
        }
    }

    /// Whether the entry `name` of `parent` is answered here, not by home: it has queued changes, or
    /// `parent` itself is not at home yet.
    pub(crate) fn local_name(&self, ns: &Namespace, parent: u64, name: &OsStr) -> FsResult<bool> {
        if lock(&self.journal).pinned(parent, name.as_bytes()) {
            return Ok(true);
        }
        Ok(!ns.at_home(parent)?)
    }

    /// Whether `ino`'s attributes are the cache's to say: changes of it are queued.
    pub(crate) fn queued(&self, ino: u64) -> bool {
        lock(&self.journal).has(ino)
    }

    /// The child `name` of `parent` from the persisted namespace (after a restart, before anything looked
    /// it up), bound in memory.
    pub(crate) fn load_child(&self, ns: &mut Namespace, parent: u64, name: &OsStr) -> FsResult<Option<u64>> {
        if let Some(&ino) = ns.inode(parent)?.children.get(name) {
            return Ok(Some(ino));
        }
        let Some(ino) = self.core.store.db().dentry(parent, name.as_bytes())? else {
            return Ok(None);
        };
        if !ns.inodes.contains_key(&ino) && self.load_inode(ns, ino).is_err() {
            return Ok(None);
        }
        let node = ns.inode_mut(ino)?;
        if node.removed {
            return Ok(None);
        }
        if !node.has_name(parent, name) {
            node.aliases.push((parent, name.to_os_string()));
        }
        ns.inode_mut(parent)?.children.insert(name.to_os_string(), ino);
        Ok(Some(ino))
    }

    /// Look `name` up in `parent`; counts one kernel reference on success.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        {
            // A hit (see `find_once`) is answered and counted in one critical section.
            let mut ns = lock(&self.ns);
            if let Some(child) = self.fresh_child(&ns, parent, name) {
                ns.inode_mut(child)?.lookups += 1;
                return self.entry(&ns, child);
            }
        }
        let ino = self.find(parent, name)?;
        let mut ns = lock(&self.ns);
        ns.inode_mut(ino)?.lookups += 1;
        self.entry(&ns, ino)
    }

    /// The inode of `name` in `parent`, asking home when the cache cannot say; counts no reference.
    pub(crate) fn find(&self, parent: u64, name: &OsStr) -> FsResult<u64> {
        check_name(name)?;
        // A directory can move at home while home is asked (a queued rename lands): then ask again, once
        // the rename has settled here.
        let deadline = Instant::now() + MOVE_WAIT;
        loop {
            match self.find_once(parent, name)? {
                Found::Ino(ino) => return Ok(ino),
                Found::Moved => {}
                Found::Moving if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                // Home's answer cannot be trusted while a rename above the name is unsettled: the cache's
                // (its persisted entries included) is the answer.
                Found::Moving | Found::Unsure => {
                    let mut ns = lock(&self.ns);
                    return self.load_child(&mut ns, parent, name)?.ok_or(FsError::NotFound);
                }
            }
        }
    }

    /// Whether home's "not found" for `asked` (the home path of `ino`, or of `name` in it) may be a move
    /// of it or a directory above it not yet settled here: [`Found::Moved`] if the home path is another
    /// now, [`Found::Moving`] if a rename that covers it was attempted and has not concluded.
    pub(crate) fn moved_meanwhile(
        &self,
        ns: &Namespace,
        ino: u64,
        name: Option<&OsStr>,
        asked: &Path,
    ) -> FsResult<Option<Found>> {
        let now = match name {
            Some(n) => ns.home_child_path(ino, n)?,
            None => ns.home_path(ino)?,
        };
        if now.as_deref() != Some(asked) {
            return Ok(Some(Found::Moved));
        }
        Ok(match lock(&self.journal).moving(asked.as_os_str().as_bytes()) {
            Some(true) => Some(Found::Moving),
            // Failed, waiting for a retry: home may or may not have it; the cache's view stands.
            Some(false) => Some(Found::Unsure),
            None => None,
        })
    }

    /// A hit: `name` in directory `parent` is known, and was checked within the validity lag (or changed
    /// here). Nothing else is asked.
    fn fresh_child(&self, ns: &Namespace, parent: u64, name: &OsStr) -> Option<u64> {
        let child = *ns.inodes.get(&parent)?.children.get(name)?;
        let c = ns.inodes.get(&child)?;
        (c.attr.is_some() && (self.fresh(c.checked) || !c.dirty.is_empty())).then_some(child)
    }

    /// One try of [`Fs::find`].
    fn find_once(&self, parent: u64, name: &OsStr) -> FsResult<Found> {
        let (path, known) = {
            let mut ns = lock(&self.ns);
            let p = ns.inode(parent)?;
            if p.kind != FileKind::Dir {
                return Err(FsError::NotDir);
            }
            if let Some(child) = self.fresh_child(&ns, parent, name) {
                return Ok(Found::Ino(child));
            }
            let local = self.local_name(&ns, parent, name)?;
            let p = ns.inode(parent)?;
            let listed_fresh = self.fresh(p.listed.as_ref().map(|l| l.0));
            let negative_fresh = self.fresh(p.negatives.get(name).copied());
            if let Some(&child) = p.children.get(name) {
                let c = ns.inode(child)?;
                if c.attr.is_some() && (local || self.fresh(c.checked) || !c.dirty.is_empty() || self.queued(child)) {
                    return Ok(Found::Ino(child));
                }
            } else if local {
                return self
                    .load_child(&mut ns, parent, name)?
                    .ok_or(FsError::NotFound)
                    .map(Found::Ino);
            } else if listed_fresh || negative_fresh {
                return Err(FsError::NotFound);
            }
            let known = ns.inode(parent)?.children.get(name).copied();
            match ns.home_child_path(parent, name)? {
                Some(path) => (path, known),
                None => return Err(FsError::NotFound),
            }
        };
        let asked = Instant::now();
        match self.core.home.stat(&path) {
            Ok(attr) => {
                let mut ns = lock(&self.ns);
                if self.local_name(&ns, parent, name)? {
                    // Changed here while home was asked: the cache's answer stands.
                    return cached_child(&ns, parent, name);
                }
                self.bind_child(&mut ns, parent, name, attr.kind, Some(attr), asked)
                    .map(Found::Ino)
            }
            Err(HomeError::NotFound) => {
                let mut ns = lock(&self.ns);
                if self.local_name(&ns, parent, name)? {
                    return cached_child(&ns, parent, name);
                }
                if let Some(found) = self.moved_meanwhile(&ns, parent, Some(name), &path)? {
                    return Ok(found);
                }
                self.gone_at_home(&mut ns, parent, name);
                if let Ok(p) = ns.inode_mut(parent) {
                    p.negatives.insert(name.to_os_string(), Instant::now());
                }
                Err(FsError::NotFound)
            }
            Err(e) if unreachable(&e) => {
                // Home away: what the cache knows is the answer. Where changes are journaled, a name it
                // does not know looks absent, so that it can be created here (the kernel looks a name up
                // before creating it; a clash with a name home turns out to have is a conflict at push).
                // That answer is remembered neither here (no negative entry) nor by the kernel (an error
                // reply), so the name is asked again once home is back. Without a journal nothing can be
                // made while home is away: the honest answer is home's error.
                let mut ns = lock(&self.ns);
                // A name known before a restart is in the index, if not in memory yet.
                let known = match known {
                    Some(child) => Some(child),
                    None => self.load_child(&mut ns, parent, name)?,
                };
                match known {
                    Some(child) if ns.inodes.get(&child).is_some_and(|c| c.attr.is_some()) => Ok(Found::Ino(child)),
                    None if self.cfg.write_mode.journaled() => Err(FsError::NotFound),
                    None if ns.inode(parent)?.listed.is_some() => Err(FsError::NotFound),
                    _ => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The kernel dropped `n` references to `ino`.
    pub fn forget(&self, ino: u64, n: u64) {
        let mut ns = lock(&self.ns);
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        node.lookups = node.lookups.saturating_sub(n);
        if node.lookups == 0 && node.opens == 0 && node.removed && ino != ROOT && !self.queued(ino) {
            ns.inodes.remove(&ino);
        }
    }

    /// Attributes of `ino`, revalidated against home once the validity lag has passed.
    pub fn getattr(&self, ino: u64) -> FsResult<Entry> {
        let path = {
            let ns = lock(&self.ns);
            let node = ns.inode(ino)?;
            if node.attr.is_some()
                && (self.fresh(node.checked) || node.removed || !node.dirty.is_empty() || self.queued(ino))
            {
                return self.entry(&ns, ino);
            }
            match ns.home_path(ino)? {
                Some(p) => p,
                None => return self.entry(&ns, ino),
            }
        };
        self.revalidate(ino, &path)
    }

    /// Ask home for the attributes of `ino` at `path` and record them.
    pub(crate) fn revalidate(&self, ino: u64, path: &std::path::Path) -> FsResult<Entry> {
        let asked = Instant::now();
        match self.core.home.stat(path) {
            Ok(attr) => {
                let mut ns = lock(&self.ns);
                if ns.inode(ino)?.kind != attr.kind {
                    return Err(FsError::NotFound);
                }
                self.update_attr(&mut ns, ino, attr, asked);
                self.entry(&ns, ino)
            }
            Err(HomeError::NotFound) => {
                let mut ns = lock(&self.ns);
                let node = ns.inode(ino)?;
                if node.opens > 0 && node.attr.is_some() {
                    // Still open here: keep serving what we have.
                    return self.entry(&ns, ino);
                }
                let (parent, name) = (node.parent, node.name.clone());
                // Changed here, or moved at home while home was asked (a queued rename landed).
                if self.queued(ino)
                    || self.local_name(&ns, parent, &name)?
                    || self.moved_meanwhile(&ns, ino, None, path)?.is_some()
                {
                    return self.entry(&ns, ino);
                }
                if ino != ROOT {
                    self.gone_at_home(&mut ns, parent, &name);
                }
                Err(FsError::NotFound)
            }
            Err(e) if unreachable(&e) => {
                let ns = lock(&self.ns);
                if ns.inode(ino)?.attr.is_some() {
                    return self.entry(&ns, ino);
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Read the target of a symlink.
    pub fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let path = {
            let ns = lock(&self.ns);
            let node = ns.inode(ino)?;
            if node.kind != FileKind::Symlink {
                return Err(FsError::Invalid);
            }
            if let Some(t) = &node.symlink
                && (self.fresh(node.checked) || self.queued(ino) || !self.health.online())
            {
                return Ok(t.clone());
            }
            match ns.home_path(ino)? {
                Some(p) => p,
                None => return node.symlink.clone().ok_or(FsError::NotFound),
            }
        };
        self.revalidate(ino, &path)?;
        let target = self.core.home.readlink(&path)?;
        let mut ns = lock(&self.ns);
        if let Ok(node) = ns.inode_mut(ino) {
            node.symlink = Some(target.clone());
        }
        self.persist(&ns, ino);
        Ok(target)
    }

    /// Capacity of home.
    pub fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.core.home.statfs()?)
    }

    /// Figures for status output.
    pub fn stats(&self) -> FsStats {
        let ns = lock(&self.ns);
        FsStats {
            inodes: ns.inodes.len() as u64,
            open_handles: ns.handles.len() as u64,
            dirty_files: ns.inodes.values().filter(|n| !n.dirty.is_empty()).count() as u64,
            readahead_blocks: self.readahead.submitted(),
            reads: self.reads.load(std::sync::atomic::Ordering::Relaxed),
            read_bytes: self.read_bytes.load(std::sync::atomic::Ordering::Relaxed),
            read_seconds: self.read_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9,
            bytes_from_cache: self.cache_bytes.load(std::sync::atomic::Ordering::Relaxed),
            bytes_from_home: self.home_bytes.load(std::sync::atomic::Ordering::Relaxed),
            home_waits: self.home_waits.load(std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Make everything durable before the process exits.
    pub fn shutdown(&self) -> FsResult<()> {
        self.stop_flushers();
        let handles: Vec<u64> = lock(&self.ns).handles.keys().copied().collect();
        for fh in handles {
            let _ = self.release(fh);
        }
        let db = self.core.store.db();
        db.submit(vec![Mutation::PutMeta(RUNNING, 0)]);
        db.close()?;
        Ok(())
    }
}

/// The cache objects referred to by persisted inodes reachable from the root; records not reachable (a
/// crash between removing a directory and its children) are dropped.
fn collect_live(db: &larder_cache::Db) -> FsResult<(HashSet<u64>, usize)> {
    let mut parents = HashMap::new();
    let mut objects = HashMap::new();
    let mut names = HashMap::new();
    db.for_each_inode(|ino, bytes| {
        if let Some(rec) = InodeRecord::decode(bytes) {
            parents.insert(ino, rec.parent);
            names.insert(ino, rec.name);
            if rec.object != 0 {
                objects.insert(ino, rec.object);
            }
        }
    })?;
    let mut reachable: HashMap<u64, bool> = HashMap::new();
    reachable.insert(ROOT, true);
    let inos: Vec<u64> = parents.keys().copied().collect();
    for ino in inos {
        let mut chain = Vec::new();
        let mut cur = ino;
        let ok = loop {
            if let Some(&r) = reachable.get(&cur) {
                break r;
            }
            if chain.len() > 4096 || chain.contains(&cur) {
                break false;
            }
            chain.push(cur);
            match parents.get(&cur) {
                Some(&p) => cur = p,
                None => break false,
            }
        };
        for c in chain {
            reachable.insert(c, ok);
        }
    }
    let mut dead = Vec::new();
    for (ino, ok) in &reachable {
        if !ok {
            dead.push(Mutation::DelInode(*ino));
            if let (Some(p), Some(n)) = (parents.get(ino), names.get(ino)) {
                dead.push(Mutation::DelDentry(*p, n.clone()));
            }
        }
    }
    let dropped = reachable.values().filter(|ok| !**ok).count();
    db.submit(dead);
    let live = objects
        .iter()
        .filter(|(ino, _)| reachable.get(ino) == Some(&true))
        .map(|(_, o)| *o)
        .collect();
    Ok((live, dropped))
}

/// The cache's answer for `name` in `parent`.
fn cached_child(ns: &Namespace, parent: u64, name: &OsStr) -> FsResult<Found> {
    ns.inode(parent)?
        .children
        .get(name)
        .copied()
        .ok_or(FsError::NotFound)
        .map(Found::Ino)
}

/// Remember which inode holds a home object that has several names.
fn note_identity(ns: &mut Namespace, ino: u64) {
    let Some(node) = ns.inodes.get(&ino) else { return };
    if let Some(a) = &node.attr
        && node.kind != FileKind::Dir
        && a.id != 0
        && (a.nlink > 1 || !node.aliases.is_empty())
    {
        ns.by_id.insert(a.id, ino);
    }
}

/// The inode already holding the home object `attr` describes, if it is a hard link known here.
fn linked_inode(ns: &Namespace, kind: FileKind, attr: &HomeAttr) -> Option<u64> {
    if kind == FileKind::Dir || attr.id == 0 || attr.nlink < 2 {
        return None;
    }
    let ino = *ns.by_id.get(&attr.id)?;
    let node = ns.inodes.get(&ino)?;
    let same = node.kind == kind && !node.removed && node.attr.as_ref().is_some_and(|a| a.id == attr.id);
    same.then_some(ino)
}
