//! Directory listings: opendir fixes a snapshot of the children for the handle (taken again at a rewind);
//! a listing is taken from home only when the cached one is past the validity lag and home's directory
//! version has changed.

use std::collections::HashSet;
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use larder_cache::Mutation;
use larder_home::{FileKind, HomeError, unreachable};

use crate::namespace::Names;
use crate::namespace::{Namespace, ROOT, read, write};
use crate::{DirItem, FsError, FsResult};

impl Names {
    /// The listings taken within the validity lag, for the next start: as wall-clock times, since the
    /// time between the stop and the start counts against the lag too.
    pub(crate) fn listings_to_keep(&self) -> Vec<Mutation> {
        let ns = read(&self.ns);
        let now = std::time::SystemTime::now();
        ns.inodes
            .iter()
            .filter_map(|(&ino, node)| {
                let listed = node.dir.as_ref()?.listed?;
                if !self.fresh(Some(listed)) {
                    return None;
                }
                let at = now.checked_sub(listed.elapsed())?;
                let ms = at.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as u64;
                Some(Mutation::PutListing(ino, ms))
            })
            .collect()
    }

    /// A listing of `dir` the last run took, if it is still within the validity lag: it becomes the
    /// directory's listing (and vouches for the children in memory), so the directory is not listed again.
    /// Not in a cluster: another node's changes while this one was down were not seen.
    pub(crate) fn restore_listing(&self, ns: &mut Namespace, dir: u64) -> bool {
        let Some(at) = ns.restored.remove(&dir) else {
            return false;
        };
        if self.coherence.get().is_some() || !self.fresh(Some(at)) {
            return false;
        }
        let children: Vec<u64> = match ns.inodes.get_mut(&dir) {
            Some(node) if node.kind == FileKind::Dir => {
                let d = node.dm();
                d.listed = Some(at);
                d.complete = false;
                d.children.values().copied().collect()
            }
            _ => return false,
        };
        for child in children {
            self.vouch_by_listing(ns, dir, child);
        }
        true
    }

    /// Open a directory: its listing, revalidated if needed, is fixed for this handle.
    pub(crate) fn opendir(&self, ino: u64) -> FsResult<u64> {
        self.sync_cluster();
        let times = self.dir_times(ino);
        let entries = Arc::new(self.listing(ino)?);
        let ns = read(&self.ns);
        if let Some(d) = ns.inodes.get(&ino).and_then(|n| n.dir.as_deref()) {
            d.opened.store(self.dir_clock.fetch_add(1, Relaxed), Relaxed);
        }
        let fh = self.new_handle(&ns, ino, Some(entries));
        self.handles.with(fh, |h| h.listed_times = times);
        Ok(fh)
    }

    /// The modification and change times of directory `ino` as the mount shows them: every name made,
    /// removed or renamed in it moves them.
    fn dir_times(&self, ino: u64) -> Option<(std::time::SystemTime, std::time::SystemTime)> {
        let ns = read(&self.ns);
        ns.inodes.get(&ino)?.attr.as_ref().map(|a| (a.mtime, a.ctime))
    }

    /// Entries of an open directory from position `offset` on (0 is `.`, 1 is `..`). A read from the start
    /// of a handle read before is a rewind (`rewinddir`, or a seek to 0): the listing is taken again, so
    /// that names made or removed since the open are seen, as POSIX asks.
    pub(crate) fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<(u64, DirItem)>> {
        let (ino, entries, read_from, listed_times) = self
            .handles
            .with(fh, |h| (h.ino, h.entries.clone(), h.read_from, h.listed_times))
            .ok_or(FsError::BadHandle)?;
        let mut entries = entries.ok_or(FsError::NotDir)?;
        // A first read (no rewind yet) takes the listing again too if names changed since the opendir: a
        // rewind before any read (`opendir`, create, `rewinddir`, `readdir`) must see them, and the kernel
        // sends no request for a rewind.
        if offset == 0 && (read_from || listed_times != self.dir_times(ino)) {
            let times = self.dir_times(ino);
            self.handles.with(fh, |h| h.listed_times = times);
            self.sync_cluster();
            entries = Arc::new(self.listing(ino)?);
            let again = entries.clone();
            self.handles.with(fh, |h| h.entries = Some(again));
        }
        self.handles.with(fh, |h| h.read_from = true);
        Ok(entries
            .iter()
            .enumerate()
            .skip(offset as usize)
            .map(|(i, e)| (i as u64 + 1, e.clone()))
            .collect())
    }

