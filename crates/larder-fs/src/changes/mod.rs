//! Namespace and attribute changes: create, mkdir, mknod, symlink, link, unlink, rmdir, rename, setattr,
//! and the queueing of written data. Every change, in every writable mode, takes one path: it is made in
//! the cache and recorded in the journal; then write-back and local return once that is durable (the
//! flusher takes it to home after the sync lag, write-back only), and write-through pushes it at once and
//! returns home's answer, taking the change back out of the cache if home refuses it (`flusher/through.rs`).
//! Renames are in `rename.rs`.
//!
//! The checks home would make (the name exists, the directory is not empty, the kinds match) are made
//! here against the cache's view, which asks home where the cache does not know.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use larder_cache::Mutation;
use larder_home::{FileKind, HomeAttr, RenameFlags, SetAttr, TimeSet, Version};

use crate::data::DataPath;
use crate::journal::{Op, OpKind};
use crate::namespace::{Inode, Names, Namespace, ROOT, check_name, lock};
use crate::ranges::{add_range, blocks_in};
use crate::record::to_ns;
use crate::{Entry, FsError, FsResult, OpenReply};

mod cluster;
mod flusher;
mod rename;
mod xattr;

pub(crate) use flusher::load_conflicts;
pub use flusher::release_freed_memory;

/// The change pipeline component (design note 012): changes of names and attributes made here, the
/// journal that queues them with written data, and the flushers that push them to home in order, with
/// their conflicts. It changes the namespace through [`Names`] and pushes file contents through the data
/// path.
pub(crate) struct Changes {
    cfg: crate::FsConfig,
    core: Arc<crate::fetch::Core>,
    health: Arc<larder_home::Health>,
    names: Arc<Names>,
    data: Arc<DataPath>,
    pipeline: Arc<crate::pipeline::Pipeline>,
    /// Files whose changes are being handed over to another node, by path.
    handing: std::sync::Mutex<std::collections::HashMap<Vec<u8>, cluster::Handing>>,
}

impl Changes {
    pub(crate) fn new(
        cfg: crate::FsConfig,
        core: Arc<crate::fetch::Core>,
        health: Arc<larder_home::Health>,
        names: Arc<Names>,
        data: Arc<DataPath>,
        pipeline: Arc<crate::pipeline::Pipeline>,
    ) -> Changes {
        Changes {
            cfg,
            core,
            health,
            names,
            data,
            pipeline,
            handing: Default::default(),
        }
    }
}

impl crate::data::Intake for Changes {
    fn commit_data(&self, ino: u64, durable: bool) -> FsResult<()> {
        Changes::commit_data(self, ino, durable)
    }

    fn make_room(&self, bytes: u64) -> FsResult<()> {
        Changes::make_room(self, bytes)
    }

    fn room_now(&self, bytes: u64) -> bool {
        Changes::room_now(self, bytes)
    }

    fn create_file(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry> {
        Changes::create_file(self, parent, name, mode, uid, gid)
    }

    fn tmpfile(&self, parent: u64, mode: u32, uid: u32, gid: u32) -> FsResult<(Entry, OpenReply)> {
        Changes::tmpfile(self, parent, mode, uid, gid)
    }

    fn setattr(&self, ino: u64, changes: &SetAttr) -> FsResult<Entry> {
        Changes::setattr(self, ino, changes)
    }

    fn settle_attr(&self, ns: &mut Namespace, ino: u64, attr: HomeAttr) {
        Changes::settle_attr(self, ns, ino, attr)
    }
}

/// Longest a writer is held back waiting for dirty data to drain before it gets `ENOSPC`.
const ROOM_WAIT: Duration = Duration::from_secs(10);
/// Longest a writer waits for room while no dirty data leaves the cache.
const ROOM_PROGRESS: Duration = Duration::from_secs(2);

pub(crate) fn path_bytes(p: &Path) -> Vec<u8> {
    p.as_os_str().as_bytes().to_vec()
}

/// What a local create makes.
pub(crate) enum NewKind<'a> {
    File,
    Dir,
    Special { rdev: u64 },
    Symlink { target: &'a [u8] },
}

impl Changes {
    /// Record `ops` (and `removed`: inodes that lost their last name), persist them with `muts`, and wait
    /// until all of it is durable (write-back, local) or at home (write-through). Called with `ns` held;
    /// returns with it released.
    ///
    /// `mutating`, the namespace-change lock where the caller holds it, is let go with the namespace before
    /// the wait: changes made meanwhile by other callers share that wait (group commit), and the sync that
    /// acknowledges a later change covers every earlier one. No home call is made under either.
    ///
    /// In write-through the caller pushes its own ops ([`Changes::land`]) and gets home's answer: a change home
    /// refuses is undone here and its error returned.
    pub(crate) fn commit(
        &self,
        mutating: Option<std::sync::MutexGuard<'_, ()>>,
        ns: std::sync::RwLockWriteGuard<'_, Namespace>,
        ops: Vec<Op>,
        removed: &[u64],
        muts: Vec<Mutation>,
    ) -> FsResult<()> {
        let held = self.queue(mutating, ns, ops, removed, muts)?;
        self.land(&held)
    }

