//! The model of home: objects keyed by path, each named by the inode that made it, to which ops are
//! applied as a home would, refusing what a home would refuse.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::model::{Kind, Local, Obj, Snapshot, inside, parent_of, symlink_version, text};
use crate::journal::{Op, OpKind};

/// Home, keyed by path; objects are named by the inode that made them.
#[derive(Clone)]
pub(super) struct Home {
    pub(super) paths: BTreeMap<String, u64>,
    objects: BTreeMap<u64, Obj>,
    /// Calls made.
    pub(super) calls: usize,
}

impl Home {
    pub(super) fn of(local: &Local) -> Home {
        let snapshot = local.snapshot();
        Home {
            paths: snapshot.iter().map(|(p, (ino, _))| (p.clone(), *ino)).collect(),
            objects: snapshot.into_values().collect(),
            calls: 0,
        }
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        self.paths
            .iter()
            .map(|(p, id)| (p.clone(), (*id, self.objects[id].clone())))
            .collect()
    }

    fn at(&self, p: &str) -> Result<u64, String> {
        self.paths
            .get(p)
            .copied()
            .ok_or_else(|| format!("{p:?} does not exist"))
    }

    fn kind_at(&self, p: &str) -> Result<Kind, String> {
        Ok(self.objects[&self.at(p)?].kind)
    }

    /// The object at `p`, which must be the op's inode.
    fn subject(&self, op: &Op, p: &str) -> Result<u64, String> {
        let id = self.at(p)?;
        if id != op.ino {
            return Err(format!("{p:?} is object {id}, not inode {}", op.ino));
        }
        Ok(id)
    }

    fn has_children(&self, p: &str) -> bool {
        self.paths.keys().any(|k| inside(k, p))
    }

    /// `p` is free and its parent a directory.
    fn vacant(&self, p: &str) -> Result<(), String> {
        if self.paths.contains_key(p) {
            return Err(format!("{p:?} exists"));
        }
        let parent = parent_of(p).ok_or("the root exists")?;
        match self.kind_at(parent)? {
            Kind::Dir => Ok(()),
            _ => Err(format!("{parent:?} is not a directory")),
        }
    }

    fn take(&mut self, p: &str) -> Vec<(String, u64)> {
        let keys: Vec<String> = self.paths.keys().filter(|k| *k == p || inside(k, p)).cloned().collect();
        keys.into_iter()
            .map(|k| {
                let id = self.paths.remove(&k).expect("listed");
                (k, id)
            })
            .collect()
    }

    fn put(&mut self, items: Vec<(String, u64)>, from: &str, to: &str) {
        for (k, id) in items {
            self.paths.insert(format!("{to}{}", &k[from.len()..]), id);
        }
    }

    /// Apply `op`; a `Data` op sets the content `content` gives for its inode.
    pub(super) fn apply(&mut self, op: &Op, content: &dyn Fn(u64) -> u64) -> Result<(), String> {
        self.calls += 1;
        let path = text(&op.path);
        let (kind, mode, uid, version) = match &op.kind {
            OpKind::Create { mode, uid, .. } => (Kind::File, *mode, *uid, 0),
            OpKind::Mkdir { mode, uid, .. } => (Kind::Dir, *mode, *uid, 0),
            OpKind::Mknod { mode, uid, .. } => (Kind::Node, *mode, *uid, 0),
            OpKind::Symlink { target, uid, .. } => (Kind::Symlink, 0o777, *uid, symlink_version(target)),
            OpKind::Link { to } => {
                let to = text(to);
                let id = self.subject(op, &path)?;
                if self.objects[&id].kind == Kind::Dir {
                    return Err(format!("hard link of directory {path:?}"));
                }
                self.vacant(&to)?;
                self.paths.insert(to, id);
                return Ok(());
            }
            OpKind::Unlink => {
                let id = self.subject(op, &path)?;
                if self.objects[&id].kind == Kind::Dir {
                    return Err(format!("unlink of directory {path:?}"));
                }
                self.paths.remove(&path);
                return Ok(());
            }
            OpKind::Rmdir => {
                let id = self.subject(op, &path)?;
                if self.objects[&id].kind != Kind::Dir || path.is_empty() {
                    return Err(format!("rmdir of {path:?}, not a directory or the root"));
                }
                if self.has_children(&path) {
                    return Err(format!("rmdir of {path:?}: not empty"));
                }
                self.paths.remove(&path);
                return Ok(());
            }
            OpKind::Rename {
                to,
                no_replace,
                exchange,
                replaced,
            } => return self.rename(op, &path, &text(to), *no_replace, *exchange, *replaced),
            OpKind::SetAttr { perm, uid, .. } => {
                let id = self.subject(op, &path)?;
                let o = self.objects.get_mut(&id).expect("object of a path");
                o.mode = perm.unwrap_or(o.mode);
                o.uid = uid.unwrap_or(o.uid);
                return Ok(());
            }
            OpKind::Data => {
                let id = self.subject(op, &path)?;
                let o = self.objects.get_mut(&id).expect("object of a path");
                if o.kind != Kind::File {
                    return Err(format!("data pushed to {path:?}, not a file"));
                }
                o.content = content(op.ino);
                return Ok(());
            }
            // The model keeps no extended attributes (its workloads make none): the object must be there.
            OpKind::SetXattr { .. } => {
                self.subject(op, &path)?;
                return Ok(());
            }
        };
        self.vacant(&path)?;
        if self.objects.contains_key(&op.ino) {
            return Err(format!("inode {} created twice", op.ino));
        }
        self.paths.insert(path, op.ino);
        self.objects.insert(
            op.ino,
            Obj {
                kind,
                content: version,
                mode,
                uid: uid.unwrap_or(0),
            },
        );
        Ok(())
    }

    fn rename(
        &mut self,
        op: &Op,
        from: &str,
        to: &str,
        no_replace: bool,
        exchange: bool,
        replaced: bool,
    ) -> Result<(), String> {
        let id = self.subject(op, from)?;
        if from == to || from.is_empty() || to.is_empty() {
            return Err(format!("rename {from:?} -> {to:?}"));
        }
        if inside(to, from) || (exchange && inside(from, to)) {
            return Err(format!("rename {from:?} -> {to:?}: into itself"));
        }
        if exchange {
            self.at(to)?;
            let a = self.take(from);
            let b = self.take(to);
            self.put(a, from, to);
            self.put(b, to, from);
            return Ok(());
        }
        match self.paths.get(to).copied() {
            Some(target) => {
                if no_replace || !replaced {
                    return Err(format!("rename {from:?} -> {to:?}: target exists (not replaced here)"));
                }
                let fits = match (self.objects[&id].kind, self.objects[&target].kind) {
                    (Kind::Dir, Kind::Dir) => !self.has_children(to),
                    (Kind::Dir, _) | (_, Kind::Dir) => false,
                    _ => target != id,
                };
                if !fits {
                    return Err(format!("rename {from:?} -> {to:?}: cannot replace object {target}"));
                }
                self.paths.remove(to);
            }
            None => self.vacant(to)?,
        }
        let moved = self.take(from);
        self.put(moved, from, to);
        Ok(())
    }
}

pub(super) fn diff(a: &Snapshot, b: &Snapshot) -> String {
    let mut out = String::new();
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        if a.get(k) != b.get(k) {
            let _ = writeln!(out, "  {k:?}: {:?} vs {:?}", a.get(k), b.get(k));
        }
    }
    out
}
