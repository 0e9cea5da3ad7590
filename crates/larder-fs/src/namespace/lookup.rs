//! Looking names up: from the cache while it is fresh, else from home, and what an answer from home
//! means while renames above a name are landing or unsure.

use super::*;

impl Names {
    /// Whether the entry `name` of `parent` is answered here, not by home: it has queued changes, or
    /// `parent` itself is not at home yet.
    pub(crate) fn local_name(&self, ns: &Namespace, parent: u64, name: &OsStr) -> FsResult<bool> {
        if self.pipeline.journal().pinned(parent, name.as_bytes()) {
            return Ok(true);
        }
        Ok(!ns.at_home(parent)?)
    }

    /// Whether the entry `name` of `parent` stays as the cache has it when home lacks it: [`Names::local_name`],
    /// or a directory with changes queued below it. Home losing a directory (removed or renamed there by
    /// others) must not take the changes made in it here with it: they stay, with their bytes, until they
    /// land or are set aside as conflicts, with a copy kept (`flusher::set_aside`).
    pub(crate) fn holds_queued_changes(&self, ns: &Namespace, parent: u64, name: &OsStr) -> FsResult<bool> {
        if self.local_name(ns, parent, name)? {
            return Ok(true);
        }
        let Some(&child) = ns.inode(parent)?.d().children.get(name) else {
            return Ok(false);
        };
        self.queued_below(ns, child)
    }

    /// Whether changes are queued below directory `ino`.
    pub(crate) fn queued_below(&self, ns: &Namespace, ino: u64) -> FsResult<bool> {
        if ns.inode(ino)?.kind != FileKind::Dir {
            return Ok(false);
        }
        let path = ns.path_of(ino)?;
        Ok(self.pipeline.journal().queued_below(path.as_os_str().as_bytes()))
    }

    /// Whether `ino`'s attributes are the cache's to say: changes of it are queued.
    pub(crate) fn queued(&self, ino: u64) -> bool {
        self.pipeline.journal().has(ino)
    }

    /// The child `name` of `parent` from the persisted namespace (after a restart, before anything looked
    /// it up), bound in memory.
    pub(crate) fn load_child(&self, ns: &mut Namespace, parent: u64, name: &OsStr) -> FsResult<Option<u64>> {
        let p = ns.inode(parent)?;
        if let Some(&ino) = p.d().children.get(name) {
            return Ok(Some(ino));
        }
        if p.d().complete {
            return Ok(None);
        }
        let Some(ino) = self.core.store.db().dentry(parent, name.as_bytes())? else {
            return Ok(None);
        };
        let in_memory = ns.inodes.contains_key(&ino);
        if !in_memory && self.load_inode(ns, ino).is_err() {
            return Ok(None);
        }
        let node = ns.inode_mut(ino)?;
        if node.removed {
            return Ok(None);
        }
        // In memory, its names are the truth: an index entry naming it where it has no name is one whose
        // removal (a rename away) the index has not taken in yet.
        if in_memory && !node.has_name(parent, name) {
            return Ok(None);
        }
        if !node.has_name(parent, name) {
            node.aliases.push((parent, name.to_os_string()));
        }
        ns.inode_mut(parent)?.dm().children.insert(name.to_os_string(), ino);
        if !in_memory {
            self.meta_counters.reloaded.fetch_add(1, Relaxed);
            self.vouch_by_listing(ns, parent, ino);
        }
        Ok(Some(ino))
    }

    /// The inode numbered `ino`, found by its number alone: the kernel's lookup of `.` in it, for a file
    /// handle (`open_by_handle_at`, an NFS server's) whose inode it no longer holds, dropped from its
    /// caches or made before a remount. Inode numbers are persistent (003): one not in memory is loaded
    /// from its record in the index through the name that record gives, its directories first, and
    /// answered only if that name still leads to it. A number no file has any more is `ESTALE`. Counts one
    /// kernel reference.
    pub(crate) fn lookup_number(&self, ino: u64) -> FsResult<Entry> {
        {
            let ns = read(&self.ns);
            if let Some(node) = ns.inodes.get(&ino) {
                node.lookups.fetch_add(1, Relaxed);
                return self.entry(&ns, ino);
            }
        }
        let mut ns = write(&self.ns);
        self.load_number(&mut ns, ino, 0)?;
        ns.inode(ino)?.lookups.fetch_add(1, Relaxed);
        self.entry(&ns, ino)
    }