    /// [`Changes::commit`] up to the push: returns the ops the caller must [`Changes::land`] (write-through), once
    /// it let go of the object's write and flush locks, which the push takes.
    fn queue(
        &self,
        mutating: Option<std::sync::MutexGuard<'_, ()>>,
        ns: std::sync::RwLockWriteGuard<'_, Namespace>,
        ops: Vec<Op>,
        removed: &[u64],
        mut muts: Vec<Mutation>,
    ) -> FsResult<Vec<u64>> {
        let mut ns = ns;
        let through = self.cfg.write_mode.acknowledges_from_home();
        let published = self.names.coherence().is_some().then(|| ops.clone());
        let mut held = Vec::new();
        {
            let mut j = self.pipeline.journal();
            for op in ops {
                // A file gone from all its names has nowhere for its data and attributes to go (its removal
                // dropped those queued before it): one made after, by a write or close racing the removal,
                // would push the gone file's bytes at its old path.
                if matches!(op.kind, OpKind::Data | OpKind::SetAttr { .. } | OpKind::SetXattr { .. })
                    && ns.inodes.get(&op.ino).is_some_and(|n| n.removed)
                {
                    continue;
                }
                if through {
                    let mut op = op;
                    // See Changes::land: one a crash leaves queued is pushed as a repeat.
                    op.attempted = true;
                    let (seq, m) = j.record_held(op);
                    held.push(seq);
                    muts.extend(m);
                } else {
                    muts.extend(j.record(op));
                }
            }
            for &ino in removed {
                muts.extend(j.forget_removed(ino));
                // A directory removed here keeps its record until its removal reaches home; made and removed
                // before either reached home, both are gone from the journal, and its record goes now.
                if !j.has(ino)
                    && let Some(node) = ns.inodes.get(&ino)
                    && node.removed
                    && node.kind == FileKind::Dir
                {
                    muts.push(Mutation::DelInode(ino));
                    if node.lookups() == 0 && node.opens() == 0 {
                        ns.inodes.remove(&ino);
                    }
                }
            }
        }
        // Submitted under the namespace's lock: records reach the index in the order of the changes that
        // made them. (Submitted after it, a record taken here could land after a newer one of the same
        // inode, another thread's, and a crash would bring back the older: a directory under a parent it
        // had left, cut off from the root once that parent goes.)
        let db = self.core.store.db();
        db.submit(muts);
        // (With what a caller gathered before: all of it under the lock.)
        db.submit_gathered();
        drop(ns);
        drop(mutating);
        // A change within the sync lag is not ready yet: the pushers look again at their next wake-up
        // (`flusher::POLL`), so only one that may go now wakes one.
        if self.cfg.sync_lag.is_zero() || self.pipeline.urgent() {
            self.pipeline.notify_one();
        }
        // Write-through syncs nothing here: it is acknowledged once home has the change (`Changes::land`).
        // Otherwise the change is as durable as the index promises (logged, or fsynced) before it returns.
        if !through {
            db.settle()?;
        }
        if let Some(ops) = published {
            self.names.publish_ops(&ops);
        }
        Ok(held)
    }

    pub(crate) fn record_of(ns: &Namespace, ino: u64) -> Option<Mutation> {
        ns.inodes
            .get(&ino)
            .filter(|n| !n.removed)
            .map(|n| Mutation::PutInode(ino, n.record().encode()))
    }

