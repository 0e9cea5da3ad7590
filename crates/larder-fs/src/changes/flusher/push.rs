//! Taking one journal op to home (`push_op`), and recording in the namespace what it made true there
//! (`settle_namespace`): the home location, renames in flight, attributes.

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use larder_home::{HomeAttr, HomeError, NewFile, RenameFlags, SetAttr, TimeSet, unreachable};

use super::{COMPARE_MAX, Outcome, os, owner_of};
use crate::FsError;
use crate::changes::Changes;
use crate::journal::{Op, OpKind};
use crate::namespace::{Namespace, lock};
use crate::record::from_ns;

impl Changes {
    /// Take one op to home. `strict` (write-through, whose caller waits for the answer): what home says
    /// is the answer, with no conflict handling: a name home has already is `EEXIST`, a name it lacks
    /// `ENOENT`, a file changed at home a conflict.
    pub(super) fn push_op(&self, op: &Op, repeated: bool, strict: bool) -> Outcome {
        // After a restart the object may not be in memory yet; what the push settles (where home has it,
        // its version) must reach its record.
        let _ = self.names.load_inode(&mut self.names.write(), op.ino);
        // Descriptors open on a version this op takes from home read the rest of it from the cache.
        if let Err(e) = self.data.keep_for_readers(op) {
            return match e {
                FsError::Home(e) => self.classify(e),
                e => Outcome::Refused(e),
            };
        }
        let home = self.core.home.as_ref();
        let path = os(&op.path);
        let result: Result<Option<HomeAttr>, HomeError> = match &op.kind {
            OpKind::Create { mode, uid, gid } => match home.create_file(
                &path,
                &NewFile {
                    mode: *mode,
                    owner: owner_of(*uid, *gid),
                    mtime: self.local_mtime(op.ino),
                    content: None,
                },
            ) {
                Err(HomeError::Exists) if !repeated && !strict => return self.name_taken(op),
                Err(HomeError::Exists) if repeated => home.stat(&path).map(Some),
                r => r.map(Some),
            },
            OpKind::Mkdir { mode, uid, gid } => match home.mkdir(&path, *mode, owner_of(*uid, *gid)) {
                // A directory of that name at home: the two merge.
                Err(HomeError::Exists) if !strict => match home.stat(&path) {
                    Ok(a) if a.kind == larder_home::FileKind::Dir => Ok(Some(a)),
                    Ok(_) => return self.name_taken(op),
                    Err(e) => Err(e),
                },
                r => r.map(Some),
            },
            OpKind::Mknod { mode, rdev, uid, gid } => match home.mknod(&path, *mode, *rdev, owner_of(*uid, *gid)) {
                Err(HomeError::Exists) if !repeated && !strict => return self.name_taken(op),
                Err(HomeError::Exists) if repeated => home.stat(&path).map(Some),
                r => r.map(Some),
            },
            OpKind::Symlink { target, uid, gid } => match home.symlink(target, &path, owner_of(*uid, *gid)) {
                Err(HomeError::Exists) if !repeated && !strict => return self.name_taken(op),
                Err(HomeError::Exists) if repeated => home.stat(&path).map(Some),
                r => r.map(Some),
            },
            OpKind::Link { to } => match home.link(&path, &os(to)) {
                Err(HomeError::Exists) if !repeated && !strict => return self.name_taken(op),
                Err(HomeError::Exists) if repeated => home.stat(&os(to)).map(Some),
                r => r.map(Some),
            },
            OpKind::Unlink => match home.unlink(&path) {
                Err(HomeError::NotFound) if !strict => Ok(None),
                r => r.map(|_| None),
            },
            OpKind::Rmdir => match home.rmdir(&path) {
                Err(HomeError::NotFound) if !strict => Ok(None),
                r => r.map(|_| None),
            },
            OpKind::Rename {
                to,
                no_replace,
                exchange,
                replaced,
            } => {
                // Write-back renames onto a name it found free only if it is still free: home's object there
                // is kept as a conflict. Write-through does what POSIX rename does, at home.
                let flags = RenameFlags {
                    no_replace: *no_replace || (!strict && !replaced && !exchange),
                    exchange: *exchange,
                };
                let renamed = match home.rename(&path, &os(to), flags) {
                    // Gone from the source and present at the target: an earlier attempt did it.
                    Err(HomeError::NotFound) if repeated && home.stat(&os(to)).is_ok() => Ok(None),
                    // A home that renames by copy, then delete (an object store) left an earlier attempt's
                    // work at the target: copies of the source's entries, and entries whose sources that
                    // attempt deleted already. The move is finished: nothing there but ours is replaced.
                    Err(HomeError::Exists) if repeated && partly_moved(home, &path, &os(to), &mut { COMPARE_MAX }) => {
                        finish_move(home, &path, &os(to)).map(|_| None)
                    }
                    Err(HomeError::Exists) if !no_replace && !strict => {
                        // Home gained an object at the target meanwhile: keep it beside ours.
                        let aside = self.conflict_path(to);
                        match home.rename(&os(to), &aside, RenameFlags::default()) {
                            Ok(()) => {
                                self.record_conflict(
                                    to,
                                    "rename",
                                    String::from_utf8_lossy(aside.as_os_str().as_bytes()).into_owned(),
                                    true,
                                    "home had another object at the rename's target; it was moved beside".into(),
                                );
                                home.rename(&path, &os(to), flags).map(|_| None)
                            }
                            Err(e) => Err(e),
                        }
                    }
                    r => r.map(|_| None),
                };
                // On a home where a rename makes a new version of a file (an object store's copy), the
                // version the next push of it is based on is the target's now, whichever way it got there.
                // (A directory has no version to settle: not asked.)
                let file = self
                    .names
                    .read()
                    .inode(op.ino)
                    .is_ok_and(|n| n.kind != larder_home::FileKind::Dir);
                match renamed {
                    Ok(None) if file && !home.limits().rename_keeps_version => match home.stat(&os(to)) {
                        Ok(a) if a.kind != larder_home::FileKind::Dir => Ok(Some(a)),
                        _ => Ok(None),
                    },
                    r => r,
                }
            }
            OpKind::SetAttr {
                perm,
                uid,
                gid,
                atime,
                mtime,
            } => home
                .setattr(
                    &path,
                    &SetAttr {
                        perm: *perm,
                        uid: *uid,
                        gid: *gid,
                        size: None,
                        atime: atime.map(|t| TimeSet::At(from_ns(t))),
                        mtime: mtime.map(|t| TimeSet::At(from_ns(t))),
                    },
                )
                .map(Some),
            OpKind::Data => return self.push_data_op(op, repeated, strict),
            // Setting or removing is the same again when repeated.
            OpKind::SetXattr { name, value } => home.set_xattr(&path, name, value.as_deref()).map(|()| None),
        };
        let result = match result {
            Ok(Some(attr)) if op.kind.creates() => Ok(Some(self.created_with_local_time(op, &path, attr))),
            other => other,
        };
        match result {
            Ok(attr) => {
                self.settle_namespace(op, attr);
                if matches!(op.kind, OpKind::Rename { .. }) && !home.limits().rename_keeps_version {
                    self.settle_moved_versions(op.ino);
                }
                Outcome::Done
            }
            Err(e) => self.classify(e),
        }
    }

