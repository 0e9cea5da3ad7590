//! Lock contention, counted: [`lock`] takes a mutex at the cost of one `try_lock` when it is free, and
//! only when another thread holds it times the wait. The totals ([`waits`]) show where threads queue on a
//! shared lock, in benchmarks and in the status, even on a machine with few cores. [`read`] and [`write`]
//! do the same for a reader-writer lock: readers never wait for each other, only for a writer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{
    LockResult, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError, TryLockResult,
};
use std::time::Instant;

static WAITS: AtomicU64 = AtomicU64::new(0);
static WAIT_NS: AtomicU64 = AtomicU64::new(0);

/// Lock `m`, counting the wait if it is held; a poisoned lock is taken as it is (its holder panicked,
/// the state it guards is still consistent at every unlock point).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    take(|| m.try_lock(), || m.lock())
}

/// Share `l` with other readers, counting the wait if a writer holds it (or waits for it).
pub fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    take(|| l.try_read(), || l.read())
}

/// Take `l` alone, counting the wait if anyone holds it.
pub fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    take(|| l.try_write(), || l.write())
}

/// The guard `try_take` gives at once, else the one `wait` waits for, with the wait counted; poison is
/// ignored (see [`lock`]).
fn take<G>(try_take: impl FnOnce() -> TryLockResult<G>, wait: impl FnOnce() -> LockResult<G>) -> G {
    match try_take() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            let start = Instant::now();
            let g = wait().unwrap_or_else(|p| p.into_inner());
            WAITS.fetch_add(1, Ordering::Relaxed);
            WAIT_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            g
        }
    }
}

/// Waits for a held lock so far, and the nanoseconds spent in them.
pub fn waits() -> (u64, u64) {
    (WAITS.load(Ordering::Relaxed), WAIT_NS.load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_wait_for_a_held_lock_is_counted_and_a_free_lock_is_not() {
        let m = Arc::new(Mutex::new(0u32));
        let (w0, _) = waits();
        *lock(&m) += 1;
        let held = lock(&m);
        let m2 = m.clone();
        let t = std::thread::spawn(move || *lock(&m2) += 1);
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        t.join().unwrap();
        let (w1, ns) = waits();
        // Other tests may count waits of their own meanwhile: at least this one.
        assert!(w1 > w0, "the wait was not counted");
        assert!(ns >= 10_000_000, "waited ~20 ms, counted {ns} ns in all");
        assert_eq!(*lock(&m), 2);
    }

    #[test]
    fn readers_share_a_reader_writer_lock_and_wait_only_for_a_writer() {
        let l = Arc::new(RwLock::new(0u32));
        let first = read(&l);
        // A second reader is let in at once while the first holds it, from another thread.
        let l2 = l.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || tx.send(*read(&l2)).unwrap());
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Ok(0),
            "a reader waited for a reader"
        );
        t.join().unwrap();
        drop(first);
        let (w0, _) = waits();
        let held = read(&l);
        let l3 = l.clone();
        let t = std::thread::spawn(move || *write(&l3) += 1);
        std::thread::sleep(Duration::from_millis(20));
        drop(held);
        t.join().unwrap();
        let (w1, _) = waits();
        assert!(w1 > w0, "a writer's wait for a reader was not counted");
        assert_eq!(*read(&l), 1);
    }
}