    /// Whether `name` exists in `parent` (asking home if the cache cannot say).
    fn exists(&self, parent: u64, name: &OsStr) -> FsResult<Option<u64>> {
        match self.names.find(parent, name) {
            Ok(ino) => Ok(Some(ino)),
            Err(FsError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Check that `name` may be created in `parent` (writable mount, valid and unused name); returns the
    /// namespace-change lock the creation holds. Home is asked (where the cache cannot say) before the lock
    /// is taken; under it, the cache alone tells whether the name was taken meanwhile.
    fn free_name(&self, parent: u64, name: &OsStr) -> FsResult<std::sync::MutexGuard<'_, ()>> {
        self.names.writable()?;
        check_name(name)?;
        self.names.take_token_of_held_dir(parent)?;
        if self.exists(parent, name)?.is_some() {
            return Err(FsError::Exists);
        }
        let m = self.names.mutate();
        if !self.still_bound(parent, name, None, false) {
            return Err(FsError::Exists);
        }
        Ok(m)
    }

    /// Whether `name` in `parent` is bound in the cache to `ino` (`None`: to nothing), and, with
    /// `empty`, `ino` is a directory with no entries: what a check made before the namespace-change lock was
    /// taken found, still true under it.
    fn still_bound(&self, parent: u64, name: &OsStr, ino: Option<u64>, empty: bool) -> bool {
        let ns = self.names.read();
        let now = ns.bound(parent, name);
        let empty_ok = !empty || ino.is_none_or(|i| ns.inodes.get(&i).is_some_and(|n| n.d().children.is_empty()));
        now == ino && empty_ok
    }

    /// The object `name` in `parent` that a removal may remove: it exists, is of the right kind, and (a
    /// directory) is empty. May ask home.
    fn removable(&self, parent: u64, name: &OsStr, dir: bool) -> FsResult<u64> {
        let child = self.exists(parent, name)?.ok_or(FsError::NotFound)?;
        let kind = self.names.read().inode(child)?.kind;
        match (dir, kind == FileKind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            _ => {}
        }
        if dir && self.names.listing(child)?.len() > 2 {
            return Err(FsError::NotEmpty);
        }
        Ok(child)
    }

    /// Touch a directory's times and link count after one of its entries changed.
    fn dir_changed(ns: &mut Namespace, dir: u64, nlink_delta: i32) {
        if let Some(a) = ns.inodes.get_mut(&dir).and_then(|d| d.attr.as_mut()) {
            let now = SystemTime::now();
            a.mtime = now;
            a.ctime = now;
            a.nlink = (a.nlink as i64 + nlink_delta as i64).max(1) as u32;
        }
    }

    /// The owner of an object the caller `uid`:`gid` makes in a directory of attributes `pattr`: the
    /// caller's (the directory's group where it is set-group-ID), or the daemon's without `set_owner`; and
    /// the owner its create at home names (`None`: home's own choice, the daemon's or the directory's).
    fn owner_of_new(&self, pattr: Option<&HomeAttr>, uid: u32, gid: u32) -> (u32, u32, (Option<u32>, Option<u32>)) {
        let setgid_parent = pattr.is_some_and(|a| a.perm & 0o2000 != 0);
        let (uid, gid) = if self.cfg.set_owner {
            (
                uid,
                if setgid_parent {
                    pattr.map_or(gid, |a| a.gid)
                } else {
                    gid
                },
            )
        } else {
            // SAFETY: getters without side effects.
            unsafe { (libc::geteuid(), libc::getegid()) }
        };
        let owner = (
            self.cfg.set_owner.then_some(uid),
            (self.cfg.set_owner && !setgid_parent).then_some(gid),
        );
        (uid, gid, owner)
    }

    /// A regular file with no name, in directory `parent` (`open(2)`'s `O_TMPFILE`), opened: it lives in
    /// the cache only, as a file removed while open does, and is gone at its last close, unless
    /// `linkat(2)` names it first ([`Changes::link`]): home hears of it only then. Nothing of it is in the
    /// index but its numbers, so a restart forgets it, as a local file system's mount does.
    pub(crate) fn tmpfile(&self, parent: u64, mode: u32, uid: u32, gid: u32) -> FsResult<(Entry, OpenReply)> {
        self.names.writable()?;
        let mut ns = self.names.write();
        let p = ns.inode(parent)?;
        if p.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        let pattr = p.attr.clone();
        let (uid, gid, _) = self.owner_of_new(pattr.as_ref(), uid, gid);
        let now = SystemTime::now();
        let ino = ns.next_ino;
        ns.next_ino += 1;
        let object = self.names.alloc_object(&mut ns);
        let mut node = Inode::new_local(parent, OsStr::new(""), FileKind::File, object);
        node.attr = Some(HomeAttr {
            kind: FileKind::File,
            id: 0,
            size: 0,
            perm: mode & 0o7777,
            uid,
            gid,
            nlink: 1,
            rdev: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            version: Version(String::new()),
        });
        node.checked = Some(Instant::now());
        node.own = true;
        node.removed = true;
        *node.lookups.get_mut() = 1;
        ns.inodes.insert(ino, Box::new(node));
        let entry = self.names.entry(&ns, ino)?;
        let reply = self.names.open_handle(&ns, ino)?;
        let muts = vec![
            Mutation::PutMeta("next_ino", ns.next_ino),
            Mutation::PutMeta("next_object", ns.next_object),
        ];
        self.commit(None, ns, Vec::new(), &[], muts)?;
        Ok((entry, reply))
    }

    /// Create a directory.
    pub(crate) fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry> {
        self.make(parent, name, mode, NewKind::Dir, uid, gid)
    }

    /// Create a special or regular file.
    pub(crate) fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u64, uid: u32, gid: u32) -> FsResult<Entry> {
        self.make(parent, name, mode, NewKind::Special { rdev }, uid, gid)
    }

    /// Create a symlink.
    pub(crate) fn symlink(&self, parent: u64, name: &OsStr, target: &[u8], uid: u32, gid: u32) -> FsResult<Entry> {
        self.make(parent, name, 0o777, NewKind::Symlink { target }, uid, gid)
    }

    /// Create an empty regular file (the caller opens it).
    pub(crate) fn create_file(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry> {
        self.make(parent, name, mode, NewKind::File, uid, gid)
    }

    /// Remove a file.
    pub(crate) fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.names.take_token_at(parent, name)?;
        self.remove(parent, name, false)
    }

    /// Remove an empty directory.
    pub(crate) fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.names.take_token_at(parent, name)?;
        self.remove(parent, name, true)
    }

