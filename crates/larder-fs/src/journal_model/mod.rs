//! Property test of the journal: coalescing and cancellation never change the final home state versus
//! pushing every operation one by one.
//!
//! Proptest generates workloads: lists of abstract steps (create, write, setattr, unlink, rmdir, rename,
//! link, and, in half of them, beginning and pushing ops while the workload runs), each interpreted
//! against a model of the local file system (inodes, directories, hard links) from an initial tree that
//! home also has. Each change's [`Op`] is built the way the file system does and recorded in a [`Journal`]
//! (calling `forget_removed` when an inode loses its last name); the same ops, uncoalesced, are kept in a
//! plain list. Both are replayed against a model of home keyed by path: the list in order, the journal
//! through `ready`/`begin`/`finish` in an order the workload picks within what is under way (so
//! coalescing and cancellation meet ops already pushed or under way); a few pushes fail cleanly and are
//! retried. The local tree and the two homes must agree on every path: object, kind, content, mode and
//! owner; the journal may make no more home calls. A failing workload is shrunk to a minimal one, and its
//! seed kept in `proptest-regressions/journal_model/mod.txt`, run first from then on.
//!
//! A `Data` op pushes what the inode holds when the push runs (the final content once the workload is
//! over); every write records one, so a write after an early push always leaves a later `Data` op.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use crate::journal::{Journal, Op, OpKind};

const ROOT: u64 = 1;
const NAMES: [&str; 5] = ["a", "b", "c", "x", "y"];
const PERMS: [u32; 4] = [0o600, 0o644, 0o700, 0o755];
/// Deepest directory the generator makes (it may move one deeper by a rename).
const MAX_DEPTH: usize = 3;

/// Picks one of the candidates a step has (modulo their number): shrinks toward the first.
type Pick = u8;

fn pick<T: Clone>(items: &[T], p: Pick) -> Option<T> {
    (!items.is_empty()).then(|| items[p as usize % items.len()].clone())
}

fn name(p: Pick) -> &'static str {
    NAMES[p as usize % NAMES.len()]
}

fn perm(p: Pick) -> u32 {
    PERMS[p as usize % PERMS.len()]
}

/// One step of a workload, interpreted against the local model as it stands: the picks choose among what
/// exists then, and a step that does not apply (a name taken, nothing to remove) is skipped.
#[derive(Clone, Debug)]
enum Step {
    Create {
        kind: Kind,
        dir: Pick,
        name: Pick,
        perm: Pick,
    },
    /// A write or truncate: the file's content changes.
    Write {
        file: Pick,
    },
    SetAttr {
        ino: Pick,
        perm: Option<Pick>,
        uid: Option<u32>,
    },
    Unlink {
        entry: Pick,
    },
    Rmdir {
        entry: Pick,
    },
    /// `exchange` applies only where the target exists (and the run makes exchanges), `no_replace` only
    /// where it does not.
    Rename {
        entry: Pick,
        dir: Pick,
        name: Pick,
        exchange: bool,
        no_replace: bool,
    },
    Link {
        entry: Pick,
        dir: Pick,
        name: Pick,
    },
    /// Begin up to `limit` ready ops while the workload runs.
    Begin {
        limit: usize,
    },
    /// Push and finish some of the ops under way while the workload runs.
    Push(Vec<Push>),
}

/// One op under way (picked among them) pushed to home, or failing cleanly (home untouched).
#[derive(Clone, Copy, Debug)]
enum Push {
    Done(Pick),
    /// Back to the queue: at once (`retry_now`) or as a refusal with no wait.
    Fail {
        op: Pick,
        retry_now: bool,
    },
}

/// One round of the final drain: begin up to `limit` ready ops (all when `None`), push `pushes`, then the
/// rest of those under way if `rest`. Once the rounds are used up, each round begins and pushes all.
#[derive(Clone, Debug)]
struct Round {
    limit: Option<usize>,
    pushes: Vec<Push>,
    rest: bool,
}

/// A workload and how the journal's ops reach home.
#[derive(Clone, Debug)]
struct Workload {
    steps: Vec<Step>,
    drain: Vec<Round>,
}

mod strategy {
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;

    use super::{Kind, Pick, Push, Round, Step, Workload};

