//! The core's [`LockTable`] over etcd (design note 017): `flock` and POSIX locks that exclude processes on
//! every node, kept in etcd under each holder's lease. A lock that must wait is woken by the
//! membership's watch when another node's locks on the file change, and looks again at least every
//! [`LOOK_EVERY`] meanwhile, asking its caller each time whether it gave up (an interrupt).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use larder_fs::locks::{LockAsk, LockError, LockRange, LockTable, apply, conflict, without_owner};

use crate::Membership;
use crate::membership::LockRecords;

/// Longest a waiting lock goes without looking again (a change the watch did not bring; an interrupt).
const LOOK_EVERY: Duration = Duration::from_millis(100);
/// Retries of a lock change another node's change overtook, before it is given up as unavailable.
const RACES: usize = 1000;
/// Files whose locks this node remembers as it last wrote them, at most.
const KNOWN_MAX: usize = 10_000;
/// How often the keeper writes again unlocks etcd did not take.
const RETRY_EVERY: Duration = Duration::from_millis(200);

pub struct EtcdLocks {
    membership: Arc<Membership>,
    /// Files this node holds locks on: a close of any other file asks etcd nothing.
    holding: Mutex<HashSet<Vec<u8>>>,
    /// The revision of this node's last change of each file's locks (the gate's, once written): a gate
    /// still there when read next means no other node changed its locks on the file meanwhile.
    last_written: Mutex<HashMap<Vec<u8>, i64>>,
    /// Each file's locks as this node last wrote them: its next change is tried on them at once (one
    /// transaction, made only if the gate is still that write's), and read afresh only if that fails
    /// or they show a conflict.
    known: Mutex<HashMap<Vec<u8>, Read>>,
    /// Unlocks etcd did not take (it was away), by file, with the owners' locks to drop: written again
    /// by the keeper until it does. Others wait on them meanwhile, as on a lock still held.
    unsent: Mutex<HashMap<Vec<u8>, Vec<LockAsk>>>,
}

fn unavailable(e: impl std::fmt::Display) -> LockError {
    LockError::Unavailable(e.to_string())
}

/// A file's locks as read: every node's (with the node), this node's own, and the gate's revision.
#[derive(Clone)]
struct Read {
    all: Vec<(u64, LockRange)>,
    mine: Vec<LockRange>,
    gate: i64,
}

fn decode(value: &[u8]) -> Vec<LockRange> {
    serde_json::from_slice(value).unwrap_or_default()
}