    /// Close an open directory.
    pub(crate) fn releasedir(&self, fh: u64) {
        self.handles.remove(fh);
    }

    /// The children of `ino` (with `.` and `..` first), from the cached listing while it is fresh. Entries
    /// with changes queued for home are the cache's; the rest come from home.
    ///
    /// No lock is held while home is asked. A change recorded meanwhile (even one that reached home and
    /// left the queue before home answered) keeps the cache's entry: the journal names it
    /// ([`Journal::watch`](crate::journal::Journal::watch)).
    pub(crate) fn listing(&self, ino: u64) -> FsResult<Vec<DirItem>> {
        loop {
            {
                // A fresh listing is a hit, taken with the namespace shared.
                let ns = read(&self.ns);
                let node = ns.inode(ino)?;
                if node.kind == FileKind::Dir && self.fresh(node.d().listed) {
                    return self.snapshot(&ns, ino);
                }
            }
            // One listing of a directory at home at a time: lookups that miss in a large directory
            // together wait for the one listing, then find it fresh (or, if it failed, try their own).
            let mut mine = None;
            self.listing_flight.run(ino, || mine = Some(self.list_now(ino)));
            if let Some(result) = mine {
                return result;
            }
            if self.cfg.validity_lag.is_zero() {
                return self.list_now(ino);
            }
        }
    }

