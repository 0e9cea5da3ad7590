//! The model of the local file system: objects and their states, paths, and the tree of inodes and
//! entries (hard links included) a workload changes.

use std::collections::{BTreeMap, BTreeSet};

pub(super) const ROOT: u64 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    Dir,
    Symlink,
    Node,
}

/// An object's state: `content` is a version counter (files) or the target (symlinks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Obj {
    pub(super) kind: Kind,
    pub(super) content: u64,
    pub(super) mode: u32,
    pub(super) uid: u32,
}

/// Path → (object, state).
pub(super) type Snapshot = BTreeMap<String, (u64, Obj)>;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

pub(super) fn parent_of(p: &str) -> Option<&str> {
    (!p.is_empty()).then(|| p.rsplit_once('/').map_or("", |(d, _)| d))
}

/// Whether `p` is strictly inside the directory at `dir`.
pub(super) fn inside(p: &str, dir: &str) -> bool {
    if dir.is_empty() {
        !p.is_empty()
    } else {
        p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/'
    }
}

pub(super) fn text(p: &[u8]) -> String {
    String::from_utf8(p.to_vec()).expect("generated paths are UTF-8")
}

pub(super) fn symlink_target(version: u64) -> Vec<u8> {
    format!("t{version}").into_bytes()
}

pub(super) fn symlink_version(target: &[u8]) -> u64 {
    text(&target[1..]).parse().expect("generated symlink target")
}

/// The local file system: inodes (kept after their last name goes, for their content) and entries.
#[derive(Clone)]
pub(super) struct Local {
    pub(super) inodes: BTreeMap<u64, Obj>,
    pub(super) entries: BTreeMap<(u64, String), u64>,
    pub(super) names: BTreeMap<u64, BTreeSet<(u64, String)>>,
    pub(super) next_ino: u64,
    next_version: u64,
}

impl Local {
    /// Root; dir `a` holding file `a/x`, symlink `a/s` and `a/y` (a hard link of `c`); file `y`; empty dir `b`.
    pub(super) fn initial() -> Local {
        let mut l = Local {
            inodes: BTreeMap::new(),
            entries: BTreeMap::new(),
            names: BTreeMap::new(),
            next_ino: ROOT + 1,
            next_version: 1000,
        };
        l.inodes.insert(ROOT, obj(Kind::Dir, 0, 0o755));
        let a = l.add(ROOT, "a", obj(Kind::Dir, 0, 0o755));
        l.add(a, "x", obj(Kind::File, 101, 0o644));
        l.add(ROOT, "y", obj(Kind::File, 102, 0o644));
        let c = l.add(ROOT, "c", obj(Kind::File, 103, 0o600));
        l.insert(a, "y", c);
        l.add(ROOT, "b", obj(Kind::Dir, 0, 0o700));
        l.add(a, "s", obj(Kind::Symlink, 104, 0o777));
        l
    }

    pub(super) fn add(&mut self, parent: u64, name: &str, o: Obj) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, o);
        self.insert(parent, name, ino);
        ino
    }

    pub(super) fn version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    pub(super) fn insert(&mut self, parent: u64, name: &str, ino: u64) {
        let old = self.entries.insert((parent, name.to_string()), ino);
        assert!(old.is_none(), "entry {parent}/{name} taken");
        self.names.entry(ino).or_default().insert((parent, name.to_string()));
    }

    pub(super) fn remove(&mut self, parent: u64, name: &str) -> u64 {
        let key = (parent, name.to_string());
        let ino = self.entries.remove(&key).expect("entry exists");
        let names = self.names.get_mut(&ino).expect("named inode");
        names.remove(&key);
        if names.is_empty() {
            self.names.remove(&ino);
        }
        ino
    }

    pub(super) fn named(&self, ino: u64) -> bool {
        ino == ROOT || self.names.contains_key(&ino)
    }

    pub(super) fn kind(&self, ino: u64) -> Kind {
        self.inodes[&ino].kind
    }

    fn parent(&self, dir: u64) -> u64 {
        self.names[&dir].first().expect("directories have one name").0
    }

    fn dir_path(&self, dir: u64) -> String {
        if dir == ROOT {
            return String::new();
        }
        let (parent, name) = self.names[&dir].first().expect("directories have one name");
        join(&self.dir_path(*parent), name)
    }

    pub(super) fn path(&self, parent: u64, name: &str) -> String {
        join(&self.dir_path(parent), name)
    }

    pub(super) fn depth(&self, dir: u64) -> usize {
        if dir == ROOT {
            0
        } else {
            1 + self.depth(self.parent(dir))
        }
    }

    /// Whether `dir` is `ancestor` or inside it.
    pub(super) fn within(&self, dir: u64, ancestor: u64) -> bool {
        let mut d = dir;
        loop {
            if d == ancestor {
                return true;
            }
            if d == ROOT {
                return false;
            }
            d = self.parent(d);
        }
    }

    pub(super) fn is_empty_dir(&self, dir: u64) -> bool {
        self.entries
            .range((dir, String::new())..)
            .next()
            .is_none_or(|((p, _), _)| *p != dir)
    }

    /// Named inodes matching `keep`, the root included.
    pub(super) fn live(&self, keep: impl Fn(&Obj) -> bool) -> Vec<u64> {
        self.inodes
            .iter()
            .filter(|(ino, o)| self.named(**ino) && keep(o))
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Entries (parent, name, inode) whose inode matches `keep`.
    pub(super) fn entries_where(&self, keep: impl Fn(u64, &Obj) -> bool) -> Vec<(u64, String, u64)> {
        self.entries
            .iter()
            .filter(|(_, ino)| keep(**ino, &self.inodes[*ino]))
            .map(|((p, n), ino)| (*p, n.clone(), *ino))
            .collect()
    }

    pub(super) fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::new();
        s.insert(String::new(), (ROOT, self.inodes[&ROOT].clone()));
        for ((parent, name), ino) in &self.entries {
            s.insert(self.path(*parent, name), (*ino, self.inodes[ino].clone()));
        }
        s
    }
}

pub(super) fn obj(kind: Kind, content: u64, mode: u32) -> Obj {
    Obj {
        kind,
        content,
        mode,
        uid: 0,
    }
}
