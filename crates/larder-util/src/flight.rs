//! Single-flight: one computation per key at a time; callers that arrive meanwhile wait for its result.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Condvar, Mutex};

enum State<V> {
    Running,
    Done(V),
    /// The computing caller panicked.
    Abandoned,
}

struct Flight<V> {
    state: Mutex<State<V>>,
    done: Condvar,
}

/// Coalesces concurrent computations of the same key.
pub struct SingleFlight<K, V> {
    flights: Mutex<HashMap<K, Arc<Flight<V>>>>,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for SingleFlight<K, V> {
    fn default() -> Self {
        SingleFlight {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

/// Publishes the end of a flight even if the computation panics, so waiters never hang.
struct Publish<'a, K: Eq + Hash, V> {
    owner: &'a Mutex<HashMap<K, Arc<Flight<V>>>>,
    flight: Arc<Flight<V>>,
    key: K,
}

impl<K: Eq + Hash, V> Drop for Publish<'_, K, V> {
    fn drop(&mut self) {
        self.owner.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.key);
        let mut state = self.flight.state.lock().unwrap_or_else(|p| p.into_inner());
        if matches!(*state, State::Running) {
            *state = State::Abandoned;
        }
        self.flight.done.notify_all();
    }
}

impl<K: Eq + Hash + Clone, V: Clone> SingleFlight<K, V> {
    /// Run `f` for `key`, unless a run for it is under way: then wait for that run's result.
    pub fn run(&self, key: K, f: impl FnOnce() -> V) -> V {
        let (flight, leader) = {
            let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
            match flights.get(&key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight {
                        state: Mutex::new(State::Running),
                        done: Condvar::new(),
                    });
                    flights.insert(key.clone(), f.clone());
                    (f, true)
                }
            }
        };
        if leader {
            let publish = Publish {
                owner: &self.flights,
                flight,
                key,
            };
            let value = f();
            *publish.flight.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Done(value.clone());
            drop(publish);
            return value;
        }
        let mut state = flight.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*state {
                State::Done(v) => return v.clone(),
                State::Abandoned => {
                    drop(state);
                    return self.run(key, f);
                }
                State::Running => state = flight.done.wait(state).unwrap_or_else(|p| p.into_inner()),
            }
        }
    }

    /// Whether a computation for `key` is under way.
    pub fn in_flight(&self, key: &K) -> bool {
        self.flights.lock().unwrap_or_else(|p| p.into_inner()).contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn concurrent_callers_share_one_run() {
        let sf = SingleFlight::<u32, u32>::default();
        let runs = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let v = sf.run(7, || {
                        runs.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(100));
                        42
                    });
                    assert_eq!(v, 42);
                });
            }
        });
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(!sf.in_flight(&7));
    }
}
