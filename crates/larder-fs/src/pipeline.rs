//! The write-back pipeline's own state: the journal of changes not yet at home, what wakes the pushers,
//! drains under way, and the conflicts recorded. Changes enter it from `changes.rs`; the flusher
//! (`flusher/`) takes them to home. `Fs` holds it beside the namespace and the data path, and methods of
//! `Fs` are where they meet (a change needs the namespace and the queue; a push settles the namespace).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::Conflict;
use crate::journal::Journal;
use larder_util::contention::lock;

pub(crate) struct Pipeline {
    /// Changes not yet at home. Taken after the namespace when both are needed (design note 011).
    journal: Mutex<Journal>,
    /// The pushers wait here: woken one at a time when an op may be ready (a pusher that takes one while
    /// another is ready wakes the next), all at once when home comes back, a drain starts or they stop.
    /// On a machine of few cores, waking every pusher for each change cost the writer more than its own
    /// request.
    work: Condvar,
    /// Drains and write-through callers wait here for ops to finish.
    done: Condvar,
    /// Drain requests (and writers waiting for room) under way: push regardless of the sync lag.
    urgent: AtomicU64,
    /// Ops that reached home and whose directories' times are being settled there: a drain waits for
    /// them too.
    pub settling: AtomicU64,
    /// Set when the flusher threads are to stop.
    pub stopping: AtomicBool,
    /// Every conflict recorded in this cache directory.
    pub conflicts: Mutex<Vec<Conflict>>,
    /// The flusher threads.
    pub flushers: Mutex<Vec<JoinHandle<()>>>,
}

impl Pipeline {
    pub fn new(journal: Journal, conflicts: Vec<Conflict>) -> Pipeline {
        Pipeline {
            journal: Mutex::new(journal),
            work: Condvar::new(),
            done: Condvar::new(),
            urgent: AtomicU64::new(0),
            settling: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            conflicts: Mutex::new(conflicts),
            flushers: Mutex::new(Vec::new()),
        }
    }

    /// The journal, locked.
    pub fn journal(&self) -> MutexGuard<'_, Journal> {
        lock(&self.journal)
    }

    /// The journal if no one holds it now (for a log line written from inside a home call).
    pub fn try_journal(&self) -> Option<MutexGuard<'_, Journal>> {
        match self.journal.try_lock() {
            Ok(j) => Some(j),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Wake every thread waiting on the journal.
    pub fn notify(&self) {
        self.work.notify_all();
        self.done.notify_all();
    }

    /// Wake one pusher: an op may be ready.
    pub fn notify_one(&self) {
        self.work.notify_one();
    }

    /// An op left the journal: an op behind it may be ready, and a drain or caller may be waiting for it.
    pub fn finished(&self) {
        self.work.notify_one();
        self.done.notify_all();
    }

    /// A pusher's wait for work, `timeout` at most.
    pub fn wait<'a>(&self, journal: MutexGuard<'a, Journal>, timeout: Duration) -> MutexGuard<'a, Journal> {
        Self::wait_on(&self.work, journal, timeout)
    }

    /// A wait for ops to finish, `timeout` at most.
    pub fn wait_done<'a>(&self, journal: MutexGuard<'a, Journal>, timeout: Duration) -> MutexGuard<'a, Journal> {
        Self::wait_on(&self.done, journal, timeout)
    }

    fn wait_on<'a>(cv: &Condvar, journal: MutexGuard<'a, Journal>, timeout: Duration) -> MutexGuard<'a, Journal> {
        cv.wait_timeout(journal, timeout)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0)
    }

    /// Whether someone waits for everything queued to be pushed now.
    pub fn urgent(&self) -> bool {
        self.urgent.load(Ordering::SeqCst) > 0
    }

    /// Push regardless of the sync lag until the returned guard is dropped.
    pub fn hurry(&self) -> Hurry<'_> {
        self.urgent.fetch_add(1, Ordering::SeqCst);
        self.notify();
        Hurry(self)
    }
}

/// See [`Pipeline::hurry`].
pub(crate) struct Hurry<'a>(&'a Pipeline);

impl Drop for Hurry<'_> {
    fn drop(&mut self) {
        self.0.urgent.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Why the namespace asked home: one name looked up, a directory listed, a known object's attributes
/// revalidated one by one, and names listed to answer a lookup (of the listings).
#[derive(Default)]
pub(crate) struct MetaCounters {
    pub lookups: AtomicU64,
    pub listings: AtomicU64,
    pub revalidations: AtomicU64,
    pub listings_for_lookups: AtomicU64,
    pub listings_for_revalidation: AtomicU64,
    /// Inodes that left memory (the kernel forgot them and the index holds all of them), and those loaded
    /// back from the index.
    pub reclaimed: AtomicU64,
    pub reloaded: AtomicU64,
    /// Entries the kernel was asked to forget, to keep memory within `--max-inodes`.
    pub trimmed: AtomicU64,
    /// Listings made ahead of a walk (see `Names::walk_ahead`).
    pub listings_ahead: AtomicU64,
}

/// Reads served, for the efficiency figures.
#[derive(Default)]
pub(crate) struct ReadCounters {
    /// Reads served: count, bytes and nanoseconds spent in them.
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    pub nanos: AtomicU64,
    /// Bytes handed to readers from the local cache and from home, and blocks readers waited for home.
    pub cache_bytes: AtomicU64,
    pub home_bytes: AtomicU64,
    pub home_waits: AtomicU64,
}
