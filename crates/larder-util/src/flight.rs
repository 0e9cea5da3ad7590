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

/// The computation of one key, taken on by [`SingleFlight::lead`].
pub struct Lead<'a, K: Eq + Hash, V> {
    publish: Publish<'a, K, V>,
}

impl<K: Eq + Hash, V: Clone> Lead<'_, K, V> {
    /// End the computation with `value`: the callers waiting for it get it.
    pub fn finish(self, value: V) {
        *self.publish.flight.state.lock().unwrap_or_else(|p| p.into_inner()) = State::Done(value);
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

    /// Take on the computation of `key` if none is under way: callers of [`SingleFlight::run`] for it wait
    /// for the value given to [`Lead::finish`] meanwhile (if the lead is dropped unfinished, one of them
    /// computes it). `None` if a computation of `key` is under way already. For a caller computing many
    /// keys at once (a run of blocks in one request), each led on its own.
    pub fn lead(&self, key: K) -> Option<Lead<'_, K, V>> {
        let mut flights = self.flights.lock().unwrap_or_else(|p| p.into_inner());
        if flights.contains_key(&key) {
            return None;
        }
        let flight = Arc::new(Flight {
            state: Mutex::new(State::Running),
            done: Condvar::new(),
        });
        flights.insert(key.clone(), flight.clone());
        Some(Lead {
            publish: Publish {
                owner: &self.flights,
                flight,
                key,
            },
        })
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

    #[test]
    fn a_led_key_is_waited_for_and_an_abandoned_one_computed_again() {
        let flights: Arc<SingleFlight<u32, u32>> = Arc::new(SingleFlight::default());
        let lead = flights.lead(1).expect("nothing under way");
        assert!(flights.lead(1).is_none(), "led already");
        assert!(flights.in_flight(&1));
        let computed = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(std::sync::Barrier::new(2));
        let waiter = {
            let (flights, computed, started) = (flights.clone(), computed.clone(), started.clone());
            std::thread::spawn(move || {
                started.wait();
                flights.run(1, || {
                    computed.fetch_add(1, Ordering::SeqCst);
                    0
                })
            })
        };
        started.wait();
        std::thread::sleep(std::time::Duration::from_millis(200));
        lead.finish(7);
        assert_eq!(waiter.join().unwrap(), 7, "the waiter got the led value");
        assert_eq!(computed.load(Ordering::SeqCst), 0, "and computed nothing");
        assert!(!flights.in_flight(&1));
        // A lead dropped unfinished: the next caller computes the value itself.
        drop(flights.lead(2).unwrap());
        assert_eq!(flights.run(2, || 9), 9);
    }
}
