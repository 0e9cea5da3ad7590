//! Binding names to inodes as home reports them, taking in home's attributes, and forgetting what left
//! home.

use super::*;

impl Names {
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
            // An answer home gave before our own latest change of this object must not undo it: a change of
            // its attributes alone (a chmod, a chown, a time) leaves its version as it was, so an answer
            // asked before one of ours concluded is older whatever version it carries. One asked before a
            // later answer was taken in is older too when its version is another.
            if node.checked.is_some_and(|c| c > asked)
                && (node.own || node.attr.as_ref().is_some_and(|a| a.version != attr.version))
            {
                return;
            }
            // (Writers the kernel serves from the cache file keep its object too: their writes land there.)
            if node.kind == FileKind::File
                && node.dirty.is_empty()
                && node.pt_writers.load(Relaxed) == 0
                && node.attr.as_ref().is_some_and(|a| a.version != attr.version)
            {
                new_object = Some(node.object);
            }
        }
        let mut refetch = None;
        if let Some(old) = new_object {
            let object = self.alloc_object(ns);
            // A pinned file's new version is pinned too, and fetched now.
            // (No push of it is under way: it has no changes queued, or `update_attr` would not be here.)
            if self.core.store.replace_object(old, object, false) {
                refetch = Some(object);
            }
            if let Some(node) = ns.inodes.get_mut(&ino) {
                node.object = object;
                node.home_size = None;
            }
            self.invalidate(crate::Invalidation::Inode(ino));
        }
        let fresh = self.fresh_from(asked, now);
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        node.checked = fresh;
        node.own = false;
        if node.attr.as_ref().is_some_and(|a| a.version != attr.version) {
            node.symlink = None;
        }
        // Extended attributes change an object's ctime (and, on an object store, its version): asked of
        // home again when either moved.
        if node
            .attr
            .as_ref()
            .is_some_and(|a| a.version != attr.version || a.ctime != attr.ctime)
        {
            node.xattrs = None;
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
        if let Some(local) = &node.attr {
            keep_own_times(local, &mut attr);
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
                blocks: 0..attr.size.div_ceil(self.core.store.block_size()) as u32,
                file: crate::FileVersion {
                    object,
                    epoch: self.core.store.epoch(object),
                    path,
                    version: attr.version,
                    home_end: attr.size,
                },
            });
        }
    }

    /// Record attributes that result from this node's own change at home: the cached data stays valid.
    pub(crate) fn adopt_attr(&self, ns: &mut Namespace, ino: u64, attr: HomeAttr) {
        if let Some(node) = ns.inodes.get_mut(&ino) {
            let mut attr = attr;
            if let Some(local) = &node.attr {
                if !node.dirty.is_empty() {
                    attr.size = local.size;
                    attr.mtime = local.mtime;
                }
                // Home's answer to our own change: its access and change times are those of the push,
                // not of anything done through the mount.
                attr.atime = local.atime;
                attr.ctime = local.ctime;
            }
            node.attr = Some(attr);
            node.checked = Some(Instant::now());
            node.own = true;
            self.persist(ns, ino);
            note_identity(ns, ino);
        }
    }

    /// The inode for `name` in `parent`, creating it (or reloading its persisted record) if needed.
    /// `persisted`: the entries of `parent` in the index, when the caller read them all at once (a
    /// listing), so that the index is not read again for each name.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn bind_child(
        &self,
        ns: &mut Namespace,
        parent: u64,
        name: &OsStr,
        kind: FileKind,
        attr: Option<HomeAttr>,
        asked: Instant,
        persisted: Option<&HashMap<Vec<u8>, u64>>,
    ) -> FsResult<u64> {
        if let Some(&ino) = ns.inode(parent)?.d().children.get(name) {
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
            p.dm().children.insert(name.to_os_string(), ino);
            p.dm().negatives.remove(name);
            db.submit(vec![Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino)]);
            self.persist(ns, ino);
            if let Some(attr) = attr {
                self.update_attr(ns, ino, attr, asked);
            }
            return Ok(ino);
        }
        let mut ino = None;
        let stored = match persisted {
            Some(p) => p.get(name.as_bytes()).copied(),
            None => db.dentry(parent, name.as_bytes())?,
        };
        if let Some(old) = stored {
            if let Some(node) = ns.inodes.get(&old) {
                // In memory, its names are the truth: an index entry naming it where it has no name is one
                // whose removal the index has not taken in yet (entries are written behind).
                if node.kind == kind && !node.removed && node.has_name(parent, name) {
                    ino = Some(old);
                }
            } else if let Some(rec) = db.inode(old)?.and_then(|b| InodeRecord::decode(&b))
                && rec.kind == kind
            {
                let mut node = Inode::from_record(rec);
                self.reclaim_dirty(&mut node);
                if node.has_name(parent, name) {
                    ns.insert_loaded(old, node);
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
                    .insert(ino, Box::new(Inode::new(parent, name.to_os_string(), kind, object)));
                db.submit(vec![
                    Mutation::PutMeta("next_ino", ns.next_ino),
                    Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino),
                ]);
                self.persist(ns, ino);
                ino
            }
        };
        let p = ns.inode_mut(parent)?;
        p.dm().children.insert(name.to_os_string(), ino);
        p.dm().negatives.remove(name);
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

    /// `name` left `parent`, at home already (`at_home`) or only here so far (home still has it there until
    /// the change is pushed).
    pub(crate) fn unbind(&self, ns: &mut Namespace, parent: u64, name: &OsStr, at_home: bool) {
        let Some(ino) = ns.inodes.get_mut(&parent).and_then(|p| p.dm().children.remove(name)) else {
            return;
        };
        self.core
            .store
            .db()
            .submit(vec![Mutation::DelDentry(parent, name.as_bytes().to_vec())]);
        self.drop_name(ns, parent, name, ino, at_home);
    }

    /// One name of `ino` is gone: if it has others (hard links), it lives on under them.
    pub(super) fn drop_name(&self, ns: &mut Namespace, parent: u64, name: &OsStr, ino: u64, at_home: bool) {
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

    pub(super) fn forget_subtree(&self, ns: &mut Namespace, ino: u64, at_home: bool) {
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        node.removed = true;
        let children: Vec<(OsString, u64)> = node
            .dir
            .as_mut()
            .map(|d| d.children.drain().collect())
            .unwrap_or_default();
        let (opens, lookups, object, pushing) = (node.opens(), node.lookups(), node.object, node.pushing);
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
                // A push of it under way reads its cache file still: unlinked, not made a spare.
                match ns.retire_later.as_mut() {
                    Some(later) => later.push((object, pushing > 0)),
                    None => self.core.store.remove_object_with(object, pushing > 0),
                }
            }
            db.submit(vec![Mutation::DelInode(ino)]);
            if lookups == 0 {
                ns.inodes.remove(&ino);
            }
        }
    }
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

/// Home's attributes `attr` of an object the cache knows as `local`: if home's object is the one the cache
/// knows (same version, size, modification time, mode, owner and links), its access and change times stay
/// the cache's. Home moves them when a push lands (and its clock is not the mount's): a file's times change
/// only when something is done to it, through the mount or at home.
fn keep_own_times(local: &HomeAttr, attr: &mut HomeAttr) {
    let same = local.version == attr.version
        && local.size == attr.size
        && local.mtime == attr.mtime
        && (local.perm, local.uid, local.gid, local.nlink) == (attr.perm, attr.uid, attr.gid, attr.nlink);
    if same {
        attr.atime = local.atime;
        attr.ctime = local.ctime;
    }
}
