//! Calls that change names and attributes at home: create, mkdir, mknod, symlink, link, unlink, rmdir,
//! rename, setattr. Each goes to home first (write-through), then updates the namespace mirror, under the
//! `mutate` lock.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

use larder_cache::Mutation;
use larder_home::{FileKind, Home, HomeAttr, HomeError, Owner, RenameFlags, SetAttr};

use crate::namespace::{Fs, Namespace, check_name, lock};
use crate::writeback::NewKind;
use crate::{Entry, FsError, FsResult};

impl Fs {
    fn owner(&self, ns: &Namespace, parent: u64, uid: u32, gid: u32) -> Owner {
        if !self.cfg.set_owner {
            return Owner::default();
        }
        let setgid = ns
            .inodes
            .get(&parent)
            .and_then(|p| p.attr.as_ref())
            .is_some_and(|a| a.perm & 0o2000 != 0);
        Owner {
            uid: Some(uid),
            gid: if setgid { None } else { Some(gid) },
        }
    }

    /// Run a call that creates `name` in `parent` at home, then record the new child.
    fn make(
        &self,
        parent: u64,
        name: &OsStr,
        kind: FileKind,
        uid: u32,
        gid: u32,
        call: impl FnOnce(&dyn Home, &std::path::Path, Owner) -> Result<HomeAttr, HomeError>,
    ) -> FsResult<Entry> {
        self.writable()?;
        check_name(name)?;
        let _m = lock(&self.mutate);
        let (path, owner) = {
            let ns = lock(&self.ns);
            let p = ns.inode(parent)?;
            if p.kind != FileKind::Dir {
                return Err(FsError::NotDir);
            }
            self.check_storable(&ns, parent, name, kind, None)?;
            (ns.child_path(parent, name)?, self.owner(&ns, parent, uid, gid))
        };
        let attr = call(self.core.home.as_ref(), &path, owner)?;
        let mut ns = lock(&self.ns);
        let kind = attr.kind;
        let version = attr.version.clone();
        let ino = self.bind_child(&mut ns, parent, name, kind, None, Instant::now())?;
        self.adopt_attr(&mut ns, ino, attr);
        if kind == FileKind::Dir {
            ns.inode_mut(ino)?.listed = Some((Instant::now(), version));
        }
        ns.inode_mut(ino)?.lookups += 1;
        ns.inode_mut(parent)?.checked = None;
        self.entry(&ns, ino)
    }

    /// Create a directory.
    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry> {
        if self.cfg.write_mode.journaled() {
            return self.make_local(parent, name, mode, NewKind::Dir, uid, gid);
        }
        self.make(parent, name, FileKind::Dir, uid, gid, |h, p, o| h.mkdir(p, mode, o))
    }

    /// Create a special or regular file.
    pub fn mknod(&self, parent: u64, name: &OsStr, mode: u32, rdev: u64, uid: u32, gid: u32) -> FsResult<Entry> {
        if self.cfg.write_mode.journaled() {
            return self.make_local(parent, name, mode, NewKind::Special { rdev }, uid, gid);
        }
        self.make(parent, name, FileKind::from_mode(mode), uid, gid, |h, p, o| {
            h.mknod(p, mode, rdev, o)
        })
    }

    /// Create a symlink.
    pub fn symlink(&self, parent: u64, name: &OsStr, target: &[u8], uid: u32, gid: u32) -> FsResult<Entry> {
        if self.cfg.write_mode.journaled() {
            return self.make_local(parent, name, 0o777, NewKind::Symlink { target }, uid, gid);
        }
        let entry = self.make(parent, name, FileKind::Symlink, uid, gid, |h, p, o| {
            h.symlink(target, p, o)
        })?;
        let mut ns = lock(&self.ns);
        ns.inode_mut(entry.attr.ino)?.symlink = Some(target.to_vec());
        self.persist(&ns, entry.attr.ino);
        Ok(entry)
    }