    /// [`Names::listing`] without waiting for a listing of the directory under way.
    fn list_now(&self, ino: u64) -> FsResult<Vec<DirItem>> {
        let path = {
            let mut ns = write(&self.ns);
            let node = ns.inode(ino)?;
            if node.kind != FileKind::Dir {
                return Err(FsError::NotDir);
            }
            if self.fresh(node.d().listed) || self.restore_listing(&mut ns, ino) {
                return self.snapshot(&ns, ino);
            }
            match ns.home_path(ino)? {
                Some(p) => p,
                None => {
                    // Not at home yet: the cache holds all of it.
                    self.load_pinned(&mut ns, ino)?;
                    return self.snapshot(&ns, ino);
                }
            }
        };
        let _watch = Watch::new(self, ino);
        let asked = Instant::now();
        // One call: listed even when the directory's version is unchanged, since the listing carries its
        // entries' attributes and revalidates them all (a file written in place leaves its directory's
        // version alone). The directory's own attributes come from its parent's listing, or a stat, and
        // from this listing where home reads them in the same call.
        // Names with changes queued before home lists and after: an op that lands meanwhile is in the
        // first set if home's answer predates it, so either way its entry is the cache's.
        let mut pinned = self.pipeline.journal().pinned_in(ino);
        self.meta_counters
            .listings
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (own, listed) = match self.core.home.list_with_own(&path) {
            Ok(l) => l,
            Err(HomeError::NotFound) => {
                let mut ns = write(&self.ns);
                let node = ns.inode(ino)?;
                let (parent, name) = (node.parent, node.name.clone());
                if self.queued(ino) || self.holds_queued_changes(&ns, parent, &name)? {
                    // Home lacks it where the cache says home has it, and changes of it (a rename of it,
                    // perhaps one that landed before a crash could record it) are queued: the cache's
                    // entries, all of them, are the answer.
                    self.load_cached(&mut ns, ino)?;
                    return self.snapshot(&ns, ino);
                }
                if let Some(found) = self.moved_meanwhile(&ns, ino, None, &path)? {
                    return self.overtaken_listing(ns, ino, found);
                }
                if ino != ROOT {
                    self.gone_at_home(&mut ns, parent, &name);
                }
                return Err(FsError::NotFound);
            }
            Err(e) if unreachable(&e) => return self.offline_listing(ino, e),
            Err(e) => return Err(e.into()),
        };
        let mut ns = write(&self.ns);
        // A rename of it or above it reached home while home listed it, or is landing: on a home that
        // renames by copy, then delete, the listing may lack entries the rename was moving.
        if let Some(found) = self.moved_meanwhile(&ns, ino, None, &path)? {
            return self.overtaken_listing(ns, ino, found);
        }
        if let Some(own) = own {
            self.listings_carry_own
                .store(true, std::sync::atomic::Ordering::Relaxed);
            // As a stat's answer (changes of it queued here stand: `update_attr`), unless entries of it
            // changed here and not all at home yet: its times are then the cache's.
            let quiet = pinned.is_empty() && {
                let j = self.pipeline.journal();
                j.pinned_in(ino).is_empty() && j.changed_while_watched(ino).is_empty()
            };
            if quiet && own.kind == FileKind::Dir && !ns.inode(ino)?.removed {
                self.update_attr(&mut ns, ino, own, asked);
            }
        }
        // The entries the index has of the directory, read once for all the names of the listing.
        let persisted: std::collections::HashMap<Vec<u8>, u64> =
            self.core.store.db().dentries_of(ino)?.into_iter().collect();
        let mut seen = HashSet::new();
        let mut entries = listed.into_iter().peekable();
        loop {
            // Names changed here up to now (this page's lock): theirs is the cache's entry.
            {
                let j = self.pipeline.journal();
                pinned.extend(j.pinned_in(ino));
                pinned.extend(j.changed_while_watched(ino));
            }
            // The page's records go to the index as one submission.
            self.core.store.db().gathered(|| {
                for e in entries.by_ref().take(BIND_PAGE) {
                    if !pinned.contains(e.name.as_bytes()) {
                        self.bind_child(&mut ns, ino, &e.name, e.kind, e.attr, asked, Some(&persisted))?;
                    }
                    seen.insert(e.name);
                }
                FsResult::Ok(())
            })?;
            if entries.peek().is_none() {
                break;
            }
            // A large directory is bound a page at a time: lookups, opens and changes elsewhere (and in
            // it: the directory is not complete until the last page) go on in between.
            drop(ns);
            ns = write(&self.ns);
        }
        // Gone at home: what the cache has bound, and what the index has of it beside (children that left
        // memory).
        let gone: HashSet<OsString> = (ns.inode(ino)?.d().children.keys().cloned())
            .chain(persisted.keys().map(|n| OsString::from_vec(n.clone())))
            .filter(|n| !seen.contains(n) && !pinned.contains(n.as_bytes()))
            .collect();
        for name in gone {
            if self.load_child(&mut ns, ino, &name)?.is_some() && !self.holds_queued_changes(&ns, ino, &name)? {
                self.gone_at_home(&mut ns, ino, &name);
            }
        }
        // (A superset of what load_pinned would take from the journal now.)
        self.load_names(&mut ns, ino, pinned)?;
        let listed = self.fresh_from(asked, Instant::now());
        let node = ns.inode_mut(ino)?;
        let d = node.dm();
        // Listed before: its previous listing's tick, for the walk ahead.
        let previous = d.listed.is_some().then_some(d.listed_tick);
        d.listed = listed;
        d.listed_tick = self.dir_clock.fetch_add(1, Relaxed);
        d.negatives.clear();
        // Every child is bound now: home's, and those with changes queued.
        d.complete = true;
        let out = self.snapshot(&ns, ino);
        // The children nothing refers to but this listing need not stay in memory: the oldest of them
        // leave it once there are many (they come back from the index, vouched for by this listing).
        let idle: Vec<u64> = ns
            .inode(ino)?
            .d()
            .children
            .values()
            .copied()
            .filter(|c| ns.inodes.get(c).is_some_and(|n| n.lookups() == 0 && n.opens() == 0))
            .collect();
        if let Some(previous) = previous {
            self.walk_ahead(&ns, ino, previous);
        }
        // A page at a time too (letting many leave memory takes a while); each is idle still when it goes.
        let mut idle = idle.into_iter().peekable();
        while idle.peek().is_some() {
            drop(ns);
            ns = write(&self.ns);
            self.note_idle(&mut ns, idle.by_ref().take(BIND_PAGE).collect());
        }
        out
    }

