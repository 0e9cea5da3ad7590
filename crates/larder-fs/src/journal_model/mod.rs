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
//!
//! Here are the properties; the workloads and their generators, the models of the local file system and of
//! home, and the run that replays a workload against both are in the submodules.

mod home;
mod model;
mod run;
mod strategy;
mod workload;

use std::time::Duration;

use self::home::Home;
use self::model::{Local, ROOT};
use self::run::{describe, run};
use crate::journal::{Journal, Op, OpKind};

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