    /// Take to home a file made here (`op`, its create) with its content (`data`, the data push queued
    /// right after it; [`crate::journal::Journal::data_after`]): one home call where home allows it, not
    /// a create, then a write. The outcome is both ops'. A name home has already is handled as the
    /// create's alone would be, its data push left queued; after a crash, a name home has is what an
    /// attempt of ours left there, and the content goes as any data push goes.
    pub(super) fn push_new_file(&self, op: &Op, data: &Op, repeated: bool) -> (Outcome, bool) {
        let OpKind::Create { mode, uid, gid } = op.kind else {
            return (self.push_op(op, repeated, false), false);
        };
        let flush_lock = {
            let mut ns = self.names.write();
            let _ = self.names.load_inode(&mut ns, op.ino);
            match ns.inode(op.ino) {
                Ok(n) if !n.removed => n.flush_lock.clone(),
                // Removed meanwhile: only its create is left to make, as its unlink, queued, expects.
                _ => return (self.push_op(op, repeated, false), false),
            }
        };
        let path = os(&op.path);
        let pushed = {
            let _f = lock(&flush_lock);
            self.data.push_new(op.ino, path, mode, owner_of(uid, gid))
        };
        match pushed {
            Ok(()) => {
                self.settle_namespace(op, None);
                (Outcome::Done, true)
            }
            Err(FsError::Home(HomeError::Exists)) if repeated => {
                self.settle_namespace(op, None);
                let outcome = self.push_data_op(data, true, false);
                let done = matches!(outcome, Outcome::Done);
                (outcome, done)
            }
            Err(FsError::Home(HomeError::Exists)) => (self.name_taken(op), false),
            Err(FsError::BadHandle) if self.removed_for_good(op.ino) => (Outcome::Done, true),
            Err(FsError::Home(e)) => (self.classify(e), false),
            Err(e) => (Outcome::Refused(e), false),
        }
    }