    /// The directory `ino` (a directory's number in a file handle) is in: the kernel's lookup of `..`,
    /// to connect a directory found by its handle to the tree. The root is its own parent. Counts one
    /// kernel reference, on the parent.
    pub(crate) fn lookup_parent(&self, ino: u64) -> FsResult<Entry> {
        let parent = {
            let mut ns = write(&self.ns);
            self.load_number(&mut ns, ino, 0)?;
            if ino == ROOT { ROOT } else { ns.inode(ino)?.parent }
        };
        self.lookup_number(parent)
    }

    /// Bring inode `ino` into memory from the index by its number (see [`Names::lookup_number`]); `depth`
    /// counts the directories above the first one asked for, so that an index whose records name each
    /// other as parents cannot recurse without end.
    fn load_number(&self, ns: &mut Namespace, ino: u64, depth: usize) -> FsResult<()> {
        let stale = || FsError::Home(HomeError::Stale);
        if ns.inodes.contains_key(&ino) {
            return Ok(());
        }
        let rec = self.stored_record(ino)?.ok_or_else(stale)?;
        if rec.parent == ino || depth > 4096 {
            return Err(stale());
        }
        self.load_number(ns, rec.parent, depth + 1)?;
        match self.load_child(ns, rec.parent, OsStr::from_bytes(&rec.name))? {
            Some(found) if found == ino => Ok(()),
            _ => Err(stale()),
        }
    }

    /// Look `name` up in `parent`; counts one kernel reference on success.
    pub(crate) fn lookup(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        match self.lookup_once(parent, name) {
            // In a cluster, a name another node made (or renamed to) just before is found at once: a
            // lookup that finds nothing applies the records written before it (one etcd read) and, if it
            // brought any, or another node's record names it (applied while this lookup used what was
            // cached before), looks again.
            Err(FsError::NotFound) if self.sync_cluster() || self.held_elsewhere(parent, name) => {
                self.lookup_once(parent, name)
            }
            other => other,
        }
    }

    fn lookup_once(&self, parent: u64, name: &OsStr) -> FsResult<Entry> {
        {
            // A hit (see `find_once`) is answered and counted in one critical section, with the namespace
            // shared: hits wait for no other hit.
            let ns = read(&self.ns);
            if let Some(child) = self.fresh_child(&ns, parent, name) {
                ns.inode(child)?.lookups.fetch_add(1, Relaxed);
                return self.entry(&ns, child);
            }
        }
        let ino = self.find(parent, name)?;
        {
            let ns = read(&self.ns);
            if let Some(node) = ns.inodes.get(&ino) {
                node.lookups.fetch_add(1, Relaxed);
                return self.entry(&ns, ino);
            }
        }
        // It left memory between the answer and now (see `reclaim.rs`): back from the index.
        let mut ns = write(&self.ns);
        let ino = self.load_child(&mut ns, parent, name)?.ok_or(FsError::NotFound)?;
        ns.inode(ino)?.lookups.fetch_add(1, Relaxed);
        self.entry(&ns, ino)
    }

