//! The namespace in a cluster (design note 016): the write tokens a change takes, the records of this
//! node's changes it publishes, and forgetting what another node's change made stale.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use crate::coherence::{Coherence, HeldRecord, bytes};
use crate::namespace::{Names, Namespace, read, write};

impl Names {
    /// Use `c` for writes across the cluster: publish this node's changes, apply the others' before
    /// opens.
    pub(crate) fn set_coherence(&self, c: Arc<dyn Coherence>) {
        let _ = self.coherence.set(c);
    }

    /// Apply the records written before now, if in a cluster; whether any was new here.
    pub(crate) fn sync_cluster(&self) -> bool {
        self.coherence.get().is_some_and(|c| c.sync())
    }

    /// Take the write tokens of the existing objects at `paths` (below home's root), if in a cluster:
    /// before a change of them is made.
    pub(crate) fn take_tokens(&self, paths: &[&Path]) -> crate::FsResult<()> {
        let Some(c) = self.coherence.get() else {
            return Ok(());
        };
        for p in paths {
            if c.take(bytes(p)).map_err(crate::FsError::Home)? {
                self.taken_over(p);
            }
        }
        Ok(())
    }

    /// Another node gave up the token of `path` just now, once home had its changes: what this node
    /// changes next is made on that version, so it is asked of home now (whatever the validity lag), and
    /// this node's open handles of the file follow it.
    ///
    /// The kernel's invalidations are sent, not waited for: the change may be the kernel's own writeback
    /// of a mapped page, which the invalidation thread is waiting on (an invalidation of a mapped file
    /// writes its dirty pages back first), or a write whose pages the kernel keeps locked until the
    /// answer. Opens and locks, which order what is read next, wait for the kernel themselves.
    fn taken_over(&self, path: &Path) {
        let (ino, home_path) = {
            let ns = read(&self.ns);
            let Some(ino) = ns.resolve_known(path).0 else { return };
            match ns.home_path(ino) {
                Ok(Some(p)) => (ino, p),
                _ => return,
            }
        };
        if let Err(e) = self.revalidate(ino, &home_path) {
            tracing::debug!(error = %e, path = %path.display(), "could not ask home for a file another node gave up");
            return;
        }
        self.follow_newest(ino);
    }

    /// Move this node's open handles of `ino` to the file's newest version: another node's change, taken
    /// in under the token or a lock, is what they read from now on. (A handle the kernel serves from a
    /// cache file directly keeps its version.)
    pub(crate) fn follow_newest(&self, ino: u64) {
        let object = match read(&self.ns).inode(ino) {
            Ok(node) if node.kind == larder_home::FileKind::File => node.object,
            _ => return,
        };
        for fh in self.handles().of_inode(ino) {
            self.handles().with(fh, |h| {
                if !h.held && h.pt_writer.is_none() {
                    h.object = object;
                }
            });
        }
    }

    /// Whether another node's record says `name` in `parent` exists; if so, what this node cached of it
    /// and its directory is dropped first (the record's own invalidation may still be on its way).
    pub(crate) fn held_elsewhere(&self, parent: u64, name: &OsStr) -> bool {
        let Some(c) = self.coherence.get() else {
            return false;
        };
        let Ok(path) = read(&self.ns).child_path(parent, name) else {
            return false;
        };
        let held = c
            .record(bytes(&path))
            .is_some_and(|(r, _)| r.holder != c.me() && r.attr.is_some());
        if held {
            self.invalidate_path(bytes(&path));
        }
        held
    }

    /// Whether this node may still change `ino` (see [`Coherence::still_held`]); always outside a
    /// cluster.
    pub(crate) fn token_still_held(&self, ino: u64) -> bool {
        let Some(c) = self.coherence.get() else {
            return true;
        };
        match read(&self.ns).path_of(ino) {
            Ok(path) => c.still_held(bytes(&path)),
            Err(_) => true,
        }
    }

    /// [`Names::take_tokens`] of the object `ino`, by its path here.
    pub(crate) fn take_token_of(&self, ino: u64) -> crate::FsResult<()> {
        if self.coherence.get().is_none() {
            return Ok(());
        }
        let path = read(&self.ns).path_of(ino)?;
        self.take_tokens(&[&path])
    }

    /// [`Names::take_tokens`] of directory `dir` if another node holds changes of it (it made it, or names
    /// in it, and home has not got them): a name made in it here reaches home only after those did.
    pub(crate) fn take_token_of_held_dir(&self, dir: u64) -> crate::FsResult<()> {
        let Some(c) = self.coherence.get() else {
            return Ok(());
        };
        let path = read(&self.ns).path_of(dir)?;
        if c.record(bytes(&path)).is_some_and(|(r, _)| r.holder != c.me()) {
            self.take_tokens(&[&path])?;
        }
        Ok(())
    }