    /// A directory listed before was revalidated: a walk of the tree is likely under way, so its
    /// subdirectories stale now that a user opened after the directory's previous listing (tick
    /// `previous`: the last walk went through them) are revalidated ahead of it, in parallel (at most
    /// [`WALK_AHEAD_QUEUE`] waiting; a walker reaching one being listed waits for that listing). Those
    /// nobody opened since are left alone: an `ls` of a directory now and then lists only it.
    fn walk_ahead(&self, ns: &Namespace, dir: u64, previous: u64) {
        let Ok(node) = ns.inode(dir) else { return };
        let mut q = crate::namespace::lock(&self.walk_ahead.queue);
        for &child in node.d().children.values() {
            if q.0.len() >= WALK_AHEAD_QUEUE {
                break;
            }
            let stale = ns.inodes.get(&child).is_some_and(|c| {
                c.kind == FileKind::Dir
                    && c.d().listed.is_some()
                    && !self.fresh(c.d().listed)
                    && c.d().opened.load(Relaxed) > previous
            });
            if stale && q.1.insert(child) {
                q.0.push_back(child);
            }
        }
        drop(q);
        self.walk_ahead.ready.notify_all();
    }

    /// Start the threads that revalidate directories ahead of a walk.
    pub(crate) fn start_walk_ahead(self: &Arc<Self>) {
        for i in 0..WALK_AHEAD_THREADS {
            let (names, ahead) = (Arc::downgrade(self), self.walk_ahead.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("larder-walk-{i}"))
                .spawn(move || Names::walk_ahead_worker(names, ahead));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a thread revalidating directories ahead of a walk");
            }
        }
    }

    /// One thread revalidating directories ahead of a walk (see [`Names::walk_ahead`]), until the core
    /// stops or is dropped.
    fn walk_ahead_worker(names: std::sync::Weak<Names>, ahead: Arc<WalkAhead>) {
        loop {
            let dir = {
                let mut q = crate::namespace::lock(&ahead.queue);
                loop {
                    if let Some(dir) = q.0.pop_front() {
                        break dir;
                    }
                    let (next, waited) = ahead
                        .ready
                        .wait_timeout(q, std::time::Duration::from_millis(500))
                        .unwrap_or_else(|p| p.into_inner());
                    q = next;
                    if waited.timed_out() {
                        let stopped = names
                            .upgrade()
                            .is_none_or(|n| n.pipeline.stopping.load(std::sync::atomic::Ordering::SeqCst));
                        if stopped {
                            return;
                        }
                    }
                }
            };
            let Some(names) = names.upgrade() else { return };
            if names.health.online() && names.listing(dir).is_ok() {
                names.meta_counters.listings_ahead.fetch_add(1, Relaxed);
            }
            crate::namespace::lock(&ahead.queue).1.remove(&dir);
        }
    }

    /// Home is away: a directory listed before is served as cached.
    /// The listing of `ino` when home's answer was overtaken by a rename of it or above it
    /// ([`Names::moved_meanwhile`]): asked again at its new place if the rename landed (`Moved`), else
    /// (landing, or tried and unsettled) the cache's entries.
    fn overtaken_listing(
        &self,
        mut ns: std::sync::RwLockWriteGuard<'_, crate::namespace::Namespace>,
        ino: u64,
        found: crate::namespace::Found,
    ) -> FsResult<Vec<DirItem>> {
        if matches!(found, crate::namespace::Found::Moved) {
            drop(ns);
            return self.list_now(ino);
        }
        self.load_cached(&mut ns, ino)?;
        self.snapshot(&ns, ino)
    }

    fn offline_listing(&self, ino: u64, e: HomeError) -> FsResult<Vec<DirItem>> {
        let mut ns = write(&self.ns);
        if ns.inode(ino)?.d().listed.is_none() {
            // Not listed since the start (a mount started while home is away): the index's entries of it
            // are the cache's view, those an earlier listing bound and the changes made here since. A
            // directory the index holds no entry of cannot be told from one never listed: home's error.
            if !ns.inode(ino)?.d().complete && self.core.store.db().dentries_of(ino)?.is_empty() {
                return Err(e.into());
            }
            self.load_cached(&mut ns, ino)?;
            return self.snapshot(&ns, ino);
        }
        self.load_pinned(&mut ns, ino)?;
        self.snapshot(&ns, ino)
    }

    /// Bind the entries of `ino` that have queued changes (or, for a directory not at home, all its
    /// persisted entries) which are not in memory yet: after a restart, they are known only to the index.
    fn load_pinned(&self, ns: &mut Namespace, ino: u64) -> FsResult<()> {
        if !ns.at_home(ino)? {
            return self.load_cached(ns, ino);
        }
        let names = self.pipeline.journal().pinned_in(ino);
        self.load_names(ns, ino, names)
    }

    /// Bind every persisted child of `ino`: the cache's whole view of it, for when home cannot say.
    fn load_cached(&self, ns: &mut Namespace, ino: u64) -> FsResult<()> {
        if ns.inode(ino)?.d().complete {
            return Ok(());
        }
        let names = self.core.store.db().dentries_of(ino)?.into_iter().map(|(n, _)| n);
        self.load_names(ns, ino, names)?;
        ns.inode_mut(ino)?.dm().complete = true;
        Ok(())
    }

    /// Bind the persisted children `names` of `ino` that are not bound yet.
    fn load_names(&self, ns: &mut Namespace, ino: u64, names: impl IntoIterator<Item = Vec<u8>>) -> FsResult<()> {
        for n in names {
            let name = OsString::from_vec(n);
            if !ns.inode(ino)?.d().children.contains_key(&name) {
                self.load_child(ns, ino, &name)?;
            }
        }
        Ok(())
    }

    fn snapshot(&self, ns: &Namespace, ino: u64) -> FsResult<Vec<DirItem>> {
        let node = ns.inode(ino)?;
        let mut out = Vec::with_capacity(node.d().children.len() + 2);
        out.push(DirItem {
            ino,
            kind: FileKind::Dir,
            name: ".".into(),
        });
        out.push(DirItem {
            ino: if ino == ROOT { ROOT } else { node.parent },
            kind: FileKind::Dir,
            name: "..".into(),
        });
        let mut children: Vec<(OsString, u64, FileKind)> = node
            .d()
            .children
            .iter()
            .filter_map(|(name, &child)| ns.inodes.get(&child).map(|c| (name.clone(), child, c.kind)))
            .collect();
        if !node.d().complete && node.d().listed.is_some() {
            // Children that left memory since the listing (see `namespace/reclaim.rs`) are in the index.
            for (name, child, rec) in self.core.store.db().children_of(ino)? {
                let name = OsString::from_vec(name);
                if node.d().children.contains_key(&name) {
                    continue;
                }
                let kind = match ns.inodes.get(&child) {
                    // In memory, its names are the truth (see `load_child`).
                    Some(c) if c.removed || !c.has_name(ino, &name) => continue,
                    Some(c) => c.kind,
                    None => match rec.and_then(|r| crate::record::InodeRecord::decode(&r)) {
                        Some(r) => r.kind,
                        None => continue,
                    },
                };
                children.push((name, child, kind));
            }
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        out.extend(
            children
                .into_iter()
                .map(|(name, ino, kind)| DirItem { ino, kind, name }),
        );
        Ok(out)
    }
}

/// Most directories waiting to be revalidated ahead of a walk.
const WALK_AHEAD_QUEUE: usize = 256;

/// Entries of a listing bound under one hold of the namespace's lock: a listing of a large directory lets
/// everything else in between pages (binding 100,000 entries at once held every other request for a
/// fraction of a second).
const BIND_PAGE: usize = 4096;

/// Threads revalidating directories ahead of a walk.
pub(crate) const WALK_AHEAD_THREADS: usize = 4;

/// Directories to revalidate ahead of a walk: in order, and as a set (each queued once).
#[derive(Default)]
pub(crate) struct WalkAhead {
    pub queue: std::sync::Mutex<(std::collections::VecDeque<u64>, HashSet<u64>)>,
    pub ready: std::sync::Condvar,
}

/// A listing of a directory under way: changes of its entries recorded meanwhile are noted by the journal
/// until it ends.
struct Watch<'a> {
    names: &'a Names,
    dir: u64,
}

impl<'a> Watch<'a> {
    fn new(names: &'a Names, dir: u64) -> Watch<'a> {
        names.pipeline.journal().watch(dir);
        Watch { names, dir }
    }
}

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.names.pipeline.journal().unwatch(self.dir);
    }
}