    /// The inode of `name` in `parent`, asking home when the cache cannot say; counts no reference.
    pub(crate) fn find(&self, parent: u64, name: &OsStr) -> FsResult<u64> {
        check_name(name)?;
        // A directory can move at home while home is asked (a queued rename lands): then ask again, once
        // the rename has settled here.
        let deadline = Instant::now() + MOVE_WAIT;
        let mut may_list = true;
        loop {
            match self.find_once(parent, name, may_list)? {
                Found::Ino(ino) => return Ok(ino),
                // A listing of the directory under way (a large one, perhaps): the name alone is asked
                // rather than waiting for it, so that no lookup (nor the create after it) waits for a
                // listing to come back.
                Found::List if self.listing_flight.in_flight(&parent) => may_list = false,
                Found::List => {
                    may_list = false;
                    match self.listing(parent) {
                        Ok(_) => self.meta_counters.listings_for_lookups.fetch_add(1, Relaxed),
                        // Home away: the name alone is asked, and answered as it can be.
                        Err(FsError::Home(e)) if unreachable(&e) => 0,
                        Err(e) => return Err(e),
                    };
                }
                Found::Moved => {}
                Found::Moving if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                // Home's answer cannot be trusted while a rename above the name is unsettled: the cache's
                // (its persisted entries included) is the answer.
                Found::Moving | Found::Unsure => {
                    let mut ns = write(&self.ns);
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
        Ok(match ns.moving(asked.as_os_str().as_bytes()) {
            Some(true) => Some(Found::Moving),
            // Failed, waiting for a retry: home may or may not have it; the cache's view stands.
            Some(false) => Some(Found::Unsure),
            None => None,
        })
    }

    /// A hit: `name` in directory `parent` is known, and was checked within the validity lag (or changed
    /// here). Nothing else is asked.
    pub(super) fn fresh_child(&self, ns: &Namespace, parent: u64, name: &OsStr) -> Option<u64> {
        let child = *ns.inodes.get(&parent)?.d().children.get(name)?;
        let c = ns.inodes.get(&child)?;
        (c.attr.is_some() && (self.fresh(c.checked) || !c.dirty.is_empty())).then_some(child)
    }

    /// One try of [`Names::find`]. With `may_list`, a name home must be asked about in a directory not
    /// listed within the validity lag is [`Found::List`]: the caller lists the directory and asks again.
    pub(super) fn find_once(&self, parent: u64, name: &OsStr, may_list: bool) -> FsResult<Found> {
        let (path, known) = {
            let mut ns = write(&self.ns);
            let p = ns.inode(parent)?;
            if p.kind != FileKind::Dir {
                return Err(FsError::NotDir);
            }
            if let Some(child) = self.fresh_child(&ns, parent, name) {
                return Ok(Found::Ino(child));
            }
            let local = self.local_name(&ns, parent, name)?;
            let p = ns.inode(parent)?;
            let listed_fresh = self.fresh(p.d().listed);
            let negative_fresh = self.fresh(p.d().negatives.get(name).copied());
            if let Some(&child) = p.d().children.get(name) {
                let c = ns.inode(child)?;
                if c.attr.is_some() && (local || self.fresh(c.checked) || !c.dirty.is_empty() || self.queued(child)) {
                    return Ok(Found::Ino(child));
                }
            } else if !local && negative_fresh {
                return Err(FsError::NotFound);
            } else if local || listed_fresh {
                // The cache's entries are the answer (a fresh listing's: a name it bound may have left
                // memory since, for the index).
                return self
                    .load_child(&mut ns, parent, name)?
                    .ok_or(FsError::NotFound)
                    .map(Found::Ino);
            }
            if may_list && !listed_fresh && !self.cfg.validity_lag.is_zero() && self.health.online() {
                return Ok(Found::List);
            }
            let known = ns.inode(parent)?.d().children.get(name).copied();
            match ns.home_child_path(parent, name)? {
                Some(path) => (path, known),
                None => return Err(FsError::NotFound),
            }
        };
        let asked = Instant::now();
        self.meta_counters.lookups.fetch_add(1, Relaxed);
        match self.core.home.stat(&path) {
            Ok(attr) => {
                let mut ns = write(&self.ns);
                if self.local_name(&ns, parent, name)? {
                    // Changed here while home was asked: the cache's answer stands.
                    return cached_child(&ns, parent, name);
                }
                // Under a directory whose rename lands at home meanwhile, home's answer may be of a copy
                // mid-move (an object store's directory without its own object yet: no mode).
                if let Some(found) = self.moved_meanwhile(&ns, parent, Some(name), &path)? {
                    return Ok(found);
                }
                self.bind_child(&mut ns, parent, name, attr.kind, Some(attr), asked, None)
                    .map(Found::Ino)
            }
            Err(HomeError::NotFound) => {
                let mut ns = write(&self.ns);
                if self.holds_queued_changes(&ns, parent, name)? {
                    return cached_child(&ns, parent, name);
                }
                if let Some(found) = self.moved_meanwhile(&ns, parent, Some(name), &path)? {
                    return Ok(found);
                }
                self.gone_at_home(&mut ns, parent, name);
                if let Ok(p) = ns.inode_mut(parent) {
                    p.dm().negatives.insert(name.to_os_string(), Instant::now());
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
                let mut ns = write(&self.ns);
                // A name known before a restart is in the index, if not in memory yet.
                let known = match known {
                    Some(child) => Some(child),
                    None => self.load_child(&mut ns, parent, name)?,
                };
                match known {
                    Some(child) if ns.inodes.get(&child).is_some_and(|c| c.attr.is_some()) => Ok(Found::Ino(child)),
                    None if self.cfg.write_mode.works_offline() => Err(FsError::NotFound),
                    None if ns.inode(parent)?.d().listed.is_some() => Err(FsError::NotFound),
                    _ => Err(e.into()),
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The kernel dropped `n` references to `ino`.
    /// The count drops with the namespace shared (the kernel forgets as often as it looks up); only the
    /// last reference, which may let the inode leave memory, takes it alone.
    pub(crate) fn forget(&self, ino: u64, n: u64) {
        let last = {
            let ns = read(&self.ns);
            let Some(node) = ns.inodes.get(&ino) else { return };
            let was = node
                .lookups
                .fetch_update(Relaxed, Relaxed, |l| Some(l.saturating_sub(n)))
                .unwrap_or(0);
            was <= n && node.opens() == 0
        };
        if !last || ino == ROOT {
            return;
        }
        let mut ns = write(&self.ns);
        let Some(node) = ns.inodes.get(&ino) else { return };
        if node.lookups() != 0 || node.opens() != 0 {
            return;
        }
        if node.removed {
            if !self.queued(ino) {
                ns.inodes.remove(&ino);
            }
        } else {
            // Nothing refers to it but the index: it leaves memory, and comes back from the index.
            self.reclaim(&mut ns, ino);
        }
    }

    /// Attributes of `ino`, revalidated against home once the validity lag has passed.
    pub(crate) fn getattr(&self, ino: u64) -> FsResult<Entry> {
        let path = {
            let ns = read(&self.ns);
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

    /// Ask home for the attributes of `ino` at `path` and record them: by listing its directory, when that
    /// is not listed within the validity lag (one call revalidates every entry of it), else by a stat.
    pub(crate) fn revalidate(&self, ino: u64, path: &std::path::Path) -> FsResult<Entry> {
        if let Some(entry) = self.revalidate_by_listing(ino)? {
            return Ok(entry);
        }
        let asked = Instant::now();
        self.meta_counters.revalidations.fetch_add(1, Relaxed);
        match self.core.home.stat(path) {
            Ok(attr) => {
                let mut ns = write(&self.ns);
                // As for a lookup: mid-move, home's answer about the old path stands for nothing.
                if self.moved_meanwhile(&ns, ino, None, path)?.is_some() {
                    return self.entry(&ns, ino);
                }
                if ns.inode(ino)?.kind != attr.kind {
                    return Err(FsError::NotFound);
                }
                self.update_attr(&mut ns, ino, attr, asked);
                self.entry(&ns, ino)
            }
            Err(HomeError::NotFound) => {
                let mut ns = write(&self.ns);
                let node = ns.inode(ino)?;
                if node.opens() > 0 && node.attr.is_some() {
                    // Still open here: keep serving what we have.
                    return self.entry(&ns, ino);
                }
                let (parent, name) = (node.parent, node.name.clone());
                // Changed here, or moved at home while home was asked (a queued rename landed).
                if self.queued(ino)
                    || self.holds_queued_changes(&ns, parent, &name)?
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
                let ns = read(&self.ns);
                if ns.inode(ino)?.attr.is_some() {
                    return self.entry(&ns, ino);
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Revalidate `ino` by listing its directory, if that is not listed within the validity lag: its
    /// entry then if the listing made it fresh, else `None` (and the caller stats it).
    ///
    /// The root, which no parent's listing carries, is revalidated by its own listing where home gives a
    /// directory's own attributes with it (a POSIX home): a walk of the tree lists it anyway.
    fn revalidate_by_listing(&self, ino: u64) -> FsResult<Option<Entry>> {
        if self.cfg.validity_lag.is_zero() || !self.health.online() {
            return Ok(None);
        }
        if ino == ROOT && !self.listings_carry_own.load(Relaxed) {
            return Ok(None);
        }
        let listed = {
            let ns = read(&self.ns);
            let node = ns.inode(ino)?;
            let listed = if ino == ROOT { ROOT } else { node.parent };
            let Some(dir) = ns.inodes.get(&listed) else {
                return Ok(None);
            };
            if node.removed || self.fresh(dir.d().listed) {
                return Ok(None);
            }
            listed
        };
        if self.listing(listed).is_err() {
            return Ok(None);
        }
        self.meta_counters.listings_for_revalidation.fetch_add(1, Relaxed);
        let ns = read(&self.ns);
        let node = ns.inode(ino)?;
        let bound = ino == ROOT || ns.inodes.get(&listed).and_then(|p| p.d().children.get(&node.name)) == Some(&ino);
        if node.attr.is_some() && !node.removed && self.fresh(node.checked) && bound {
            return self.entry(&ns, ino).map(Some);
        }
        Ok(None)
    }

    /// Read the target of a symlink.
    /// A symlink's target never changes in place: another target is another object, which the lookup or
    /// revalidation that reached this inode found (and which then holds no cached target). So a cached
    /// target is the answer, fresh or not; home is asked only for one never read.
    pub(crate) fn readlink(&self, ino: u64) -> FsResult<Vec<u8>> {
        let deadline = Instant::now() + MOVE_WAIT;
        loop {
            let path = {
                let ns = read(&self.ns);
                let node = ns.inode(ino)?;
                if node.kind != FileKind::Symlink {
                    return Err(FsError::Invalid);
                }
                if let Some(t) = &node.symlink {
                    return Ok(t.clone());
                }
                match ns.home_path(ino)? {
                    Some(p) => p,
                    None => return Err(FsError::NotFound),
                }
            };
            match self.core.home.readlink(&path) {
                Ok(target) => {
                    let mut ns = write(&self.ns);
                    if let Ok(node) = ns.inode_mut(ino) {
                        node.symlink = Some(target.clone());
                    }
                    self.persist(&ns, ino);
                    return Ok(target);
                }
                // A rename above it landed, or is landing, while home was asked: ask again at its place.
                Err(HomeError::NotFound) => match self.moved_meanwhile(&read(&self.ns), ino, None, &path)? {
                    Some(Found::Moved) => {}
                    Some(Found::Moving) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                    _ => return Err(FsError::NotFound),
                },
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Where to ask home about `ino` before its cached attributes are trusted again: `None` while they are
    /// fresh, or while the cache's version stands anyway (changes here not yet at home, or removed).
    pub(crate) fn revalidation_path(&self, ns: &Namespace, ino: u64) -> FsResult<Option<std::path::PathBuf>> {
        let node = ns.inode(ino)?;
        let stale = node.attr.is_none() || !self.fresh(node.checked);
        if stale && node.dirty.is_empty() && !node.removed && !self.queued(ino) {
            ns.home_path(ino)
        } else {
            Ok(None)
        }
    }
}

/// The cache's answer for `name` in `parent`.
fn cached_child(ns: &Namespace, parent: u64, name: &OsStr) -> FsResult<Found> {
    ns.inode(parent)?
        .d()
        .children
        .get(name)
        .copied()
        .ok_or(FsError::NotFound)
        .map(Found::Ino)
}
