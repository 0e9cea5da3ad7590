//! The write-back pipeline's own state: the journal of changes not yet at home, what wakes the pushers,
//! drains under way, and the conflicts recorded. Changes enter it from `changes.rs`; the flusher
//! (`flusher/`) takes them to home. `Fs` holds it beside the namespace and the data path, and methods of
//! `Fs` are where they meet (a change needs the namespace and the queue; a push settles the namespace).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// How many of them may push at once.
    pub window: Window,
}

impl Pipeline {
    /// A pipeline whose pushers are at most `pushers` at once.
    pub fn new(journal: Journal, conflicts: Vec<Conflict>, pushers: usize) -> Pipeline {
        Pipeline {
            window: Window::new(pushers),
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

/// How many pushes may be under way at once. A far home answers each call a round trip later, and the
/// pushers hide that by asking it many things at once; a home nearby that is busy answers later the more it
/// is asked. So the window starts at [`Window::START`], grows by one each time a push ends with every
/// pusher inside it busy and home answering about as fast as it did at its best, and shrinks by a quarter
/// when home takes more than three times that, by half when home goes away; never past `--flush-threads`
/// (its ceiling), never under [`Window::FLOOR`] (or the ceiling, if lower). Only calls that move no file
/// data are timed: a large file's push is slow for its bytes, not for home's load.
pub(crate) struct Window {
    ceiling: usize,
    limit: AtomicUsize,
    state: Mutex<WindowState>,
    /// Pushers outside the window wait here.
    spare: Condvar,
}

#[derive(Default)]
struct WindowState {
    /// Pushes under way.
    under_way: usize,
    /// Home's best time for a call that moves no data, drifting up slowly to what it takes now.
    best: Option<Duration>,
    last_cut: Option<Instant>,
}

/// How a push ended, as the window sees it.
pub(crate) enum Ended {
    /// Home answered, in this long (`None`: the push moved file data; not timed).
    Answered(Option<Duration>),
    /// Home is away, or timed out.
    Away,
}

impl Window {
    /// Pushers allowed at the start.
    pub const START: usize = 8;
    /// Fewest allowed.
    pub const FLOOR: usize = 4;

    fn new(ceiling: usize) -> Window {
        let ceiling = ceiling.max(1);
        Window {
            ceiling,
            limit: AtomicUsize::new(Self::START.min(ceiling)),
            state: Mutex::new(WindowState::default()),
            spare: Condvar::new(),
        }
    }

    /// Pushers allowed now.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// The pusher `index` (from 0) may push now; otherwise it waits until the window grows (or `timeout`).
    pub fn admits(&self, index: usize, timeout: Duration) -> bool {
        if index < self.limit() {
            return true;
        }
        let st = lock(&self.state);
        if index < self.limit() {
            return true;
        }
        let _ = self.spare.wait_timeout(st, timeout);
        false
    }

    /// A push begins.
    pub fn began(&self) {
        lock(&self.state).under_way += 1;
    }

    /// A push ended as `ended`.
    pub fn ended(&self, ended: Ended) {
        let mut st = lock(&self.state);
        let limit = self.limit();
        let full = st.under_way >= limit;
        st.under_way = st.under_way.saturating_sub(1);
        let floor = Self::FLOOR.min(self.ceiling);
        let now = Instant::now();
        // One cut per round trip: the pushes under way when home slowed all end slow.
        let may_cut = |st: &WindowState| {
            st.last_cut
                .is_none_or(|t| now.duration_since(t) > st.best.unwrap_or(Duration::from_secs(1)))
        };
        match ended {
            Ended::Away => {
                if may_cut(&st) {
                    self.limit.store((limit / 2).max(floor), Ordering::Relaxed);
                    st.last_cut = Some(now);
                }
            }
            Ended::Answered(None) => {}
            Ended::Answered(Some(took)) => {
                let best = match st.best {
                    Some(b) if took >= b => b + (took - b) / 64,
                    _ => took,
                };
                st.best = Some(best);
                if took > best * 3 && limit > floor {
                    if may_cut(&st) {
                        self.limit.store((limit * 3 / 4).max(floor), Ordering::Relaxed);
                        st.last_cut = Some(now);
                    }
                } else if took <= best * 2 && full && limit < self.ceiling {
                    self.limit.store(limit + 1, Ordering::Relaxed);
                    self.spare.notify_all();
                }
            }
        }
    }

    /// Wake the pushers outside the window (to stop).
    pub fn wake_all(&self) {
        let _st = lock(&self.state);
        self.spare.notify_all();
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