    /// The time a file made here takes to home with its create: the time the mount shows, unless home's
    /// own times are shown (write-through) or home keeps none.
    pub(super) fn local_mtime(&self, ino: u64) -> Option<std::time::SystemTime> {
        if self.cfg.write_mode.shows_home_times() || !self.core.home.limits().times {
            return None;
        }
        self.names.read().inode(ino).ok()?.attr.as_ref().map(|a| a.mtime)
    }

    /// A directory `dir` moved on a home that moves by copying (an object store): every object below it
    /// is a copy, and a copy of an object uploaded in parts has a new version. Every file below it the
    /// cache knows takes the version home has now (one stat each), so that a push of theirs, queued or
    /// made later within the validity lag, is based on it, or it would be refused as a conflict with
    /// itself (`docs/reliability.md`, fault 21). Only the version (and identity) is taken: their queued
    /// changes stand. Files in memory (or with changes queued, loaded for it) are changed there; files
    /// that left memory are changed in their index records, without loading them.
    fn settle_moved_versions(&self, dir: u64) {
        use larder_home::FileKind;
        let (in_memory, stored) = {
            let mut ns = self.names.write();
            if ns.inode(dir).map_or(true, |n| n.kind != FileKind::Dir) {
                return;
            }
            let Ok(Some(top)) = ns.home_path(dir) else { return };
            // Files with changes queued, in memory from here on: their home paths are in memory.
            let mut files = std::collections::BTreeSet::new();
            for ino in self.pipeline.journal().inos() {
                if self.names.load_inode(&mut ns, ino).is_ok() && ns.inode(ino).is_ok_and(|n| n.kind == FileKind::File)
                {
                    files.insert(ino);
                }
            }
            // The directories below it, in memory or in the index only, with their home paths. A file
            // or directory in the index only has no change queued: its record's home location is where
            // home has it below its parent.
            let mut stored = Vec::new();
            let mut dirs = vec![(dir, top.clone())];
            let mut seen = std::collections::HashSet::from([dir]);
            while let Some((d, path)) = dirs.pop() {
                let bound: Vec<u64> = ns
                    .inodes
                    .get(&d)
                    .and_then(|n| n.dir.as_ref())
                    .map(|x| x.children.values().copied().collect())
                    .unwrap_or_default();
                let entries = self.core.store.db().children_of(d).unwrap_or_default();
                // In memory (bound here, or named here by the index only): its home path is in memory.
                let mut took_from_memory = |child: u64, dirs: &mut Vec<(u64, std::path::PathBuf)>| {
                    let Some(node) = ns.inodes.get(&child) else {
                        return false;
                    };
                    match node.kind {
                        FileKind::Dir if seen.insert(child) => {
                            if let Ok(Some(p)) = ns.home_path(child) {
                                dirs.push((child, p));
                            }
                        }
                        FileKind::File => {
                            files.insert(child);
                        }
                        _ => {}
                    }
                    true
                };
                for child in bound {
                    took_from_memory(child, &mut dirs);
                }
                for (name, child, rec) in entries {
                    if took_from_memory(child, &mut dirs) {
                        continue;
                    }
                    let Some(rec) = rec.as_deref().and_then(crate::record::InodeRecord::decode) else {
                        continue;
                    };
                    if rec.home_loc.as_ref() != Some(&(d, name.clone())) {
                        continue;
                    }
                    let at = path.join(std::ffi::OsStr::from_bytes(&name));
                    match rec.kind {
                        FileKind::Dir => dirs.push((child, at)),
                        FileKind::File if rec.attr.is_some() => stored.push((child, at)),
                        _ => {}
                    }
                }
            }
            let mut in_memory = Vec::new();
            for ino in files {
                let Ok(node) = ns.inode(ino) else { continue };
                if node.attr.is_none() {
                    continue;
                }
                // Below `dir` at home (paths compare by component).
                if let Ok(Some(path)) = ns.home_path(ino)
                    && path.starts_with(&top)
                {
                    in_memory.push((ino, path));
                }
            }
            (in_memory, stored)
        };
        for (ino, path) in in_memory.into_iter().chain(stored) {
            let Ok(attr) = self.core.home.stat(&path) else { continue };
            if attr.kind != FileKind::File {
                continue;
            }
            let mut ns = self.names.write();
            if let Ok(node) = ns.inode_mut(ino) {
                if let Some(a) = node.attr.as_mut()
                    && a.version != attr.version
                {
                    a.version = attr.version;
                    a.id = attr.id;
                    self.names.persist(&ns, ino);
                }
                continue;
            }
            // Still in the index only (loading it takes this lock): its record changes there.
            let db = self.core.store.db();
            let Some(mut rec) = db
                .inode(ino)
                .ok()
                .flatten()
                .and_then(|b| crate::record::InodeRecord::decode(&b))
            else {
                continue;
            };
            if let Some(a) = rec.attr.as_ref().map(|a| a.to_attr())
                && a.version != attr.version
            {
                let a = HomeAttr {
                    version: attr.version,
                    id: attr.id,
                    ..a
                };
                rec.attr = Some(crate::record::AttrRecord::from_attr(&a));
                db.submit(vec![larder_cache::Mutation::PutInode(ino, rec.encode())]);
            }
            drop(ns);
        }
    }

