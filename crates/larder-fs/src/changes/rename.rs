//! Renames: the checks at both ends, the change in the namespace, and its record in the journal.

use super::*;

impl Changes {
    /// What a rename finds: its source, and the object it replaces or exchanges with (`None`: nothing to
    /// do, the two names are one object's). May ask home.
    fn rename_ends(
        &self,
        (parent, name): (u64, &OsStr),
        (new_parent, new_name): (u64, &OsStr),
        flags: RenameFlags,
    ) -> FsResult<Option<(u64, Option<u64>)>> {
        let src = self.exists(parent, name)?.ok_or(FsError::NotFound)?;
        let dst = self.exists(new_parent, new_name)?;
        if flags.no_replace && dst.is_some() {
            return Err(FsError::Exists);
        }
        if flags.exchange && dst.is_none() {
            return Err(FsError::NotFound);
        }
        if dst == Some(src) {
            return Ok(None);
        }
        let src_kind = self.names.read().inode(src)?.kind;
        if let Some(d) = dst
            && !flags.exchange
        {
            let dst_kind = self.names.read().inode(d)?.kind;
            match (src_kind == FileKind::Dir, dst_kind == FileKind::Dir) {
                (true, false) => return Err(FsError::NotDir),
                (false, true) => return Err(FsError::IsDir),
                (true, true) if self.names.listing(d)?.len() > 2 => return Err(FsError::NotEmpty),
                _ => {}
            }
        }
        Ok(Some((src, dst)))
    }

    /// Rename `name` in `parent` to `new_name` in `new_parent`.
    pub(crate) fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> FsResult<()> {
        self.names.writable()?;
        check_name(name)?;
        check_name(new_name)?;
        self.names.take_token_at(parent, name)?;
        self.names.take_token_at(new_parent, new_name)?;
        self.names.take_token_of_held_dir(new_parent)?;
        // As for a removal: checked without the lock, confirmed under it.
        let ends = ((parent, name), (new_parent, new_name));
        let found = self.rename_ends(ends.0, ends.1, flags).or_else(left_memory)?;
        let mutating = self.names.mutate();
        let unchanged = match found {
            Some((src, dst)) => {
                let replaced_dir = dst.is_some() && !flags.exchange;
                self.still_bound(parent, name, Some(src), false)
                    && self.still_bound(new_parent, new_name, dst, replaced_dir)
            }
            None => false,
        };
        let found = if unchanged {
            found
        } else {
            self.rename_ends(ends.0, ends.1, flags)?
        };
        let Some((src, dst)) = found else {
            return Ok(());
        };
        let src_kind = self.names.read().inode(src)?.kind;
        // Its changes to the index (entries removed, then made, records, the op) reach it as one
        // submission: a stop between them would leave a record no entry names, taken at the next start
        // for a file removed while open. (Write-through pushes it after that submission, as a removal.)
        let db = self.core.store.db().clone();
        let held = db.gathered(move || {
            let mut ns = self.names.write();
            // A directory may not move into its own subtree.
            let mut cur = new_parent;
            while cur != ROOT {
                if cur == src {
                    return Err(FsError::Invalid);
                }
                cur = ns.inode(cur)?.parent;
            }
            self.names
                .check_rename(&ns, (parent, name), (new_parent, new_name), flags)?;
            let from = path_bytes(&ns.child_path(parent, name)?);
            let to = path_bytes(&ns.child_path(new_parent, new_name)?);
            self.rename_in_ns(&mut ns, parent, name, new_parent, new_name, flags)?;
            let victim_gone = dst.filter(|d| !flags.exchange && ns.inodes.get(d).is_none_or(|n| n.removed));
            if let Some(d) = dst.filter(|d| !flags.exchange && Some(*d) != victim_gone)
                && let Some(a) = ns.inodes.get_mut(&d).and_then(|n| n.attr.as_mut())
            {
                // Replaced under one of its names, alive under others.
                a.nlink = a.nlink.saturating_sub(1).max(1);
                a.ctime = SystemTime::now();
            }
            let moved_dir = if src_kind == FileKind::Dir { 1 } else { 0 };
            if parent != new_parent {
                Self::dir_changed(&mut ns, parent, -moved_dir);
                Self::dir_changed(&mut ns, new_parent, moved_dir);
            } else {
                Self::dir_changed(&mut ns, parent, 0);
            }
            if let Some(a) = ns.inodes.get_mut(&src).and_then(|n| n.attr.as_mut()) {
                a.ctime = SystemTime::now();
            }
            let mut muts = Vec::new();
            for ino in [parent, new_parent, src].into_iter().chain(dst) {
                muts.extend(Self::record_of(&ns, ino));
            }
            let op = Op::new(
                src,
                from,
                vec![
                    (parent, name.as_bytes().to_vec()),
                    (new_parent, new_name.as_bytes().to_vec()),
                ],
                OpKind::Rename {
                    to,
                    no_replace: flags.no_replace,
                    exchange: flags.exchange,
                    replaced: dst.is_some(),
                },
            );
            if let Some(node) = ns.inodes.get_mut(&src) {
                // Its label names its path: made again below.
                node.labelled = false;
            }
            let removed: Vec<u64> = victim_gone.into_iter().collect();
            self.queue(Some(mutating), ns, vec![op], &removed, muts)
        })?;
        self.data.label_unpushed(src);
        self.land(&held)
    }

    /// Apply a rename to the cache's namespace. Home locations stay: they move when the rename lands.
    pub(crate) fn rename_in_ns(
        &self,
        ns: &mut Namespace,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> FsResult<()> {
        let src = ns.inode_mut(parent)?.dm().children.remove(name);
        let dst = ns.inode_mut(new_parent)?.dm().children.remove(new_name);
        let db = self.core.store.db().clone();
        db.submit(vec![
            Mutation::DelDentry(parent, name.as_bytes().to_vec()),
            Mutation::DelDentry(new_parent, new_name.as_bytes().to_vec()),
        ]);
        if src.is_some() && src == dst {
            // Two names of one object: POSIX says nothing happens.
            ns.inode_mut(parent)?
                .dm()
                .children
                .insert(name.to_os_string(), src.unwrap_or_default());
            ns.inode_mut(new_parent)?
                .dm()
                .children
                .insert(new_name.to_os_string(), src.unwrap_or_default());
            return Ok(());
        }
        let place = |ns: &mut Namespace, ino: u64, from: (u64, &OsStr), dir: u64, n: &OsStr| -> FsResult<()> {
            let node = ns.inode_mut(ino)?;
            node.rename_name(from, (dir, n));
            ns.inode_mut(dir)?.dm().children.insert(n.to_os_string(), ino);
            ns.inode_mut(dir)?.dm().negatives.remove(n);
            db.submit(vec![Mutation::PutDentry(dir, n.as_bytes().to_vec(), ino)]);
            self.names.persist(ns, ino);
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
                ns.inode_mut(new_parent)?
                    .dm()
                    .children
                    .insert(new_name.to_os_string(), d);
                self.names.unbind(ns, new_parent, new_name, false);
            }
            match src {
                Some(s) => place(ns, s, (parent, name), new_parent, new_name)?,
                // Not known here: forget any negative entry so the next lookup asks home.
                None => {
                    ns.inode_mut(new_parent)?.dm().negatives.remove(new_name);
                }
            }
            ns.inode_mut(parent)?
                .dm()
                .negatives
                .insert(name.to_os_string(), Instant::now());
        }
        ns.inode_mut(parent)?.checked = None;
        ns.inode_mut(new_parent)?.checked = None;
        Ok(())
    }
}
