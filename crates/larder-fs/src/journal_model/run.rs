//! One run of a workload: the local changes and their ops, recorded in the journal and pushed in the order
//! the workload picks, then both homes compared; and how ops are described in a failure's report.

use std::fmt::Write as _;
use std::time::Duration;

use super::home::{Home, diff};
use super::model::{Kind, Local, ROOT, obj, symlink_target, text};
use super::workload::{MAX_DEPTH, Pick, Push, Round, Step, Workload, name, perm, pick};
use crate::journal::{Journal, Op, OpKind};

pub(super) fn describe(op: &Op) -> String {
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

pub(super) struct Outcome {
    /// Home calls one by one.
    pub(super) reference: usize,
    /// Home calls through the journal.
    pub(super) pushed: usize,
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
pub(super) fn run(w: &Workload) -> Result<Outcome, String> {
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
