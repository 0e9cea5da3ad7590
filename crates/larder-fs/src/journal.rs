//! The write-back journal: the ordered list of changes made here and not yet at home.
//!
//! Every change is one [`Op`] naming its subject inode and the home path(s) it had when the change was
//! made. Replaying the ops in sequence order against home reproduces the local namespace; the journal
//! only ever changes that sequence in ways that leave the final home state the same:
//!
//! * **Coalescing.** A file has at most one queued `Data` op: it pushes whatever ranges are dirty when it
//!   runs, so later writes join it. If other ops of the file were queued after it, it moves behind them
//!   (keeping its age), so a write never overtakes a change of the same file made after it. A `SetAttr`
//!   that follows another of the same inode merges into it.
//! * **Cancellation.** When an object created here (its create still queued) loses its last name, all its
//!   queued ops are dropped, unless one of them has effects beyond the object (a rename that replaced or
//!   exchanged another, a hard link) or, for a directory, other queued ops still name it as a parent.
//!   When an object that home has loses its last name, its queued `Data`, `SetAttr` and `SetXattr` are
//!   dropped.
//! * **Dependency order.** Op B may run once no earlier op still pending or under way shares a path with
//!   it (equal, or one inside the other) or its subject. Independent ops run in parallel.
//!
//! This module is pure: callers persist the [`Mutation`]s it returns and do the home calls.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use larder_cache::Mutation;
use serde::{Deserialize, Serialize};

