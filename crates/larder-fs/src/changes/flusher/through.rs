//! Write-through on the write-back pipeline: a change is made in the cache and queued like any other, then
//! its caller pushes it at once (a sync lag of 0) and returns home's answer. A change home refuses is
//! taken back out of the cache, so the mount never shows what home does not hold.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::time::Duration;

use larder_cache::Mutation;
use larder_home::{FileKind, RenameFlags};

use super::Outcome;
use crate::FsResult;
use crate::changes::Changes;
use crate::journal::{Op, OpKind};
use crate::namespace::Namespace;

impl Changes {
    /// Push the held ops `seqs` (just recorded by this caller, in order), each once the ops it depends on
    /// have concluded; the first error home gave, after every one was tried (those after a refused one
    /// usually fail with it, and are undone too).
    pub(crate) fn land(&self, seqs: &[u64]) -> FsResult<()> {
        let mut first = Ok(());
        for &seq in seqs {
            if let Err(e) = self.land_one(seq)
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }

    fn land_one(&self, seq: u64) -> FsResult<()> {
        let op = {
            let mut j = self.pipeline.journal();
            loop {
                let Some(op) = j.get(seq) else {
                    // Cancelled by a later change (its object was removed before it reached home).
                    return Ok(());
                };
                if j.ready_now(seq) {
                    let op = op.clone();
                    let muts = j.begin(seq);
                    self.core.store.db().submit(muts);
                    break op;
                }
                j = self.pipeline.wait_done(j, Duration::from_millis(100));
            }
        };
        // No sync before the push, unlike write-back: a held op is recorded as attempted already, so one a
        // crash leaves queued is pushed as a repeat, whose "already done" answers are success. That is
        // safe here because nothing of it was acknowledged: if home's object turns out not to be ours
        // after all, the cache shows home's, which is all write-through promised.
        self.pushing_rename(&op);
        match self.push_op(&op, false, true) {
            Outcome::Done => {
                self.conclude(seq, &op, Outcome::Done);
                Ok(())
            }
            Outcome::Retry(e) => {
                self.take_back(seq, &op);
                Err(e.into())
            }
            Outcome::Refused(e) => {
                self.take_back(seq, &op);
                Err(e)
            }
        }
    }

    /// Home did not take `op`: it leaves the journal and the cache.
    fn take_back(&self, seq: u64, op: &Op) {
        let mut ns = self.names.write();
        let mut muts = self.pipeline.journal().finish(seq).1;
        ns.renames.remove(&op.ino);
        self.undo(&mut ns, op, &mut muts);
        self.core.store.db().submit(muts);
        drop(ns);
        self.pipeline.finished();
    }

    /// Take back what `op` changed in the namespace. Home holds what it held before, so whatever is not put
    /// back exactly is forgotten and asked of home again: the directories' listings and times, and the
    /// objects' attributes.
    fn undo(&self, ns: &mut Namespace, op: &Op, muts: &mut Vec<Mutation>) {
        let name = |i: usize| op.names.get(i).map(|(d, n)| (*d, OsString::from_vec(n.clone())));
        match &op.kind {
            // The name it made goes (a hard link's object keeps its other names).
            OpKind::Create { .. }
            | OpKind::Mkdir { .. }
            | OpKind::Mknod { .. }
            | OpKind::Symlink { .. }
            | OpKind::Link { .. } => {
                if let Some((dir, n)) = name(0)
                    && ns.bound(dir, &n) == Some(op.ino)
                {
                    self.names.unbind(ns, dir, &n, false);
                }
            }
            OpKind::Unlink | OpKind::Rmdir => {
                if let Some((dir, n)) = name(0) {
                    self.rebind(ns, dir, &n, op.ino, muts);
                }
            }
            OpKind::Rename { exchange, replaced, .. } => {
                if let (Some((from_dir, from)), Some((to_dir, to))) = (name(0), name(1)) {
                    let flags = RenameFlags {
                        no_replace: false,
                        exchange: *exchange,
                    };
                    if ns.bound(to_dir, &to) == Some(op.ino) {
                        let _ = self.rename_in_ns(ns, to_dir, &to, from_dir, &from, flags);
                    }
                    if *replaced && !*exchange {
                        // What it replaced is still at home under that name: asked again.
                        if let Ok(d) = ns.inode_mut(to_dir) {
                            d.dm().negatives.remove(&to);
                        }
                    }
                }
            }
            OpKind::SetAttr { .. } | OpKind::Data => {}
            // Home keeps what it had: asked again.
            OpKind::SetXattr { .. } => {
                if let Some(node) = ns.inodes.get_mut(&op.ino) {
                    node.xattrs = None;
                }
            }
        }
        for (dir, n) in &op.names {
            if let Some(d) = ns.inodes.get_mut(dir) {
                // Home may hold a name the cache did not know (why a create failed): listed again.
                d.dm().negatives.remove(OsStr::from_bytes(n));
                d.unlist();
                d.checked = None;
            }
        }
        if op.kind != OpKind::Data
            && let Some(node) = ns.inodes.get_mut(&op.ino)
        {
            // Times, modes, link counts: home's again at the next look.
            node.checked = None;
        }
    }

    /// Put `ino` back under `name` in `dir` after a removal home refused. If the cache let go of it
    /// altogether, the name is simply asked of home again.
    fn rebind(&self, ns: &mut Namespace, dir: u64, name: &OsStr, ino: u64, muts: &mut Vec<Mutation>) {
        if ns.bound(dir, name).is_some() {
            return;
        }
        let Some(node) = ns.inodes.get(&ino) else { return };
        // Its cached data went with its last name (unless open): it starts again from home's.
        let fresh =
            (node.removed && node.opens() == 0 && node.kind == FileKind::File).then(|| self.names.alloc_object(ns));
        let Some(node) = ns.inodes.get_mut(&ino) else { return };
        if let Some(object) = fresh {
            node.object = object;
            node.dirty.clear();
            node.home_size = None;
        }
        if node.removed {
            node.removed = false;
            node.parent = dir;
            node.name = name.to_os_string();
        } else if !(node.parent == dir && node.name == name) {
            node.aliases.push((dir, name.to_os_string()));
        }
        if node.kind == FileKind::Dir {
            node.unlist();
        }
        let id = node.attr.as_ref().map_or(0, |a| a.id);
        if id != 0 {
            ns.by_id.entry(id).or_insert(ino);
        }
        if let Some(d) = ns.inodes.get_mut(&dir) {
            d.dm().children.insert(name.to_os_string(), ino);
        }
        muts.push(Mutation::PutDentry(dir, name.as_bytes().to_vec(), ino));
        if let Some(n) = ns.inodes.get(&ino) {
            muts.push(Mutation::PutInode(ino, n.record().encode()));
        }
    }
}