    pub(super) fn classify(&self, e: HomeError) -> Outcome {
        if unreachable(&e) {
            Outcome::Retry(e)
        } else {
            Outcome::Refused(e.into())
        }
    }

    /// Record in the namespace what a pushed op made true at home.
    pub(super) fn settle_namespace(&self, op: &Op, attr: Option<HomeAttr>) {
        let mut ns = self.names.write();
        let loc = |i: usize| {
            op.names
                .get(i)
                .map(|(d, n)| (*d, std::ffi::OsString::from_vec(n.clone())))
        };
        match &op.kind {
            OpKind::Create { .. } | OpKind::Mkdir { .. } | OpKind::Mknod { .. } | OpKind::Symlink { .. } => {
                if let Some(node) = ns.inodes.get_mut(&op.ino) {
                    node.home_loc = loc(0);
                }
            }
            OpKind::Rename { exchange, .. } => {
                let (from, to) = (loc(0), loc(1));
                if *exchange {
                    let partner = |ns: &Namespace| {
                        ns.inodes
                            .iter()
                            .find(|(i, n)| **i != op.ino && n.home_loc == to)
                            .map(|(i, _)| *i)
                    };
                    let mut other = partner(&ns);
                    if other.is_none()
                        && let Some((dir, name)) = &from
                    {
                        // Not in memory (a restart since): unless moved again, the partner is where ours
                        // was, and an op that moved it again loaded it.
                        if let Ok(Some(ino)) = self.core.store.db().dentry(*dir, name.as_bytes()) {
                            let _ = self.names.load_inode(&mut ns, ino);
                        }
                        other = partner(&ns);
                    }
                    if let Some(o) = other
                        && let Some(node) = ns.inodes.get_mut(&o)
                    {
                        node.home_loc = from;
                        self.names.load_home_ancestors(&mut ns, o);
                        // Its own ops (if any) are not the ones concluding here.
                        self.names.persist(&ns, o);
                    }
                }
                if let Some(node) = ns.inodes.get_mut(&op.ino) {
                    node.home_loc = to;
                }
                // In the same critical section as the new home location: never one without the other.
                ns.renames.remove(&op.ino);
            }
            OpKind::Unlink => {
                // A hard-linked object lives on at home under another name.
                if let Some(node) = ns.inodes.get_mut(&op.ino)
                    && node.home_loc == loc(0)
                    && !node.removed
                {
                    node.home_loc = Some((node.parent, node.name.clone()));
                }
            }
            _ => {}
        }
        // The directory it is at home in now may not have been looked up since a restart.
        self.names.load_home_ancestors(&mut ns, op.ino);
        if let Some(attr) = attr {
            self.settle_attr(&mut ns, op.ino, attr);
        }
    }