/// What a queued op does at home.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum OpKind {
    Create {
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Mkdir {
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Mknod {
        mode: u32,
        rdev: u64,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Symlink {
        target: Vec<u8>,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    /// Hard-link the object at the op's path as `to`.
    Link {
        to: Vec<u8>,
    },
    Unlink,
    Rmdir,
    /// Rename the op's path to `to`. `replaced`: something was at `to` locally when it was made.
    Rename {
        to: Vec<u8>,
        no_replace: bool,
        exchange: bool,
        replaced: bool,
    },
    /// Mode, owner and times; times in nanoseconds since the epoch.
    SetAttr {
        perm: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<i128>,
        mtime: Option<i128>,
    },
    /// Push the file's dirty ranges and size.
    Data,
    /// Give the object the extended attribute `name` with `value`, or take it away (`None`).
    SetXattr {
        name: Vec<u8>,
        value: Option<Vec<u8>>,
    },
}

impl OpKind {
    pub fn name(&self) -> &'static str {
        match self {
            OpKind::Create { .. } => "create",
            OpKind::Mkdir { .. } => "mkdir",
            OpKind::Mknod { .. } => "mknod",
            OpKind::Symlink { .. } => "symlink",
            OpKind::Link { .. } => "link",
            OpKind::Unlink => "unlink",
            OpKind::Rmdir => "rmdir",
            OpKind::Rename { .. } => "rename",
            OpKind::SetAttr { .. } => "setattr",
            OpKind::Data => "data",
            OpKind::SetXattr { .. } => "setxattr",
        }
    }

    pub(crate) fn creates(&self) -> bool {
        matches!(
            self,
            OpKind::Create { .. } | OpKind::Mkdir { .. } | OpKind::Mknod { .. } | OpKind::Symlink { .. }
        )
    }
}

/// One queued change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Op {
    /// The inode changed.
    pub ino: u64,
    /// Its home path when the change was made.
    pub path: Vec<u8>,
    /// The directory entries it changes: (directory inode, name).
    pub names: Vec<(u64, Vec<u8>)>,
    pub kind: OpKind,
    /// Wall-clock milliseconds of the oldest change this op carries.
    pub since_ms: u64,
    /// A push was started (it may have reached home before a crash): errors that say "already done" are
    /// success when it is repeated.
    pub attempted: bool,
}

impl Op {
    /// An op on `ino`, at `path`, changing the directory entries `names`.
    pub fn new(ino: u64, path: Vec<u8>, names: Vec<(u64, Vec<u8>)>, kind: OpKind) -> Op {
        Op {
            ino,
            path,
            names,
            kind,
            since_ms: now_ms(),
            attempted: false,
        }
    }

    pub(crate) fn paths(&self) -> impl Iterator<Item = &[u8]> {
        let second = match &self.kind {
            OpKind::Link { to } | OpKind::Rename { to, .. } => Some(to.as_slice()),
            _ => None,
        };
        std::iter::once(self.path.as_slice()).chain(second)
    }

    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<Op> {
        postcard::from_bytes(bytes).ok()
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Proper ancestors of a path ("" is the root, an ancestor of every other path).
fn ancestors(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    let cuts = p.iter().enumerate().filter(|(_, b)| **b == b'/').map(|(i, _)| i);
    (!p.is_empty())
        .then_some(&p[..0])
        .into_iter()
        .chain(cuts.map(move |i| &p[..i]))
}

/// What the ops seen so far in queue order touch: an op that shares its subject or a path with one of
/// them (equal, or one inside the other) must wait for it.
#[derive(Default)]
struct Earlier<'a> {
    paths: HashSet<&'a [u8]>,
    inside: HashSet<&'a [u8]>,
    inos: HashSet<u64>,
}

impl<'a> Earlier<'a> {
    /// Whether `op` depends on an op seen before it; then `op` is counted as seen.
    fn block(&mut self, op: &'a Op) -> bool {
        let blocked = self.inos.contains(&op.ino)
            || op.paths().any(|p| {
                self.paths.contains(p) || self.inside.contains(p) || ancestors(p).any(|a| self.paths.contains(a))
            });
        self.inos.insert(op.ino);
        for p in op.paths() {
            self.paths.insert(p);
            self.inside.extend(ancestors(p));
        }
        blocked
    }
}

/// Why an op is waiting after a failed push, and until when.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub error: String,
    pub retry_at: Instant,
    pub attempts: u32,
    /// When the attempt that failed began.
    pub attempt_began: Instant,
}

/// The queue.
#[derive(Default)]
pub(crate) struct Journal {
    ops: BTreeMap<u64, Op>,
    next_seq: u64,
    /// Ops under way, with when their attempt began.
    inflight: HashMap<u64, Instant>,
    /// Queued seqs per subject inode.
    by_ino: HashMap<u64, BTreeSet<u64>>,
    failed: HashMap<u64, Failure>,
    /// Queued changes per directory entry: directory -> name -> count.
    names: HashMap<u64, HashMap<Vec<u8>, u32>>,
    /// Directories being listed from home, with the names of theirs that changes were recorded for since
    /// (`watchers`, `names`): a listing must not undo them, though they may have left the queue already.
    watched: HashMap<u64, (u32, HashSet<Vec<u8>>)>,
    /// Ops whose callers push them themselves and wait for the answer (write-through): never coalesced,
    /// and left alone by the flusher threads.
    held: HashSet<u64>,
    /// Queued renames that exchange their two ends.
    exchanges: usize,
}

impl Journal {
    /// A journal holding the persisted ops (in sequence order).
    pub fn load(ops: Vec<(u64, Op)>) -> Journal {
        let mut j = Journal::default();
        for (seq, op) in ops {
            j.next_seq = j.next_seq.max(seq + 1);
            j.index(seq, &op);
            j.ops.insert(seq, op);
        }
        j.next_seq = j.next_seq.max(1);
        j
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub fn get(&self, seq: u64) -> Option<&Op> {
        self.ops.get(&seq)
    }

    /// Age of the oldest queued change.
    pub fn oldest_age(&self) -> Duration {
        let oldest = self.ops.values().map(|o| o.since_ms).min();
        oldest.map_or(Duration::ZERO, |t| Duration::from_millis(now_ms().saturating_sub(t)))
    }

    pub fn failures(&self) -> impl Iterator<Item = (&u64, &Failure)> {
        self.failed.iter()
    }

    /// Whether `ino` has queued ops besides those under way (being concluded: one, or a create with the
    /// data push that rides on it).
    pub fn has_after_current(&self, ino: u64) -> bool {
        self.by_ino
            .get(&ino)
            .is_some_and(|s| s.iter().any(|q| !self.inflight.contains_key(q)))
    }

    /// The data push of the file whose create `seq` is, when it is the file's next queued op and free to
    /// go with it: not under way, not held by a caller. The two may land as one (a file made with its
    /// content): nothing queued between them can see the file's content at home, and whatever is queued
    /// between them that moves the file or a directory above it applies to it with content as without.
    pub fn data_after(&self, seq: u64) -> Option<u64> {
        let op = self.ops.get(&seq)?;
        if !matches!(op.kind, OpKind::Create { .. }) {
            return None;
        }
        let next = *self.by_ino.get(&op.ino)?.range(seq + 1..).next()?;
        (self.ops[&next].kind == OpKind::Data
            && !self.inflight.contains_key(&next)
            && !self.held.contains(&next)
            && !self.held.contains(&seq))
        .then_some(next)
    }

    /// Whether a queued op of `ino` gives home its time again when it lands (a data push, a time set).
    pub fn time_given_later(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|s| {
            s.iter()
                .any(|q| matches!(self.ops[q].kind, OpKind::Data | OpKind::SetAttr { mtime: Some(_), .. }))
        })
    }

    /// Every inode with queued ops.
    pub fn inos(&self) -> Vec<u64> {
        self.by_ino.keys().copied().collect()
    }

    /// Whether `ino` has queued ops.
    pub fn has(&self, ino: u64) -> bool {
        self.by_ino.get(&ino).is_some_and(|s| !s.is_empty())
    }

    fn index(&mut self, seq: u64, op: &Op) {
        self.by_ino.entry(op.ino).or_default().insert(seq);
        if matches!(op.kind, OpKind::Rename { exchange: true, .. }) {
            self.exchanges += 1;
        }
        for (d, n) in &op.names {
            if let Some((_, names)) = self.watched.get_mut(d) {
                names.insert(n.clone());
            }
            *self.names.entry(*d).or_default().entry(n.clone()).or_default() += 1;
        }
    }

    /// Whether the entry `name` of directory `dir` has queued changes (home's view of it is behind).
    pub fn pinned(&self, dir: u64, name: &[u8]) -> bool {
        self.names.get(&dir).is_some_and(|m| m.contains_key(name))
    }

    /// Whether nothing queued changes directory `dir` any more: neither an entry of it nor it.
    pub fn dir_settled(&self, dir: u64) -> bool {
        !self.has(dir) && self.names.get(&dir).is_none_or(|m| m.is_empty())
    }

    /// A listing of `dir` from home begins: from now on, [`Journal::changed_while_watched`] names every entry
    /// of it a change is recorded for.
    pub fn watch(&mut self, dir: u64) {
        self.watched.entry(dir).or_default().0 += 1;
    }

    /// The listing of `dir` is over.
    pub fn unwatch(&mut self, dir: u64) {
        if let Some(w) = self.watched.get_mut(&dir) {
            w.0 -= 1;
            if w.0 == 0 {
                self.watched.remove(&dir);
            }
        }
    }

    /// Entries of `dir` changes were recorded for since the oldest listing of it under way began.
    pub fn changed_while_watched(&self, dir: u64) -> HashSet<Vec<u8>> {
        self.watched.get(&dir).map(|w| w.1.clone()).unwrap_or_default()
    }

    /// Whether a queued op touches a path below the directory at `dir` ("" is the root): home losing that
    /// directory (removed or renamed by others) must not take those changes with it.
    pub fn queued_below(&self, dir: &[u8]) -> bool {
        let below = |p: &[u8]| {
            dir.is_empty() && !p.is_empty() || p.len() > dir.len() && p.starts_with(dir) && p[dir.len()] == b'/'
        };
        self.ops.values().any(|op| op.paths().any(below))
    }

    /// The queued ops of `ino` that change its content or attributes (data, attributes, extended
    /// attributes) and are not under way, dropped: its changes were set aside whole (a copy of the file is
    /// in the conflicts area).
    pub fn drop_content_ops(&mut self, ino: u64) -> Vec<Mutation> {
        let mut out = Vec::new();
        let seqs: Vec<u64> = self
            .by_ino
            .get(&ino)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for s in seqs {
            let content = matches!(
                self.ops[&s].kind,
                OpKind::Data | OpKind::SetAttr { .. } | OpKind::SetXattr { .. }
            );
            if content && !self.inflight.contains_key(&s) {
                self.remove(s, &mut out);
            }
        }
        out
    }

    /// What of the file `ino` at `path` another node can take over with its write token, this node unable
    /// to push (design note 016): its queued ops, if each is a data push or a change of its attributes
    /// and no queued op of another object makes, moves or removes a name on its path (a push of one under
    /// way is the caller's to wait for). The ops' kinds; why not otherwise. (What a push of it begun
    /// sent is the file's `unconfirmed`, which goes with it.)
    pub fn handover_of(&self, ino: u64, path: &[u8]) -> Result<Vec<OpKind>, &'static str> {
        let mut kinds = Vec::new();
        for s in self.by_ino.get(&ino).into_iter().flatten() {
            let op = &self.ops[s];
            if !matches!(op.kind, OpKind::Data | OpKind::SetAttr { .. }) {
                return Err("its names or extended attributes changed here");
            }
            kinds.push(op.kind.clone());
        }
        let on_path = |p: &[u8]| p == path || ancestors(path).any(|a| a == p);
        let blocks = self.ops.values().any(|op| {
            op.ino != ino
                && !matches!(op.kind, OpKind::Data | OpKind::SetAttr { .. } | OpKind::SetXattr { .. })
                && op.paths().any(on_path)
        });
        if blocks {
            return Err("a name on its path changed here");
        }
        Ok(kinds)
    }

    /// Whether a queued op names `path`, a path below it, or makes, moves or removes a name above it: a
    /// change of `path` made elsewhere may depend on it reaching home first.
    pub fn touches_path(&self, path: &[u8]) -> bool {
        let below = |p: &[u8]| path.is_empty() || p.len() > path.len() && p.starts_with(path) && p[path.len()] == b'/';
        self.ops.values().any(|op| {
            let names = !matches!(op.kind, OpKind::Data | OpKind::SetAttr { .. } | OpKind::SetXattr { .. });
            op.paths()
                .any(|p| p == path || below(p) || (names && ancestors(path).any(|a| a == p)))
        })
    }

    /// Keep the flushers off the queued ops of `ino` (while another node takes them over); the seqs kept.
    pub fn hold_ino(&mut self, ino: u64) -> Vec<u64> {
        let seqs: Vec<u64> = self
            .by_ino
            .get(&ino)
            .into_iter()
            .flatten()
            .copied()
            .filter(|s| !self.held.contains(s))
            .collect();
        self.held.extend(seqs.iter().copied());
        seqs
    }

    /// Give the flushers back the ops [`Journal::hold_ino`] kept (those still queued).
    pub fn unhold(&mut self, seqs: &[u64]) {
        for s in seqs {
            self.held.remove(s);
        }
    }

    /// Whether an op of `ino` is under way.
    pub fn under_way(&self, ino: u64) -> bool {
        self.by_ino
            .get(&ino)
            .is_some_and(|s| s.iter().any(|q| self.inflight.contains_key(q)))
    }

    /// Names of `dir` with queued changes.
    pub fn pinned_in(&self, dir: u64) -> HashSet<Vec<u8>> {
        self.names
            .get(&dir)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn insert(&mut self, op: Op, out: &mut Vec<Mutation>) -> u64 {
        let seq = self.next_seq.max(1);
        self.next_seq = seq + 1;
        tracing::debug!(seq, ino = op.ino, op = op.kind.name(), path = %String::from_utf8_lossy(&op.path), "queued");
        out.push(Mutation::PutOp(seq, op.encode()));
        self.index(seq, &op);
        self.ops.insert(seq, op);
        seq
    }

    fn remove(&mut self, seq: u64, out: &mut Vec<Mutation>) -> Option<Op> {
        let op = self.ops.remove(&seq)?;
        tracing::debug!(seq, ino = op.ino, op = op.kind.name(), "left the queue");
        out.push(Mutation::DelOp(seq));
        if matches!(op.kind, OpKind::Rename { exchange: true, .. }) {
            self.exchanges -= 1;
        }
        self.inflight.remove(&seq);
        self.held.remove(&seq);
        self.failed.remove(&seq);
        if let Some(s) = self.by_ino.get_mut(&op.ino) {
            s.remove(&seq);
            if s.is_empty() {
                self.by_ino.remove(&op.ino);
            }
        }
        for (d, n) in &op.names {
            if let Some(m) = self.names.get_mut(d) {
                if let Some(c) = m.get_mut(n) {
                    *c -= 1;
                    if *c == 0 {
                        m.remove(n);
                    }
                }
                if m.is_empty() {
                    self.names.remove(d);
                }
            }
        }
        Some(op)
    }

    fn last_of(&self, ino: u64) -> Option<u64> {
        self.by_ino.get(&ino).and_then(|s| s.last().copied())
    }

    /// Queue `op` for its caller to push and wait for (write-through): not coalesced with anything, and
    /// skipped by [`Journal::ready`]. Returns its seq and the mutations that persist it.
    pub fn record_held(&mut self, op: Op) -> (u64, Vec<Mutation>) {
        let mut out = Vec::new();
        let seq = self.insert(op, &mut out);
        self.held.insert(seq);
        (seq, out)
    }

    /// Queue `op`, coalescing it with what is queued. Returns the mutations that persist the change.
    pub fn record(&mut self, op: Op) -> Vec<Mutation> {
        let mut out = Vec::new();
        let last = self
            .last_of(op.ino)
            .filter(|s| !self.inflight.contains_key(s) && !self.held.contains(s));
        match &op.kind {
            OpKind::Data => {
                let queued = self.by_ino.get(&op.ino).and_then(|s| {
                    s.iter().copied().find(|q| {
                        !self.inflight.contains_key(q) && !self.held.contains(q) && self.ops[q].kind == OpKind::Data
                    })
                });
                if let Some(q) = queued {
                    if Some(q) == last {
                        // Already the last op of this file: the new ranges ride along.
                        return out;
                    }
                    let since = self.ops[&q].since_ms;
                    self.remove(q, &mut out);
                    let mut op = op;
                    op.since_ms = op.since_ms.min(since);
                    self.insert(op, &mut out);
                    return out;
                }
            }
            OpKind::SetAttr {
                perm,
                uid,
                gid,
                atime,
                mtime,
            } => {
                if let Some(q) = last
                    && let Some(prev) = self.ops.get_mut(&q)
                    && let OpKind::SetAttr {
                        perm: p,
                        uid: u,
                        gid: g,
                        atime: a,
                        mtime: m,
                    } = &mut prev.kind
                    && prev.path == op.path
                {
                    *p = perm.or(*p);
                    *u = uid.or(*u);
                    *g = gid.or(*g);
                    *a = atime.or(*a);
                    *m = mtime.or(*m);
                    out.push(Mutation::PutOp(q, prev.encode()));
                    return out;
                }
            }
            OpKind::Rename {
                to,
                no_replace,
                exchange: false,
                replaced: false,
            } => {
                // A move of what the last op queued just moved, with nothing queued since, neither
                // replacing anything: one move from the first place to the last. The name in between held
                // only this object, and nothing queued names it; the last place was free, and nothing
                // changed above the first since. A chain of renames of one object (a program renaming a
                // directory back and forth 20,000 times) would otherwise be pushed one rename at a time,
                // each waiting for the one before. (One that replaced something stays apart: what it
                // replaced may be above the first place, a directory the object was moved out of first.)
                if let Some(q) = last
                    && q + 1 == self.next_seq
                    && let Some(prev) = self.ops.get(&q)
                    && !prev.attempted
                    && prev.names.len() == 2
                    && op.names.len() == 2
                    && let OpKind::Rename {
                        to: between,
                        exchange: false,
                        replaced: false,
                        ..
                    } = &prev.kind
                    && *between == op.path
                {
                    let (to, no_replace) = (to.clone(), *no_replace);
                    let prev = self.remove(q, &mut out).expect("queued");
                    if prev.path == to {
                        // Back where it was: nothing for home to do.
                        return out;
                    }
                    let merged = Op {
                        ino: op.ino,
                        path: prev.path,
                        names: vec![prev.names[0].clone(), op.names[1].clone()],
                        kind: OpKind::Rename {
                            to,
                            no_replace,
                            exchange: false,
                            replaced: false,
                        },
                        since_ms: prev.since_ms,
                        attempted: false,
                    };
                    self.insert(merged, &mut out);
                    return out;
                }
            }
            _ => {}
        }
        self.insert(op, &mut out);
        out
    }

    /// `ino` lost its last name (the removing op is already recorded): drop what no longer matters.
    pub fn forget_removed(&mut self, ino: u64) -> Vec<Mutation> {
        let mut out = Vec::new();
        let Some(seqs) = self.by_ino.get(&ino).cloned() else {
            return out;
        };
        let untouched = seqs
            .iter()
            .all(|s| !self.inflight.contains_key(s) && !self.ops[s].attempted);
        let created_here = seqs.first().is_some_and(|s| self.ops[s].kind.creates());
        let no_side_effects = seqs.iter().all(|s| match &self.ops[s].kind {
            OpKind::Rename { replaced, exchange, .. } => !replaced && !exchange,
            OpKind::Link { .. } => false,
            _ => true,
        });
        // Queued ops naming an entry of `ino` (none of its own ops do: a directory is not its own parent).
        // Both from the journal's indexes: a scan of the queue per removal made `rm -rf` of a tree whose
        // creates are still queued quadratic.
        let named_as_parent = self.names.get(&ino).is_some_and(|m| !m.is_empty());
        // An exchange names its partner only by path: while one is queued, nothing is cancelled.
        let exchanged = self.exchanges > 0;
        if untouched && created_here && no_side_effects && !named_as_parent && !exchanged {
            for s in seqs {
                self.remove(s, &mut out);
            }
            return out;
        }
        for s in seqs {
            let op = &self.ops[&s];
            if matches!(op.kind, OpKind::Data | OpKind::SetAttr { .. } | OpKind::SetXattr { .. })
                && !self.inflight.contains_key(&s)
            {
                self.remove(s, &mut out);
            }
        }
        out
    }

    /// Up to `limit` ops that may be pushed now: old enough (or `urgent`), not waiting after a failure, and
    /// with no earlier unfinished op they depend on.
    pub fn ready(&self, lag: Duration, urgent: bool, limit: usize) -> Vec<u64> {
        let now = now_ms();
        let lag_ms = lag.as_millis() as u64;
        let instant = Instant::now();
        let mut picked = Vec::new();
        let mut earlier = Earlier::default();
        for (seq, op) in &self.ops {
            let due = urgent || now.saturating_sub(op.since_ms) >= lag_ms;
            if !due {
                // Ops are in the order they were queued, so none after this one is due either (a coalesced
                // data op keeps its first write's time and may wait here, at most the lag). Stopping keeps
                // this call short while a burst of changes sits out its lag: every change wakes the pushers.
                break;
            }
            let blocked = earlier.block(op);
            let waiting = self.failed.get(seq).is_some_and(|f| f.retry_at > instant);
            if !blocked && !waiting && !self.inflight.contains_key(seq) && !self.held.contains(seq) {
                picked.push(*seq);
                if picked.len() >= limit {
                    break;
                }
            }
        }
        picked
    }

    /// Whether the held op `seq` may be pushed now: queued, not under way, and with no earlier unfinished op
    /// it depends on (whatever their age).
    pub fn ready_now(&self, seq: u64) -> bool {
        let mut earlier = Earlier::default();
        for (s, op) in self.ops.range(..=seq) {
            let blocked = earlier.block(op);
            if *s == seq {
                return !blocked && !self.inflight.contains_key(s);
            }
        }
        false
    }

    /// Mark `seq` under way; returns the mutation that records the attempt, if it is the first.
    pub fn begin(&mut self, seq: u64) -> Vec<Mutation> {
        self.inflight.insert(seq, Instant::now());
        match self.ops.get_mut(&seq) {
            Some(op) if !op.attempted => {
                op.attempted = true;
                vec![Mutation::PutOp(seq, op.encode())]
            }
            _ => Vec::new(),
        }
    }

    /// `seq` reached home.
    pub fn finish(&mut self, seq: u64) -> (Option<Op>, Vec<Mutation>) {
        let mut out = Vec::new();
        let op = self.remove(seq, &mut out);
        (op, out)
    }

    /// Let every op home refused be tried again now (its count of refusals stays).
    /// Ops home refused in attempts that began before `since` may be tried again at once (a drain begun at
    /// `since` asks home again about each, once). Returns whether any was waiting.
    pub fn retry_refused_before(&mut self, since: Instant) -> bool {
        let now = Instant::now();
        let mut moved = false;
        for f in self.failed.values_mut() {
            if f.attempt_began < since && f.retry_at > now {
                f.retry_at = now;
                moved = true;
            }
        }
        moved
    }

    /// Whether what is queued waits only on ops home refused in attempts begun at `since` or later: some
    /// were refused, none is under way, and none could be pushed now (the others wait behind the refused
    /// ones). A refusal from an attempt already under way at `since` does not count: home may have changed
    /// its mind since (what a drain started for), and the op is asked again.
    pub fn only_refused_left(&self, since: Instant) -> bool {
        !self.failed.is_empty()
            && self.inflight.is_empty()
            && self.failed.values().all(|f| f.attempt_began >= since)
            && self.ready(Duration::ZERO, true, 1).is_empty()
    }

    /// Times home refused `seq` so far.
    pub fn refusals(&self, seq: u64) -> u32 {
        self.failed.get(&seq).map_or(0, |f| f.attempts)
    }

    /// `seq` could not be pushed; it waits `backoff` (or goes back to the queue at once when `None`).
    /// Returns the refusals so far.
    pub fn fail(&mut self, seq: u64, error: String, backoff: Option<Duration>) -> u32 {
        let attempt_began = self.inflight.remove(&seq).unwrap_or_else(Instant::now);
        match backoff {
            Some(b) => {
                let attempts = self.refusals(seq) + 1;
                self.failed.insert(
                    seq,
                    Failure {
                        error,
                        retry_at: Instant::now() + b,
                        attempts,
                        attempt_began,
                    },
                );
                attempts
            }
            None => {
                self.failed.remove(&seq);
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(ino: u64, path: &str, kind: OpKind) -> Op {
        Op::new(ino, path.as_bytes().to_vec(), Vec::new(), kind)
    }

    fn chmod(perm: u32) -> OpKind {
        OpKind::SetAttr {
            perm: Some(perm),
            uid: None,
            gid: None,
            atime: None,
            mtime: None,
        }
    }

    /// A file home has, changed here in its data and attributes only, can be handed over; one this node
    /// made, renamed or gave extended attributes, or one under a directory it made or moved, cannot.
    #[test]
    fn only_a_file_home_has_changed_in_data_and_attributes_is_handed_over() {
        let mut j = Journal::default();
        assert_eq!(j.handover_of(5, b"d/f"), Ok(Vec::new()), "nothing queued");
        j.record(op(5, "d/f", OpKind::Data));
        j.record(op(5, "d/f", chmod(0o600)));
        // Another file's changes, and the directory's attributes, are no business of this file's.
        j.record(op(6, "d/g", OpKind::Data));
        j.record(op(2, "d", chmod(0o700)));
        assert_eq!(j.handover_of(5, b"d/f"), Ok(vec![OpKind::Data, chmod(0o600)]));
        // A push begun (and failed: home away) does not keep the file from being handed over.
        let data = j.by_ino[&5]
            .iter()
            .copied()
            .find(|s| j.ops[s].kind == OpKind::Data)
            .unwrap();
        j.begin(data);
        j.fail(data, "home away".into(), Some(Duration::from_secs(60)));
        assert_eq!(j.handover_of(5, b"d/f"), Ok(vec![OpKind::Data, chmod(0o600)]));

        // Made here: its creation is not the other node's to make.
        let mut made = Journal::default();
        made.record(op(
            5,
            "d/f",
            OpKind::Create {
                mode: 0o644,
                uid: None,
                gid: None,
            },
        ));
        made.record(op(5, "d/f", OpKind::Data));
        assert!(made.handover_of(5, b"d/f").is_err());
        // Extended attributes changed here.
        let mut x = Journal::default();
        x.record(op(
            5,
            "d/f",
            OpKind::SetXattr {
                name: b"user.a".to_vec(),
                value: None,
            },
        ));
        assert!(x.handover_of(5, b"d/f").is_err());
        // Under a directory made here, or a name on its path removed here.
        for other in [
            OpKind::Mkdir {
                mode: 0o755,
                uid: None,
                gid: None,
            },
            OpKind::Unlink,
        ] {
            let mut under = Journal::default();
            under.record(op(2, "d", other));
            under.record(op(5, "d/f", OpKind::Data));
            assert!(under.handover_of(5, b"d/f").is_err());
            assert!(under.touches_path(b"d/f"));
        }
    }

    /// What is queued of a path, below it, or of a name above it, touches it; attribute changes above
    /// it and other paths do not.
    #[test]
    fn a_path_is_touched_by_its_ops_those_below_it_and_name_changes_above_it() {
        let mut j = Journal::default();
        j.record(op(2, "d", chmod(0o700)));
        j.record(op(6, "d/g", OpKind::Data));
        j.record(op(7, "dx/f", OpKind::Data));
        assert!(!j.touches_path(b"d/f"));
        assert!(j.touches_path(b"d"), "d/g is below d");
        assert!(j.touches_path(b"d/g"));
        assert!(j.touches_path(b""), "everything is below the root");
        j.record(op(
            8,
            "d/h",
            OpKind::Rename {
                to: b"d/f".to_vec(),
                no_replace: false,
                exchange: false,
                replaced: false,
            },
        ));
        assert!(j.touches_path(b"d/f"), "a rename onto it");
    }

    /// A rename of `ino` from `from` (entry `a` of directory 1) to `to` (entry `b`), replacing something there
    /// or not.
    fn mv(ino: u64, from: &str, to: &str, replaced: bool) -> Op {
        Op::new(
            ino,
            from.as_bytes().to_vec(),
            vec![(1, from.as_bytes().to_vec()), (1, to.as_bytes().to_vec())],
            OpKind::Rename {
                to: to.as_bytes().to_vec(),
                no_replace: false,
                exchange: false,
                replaced,
            },
        )
    }

    /// The (from, to, replaced) of every queued op, a rename or not, in order.
    fn moves(j: &Journal) -> Vec<(String, String, bool)> {
        j.ops
            .values()
            .map(|o| match &o.kind {
                OpKind::Rename { to, replaced, .. } => (
                    String::from_utf8_lossy(&o.path).into_owned(),
                    String::from_utf8_lossy(to).into_owned(),
                    *replaced,
                ),
                k => (
                    String::from_utf8_lossy(&o.path).into_owned(),
                    k.name().to_string(),
                    false,
                ),
            })
            .collect()
    }

    /// Renames of one object, each of what the one before moved with nothing queued in between, are one
    /// move from the first place to the last (none if it is back where it was); a rename that replaced
    /// something, one under way, or one with an op queued after it stays as it is.
    #[test]
    fn a_chain_of_renames_of_one_object_is_one_rename() {
        let mut j = Journal::default();
        for i in 0..10_000 {
            let (a, b) = if i % 2 == 0 { ("x", "y") } else { ("y", "x") };
            j.record(mv(5, a, b, false));
        }
        assert!(j.is_empty(), "back where it started: {:?}", moves(&j));
        j.record(mv(5, "x", "y", false));
        j.record(mv(5, "y", "z", false));
        j.record(mv(5, "z", "w", false));
        assert_eq!(moves(&j), [("x".into(), "w".into(), false)]);
        assert_eq!(j.names.get(&1).map(|m| m.len()), Some(2), "only x and w are pinned");
        // One that replaces something stays apart, and so does what follows it.
        j.record(mv(5, "w", "v", true));
        j.record(mv(5, "v", "x", false));
        assert_eq!(moves(&j).len(), 3);
        let mut j = Journal::default();
        j.record(mv(5, "x", "w", false));
        // Under way: not changed.
        let last = *j.ops.keys().last().unwrap();
        j.begin(last);
        j.record(mv(5, "w", "v", false));
        assert_eq!(moves(&j).len(), 2);
        // Another op after it: order kept.
        j.record(op(6, "other", OpKind::Data));
        j.record(mv(5, "v", "u", false));
        assert_eq!(moves(&j).len(), 4);
    }

    /// Ops held for a hand-over are left alone by the flushers until let go, and coalesce with nothing.
    #[test]
    fn ops_held_for_a_handover_are_not_pushed_until_let_go() {
        let mut j = Journal::default();
        j.record(op(5, "f", OpKind::Data));
        j.record(op(6, "g", OpKind::Data));
        let held = j.hold_ino(5);
        assert_eq!(held.len(), 1);
        let ready: Vec<u64> = j.ready(Duration::ZERO, true, 10);
        assert_eq!(ready.len(), 1);
        assert_eq!(j.get(ready[0]).unwrap().ino, 6);
        assert!(j.hold_ino(5).is_empty(), "held already");
        j.unhold(&held);
        assert_eq!(j.ready(Duration::ZERO, true, 10).len(), 2);
        j.hold_ino(5);
        assert!(!j.drop_content_ops(5).is_empty());
        assert!(!j.has(5), "dropped once taken over");
    }

    #[test]
    fn only_refused_ops_and_those_behind_them_left() {
        let mut j = Journal::default();
        let mkdir = OpKind::Mkdir {
            mode: 0o755,
            uid: None,
            gid: None,
        };
        j.record(op(2, "d", mkdir));
        j.record(op(3, "d/f", OpKind::Data));
        let start = Instant::now();
        assert!(!j.only_refused_left(start), "nothing was refused");
        let seq = j.ready(Duration::ZERO, true, 1)[0];
        j.begin(seq);
        assert!(!j.only_refused_left(start), "the mkdir is under way");
        j.fail(seq, "refused".into(), Some(Duration::from_secs(60)));
        assert!(j.only_refused_left(start), "the data op waits behind the refused mkdir");
        let drain = Instant::now();
        j.retry_refused_before(drain);
        assert!(!j.only_refused_left(drain), "the mkdir may be tried again");
        assert_eq!(j.ready(Duration::ZERO, true, 1), vec![seq]);
    }

    /// A refusal from an attempt under way when a drain began is not the drain's answer: the op is asked
    /// again (home may have changed its mind since), and only a refusal of that attempt counts.
    #[test]
    fn a_refusal_of_an_attempt_begun_before_a_drain_is_asked_again() {
        let mut j = Journal::default();
        j.record(op(2, "f", OpKind::Data));
        let seq = j.ready(Duration::ZERO, true, 1)[0];
        j.begin(seq);
        std::thread::sleep(Duration::from_millis(2));
        let drain = Instant::now();
        j.retry_refused_before(drain);
        // The attempt under way when the drain began is refused after it.
        j.fail(seq, "refused".into(), Some(Duration::from_secs(60)));
        assert!(!j.only_refused_left(drain), "refused before the drain asked");
        j.retry_refused_before(drain);
        assert_eq!(j.ready(Duration::ZERO, true, 1), vec![seq], "asked again at once");
        j.begin(seq);
        j.fail(seq, "refused".into(), Some(Duration::from_secs(60)));
        assert!(j.only_refused_left(drain), "refused in an attempt of the drain's");
    }

    #[test]
    fn ancestors_of_paths() {
        let a: Vec<&[u8]> = ancestors(b"a/b/c").collect();
        assert_eq!(a, vec![&b""[..], b"a", b"a/b"]);
        assert_eq!(ancestors(b"").count(), 0);
    }

    #[test]
    fn dependent_ops_wait_and_independent_ones_run_together() {
        let mut j = Journal::default();
        let mk = OpKind::Mkdir {
            mode: 0o755,
            uid: None,
            gid: None,
        };
        let cr = OpKind::Create {
            mode: 0o644,
            uid: None,
            gid: None,
        };
        j.record(op(2, "d", mk.clone()));
        j.record(op(3, "d/f", cr.clone()));
        j.record(op(4, "e", mk));
        j.record(op(5, "de", cr));
        let ready = j.ready(Duration::ZERO, false, 10);
        // d/f waits for d; e and de (a sibling whose name merely starts like d) do not.
        assert_eq!(ready, vec![1, 3, 4]);
        j.begin(1);
        assert_eq!(j.ready(Duration::ZERO, false, 10), vec![3, 4]);
        j.finish(1);
        assert_eq!(j.ready(Duration::ZERO, false, 10), vec![2, 3, 4]);
        // Nothing is due before the lag unless urgent.
        assert!(j.ready(Duration::from_secs(60), false, 10).is_empty());
        assert_eq!(j.ready(Duration::from_secs(60), true, 10).len(), 3);
    }

    #[test]
    fn created_then_removed_leaves_nothing() {
        let mut j = Journal::default();
        j.record(op(
            7,
            "t",
            OpKind::Create {
                mode: 0o644,
                uid: None,
                gid: None,
            },
        ));
        j.record(op(7, "t", OpKind::Data));
        j.record(op(7, "t", OpKind::Data));
        assert_eq!(j.len(), 2, "writes coalesce");
        j.record(op(7, "t", OpKind::Unlink));
        j.forget_removed(7);
        assert!(j.is_empty());
    }
}