    /// Create `name` in `parent` in the cache and queue its creation at home.
    fn make(&self, parent: u64, name: &OsStr, mode: u32, kind: NewKind<'_>, uid: u32, gid: u32) -> FsResult<Entry> {
        let mutating = self.free_name(parent, name)?;
        let mut ns = self.names.write();
        let p = ns.inode(parent)?;
        if p.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        let pattr = p.attr.clone();
        let path = path_bytes(&ns.child_path(parent, name)?);
        let setgid_parent = pattr.as_ref().is_some_and(|a| a.perm & 0o2000 != 0);
        let (uid, gid, owner) = self.owner_of_new(pattr.as_ref(), uid, gid);
        let mut perm = mode & 0o7777;
        let (file_kind, op_kind, size, rdev) = match kind {
            NewKind::File => (
                FileKind::File,
                OpKind::Create {
                    mode: perm,
                    uid: owner.0,
                    gid: owner.1,
                },
                0,
                0,
            ),
            NewKind::Dir => {
                if setgid_parent {
                    perm |= 0o2000;
                }
                (
                    FileKind::Dir,
                    OpKind::Mkdir {
                        mode: perm,
                        uid: owner.0,
                        gid: owner.1,
                    },
                    0,
                    0,
                )
            }
            NewKind::Special { rdev } => (
                FileKind::from_mode(mode),
                OpKind::Mknod {
                    mode,
                    rdev,
                    uid: owner.0,
                    gid: owner.1,
                },
                0,
                rdev,
            ),
            NewKind::Symlink { target } => (
                FileKind::Symlink,
                OpKind::Symlink {
                    target: target.to_vec(),
                    uid: owner.0,
                    gid: owner.1,
                },
                target.len() as u64,
                0,
            ),
        };
        // Nothing is changed before this check: a name home cannot store is refused with nothing queued.
        self.names.check_storable(&ns, parent, name, file_kind, None)?;
        let now = SystemTime::now();
        let attr = HomeAttr {
            kind: file_kind,
            id: 0,
            size,
            perm: if file_kind == FileKind::Symlink { 0o777 } else { perm },
            uid,
            gid,
            nlink: if file_kind == FileKind::Dir { 2 } else { 1 },
            rdev,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            version: Version(String::new()),
        };
        let ino = ns.next_ino;
        ns.next_ino += 1;
        let object = if file_kind == FileKind::File {
            self.names.alloc_object(&mut ns)
        } else {
            0
        };
        let mut node = Inode::new_local(parent, name, file_kind, object);
        node.attr = Some(attr);
        node.checked = Some(Instant::now());
        node.own = true;
        *node.lookups.get_mut() = 1;
        if let NewKind::Symlink { target } = kind {
            node.symlink = Some(target.to_vec());
        }
        if file_kind == FileKind::Dir {
            node.dm().listed = Some(Instant::now());
        }
        ns.inodes.insert(ino, Box::new(node));
        let p = ns.inode_mut(parent)?;
        p.dm().children.insert(name.to_os_string(), ino);
        p.dm().negatives.remove(name);
        Self::dir_changed(&mut ns, parent, if file_kind == FileKind::Dir { 1 } else { 0 });
        let mut muts = vec![
            Mutation::PutMeta("next_ino", ns.next_ino),
            Mutation::PutMeta("next_object", ns.next_object),
            Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino),
        ];
        muts.extend(Self::record_of(&ns, ino));
        muts.extend(Self::record_of(&ns, parent));
        let entry = self.names.entry(&ns, ino)?;
        let op = Op::new(ino, path, vec![(parent, name.as_bytes().to_vec())], op_kind);
        self.commit(Some(mutating), ns, vec![op], &[], muts)?;
        Ok(entry)
    }

