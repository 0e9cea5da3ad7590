//! The namespace component ([`Names`], design note 012): the mirror of home's names, and the checks a
//! change makes before it is taken. The inodes and their table are the model (`model`); lookups
//! (`lookup`), binding names home reports (`binding`), reclaiming inodes (`reclaim`), listings (`dirs`),
//! extended attributes (`xattr`) and the namespace in a cluster (`cluster`) are in their own files.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use larder_cache::{Mutation, Store};
use larder_home::{FileKind, Health, HomeAttr, HomeError, unreachable};

use crate::pipeline::{MetaCounters, Pipeline};
use crate::readahead::Readahead;
use crate::record::InodeRecord;
use crate::{Attr, DirItem, Entry, FsConfig, FsError, FsResult, OpenReply};

mod atime;
mod binding;
mod cluster;
mod dirs;
mod handles;
mod lookup;
mod model;
mod reclaim;
mod xattr;

pub use atime::{Atime, AtimePolicy};
pub(crate) use dirs::WalkAhead;
pub use xattr::XattrFlags;
pub(crate) use xattr::{Xattrs, check_name as check_xattr_name, kept as xattr_kept};

pub(crate) use handles::{Handle, Handles};

pub(crate) use model::RUNNING;
pub(crate) use model::{Attempt, Found, Inode, Namespace, OWN_CHANGE_WINDOW, ROOT, Unsettled};
use model::{MOVE_WAIT, NAME_MAX};

pub(crate) use crate::fetch::Core;

/// The namespace component (design note 012): names, inodes, home locations and renames in flight (the
/// table, shared by hits and taken alone by changes), open handles (sharded), the lock that serialises
/// changes of names, listings and lookups of home, and what the kernel is told to forget. The data path
/// and the change pipeline see the table through [`Names::read`] and [`Names::write`] (the lock order is
/// design note 011's) and ask everything else of it by name.
pub(crate) struct Names {
    cfg: FsConfig,
    core: Arc<Core>,
    health: Arc<Health>,
    /// The change pipeline's journal, asked whether changes of a name wait in it.
    pipeline: Arc<Pipeline>,
    /// The data path's ingest queue: a new version of a pinned file is brought in whole.
    readahead: Arc<Readahead>,
    ns: RwLock<Namespace>,
    /// Open handles, sharded: a leaf under `ns`.
    handles: Handles,
    mutate: Mutex<()>,
    meta_counters: MetaCounters,
    /// Where invalidations for the kernel go (the FUSE adapter's notifier); unset without a kernel.
    invalidator: std::sync::OnceLock<Box<dyn Fn(crate::Invalidation) + Send + Sync>>,
    kernel_barrier: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Writes across a cluster: publishing this node's changes, applying the others' (design note 016).
    coherence: std::sync::OnceLock<Arc<dyn crate::coherence::Coherence>>,
    /// When another node's change last dropped what this node cached: an answer asked for before then
    /// may predate that change, and is not counted fresh.
    invalidated: std::sync::Mutex<Option<Instant>>,
    /// Listings of directories at home under way, one per directory (see [`Names::listing`]).
    listing_flight: larder_util::SingleFlight<u64, ()>,
    /// Ticks for directories' listings and opens, to tell which came first (see `DirState::opened`).
    dir_clock: AtomicU64,
    /// Directories to revalidate ahead of a walk (see `Names::walk_ahead`).
    walk_ahead: Arc<WalkAhead>,
    /// Home has given a directory's own attributes with its listing ([`Home::list_with_own`]): the root,
    /// which no parent's listing carries, is then revalidated by its own listing.
    listings_carry_own: std::sync::atomic::AtomicBool,
}

impl Names {
    pub(crate) fn new(
        cfg: FsConfig,
        core: Arc<Core>,
        health: Arc<Health>,
        pipeline: Arc<Pipeline>,
        readahead: Arc<Readahead>,
        ns: Namespace,
    ) -> Names {
        Names {
            cfg,
            core,
            health,
            pipeline,
            readahead,
            ns: RwLock::new(ns),
            handles: Handles::default(),
            mutate: Mutex::new(()),
            meta_counters: Default::default(),
            invalidator: std::sync::OnceLock::new(),
            kernel_barrier: std::sync::OnceLock::new(),
            coherence: std::sync::OnceLock::new(),
            invalidated: std::sync::Mutex::new(None),
            listing_flight: Default::default(),
            dir_clock: AtomicU64::new(1),
            walk_ahead: Default::default(),
            listings_carry_own: Default::default(),
        }
    }

    /// The table, shared: hits and reads take it so.
    pub(crate) fn read(&self) -> std::sync::RwLockReadGuard<'_, Namespace> {
        read(&self.ns)
    }

    /// The table, alone: changes take it so.
    pub(crate) fn write(&self) -> std::sync::RwLockWriteGuard<'_, Namespace> {
        write(&self.ns)
    }

    /// Open handles.
    pub(crate) fn handles(&self) -> &Handles {
        &self.handles
    }

    /// The lock that serialises changes of names (taken before the table).
    pub(crate) fn mutate(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.mutate)
    }

    /// The cluster's coherence, in a cluster.
    pub(crate) fn coherence(&self) -> Option<&Arc<dyn crate::coherence::Coherence>> {
        self.coherence.get()
    }

    pub(crate) fn meta_counters(&self) -> &MetaCounters {
        &self.meta_counters
    }
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

impl Names {
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