    /// Create an empty regular file (the caller opens it).
    pub(crate) fn create_file(&self, parent: u64, name: &OsStr, mode: u32, uid: u32, gid: u32) -> FsResult<Entry> {
        if self.cfg.write_mode.journaled() {
            return self.make_local(parent, name, mode, NewKind::File, uid, gid);
        }
        self.make(parent, name, FileKind::File, uid, gid, |h, p, o| h.create(p, mode, o))
    }

    /// Hard-link `ino` as `name` in `parent`.
    pub fn link(&self, ino: u64, parent: u64, name: &OsStr) -> FsResult<Entry> {
        if self.cfg.write_mode.journaled() {
            return self.link_local(ino, parent, name);
        }
        self.writable()?;
        check_name(name)?;
        let _m = lock(&self.mutate);
        let (from, to) = {
            let ns = lock(&self.ns);
            if ns.inode(parent)?.kind != FileKind::Dir {
                return Err(FsError::NotDir);
            }
            self.check_link(&ns, ino, parent, name)?;
            (ns.path_of(ino)?, ns.child_path(parent, name)?)
        };
        let attr = self.core.home.link(&from, &to)?;
        let mut ns = lock(&self.ns);
        self.detach(&mut ns, parent, name);
        let node = ns.inode_mut(ino)?;
        node.aliases.push((parent, name.to_os_string()));
        node.lookups += 1;
        let p = ns.inode_mut(parent)?;
        p.children.insert(name.to_os_string(), ino);
        p.negatives.remove(name);
        p.checked = None;
        self.core
            .store
            .db()
            .submit(vec![Mutation::PutDentry(parent, name.as_bytes().to_vec(), ino)]);
        self.adopt_attr(&mut ns, ino, attr);
        self.entry(&ns, ino)
    }

    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> FsResult<()> {
        if self.cfg.write_mode.journaled() {
            return self.remove_local(parent, name, dir);
        }
        self.writable()?;
        check_name(name)?;
        let _m = lock(&self.mutate);
        let path = lock(&self.ns).child_path(parent, name)?;
        if dir {
            self.core.home.rmdir(&path)?;
        } else {
            self.core.home.unlink(&path)?;
        }
        let mut ns = lock(&self.ns);
        self.detach(&mut ns, parent, name);
        let p = ns.inode_mut(parent)?;
        p.negatives.insert(name.to_os_string(), Instant::now());
        p.checked = None;
        Ok(())
    }

