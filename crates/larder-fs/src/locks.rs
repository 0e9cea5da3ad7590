//! File locks across a cluster (design note 017): `flock` and POSIX byte-range locks granted by a
//! [`LockTable`] the cluster provides (etcd, under each node's lease), so processes on different nodes
//! exclude each other as processes on one machine do. Without one (a mount outside a cluster) the kernel
//! keeps its own local locks and none of this is used.
//!
//! This module is the core's side: what a lock is, how an owner's ranges change when it locks or unlocks
//! (POSIX: a new lock replaces the owner's own over the range it covers, splitting or merging), and what
//! conflicts. `flock` locks are whole-file locks of the open file's owner, as NFS gives them: they
//! exclude byte-range locks of other owners too.

use serde::{Deserialize, Serialize};

/// A lock's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LockKind {
    /// Shared (`F_RDLCK`, `LOCK_SH`).
    Read,
    /// Exclusive (`F_WRLCK`, `LOCK_EX`).
    Write,
}

/// A lock one owner holds on one file: bytes `start..=end` (`end` `u64::MAX`: to the end, however far).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRange {
    /// The owner the kernel names (a process's file table for POSIX locks, an open file for `flock`).
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
    /// The process that took it, as `F_GETLK` reports (0 when it is another node's).
    pub pid: u32,
}

/// A lock or unlock asked for: `kind` `None` unlocks the range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockAsk {
    pub owner: u64,
    pub start: u64,
    pub end: u64,
    pub kind: Option<LockKind>,
    pub pid: u32,
}

/// Why a lock was not granted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Held by another owner, and the caller does not wait (`EAGAIN`).
    #[error("the lock is held by another owner")]
    WouldBlock,
    /// The caller was interrupted while it waited (`EINTR`).
    #[error("interrupted while waiting for a lock")]
    Interrupted,
    /// The cluster's lock table cannot be reached (`ENOLCK`): a lock granted now might not exclude
    /// another node's.
    #[error("the cluster's locks cannot be reached: {0}")]
    Unavailable(String),
}

/// The cluster's lock table: grants locks to this node's owners against every node's.
pub trait LockTable: Send + Sync {
    /// A lock that would stop `ask` (`F_GETLK`); `None` if it would be granted.
    fn test(&self, key: &[u8], ask: &LockAsk) -> Result<Option<LockRange>, LockError>;
    /// Lock or unlock as `ask` says. With `wait`, a conflicting lock is waited for until it goes, or until
    /// `cancelled` says the caller gave up (asked again every moment while waiting). Whether another node
    /// changed its locks on `key` since this node last changed its own: if not, no other node can have
    /// released a lock (and published its writes) meanwhile; if so, what the others published before
    /// the lock was granted has been taken in (the cluster's records applied).
    fn set(&self, key: &[u8], ask: &LockAsk, wait: bool, cancelled: &dyn Fn() -> bool) -> Result<bool, LockError>;
    /// Drop every lock `owner` holds on `key` (its file closed).
    fn release_owner(&self, key: &[u8], owner: u64) -> Result<(), LockError>;
    /// Whether this node holds any lock on `key`.
    fn holds(&self, key: &[u8]) -> bool;
}

fn overlaps(a: &LockRange, start: u64, end: u64) -> bool {
    a.start <= end && start <= a.end
}

/// The first lock of `held` (each with the node holding it) that stops `ask` by node `me`: another
/// owner's (on this node or another) overlapping it, one of the two exclusive. An unlock meets none.
pub fn conflict<'a>(held: &'a [(u64, LockRange)], me: u64, ask: &LockAsk) -> Option<&'a (u64, LockRange)> {
    let want = ask.kind?;
    held.iter().find(|(node, l)| {
        (*node != me || l.owner != ask.owner)
            && overlaps(l, ask.start, ask.end)
            && (want == LockKind::Write || l.kind == LockKind::Write)
    })
}