    /// Attributes home gave back for our own change: while more changes of the object are queued, only
    /// its identity and version are taken (the base of the next push); after the last, all of them.
    pub(crate) fn settle_attr(&self, ns: &mut Namespace, ino: u64, attr: HomeAttr) {
        let more = self.pipeline.journal().has_after_current(ino);
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        if node.removed {
            return;
        }
        if more {
            if let Some(a) = node.attr.as_mut() {
                a.version = attr.version;
                a.id = attr.id;
            }
        } else {
            self.names.adopt_attr(ns, ino, attr);
        }
    }

    /// Push a file's data for a `Data` op, with the conflict policy on a version mismatch (`strict`: the
    /// mismatch is the answer, and the data stays dirty).
    pub(super) fn push_data_op(&self, op: &Op, repeated: bool, strict: bool) -> Outcome {
        {
            let mut ns = self.names.write();
            if self.names.load_inode(&mut ns, op.ino).is_err() {
                // Nothing left of it here (removed): nothing to push.
                return Outcome::Done;
            }
        }
        // A push of the file cut short before this one (its record says what it sent) may have changed home,
        // whichever op it was: home holding what it sent is ours, not a conflict.
        let (flush_lock, cut_short) = match self.names.read().inode(op.ino) {
            Ok(n) => (n.flush_lock.clone(), n.unconfirmed.is_some()),
            Err(_) => return Outcome::Done,
        };
        let repeated = repeated || cut_short;
        let _f = lock(&flush_lock);
        let path = os(&op.path);
        // Whether it did is settled before anything more is sent: this push's record replaces that one's,
        // and after a crash during this push home holding what that one sent would be taken for someone
        // else's change. Its version is then the one the changes are made on; its ranges are dirty still
        // (made so when it was found cut short) and go again.
        if cut_short && let Some(attr) = self.data.home_has_ours(op.ino, &path) {
            self.settle_cut_short(op.ino, attr);
        }
        match self.data.push_data(op.ino, Some(path.clone()), false) {
            Ok(()) => Outcome::Done,
            // Removed while the push ran (an unlink takes no flush lock): its data has nowhere to go.
            Err(FsError::BadHandle) if self.removed_for_good(op.ino) => Outcome::Done,
            Err(e @ FsError::Home(HomeError::Conflict | HomeError::NotFound)) if strict => Outcome::Refused(e),
            Err(FsError::Home(HomeError::Conflict)) | Err(FsError::Home(HomeError::NotFound)) => {
                if repeated && self.data.home_has_ours(op.ino, &path).is_some() {
                    // An earlier attempt landed before we could record it.
                    return match self.data.push_data(op.ino, Some(path), true) {
                        Ok(()) => Outcome::Done,
                        Err(FsError::Home(e)) => self.classify(e),
                        Err(e) => Outcome::Refused(e),
                    };
                }
                self.resolve_conflict(op.ino, &op.path)
            }
            Err(FsError::Home(e)) => self.classify(e),
            Err(e) => Outcome::Refused(e),
        }
    }

    /// Home holds what a push of `ino` cut short sent (`attr`, its attributes now): that version is the
    /// base of the next push, and the attempt is settled, on record too.
    fn settle_cut_short(&self, ino: u64, attr: HomeAttr) {
        let mut ns = self.names.write();
        let Ok(node) = ns.inode_mut(ino) else { return };
        if let Some(a) = node.attr.as_mut() {
            a.version = attr.version;
            a.id = attr.id;
        }
        // (A push of the whole content cut short may have left a prefix of it: home's part ends there.)
        node.home_size = Some(node.home_size.map_or(attr.size, |h| h.min(attr.size)));
        node.unconfirmed = None;
        self.names.persist(&ns, ino);
    }

    /// Whether `ino` is gone from memory and from the index: removed, nothing of it left to push.
    fn removed_for_good(&self, ino: u64) -> bool {
        !self.names.read().inodes.contains_key(&ino) && matches!(self.core.store.db().inode(ino), Ok(None))
    }
}