    /// Remove a file.
    pub fn unlink(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, false)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &OsStr) -> FsResult<()> {
        self.remove(parent, name, true)
    }

    /// Rename `name` in `parent` to `new_name` in `new_parent`.
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> FsResult<()> {
        if self.cfg.write_mode.journaled() {
            return self.rename_local(parent, name, new_parent, new_name, flags);
        }
        self.writable()?;
        check_name(name)?;
        check_name(new_name)?;
        let _m = lock(&self.mutate);
        let (from, to) = {
            let ns = lock(&self.ns);
            self.check_rename(&ns, (parent, name), (new_parent, new_name), flags)?;
            (ns.child_path(parent, name)?, ns.child_path(new_parent, new_name)?)
        };
        self.core.home.rename(&from, &to, flags)?;
        let mut ns = lock(&self.ns);
        self.rename_in_ns(&mut ns, parent, name, new_parent, new_name, flags, true)
    }

    /// Apply a rename to the namespace mirror; `at_home`: home has it already (write-through), so the
    /// moved objects' home locations move too.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rename_in_ns(
        &self,
        ns: &mut Namespace,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
        at_home: bool,
    ) -> FsResult<()> {
        let src = ns.inode_mut(parent)?.children.remove(name);
        let dst = ns.inode_mut(new_parent)?.children.remove(new_name);
        let db = self.core.store.db().clone();
        db.submit(vec![
            Mutation::DelDentry(parent, name.as_bytes().to_vec()),
            Mutation::DelDentry(new_parent, new_name.as_bytes().to_vec()),
        ]);
        if src.is_some() && src == dst {
            // Two names of one object: POSIX says nothing happens.
            ns.inode_mut(parent)?
                .children
                .insert(name.to_os_string(), src.unwrap_or_default());
            ns.inode_mut(new_parent)?
                .children
                .insert(new_name.to_os_string(), src.unwrap_or_default());
            return Ok(());
        }
        let place = |ns: &mut Namespace, ino: u64, from: (u64, &OsStr), dir: u64, n: &OsStr| -> FsResult<()> {
            let node = ns.inode_mut(ino)?;
            node.rename_name(from, (dir, n));
            if at_home {
                node.home_loc = Some((dir, n.to_os_string()));
                node.checked = None;
            }
            ns.inode_mut(dir)?.children.insert(n.to_os_string(), ino);
            ns.inode_mut(dir)?.negatives.remove(n);
            db.submit(vec![Mutation::PutDentry(dir, n.as_bytes().to_vec(), ino)]);
            self.persist(ns, ino);
            Ok(())
        };
        if flags.exchange {
            if let Some(s) = src {
                place(ns, s, (parent, name), new_parent, new_name)?;
            }
            if let Some(d) = dst {
                place(ns, d, (new_parent, new_name), parent, name)?;
            }
        } else {
            if let Some(d) = dst {
                // Replaced at home: put it back under its old name only to detach it properly.
                ns.inode_mut(new_parent)?.children.insert(new_name.to_os_string(), d);
                self.unbind(ns, new_parent, new_name, at_home);
            }
            match src {
                Some(s) => place(ns, s, (parent, name), new_parent, new_name)?,
                // Not known here: forget any negative entry so the next lookup asks home.
                None => {
                    ns.inode_mut(new_parent)?.negatives.remove(new_name);
                }
            }
            ns.inode_mut(parent)?
                .negatives
                .insert(name.to_os_string(), Instant::now());
        }
        ns.inode_mut(parent)?.checked = None;
        ns.inode_mut(new_parent)?.checked = None;
        Ok(())
    }

    /// Change attributes. A size change first pushes pending writes, then truncates home and the cache.
    pub fn setattr(&self, ino: u64, changes: &SetAttr) -> FsResult<Entry> {
        if self.cfg.write_mode.journaled() {
            return self.setattr_local(ino, changes);
        }
        self.writable()?;
        let (path, kind, flush_lock, write_lock) = {
            let ns = lock(&self.ns);
            let node = ns.inode(ino)?;
            (
                ns.path_of(ino)?,
                node.kind,
                node.flush_lock.clone(),
                node.write_lock.clone(),
            )
        };
        let _f = lock(&flush_lock);
        let mut _w = None;
        if changes.size.is_some() {
            if kind == FileKind::Dir {
                return Err(FsError::IsDir);
            }
            self.push_locked(ino)?;
            // No write may land between the push and the truncate of home and cache.
            _w = Some(lock(&write_lock));
        }
        // Home's version moves before we adopt it: a fetch that sees the new version meanwhile waits for
        // this change to be adopted, as for a push.
        lock(&self.ns).inode_mut(ino)?.pushing += 1;
        let result = self.core.home.setattr(&path, changes);
        let mut ns = lock(&self.ns);
        ns.inode_mut(ino)?.pushing -= 1;
        let attr = result?;
        if let Some(size) = changes.size {
            let object = ns.inode(ino)?.object;
            self.core.store.truncate(object, size)?;
        }
        let set_mtime = changes.mtime.is_some().then_some(attr.mtime);
        self.adopt_attr(&mut ns, ino, attr);
        if let Some(t) = set_mtime
            && let Some(a) = ns.inode_mut(ino)?.attr.as_mut()
        {
            // Pending writes keep their size, not their time: the time set now is the file's, and the
            // push of those writes gives it to home again.
            a.mtime = t;
        }
        self.entry(&ns, ino)
    }
}
