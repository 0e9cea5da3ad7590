//! The namespace's model: inodes as the core knows them (home location, attributes, dirty ranges, the
//! state of pushes), directories' listings, renames not yet settled at home, and the table of them all
//! ([`Namespace`], behind the file system's namespace lock).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::ops::Range;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use larder_home::{FileKind, HomeAttr};

use crate::record::{AttrRecord, InodeRecord};
use crate::{FsError, FsResult};

pub(crate) const ROOT: u64 = 1;
/// Index meta key: 1 while a daemon has the cache open, 0 after a clean shutdown.
pub(crate) const RUNNING: &str = "running";
/// Longest a lookup waits for a rename under way at home to settle here.
pub(super) const MOVE_WAIT: Duration = Duration::from_secs(2);

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
pub(super) const NAME_MAX: usize = 255;

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
    /// of home's: an answer home gave before it must not undo it (see `Names::update_attr`), also after
    /// the inode left memory and came back (see `Namespace::own_changes`).
    pub own: bool,
    /// What only a directory has (`None` for other kinds, and for a directory nothing is known of yet):
    /// boxed, so that the many files cost a pointer for it. See [`Inode::d`] and [`Inode::dm`].
    pub(crate) dir: Option<Box<DirState>>,
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
    /// asks, and again when home's object changed (`Names::update_attr`).
    pub xattrs: Option<Box<super::Xattrs>>,
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
    /// When a listing of it was last opened by a user (`opendir`), in ticks of [`Names::dir_clock`]: a walk
    /// of its parent revalidates it ahead only if it was, since the parent's previous listing.
    pub opened: AtomicU64,
    /// The tick of [`Names::dir_clock`] at its last listing at home.
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

    pub(crate) fn new(parent: u64, name: OsString, kind: FileKind, object: u64) -> Inode {
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
        // Its extended attributes are known from the start: none but those set here, which reach home
        // through the journal. Home is not asked for them once the object is there (`cp -a` of files just
        // made would otherwise cost a round trip each).
        node.xattrs = Some(Box::default());
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
    /// (`Changes::settle_namespace`): one look tells where home has a name and whether that may be changing.
    pub renames: HashMap<u64, Unsettled>,
    /// Inodes loaded by listings that nothing else refers to, oldest first: past [`IDLE_MAX`] of them,
    /// the oldest leave memory (see `reclaim.rs`). May name inodes gone or referred to since.
    pub idle: std::collections::VecDeque<u64>,
    /// Inodes that could have left memory while a namespace change was being made (see `Names::reclaim`):
    /// the next reclaim lets them go.
    pub deferred: Vec<u64>,
    /// While a removal gathers its changes to the index into one submission: the cache objects of what it
    /// removed (and whether a push reads them still), removed once that submission is made, so that a
    /// stop before it finds the removed file whole (see `Changes::remove`).
    pub retire_later: Option<Vec<(u64, bool)>>,
    /// Listings of directories the last run took within the validity lag of its clean stop, by when
    /// (see `Names::restore_listing`).
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

/// Most entries below a directory being moved whose path lengths are checked against home's limits (the
/// cached ones; a larger subtree is checked that far).
const MOVED_SUBTREE_MAX: usize = 100_000;

impl Namespace {
    /// The inode at `path` (below home's root) in the namespace as it is in memory, asking nothing; and the
    /// deepest directory reached on the way, with the name not found in it.
    pub(crate) fn resolve_known(&self, path: &std::path::Path) -> (Option<u64>, Option<(u64, std::ffi::OsString)>) {
        let mut ino = ROOT;
        let mut last = None;
        for part in path.components() {
            let std::path::Component::Normal(name) = part else {
                return (None, None);
            };
            let Some(&child) = self.inodes.get(&ino).and_then(|n| n.d().children.get(name)) else {
                return (None, Some((ino, name.to_os_string())));
            };
            last = Some((ino, name.to_os_string()));
            ino = child;
        }
        (Some(ino), last)
    }

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
    pub(super) fn longest_below(&self, ino: u64, dir_suffix: usize) -> usize {
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