    /// Remove `name` from `parent` in the cache and queue its removal at home.
    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> FsResult<()> {
        self.names.writable()?;
        check_name(name)?;
        // Checked without the namespace-change lock (home may be asked), then again under it from the cache
        // alone; only if something changed in between is home asked under it.
        let found = self.removable(parent, name, dir).map(Some).or_else(left_memory)?;
        let mutating = self.names.mutate();
        let child = if let Some(found) = found
            && self.still_bound(parent, name, Some(found), dir)
        {
            found
        } else {
            self.removable(parent, name, dir)?
        };
        // Its changes to the index (the entry and record removed, the op, the queued ops it cancels) reach
        // it as one submission: a stop between them would leave a file no entry names with its create still
        // queued, and home would get a file the cache no longer has. Its cache object goes after that
        // submission, so that a stop before it finds the file whole.
        // (Write-through pushes it after that submission: the op is on record as a repeat first.)
        let db = self.core.store.db().clone();
        let (retire, held) = db.gathered(|| self.remove_bound(mutating, parent, name, child, dir))?;
        for (object, in_use) in retire {
            self.core.store.remove_object_with(object, in_use);
        }
        self.land(&held)
    }

    /// [`Changes::remove`] of `child`, found bound as `name` in `parent`, under the namespace-change lock, up to
    /// the push: returns the cache objects to remove once its changes are submitted, and the ops to
    /// [`Changes::land`].
    fn remove_bound(
        &self,
        mutating: std::sync::MutexGuard<'_, ()>,
        parent: u64,
        name: &OsStr,
        child: u64,
        dir: bool,
    ) -> FsResult<(Retired, Vec<u64>)> {
        let mut ns = self.names.write();
        let path = path_bytes(&ns.child_path(parent, name)?);
        ns.retire_later = Some(Vec::new());
        self.names.unbind(&mut ns, parent, name, false);
        let retire = ns.retire_later.take().unwrap_or_default();
        let gone = ns.inodes.get(&child).is_none_or(|n| n.removed);
        if !gone && let Some(a) = ns.inodes.get_mut(&child).and_then(|n| n.attr.as_mut()) {
            a.nlink = a.nlink.saturating_sub(1).max(1);
            a.ctime = SystemTime::now();
        }
        let p = ns.inode_mut(parent)?;
        p.dm().negatives.insert(name.to_os_string(), Instant::now());
        Self::dir_changed(&mut ns, parent, if dir { -1 } else { 0 });
        let mut muts = Vec::new();
        muts.extend(Self::record_of(&ns, parent));
        if !gone {
            muts.extend(Self::record_of(&ns, child));
        }
        let kind = if dir { OpKind::Rmdir } else { OpKind::Unlink };
        let op = Op::new(child, path, vec![(parent, name.as_bytes().to_vec())], kind);
        let removed = if gone { vec![child] } else { Vec::new() };
        let held = self.queue(Some(mutating), ns, vec![op], &removed, muts)?;
        Ok((retire, held))
    }

    /// Hard-link `ino` as `name` in `parent`.
    pub(crate) fn link(&self, ino: u64, parent: u64, name: &OsStr) -> FsResult<Entry> {
        self.names.take_token_of(ino)?;
        let mutating = self.free_name(parent, name)?;
        let mut ns = self.names.write();
        if ns.inode(parent)?.kind != FileKind::Dir {
            return Err(FsError::NotDir);
        }
        self.names.check_link(&ns, ino, parent, name)?;
        if ns.inode(ino)?.removed {
            return self.link_unnamed(mutating, ns, ino, parent, name);
        }
        let from = path_bytes(&ns.path_of(ino)?);
        let to = path_bytes(&ns.child_path(parent, name)?);
        let node = ns.inode_mut(ino)?;
        node.aliases.push((parent, name.to_os_string()));
        *node.lookups.get_mut() += 1;
        if let Some(a) = node.attr.as_mut() {
            a.nlink += 1;
            a.ctime = SystemTime::now();
        }
        let (muts, entry) = self.bind_link(&mut ns, ino, parent, name)?;
        let op = Op::new(ino, from, vec![(parent, name.as_bytes().to_vec())], OpKind::Link { to });
        self.commit(Some(mutating), ns, vec![op], &[], muts)?;
        Ok(entry)
    }