/// Whether `to` at home holds nothing but a copy of (part of) `from`: what a rename cut short leaves on a
/// home that renames by copying, then deleting. Files must match byte for byte, a directory's every entry
/// must be such a copy of the source's entry of that name. `budget` caps the bytes and entries compared; a
/// larger tree counts as not a copy (the conflict path keeps both).
fn leftover_copy(home: &dyn larder_home::Home, from: &Path, to: &Path, budget: &mut u64) -> bool {
    use larder_home::FileKind;
    let (Ok(a), Ok(b)) = (home.stat(from), home.stat(to)) else {
        return false;
    };
    if a.kind != b.kind {
        return false;
    }
    match a.kind {
        FileKind::File => {
            if a.size != b.size || b.size > *budget {
                return false;
            }
            *budget -= b.size;
            if a.version == b.version {
                return true;
            }
            const CHUNK: u64 = 8 << 20;
            let mut off = 0;
            while off < a.size {
                let len = CHUNK.min(a.size - off) as usize;
                match (
                    home.read(from, &a.version, off, len),
                    home.read(to, &b.version, off, len),
                ) {
                    (Ok(x), Ok(y)) if x == y && x.len() == len => off += len as u64,
                    _ => return false,
                }
            }
            true
        }
        FileKind::Symlink => home
            .readlink(from)
            .ok()
            .is_some_and(|x| home.readlink(to).ok() == Some(x)),
        FileKind::Dir => {
            let Ok(entries) = home.list(to) else { return false };
            entries.iter().all(|e| {
                if *budget == 0 {
                    return false;
                }
                *budget -= 1;
                leftover_copy(home, &from.join(&e.name), &to.join(&e.name), budget)
            })
        }
        _ => false,
    }
}

/// Whether `to` at home is what a rename of `from` cut short left there, on a home that renames by copying
/// every object, then deleting the sources: a copy of `from` ([`leftover_copy`]), or, for a directory,
/// one whose every entry is either such a copy of the source's entry of that name or has no source left
/// (moved already: copied, then its source deleted). `budget` as for [`leftover_copy`].
fn partly_moved(home: &dyn larder_home::Home, from: &Path, to: &Path, budget: &mut u64) -> bool {
    use larder_home::FileKind;
    let both_dirs = matches!(
        (home.stat(from), home.stat(to)),
        (Ok(a), Ok(b)) if a.kind == FileKind::Dir && b.kind == FileKind::Dir
    );
    if !both_dirs {
        return leftover_copy(home, from, to, budget);
    }
    let Ok(entries) = home.list(to) else { return false };
    entries.iter().all(|e| {
        if *budget == 0 {
            return false;
        }
        *budget -= 1;
        let src = from.join(&e.name);
        match home.stat(&src) {
            Err(HomeError::NotFound) => true,
            Ok(_) => partly_moved(home, &src, &to.join(&e.name), budget),
            Err(_) => false,
        }
    })
}

/// Finish a move [`partly_moved`] recognised: what is still at `from` goes to `to`, over its copies there,
/// then `from` goes, its mode, owner, time and extended attributes given to `to` first (the attempt cut
/// short may have copied the entries, not the directory's own object that carries them).
fn finish_move(home: &dyn larder_home::Home, from: &Path, to: &Path) -> Result<(), HomeError> {
    use larder_home::FileKind;
    let attr = home.stat(from)?;
    if attr.kind != FileKind::Dir {
        return home.rename(from, to, RenameFlags::default());
    }
    for e in home.list(from)? {
        let (src, dst) = (from.join(&e.name), to.join(&e.name));
        if e.kind == FileKind::Dir && home.stat(&dst).is_ok_and(|a| a.kind == FileKind::Dir) {
            finish_move(home, &src, &dst)?;
        } else {
            home.rename(&src, &dst, RenameFlags::default())?;
        }
    }
    let own = SetAttr {
        perm: Some(attr.perm),
        uid: Some(attr.uid),
        gid: Some(attr.gid),
        mtime: Some(TimeSet::At(attr.mtime)),
        ..SetAttr::default()
    };
    // (Best effort: a home that keeps no modes or owners has nothing to carry.)
    if let Err(e) = home.setattr(to, &own) {
        tracing::debug!(to = %to.display(), error = %e, "a finished move could not give the directory its attributes");
    }
    for (name, value) in home.xattrs(from).unwrap_or_default() {
        let _ = home.set_xattr(to, &name, Some(&value));
    }
    home.rmdir(from)
}