    fn push() -> impl Strategy<Value = Push> {
        prop_oneof![
            24 => any::<Pick>().prop_map(Push::Done),
            1 => (any::<Pick>(), any::<bool>()).prop_map(|(op, retry_now)| Push::Fail { op, retry_now }),
        ]
    }

    fn step(exchange: bool, early: bool) -> BoxedStrategy<Step> {
        let p = any::<Pick>;
        let kind =
            prop_oneof![7 => Just(Kind::File), 4 => Just(Kind::Dir), 1 => Just(Kind::Symlink), 1 => Just(Kind::Node)];
        let setattr = prop_oneof![
            (p(), p()).prop_map(|(ino, perm)| Step::SetAttr {
                ino,
                perm: Some(perm),
                uid: None
            }),
            (p(), 0..3u32).prop_map(|(ino, uid)| Step::SetAttr {
                ino,
                perm: None,
                uid: Some(uid)
            }),
            (p(), p(), 0..3u32).prop_map(|(ino, perm, uid)| Step::SetAttr {
                ino,
                perm: Some(perm),
                uid: Some(uid)
            }),
        ];
        let exchange = if exchange {
            prop::bool::weighted(0.4).boxed()
        } else {
            Just(false).boxed()
        };
        let rename = (p(), p(), p(), exchange, prop::bool::weighted(0.3)).prop_map(
            |(entry, dir, name, exchange, no_replace)| Step::Rename {
                entry,
                dir,
                name,
                exchange,
                no_replace,
            },
        );
        let change = prop_oneof![
            25 => (kind, p(), p(), p()).prop_map(|(kind, dir, name, perm)| Step::Create { kind, dir, name, perm }),
            18 => p().prop_map(|file| Step::Write { file }),
            8 => setattr,
            12 => p().prop_map(|entry| Step::Unlink { entry }),
            6 => p().prop_map(|entry| Step::Rmdir { entry }),
            24 => rename,
            7 => (p(), p(), p()).prop_map(|(entry, dir, name)| Step::Link { entry, dir, name }),
        ];
        if !early {
            return change.boxed();
        }
        prop_oneof![
            84 => change,
            8 => (1..4usize).prop_map(|limit| Step::Begin { limit }),
            8 => vec(push(), 1..4).prop_map(Step::Push),
        ]
        .boxed()
    }

    fn round() -> impl Strategy<Value = Round> {
        (
            option::weighted(0.5, 1..4usize),
            vec(push(), 0..3),
            prop::bool::weighted(0.7),
        )
            .prop_map(|(limit, pushes, rest)| Round { limit, pushes, rest })
    }