    /// [`Names::take_tokens`] of `name` in `parent`, if it exists here.
    pub(crate) fn take_token_at(&self, parent: u64, name: &OsStr) -> crate::FsResult<()> {
        if self.coherence.get().is_none() {
            return Ok(());
        }
        let path = read(&self.ns).child_path(parent, name)?;
        self.take_tokens(&[&path])
    }

    /// Publish what this node has now at the paths of `ops` (and their directories, for changes of
    /// names), if in a cluster.
    pub(crate) fn publish_ops(&self, ops: &[crate::journal::Op]) {
        let Some(c) = self.coherence.get() else {
            return;
        };
        let mut paths: Vec<Vec<u8>> = Vec::new();
        for op in ops {
            let names = !matches!(
                op.kind,
                crate::journal::OpKind::Data
                    | crate::journal::OpKind::SetAttr { .. }
                    | crate::journal::OpKind::SetXattr { .. }
            );
            for p in op.paths() {
                paths.push(p.to_vec());
                if names {
                    let parent = Path::new(OsStr::from_bytes(p)).parent().unwrap_or(Path::new(""));
                    paths.push(bytes(parent).to_vec());
                }
            }
            if let crate::journal::OpKind::Rename { to, .. } = &op.kind {
                // What this node holds below a directory it renamed is published at its new paths (and
                // gone from the old): the others would see the directory empty until it reached home.
                for below in own_below(c.as_ref(), &op.path) {
                    paths.push([to.as_slice(), &below[op.path.len()..]].concat());
                    paths.push(below);
                }
            }
        }
        paths.sort();
        paths.dedup();
        c.publish(self.held_records(c.me(), paths));
    }

    /// This node's records of `paths`, as it has them now: see [`held_record`].
    pub(crate) fn held_records(&self, me: u64, paths: Vec<Vec<u8>>) -> Vec<(Vec<u8>, HeldRecord)> {
        let ns = read(&self.ns);
        paths
            .into_iter()
            .filter_map(|p| {
                let record = held_record(&ns, me, Path::new(OsStr::from_bytes(&p)))?;
                Some((p, record))
            })
            .collect()
    }

    /// Forget what this node cached of `path` and of the directory it is in, in memory and in the
    /// kernel: another node changed it (its held record was written or removed).
    pub(crate) fn invalidate_path(&self, path: &[u8]) {
        let path = Path::new(OsStr::from_bytes(path));
        tracing::debug!(path = %path.display(), "another node's change: dropping what is cached");
        let mut kernel = Vec::new();
        {
            let mut ns = write(&self.ns);
            // Under the namespace's lock: an answer taken in after this, asked for before, is not fresh.
            *self.invalidated.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
            let (found, parent) = ns.resolve_known(path);
            if let Some(ino) = found
                && let Some(node) = ns.inodes.get_mut(&ino)
            {
                node.checked = None;
                node.unlist();
                node.dm().negatives.clear();
                kernel.push(crate::Invalidation::Inode(ino));
            }
            if let Some((dir, name)) = parent
                && let Some(node) = ns.inodes.get_mut(&dir)
            {
                node.checked = None;
                node.unlist();
                node.dm().negatives.remove(&name);
                kernel.push(crate::Invalidation::Entry(dir, name));
                kernel.push(crate::Invalidation::Inode(dir));
            }
        }
        for k in kernel {
            self.invalidate(k);
        }
    }
}

/// This node's record of `path`: its attributes here (none if it is not here, or removed), and where
/// home has it if that is elsewhere. Nothing for a name known only from a listing (no attributes yet):
/// this node has nothing to say of it.
/// The paths strictly below `dir` that this node holds records of.
fn own_below(c: &dyn Coherence, dir: &[u8]) -> Vec<Vec<u8>> {
    let me = c.me();
    let mut out = Vec::new();
    let mut todo = vec![dir.to_vec()];
    while let Some(d) = todo.pop() {
        for (name, record, _) in c.children(&d) {
            if record.holder != me {
                continue;
            }
            let path = [d.as_slice(), b"/", name.as_slice()].concat();
            if record
                .attr
                .as_ref()
                .is_some_and(|a| a.kind == larder_home::FileKind::Dir)
            {
                todo.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}

pub(crate) fn held_record(ns: &Namespace, me: u64, path: &Path) -> Option<HeldRecord> {
    let (found, _) = ns.resolve_known(path);
    let node = found.and_then(|ino| ns.inodes.get(&ino).filter(|n| !n.removed).map(|n| (ino, n)));
    let attr = match node {
        Some((_, n)) => Some(n.attr.clone()?),
        None => None,
    };
    let home_path = node
        .and_then(|(ino, _)| ns.home_path(ino).ok().flatten())
        .filter(|h| h.as_path() != path)
        .map(|h| bytes(&h).to_vec());
    Some(HeldRecord {
        holder: me,
        attr,
        home_path,
    })
}