/// The locks of one node after `ask`: the owner's own locks over the range are replaced by the new one
/// (or removed, for an unlock), the parts outside it kept; adjacent or overlapping locks of the owner of
/// one kind merge. Other owners' locks are untouched.
pub fn apply(mine: &[LockRange], ask: &LockAsk) -> Vec<LockRange> {
    let mut out: Vec<LockRange> = Vec::with_capacity(mine.len() + 2);
    let mut own: Vec<LockRange> = Vec::new();
    for l in mine {
        if l.owner != ask.owner {
            out.push(*l);
            continue;
        }
        if !overlaps(l, ask.start, ask.end) {
            own.push(*l);
            continue;
        }
        if l.start < ask.start {
            own.push(LockRange {
                end: ask.start - 1,
                ..*l
            });
        }
        if l.end > ask.end {
            own.push(LockRange {
                start: ask.end + 1,
                ..*l
            });
        }
    }
    if let Some(kind) = ask.kind {
        own.push(LockRange {
            owner: ask.owner,
            start: ask.start,
            end: ask.end,
            kind,
            pid: ask.pid,
        });
    }
    own.sort_by_key(|l| l.start);
    for l in own {
        match out.last_mut() {
            Some(last)
                if last.owner == l.owner && last.kind == l.kind && last.end != u64::MAX && last.end + 1 >= l.start =>
            {
                last.end = last.end.max(l.end);
            }
            _ => out.push(l),
        }
    }
    out
}

/// Every lock of `owner` dropped.
pub fn without_owner(mine: &[LockRange], owner: u64) -> Vec<LockRange> {
    mine.iter().filter(|l| l.owner != owner).copied().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(owner: u64, start: u64, end: u64, kind: Option<LockKind>) -> LockAsk {
        LockAsk {
            owner,
            start,
            end,
            kind,
            pid: 7,
        }
    }

    fn ranges(v: &[LockRange]) -> Vec<(u64, u64, u64, LockKind)> {
        let mut r: Vec<_> = v.iter().map(|l| (l.owner, l.start, l.end, l.kind)).collect();
        r.sort();
        r
    }

    #[test]
    fn an_unlock_in_the_middle_splits_the_owners_lock() {
        let a = apply(&[], &ask(1, 0, 99, Some(LockKind::Write)));
        let b = apply(&a, &ask(1, 10, 19, None));
        assert_eq!(
            ranges(&b),
            vec![(1, 0, 9, LockKind::Write), (1, 20, 99, LockKind::Write)]
        );
    }

    #[test]
    fn a_lock_of_another_kind_replaces_the_owners_lock_over_its_range() {
        let a = apply(&[], &ask(1, 0, 99, Some(LockKind::Read)));
        let b = apply(&a, &ask(1, 50, u64::MAX, Some(LockKind::Write)));
        assert_eq!(
            ranges(&b),
            vec![(1, 0, 49, LockKind::Read), (1, 50, u64::MAX, LockKind::Write)]
        );
        let c = apply(&b, &ask(1, 0, u64::MAX, None));
        assert!(c.is_empty(), "an unlock of everything leaves nothing: {c:?}");
    }

    #[test]
    fn adjacent_locks_of_one_owner_and_kind_merge_and_others_stay() {
        let a = apply(&[], &ask(1, 0, 9, Some(LockKind::Write)));
        let a = apply(&a, &ask(2, 100, 109, Some(LockKind::Read)));
        let b = apply(&a, &ask(1, 10, 19, Some(LockKind::Write)));
        assert_eq!(
            ranges(&b),
            vec![(1, 0, 19, LockKind::Write), (2, 100, 109, LockKind::Read)]
        );
        assert_eq!(ranges(&without_owner(&b, 1)), vec![(2, 100, 109, LockKind::Read)]);
    }

    #[test]
    fn shared_locks_share_and_exclusive_ones_exclude_other_owners_and_nodes() {
        let held = vec![(1, apply(&[], &ask(5, 0, u64::MAX, Some(LockKind::Read)))[0])];
        assert!(conflict(&held, 2, &ask(6, 0, 0, Some(LockKind::Read))).is_none());
        assert!(conflict(&held, 2, &ask(6, 10, 10, Some(LockKind::Write))).is_some());
        // Another owner on the same node is excluded as well; the owner itself is not.
        assert!(conflict(&held, 1, &ask(6, 10, 10, Some(LockKind::Write))).is_some());
        assert!(conflict(&held, 1, &ask(5, 10, 10, Some(LockKind::Write))).is_none());
        // Unlocks never wait.
        assert!(conflict(&held, 2, &ask(6, 0, 10, None)).is_none());
        let ranged = vec![(1, apply(&[], &ask(5, 100, 199, Some(LockKind::Write)))[0])];
        assert!(conflict(&ranged, 2, &ask(6, 0, 99, Some(LockKind::Write))).is_none());
        assert!(conflict(&ranged, 2, &ask(6, 199, 300, Some(LockKind::Read))).is_some());
    }
}
