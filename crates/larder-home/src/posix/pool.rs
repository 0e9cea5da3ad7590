//! The worker pool calls run on, each awaited with the home's deadline: a call stuck in the kernel holds
//! a worker, not the caller.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::PosixHome;
use crate::{HomeError, HomeResult};

const MAX_WORKERS: usize = 128;

type Job = Box<dyn FnOnce() + Send + 'static>;

pub(super) struct Pool {
    sender: Mutex<Sender<Job>>,
    receiver: Arc<Mutex<Receiver<Job>>>,
    workers: AtomicUsize,
    idle: Arc<AtomicUsize>,
}

impl Pool {
    pub(super) fn new() -> Pool {
        let (sender, receiver) = mpsc::channel();
        Pool {
            sender: Mutex::new(sender),
            receiver: Arc::new(Mutex::new(receiver)),
            workers: AtomicUsize::new(0),
            idle: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn submit(&self, job: Job) {
        if self.idle.load(Ordering::Acquire) == 0 && self.workers.load(Ordering::Acquire) < MAX_WORKERS {
            self.workers.fetch_add(1, Ordering::AcqRel);
            let receiver = self.receiver.clone();
            let idle = self.idle.clone();
            let spawned = std::thread::Builder::new().name("larder-home".into()).spawn(move || {
                loop {
                    idle.fetch_add(1, Ordering::AcqRel);
                    let job = receiver.lock().unwrap_or_else(|p| p.into_inner()).recv();
                    idle.fetch_sub(1, Ordering::AcqRel);
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                }
            });
            if spawned.is_err() {
                self.workers.fetch_sub(1, Ordering::AcqRel);
            }
        }
        // The receiver lives as long as the pool, so a send cannot fail while `self` exists.
        let _ = self.sender.lock().unwrap_or_else(|p| p.into_inner()).send(job);
    }
}

impl PosixHome {
    /// Run `f` on the pool with the deadline, or inline when there is none.
    pub(super) fn run<T: Send + 'static>(&self, f: impl FnOnce() -> HomeResult<T> + Send + 'static) -> HomeResult<T> {
        let (Some(pool), Some(timeout)) = (&self.pool, self.op_timeout) else {
            return f();
        };
        let (tx, rx) = mpsc::sync_channel(1);
        pool.submit(Box::new(move || {
            let _ = tx.send(f());
        }));
        match rx.recv_timeout(timeout) {
            Ok(result) => result,
            Err(_) => Err(HomeError::TimedOut(timeout)),
        }
    }
}
