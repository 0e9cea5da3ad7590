//! Lock contention, counted: [`lock`] takes a mutex at the cost of one `try_lock` when it is free, and
//! only when another thread holds it times the wait. The totals ([`waits`]) show where threads queue on a
//! shared lock, in benchmarks and in the status, even on a machine with few cores.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::Instant;

static WAITS: AtomicU64 = AtomicU64::new(0);
static WAIT_NS: AtomicU64 = AtomicU64::new(0);

/// Lock `m`, counting the wait if it is held; a poisoned lock is taken as it is (its holder panicked,
/// the state it guards is still consistent at every unlock point).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.try_lock() {
        Ok(g) => g,
        Err(TryLockError::Poisoned(p)) => p.into_inner(),
        Err(TryLockError::WouldBlock) => {
            let start = Instant::now();
            let g = m.lock().unwrap_or_else(|p| p.into_inner());
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
}