    /// Mark the blocks of a reloaded inode's unpushed ranges dirty in the store, so eviction spares them,
    /// and keep of an interrupted push only what the cache file still shows of it
    /// ([`Names::unconfirmed_as_pushed`]).
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
        let rec = self.stored_record(ino)?.ok_or(FsError::BadHandle)?;
        let mut node = Inode::from_record(rec);
        self.reclaim_dirty(&mut node);
        ns.insert_loaded(ino, node);
        self.load_home_ancestors(ns, ino);
        Ok(())
    }

    /// The record of inode `ino` in the index, if it has a readable one.
    pub(crate) fn stored_record(&self, ino: u64) -> FsResult<Option<InodeRecord>> {
        Ok(self.core.store.db().inode(ino)?.and_then(|b| InodeRecord::decode(&b)))
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

    /// The validity lag, which is also the kernel's attribute and entry timeout.
    pub(crate) fn validity_lag(&self) -> std::time::Duration {
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

    /// For a file with writers the kernel serves from the cache file that wrote since their writes were
    /// last taken in: the cache file's length and modification time, which show those writes.
    pub(crate) fn written_directly(&self, node: &Inode) -> Option<(u64, Option<std::time::SystemTime>)> {
        if node.pt_writers.load(Relaxed) == 0 {
            return None;
        }
        let m = self.core.store.file(node.object).ok()?.metadata().ok()?;
        // The size always (only writes grow the cache file; truncations cut it and the file together);
        // the time only if it moved since it was last taken in (a time set since must show).
        let modified = m
            .modified()
            .ok()
            .filter(|t| crate::stamp::nanos(*t) > node.pt_seen.load(Relaxed));
        Some((m.len(), modified))
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
            // (Home's figure counts no more than the file's size now: a truncation here cut the rest.)
            blocks: if node.dirty.is_empty() && node.home_size.is_none() {
                if a.blocks == 0 && size > 0 && node.kind == FileKind::File {
                    // Home's figure for a file with data is 0 only while the attributes are those it was
                    // made with (a push's answer is taken whole only after the file's last queued change):
                    // the cache file's count then, as a local file system never shows data in 0 blocks.
                    self.core.store.allocated_blocks(node.object).min(size.div_ceil(512))
                } else {
                    a.blocks
                }
            } else if node.home_size == Some(0) && !node.dirty.is_empty() {
                // Nothing of it at home: the cache file holds the pages written here and nothing else (no
                // stat of the cache file for every answer about a file being written). (While a push has
                // taken its dirty ranges, the cache file's own count, below: never 0 for a file with data.)
                a.blocks.min(size.div_ceil(512)).max(pages_of(&node.dirty))
            } else {
                a.blocks
                    .min(size.div_ceil(512))
                    .max(self.core.store.allocated_blocks(node.object))
            },
            perm: a.perm,
            // Gone from every name (a directory removed, or replaced by a rename, too): no link left, as
            // a local file system says of what is still open.
            nlink: if node.removed { 0 } else { a.nlink },
            uid: a.uid,
            gid: a.gid,
            rdev: a.rdev,
            atime: a.atime,
            mtime,
            ctime,
        })
    }

    /// The answer about `ino`, and how long the kernel may keep it: the validity lag, or not at all while
    /// writers the kernel serves from the cache file are open (their writes, through `mmap` too, move the
    /// size and times behind the daemon's back: each `stat` asks again, and sees them).
    pub(crate) fn entry(&self, ns: &Namespace, ino: u64) -> FsResult<Entry> {
        let writing = ns.inode(ino)?.pt_writers.load(Relaxed) > 0;
        Ok(Entry {
            attr: self.attr_of(ns, ino)?,
            ttl: if writing { Duration::ZERO } else { self.cfg.validity_lag },
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

    /// How to wait until the invalidations sent so far reached the kernel: see [`Names::kernel_barrier`].
    pub(crate) fn set_kernel_barrier(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.kernel_barrier.set(f);
    }

    /// Send the kernel's invalidations to `f` (it must not block: it is called with locks held).
    pub(crate) fn set_invalidator(&self, f: Box<dyn Fn(crate::Invalidation) + Send + Sync>) {
        let _ = self.invalidator.set(f);
    }

    /// Home calls the namespace made: stats of one name, listings, revalidations by stat (three counters
    /// read, nothing walked: sampled every second for status rates).
    pub(crate) fn home_meta_calls(&self) -> [u64; 3] {
        let c = &self.meta_counters;
        [
            c.lookups.load(Relaxed),
            c.listings.load(Relaxed),
            c.revalidations.load(Relaxed),
        ]
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
    use crate::Fs;
    use larder_home::Home;

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
        let held = fs.names.read();
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
        let ns = fs.names.read();
        assert_eq!(ns.inode(ino).unwrap().lookups(), 2);
        assert_eq!(ns.inode(ino).unwrap().opens(), 1, "the first handle is still open");
        drop(ns);
        fs.release(fh).unwrap();
        assert_eq!(fs.names.read().inode(ino).unwrap().opens(), 0);
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
        let object = fs.names.read().inode(ino).unwrap().object;
        fs.core().store.file(object).unwrap().set_len(10 << 10).unwrap();
        // A push sent the whole file and was cut short: nothing in the cache file changed since.
        let mut ns = fs.names.write();
        let node = ns.inode_mut(ino).unwrap();
        node.unconfirmed = Some(Box::new(Attempt::sent(std::iter::once(0..size).collect(), size)));
        fs.names.unconfirmed_as_pushed(node);
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