impl EtcdLocks {
    pub fn new(membership: Arc<Membership>) -> Arc<EtcdLocks> {
        let locks = Arc::new(EtcdLocks {
            membership,
            holding: Mutex::new(HashSet::new()),
            last_written: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
            unsent: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&locks);
        let _ = std::thread::Builder::new().name("larder-locks".into()).spawn(move || {
            loop {
                std::thread::sleep(RETRY_EVERY);
                let Some(l) = weak.upgrade() else { return };
                l.send_unsent();
            }
        });
        locks
    }

    fn me(&self) -> u64 {
        self.membership.me().id
    }

    /// Every node's locks of `key`, flat, and this node's own; the gate's revision.
    fn read(&self, key: &[u8]) -> Result<Read, LockError> {
        Ok(self.flatten(self.membership.read_locks(key).map_err(unavailable)?))
    }

    fn flatten(&self, records: LockRecords) -> Read {
        let me = self.me();
        let mut all = Vec::new();
        let mut mine = Vec::new();
        for (node, value) in records.nodes {
            let ranges = decode(&value);
            if node == me {
                mine = ranges.clone();
            }
            all.extend(ranges.into_iter().map(|r| (node, r)));
        }
        Read {
            all,
            mine,
            gate: records.gate,
        }
    }

    /// `key`'s locks as this node last wrote them, else as etcd has them now.
    fn known_or_read(&self, key: &[u8]) -> Result<(Read, bool), LockError> {
        if let Some(r) = self.known.lock().unwrap().get(key) {
            return Ok((r.clone(), true));
        }
        Ok((self.read(key)?, false))
    }

    /// Write this node's locks of `key` as `mine` if nothing changed since `read` (at its gate): the held
    /// records' mark as of the write; if something did change, the locks as they are now (one round trip
    /// either way).
    fn write(&self, key: &[u8], read: &Read, mine: &[LockRange]) -> Result<Result<Option<i64>, Read>, LockError> {
        let value = (!mine.is_empty()).then(|| serde_json::to_vec(mine).expect("locks serialise"));
        let written = self
            .membership
            .write_locks(key, read.gate, value)
            .map_err(unavailable)?;
        let (revision, held_mark) = match written {
            Ok(w) => (w.revision, w.held_mark),
            Err(now) => {
                self.known.lock().unwrap().remove(key);
                return Ok(Err(self.flatten(now)));
            }
        };
        let me = self.me();
        // Two threads of this node writing the same key (a close's unlock, the next process's lock) take
        // their answers in here in either order: only a write later than the last one noted is, else the
        // earlier one's view (nothing held, say) would undo the later's, and its unlock never be sent.
        let mut last = self.last_written.lock().unwrap();
        if last.get(key).is_some_and(|&r| r > revision) {
            return Ok(Ok(held_mark));
        }
        last.insert(key.to_vec(), revision);
        let mut all: Vec<(u64, LockRange)> = read.all.iter().filter(|(n, _)| *n != me).copied().collect();
        all.extend(mine.iter().map(|l| (me, *l)));
        {
            let mut known = self.known.lock().unwrap();
            if known.len() >= KNOWN_MAX {
                known.clear();
            }
            known.insert(
                key.to_vec(),
                Read {
                    all,
                    mine: mine.to_vec(),
                    gate: revision,
                },
            );
        }
        let mut holding = self.holding.lock().unwrap();
        if mine.is_empty() {
            holding.remove(key);
        } else {
            holding.insert(key.to_vec());
        }
        Ok(Ok(held_mark))
    }

    /// Whether a gate read at `gate` was last written by another node (or this node holds nothing there).
    fn others_since(&self, key: &[u8], gate: i64) -> bool {
        self.last_written.lock().unwrap().get(key) != Some(&gate)
    }

    /// Change this node's locks of `key` by `change` (unlocks: nothing to wait for), until etcd takes it.
    fn unlock(&self, key: &[u8], change: impl Fn(&[LockRange]) -> Vec<LockRange>) -> Result<(), LockError> {
        let mut now = None;
        for _ in 0..RACES {
            let read = match now.take() {
                Some(read) => read,
                None => self.known_or_read(key)?.0,
            };
            let after = change(&read.mine);
            if after == read.mine {
                // Nothing held here: forgotten, unless another thread's lock was noted since this read
                // (checked under the lock `write` notes its answers under).
                let _notes = self.last_written.lock().unwrap();
                let none = self.known.lock().unwrap().get(key).is_some_and(|r| r.mine.is_empty());
                if read.mine.is_empty() && none {
                    self.holding.lock().unwrap().remove(key);
                }
                return Ok(());
            }
            match self.write(key, &read, &after)? {
                Ok(_) => return Ok(()),
                Err(fresh) => now = Some(fresh),
            }
        }
        Err(unavailable("the file's locks kept changing"))
    }

    /// The held records other nodes published before a lock was granted, applied here (the node that
    /// unlocked published its writes first): read only if the mark, as the lock's transaction found it,
    /// moved past what the watch brought.
    fn take_in_records(&self, held_mark: Option<i64>) {
        if let Err(e) = self.membership.sync_held_to(held_mark.unwrap_or(0)) {
            tracing::debug!(error = %e, "could not read the held records for a lock; going on with what this node knows");
        }
    }

    /// An unlock etcd did not take: kept, and sent again by the keeper. The caller is told it is done
    /// (a close or an unlock cannot fail); the others wait on the lock until it reaches etcd, or until
    /// this node's lease runs out.
    fn keep_unsent(&self, key: &[u8], ask: LockAsk, e: &LockError) {
        tracing::warn!(error = %e, "cannot tell the cluster a lock was released; trying again");
        self.unsent.lock().unwrap().entry(key.to_vec()).or_default().push(ask);
    }

    fn send_unsent(&self) {
        let pending: Vec<(Vec<u8>, Vec<LockAsk>)> = self.unsent.lock().unwrap().drain().collect();
        for (key, asks) in pending {
            let undo = |mine: &[LockRange]| asks.iter().fold(mine.to_vec(), |m, a| apply(&m, a));
            if self.unlock(&key, undo).is_err() {
                self.unsent.lock().unwrap().entry(key).or_default().extend(asks);
            }
        }
    }
}

impl LockTable for EtcdLocks {
    fn test(&self, key: &[u8], ask: &LockAsk) -> Result<Option<LockRange>, LockError> {
        let all = self.read(key)?.all;
        self.known.lock().unwrap().remove(key);
        Ok(conflict(&all, self.me(), ask).map(|(node, l)| LockRange {
            // Another node's process is no process here.
            pid: if *node == self.me() { l.pid } else { 0 },
            ..*l
        }))
    }

    fn set(&self, key: &[u8], ask: &LockAsk, wait: bool, cancelled: &dyn Fn() -> bool) -> Result<bool, LockError> {
        if ask.kind.is_none() {
            return self.unlock(key, |mine| apply(mine, ask)).map(|()| false).or_else(|e| {
                self.keep_unsent(key, *ask, &e);
                Ok(false)
            });
        }
        let mut races = 0;
        let mut fresh = false;
        // The locks as a failed transaction found them: the next try starts from those.
        let mut now: Option<Read> = None;
        loop {
            let seen = self.membership.locks_seen();
            let (read, cached) = match now.take() {
                Some(read) => (read, false),
                None if fresh => (self.read(key)?, false),
                None => self.known_or_read(key)?,
            };
            if conflict(&read.all, self.me(), ask).is_some() {
                if cached {
                    // What this node last wrote may be out of date: asked afresh before it waits.
                    fresh = true;
                    continue;
                }
                if !wait {
                    return Err(LockError::WouldBlock);
                }
                if cancelled() {
                    return Err(LockError::Interrupted);
                }
                self.membership.wait_for_locks(seen, LOOK_EVERY);
                fresh = true;
                continue;
            }
            let others_since = self.others_since(key, read.gate);
            match self.write(key, &read, &apply(&read.mine, ask))? {
                Ok(held_mark) => {
                    if others_since {
                        self.take_in_records(held_mark);
                    }
                    return Ok(others_since);
                }
                Err(found) => now = Some(found),
            }
            races += 1;
            if races >= RACES {
                return Err(unavailable("the file's locks kept changing"));
            }
        }
    }

    fn release_owner(&self, key: &[u8], owner: u64) -> Result<(), LockError> {
        if !self.holding.lock().unwrap().contains(key) {
            return Ok(());
        }
        self.unlock(key, |mine| without_owner(mine, owner)).or_else(|e| {
            let all = LockAsk {
                owner,
                start: 0,
                end: u64::MAX,
                kind: None,
                pid: 0,
            };
            self.keep_unsent(key, all, &e);
            Ok(())
        })
    }

    fn holds(&self, key: &[u8]) -> bool {
        self.holding.lock().unwrap().contains(key)
    }
}