    /// Workloads of up to 80 steps; in half of them, ops are pushed while the workload runs.
    pub(super) fn workload(exchange: bool) -> impl Strategy<Value = Workload> {
        any::<bool>().prop_flat_map(move |early| {
            (vec(step(exchange, early), 1..80), vec(round(), 0..8)).prop_map(|(steps, drain)| Workload { steps, drain })
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
    Node,
}

/// An object's state: `content` is a version counter (files) or the target (symlinks).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Obj {
    kind: Kind,
    content: u64,
    mode: u32,
    uid: u32,
}

/// Path → (object, state).
type Snapshot = BTreeMap<String, (u64, Obj)>;

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn parent_of(p: &str) -> Option<&str> {
    (!p.is_empty()).then(|| p.rsplit_once('/').map_or("", |(d, _)| d))
}

/// Whether `p` is strictly inside the directory at `dir`.
fn inside(p: &str, dir: &str) -> bool {
    if dir.is_empty() {
        !p.is_empty()
    } else {
        p.len() > dir.len() && p.starts_with(dir) && p.as_bytes()[dir.len()] == b'/'
    }
}

fn text(p: &[u8]) -> String {
    String::from_utf8(p.to_vec()).expect("generated paths are UTF-8")
}

fn symlink_target(version: u64) -> Vec<u8> {
    format!("t{version}").into_bytes()
}

fn symlink_version(target: &[u8]) -> u64 {
    text(&target[1..]).parse().expect("generated symlink target")
}

fn describe(op: &Op) -> String {
    let path = text(&op.path);
    let what = match &op.kind {
        OpKind::Create { mode, .. } | OpKind::Mkdir { mode, .. } | OpKind::Mknod { mode, .. } => {
            format!("{} {path:?} mode {mode:o}", op.kind.name())
        }
        OpKind::Symlink { target, .. } => format!("symlink {path:?} -> {:?}", text(target)),
        OpKind::Link { to } => format!("link {path:?} as {:?}", text(to)),
        OpKind::Rename {
            to,
            no_replace,
            exchange,
            replaced,
        } => {
            let mut flags = String::new();
            for (set, flag) in [
                (*no_replace, " no_replace"),
                (*exchange, " exchange"),
                (*replaced, " replaced"),
            ] {
                if set {
                    flags.push_str(flag);
                }
            }
            format!("rename {path:?} -> {:?}{flags}", text(to))
        }
        OpKind::SetAttr { perm, uid, .. } => {
            format!("setattr {path:?} perm {:?} uid {uid:?}", perm.map(|p| format!("{p:o}")))
        }
        _ => format!("{} {path:?}", op.kind.name()),
    };
    format!("ino {} {what} names {:?}", op.ino, op.names)
}

/// The local file system: inodes (kept after their last name goes, for their content) and entries.
#[derive(Clone)]
struct Local {
    inodes: BTreeMap<u64, Obj>,
    entries: BTreeMap<(u64, String), u64>,
    names: BTreeMap<u64, BTreeSet<(u64, String)>>,
    next_ino: u64,
    next_version: u64,
}

impl Local {
    /// Root; dir `a` holding file `a/x`, symlink `a/s` and `a/y` (a hard link of `c`); file `y`; empty dir `b`.
    fn initial() -> Local {
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

    fn add(&mut self, parent: u64, name: &str, o: Obj) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, o);
        self.insert(parent, name, ino);
        ino
    }

    fn version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    fn insert(&mut self, parent: u64, name: &str, ino: u64) {
        let old = self.entries.insert((parent, name.to_string()), ino);
        assert!(old.is_none(), "entry {parent}/{name} taken");
        self.names.entry(ino).or_default().insert((parent, name.to_string()));
    }

    fn remove(&mut self, parent: u64, name: &str) -> u64 {
        let key = (parent, name.to_string());
        let ino = self.entries.remove(&key).expect("entry exists");
        let names = self.names.get_mut(&ino).expect("named inode");
        names.remove(&key);
        if names.is_empty() {
            self.names.remove(&ino);
        }
        ino
    }

    fn named(&self, ino: u64) -> bool {
        ino == ROOT || self.names.contains_key(&ino)
    }

    fn kind(&self, ino: u64) -> Kind {
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

    fn path(&self, parent: u64, name: &str) -> String {
        join(&self.dir_path(parent), name)
    }

    fn depth(&self, dir: u64) -> usize {
        if dir == ROOT {
            0
        } else {
            1 + self.depth(self.parent(dir))
        }
    }

    /// Whether `dir` is `ancestor` or inside it.
    fn within(&self, dir: u64, ancestor: u64) -> bool {
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

    fn is_empty_dir(&self, dir: u64) -> bool {
        self.entries
            .range((dir, String::new())..)
            .next()
            .is_none_or(|((p, _), _)| *p != dir)
    }

    /// Named inodes matching `keep`, the root included.
    fn live(&self, keep: impl Fn(&Obj) -> bool) -> Vec<u64> {
        self.inodes
            .iter()
            .filter(|(ino, o)| self.named(**ino) && keep(o))
            .map(|(ino, _)| *ino)
            .collect()
    }

    /// Entries (parent, name, inode) whose inode matches `keep`.
    fn entries_where(&self, keep: impl Fn(u64, &Obj) -> bool) -> Vec<(u64, String, u64)> {
        self.entries
            .iter()
            .filter(|(_, ino)| keep(**ino, &self.inodes[*ino]))
            .map(|((p, n), ino)| (*p, n.clone(), *ino))
            .collect()
    }

    fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot::new();
        s.insert(String::new(), (ROOT, self.inodes[&ROOT].clone()));
        for ((parent, name), ino) in &self.entries {
            s.insert(self.path(*parent, name), (*ino, self.inodes[ino].clone()));
        }
        s
    }
}

fn obj(kind: Kind, content: u64, mode: u32) -> Obj {
    Obj {
        kind,
        content,
        mode,
        uid: 0,
    }
}

/// Home, keyed by path; objects are named by the inode that made them.
#[derive(Clone)]
struct Home {
    paths: BTreeMap<String, u64>,
    objects: BTreeMap<u64, Obj>,
    /// Calls made.
    calls: usize,
}

impl Home {
    fn of(local: &Local) -> Home {
        let snapshot = local.snapshot();
        Home {
            paths: snapshot.iter().map(|(p, (ino, _))| (p.clone(), *ino)).collect(),
            objects: snapshot.into_values().collect(),
            calls: 0,
        }
    }

    fn snapshot(&self) -> Snapshot {
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
    fn apply(&mut self, op: &Op, content: &dyn Fn(u64) -> u64) -> Result<(), String> {
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

fn diff(a: &Snapshot, b: &Snapshot) -> String {
    let mut out = String::new();
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for k in keys {
        if a.get(k) != b.get(k) {
            let _ = writeln!(out, "  {k:?}: {:?} vs {:?}", a.get(k), b.get(k));
        }
    }
    out
}

struct Outcome {
    /// Home calls one by one.
    reference: usize,
    /// Home calls through the journal.
    pushed: usize,
}

struct Run {
    local: Local,
    journal: Journal,
    /// Every op, in order, uncoalesced.
    all: Vec<Op>,
    /// Home as the journal's pushes leave it.
    home: Home,
    /// Begun, not yet finished: seq and the op as begun.
    inflight: Vec<(u64, Op)>,
    log: Vec<String>,
}

/// A local change: its op and the inodes that lost their last name by it.
type Change = (Op, Vec<u64>);

impl Run {
    fn new() -> Run {
        let local = Local::initial();
        Run {
            home: Home::of(&local),
            local,
            journal: Journal::default(),
            all: Vec::new(),
            inflight: Vec::new(),
            log: Vec::new(),
        }
    }

    /// A path of `ino` (any of its names).
    fn some_path(&self, ino: u64, p: Pick) -> String {
        if ino == ROOT {
            return String::new();
        }
        let names: Vec<(u64, String)> = self.local.names[&ino].iter().cloned().collect();
        let (parent, name) = pick(&names, p).expect("named");
        self.local.path(parent, &name)
    }

    /// The change `step` makes, if it is one and applies.
    fn change(&mut self, step: &Step) -> Option<Change> {
        match *step {
            Step::Create {
                kind,
                dir,
                name: n,
                perm: m,
            } => self.create(kind, dir, name(n), perm(m)),
            Step::Write { file } => self.write(file),
            Step::SetAttr { ino, perm: m, uid } => self.setattr(ino, m.map(perm), uid),
            Step::Unlink { entry } => self.unlink(entry),
            Step::Rmdir { entry } => self.rmdir(entry),
            Step::Rename {
                entry,
                dir,
                name: n,
                exchange,
                no_replace,
            } => self.rename(entry, dir, name(n), exchange, no_replace),
            Step::Link { entry, dir, name: n } => self.link(entry, dir, name(n)),
            Step::Begin { .. } | Step::Push(_) => None,
        }
    }

    fn create(&mut self, kind: Kind, dir: Pick, name: &str, mode: u32) -> Option<Change> {
        let parent = pick(&self.local.live(|o| o.kind == Kind::Dir), dir)?;
        if self.local.entries.contains_key(&(parent, name.to_string()))
            || (kind == Kind::Dir && self.local.depth(parent) >= MAX_DEPTH)
        {
            return None;
        }
        let path = self.local.path(parent, name);
        let (op_kind, o) = match kind {
            Kind::File => (
                OpKind::Create {
                    mode,
                    uid: None,
                    gid: None,
                },
                obj(Kind::File, 0, mode),
            ),
            Kind::Dir => (
                OpKind::Mkdir {
                    mode,
                    uid: None,
                    gid: None,
                },
                obj(Kind::Dir, 0, mode),
            ),
            Kind::Symlink => {
                let v = self.local.version();
                (
                    OpKind::Symlink {
                        target: symlink_target(v),
                        uid: None,
                        gid: None,
                    },
                    obj(Kind::Symlink, v, 0o777),
                )
            }
            Kind::Node => (
                OpKind::Mknod {
                    mode,
                    rdev: 0,
                    uid: None,
                    gid: None,
                },
                obj(Kind::Node, 0, mode),
            ),
        };
        let ino = self.local.add(parent, name, o);
        Some((
            Op::new(
                ino,
                path.into_bytes(),
                vec![(parent, name.as_bytes().to_vec())],
                op_kind,
            ),
            Vec::new(),
        ))
    }

    fn write(&mut self, file: Pick) -> Option<Change> {
        let ino = pick(&self.local.live(|o| o.kind == Kind::File), file)?;
        let v = self.local.version();
        self.local.inodes.get_mut(&ino).expect("live").content = v;
        let path = self.some_path(ino, file);
        Some((Op::new(ino, path.into_bytes(), Vec::new(), OpKind::Data), Vec::new()))
    }

    fn setattr(&mut self, which: Pick, perm: Option<u32>, uid: Option<u32>) -> Option<Change> {
        let ino = pick(&self.local.live(|o| matches!(o.kind, Kind::File | Kind::Dir)), which)?;
        let o = self.local.inodes.get_mut(&ino).expect("live");
        o.mode = perm.unwrap_or(o.mode);
        o.uid = uid.unwrap_or(o.uid);
        let path = self.some_path(ino, which);
        let kind = OpKind::SetAttr {
            perm,
            uid,
            gid: None,
            atime: None,
            mtime: None,
        };
        Some((Op::new(ino, path.into_bytes(), Vec::new(), kind), Vec::new()))
    }

    fn unlink(&mut self, entry: Pick) -> Option<Change> {
        let (parent, name, ino) = pick(&self.local.entries_where(|_, o| o.kind != Kind::Dir), entry)?;
        let path = self.local.path(parent, &name);
        self.local.remove(parent, &name);
        let gone = if self.local.named(ino) { Vec::new() } else { vec![ino] };
        Some((
            Op::new(
                ino,
                path.into_bytes(),
                vec![(parent, name.into_bytes())],
                OpKind::Unlink,
            ),
            gone,
        ))
    }

    fn rmdir(&mut self, entry: Pick) -> Option<Change> {
        let empty = self
            .local
            .entries_where(|ino, o| o.kind == Kind::Dir && self.local.is_empty_dir(ino));
        let (parent, name, ino) = pick(&empty, entry)?;
        let path = self.local.path(parent, &name);
        self.local.remove(parent, &name);
        Some((
            Op::new(ino, path.into_bytes(), vec![(parent, name.into_bytes())], OpKind::Rmdir),
            vec![ino],
        ))
    }

    fn rename(&mut self, entry: Pick, dir: Pick, to_name: &str, exchange: bool, no_replace: bool) -> Option<Change> {
        let (from_dir, from_name, ino) = pick(&self.local.entries_where(|_, _| true), entry)?;
        let to_dir = pick(&self.local.live(|o| o.kind == Kind::Dir), dir)?;
        let is_dir = self.local.kind(ino) == Kind::Dir;
        if (from_dir, from_name.as_str()) == (to_dir, to_name)
            || (is_dir && (self.local.within(to_dir, ino) || self.local.depth(to_dir) >= MAX_DEPTH))
        {
            return None;
        }
        let target = self.local.entries.get(&(to_dir, to_name.to_string())).copied();
        let exchange = target.is_some() && exchange;
        if let Some(t) = target {
            let t_dir = self.local.kind(t) == Kind::Dir;
            let fits = if exchange {
                !(t_dir && self.local.within(from_dir, t))
            } else if is_dir {
                t_dir && self.local.is_empty_dir(t)
            } else {
                !t_dir
            };
            if t == ino || !fits {
                return None;
            }
        }
        let from = self.local.path(from_dir, &from_name);
        let to = self.local.path(to_dir, to_name);
        let names = vec![
            (from_dir, from_name.as_bytes().to_vec()),
            (to_dir, to_name.as_bytes().to_vec()),
        ];
        let kind = OpKind::Rename {
            to: to.into_bytes(),
            no_replace: target.is_none() && no_replace,
            exchange,
            replaced: target.is_some(),
        };
        let mut gone = Vec::new();
        if let Some(t) = target {
            self.local.remove(to_dir, to_name);
            if exchange {
                self.local.remove(from_dir, &from_name);
                self.local.insert(from_dir, &from_name, t);
            } else if !self.local.named(t) {
                gone.push(t);
            }
        }
        if !exchange {
            self.local.remove(from_dir, &from_name);
        }
        self.local.insert(to_dir, to_name, ino);
        Some((Op::new(ino, from.into_bytes(), names, kind), gone))
    }

    fn link(&mut self, entry: Pick, dir: Pick, to_name: &str) -> Option<Change> {
        let (from_dir, from_name, ino) = pick(&self.local.entries_where(|_, o| o.kind != Kind::Dir), entry)?;
        let to_dir = pick(&self.local.live(|o| o.kind == Kind::Dir), dir)?;
        if self.local.entries.contains_key(&(to_dir, to_name.to_string())) {
            return None;
        }
        let from = self.local.path(from_dir, &from_name);
        let to = self.local.path(to_dir, to_name);
        self.local.insert(to_dir, to_name, ino);
        let kind = OpKind::Link { to: to.into_bytes() };
        Some((
            Op::new(
                ino,
                from.into_bytes(),
                vec![(to_dir, to_name.as_bytes().to_vec())],
                kind,
            ),
            Vec::new(),
        ))
    }

    fn record(&mut self, (op, gone): Change) {
        self.log.push(format!("record {}", describe(&op)));
        self.all.push(op.clone());
        let _ = self.journal.record(op);
        for ino in gone {
            self.log.push(format!("forget_removed {ino}"));
            let _ = self.journal.forget_removed(ino);
        }
    }

    /// Begin up to `limit` ready ops.
    fn start(&mut self, limit: usize) -> Result<(), String> {
        for seq in self.journal.ready(Duration::ZERO, false, limit) {
            if self.inflight.iter().any(|(s, _)| *s == seq) {
                return Err(format!("ready returned #{seq}, which is under way"));
            }
            let _ = self.journal.begin(seq);
            let op = self
                .journal
                .get(seq)
                .cloned()
                .ok_or(format!("ready returned #{seq}, not queued"))?;
            self.log.push(format!("begin #{seq}: {}", describe(&op)));
            self.inflight.push((seq, op));
        }
        Ok(())
    }

    /// Push and finish ops under way in the order `pushes` picks them (any order will do: they were claimed
    /// independent). A failed push leaves home untouched; the op goes back to the queue.
    fn finish(&mut self, pushes: impl IntoIterator<Item = Push>) -> Result<(), String> {
        for push in pushes {
            if self.inflight.is_empty() {
                break;
            }
            let (Push::Done(p) | Push::Fail { op: p, .. }) = push;
            let (seq, op) = self.inflight.remove(p as usize % self.inflight.len());
            if let Push::Fail { retry_now, .. } = push {
                self.log.push(format!("fail #{seq}"));
                let backoff = (!retry_now).then_some(Duration::ZERO);
                self.journal.fail(seq, "model failure".to_string(), backoff);
                continue;
            }
            self.log.push(format!("push #{seq}: {}", describe(&op)));
            let local = &self.local;
            self.home
                .apply(&op, &|ino| local.inodes[&ino].content)
                .map_err(|e| format!("journal replay: push #{seq} ({}) failed: {e}", describe(&op)))?;
            match self.journal.finish(seq).0 {
                Some(f) if f.ino == op.ino && f.path == op.path && f.kind == op.kind && f.names == op.names => {}
                other => return Err(format!("finish(#{seq}) returned {other:?}, begun as {op:?}")),
            }
        }
        Ok(())
    }

    /// Push everything under way, oldest first.
    fn finish_all(&mut self) -> Result<(), String> {
        let n = self.inflight.len();
        self.finish(std::iter::repeat_n(Push::Done(0), n))
    }

    fn run(&mut self, w: &Workload) -> Result<Outcome, String> {
        let initial = self.home.clone();
        for step in &w.steps {
            match step {
                Step::Begin { limit } => self.start(*limit)?,
                Step::Push(pushes) => self.finish(pushes.iter().copied())?,
                _ => {
                    if let Some(change) = self.change(step) {
                        self.record(change);
                    }
                }
            }
        }
        let default = Round {
            limit: None,
            pushes: Vec::new(),
            rest: true,
        };
        for round in w.drain.iter().chain(std::iter::repeat(&default)).take(10_000) {
            if self.journal.is_empty() && self.inflight.is_empty() {
                break;
            }
            self.start(round.limit.unwrap_or(usize::MAX))?;
            if self.inflight.is_empty() {
                return Err(format!("deadlock: {} ops queued, none ready", self.journal.len()));
            }
            self.finish(round.pushes.iter().copied())?;
            if round.rest {
                self.finish_all()?;
            }
        }
        if !self.journal.is_empty() {
            return Err(format!("journal did not drain: {} ops left", self.journal.len()));
        }
        let mut reference = initial;
        for (i, op) in self.all.iter().enumerate() {
            let local = &self.local;
            reference
                .apply(op, &|ino| local.inodes[&ino].content)
                .map_err(|e| format!("model bug: op {i} ({}) fails one by one: {e}", describe(op)))?;
        }
        let local = self.local.snapshot();
        let expected = reference.snapshot();
        if local != expected {
            return Err(format!(
                "model bug: local vs one-by-one home:\n{}",
                diff(&local, &expected)
            ));
        }
        let got = self.home.snapshot();
        if got != expected {
            return Err(format!(
                "final home differs, one by one vs journal:\n{}",
                diff(&expected, &got)
            ));
        }
        if self.home.calls > reference.calls {
            return Err(format!(
                "journal made {} home calls, one by one {}",
                self.home.calls, reference.calls
            ));
        }
        Ok(Outcome {
            reference: reference.calls,
            pushed: self.home.calls,
        })
    }
}

/// Run one workload; on failure, the report lists the ops and what the journal did.
fn run(w: &Workload) -> Result<Outcome, String> {
    let mut r = Run::new();
    r.run(w).map_err(|e| {
        let mut report = format!("{e}\nops, one by one:\n");
        for (i, op) in r.all.iter().enumerate() {
            let _ = writeln!(report, "  {i:3} {}", describe(op));
        }
        report.push_str("journal:\n");
        for line in &r.log {
            let _ = writeln!(report, "  {line}");
        }
        report
    })
}

/// Random workloads (a bounded number: the whole test takes seconds in a debug build); a failing one is
/// shrunk, and its seed saved under `proptest-regressions/` to be run first next time. Returns the home
/// calls made one by one and through the journal, over all workloads.
fn check_workloads(exchange: bool) -> (usize, usize) {
    use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestError, TestRunner};

    let config = Config {
        cases: 1000,
        source_file: Some(file!()),
        failure_persistence: Some(Box::new(FileFailurePersistence::SourceParallel("proptest-regressions"))),
        ..Config::default()
    };
    let totals = std::cell::Cell::new((0, 0));
    let result = TestRunner::new(config).run(&strategy::workload(exchange), |w| {
        let o = run(&w).map_err(TestCaseError::fail)?;
        let (reference, pushed) = totals.get();
        totals.set((reference + o.reference, pushed + o.pushed));
        Ok(())
    });
    match result {
        Ok(()) => totals.get(),
        Err(TestError::Fail(why, w)) => panic!("{why}\nminimal failing workload: {w:#?}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn coalescing_and_cancellation_keep_the_final_home_state() {
    let (reference, pushed) = check_workloads(false);
    eprintln!("{reference} ops one by one, {pushed} pushed through the journal");
    assert!(pushed < reference, "nothing was coalesced or cancelled");
}

fn op(ino: u64, path: &str, names: &[(u64, &str)], kind: OpKind) -> Op {
    let names = names.iter().map(|(d, n)| (*d, n.as_bytes().to_vec())).collect();
    Op::new(ino, path.as_bytes().to_vec(), names, kind)
}

fn create() -> OpKind {
    OpKind::Create {
        mode: 0o644,
        uid: None,
        gid: None,
    }
}

fn rename(to: &str, replaced: bool) -> OpKind {
    OpKind::Rename {
        to: to.as_bytes().to_vec(),
        no_replace: false,
        exchange: false,
        replaced,
    }
}

/// Push everything queued, one ready op at a time, to `home`; returns the ops pushed, in order.
fn drain(j: &mut Journal, home: &mut Home, content: &dyn Fn(u64) -> u64) -> Vec<Op> {
    let mut pushed = Vec::new();
    while let Some(&seq) = j.ready(Duration::ZERO, false, 1).first() {
        j.begin(seq);
        let op = j.get(seq).cloned().expect("ready ops are queued");
        home.apply(&op, content)
            .unwrap_or_else(|e| panic!("{}: {e}", describe(&op)));
        j.finish(seq);
        pushed.push(op);
    }
    assert!(j.is_empty(), "{} ops left, none ready", j.len());
    pushed
}

fn kinds(ops: &[Op]) -> Vec<(u64, &'static str)> {
    ops.iter().map(|o| (o.ino, o.kind.name())).collect()
}

#[test]
fn a_tree_made_and_removed_here_leaves_nothing() {
    let mut j = Journal::default();
    let (d, f) = (10, 11);
    let mkdir = OpKind::Mkdir {
        mode: 0o755,
        uid: None,
        gid: None,
    };
    j.record(op(d, "d", &[(ROOT, "d")], mkdir));
    j.record(op(f, "d/f", &[(d, "f")], create()));
    j.record(op(f, "d/f", &[], OpKind::Data));
    j.record(op(d, "d", &[(ROOT, "d"), (ROOT, "e")], rename("e", false)));
    j.record(op(f, "e/f", &[(d, "f")], OpKind::Unlink));
    j.forget_removed(f);
    j.record(op(d, "e", &[(ROOT, "e")], OpKind::Rmdir));
    j.forget_removed(d);
    assert!(j.is_empty(), "{} ops left", j.len());
}

#[test]
fn a_file_home_has_written_truncated_and_removed_leaves_only_the_unlink() {
    let local = Local::initial();
    let y = local.entries[&(ROOT, "y".to_string())];
    let mut j = Journal::default();
    j.record(op(y, "y", &[], OpKind::Data));
    // A truncate is one more change of the content.
    j.record(op(y, "y", &[], OpKind::Data));
    j.record(op(y, "y", &[(ROOT, "y")], OpKind::Unlink));
    j.forget_removed(y);
    let mut home = Home::of(&local);
    let pushed = drain(&mut j, &mut home, &|_| unreachable!("no data is pushed"));
    assert_eq!(kinds(&pushed), [(y, "unlink")]);
    assert!(!home.paths.contains_key("y"));
}

#[test]
fn a_rename_that_replaced_a_file_home_has_is_never_cancelled() {
    let local = Local::initial();
    let y = local.entries[&(ROOT, "y".to_string())];
    let n = local.next_ino;
    let mut j = Journal::default();
    j.record(op(y, "y", &[], OpKind::Data));
    j.record(op(n, "n", &[(ROOT, "n")], create()));
    j.record(op(n, "n", &[], OpKind::Data));
    j.record(op(n, "n", &[(ROOT, "n"), (ROOT, "y")], rename("y", true)));
    j.forget_removed(y);
    j.record(op(n, "y", &[(ROOT, "y"), (ROOT, "z")], rename("z", false)));
    j.record(op(n, "z", &[(ROOT, "z")], OpKind::Unlink));
    j.forget_removed(n);
    let mut home = Home::of(&local);
    let pushed = drain(&mut j, &mut home, &|_| unreachable!("data of removed files is dropped"));
    assert_eq!(
        kinds(&pushed),
        [(n, "create"), (n, "rename"), (n, "rename"), (n, "unlink")]
    );
    for gone in ["y", "n", "z"] {
        assert!(!home.paths.contains_key(gone), "{gone:?} left at home");
    }
}

/// `rename(y, n, RENAME_EXCHANGE)` is one op of `y`'s inode, yet it needs `n` at home: `n` is not cancelled
/// when it goes later.
#[test]
fn an_exchange_keeps_its_partner() {
    let local = Local::initial();
    let y = local.entries[&(ROOT, "y".to_string())];
    let n = local.next_ino;
    let mut j = Journal::default();
    j.record(op(n, "n", &[(ROOT, "n")], create()));
    let exchange = OpKind::Rename {
        to: b"n".to_vec(),
        no_replace: false,
        exchange: true,
        replaced: true,
    };
    j.record(op(y, "y", &[(ROOT, "y"), (ROOT, "n")], exchange));
    j.record(op(n, "y", &[(ROOT, "y")], OpKind::Unlink));
    j.forget_removed(n);
    let mut home = Home::of(&local);
    drain(&mut j, &mut home, &|_| unreachable!("no data is pushed"));
    assert_eq!(home.paths.get("n"), Some(&y));
    assert!(!home.paths.contains_key("y"));
}

#[test]
fn coalescing_and_cancellation_keep_the_final_home_state_with_exchanges() {
    let (reference, pushed) = check_workloads(true);
    assert!(pushed < reference, "nothing was coalesced or cancelled");
}