    /// Enter `ino` as `name` in `parent` (a link): the directory's entry and times, and the records and
    /// entry to persist, with the entry to answer.
    fn bind_link(&self, ns: &mut Namespace, ino: u64, parent: u64, name: &OsStr) -> FsResult<(Vec<Mutation>, Entry)> {
        let p = ns.inode_mut(parent)?;
        p.dm().children.insert(name.to_os_string(), ino);
        p.dm().negatives.remove(name);
        Self::dir_changed(ns, parent, 0);
        let mut muts = vec![Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino)];
        muts.extend(Self::record_of(ns, ino));
        muts.extend(Self::record_of(ns, parent));
        Ok((muts, self.names.entry(ns, ino)?))
    }

    /// [`Changes::link`] of a file that has no name (made by `O_TMPFILE`, or removed while open): it gets
    /// `name` in `parent` as a new file, and home gets it as one made there, with its content: a create
    /// now, its size with it, and its written data at its next close or `fsync`, as a new file's.
    fn link_unnamed(
        &self,
        mutating: std::sync::MutexGuard<'_, ()>,
        mut ns: std::sync::RwLockWriteGuard<'_, Namespace>,
        ino: u64,
        parent: u64,
        name: &OsStr,
    ) -> FsResult<Entry> {
        let node = ns.inode(ino)?;
        if node.kind != FileKind::File || node.object == 0 {
            return Err(FsError::NotFound);
        }
        let path = path_bytes(&ns.child_path(parent, name)?);
        let (_, _, owner) = self.owner_of_new(ns.inode(parent)?.attr.as_ref(), 0, 0);
        let node = ns.inode_mut(ino)?;
        node.removed = false;
        node.parent = parent;
        node.name = name.to_os_string();
        node.aliases.clear();
        node.home_loc = None;
        *node.lookups.get_mut() += 1;
        let attr = node.attr.as_mut().ok_or(FsError::BadHandle)?;
        attr.nlink = 1;
        attr.ctime = SystemTime::now();
        let (perm, size) = (attr.perm, attr.size);
        // The owner is the file's, set since it was made (where larder sets owners at home at all).
        let owner = (owner.0.map(|_| attr.uid), owner.1.map(|_| attr.gid));
        let (muts, entry) = self.bind_link(&mut ns, ino, parent, name)?;
        let at = vec![(parent, name.as_bytes().to_vec())];
        let mut ops = vec![Op::new(
            ino,
            path.clone(),
            at.clone(),
            OpKind::Create {
                mode: perm,
                uid: owner.0,
                gid: owner.1,
            },
        )];
        if size > 0 {
            ops.push(Op::new(ino, path, at, OpKind::Data));
        }
        self.commit(Some(mutating), ns, ops, &[], muts)?;
        Ok(entry)
    }

    /// Change attributes (a size change is queued as data).
    pub(crate) fn setattr(&self, ino: u64, changes: &SetAttr) -> FsResult<Entry> {
        self.setattr_dropping(ino, changes, None)
    }

    /// A write by a caller without `CAP_FSETID` (the kernel says so, and leaves the rest to the file
    /// system): a file's set-ID bits go as [`crate::Fs::setattr_dropping`] says.
    pub(crate) fn drop_set_id(&self, ino: u64, in_group: InGroup) -> FsResult<()> {
        let has = self
            .names
            .read()
            .inode(ino)?
            .attr
            .as_ref()
            .is_some_and(|a| set_id_dropped(a.perm, a.gid, in_group) != a.perm);
        if has {
            self.setattr_dropping(ino, &SetAttr::default(), Some(in_group))?;
            // The kernel takes the new mode from nothing else after a direct write (a buffered one
            // asks for it with a setattr of its own): what it holds goes before the write is answered.
            self.names.invalidate(crate::Invalidation::Attr(ino));
            self.names.kernel_barrier();
        }
        Ok(())
    }

    /// [`crate::Fs::setattr`], and with `drop_set_id`, what the kernel leaves to the file system when it lets it
    /// clear set-ID bits itself (`FUSE_HANDLE_KILLPRIV_V2`, which spares a refresh of the attributes
    /// before every `chown`), as Linux's own file systems do: a non-directory's set-user-ID bit goes, and
    /// its set-group-ID bit when group execute is set or the caller is not in the file's group (without
    /// group execute the bit marks mandatory locking, kept for the group's members), unless the change
    /// sets the mode itself. The caller says when, and who asks (`in_group`): always at an owner change,
    /// and at a truncation or write by a caller without `CAP_FSETID`.
    pub(crate) fn setattr_dropping(
        &self,
        ino: u64,
        changes: &SetAttr,
        drop_set_id: Option<InGroup>,
    ) -> FsResult<Entry> {
        self.names.writable()?;
        let (kind, flush_lock, write_lock) = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            (node.kind, node.flush_lock.clone(), node.write_lock.clone())
        };
        if changes.size.is_some() && kind == FileKind::Dir {
            return Err(FsError::IsDir);
        }
        // The token, and still this node's once the write lock is (as for a write).
        let (_f, _w) = loop {
            self.names.take_token_of(ino)?;
            // What the kernel wrote to the cache file comes first: a truncation or a size is taken after it.
            self.data.adopt_all_direct_writes(ino);
            let f = lock(&flush_lock);
            let w = lock(&write_lock);
            if self.names.token_still_held(ino) {
                break (f, w);
            }
        };
        let mut ns = self.names.write();
        let path = path_bytes(&ns.path_of(ino)?);
        let now = SystemTime::now();
        let node = ns.inode_mut(ino)?;
        let object = node.object;
        let mut ops = Vec::new();
        if let Some(size) = changes.size {
            self.core.store.truncate(object, size)?;
            let node = ns.inode_mut(ino)?;
            let old = node.attr.as_ref().map_or(0, |a| a.size);
            let kept: Vec<_> = node
                .dirty
                .drain(..)
                .filter(|r| r.start < size)
                .map(|r| r.start..r.end.min(size))
                .collect();
            for r in kept {
                add_range(&mut node.dirty, r);
            }
            node.home_size = Some(node.home_size.unwrap_or(old).min(size));
            if let Some(u) = node.unconfirmed.as_mut() {
                u.ranges = crate::ranges::subtract(&u.ranges, std::slice::from_ref(&(size..u64::MAX)));
            }
            if let Some(a) = node.attr.as_mut() {
                a.size = size;
                a.mtime = now;
                a.ctime = now;
            }
            ops.push(Op::new(ino, path.clone(), Vec::new(), OpKind::Data));
        }
        let node = ns.inode_mut(ino)?;
        let resolve = |t: Option<TimeSet>| {
            t.map(|t| match t {
                TimeSet::Now => now,
                TimeSet::At(at) => at,
            })
        };
        let (atime, mtime) = (resolve(changes.atime), resolve(changes.mtime));
        let perm = match (&node.attr, changes.perm) {
            (Some(a), None) if node.kind != FileKind::Dir => drop_set_id
                .map(|in_group| set_id_dropped(a.perm, a.gid, in_group))
                .filter(|p| *p != a.perm),
            (_, perm) => perm,
        };
        let other = perm.is_some() || changes.uid.is_some() || changes.gid.is_some();
        if other || atime.is_some() || mtime.is_some() {
            if let Some(a) = node.attr.as_mut() {
                if let Some(p) = perm {
                    a.perm = p & 0o7777;
                }
                if let Some(u) = changes.uid {
                    a.uid = u;
                }
                if let Some(g) = changes.gid {
                    a.gid = g;
                }
                if let Some(t) = atime {
                    a.atime = t;
                }
                if let Some(t) = mtime {
                    a.mtime = t;
                }
                a.ctime = now;
            }
            ops.push(Op::new(
                ino,
                path,
                Vec::new(),
                OpKind::SetAttr {
                    perm: perm.map(|p| p & 0o7777),
                    uid: changes.uid,
                    gid: changes.gid,
                    atime: atime.map(to_ns),
                    mtime: mtime.map(to_ns),
                },
            ));
        }
        let entry = self.names.entry(&ns, ino)?;
        let muts: Vec<Mutation> = Self::record_of(&ns, ino).into_iter().collect();
        let held = self.queue(None, ns, ops, &[], muts)?;
        drop((_w, _f));
        self.land(&held)?;
        Ok(entry)
    }

    /// Queue the written data of `ino` for home (fsync and close): in the cache first (write-back, local),
    /// pushed before it returns (write-through). In the cache, the data is written to the operating system
    /// and indexed as the index's durability promises; with `durable` (fsync), or with power durability,
    /// the cache file is fsynced too.
    pub(crate) fn commit_data(&self, ino: u64, durable: bool) -> FsResult<()> {
        let write_lock = self.names.read().inode(ino)?.write_lock.clone();
        let _w = lock(&write_lock);
        let (object, blocks, size) = {
            let ns = self.names.read();
            let node = ns.inode(ino)?;
            if node.removed || node.dirty.is_empty() {
                return Ok(());
            }
            let bs = self.core.store.block_size();
            let blocks = blocks_in(&node.dirty, bs);
            (node.object, blocks, node.attr.as_ref().map_or(0, |a| a.size))
        };
        if !self.cfg.write_mode.acknowledges_from_home() {
            // Acknowledged from the cache: indexed and durable there first. (Write-through acknowledges
            // from home; its push indexes the blocks as clean.)
            self.core.store.commit(object, blocks, size)?;
            self.data.label_unpushed(ino);
            if durable || self.core.store.db().durability() == larder_cache::Durability::Power {
                self.core
                    .store
                    .file(object)?
                    .sync_data()
                    .map_err(|e| FsError::Cache(larder_cache::CacheError::Io(e)))?;
            }
        }
        let ns = self.names.write();
        let path = path_bytes(&ns.path_of(ino)?);
        let muts: Vec<Mutation> = Self::record_of(&ns, ino).into_iter().collect();
        let op = Op::new(ino, path, Vec::new(), OpKind::Data);
        let held = self.queue(None, ns, vec![op], &[], muts)?;
        drop(_w);
        self.land(&held)
    }

    /// Whether `bytes` more dirty data fit now, with no wait: in the cache's bound for dirty data (but in
    /// write-through, where it leaves at the next close) and on the cache disk.
    pub(crate) fn room_now(&self, bytes: u64) -> bool {
        let stats = self.core.store.stats();
        let dirty_fits = stats.bytes_dirty + bytes <= stats.bytes_limit / 10 * 9;
        (!self.cfg.write_mode.pushes_to_make_room() || dirty_fits) && self.core.store.room_on_disk(bytes)
    }

    /// Hold a writer back while dirty data is near the cache's capacity, or the cache disk near full (past
    /// the headroom the store keeps for its index: `larder-cache/src/store/space.rs`); `ENOSPC` if it stays
    /// there. Clean data is evicted to make room first; then what is dirty is queued and pushed at once
    /// (pushed, it can be evicted), and the writer waits while that makes progress, at most `ROOM_WAIT`.
    pub(crate) fn make_room(&self, bytes: u64) -> FsResult<()> {
        let limit = self.core.store.stats().bytes_limit / 10 * 9;
        let dirty_fits = || self.core.store.stats().bytes_dirty + bytes <= limit;
        let early = self.cfg.write_mode.pushes_to_make_room();
        if self.room_now(bytes) {
            return Ok(());
        }
        if !early {
            // Write-through: dirty data leaves at the next close or fsync; local: it never leaves.
            return if self.core.store.room_on_disk(bytes) {
                Ok(())
            } else {
                Err(FsError::NoSpace)
            };
        }
        // Files still open hold dirty data no close has queued yet: queue it, so the flushers can free room.
        let dirty: Vec<u64> = self
            .names
            .read()
            .inodes
            .iter()
            .filter(|(_, n)| !n.dirty.is_empty() && !n.removed)
            .map(|(i, _)| *i)
            .collect();
        for ino in dirty {
            self.commit_data(ino, false)?;
        }
        let _hurry = self.pipeline.hurry();
        let deadline = Instant::now() + ROOM_WAIT;
        // The pushes make progress while dirty data leaves (pushed, it can be evicted): a writer waits while
        // it does, not for a disk something else filled.
        let mut progress = (self.core.store.stats().bytes_dirty, Instant::now());
        loop {
            if dirty_fits() && self.core.store.room_on_disk(bytes) {
                break Ok(());
            }
            let dirty = self.core.store.stats().bytes_dirty;
            if dirty < progress.0 {
                progress = (dirty, Instant::now());
            }
            // Nothing to wait for: home away, nothing left to push, or pushes that free nothing.
            let stuck = !self.health.online()
                || self.pipeline.journal().is_empty()
                || dirty == 0
                || progress.1.elapsed() > ROOM_PROGRESS;
            if Instant::now() >= deadline || stuck {
                break Err(FsError::NoSpace);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether the caller of a change is in a group: its own, one of its supplementary groups, or any when it
/// has `CAP_FSETID` (Linux's `in_group_or_capable`).
pub type InGroup<'a> = &'a dyn Fn(u32) -> bool;

/// `perm` of a file of group `gid` without its set-user-ID bit, and without its set-group-ID bit when
/// group execute is set or the caller is not in the group (Linux's `setattr_should_drop_sgid`).
fn set_id_dropped(perm: u32, gid: u32, in_group: InGroup) -> u32 {
    let mut p = perm & !libc::S_ISUID;
    if p & libc::S_ISGID != 0 && (p & libc::S_IXGRP != 0 || !in_group(gid)) {
        p &= !libc::S_ISGID;
    }
    p
}

/// Cache objects a removal let go of, each with whether a push reads it still: removed once the removal's
/// changes are submitted (see `Changes::remove`).
type Retired = Vec<(u64, bool)>;

/// What a check made before the namespace-change lock is taken does when an object it found left memory
/// before it was read (nothing referred to it: `Names::reclaim`): no error, but a change like any other, and
/// the check is made again under the lock (`None`).
fn left_memory<T>(e: FsError) -> FsResult<Option<T>> {
    match e {
        FsError::BadHandle => Ok(None),
        e => Err(e),
    }
}
